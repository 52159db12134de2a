"""A GPU under a board power limit (`power_limit_w`, nvidia-smi -pl): its tensor-core peaks in the
ratio its silicon's datasheet ratings give (planner.power power_scale), its HBM as rated.

The datasheet figures below are typed from NVIDIA's tables, not read from the catalog: HGX B100
(700 W) 1.75 PFLOP/s bf16 dense and 3.5 FP8 dense; HGX B200 (1000 W) 2.25 / 4.5; GB200 NVL72
(1200 W) 2.5 / 5.0 per GPU."""
import dataclasses
import json
from pathlib import Path

import pytest

from planner.catalog import get_cluster, get_gpu
from planner.cost.compute import gemm_time
from planner.errors import BadInput
from planner.plan import Plan
from planner.precision import low_precision_peak
from tests.cli_helpers import one_line, run, write

HGX_B100 = {"watts": 700, "bf16": 1750.0, "fp8": 3500.0}
HGX_B200 = {"watts": 1000, "bf16": 2250.0, "fp8": 4500.0}


def limited(name, watts):
    return dataclasses.replace(get_gpu(name), power_limit_w=watts)


@pytest.mark.parametrize("name, rating", [("b200", HGX_B100), ("gb200", HGX_B100),
                                          ("gb200", HGX_B200)])
def test_a_limit_at_another_rating_of_the_silicon_is_that_part(name, rating):
    g = limited(name, rating["watts"])
    assert g.tensor_peak_tflops == pytest.approx(rating["bf16"])
    assert low_precision_peak(g, "fp8") == pytest.approx(rating["fp8"])
    assert g.hbm_gbps == get_gpu(name).hbm_gbps


def test_no_limit_or_the_rated_power_is_the_rated_part():
    for name, watts in (("b200", 0), ("b200", 1000), ("gb200", 1200)):
        g, rated = limited(name, watts), get_gpu(name)
        assert g.tensor_peak_tflops == rated.peak_tflops
        assert low_precision_peak(g, "mxfp8") == low_precision_peak(rated, "mxfp8")


def test_between_ratings_the_peak_lies_between_and_rises_with_power():
    peaks = [limited("b200", w).tensor_peak_tflops for w in (700, 750, 850, 1000)]
    assert peaks == sorted(peaks) and len(set(peaks)) == 4
    assert HGX_B100["bf16"] < peaks[1] < HGX_B200["bf16"]


def test_a_compute_bound_gemm_slows_by_the_peak_a_memory_bound_one_not():
    g, rated = limited("b200", 700), get_gpu("b200")
    big = gemm_time(g, 8192, 8192, 8192) / gemm_time(rated, 8192, 8192, 8192)
    assert big == pytest.approx(HGX_B200["bf16"] / HGX_B100["bf16"])
    thin = (8192 * 1024, 4, 4)        # reads and writes far more than it multiplies
    assert gemm_time(g, *thin) == gemm_time(rated, *thin)


@pytest.mark.parametrize("name, watts, needle", [
    ("h100", 500, "no datasheet rates its silicon at another power"),
    ("b200", 600, "outside 700-1000 W"),
    ("b200", 1200, "outside 700-1000 W"),
])
def test_a_limit_no_datasheet_prices_is_refused(name, watts, needle):
    with pytest.raises(BadInput, match=needle):
        limited(name, watts)


def test_a_cluster_file_with_a_power_limit_plans_slower_and_round_trips(capsys, tmp_path):
    cf = write(tmp_path, "capped.json", {"base": "b200", "num_gpus": 8, "power_limit_w": 750})
    assert get_cluster(cf).gpu.power_limit_w == 750
    times = {}
    for name, cluster in (("rated", "b200x8"), ("capped", cf)):
        out = tmp_path / f"{name}.json"
        code, _, err = run(capsys, "--model", "llama8b", "--cluster", cluster, "--out", out,
                           limit_s=60.0)
        assert code == 0, err
        times[name] = json.loads(out.read_text())
    assert (times["capped"]["estimate"]["step_time_s"]
            > times["rated"]["estimate"]["step_time_s"])
    p = Plan.load(str(tmp_path / "capped.json"), whole_cluster=True)
    assert p.cluster.gpu.power_limit_w == 750


