"""The cost model against published runs: runs the real predictor on the committed data sets."""

import re
import statistics
from pathlib import Path

import pytest

from benchmarks import fidelity
from planner.catalog.gpus import GPUS
from planner.engines import ENGINES
from planner.engines.trust import TABLE, VALIDATION


@pytest.fixture(scope="module")
def runs():
    return fidelity.load_runs()


@pytest.fixture(scope="module")
def rows(runs):
    return fidelity.table(runs)


def test_data_sets_are_complete(runs):
    # dropping a run would quietly improve the statistics below
    # + the 15 context-parallel rows of published-runs-2.json (9 Megatron-Bridge, 6 torchtitan)
    assert len(runs) == 23 + 87 + 39 + 15
    assert len({r["id"] for r in runs}) == len(runs)
    by_engine = {e: sum(r["engine"] == e for r in runs) for e in ("megatron", "fsdp", "torchtitan")}
    assert by_engine == {"megatron": 23 + 12 + 9, "fsdp": 70 + 7, "torchtitan": 17 + 20 + 6}
    lowp = {e: sum(r["engine"] == e and r.get("precision", "bf16") != "bf16" for r in runs)
            for e in ("megatron", "fsdp", "torchtitan")}
    assert lowp == {"megatron": 12 + 9, "fsdp": 7, "torchtitan": 20 + 6}
    assert sum("cp" in r.get("needs", []) for r in runs) == 15
    for r in runs:
        assert r["step_time_s"] > 0 and r["source"]
        # only what the planner evaluates: no MoE; CP, FP8 / MXFP8 with the recipe named
        needs = [n for n in r.get("needs", []) if n != "cp"]
        assert needs in ([], ["fp8"], ["mxfp8"]), r["id"]
        assert ("cp" in r.get("needs", [])) == (r["fixed"].get("cp", 1) > 1), r["id"]
        prec = r.get("precision", "bf16")
        assert (prec == "bf16") == (not needs), r["id"]
        # as the source labels it, or corrected with the reason given
        assert [prec] == (needs or ["bf16"]) or r.get("corrections"), r["id"]
        assert (r.get("recipe") is None) == (r.get("precision", "bf16") == "bf16"), r["id"]
        # one set of constants per GPU type: every run names a catalog GPU, memory aside
        gpu = fidelity.cluster_of(r).gpu
        assert gpu.name in GPUS and gpu.gemm_efficiency == GPUS[gpu.name].gemm_efficiency
        # a figure of the row's own GPU, and a TP overlap the row says it ran, cite the source
        c = r["cluster"]
        if isinstance(c, dict) and "hbm_gbps" in c:
            assert r["hbm_source"], r["id"]
        if r["fixed"].get("tp_comm_overlap"):
            assert r["tp_comm_overlap_source"], r["id"]


def test_every_engine_within_target(rows):
    for eng in {r["engine"] for r in rows}:
        mine = [abs(r["error_pct"]) for r in rows if r["engine"] == eng]
        if len(mine) < fidelity.MIN_ROWS_FOR_TARGET:
            continue
        assert statistics.median(mine) <= fidelity.MEDIAN_TARGET_PCT, eng
        assert fidelity._p90(mine) <= fidelity.P90_TARGET_PCT, eng


def test_held_out_rows_within_target(rows):
    # the rows no kernel figure was fitted on hold the engines to the same targets
    held = [abs(r["error_pct"]) for r in rows if r["fit"] != "yes"]
    assert len(held) >= 30
    assert statistics.median(held) <= fidelity.MEDIAN_TARGET_PCT
    assert fidelity._p90(held) <= fidelity.P90_TARGET_PCT


def test_megatron_table_worst_run(rows):
    mine = [r for r in rows if r["engine"] == "megatron"]
    worst = max(mine, key=lambda r: abs(r["error_pct"]))
    assert abs(worst["error_pct"]) <= fidelity.MAX_TARGET_PCT, (worst["run"], worst["error_pct"])


def test_every_published_configuration_fits(rows):
    bad = [(r["run"], round(r["reserved_gib"], 1)) for r in rows if not r["fits"]]
    assert not bad
    for r in rows:
        assert r["needed_gib"] <= r["capacity_gib"]


