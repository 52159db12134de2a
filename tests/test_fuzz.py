"""Property-based fuzzing (hypothesis) of every loader and CLI entry: random JSON of any type
and shape, and valid files with one value replaced, one key removed or one key added.

Whatever the input: exit 0 (or 3, nothing fits) or 2, and when not 0 exactly one line on
stderr, "plan: error: ...", never a traceback, in bounded time. Examples are few (the whole
file runs in well under a minute on two cores); `main(argv)` runs in-process.
"""
from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import time

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from planner.cli import main  # noqa: E402
from planner.errors import BadInput  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROFILE = os.path.join(ROOT, "benchmarks", "profiles", "cpux2-tiny-llama.json")
FIXED = ["--tp", "1", "--pp", "1", "--dp", "8", "--zero", "3", "--micro-batch", "1",
         "--recompute", "full", "--no-sp", "--seq-len", "512", "--global-batch", "8"]
LIMIT_S = 20.0          # per call, generous for a loaded 2-core machine
FUZZ = settings(max_examples=int(os.environ.get("PLANNER_FUZZ_EXAMPLES", "25")), deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

# ---- strategies ------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(-10, 10), st.integers(-2 ** 70, 2 ** 70),
    st.sampled_from([0, 1, 2, 8, 10 ** 12, 10 ** 400, -1]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 0.5, 1e9, -1e-9]),
    st.text(max_size=12), st.sampled_from(["", "no", "true", "80", "h100", "a\nb", "$(x)"]))
json_values = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                     st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)


def _paths(x, prefix=(), out=None, max_items=2):
    """Every path into `x` (lists: their first `max_items` items)."""
    out = [] if out is None else out
    if isinstance(x, dict):
        for k, v in x.items():
            out.append(prefix + (k,))
            _paths(v, prefix + (k,), out, max_items)
    elif isinstance(x, list):
        for i, v in enumerate(x[:max_items]):
            out.append(prefix + (i,))
            _paths(v, prefix + (i,), out, max_items)
    return out


@st.composite
def mutated(draw, doc):
    """`doc` with one change: a value replaced (random, or of another type), a key deleted, or
    an unknown key added."""
    d = copy.deepcopy(doc)
    paths = _paths(d)
    path = draw(st.sampled_from(paths))
    *head, last = path
    parent = d
    for k in head:
        parent = parent[k]
    op = draw(st.sampled_from(["replace", "replace", "replace", "delete", "add"]))
    if op == "replace":
        parent[last] = draw(json_values)
    elif op == "delete":
        del parent[last]
    else:
        target = parent[last] if isinstance(parent[last], dict) else parent
        if isinstance(target, dict):
            target[draw(st.text(min_size=1, max_size=10))] = draw(json_values)
        else:
            target.append(draw(json_values))
    return d


def _dump(obj) -> str:
    return json.dumps(obj, allow_nan=True)      # NaN / Infinity reach the file as such


# ---- the property ----------------------------------------------------------------------------

def cli(*argv, ok=(0, 3), silent_3=False):
    """Run `plan ...` in-process; assert the exit code and the one-line error (`silent_3`:
    exit 3 may come with no line, as `plan sweep`'s table says what did not fit)."""
    out, err = io.StringIO(), io.StringIO()
    t = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    took = time.perf_counter() - t
    e = err.getvalue()
    assert took < LIMIT_S, f"{argv}: {took:.1f} s"
    assert "Traceback" not in e, e
    assert code in (*ok, 2), (code, e)
    if code == 3 and silent_3:
        assert e == "", repr(e)
    elif code != 0:
        assert e.startswith("plan: error:") and e.count("\n") == 1, repr(e)
    return code, e


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module")
def plan_doc(work):
    p = work / "good-plan.json"
    code = main(["--model", "llama8b", "--cluster", "h100x8", "--tp", "2", "--pp", "2",
                 "--dp", "2", "--seq-len", "1024", "--global-batch", "16", "--out", str(p),
                 "--json"])
    assert code == 0
    return json.loads(p.read_text())


