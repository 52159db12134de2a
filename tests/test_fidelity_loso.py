"""Leave-one-source-out fidelity (benchmarks.fidelity --loso) and the trust band it writes.

Bounds, not today's values: the issue-22 targets where they hold, regression bounds with an
xfail for the target where it does not yet (an open finding, reported in the table).
"""
import csv
import re
import statistics
from pathlib import Path

import pytest

from benchmarks import fidelity
from planner.engines import ENGINES
from planner.engines.trust import TABLE, TRUST, trust_on, validation_of

ROOT = Path(__file__).parent.parent
MEDIAN_TARGET, P90_TARGET, MIN_ROWS = 10.0, 25.0, 10


@pytest.fixture(scope="module")
def all_rows():
    csv_path = ROOT / TABLE.replace(".md", ".csv")
    return list(csv.DictReader(open(csv_path)))


@pytest.fixture(scope="module")
def loso_rows(all_rows):
    """The rows of the three fitted-on files, each scored without its family; the held-out
    file's rows (never fitted on) are held to their own targets in test_fidelity_heldout.py."""
    return [r for r in all_rows if not r["family"].startswith("held out: ")]


def test_trust_file_matches_the_committed_table():
    """planner/engines/trust.json says what the committed leave-one-source-out table says."""
    text = (ROOT / TABLE).read_text()
    for scope, gens in TRUST.items():
        assert scope.split()[0] in ENGINES
        for gen, v in gens.items():
            m = re.search(rf"^\| {re.escape(scope)} \| {gen} \| (\d+) \| ([\d.]+) \| ([\d.]+) \| "
                          rf"([\d.]+) \|", text, re.M)
            assert m, (scope, gen)
            assert (int(m.group(1)), float(m.group(2)), float(m.group(3)),
                    float(m.group(4))) == (v["runs"], v["held_out_median_abs_pct"],
                                           v["held_out_p90_abs_pct"],
                                           v["in_sample_median_abs_pct"]), (scope, gen)


def test_trust_band_is_held_out_and_per_generation():
    megatron = ENGINES["megatron"]
    line = trust_on(megatron, "a100")
    assert "held out" in line and "Ampere" in line and "in-sample" in line
    assert validation_of("megatron", "a100").runs == TRUST["megatron"]["ampere"]["runs"]
    # a generation with no published run falls back to all of the engine's runs
    assert validation_of("megatron", "mi300x").runs == TRUST["megatron"]["all"]["runs"]
    assert ENGINES["megatron"].trust() == validation_of("megatron").describe("megatron")


def _scopes(rows):
    out = {}
    for r in rows:
        out.setdefault(r["engine"] + (" moe" if r["family"].startswith("Megatron-Bridge MoE")
                                      else ""), []).append(r)
    return out


def _stats(rows, col):
    a = sorted(abs(float(r[col])) for r in rows)
    return statistics.median(a), fidelity._p90(a)


# Dense scopes held out beyond the issue-22 target (open findings, reported in the table), with
# their regression bounds (median, p90):
# - fsdp: leaving out llm-foundry's H100 table, the eager figures are refitted on torchtitan's
#   eager rows, which ran SDPA's flash attention; the table's long-sequence rows ran MPT's
#   Triton kernel (planner.engines.eager) and are predicted 30-43% fast: median 5%, p90 36%
#   (22.8% / 47.8% before the element-wise kernels were counted per op);
# - torchtitan: its p90 on its own family's 43 rows, 25.5% (its rowwise rows with no rowwise
#   row left to fit, the 8B CP 64K row, the 8B async-TP rows whose overlap is priced above what
#   they gained); with the held-out file's 11 torchao rows, the trust band's 54, it is 23.9%
#   since those rows' 750 W B200s are priced at their power limit;
# (megatron was one until Blackwell's GEMMs were priced as measured, planner.catalog.gpus
# BLACKWELL_GEMM: on the fitted-on files' 44 rows 10.1% / 15.5% then, 4.8% / 12.5% since, 3.2% /
# 12.5% once TE's Blackwell FP8 kept no transposes (planner.precision on_gpu); with
# H100's figure assumed on Blackwell, Megatron-Bridge's H100 rows left out had Transformer
# Engine's low-precision GEMM figure refitted on Blackwell rows that were too fast.)
OPEN_DENSE_SCOPES = {"fsdp": (10.0, 40.0), "torchtitan": (10.0, 30.0)}


def _dense_scopes(loso_rows):
    return {scope: rows for scope, rows in _scopes(loso_rows).items()
            if not scope.endswith(" moe") and len(rows) >= MIN_ROWS}


def test_dense_engines_within_issue_targets_held_out(loso_rows):
    for scope, rows in _dense_scopes(loso_rows).items():
        if scope in OPEN_DENSE_SCOPES:
            continue
        med, p90 = _stats(rows, "loso_error_pct")
        assert med <= MEDIAN_TARGET and p90 <= P90_TARGET, (scope, med, p90)


def test_open_dense_scopes_regression_bound(loso_rows):
    scopes = _dense_scopes(loso_rows)
    for scope, (med_bound, p90_bound) in OPEN_DENSE_SCOPES.items():
        med, p90 = _stats(scopes[scope], "loso_error_pct")
        assert med <= med_bound and p90 <= p90_bound, (scope, med, p90)