# Measured rows the memory model misses today, named so that none can hide: three of
# torchtitan's TP x PP float8 runs (405B 1F1B, interleaved, and CP 8 at 256K) measure 18-23%
# MORE than predicted (an out-of-memory the plan would not foresee). Trainy's H200 FSDP runs,
# predicted 48% above what they measured while their loss was priced eager, are within 9%
# with the compiled loss their torchtitan ran (planner.engines.spec COMPILED_LOSS, the rows'
# `loss_source`) and its FSDP2 root group's unsharded state at the peak (fsdp_outer_wrap).
# The TP x PP runs measured 41-48% more until the pipeline stage's unsharded FSDP gradients
# and parameters were counted (planner.engines.spec pp_keeps_unsharded_grads); the
# 70B TP runs 17-22% more until the loss's peak was measured (planner.engines.spec LossMemory:
# DTensor's loss_parallel holds 16 bytes per logit in backward, where 10 were priced; tests/
# test_loss_memory.py) and the head's saved inputs were counted (planner.cost.memory.
# head_input_bytes): they are now within 5%. Still left out (a research pass, 2026-12-01):
# AsyncTP's symmetric-memory workspaces outside the caching allocator, and a reserved /
# allocated ratio of these large-block runs well above the 1.05 priced. The 405B pipelines
# measured 10-20% more until what torch.distributed.pipelining holds was counted (planner.
# engines.spec pipeline_recv_buffers, and as the rows' torch ran it pipeline_returns_outputs
# and pipeline_keeps_input_grads: their last stage keeps every micro-batch's logits and
# input gradients to the step's end, and becomes the peak); the CP 8 row is still 16% short.
KNOWN_MEMORY_GAPS = {
    "torchtitan-202412-table6-405b-fsdp1-cp8-seq262144",
}


def test_memory_within_target_in_both_directions(rows):
    measured = [r for r in rows if r["measured_gib"] and r["run"] not in KNOWN_MEMORY_GAPS]
    assert len(measured) >= 7
    for r in measured:
        # an underestimate is an out-of-memory the plan said would not happen; an
        # overestimate refuses plans that fit: both count
        assert abs(r["memory_error_pct"]) <= fidelity.MEMORY_TARGET_PCT, r["run"]


def test_default_margin_covers_measured_under_prediction_but_at_405b(runs, rows):
    """The measured rows the planner under-counts (13 of 20 today) are within `plan`'s default
    margin (planner.cost.stage DEFAULT_MARGIN_FRACTION: the largest, torchtitan's 8B on 8 H100s
    without compile, 1.6 GiB of 95) but torchtitan's 405B pipelines, whose gap (up to 14% of the GPU's
    memory) is an open finding no margin of this size covers."""
    v = fidelity.memory_verdicts(runs, rows)
    at_default = v["sweep"][v["default_margin_fraction"]]
    assert v["measured"] >= 15
    assert all("-405b-" in r for r in at_default["uncovered"]), at_default["uncovered"]
    assert len(at_default["uncovered"]) <= 5        # five of the six 405B pipelines today


@pytest.mark.xfail(strict=True, reason="open finding: KNOWN_MEMORY_GAPS")
def test_known_memory_gaps_within_target(rows):
    gaps = [r for r in rows if r["run"] in KNOWN_MEMORY_GAPS]
    assert len(gaps) == len(KNOWN_MEMORY_GAPS)
    assert all(abs(r["memory_error_pct"]) <= fidelity.MEMORY_TARGET_PCT for r in gaps)


def test_prediction_uses_the_published_configuration(runs, rows):
    for run, row in zip(runs, rows):
        f, c = run["fixed"], row["candidate"]
        assert row["run"] == run["id"] and row["engine"] == run["engine"]
        assert c.cp == f.get("cp", 1), run["id"]
        for key, attr in (("tp", "tp"), ("pp", "pp"), ("dp", "dp"), ("micro_batch", "mbs"),
                          ("sequence_parallel", "sp"), ("vpp", "vpp"), ("zero", "zero"),
                          ("global_batch", "global_batch"), ("seq_len", "seq_len")):
            if key in f:
                assert getattr(c, attr) == f[key], (run["id"], key)
        assert c.flash == (run.get("attention", "flash") == "flash")
        if "zero" not in f:
            assert c.zero in run["zero_stages"], run["id"]     # what the engine offered
        layers = run["model"].get("n_layer") or run["model"].get("num_hidden_layers")
        assert sum(row["layers"]) == layers
        if f.get("recompute") in ("full", "selective"):
            # published full/selective recompute covers every layer
            assert row["recompute"] == row["layers"], run["id"]


