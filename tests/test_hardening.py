"""Issue 13's kinds of bad input, one test each: a clear line on stderr and exit 2 (3 = nothing
fits), never a traceback, nothing accepted silently, no injection, no hang."""
from __future__ import annotations

import copy
import json
import math
import os
import shlex
import time

import pytest

from planner import filecheck as S
from planner.limits import MAX_GPUS, divisors
from planner.catalog import get_cluster, get_gpu, get_model
from planner.cli import main
from planner.errors import BadInput
from planner.launch import launch_commands, torchrun_command
from planner.plan import Plan
from planner.specs import Gpu, Model
from tests.cli_helpers import one_line, run, write

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROFILE = os.path.join(ROOT, "benchmarks", "profiles", "cpux2-tiny-llama.json")
# one fixed configuration: a single candidate, so each call is quick
FIXED = ["--tp", "1", "--pp", "1", "--dp", "8", "--zero", "3", "--micro-batch", "1",
         "--recompute", "full", "--no-sp", "--seq-len", "512", "--global-batch", "8"]
HF = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256,
      "intermediate_size": 704, "num_attention_heads": 8, "num_key_value_heads": 4,
      "vocab_size": 4096, "max_position_embeddings": 2048}
CLUSTER = {"gpu": "h100", "num_gpus": 8, "gpus_per_node": 8}


# ---- model config ----------------------------------------------------------------------------

@pytest.mark.parametrize("change, needle", [
    ({"hidden_act": 3}, "hidden_act must be a string, got 3"),
    ({"hidden_act": "tanh"}, "hidden_act"),
    ({"num_hidden_layers": int("9" * 400)}, "400-digit"),
    ({"num_hidden_layers": True}, "num_hidden_layers must be an integer, got true"),
    ({"num_hidden_layers": 4.0}, "must be an integer"),
    ({"num_key_value_heads": 0}, "num_key_value_heads must be at least 1"),
    ({"num_key_value_heads": 3}, "not divisible"),
    ({"hidden_size": "256"}, "hidden_size must be an integer"),
    ({"rms_norm_eps": -1}, "rms_norm_eps must be greater than 0"),
    ({"rope_theta": "big"}, "rope_theta must be a number"),
    ({"tie_word_embeddings": "no"}, "tie_word_embeddings must be true or false"),
    ({"vocab_size": None}, "missing 'vocab_size'"),
    ({"model_type": "mamba"}, "model_type"),
    ({"model_type": ["llama"]}, "model_type"),
])
def test_hf_config_values_are_checked(capsys, tmp_path, change, needle):
    cfg = {**HF, **change}
    cfg = {k: v for k, v in cfg.items() if v is not None or k != "vocab_size"}
    one_line(*run(capsys, "--model", write(tmp_path, "m.json", cfg), "--cluster", "h100x8",
                  *FIXED)[::2], needle=needle)


def test_hf_config_nan_and_deep_nesting(capsys, tmp_path):
    nan = json.dumps({**HF, "rms_norm_eps": float("nan")})
    one_line(*run(capsys, "--model", write(tmp_path, "n.json", nan, raw=True), "--cluster",
                  "h100x8")[::2], needle="NaN")
    deep = "[" * 100_000 + "]" * 100_000
    for flag in ("--model", "--cluster", "--profile"):
        args = {"--model": "llama8b", "--cluster": "h100x8"}
        args[flag] = write(tmp_path, "deep.json", deep, raw=True)
        argv = [x for kv in args.items() for x in kv]
        one_line(*run(capsys, *argv)[::2], needle="nested deeper")
    for cmd in (["show"], ["launch"]):
        extra = ["--nnodes", "1"] if cmd == ["launch"] else []
        one_line(*run(capsys, *cmd, str(tmp_path / "deep.json"), *extra)[::2],
                 needle="nested deeper")


def test_own_model_spec_is_checked(capsys, tmp_path):
    spec = get_model("llama8b").to_dict()
    spec.pop("name")
    code, _, err = run(capsys, "--model", write(tmp_path, "m.json", {**spec, "num_layer": 3}),
                       "--cluster", "h100x8")
    one_line(code, err, needle="did you mean 'num_layers'")
    code, _, err = run(capsys, "--model", write(tmp_path, "m.json", {**spec, "dropout": 1.5}),
                       "--cluster", "h100x8")
    one_line(code, err, needle="dropout must be less than 1")