HF = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256,
      "intermediate_size": 704, "num_attention_heads": 8, "num_key_value_heads": 4,
      "vocab_size": 4096, "max_position_embeddings": 2048, "hidden_act": "silu",
      "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False}
SPEC = {"name": "tiny", "num_layers": 4, "hidden": 256, "ffn_hidden": 704, "num_heads": 8,
        "num_kv_heads": 4, "vocab_size": 4096, "max_seq_len": 2048, "gated_mlp": True,
        "activation": "silu", "norm": "rmsnorm", "position": "rope", "dropout": 0.0}
CLUSTER = {"name": "mine", "base": "h100", "num_gpus": 8, "gpus_per_node": 8,
           "memory_gib": 80, "internode_gbps_per_gpu": 40.0}
CLUSTER_FULL = {"num_gpus": 8, "gpu": {"name": "g", "peak_tflops": 900.0, "memory_gib": 80.0,
                                        "hbm_gbps": 3000.0, "gemm_efficiency": 0.7,
                                        "attn_efficiency": 0.4, "nvlink_busbw_gbps": 300.0,
                                        "nvlink_p2p_gbps": 300.0, "nvlink_latency_us": 8.0,
                                        "internode_gbps_per_gpu": 40.0,
                                        "internode_latency_us": 15.0}}


# ---- model config ----------------------------------------------------------------------------

@FUZZ
@given(doc=st.one_of(json_values, mutated(HF), mutated(SPEC)))
def test_fuzz_model_config(work, doc):
    f = work / "model.json"
    f.write_text(_dump(doc))
    cli("--model", f, "--cluster", "h100x8", *FIXED)


# ---- cluster file ----------------------------------------------------------------------------

@FUZZ
@given(doc=st.one_of(json_values, mutated(CLUSTER), mutated(CLUSTER_FULL)))
def test_fuzz_cluster_file(work, doc):
    f = work / "cluster.json"
    f.write_text(_dump(doc))
    code, err = cli("--model", "llama8b", "--cluster", f, *FIXED)
    if code == 0:        # accepted: then it is a cluster the planner can describe again
        from planner.catalog import get_cluster
        c = get_cluster(str(f))
        assert 0 < c.gpu.gemm_efficiency <= 1 and c.gpus_per_node <= c.num_gpus


@FUZZ
@given(name=st.one_of(st.text(max_size=30), st.from_regex(r"[a-z0-9]{1,6}x[0-9]{1,30}",
                                                          fullmatch=True)))
def test_fuzz_cluster_names(name):
    if "\x00" in name or name.startswith("-"):
        return          # argv cannot hold NUL; a leading '-' is an option to argparse
    cli("--model", "llama8b", "--cluster", name, *FIXED[:-4], "--seq-len", "512",
        "--global-batch", "8")


# ---- plan show / plan launch -----------------------------------------------------------------

@FUZZ
@given(data=st.data())
def test_fuzz_plan_show_and_launch(work, plan_doc, data):
    doc = data.draw(st.one_of(mutated(plan_doc), json_values), label="plan")
    f = work / "plan.json"
    f.write_text(_dump(doc))
    cli("show", f, ok=(0,))
    cli("launch", f, "--nnodes", data.draw(st.sampled_from(["1", "2", "8"])), ok=(0,))
    fmt = data.draw(st.sampled_from(["megatron", "deepspeed", "torchtitan", None]))
    if fmt:
        cli("show", f, "--export", fmt, ok=(0,))


# ---- --profile -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def prof_doc():
    with open(PROFILE) as f:
        return json.load(f)


