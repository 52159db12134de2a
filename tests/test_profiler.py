"""The profiler and `plan --profile`: one tiny quick profile (2 gloo processes), then checks of
its contents, of how measured figures move the planner's estimate, and of the error paths."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.cli import main as plan_main
from planner.cost.stage import Candidate, evaluate, stage_coefficients
from planner.catalog import get_cluster, get_model
from planner.errors import BadInput
from planner.plan import Plan
from planner.profile import (FORMAT, VERSION, Profile, apply_profile, load_profile,
                             merge_profiles)

ROOT = Path(__file__).resolve().parent.parent
TINY = {"name": "tiny-prof", "num_layers": 2, "hidden": 64, "ffn_hidden": 128, "num_heads": 4,
        "num_kv_heads": 2, "vocab_size": 512, "max_seq_len": 128}
SEQ = 64


@pytest.fixture(scope="module")
def prof(tmp_path_factory):
    d = tmp_path_factory.mktemp("prof")
    cfg = d / "tiny.json"
    cfg.write_text(json.dumps(TINY))
    out = d / "profile.json"
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", "-m", "profiler", "--model", str(cfg),
                        "--seq-len", str(SEQ), "--quick", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return {"path": out, "model": str(cfg), "data": json.loads(out.read_text())}


def _write(tmp_path, name, d):
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return p


def _text(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def _cand(**kw):
    base = dict(tp=1, pp=1, dp=2, zero=0, sp=False, mbs=2, seq_len=SEQ, global_batch=8)
    base.update(kw)
    return Candidate(**base)


# ---- the profile itself ---------------------------------------------------------------------

@pytest.mark.slow
def test_profile_validates_and_names_what_it_measured(prof):
    p = load_profile(prof["path"])
    d = p.data
    assert d["format"] == FORMAT and d["version"] == VERSION
    assert d["created_utc"] and d["software"]["torch"] and d["software"]["backend"] == "gloo"
    assert d["hardware"]["device_type"] == "cpu" and d["hardware"]["world_size"] == 2
    m = d["models"][0]
    assert m["model"]["name"] == "tiny-prof" and m["seq_len"] == SEQ
    pts = m["layer"]["points"]
    assert {p["tp"] for p in pts} == {1, 2}
    for q in pts:
        assert q["fwd_s"]["median"] > 0 and q["bwd_s"]["median"] > 0 and q["fwd_s"]["n"] >= 3
        assert q["fwd_s"]["p10"] <= q["fwd_s"]["median"] <= q["fwd_s"]["p90"]
    assert set(m["layer"]["fit"]) == {"1", "2"}
    # memory: more samples save more; recompute saves less than none, full least
    tp1 = sorted((q for q in pts if q["tp"] == 1), key=lambda q: q["mbs"])
    assert tp1[-1]["saved_bytes"] > tp1[0]["saved_bytes"] > 0
    rec = m["recompute"]["1"]
    assert rec["full"]["saved_bytes"] < rec["selective"]["saved_bytes"] <= rec["none"]["saved_bytes"]
    assert m["optimizer"]["s_per_param"] > 0 and m["optimizer"]["state_bytes_per_param"] == 8
    ops = d["links"]["intra"]["2"]["ops"]
    assert set(ops) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"}
    for op in ops.values():
        assert op["fit"]["busbw_gbps"] > 0 and op["fit"]["alpha_s"] >= 0
        assert all(q["busbw_gbps"] > 0 and q["algbw_gbps"] > 0 for q in op["points"])
    ar = ops["all_reduce"]["points"][-1]     # n = 2: busbw = algbw * 2(n-1)/n = algbw
    assert ar["busbw_gbps"] == pytest.approx(ar["algbw_gbps"])
    assert 0.0 <= d["overlap"]["overlap_slowdown"] <= 1.0


@pytest.mark.slow
def test_measured_figures_flow_into_the_estimate(prof):
    p = load_profile(prof["path"])
    model = get_model(prof["model"])
    catalog = get_cluster("cpux2")
    cluster, engine, notes = apply_profile(p, catalog, model)
    assert any("layer forward/backward: measured" in n for n in notes)
    assert any("intra-node links" in n for n in notes)
    assert cluster.gpu.nvlink_busbw_gbps != catalog.gpu.nvlink_busbw_gbps
    # at a measured shape the per-layer coefficient is the measured point itself
    pt = next(q for q in p.data["models"][0]["layer"]["points"] if q["tp"] == 1 and q["mbs"] == 2)
    k = stage_coefficients(model, cluster, _cand(), engine)[0]
    assert k.compute_layer == pytest.approx(pt["fwd_s"]["median"] + pt["bwd_s"]["median"])
    assert k.mem_layer["activations"] == pytest.approx(pt["saved_bytes"])


@pytest.mark.slow
def test_slower_layers_in_the_profile_raise_the_prediction(prof, tmp_path):
    model = get_model(prof["model"])
    catalog = get_cluster("cpux2")
    slow = copy.deepcopy(prof["data"])
    m = slow["models"][0]
    for q in m["layer"]["points"] + m["layer_runtime_tp"]:   # shard and runtime-TP layers
        for k in ("fwd_s", "bwd_s"):
            q[k] = {key: (v if key == "n" else [x * 2 for x in v] if key == "samples"
                          else v * 2) for key, v in q[k].items()}
        if "saved_bytes" in q:
            q["saved_bytes"] *= 2
    base, base_engine, _ = apply_profile(load_profile(prof["path"]), catalog, model)
    slower, slower_engine, _ = apply_profile(Profile(slow, "slow"), catalog, model)
    for c in (_cand(), _cand(tp=2, dp=1, mbs=4), _cand(pp=2, dp=1, mbs=1, schedule="1f1b")):
        n = [model.num_layers // c.pp] * c.pp
        e0 = evaluate(model, base, c, n, [0] * c.pp, engine=base_engine)
        e1 = evaluate(model, slower, c, n, [0] * c.pp, engine=slower_engine)
        k0 = stage_coefficients(model, base, c, base_engine)[0]
        k1 = stage_coefficients(model, slower, c, slower_engine)[0]
        assert k1.compute_layer >= 1.99 * k0.compute_layer
        assert e1.step_time_s > e0.step_time_s * 1.05
        assert e1.peak_memory_gib > e0.peak_memory_gib
    # and at another sequence length (calibrated, not measured directly) too
    c = _cand(seq_len=2 * SEQ)
    assert stage_coefficients(model, slower, c, slower_engine)[0].compute_layer == \
        pytest.approx(2 * stage_coefficients(model, base, c, base_engine)[0].compute_layer)
    assert evaluate(model, slower, c, [2], [0], engine=slower_engine).step_time_s > \
        evaluate(model, base, c, [2], [0], engine=base_engine).step_time_s * 1.05


@pytest.mark.slow
def test_plan_cli_uses_the_profile(prof, tmp_path, capsys):
    out = tmp_path / "plan.json"
    rc = plan_main(["--model", prof["model"], "--cluster", "cpux2", "--seq-len", str(SEQ),
                    "--global-batch", "8", "--profile", str(prof["path"]), "--out", str(out),
                    "--json"])
    assert rc == 0
    plan = json.loads(out.read_text())
    used = plan["search"]["profile_used"]
    assert used and any("measured" in u for u in used)
    printed = json.loads(capsys.readouterr().out)
    assert printed["search"]["profile_used"] == used and printed["search"]["profile"]


def test_layers_faster_than_the_peak_raise_it_so_the_plan_stays_valid(tmp_path, capsys):
    """On a machine whose measured layers run at a higher model-FLOP rate than its GEMM probe
    and the catalog's peak (the committed CPU profile, measured on a quiet machine on
    2026-12-04: 72.6 GFLOP/s of layer against the catalog's 50), that rate is the peak: the
    plan's MFU stays at most 1 and the plan loads. Before, the closed loop's best plan said MFU
    1.28 and the runtime refused it ("estimate.mfu must be at most 1")."""
    path = ROOT / "benchmarks" / "profiles" / "cpux2-tiny-llama.json"
    d = json.loads(path.read_text())
    model = _write(tmp_path, "tiny-llama.json", d["models"][0]["model"])
    out = tmp_path / "plan.json"
    rc = plan_main(["--model", str(model), "--cluster", "cpux2", "--seq-len",
                    str(d["models"][0]["seq_len"]), "--global-batch", "8", "--profile", str(path),
                    "--out", str(out)])
    capsys.readouterr()
    assert rc == 0
    plan = Plan.load(str(out), whole_cluster=True)
    assert 0 < plan.estimate["mfu"] <= 1.0
    # a layer point without its own seq_len (the schema does not require one) is at the
    # entry's: the profile still plans
    for p in d["models"][0]["layer"]["points"]:
        p.pop("seq_len", None)
    rc = plan_main(["--model", str(model), "--cluster", "cpux2", "--seq-len",
                    str(d["models"][0]["seq_len"]), "--global-batch", "8", "--profile",
                    str(_write(tmp_path, "no-seq.json", d))])
    capsys.readouterr()
    assert rc == 0


# ---- errors -------------------------------------------------------------------------------

def _bad_files(tmp_path, good: dict) -> dict:
    wrong_version = dict(good, version=99)
    foreign = {"schema_version": 1, "parallelism": {"tp": 1}}
    broken = copy.deepcopy(good)
    broken["models"][0]["layer"]["points"][0]["fwd_s"]["median"] = -1
    return {
        "missing": tmp_path / "nope.json",
        "not json": _text(tmp_path, "bad.json", "{not json"),
        "empty": _text(tmp_path, "empty.json", ""),
        "foreign (a plan)": _write(tmp_path, "plan.json", foreign),
        "wrong version": _write(tmp_path, "v99.json", wrong_version),
        "negative time": _write(tmp_path, "neg.json", broken),
        "a list": _write(tmp_path, "list.json", [1, 2]),
    }


@pytest.mark.slow
def test_bad_profiles_are_one_line_exit_2(prof, tmp_path, capsys):
    for what, path in _bad_files(tmp_path, prof["data"]).items():
        with pytest.raises(BadInput):
            load_profile(path)
        rc = plan_main(["--model", prof["model"], "--cluster", "cpux2", "--profile", str(path)])
        err = capsys.readouterr().err
        assert rc == 2, what
        assert err.startswith("plan: error: profile ") and err.count("\n") == 1, (what, err)
        assert "Traceback" not in err


@pytest.mark.slow
def test_profile_of_other_hardware_is_refused(prof, capsys):
    rc = plan_main(["--model", "llama3-8b", "--cluster", "h100x8", "--profile",
                    str(prof["path"])])
    err = capsys.readouterr().err
    assert rc == 2 and "measured on" in err and err.count("\n") == 1


def test_profiler_cli_errors_are_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "profiler", "--model", "no-such-model"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("profiler: error: unknown model")
    assert r.stderr.count("\n") == 1
    r = subprocess.run([sys.executable, "-m", "profiler", "merge", str(tmp_path / "x.json"),
                        "--out", str(tmp_path / "y.json")],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no such file" in r.stderr


# ---- merging and the planner's independence from torch -----------------------------------

@pytest.mark.slow
def test_merge_keeps_the_slower_node(prof, tmp_path):
    slow = copy.deepcopy(prof["data"])
    slow["hardware"]["hosts"] = ["node-b"]
    for q in slow["models"][0]["layer"]["points"]:
        q["fwd_s"]["median"] *= 3
    a = load_profile(prof["path"])
    b = load_profile(_write(tmp_path, "b.json", slow))
    m = merge_profiles([a, b])
    assert "node-b" in m.hardware["hosts"] and len(m.data["merged_from"]) == 2
    for q, r in zip(m.data["models"][0]["layer"]["points"], slow["models"][0]["layer"]["points"]):
        assert q["fwd_s"]["median"] == r["fwd_s"]["median"]
    out = tmp_path / "merged.json"
    r = subprocess.run([sys.executable, "-m", "profiler", "merge", str(prof["path"]),
                        str(tmp_path / "b.json"), "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    load_profile(out)
    other = copy.deepcopy(prof["data"])
    other["hardware"].update(device_type="cuda", catalog_gpu="h100")
    with pytest.raises(BadInput, match="different hardware"):
        merge_profiles([a, load_profile(_write(tmp_path, "gpu.json", other))])


def test_planner_does_not_import_torch():
    code = ("import sys, planner.profile, planner.cli, planner.cost.stage; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_large_models_are_scaled_down_on_cpu_and_say_so():
    import torch
    from profiler.compute import scaled_spec
    small, seq, note = scaled_spec(get_model("llama70b"), torch.device("cpu"), 8192, 2)
    assert small.hidden < 8192 and small.num_heads == 64 and seq <= 512
    assert note and "llama3-70b" in note and "ratio" in note


@pytest.mark.slow
def test_min_statistic_pairs_forward_and_backward_of_one_repeat(prof):
    """The fastest step is the fastest repeat, not min(forward) + min(backward)."""
    d = copy.deepcopy(prof["data"])
    d["settings"]["statistic"] = "min"
    pt = next(q for q in d["models"][0]["layer"]["points"] if q["tp"] == 1 and q["mbs"] == 2)
    pt["fwd_s"].update(samples=[0.001, 0.005, 0.009], min=0.001)
    pt["bwd_s"].update(samples=[0.009, 0.001, 0.009], min=0.001)
    model = get_model(prof["model"])
    cluster, engine, notes = apply_profile(Profile(d, "p"), get_cluster("cpux2"), model)
    assert any("min of the repeats" in n for n in notes)
    k = stage_coefficients(model, cluster, _cand(), engine)[0]
    assert k.compute_layer == pytest.approx(0.006)      # repeat 2: 5 + 1 ms, not 1 + 1 ms


def test_profiler_refuses_an_unwritable_out_before_measuring(tmp_path):
    """No minutes of measuring lost to an --out that cannot be written: refused at once."""
    import time
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "profiler", "--model", "llama8b", "--out",
                        str(tmp_path / "no-such-dir" / "p.json")],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "cannot write" in r.stderr and time.perf_counter() - t < 30


def test_profiler_writes_only_what_the_planner_reads(tmp_path):
    """A profile the planner's schema refuses is not written as the profile; it is kept."""
    from profiler.__main__ import _write_profile
    out = tmp_path / "p.json"
    with pytest.raises(BadInput, match="rejected"):
        _write_profile({"format": "nonsense"}, out)
    assert not out.exists() and (tmp_path / "p.json.rejected").exists()