def test_model_names_with_control_characters_are_refused(tmp_path):
    with pytest.raises(BadInput, match="control characters"):
        get_model("llama8b").scaled(name="x\nrm -rf ~")
    p = tmp_path / "m.json"
    p.write_text(json.dumps({**HF, "_name": "a\rb"}))
    with pytest.raises(BadInput, match="control characters"):
        get_model(str(p))
    with pytest.raises(BadInput, match="control characters"):
        get_model("llama8b\n")


# ---- cluster file (issue 12 item 3 too) -------------------------------------------------------

@pytest.mark.parametrize("change, needle", [
    ({"memory_gib": "80"}, 'memory_gib must be a number, got "80" (a string)'),
    ({"memory_gib": -5}, "memory_gib must be greater than 0"),
    ({"hbm_gbps": 0}, "hbm_gbps must be greater than 0"),
    ({"nvlink_busbw_gbps": 0}, "nvlink_busbw_gbps"),
    ({"internode_gbps_per_gpu": 0}, "internode_gbps_per_gpu"),
    ({"peak_tflops": 0}, "peak_tflops"),
    ({"attn_efficiency": 0}, "attn_efficiency"),
    ({"gemm_efficiency": 1e9}, "gemm_efficiency must be at most 1"),
    ({"num_gpus": 8.7}, "num_gpus must be an integer, got 8.7"),
    ({"num_gpus": True}, "num_gpus must be an integer"),
    ({"num_gpus": 10 ** 12}, "more than this planner plans for"),
    ({"gpus_per_node": 16}, "gpus_per_node 16 is more than num_gpus 8"),
    ({"internode_gbps": 50}, "did you mean 'internode_gbps_per_gpu'"),
    ({"gpu": "tpu"}, "unknown GPU 'tpu'"),
    ({"gpu": 7}, "gpu must be a catalog GPU name or an object"),
    ({"gpu": {"peak_tflops": 900}}, "gpu is missing"),
    ({"gpu": {"base": "h100", "hbm": 1}}, "gpu has unknown key \"hbm\""),
    ({"base": "h100"}, "either 'gpu' or 'base'"),
    ({"name": "a\nb"}, "control characters"),
])
def test_cluster_file_values_are_checked(capsys, tmp_path, change, needle):
    code, _, err = run(capsys, "--model", "llama8b", "--cluster",
                       write(tmp_path, "c.json", {**CLUSTER, **change}), *FIXED)
    one_line(code, err, needle=needle)


def test_cluster_file_unknown_key_lists_the_known_ones(tmp_path):
    with pytest.raises(BadInput) as e:
        get_cluster(write(tmp_path, "c.json", {**CLUSTER, "internode_gbps": 1}))
    for k in ("num_gpus", "gpus_per_node", "base", "internode_gbps_per_gpu", "memory_gib"):
        assert k in str(e.value)


def test_cluster_file_base_plus_overrides(tmp_path):
    c = get_cluster(write(tmp_path, "c.json", {"base": "h100", "num_gpus": 16,
                                                "memory_gib": 40, "hbm_gbps": 2000}))
    h = get_gpu("h100")
    assert (c.num_gpus, c.gpus_per_node, c.gpu.name, c.gpu.memory_gib, c.gpu.hbm_gbps) == \
        (16, 8, "h100", 40, 2000)
    assert c.gpu.peak_tflops == h.peak_tflops and c.gpu.nvlink_busbw_gbps == h.nvlink_busbw_gbps
    c = get_cluster(write(tmp_path, "d.json", {"gpu": {"base": "a100", "memory_gib": 40},
                                                "num_gpus": 4, "name": "mine"}))
    assert (c.name, c.gpus_per_node, c.gpu.memory_gib, c.gpu.peak_tflops) == \
        ("mine", 4, 40, get_gpu("a100").peak_tflops)
    full = {k: v for k, v in get_gpu("h100").__dict__.items()}
    c = get_cluster(write(tmp_path, "e.json", {"gpu": full, "num_gpus": 8}))
    assert c.gpu == get_gpu("h100")


