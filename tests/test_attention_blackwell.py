"""Blackwell's attention, priced from NVIDIA's measured cuDNN attention (planner.catalog.gpus
BLACKWELL_ATTENTION, benchmarks/attention_fit.py): the planner's attention seconds for the
measured shapes against the measured seconds, through the catalog models and
planner.cost.compute.attention_time (not the fit's own arithmetic)."""
import csv
import dataclasses
from collections import defaultdict
from pathlib import Path

import pytest

from benchmarks.attention_fit import DATA, FIT_CONFIGS, SERVES, fit, measured_points
from planner.catalog.gpus import get_gpu
from planner.catalog.models import MODELS
from planner.cost.compute import ATTN_BWD_FACTOR, attention_time

# the measured configurations as catalog models: Llama 3.1 70B's attention (64 query heads,
# 8 key-value heads of 128) and DeepSeek-V3's MLA (128 heads, 192 / 128)
AS_CATALOG = {"llama3.1": "llama3.1-70b", "dsv3": "deepseek-v3"}


def _measured():
    """{(config, gpu, seq, batch): fwd + bwd seconds} of the causal rows."""
    out = defaultdict(float)
    with open(DATA, newline="") as f:
        for r in csv.DictReader(f):
            out[(r["config"], r["gpu"], int(r["q_seqlen"]), int(r["batch_size"]))] += (
                float(r["time_ms"]) * 1e-3)
    return out


def test_the_catalog_figures_are_the_fit_of_the_measurement():
    points = measured_points()
    for measured, (eff, half) in fit(points).items():
        for name in SERVES[measured]:
            gpu = get_gpu(name)
            assert gpu.attn_efficiency == pytest.approx(eff, rel=2e-3)
            assert gpu.attn_half_keys == pytest.approx(half, rel=2e-3)


@pytest.mark.parametrize("config", sorted(AS_CATALOG))
def test_planner_attention_seconds_match_cudnn_on_gb200_and_gb300(config):
    model = MODELS[AS_CATALOG[config]]
    assert config in FIT_CONFIGS
    times = _measured()
    checked = 0
    for (cfg, gpu, s, b), measured in times.items():
        if cfg != config:
            continue
        fwd = attention_time(model, get_gpu(gpu), b, s, tp=1)
        predicted = fwd * (1 + ATTN_BWD_FACTOR)
        # within the fit's worst point, 15.4% (benchmarks/results/attention_blackwell_*.md)
        assert predicted == pytest.approx(measured, rel=0.155), (gpu, s)
        checked += 1
    assert checked == 10


def test_the_old_flat_figure_missed_the_measurement():
    """H100's assumed 0.40 flat, as Blackwell had it before: off by more than a fifth at the
    short end or the long end of the measured range on each GPU."""
    times = _measured()
    model = MODELS["llama3.1-70b"]
    for gpu_name in ("gb200", "gb300"):
        flat = dataclasses.replace(get_gpu(gpu_name), attn_efficiency=0.40, attn_half_keys=0.0)
        errs = []
        for s in (2048, 8192, 16384):
            t = attention_time(model, flat, 2, s, tp=1) * (1 + ATTN_BWD_FACTOR)
            errs.append(abs(t / times[("llama3.1", gpu_name, s, 2)] - 1))
        assert max(errs) > 0.2


def test_hopper_and_older_attention_is_unchanged_flat():
    """Where the catalog has no measured roll-off the efficiency is one figure at any length:
    twice the sequence is four times the causal attention, exactly."""
    model = MODELS["llama3-8b"]
    for name in ("h100", "a100"):
        gpu = get_gpu(name)
        assert gpu.attn_half_keys == 0.0
        a = attention_time(model, gpu, 1, 2048, tp=1)
        b = attention_time(model, gpu, 1, 4096, tp=1)
        assert b == pytest.approx(4 * a, rel=1e-3)


