"""The published runs held out of every fit (benchmarks/data/published_runs_heldout.json,
issue 22 item 5), scored with the committed figures: the issue's targets where they hold,
the open findings as strict xfails (benchmarks/results/fidelity_heldout_*.md)."""
import re
import statistics

import pytest

from benchmarks import fidelity

MEDIAN_TARGET, P90_TARGET, MIN_ROWS = 10.0, 25.0, 10

pytestmark = pytest.mark.skipif(not fidelity.DATA_HELDOUT.exists(), reason="no held-out file")


@pytest.fixture(scope="module")
def scored():
    return fidelity.heldout_table()


def test_every_row_is_scored_or_says_why(scored):
    rows, skipped = scored
    assert len(rows) + len(skipped) == len(fidelity.load_runs(fidelity.DATA_HELDOUT))
    assert len(rows) >= 150 and all(why for _, why in skipped)


def test_no_published_configuration_is_refused(scored):
    """Every held-out published configuration gets a plan with its published knobs (the five
    Megatron-Bridge GB200 Llama 3.1 405B rows, 126 layers at pp 16 x vpp 8, were the last
    refused: Megatron's embedding-and-loss split, planner.rules.rank_min_layers)."""
    rows, skipped = scored
    assert skipped == []
    gb200 = [r for r in rows if "gb200-llama31405b-mxfp8-256gpu-tp4pp16" in r["run"]]
    assert len(gb200) == 5 and all(r["fits"] for r in gb200)


def test_no_held_out_row_entered_a_fit():
    runs = fidelity.load_runs(fidelity.DATA_HELDOUT)
    fitted = {r["id"] for r in fidelity.loso_runs()
              if any(fig.production(r) for fig in fidelity.FIGURES)}
    assert not fitted & {r["id"] for r in runs}


def test_engines_within_issue_targets(scored):
    """The dense scopes (MoE models apart, as the trust band counts them: fidelity.trust_scope)."""
    rows, _ = scored
    for eng in ("fsdp", "megatron"):
        a = [abs(r["error_pct"]) for r in rows if fidelity.trust_scope(r) == eng]
        assert len(a) >= MIN_ROWS
        assert statistics.median(a) <= MEDIAN_TARGET and fidelity._p90(a) <= P90_TARGET, eng


# The Megatron-Bridge MoE rows of GB200, GB300 and B300 (and the releases the MoE file lacks),
# held out: GPT-OSS-120B is up to 46% fast on Blackwell, Qwen3-235B before 26.06 (its recipes
# graphing attention and router per layer) 18-30% slow (benchmarks/results/
# fidelity_heldout_*.md: 11.2 / 27.6% over the 91 rows). Regression bounds (20 / 45 until the
# MoE layer's GPU work was priced as Megatron-Core runs it), and the target as an xfail.
MOE_HELDOUT_MEDIAN_BOUND, MOE_HELDOUT_P90_BOUND = 15.0, 40.0


def _moe(rows):
    return [abs(r["error_pct"]) for r in rows if fidelity.trust_scope(r) == "megatron moe"]


def test_moe_held_out_regression_bound(scored):
    a = _moe(scored[0])
    assert len(a) >= 80
    med, p90 = statistics.median(a), fidelity._p90(a)
    assert med <= MOE_HELDOUT_MEDIAN_BOUND and p90 <= MOE_HELDOUT_P90_BOUND, (med, p90)


@pytest.mark.xfail(strict=True, reason="open finding: MoE rows held out beyond the issue-22 target")
def test_moe_within_issue_targets(scored):
    a = _moe(scored[0])
    assert statistics.median(a) <= MEDIAN_TARGET and fidelity._p90(a) <= P90_TARGET


def _published_key(r):
    """A table row as printed: release, system, model (less its variant), precision and layout."""
    p = r["published"]
    rel = r["source"].split()[2]
    system = p.get("System") or r["source"].split("System: ")[-1]
    model = (p.get("Model") or r["source"].split("Model: ")[-1].split(" / ")[0]).split(" (")[0]
    return (rel, system.strip(), model.strip(), r["precision"], p["#-GPUs"], p["GBS"], p["TP"],
            p["PP"], p["EP"], p["_variant"] if "(" in p["Tokens / sec / GPU"] else "")


