"""The published runs held out of every fit (benchmarks/data/published_runs_heldout.json,
issue 22 item 5), scored with the committed figures: the issue's targets where they hold,
the open findings as strict xfails (benchmarks/results/fidelity_heldout_*.md)."""
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


def test_no_held_out_row_entered_a_fit():
    runs = fidelity.load_runs(fidelity.DATA_HELDOUT)
    fitted = {r["id"] for r in fidelity.loso_runs()
              if any(fig.production(r) for fig in fidelity.FIGURES)}
    assert not fitted & {r["id"] for r in runs}


def test_engines_within_issue_targets(scored):
    rows, _ = scored
    for eng in ("fsdp", "megatron"):
        a = [abs(r["error_pct"]) for r in rows if r["engine"] == eng]
        assert len(a) >= MIN_ROWS
        assert statistics.median(a) <= MEDIAN_TARGET and fidelity._p90(a) <= P90_TARGET, eng


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


@pytest.mark.xfail(strict=True, reason="open finding: 5 published configurations predicted not "
                   "to fit (A100-40GB FSDP 1B at 38.4-38.9 of 38.0 GiB, NeMo 24.07 Llama 3 8B cp2 "
                   "FP8 at 90.8 of 77.6, Nemotron-4 340B at 87.2)")
def test_no_published_configuration_predicted_not_to_fit(scored):
    rows, _ = scored
    assert all(r["fits"] for r in rows)