def test_negative_memory_is_exit_2_not_3(capsys, tmp_path):
    code, _, err = run(capsys, "--model", "llama8b", "--cluster",
                       write(tmp_path, "c.json", {**CLUSTER, "memory_gib": -5}))
    one_line(code, err, expect=2)


# ---- plan files ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def plan_dict(tmp_path_factory):
    p = tmp_path_factory.mktemp("plan") / "p.json"
    code = main(["--model", "llama8b", "--cluster", "h100x8", "--tp", "2", "--pp", "2",
                 "--dp", "2", "--seq-len", "1024", "--global-batch", "16", "--out", str(p),
                 "--engine", "runtime", "--json"])
    assert code == 0
    return json.loads(p.read_text())


def _edit(d, path, value):
    d = copy.deepcopy(d)
    *head, last = path
    x = d
    for k in head:
        x = x[k]
    if value is KeyError:
        del x[last]
    else:
        x[last] = value
    return d


@pytest.mark.parametrize("path, value, needle", [
    (("batch", "seq_len"), "32", "batch.seq_len must be an integer"),
    (("batch", "seq_len"), 32.0, "batch.seq_len must be an integer"),
    (("stages", 0, "layers"), [0], "stages[0].layers must have at least 2"),
    (("stages", 0, "layers"), [0, 7.5], "stages[0].layers[1] must be an integer"),
    (("estimate",), None, "estimate must be an object, got null"),
    (("estimate", "mfu"), 1.75, "estimate.mfu must be at most 1"),
    (("parallelism", "sequence_parallel"), "no", "sequence_parallel must be true or false"),
    (("parallelism", "sequence_parallel"), 0, "sequence_parallel must be true or false"),
    (("parallelism", "zero_stage"), True, "zero_stage"),
    (("parallelism", "tpp"), 2, "did you mean 'tp'"),
    (("parallelism", "tp"), KeyError, "missing field 'tp'"),
    (("cluster", "num_gpus"), 16, "has 16"),
    (("cluster", "gpu_memory_gib"), 40, "gpu_memory_gib 40 differs"),
    (("cluster", "gpu_spec", "memory_gib"), "80", "gpu_spec.memory_gib must be a number"),
    (("model", "spec", "num_kv_heads"), 0, "num_kv_heads must be at least 1"),
    (("model", "spec", "name"), "x\n$(reboot)", "control characters"),
    (("model", "num_layers"), 31, "differ from model.spec"),
    (("schema_version",), True, "schema_version true"),
    (("search", "seconds"), "fast", "search.seconds must be a number"),
    (("stages", 0, "memory_gib", "total"), -1, "memory_gib.total must be at least 0"),
    (("extra",), 1, "unknown key \"extra\""),
])
def test_hand_edited_plans_are_checked(capsys, tmp_path, plan_dict, path, value, needle):
    f = write(tmp_path, "p.json", _edit(plan_dict, path, value))
    for cmd in (["show", f], ["launch", f, "--nnodes", "1"]):
        one_line(*run(capsys, *cmd)[::2], needle=needle)
    if path != ("cluster", "num_gpus"):
        with pytest.raises(BadInput, match="plan "):
            Plan.load(f)


def test_plan_for_fewer_gpus_than_its_cluster_is_refused(capsys, tmp_path, plan_dict):
    d = _edit(plan_dict, ("cluster", "num_gpus"), 16)
    f = write(tmp_path, "p.json", d)
    for cmd in (["show", f], ["show", f, "--export", "megatron"], ["launch", f, "--nnodes", "2"],
                ["launch", f, "--nnodes", "1", "--slurm"]):
        one_line(*run(capsys, *cmd)[::2], needle="tp*pp*dp = 8 GPUs")
    assert Plan.load(f).parallelism.world_size == 8      # the runtime may run it on 8


def test_saved_plan_round_trips(plan_dict):
    p = Plan.from_dict(plan_dict, whole_cluster=True)
    assert p.to_dict() == plan_dict