@pytest.mark.xfail(strict=True, reason="open finding: held out beyond the issue-22 target")
@pytest.mark.parametrize("scope", sorted(OPEN_DENSE_SCOPES))
def test_open_dense_scope_within_issue_targets_held_out(loso_rows, scope):
    med, p90 = _stats(_dense_scopes(loso_rows)[scope], "loso_error_pct")
    assert med <= MEDIAN_TARGET and p90 <= P90_TARGET


# MoE rows held out: release drift (the 25.09 token-drop rows 31-44% fast on B200), GPT-OSS-120B
# on Blackwell up to 46% fast, that the static model does not follow (benchmarks/results/
# fidelity_loso_*.md: 10.9 / 31.0% over the 138 rows, 10.8 / 28.4% over the fitted-on files' 42). Regression bounds (20 / 45 until the MoE
# layer's GPU work was priced as Megatron-Core runs it), and the target as an xfail.
MOE_MEDIAN_BOUND, MOE_P90_BOUND = 15.0, 40.0


def test_moe_held_out_regression_bound(loso_rows):
    med, p90 = _stats(_scopes(loso_rows)["megatron moe"], "loso_error_pct")
    assert med <= MOE_MEDIAN_BOUND and p90 <= MOE_P90_BOUND, (med, p90)


@pytest.mark.xfail(strict=True, reason="open finding: MoE held out beyond the issue-22 target")
def test_moe_within_issue_targets_held_out(loso_rows):
    med, p90 = _stats(_scopes(loso_rows)["megatron moe"], "loso_error_pct")
    assert med <= MEDIAN_TARGET and p90 <= P90_TARGET


def test_no_published_configuration_predicted_not_to_fit_held_out(loso_rows):
    assert all(r["fits"] == "True" and r["loso_fits"] == "True" for r in loso_rows)


def test_every_family_is_scored(loso_rows, all_rows):
    fams = {r["family"] for r in loso_rows}
    runs = fidelity.loso_runs()
    assert fams == {fidelity.family_of(r) for r in runs}
    assert len(loso_rows) == len(runs)
    if fidelity.DATA_HELDOUT.exists():       # and the trust band counts the held-out file too
        assert len(all_rows) == len(runs) + len(fidelity.heldout_table()[0])


def test_fit_procedures_reproduce_the_committed_figures():
    """A real refit: each figure's procedure, run on its production fit rows from its prior
    (never from the committed value), gives the committed value: exactly for a grid, to the
    significant figures committed (three, or four where three sat at the tolerance's edge) for
    the least-squares solves. The MoE host stall's
    simplex starts from the best point of a grid fixed in the code (from the prior alone it
    stopped at a corner, the per-expert bound of 0, at a 6% higher loss: every held-out refit
    lost that term), and now gives the committed figures too."""
    runs, values = fidelity.loso_runs(), fidelity.committed_figures()
    for fig in fidelity.FIGURES:
        rows = [r for r in runs if fig.production(r)]
        assert rows, fig.name
        got = fidelity.refit(fig, rows, values)
        if fig.procedure == "grid":
            assert got == values[fig.name], fig.name
        else:
            assert got == pytest.approx(values[fig.name], rel=1.5e-3), fig.name


def test_leaving_a_family_out_refits_without_it():
    """Leaving torchtitan out leaves the rowwise figure no row: its prior; its rows are then
    predicted with it, and nothing fitted on them is used."""
    runs = [r for r in fidelity.loso_runs() if r["engine"] == "torchtitan"
            or fidelity.FIGURES[1].production(r)]
    res = fidelity.loso(runs, families=["torchtitan"], log=lambda m: None)
    how = res["refits"]["torchtitan"]
    assert how["torchao rowwise float8 GEMM"][0] == (1.0,)
    assert "eager-PyTorch kernel figures" not in how      # not fitted on torchtitan rows
    rowwise = [r for r in res["rows"] if "rowwise" in r["run"]]
    assert rowwise and all(r["loso_error_pct"] != r["in_sample_error_pct"] for r in rowwise)


def test_repeat_publications_group_one_configuration_across_releases():
    """A configuration one table publishes in several releases is grouped, knob for knob
    (another micro-batch is another configuration; a source without releases is never
    grouped), its spread the slowest over the fastest published time."""
    base = {"cluster": "gb200x8", "catalog_model": "qwen3-30b-a3b", "precision": "mxfp8",
            "recipe": "mxfp8", "fixed": {"tp": 1, "ep": 8, "micro_batch": 4}}
    rows = [dict(base, id="mbridge-26.04-gb200-x", step_time_s=10.0),
            dict(base, id="mbridge-26.04.01-gb200-x", step_time_s=12.5),
            dict(base, id="mbridge-26.06-gb200-x", fixed={**base["fixed"], "micro_batch": 8},
                 step_time_s=9.0),
            dict(base, id="torchtitan-202412-x", step_time_s=20.0)]
    groups = fidelity.repeat_publications(rows)
    assert len(groups) == 1
    assert groups[0]["spread"] == pytest.approx(1.25)
    assert [rel for rel, _, _ in groups[0]["rows"]] == ["26.04", "26.04.01"]
