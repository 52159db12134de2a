"""The benchmark scripts' own logic: brute force, baselines, tables. Small instances, fast."""

import dataclasses
import itertools
import json
import math

import pytest

from benchmarks import plan_quality as pq
from benchmarks import search_speed as ss
from benchmarks._common import markdown_table
from planner.catalog import get_gpu, get_model, get_cluster
from planner.cost.stage import Candidate, evaluate, stage_coefficients
from planner.search import Fixed, search, solve_candidate
from planner.specs import Cluster, Model


def tiny(layers=8, hidden=1024):
    return Model("tiny", num_layers=layers, hidden=hidden, ffn_hidden=4 * hidden, num_heads=8,
                 num_kv_heads=8, vocab_size=32000, max_seq_len=4096)


def small_cluster(gib, n=8):
    return Cluster(f"h100x{n}", dataclasses.replace(get_gpu("h100"), memory_gib=gib), n, 8)


@pytest.mark.parametrize("total,parts", [(5, 1), (5, 2), (7, 3), (9, 4), (6, 6), (3, 4)])
def test_compositions_are_all_and_only_the_splits(total, parts):
    got = sorted(map(tuple, ss.compositions(total, parts).tolist()))
    want = sorted(x for x in itertools.product(range(1, total + 1), repeat=parts)
                  if sum(x) == total)
    assert got == want
    assert len(got) == ss.n_splits(total, parts)


def _naive(model, cluster, c):
    """Every split and every recompute count per rank: the definition of the optimum."""
    coeffs = stage_coefficients(model, cluster, c, ss.ENGINE)
    best = None
    for layers in itertools.product(range(c.vpp, model.num_layers + 1), repeat=c.pp):
        if sum(layers) != model.num_layers:
            continue
        for rec in itertools.product(*[range(n + 1) for n in layers]):
            e = evaluate(model, cluster, c, layers, list(rec), coeffs, ss.ENGINE)
            if e.fits and (best is None or e.step_time_s < best):
                best = e.step_time_s
    return best


@pytest.mark.parametrize("pp,v,sched,gib,zero", [
    (2, 1, "1f1b", 9.0, 0), (3, 1, "gpipe", 6.0, 1), (2, 2, "interleaved", 8.0, 2),
    (4, 1, "1f1b", 4.0, 3), (2, 1, "1f1b", 1.0, 0)])
def test_brute_force_with_least_recompute_is_exact(pp, v, sched, gib, zero):
    model, cluster = tiny(layers=8), small_cluster(gib)
    dp = 8 // pp
    c = Candidate(tp=1, pp=pp, dp=dp, zero=zero if dp > 1 else 0, sp=False, mbs=2,
                  seq_len=2048, global_batch=8 * dp, schedule=sched, vpp=v, recompute="full")
    got = ss.brute_force_candidate(model, cluster, c)
    want = _naive(model, cluster, c)
    if want is None:
        assert got is None
    else:
        assert got is not None and got[0] == pytest.approx(want, rel=1e-12)
        # and the planner's exact solver agrees
        res, fits = solve_candidate(model, cluster, c, engine=ss.ENGINE)
        assert fits and res.estimate.step_time_s == pytest.approx(want, rel=1e-6)


def test_exhaustive_matches_search_on_a_small_instance():
    model, cluster = tiny(layers=8), small_cluster(12.0)
    rep = search(model, cluster, Fixed(), 2048, 64, top=1, engine=ss.ENGINE)
    ex = ss.exhaustive(model, cluster, budget_s=60, seq=2048, gbs=64)
    assert ex["skipped"] == 0 and ex["enumerated"] == rep.candidates
    assert ex["best"][0] == pytest.approx(rep.best.estimate.step_time_s, rel=1e-6)


def test_fsdp_baseline_reasons():
    model = get_model("llama3-8b")
    out = pq.fsdp(model, get_cluster("h100x64"), 8192, 32, True)
    assert not out.fits and out.why.startswith("not divisible")
    out = pq.fsdp(model, get_cluster("h100x8"), 8192, 64, True)
    c = out.result.candidate
    assert out.fits and (c.tp, c.pp, c.dp, c.zero) == (1, 1, 8, 3)


def test_megatron_baseline_takes_the_smallest_pipeline_that_fits():
    model, cluster = get_model("llama3-70b"), get_cluster("h100x64")
    out = pq.megatron(model, cluster, 4096, 64, True)
    c = out.result.candidate
    assert out.fits and c.tp == 8 and c.schedule in ("1f1b",) and c.vpp == 1 and c.sp
    assert out.result.recompute == out.result.layers          # every layer recomputed
    # one pipeline degree less does not fit
    smaller = [p for p in (1, 2, 4) if p < c.pp]
    for p in smaller:
        r = search(model, cluster, Fixed(tp=8, pp=p, zero=1, sp=True, schedule="1f1b",
                                         recompute="full"), 4096, 64, top=1)
        assert r.best is None