# ---- profiles --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def prof():
    with open(PROFILE) as f:
        return json.load(f)


@pytest.mark.parametrize("path, value, needle", [
    (("models",), [], "models must have at least 1"),
    (("models", 0, "layer", "points"), [], "points must have at least 1"),
    (("models", 0, "layer", "points", 0, "mbs"), 0, "mbs must be at least 1"),
    (("models", 0, "layer", "points", 0, "tp"), "1", "tp must be an integer"),
    (("models", 0, "layer", "points", 1, "mbs"), 1, "two points at tp=1 micro-batch 1"),
    (("models", 0, "optimizer"), KeyError, "missing field 'optimizer'"),
    (("models", 0, "head"), [], "head must have at least 1"),
    (("links", "intra", "2", "size"), 0, "size must be at least 1"),
    (("links", "intra", "0"), {"size": 2, "ops": {}}, "must be in 1.."),
    (("links", "intra", "2", "ops", "all_reduce", "fit", "busbw_gbps"), 0, "busbw_gbps"),
    (("device", "gemm", "tflops"), 0, "tflops must be greater than 0"),
    (("hardware", "memory_gib"), -1, "memory_gib must be greater than 0"),
    (("hardware", "world_size"), 2.5, "world_size must be an integer"),
    (("overlap", "overlap_slowdown"), float("inf"), "Infinity"),
    (("settings", "statistic"), "mean", "statistic must be"),
    (("hardware",), KeyError, "missing field 'hardware'"),
    (("bogus",), 1, "unknown key \"bogus\""),
])
def test_bad_profiles_are_one_line(capsys, tmp_path, prof, path, value, needle):
    f = tmp_path / "p.json"
    f.write_text(json.dumps(_edit(prof, path, value)))      # inf is written as Infinity
    model = write(tmp_path, "tiny.json", prof["models"][0]["model"])
    code, _, err = run(capsys, "--model", model, "--cluster", "cpux2", "--profile", str(f))
    one_line(code, err, needle=needle)


def test_good_profile_plans_and_keeps_efficiencies_fractions(capsys, tmp_path, prof):
    model = write(tmp_path, "tiny.json", prof["models"][0]["model"])
    code, out, err = run(capsys, "--model", model, "--cluster", "cpux2", "--profile", PROFILE,
                         "--seq-len", "256", "--global-batch", "8", "--json")
    assert code == 0, err
    d = json.loads(out)
    spec = d["cluster"]["gpu_spec"]
    assert 0 < spec["gemm_efficiency"] <= 1 and 0 < spec["attn_efficiency"] <= 1
    assert 0 < d["estimate"]["mfu"] <= 1
    Plan.from_dict(d, whole_cluster=True)                   # what it writes, it reads back


# ---- injection -------------------------------------------------------------------------------

def test_launch_quotes_paths_and_refuses_control_characters(tmp_path, plan_dict):
    plan = Plan.from_dict(plan_dict)
    odd = str(tmp_path / "my plan; $(reboot) `x` 'q'.json")
    text = launch_commands(plan, odd, 1)
    line = [x for x in text.splitlines() if x.startswith("torchrun")][0]
    argv = shlex.split(line)
    assert argv[argv.index("--plan") + 1] == odd
    text = launch_commands(plan, odd, 1, slurm=True)
    line = [x for x in text.splitlines() if x.startswith("srun")][0]
    assert shlex.split(line)[shlex.split(line).index("--plan") + 1] == odd
    for bad in ("a\nrm -rf ~", "a\rb", "a\x1bb", "a\u2028b"):
        with pytest.raises(BadInput, match="control characters"):
            launch_commands(plan, bad, 1)
        with pytest.raises(BadInput, match="control characters"):
            torchrun_command(1, 8, "p.json", "localhost:1", extra_args=[bad])
        with pytest.raises(BadInput, match="control characters"):
            launch_commands(plan, "p.json", 1, slurm=True, job_name=bad)