def test_low_precision_rows_within_issue_targets(rows):
    """Issue 12: on the FP8/MXFP8 rows, per engine and held out, median |error| <= 12%, p90
    <= 25%, every published configuration predicted to fit."""
    lowp = [r for r in rows if r["precision"] != "bf16"]
    assert len(lowp) == 39 + 15 and all(r["fits"] for r in lowp)
    held = [r for r in lowp if r["fit"] != "yes"]
    assert len(held) == 31 + 15
    groups = {"held out": held}
    for eng in ("megatron", "fsdp", "torchtitan"):
        groups[eng] = [r for r in lowp if r["engine"] == eng]
    for name, rs in groups.items():
        errs = [abs(r["error_pct"]) for r in rs]
        assert statistics.median(errs) <= 12.0, name
        # torchtitan's p90: an open finding (test below), held to a regression bound
        assert fidelity._p90(errs) <= (30.0 if name == "torchtitan" else 25.0), name
    # Megatron's held-out FP8/MXFP8 rows (8B H100/B200, 405B CP 2), tightened once the TP
    # communication overlap the Megatron-Bridge runs used was priced (was 14.8% / 21.0%); the
    # p90 bound 15% -> 16% when B200's attention was priced as cuDNN measures it, faster than
    # the H100 figure it had, on B200 rows that were already too fast (7.4 / 13.8% -> 8.9 / 15.2%),
    # and back to 15% once B200's GEMMs were priced as measured (planner.catalog.gpus
    # BLACKWELL_GEMM: 8.9 / 15.2% -> 3.5 / 7.8%)
    mh = [abs(r["error_pct"]) for r in held if r["engine"] == "megatron"]
    assert len(mh) == 15 and statistics.median(mh) <= 10.0 and fidelity._p90(mh) <= 15.0


def test_torchtitan_low_precision_p90_within_issue_target(rows):
    """torchtitan's FP8 rows within the issue's p90, in-sample (two of them fitted the rowwise
    figure; held out, tests/test_fidelity_loso.py): 25.1% while async TP was priced as vanilla
    TP, the 70B async-TP tensorwise run +25%; 23.9% with its forward overlap priced."""
    errs = [abs(r["error_pct"]) for r in rows
            if r["precision"] != "bf16" and r["engine"] == "torchtitan"]
    assert fidelity._p90(errs) <= 25.0


def test_context_parallel_rows_within_issue_targets(rows):
    """Issue 12: on the 15 published context-parallel runs (Megatron-Bridge 405B CP 2 on H100
    and B200, torchtitan 8B and 405B CP 2-8 at 64K-256K), none of them fitted on, median
    |error| <= 12%, p90 <= 25%, every published configuration predicted to fit."""
    cp = [r for r in rows if r["cp"] > 1]
    assert len(cp) == 15 and all(r["fits"] for r in cp)
    assert all(r["fit"] != "yes" for r in cp)
    errs = [abs(r["error_pct"]) for r in cp]
    assert statistics.median(errs) <= 12.0
    assert fidelity._p90(errs) <= 25.0
    for r in cp:
        assert r["needed_gib"] <= r["capacity_gib"], r["run"]


def test_precision_is_passed_to_the_search(runs, rows):
    for run, row in zip(runs, rows):
        assert row["candidate"].precision == run.get("precision", "bf16")
        assert row["candidate"].recipe == run.get("recipe")


def test_engine_trust_figures_match_the_committed_table():
    """planner/engines/trust.py says what the committed leave-one-source-out table says
    (held-out median over all of the engine's dense-model rows)."""
    text = (Path(__file__).parent.parent / TABLE).read_text()
    for eng, (n, median) in VALIDATION.items():
        assert eng in ENGINES
        m = re.search(rf"^\| {eng} \| all \| (\d+) \| ([\d.]+) \|", text, re.M)
        assert m, eng
        assert (int(m.group(1)), float(m.group(2))) == (n, median), eng


def test_summary_and_markdown(rows):
    s = fidelity.summary(rows)
    assert s["all"]["runs"] == len(rows) and s["all_fit"]
    md = fidelity.to_markdown(rows, s, 1.0)
    assert md.count("\n| ptdp-") == 10 and "| megatron | 44 |" in md


def _cli_args(run, tmp_path) -> list:
    """The `plan` command line that reproduces a published row: its model and cluster files,
    every published knob, its engine and attention kernel, no margin."""
    import json as _json
    model = tmp_path / f"{run['id']}-model.json"
    model.write_text(_json.dumps(run["model"]))
    c = run["cluster"]
    if isinstance(c, dict):
        cluster = tmp_path / f"{run['id']}-cluster.json"
        cluster.write_text(_json.dumps({"base": c["gpu"], "num_gpus": c["num_gpus"],
                                        "gpus_per_node": c.get("gpus_per_node", 8),
                                        **{k: c[k] for k in fidelity.GPU_OVERRIDES if k in c}}))
    else:
        cluster = c
    f = fidelity.fixed_of(run)
    args = ["--model", str(model), "--cluster", str(cluster), "--engine", run["engine"],
            "--attention", "flash" if f.flash else "eager", "--memory-margin", "0",
            "--seq-len", run["fixed"]["seq_len"], "--global-batch", run["fixed"]["global_batch"]]
    for flag, v in (("--tp", f.tp), ("--pp", f.pp), ("--dp", f.dp), ("--zero", f.zero),
                    ("--micro-batch", f.mbs), ("--vpp", f.vpp), ("--recompute", f.recompute),
                    ("--schedule", f.schedule), ("--cp", f.cp)):
        if v is not None:
            args += [flag, v]
    if f.sp is not None:
        args.append("--sp" if f.sp else "--no-sp")
    return [str(a) for a in args]