def test_megatron_not_divisible_when_heads_do_not_split():
    model = dataclasses.replace(tiny(), num_heads=6, num_kv_heads=6, hidden=768)
    out = pq.megatron(model, small_cluster(80.0), 2048, 8, True)
    assert not out.fits and "not divisible" in out.why


def test_verdicts_name_the_loss():
    model, cluster = get_model("llama3-8b"), get_cluster("h100x8")
    best = pq.run_search(model, cluster, Fixed(), 8192, 64)
    slow = pq.run_search(model, cluster, Fixed(tp=8, pp=1, recompute="full"), 8192, 64)
    v = pq.verdict(slow, best)
    assert v.startswith("slower by ") and "%" in v
    assert pq.verdict(best, best) == "ties the planner"
    oom = pq.run_search(model, small_cluster(20.0), Fixed(tp=1, pp=1, dp=8, zero=0), 8192, 64)
    assert not oom.fits and oom.why.startswith("out of memory on stage 0 by ")


def test_markdown_table():
    md = markdown_table([{"a": "x|y", "b": 1.5, "c": None}, {"a": "z", "b": 2, "c": True}],
                        ["a", "b", "c"])
    lines = md.splitlines()
    assert lines[0] == "| a | b | c |" and lines[1] == "|:---|---:|:---|"
    assert lines[2] == "| x\\|y | 1.50 |  |" and lines[3] == "| z | 2 | yes |"
    assert not math.isnan(len(md))


# ---- every entry point, end to end on a small slice, writing outside the checkout ----------

import subprocess
import sys
from pathlib import Path

from benchmarks import _common
from benchmarks import closed_loop, fidelity, gpu_check

ROOT = Path(__file__).resolve().parents[1]


def _written(tmp_path, stem):
    return sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(stem))


def test_default_output_is_outside_the_checkout():
    assert not _common.SCRATCH.resolve().is_relative_to(ROOT)
    from benchmarks import attention_fit, gemm_fit
    for mod in (fidelity, pq, ss, closed_loop, attention_fit, gemm_fit):
        ap_defaults = [a for a in mod.__dict__.values() if a is _common.SCRATCH]
        assert ap_defaults, mod.__name__       # each takes the scratch directory by default


def test_plan_quality_runs_end_to_end(tmp_path, capsys):
    assert pq.main(["--limit", "1", "--out", str(tmp_path)]) == 0
    assert _written(tmp_path, "plan_quality") == [f"plan_quality_{_common.today()}.csv",
                                                  f"plan_quality_{_common.today()}.md"]
    out = capsys.readouterr().out
    assert "## Published runs" in out and "## Catalog models on typical clusters" in out


@pytest.mark.parametrize("args,stem", [(["--cp", "--no-sensitivity"], "fidelity_cp"),
                                       (["--moe"], "fidelity_moe")])
def test_fidelity_runs_end_to_end(tmp_path, capsys, args, stem):
    assert fidelity.main(args + ["--no-plot", "--out", str(tmp_path)]) == 0
    assert _written(tmp_path, stem)
    if "--moe" not in args:
        assert "targets: all met" in capsys.readouterr().out


def test_loso_elsewhere_leaves_the_planners_trust_band(tmp_path, capsys):
    """`--loso --out DIR` writes its trust band beside its table; the committed one
    (planner/engines/trust.json) is written only with the committed tables. And what it
    writes is what is committed: the band `plan` prints, and the table the README and the
    fidelity tests read, are what the planner's figures give today (a cost change that moves
    them fails here until the table is regenerated)."""
    import csv
    import json
    from planner.engines.trust import TABLE
    before = fidelity.TRUST_FILE.read_bytes()
    assert fidelity.main(["--loso", "--out", str(tmp_path)]) == 0
    assert fidelity.TRUST_FILE.read_bytes() == before
    made = json.loads((tmp_path / "trust.json").read_text())
    assert made["engines"] == json.loads(before)["engines"]
    root = fidelity.TRUST_FILE.parent.parent.parent
    committed = list(csv.DictReader(open(root / TABLE.replace(".md", ".csv"))))
    regenerated = list(csv.DictReader(open(next(tmp_path.glob("fidelity_loso_*.csv")))))
    assert regenerated == committed