def test_a_context_parallel_rank_does_its_share_at_the_whole_sequence_rate():
    """1/cp of the (load-balanced) FLOPs at the rate of the whole sequence's keys: Ulysses and
    the all-gather kind attend the whole sequence (the ring's chunked steps, a little slower,
    are not priced: planner.cost.compute.attention_time)."""
    model = MODELS["llama3.1-70b"]
    gpu = get_gpu("gb200")
    whole = attention_time(model, gpu, 1, 32768, tp=8)
    for cp in (2, 4, 8):
        assert attention_time(model, gpu, 1, 32768, tp=8, cp=cp) == pytest.approx(
            whole / cp, rel=1e-12)


def _brute_keys(s: int, window: int) -> float:
    """Keys a query attends, counted query by query (causal, a window of `window` if set)."""
    return sum(min(i + 1, window) if window else i + 1 for i in range(s)) / s


def test_each_layer_kind_at_its_own_rate():
    """gpt-oss alternates windowed (128) and full layers: each kind's FLOPs at the rate of its
    own keys, counted here query by query, not one rate at the layers' mean."""
    model = MODELS["gpt-oss-120b"]
    gpu = get_gpu("gb200")
    s, b = 4096, 1
    width = model.num_heads * (model.head_dim + model.value_head_dim) / 2
    share = model.num_sliding_layers / model.num_layers
    peak = gpu.tensor_peak_tflops * 1e12
    want = 0.0
    for frac, window in ((share, model.sliding_window), (1 - share, 0)):
        keys = _brute_keys(s, window)
        rate = peak * gpu.attn_efficiency * keys / (keys + gpu.attn_half_keys)
        want += frac * 4 * b * s * keys * width / rate
    assert attention_time(model, gpu, b, s, tp=1) == pytest.approx(want, rel=1e-3)
    # the windowed layers' share of the time is over three times their share of the FLOPs
    kw, kf = _brute_keys(s, model.sliding_window), _brute_keys(s, 0)
    flop_share = share * kw / (share * kw + (1 - share) * kf)
    windowed = share * 4 * b * s * width * (kw + gpu.attn_half_keys) / (
        peak * gpu.attn_efficiency)
    assert windowed / want > 3 * flop_share


@pytest.mark.parametrize("half_keys", [500.0, 1e5])
def test_a_profile_moves_the_roll_off_through_its_measurement(half_keys):
    """A measured attention rate (the profile's, at its causal keys) on a GPU with a roll-off:
    the planner's efficiency there is the measured one, whether the long-sequence figure is
    scaled (500 keys) or, were that above the peak, the half-way keys moved (1e5)."""
    from planner.catalog import get_cluster
    from planner.cost.compute import attention_efficiency
    from planner.profile import apply_profile, load_profile
    repo = Path(__file__).resolve().parents[1]
    p = load_profile(repo / "benchmarks" / "profiles" / "cpux2-tiny-llama.json")
    catalog = get_cluster("cpux2")
    catalog = dataclasses.replace(catalog, gpu=dataclasses.replace(
        catalog.gpu, attn_half_keys=half_keys))
    model = MODELS["llama3-8b"]
    cluster, _, notes = apply_profile(p, catalog, model)
    pts = [dict(e, seq_len=m["seq_len"]) for m in p.data["models"] for e in m["attention_core"]]
    best = max(pts, key=lambda e: e["flops"])
    keys = best["seq_len"] / 2
    rate = best["flops"] / best["fwd_s"]["median"] / 1e12
    measured = rate / cluster.gpu.tensor_peak_tflops
    assert attention_efficiency(cluster.gpu, keys) == pytest.approx(measured, rel=1e-9)
    assert cluster.gpu.attn_efficiency <= 1.0
    assert any("attention efficiency" in n for n in notes)


def test_a_window_of_128_is_priced_slower_per_flop():
    """gpt-oss's 128-key window: the rate at its keys is a fraction of the full layers' (the
    measurement: 7% of peak for window 128 against about 50% at 4096; not fitted on)."""
    from planner.cost.compute import attention_efficiency
    gpu = get_gpu("gb200")
    assert attention_efficiency(gpu, 128) < 0.3 * attention_efficiency(gpu, 2048)
    pts = [p for p in measured_points() if p["config"] == "gpt_oss"]
    assert pts and all(p["efficiency"] < 0.1 for p in pts)