def test_held_out_moe_rows_are_not_the_moe_tables_rows():
    """No Megatron-Bridge MoE row is held out and fitted on both: the held-out file's MoE rows
    are table rows published_runs_moe.json does not hold (compared as printed)."""
    # the performance tables' rows, as printed (the verification cards' rows below)
    held = [r for r in fidelity.load_runs(fidelity.DATA_HELDOUT) if "moe" in r.get("needs", ())
            and r["family"].startswith("Megatron-Bridge MoE")]
    moe = fidelity.load_runs(fidelity.DATA_MOE)
    assert len(held) >= 80
    assert all(r["id"].startswith("mbridge-") and r["quote"] and r["commit"] for r in held)
    assert not {_published_key(r) for r in held} & {_published_key(r) for r in moe}
    # a verification card's row is no summary-table row re-measured: no table row, in either
    # file, of the same model, system, GPUs, precision, layout and batch
    cards = [r for r in fidelity.load_runs(fidelity.DATA_HELDOUT)
             if r["family"] == "Megatron-Bridge verification cards"]
    assert len(cards) == 5
    tables = held + moe

    def config(r):
        f = r["fixed"]
        return (r["catalog_model"], r["cluster"], r["precision"], f["tp"], f["pp"], f["ep"],
                f["micro_batch"], f["global_batch"])
    assert not {config(r) for r in cards} & {config(r) for r in tables if "catalog_model" in r}


def test_recipe_memory_facts_fit_the_mlperf_405b_runs(scored):
    """MLPerf v5.0's Llama 3.1 405B runs keep FP8 primary weights and bf16 gradients
    (benchmarks.fidelity RECIPE_MEMORY_FACTS, read from their config_common.sh and
    pretrain.py): priced so, every one fits (before: 78.9-87.7 GiB of 77.6, "does not fit")."""
    rows, _ = scored
    mlperf = [r for r in rows if r["run"].startswith("mlperf-v5.0-nvidia-eos")]
    assert len(mlperf) == 5 and all(r["fits"] for r in mlperf)


def test_never_fits_then_out_of_memory(scored):
    rows, _ = scored
    runs = {r["id"]: r for r in fidelity.load_runs(fidelity.DATA_HELDOUT)}
    v = fidelity.memory_verdicts([runs[r["run"]] for r in rows], rows)
    assert v["measured"] >= 5 and v["fits_then_oom"] == []


def test_default_margin_covers_every_measured_under_prediction(scored):
    """`plan`'s default margin (planner.cost.stage DEFAULT_MARGIN_FRACTION) keeps free more
    than the planner under-counts any held-out row's measured reserved memory (none is under
    today), and with that margin kept free the search refuses only configurations that left it
    nothing to choose: llm-foundry's A100 40GB runs without recompute at 32-128 GPUs (0.4-1.1
    GiB free at no margin), NeMo's GPT-3 20B and, since the MoE rows carry their recipe's
    dispatcher, recompute and layout (`recipe_source`), Megatron-Bridge's DeepSeek-V3 MXFP8
    runs of 26.02-26.04.01 with 32 of 61 layers on a GB300 (pp 2 x vp 8) or 16 on a GB200 (pp
    4 x vp 4), 2.2-5.0 GiB free at no margin (NeMo's 1.8) since the allocator's reserve is
    taken on the churned bytes only (planner.cost.stage MemoryBudget; over capacity before);
    at most those. Megatron-Bridge's five Llama 3.1 405B FP8 GB200 runs at pp 16 x vp 4, refused at
    the default margin while the reserve was on every byte (5.4 GiB free of its 5.55), fit with
    it now."""
    rows, _ = scored
    runs = {r["id"]: r for r in fidelity.load_runs(fidelity.DATA_HELDOUT)}
    v = fidelity.memory_verdicts([runs[r["run"]] for r in rows], rows)
    at_default = v["sweep"][v["default_margin_fraction"]]
    assert v["measured"] >= 10 and at_default["uncovered"] == []
    assert all(r.startswith(("llmfoundry-a10040gb-", "nemo-24.07-h100-gpt320b"))
               or re.fullmatch(r"mbridge-26\.0[24](\.01)?-gb[23]00-deepseekv3-mxfp8-256gpu-"
                               r"tp1pp[24]cp1ep(32|64)vp[48]-gbs4096", r)
               for r in at_default["refused"]) and len(at_default["refused"]) <= 11