@pytest.mark.slow
def test_calibration_models_both_shapes_with_the_profiled_kernels(prof, monkeypatch):
    """Calibrating a measured shape against itself gives the measurement back: the asked and
    the profiled shape are modelled with the same element-wise kernels (the runtime's eager
    RMSNorm, RoPE and SwiGLU), so the ratio carries no kernel difference."""
    from planner import profile as profile_mod
    p = load_profile(prof["path"])
    model = get_model(prof["model"])
    cluster, engine, _ = apply_profile(p, get_cluster("cpux2"), model)
    direct = stage_coefficients(model, cluster, _cand(), engine)[0].compute_layer
    cls = next(c for c in vars(profile_mod).values()
               if isinstance(c, type) and "_direct" in vars(c))
    monkeypatch.setattr(cls, "_direct", lambda self, *a, **k: False)
    calibrated = stage_coefficients(model, cluster, _cand(), engine)[0].compute_layer
    assert calibrated == pytest.approx(direct, rel=1e-9)


def test_a_measured_collective_latency_is_divided_by_the_hops_it_is_priced_with():
    """An 8-rank link class whose all-reduce, all-gather and reduce-scatter each measured an
    alpha of 5 us per hop as NCCL counts hops (a double binary tree: 2 x log2(8) = 6 hops; a
    ring: 7): the profile's per-hop latency is 5 us, and the planner then prices each
    collective's latency back at what was measured. (The ring's alphas were divided by the
    tree's 3 hops, which read 11.7 us.)"""
    from planner.cost import comm
    from planner.profile import _link_figures
    per_hop = 5e-6
    alphas = {"all_reduce": 6 * per_hop, "all_gather": 7 * per_hop,
              "reduce_scatter": 7 * per_hop}
    shapes = {"8": {"size": 8, "ops": {op: {"fit": {"busbw_gbps": 300.0, "alpha_s": a}}
                                       for op, a in alphas.items()}}}
    fig = _link_figures(shapes)
    assert fig["latency_s"] == pytest.approx(per_hop)
    link = comm.Link(fig["busbw_gbps"], 300.0, fig["latency_s"])
    tiny = 1e-3    # bytes: the latency alone
    assert comm.all_reduce(tiny, 8, link) == pytest.approx(alphas["all_reduce"], rel=1e-6)
    assert comm.all_gather(tiny, 8, link) == pytest.approx(alphas["all_gather"], rel=1e-6)