@pytest.mark.parametrize("watts, needle", [(500, "outside 700-1000 W"),
                                           (-5, "power_limit_w must be")])
def test_a_bad_power_limit_in_a_cluster_file_is_one_line_exit_2(capsys, tmp_path, watts, needle):
    cf = write(tmp_path, "c.json", {"base": "b200", "num_gpus": 8, "power_limit_w": watts})
    code, _, err = run(capsys, "--model", "llama8b", "--cluster", cf)
    one_line(code, err, needle=needle)


def test_the_trust_band_under_a_power_limit_is_that_of_runs_at_that_limit():
    """On a catalog GPU under a power limit, `plan` quotes the held-out error of the published
    runs at that limit (torchao's B200 rows at 750 W), and no band at a limit no run had."""
    from planner.engines import get_engine
    from planner.explain import gpu_label, trust_label
    rows = json.loads((Path(__file__).parent.parent / "benchmarks" / "data"
                       / "published_runs_heldout.json").read_text())
    rows = rows["runs"] if isinstance(rows, dict) else rows
    at_750 = [r for r in rows if r.get("power_limit_w") == 750 and r["engine"] == "torchtitan"]
    tt = get_engine("torchtitan")
    band = trust_label(tt, limited("b200", 750))
    assert f"{len(at_750)} published torchtitan runs on Blackwell GPUs at 750 W" in band
    assert trust_label(tt, limited("b200", 800)).startswith("not validated on a custom GPU")
    assert trust_label(get_engine("megatron"), limited("b200", 750)).startswith("not validated")
    assert gpu_label(limited("b200", 750)) == "b200 at 750 W"


def test_a_power_limit_lends_no_band_where_the_engine_never_ran_and_rated_is_the_catalog():
    """gb200 at 750 W under torchtitan, which has no gb200 run, is not validated by torchao's
    b200 rows; a limit at the part's own rated power is the catalog part, its band and name."""
    from planner.engines import get_engine
    from planner.explain import gpu_label, trust_label
    tt, mg = get_engine("torchtitan"), get_engine("megatron")
    assert trust_label(tt, limited("gb200", 750)).startswith("not validated")
    for name, rated in (("b200", 1000), ("gb200", 1200)):
        assert gpu_label(limited(name, rated)) == name
        for engine in (tt, mg):
            assert trust_label(engine, limited(name, rated)) == trust_label(engine,
                                                                            get_gpu(name))


def test_a_mixed_clusters_all_as_the_slowest_baseline_names_its_power_limit(tmp_path):
    """Two B200 groups, one capped at 750 W: the capped one is the slowest (its peak 1833 of
    2250), and the baseline "all as the slowest" is priced and named at its limit (it was
    named plain "b200x16", which reads as 16 uncapped B200s)."""
    from planner.search.groups import slowest_cluster
    path = write(tmp_path, "mx.json", {"name": "mx", "groups": [
        {"name": "full", "gpu": "b200", "num_gpus": 8},
        {"name": "capped", "gpu": {"base": "b200", "power_limit_w": 750}, "num_gpus": 8}]})
    slow = slowest_cluster(get_cluster(str(path)))
    assert slow.gpu.power_limit_w == 750
    assert slow.gpu.tensor_peak_tflops == pytest.approx(1750 + 500 * 50 / 300)
    assert slow.name == "b200x16 at 750 W"


def test_a_rows_generation_at_a_limit_written_as_a_float_is_the_trust_key():
    """fidelity.generation_of names a power-limited row's generation as the trust band's key
    ("blackwell at 750 W"), whether the data writes the limit 750 or 750.0."""
    from benchmarks.fidelity import generation_of
    trust = json.loads((Path(__file__).parent.parent / "planner" / "engines"
                        / "trust.json").read_text())
    for watts in (750, 750.0):
        gen = generation_of({"power_limit_w": watts}, "b200")
        assert gen in trust["engines"]["torchtitan"]