def test_a_plan_named_to_inject_never_reaches_the_launch_lines(capsys, tmp_path, plan_dict):
    d = copy.deepcopy(plan_dict)
    d["model"]["name"] = d["model"]["spec"]["name"] = "x\ntouch /tmp/pwned"
    f = write(tmp_path, "p.json", d)
    for cmd in (["launch", f, "--nnodes", "1"], ["launch", f, "--nnodes", "1", "--slurm"],
                ["show", f, "--export", "megatron"], ["show", f, "--export", "torchtitan"]):
        code, out, err = run(capsys, *cmd)
        one_line(code, err, needle="control characters")
        assert out == ""


def test_check_name_and_toml_string():
    assert S.check_name("llama-3.1 405B (mine)") == "llama-3.1 405B (mine)"
    for bad in ("", "  ", "a\tb", "a\x00b", "x" * 201, 3, None):
        with pytest.raises(BadInput):
            S.check_name(bad)
    assert json.loads(S.toml_string('a"b\\c')) == 'a"b\\c'


# ---- bounded work ----------------------------------------------------------------------------

def test_divisors_are_exact_and_quick():
    for n in list(range(1, 400)) + [720720, 2 ** 20, 999983]:
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]
    t = time.perf_counter()
    assert len(divisors(10 ** 12)) == 169 and divisors(999_999_999_989) == [1, 999_999_999_989]
    assert time.perf_counter() - t < 2.0
    for bad in (0, -4, True, 2.0):
        with pytest.raises(ValueError):
            divisors(bad)


@pytest.mark.parametrize("cluster", ["h100x1000000000", "h100x" + "9" * 5000,
                                     f"h100x{MAX_GPUS + 1}"])
def test_huge_gpu_counts_are_refused_quickly(capsys, cluster):
    one_line(*run(capsys, "--model", "llama70b", "--cluster", cluster, limit_s=2.0)[::2],
             needle="more than this planner plans for")


def test_huge_cluster_file_is_refused_quickly(capsys, tmp_path):
    f = write(tmp_path, "c.json", {**CLUSTER, "num_gpus": 10 ** 12})
    one_line(*run(capsys, "--model", "llama70b", "--cluster", f, limit_s=2.0)[::2],
             needle="more than this planner plans for")


def test_sweeps_are_bounded(capsys):
    one_line(*run(capsys, "sweep", "--model", "llama8b", "--clusters",
                  "h100x8,h100x1000000000", limit_s=2.0)[::2], needle="more than this planner")
    many = ",".join(f"h100x{8 * i}" for i in range(1, 20))
    one_line(*run(capsys, "sweep", "--model", "llama8b", "--clusters", many,
                  "--seq-lens", "1024,2048,4096", "--global-batches", "8,16,32,64,128",
                  limit_s=2.0)[::2], needle="points, more than")
    one_line(*run(capsys, "sweep", "--model", "llama8b", "--clusters", "h100x8",
                  "--seq-lens", "9" * 5000, limit_s=2.0)[::2], needle="too large")


@pytest.mark.parametrize("flag", ["--seq-len", "--global-batch", "--micro-batch", "--tp"])
def test_huge_integers_on_the_command_line(capsys, flag):
    one_line(*run(capsys, "--model", "llama8b", "--cluster", "h100x8", flag, "9" * 400,
                  limit_s=2.0)[::2], needle="too large")


# ---- reading files ---------------------------------------------------------------------------

def test_strict_json_reading(tmp_path):
    cases = {
        '{"a": 1, "a": 2}': "duplicate key 'a'",
        '{"a": NaN}': "NaN",
        '{"a": -Infinity}': "Infinity",
        '{"a": ' + "1" * 5000 + "}": "not valid JSON",
        "[" * 40 + "]" * 40: "nested deeper than 32",
        '{"a": 1': "not valid JSON (line 1",
        "": "not valid JSON",
    }
    for text, needle in cases.items():
        p = tmp_path / "x.json"
        p.write_text(text)
        with pytest.raises(BadInput, match=None) as e:
            S.read_json(p, "plan")
        assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)
    p = tmp_path / "x.json"
    p.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(BadInput, match="not UTF-8"):
        S.read_json(p, "plan")
    assert S.read_json_object(_ok(tmp_path), "plan") == {"a": [1, {"b": None}]}