MEMORY_MEDIAN_TARGET = 10.0     # issue 22: memory median |error| <= 10% where measured


def test_memory_median_within_issue_target(scored):
    """torchao's torchtitan tables measured their reserved memory (H100, MI300X, B200): the
    median |error| is within the issue's target since ZeRO-3's unsharded state is priced as
    each table's torchtitan grouped the embedding and head (planner.engines.spec
    fsdp_outer_wrap; 16.1% before, 37.2% while every loss was priced eager)."""
    rows, _ = scored
    runs = {r["id"]: r for r in fidelity.load_runs(fidelity.DATA_HELDOUT)}
    v = fidelity.memory_verdicts([runs[r["run"]] for r in rows], rows)
    assert v["measured"] >= 10 and v["memory_median_abs_pct"] <= MEMORY_MEDIAN_TARGET


def test_llm_foundry_a100_40gb_1b_runs_fit(scored):
    """llm-foundry's MPT-1b on A100 40GB (scripts/train/benchmarking/README.md: 32-128 GPUs,
    MBS 10, seq 2048, no activation checkpointing, FULL_SHARD) ran; they were predicted at
    38.4-38.9 GiB of 38.0 ("does not fit") while the loss's peak and a layer's backward
    working set were counted together though they are of different moments
    (planner/cost/stage.py). Now each fits, and the 80 GB and 40 GB rows that fitted still do."""
    rows, _ = scored
    a100 = [r for r in rows if r["run"].startswith("llmfoundry-a10040gb-1b-seq2048-")
            and r["run"].endswith(("gbs1280", "gbs640", "gbs320"))]
    assert len(a100) == 3 and all(r["fits"] for r in a100)
    assert all(r["fits"] for r in rows if r["run"].startswith("llmfoundry-"))


def test_nemo_rows_fit_as_their_launcher_ran_them(scored):
    """NeMo 24.07's H100 FP8 rows ran Apex's DistributedFusedAdam with the launcher's FP8
    example scripts' bf16 gradients (`optimizer_source`): GPT-3 175B on 128 GPUs, Llama 3 8B at
    cp 2 and Nemotron-4 340B (bf16 optimizer state, no fp32 master) were predicted at 78.7, 90.3
    and 87.2 GiB of 77.6 with Megatron's fp32 gradients and 12 B of state; they ran."""
    rows, _ = scored
    runs = {r["id"]: r for r in fidelity.load_runs(fidelity.DATA_HELDOUT)}
    nemo = [r for r in rows if r["run"].startswith("nemo-24.07-")]
    assert len(nemo) == 12
    for r in nemo:
        assert runs[r["run"]]["fixed"]["optimizer_state_bytes"] in (10.0, 4.0), r["run"]
    for key in ("-gpt3175b-fp8-128gpu-", "-llama38b-", "-nemotron340b-"):
        (row,) = [r for r in nemo if key in r["run"]]
        assert row["fits"], row["run"]


