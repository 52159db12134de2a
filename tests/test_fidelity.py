"""The cost model against published runs: runs the real predictor on the committed data set."""

import statistics

import pytest

from benchmarks import fidelity
from planner.catalog import get_cluster
from planner.catalog.gpus import GPUS


@pytest.fixture(scope="module")
def runs():
    return fidelity.load_runs()


@pytest.fixture(scope="module")
def rows(runs):
    return fidelity.table(runs)


def test_data_set_is_complete(runs):
    # dropping a run would quietly improve the statistics below
    assert len(runs) == 23
    assert len({r["id"] for r in runs}) == len(runs)
    for r in runs:
        assert r["step_time_s"] > 0 and r["source"]
        # one set of constants per GPU type: every run names a catalog cluster, no overrides
        gpu = get_cluster(r["cluster"]).gpu
        assert GPUS[gpu.name] is gpu, r["id"]


def test_median_and_max_error(rows):
    errs = [abs(r["error_pct"]) for r in rows]
    worst = max(rows, key=lambda r: abs(r["error_pct"]))
    assert statistics.median(errs) <= fidelity.MEDIAN_TARGET_PCT
    assert max(errs) <= fidelity.MAX_TARGET_PCT, (worst["run"], worst["error_pct"])


def test_every_gpu_type_within_target(rows):
    # one GPU type cannot hide behind the other's accuracy
    for gpu, s in fidelity.summary(rows).items():
        if gpu in ("all", "all_fit"):
            continue
        assert s["median_abs_pct"] <= fidelity.MEDIAN_TARGET_PCT, gpu


def test_every_published_configuration_fits(rows):
    bad = [(r["run"], round(r["peak_gib"], 1)) for r in rows if not r["fits"]]
    assert not bad
    for r in rows:
        assert r["peak_gib"] <= r["capacity_gib"]


def test_prediction_uses_the_published_configuration(runs, rows):
    for run, row in zip(runs, rows):
        f, c = run["fixed"], row["candidate"]
        assert row["run"] == run["id"]
        for key, attr in (("tp", "tp"), ("pp", "pp"), ("dp", "dp"), ("micro_batch", "mbs"),
                          ("sequence_parallel", "sp"), ("vpp", "vpp"),
                          ("global_batch", "global_batch"), ("seq_len", "seq_len")):
            if key in f:
                assert getattr(c, attr) == f[key], (run["id"], key)
        assert c.flash == (run.get("attention", "flash") == "flash")
        assert c.zero in run["zero_stages"], run["id"]     # what the engine offered
        assert sum(row["layers"]) == run["model"].get("n_layer", 0)
        if f.get("recompute") in ("full", "selective"):
            # published full/selective recompute covers every layer
            assert c.recompute == f["recompute"] and row["recompute"] == row["layers"]


def test_summary_and_markdown(rows):
    s = fidelity.summary(rows)
    assert s["all"]["runs"] == len(rows) and s["all_fit"]
    md = fidelity.to_markdown(rows, s, 1.0)
    assert md.count("\n| ptdp-") == 10 and "| all | 23 |" in md