def _ok(tmp_path):
    p = tmp_path / "ok.json"
    p.write_text('{"a": [1, {"b": null}]}')
    return p


def test_fifo_device_directory_and_size_do_not_hang(tmp_path, monkeypatch):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)                         # opening it would block until a writer came
    t = time.perf_counter()
    for path in (fifo, "/dev/zero", tmp_path):
        with pytest.raises(BadInput, match="cannot read"):
            S.read_json(path, "cluster file")
    assert time.perf_counter() - t < 1.0
    big = tmp_path / "big.json"
    big.write_text("[" + "0," * 1000 + "0]")
    monkeypatch.setitem(S.MAX_BYTES, "plan", 1000)
    with pytest.raises(BadInput, match="more than the 1000"):
        S.read_json(big, "plan")
    with pytest.raises(BadInput, match="cannot read"):
        S.read_json("a\x00b", "plan")


def test_messages_are_one_line_whatever_the_keys(tmp_path):
    with pytest.raises(BadInput) as e:
        get_cluster(write(tmp_path, "c.json", {**CLUSTER, "bad\nkey" * 30: 1}))
    assert "\n" not in str(e.value) and len(str(e.value)) < 600


# ---- the checkers ----------------------------------------------------------------------------

def test_checkers():
    assert S.Int(1, 3)(2) == 2
    for bad in (True, 2.0, "2", None, 0, 4):
        with pytest.raises(S.Invalid):
            S.Int(1, 3)(bad)
    assert S.Num(gt=0)(3) == 3.0
    for bad in (0, -1, math.nan, math.inf, "1", False, 10 ** 400):
        with pytest.raises(S.Invalid):
            S.Num(gt=0)(bad)
    assert S.Bool()(False) is False
    for bad in ("no", "false", 0, 1, None):
        with pytest.raises(S.Invalid):
            S.Bool()(bad)
    assert S.Enum(0, 1)(1) == 1
    for bad in (True, 1.0, "1"):
        with pytest.raises(S.Invalid):
            S.Enum(0, 1)(bad)
    o = S.Obj({"a": S.Int(), "b": (S.Str(), "x")}, fill_defaults=True)
    assert o({"a": 1}) == {"a": 1, "b": "x"}
    with pytest.raises(S.Invalid, match="missing field 'a'"):
        o({})
    with pytest.raises(S.Invalid, match="unknown key \"c\""):
        o({"a": 1, "c": 2})


def test_gpu_and_model_constructors_check_their_fields():
    with pytest.raises(BadInput, match="memory_gib"):
        Gpu("g", 1, -1, 1, 0.5, 0.5, 1, 1, 1, 1, 1)
    with pytest.raises(BadInput, match="num_layers"):
        Model("m", num_layers=0, hidden=8, ffn_hidden=8, num_heads=1, num_kv_heads=1,
              vocab_size=8, max_seq_len=8)


def test_schema_import_is_cheap():
    """The typed layer costs far less than the ~1 s `plan` takes (pydantic / jsonschema would
    add 70-80 ms of imports alone)."""
    import subprocess
    import sys
    code = ("import time; t = time.perf_counter(); import planner.filecheck, planner.limits; "
            "print(time.perf_counter() - t)")
    best = min(float(subprocess.run([sys.executable, "-c", code], cwd=ROOT, text=True,
                                    capture_output=True, env={**os.environ, "PYTHONPATH": ROOT}
                                    ).stdout) for _ in range(3))
    assert best < 0.05


def test_suggestions_never_build_a_cluster_beyond_the_cap(capsys, tmp_path):
    """Nothing fits anywhere on 2^20 GPUs: exit 3 with the closest candidate, not a refusal of
    the 2^21-GPU cluster the suggestions would try next."""
    f = write(tmp_path, "c.json", {"base": "h100", "num_gpus": MAX_GPUS, "memory_gib": 0.01})
    code, _, err = run(capsys, "--model", "llama8b", "--cluster", f, "--engine", "runtime",
                       "--tp", "8", "--pp", "4", "--zero", "3", "--micro-batch", "1", "--recompute", "full",
                       "--seq-len", "512", limit_s=30.0)
    one_line(code, err, expect=3, needle="nothing fits")