def test_no_published_configuration_predicted_not_to_fit(scored):
    """Every held-out configuration ran, and each is predicted to fit (issue 22). The last
    seven fit since the verdict is taken on what a plan needs, the allocator's reserve on the
    churned bytes only (planner.cost.stage MemoryBudget): NeMo 24.07's GPT-3 20B (H100, FP8,
    tp 2, dp 32, mbs 2: 75.0 GiB allocated, 78.8 reserved of 77.6) and Megatron-Bridge's
    DeepSeek-V3 MXFP8 runs of 26.02-26.04.01 with their recipes' layout and recompute
    (GB300, pp 2 x vp 8, 32 layers on the first rank: 262.6 allocated, 275.7 reserved of
    275.5; GB200, pp 4 x vp 4: 174.9 allocated, 183.6 reserved of 183.0). Their runs bound
    the reserve: at most 3.5-4.9% of the bytes they allocate, at least 6.1% of the churned ones
    on every configuration that ran."""
    rows, _ = scored
    assert all(r["fits"] for r in rows)
    over_reserved = [r["run"] for r in rows if r["reserved_gib"] > r["capacity_gib"]]
    assert len(over_reserved) >= 7      # their reserve exceeds capacity: it did not decide
    assert all(r["needed_gib"] <= r["capacity_gib"] for r in rows)


def test_nvidia_mlperf_gpt3_runs_reduce_bf16_gradients():
    """NVIDIA's MLPerf GPT-3 175B submissions (v4.0, v4.1) run Apex's DistributedFusedAdam with
    grad_sync_dtype: bf16 (their conf/optim/distributed_fused_adam.yaml), so their data-parallel
    reduce-scatter moves 2 B a gradient, not Megatron's default fp32 4 B; Oracle's v4.1 rows,
    whose submission does not carry that file, keep the default."""
    runs = [r for r in fidelity.load_runs(fidelity.DATA_HELDOUT) if "gpt3-175b" in r["id"]]
    nvidia = [r for r in runs if r["id"].startswith(("mlperf-v4.0-nvidia", "mlperf-v4.1-nvidia"))]
    assert len(nvidia) == 6
    assert all(fidelity.engine_of(r).grad_bytes == 2.0 for r in nvidia)
    assert all(fidelity.engine_of(r).grad_bytes == 4.0 for r in runs if r not in nvidia)


def test_full_iteration_graph_rows_are_priced_without_the_host_stall(scored):
    """The 26.06-26.08 MXFP8 rows on GB200 / GB300 (and Qwen3-30B on B300) ran recipes that
    replay the iteration as one CUDA graph with static MoE shapes (`cuda_graph_source`: the
    Megatron-Bridge commits picked into the 26.06 release branch on 2026-06-10); the same
    configurations' step times fell 14-36% from 26.04.01 to 26.06. Priced without the dropless
    host stall, as they ran, the Qwen3 and DeepSeek-V3 ones are within 20%, the Qwen3-30B ones
    within 10%; with the stall the Qwen3-30B ones would be 24-55% slow, each at least 25 points
    slower than priced as it ran (33-74% slow before the MoE layer's GPU work was priced as
    Megatron-Core runs it, with a larger fitted stall; 30-54% before Blackwell's attention was
    priced as measured, faster than the H100 figure it had)."""
    rows, _ = scored
    runs = {r["id"]: r for r in fidelity.load_runs(fidelity.DATA_HELDOUT)}
    graphed = [r for r in rows if fidelity.full_iteration_graph(runs[r["run"]])]
    assert len(graphed) >= 20
    for r in graphed:
        run = runs[r["run"]]
        assert run["cuda_graph_source"].startswith("NVIDIA-NeMo/Megatron-Bridge ")
        assert fidelity.engine_of(run).moe_layer_overhead_s == 0.0
    not_gptoss = [abs(r["error_pct"]) for r in graphed if "gptoss" not in r["run"]]
    assert len(not_gptoss) >= 15 and max(not_gptoss) <= 20.0
    # the same rows priced with the stall (the fact removed): each at least 25 points slower
    qwen = [r for r in graphed if "qwen330ba3b" in r["run"]]
    stalled = [fidelity.predict(dict(runs[r["run"]], fixed={
        k: v for k, v in runs[r["run"]]["fixed"].items() if k != "cuda_graph"}))["error_pct"]
        - r["error_pct"] for r in qwen]
    assert len(stalled) >= 5 and min(stalled) >= 25.0
    assert max(abs(r["error_pct"]) for r in graphed if "qwen330ba3b" in r["run"]) <= 10.0