# the torchtitan row ran the engine's eager kernels (its Triton RMSNorm is fused like torch's
# today): a row's composite RMSNorm or torch.compile is a fact of its code, not a plan knob
@pytest.mark.parametrize("pick", ["torchtitan-docs-a100-llama2-13b-lbs2-no",
                                  "llmfoundry-h10080gbbf16-70b-seq2048-512gpu-ac-amp_bf16-full_shard",
                                  "ptdp-t1-1.7b"])
def test_published_rows_reproduce_from_the_command_line(runs, rows, pick, tmp_path, capsys):
    """Every knob the benchmark sets reaches `plan` through its flags: the CLI answers the
    benchmark's prediction for the row (the ZeRO stage fixed to the one the benchmark chose)."""
    import json as _json

    from planner.cli import main
    i = next(k for k, r in enumerate(runs) if r["id"] == pick)
    run, row = runs[i], rows[i]
    args = _cli_args(run, tmp_path)
    if "--zero" not in args:
        args += ["--zero", str(row["candidate"].zero)]
    assert main(args + ["--json"]) == 0
    plan = _json.loads(capsys.readouterr().out)
    assert plan["engine"] == run["engine"]
    assert plan["estimate"]["step_time_s"] == pytest.approx(row["predicted_s"], rel=1e-6)


@pytest.mark.parametrize("table", ["table1-8b-8gpu", "table3-8b-128gpu"])
def test_torch_compile_gain_follows_the_element_wise_kernels(runs, rows, table):
    """torchtitan's 2024-12 eager 8B rows beside their torch.compile twins (same knobs): the
    element-wise kernels counted per op (eager RMSNorm, RoPE and SwiGLU against fused) predict
    the published cost of running eager, 15.7% / 16.2% of the compiled step, within 3 points
    (14.5% / 14.4%; with the kernels counted as fused for both, 0%)."""
    by_id = {r["id"]: i for i, r in enumerate(runs)}
    eager, compiled = (by_id[f"torchtitan-202412-{table}-fsdp{s}"] for s in ("", "+torch.compile"))
    published = runs[eager]["step_time_s"] / runs[compiled]["step_time_s"]
    predicted = rows[eager]["predicted_s"] / rows[compiled]["predicted_s"]
    assert runs[compiled].get("compiled") and not runs[eager].get("compiled")
    assert abs(predicted - published) <= 0.03, (published, predicted)


def test_megatron_bridge_rows_price_the_fused_cross_entropy_their_recipes_ran():
    """Megatron-Bridge's performance recipes run Transformer Engine's fused cross entropy
    (cross_entropy_fusion_impl "te" over cross_entropy_loss_fusion True): two passes over the
    bf16 logits writing the gradient in place, scaled in place in backward, 10 bytes a logit
    (planner.engines.spec TE_FUSED_LOSS) where Megatron's default unfused one moves 38 + 14.
    By hand for Qwen3-235B's head on one GB200 (a micro-batch of 4096 tokens, 151936 logits
    each, 8000 GB/s): 4096 x 151936 x (52 - 10) B / 8e12 B/s = 3.27 ms less. The planner's own
    Megatron plans, exported without the fusion flags, keep the unfused one; the 2021-24
    Megatron rows and Megatron-Bridge's verification cards (other recipes) too."""
    from planner.cost.facts import facts_for
    from planner.engines import get_engine
    runs = {r["id"]: r for r in fidelity.load_runs(fidelity.DATA_HELDOUT)}
    row = runs["mbridge-26.06-gb200-qwen3235ba22b-mxfp8-256gpu-tp1pp8cp1ep32vp3-gbs8192"]
    model, gpu = fidelity.model_of(row), fidelity.cluster_of(row).gpu
    fused = sum(facts_for(fidelity.engine_of(row), gpu).head_time(model, 1, 4096, 1))
    plain = sum(facts_for(get_engine("megatron"), gpu).head_time(model, 1, 4096, 1))
    assert plain - fused == pytest.approx(4096 * 151936 * (52 - 10) / 8e12, rel=1e-9)
    card = next(r for r in runs.values() if r["id"].startswith("mbridge-card-"))
    old = fidelity.load_runs(fidelity.DATA)[0]
    for r in (card, old):
        assert fidelity.engine_of(r).loss_memory == get_engine("megatron").loss_memory