@FUZZ
@given(data=st.data())
def test_fuzz_profile(work, prof_doc, data):
    doc = data.draw(st.one_of(mutated(prof_doc), json_values), label="profile")
    f = work / "profile.json"
    f.write_text(_dump(doc))
    m = work / "tiny.json"
    if not m.exists():
        m.write_text(json.dumps(prof_doc["models"][0]["model"]))
    cli("--model", m, "--cluster", "cpux2", "--profile", f, "--tp", "1", "--pp", "1",
        "--dp", "2", "--zero", "0", "--micro-batch", "1", "--recompute", "none", "--no-sp",
        "--seq-len", "256", "--global-batch", "8")


def test_profile_layer_point_without_a_length_is_bad_input(work, prof_doc):
    """Found by test_fuzz_profile: a layer point's `seq_len` (a point measured at another
    length than its entry's) set to null reached the layers' FLOP count as None, a traceback;
    now the schema refuses it in one line."""
    doc = json.loads(json.dumps(prof_doc))
    doc["models"][0]["layer"]["points"][0]["seq_len"] = None
    f = work / "null-seq.json"
    f.write_text(_dump(doc))
    m = work / "tiny-null-seq.json"
    m.write_text(json.dumps(prof_doc["models"][0]["model"]))
    code, err = cli("--model", m, "--cluster", "cpux2", "--profile", f, "--seq-len", "256",
                    "--global-batch", "8", ok=())
    assert code == 2 and "seq_len" in err


def test_profile_loader_direct(prof_doc, tmp_path):
    """load_profile itself: BadInput (never another exception) for broken shapes."""
    from planner.profile import load_profile

    @FUZZ
    @given(doc=mutated(prof_doc))
    def inner(doc):
        f = tmp_path / "p.json"
        f.write_text(_dump(doc))
        try:
            load_profile(f)
        except BadInput as e:
            assert "\n" not in str(e)
    inner()


# ---- plan sweep and the command line ---------------------------------------------------------

lists = st.lists(st.one_of(st.sampled_from(["8", "16", "0", "-8", "9" * 30, "1e3", "x", ""]),
                           st.integers(-5, 10 ** 13).map(str)), min_size=0, max_size=4
                 ).map(",".join)


@settings(FUZZ, max_examples=max(5, FUZZ.max_examples // 2))
@given(clusters=st.lists(st.one_of(st.sampled_from(["h100x8", "h100x16", "a100x8",
                                                    "h100x1000000000", "tpux8", ""]),
                                   st.from_regex(r"h100x[0-9]{1,12}", fullmatch=True)),
                         min_size=1, max_size=3).map(",".join),
       seqs=lists, batches=lists)
def test_fuzz_sweep(clusters, seqs, batches):
    argv = ["sweep", "--model", "llama8b", "--clusters", clusters]
    if seqs:
        argv += ["--seq-lens", seqs]
    if batches:
        argv += ["--global-batches", batches]
    cli(*argv, silent_3=True)


flag_values = st.one_of(st.sampled_from(["0", "-1", "1", "2", "8", "9" * 400, "1.5", "x",
                                         "", "4096", "16"]),
                        st.integers(-3, 2 ** 45).map(str))


@FUZZ
@given(flags=st.dictionaries(st.sampled_from(["--tp", "--pp", "--dp", "--micro-batch",
                                              "--seq-len", "--global-batch", "--vpp", "--zero",
                                              "--top"]), flag_values, max_size=4))
def test_fuzz_plan_flags(flags):
    argv = ["--model", "llama8b", "--cluster", "h100x8"]
    for k, v in flags.items():
        argv += [k, v] if not v.startswith("-") else [f"{k}={v}"]
    # fix the rest so each call is one candidate (or refused before the search)
    for k, v in (("--tp", "1"), ("--pp", "1"), ("--zero", "3"), ("--micro-batch", "1"),
                 ("--seq-len", "512"), ("--global-batch", "8")):
        if k not in flags:
            argv += [k, v]
    cli(*argv, "--recompute", "full", "--no-sp")