def test_fidelity_names_the_target_it_fails():
    rows = [{"engine": "megatron", "fit": "held out", "error_pct": e}
            for e in [1.0] * 9 + [30.0]]
    failed = fidelity.failed_targets(rows, {"all_fit": True})
    assert failed == [f"megatron max |error| 30.0% > {fidelity.MAX_TARGET_PCT:.0f}%"]
    rows = [{"engine": "fsdp", "fit": "yes", "error_pct": 12.0}] * 10
    failed = fidelity.failed_targets(rows, {"all_fit": False})
    assert failed == [f"fsdp median |error| 12.0% > {fidelity.MEDIAN_TARGET_PCT:.0f}%",
                      "a published configuration is predicted not to fit"]


@pytest.mark.parametrize("name,stem", [("attention_fit", "attention_blackwell"),
                                       ("gemm_fit", "gemm_blackwell")])
def test_blackwell_fits_run_end_to_end(tmp_path, capsys, name, stem):
    import importlib
    mod = importlib.import_module(f"benchmarks.{name}")
    assert mod.main(["--out", str(tmp_path)]) == 0
    assert _written(tmp_path, stem) == [f"{stem}_{_common.today()}.md"]
    out = capsys.readouterr().out
    assert "gb200 (serves gb200, b200)" in out and "gb300 (serves gb300, b300)" in out


def test_search_speed_runs_end_to_end(tmp_path, capsys):
    rc = ss.main(["--only", "llama3-8b:h100x8", "--quick", "--repeat", "1",
                  "--out", str(tmp_path)])
    assert rc == 0 and "targets: all met" in capsys.readouterr().out   # no target on this one
    assert _written(tmp_path, "search_speed")


@pytest.mark.slow
def test_closed_loop_runs_end_to_end(tmp_path):
    # the committed profile (no torchrun for it), one plan, two steps, one round
    prof = ROOT / "benchmarks/profiles/cpux2-tiny-llama.json"
    before = prof.read_bytes()
    rc = closed_loop.main(["--profile", str(prof), "--steps", "2", "--alternatives", "0",
                           "--rounds", "1", "--wait-quiet", "0", "--out", str(tmp_path)])
    assert rc == 0 and (tmp_path / "closed_loop.md").exists()
    assert prof.read_bytes() == before


@pytest.mark.slow
def test_gpu_check_cpu_dry_run_end_to_end(tmp_path):
    r = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--cpu-dry-run",
                        "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert (tmp_path / "gpu_check.md").exists()


def test_a_benchmark_script_says_bad_input_in_one_line(tmp_path):
    """A bad file given to a benchmark script is one line on stderr and exit 2, as for `plan`
    (benchmarks._common run_cli; a non-JSON profile printed a traceback)."""
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    r = subprocess.run([sys.executable, "-m", "benchmarks.closed_loop", "--profile", str(bad),
                        "--steps", "1"], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).parent.parent)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("closed_loop: error: profile ") and r.stderr.count("\n") == 1
    assert "not valid JSON" in r.stderr and "Traceback" not in r.stderr


def test_moe_gemm_check_cpu_dry_run_end_to_end(tmp_path, capsys):
    """The GPU check of the MoE rows' expert GEMMs (benchmarks/moe_gemm_check.py) runs its
    whole path on CPU: every Megatron MoE layout of the data timed both ways where torch can,
    with the expert shapes counted by hand for one of them: Qwen3-30B-A3B (128 experts, top 8,
    hidden 2048, expert FFN 768) at ep 16, one 4096-token sequence, takes 4096 x 8 x 16 / 128
    = 4096 tokens on each of its 8 local experts. Without a GPU and without the dry run it says
    so in one line, exit 2."""
    pytest.importorskip("torch")
    from benchmarks import fidelity, moe_gemm_check as mg
    from planner.catalog import get_gpu
    assert mg.main(["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("moe_gemm_check: no CUDA GPU here") and err.count("\n") == 1
    key, run, _ = next(x for x in mg.layouts() if x[0][:6] == ("qwen3-30b-a3b", 1, 16, 1, 1, 4096))
    sh = mg.shapes_and_price(run, key, get_gpu("h100"))
    assert (sh["local_experts"], sh["tokens"], sh["hidden"], sh["ffn"], sh["gated"]) == \
        (8, 4096, 2048, 768, 2)
    assert mg.main(["--cpu-dry-run", "--repeats", "1", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "moe_gemm_check.json").read_text())["rows"]
    moe_rows = [r for path in mg.DATA for r in fidelity.load_runs(path)
                if "moe" in r.get("needs", ()) and r.get("engine", "megatron") == "megatron"]
    assert sum(r["rows"] for r in rows) == len(moe_rows) >= 100
    assert all(r["loop_s"] > 0 and r["predicted_s"] > 0 for r in rows)
    assert any(r["grouped_s"] for r in rows)       # torch._grouped_mm on CPU, aligned shapes
