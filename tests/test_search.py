"""The search: CP-SAT placements equal brute force; the searched plan is never beaten."""
import dataclasses
import itertools
from unittest import mock

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from planner.catalog import get_cluster, get_gpu, get_model
from planner.cost.memory import GIB
from planner.cost.schedule import in_flight, pipeline_time
from planner.cost.stage import Candidate, evaluate, memory_budget, stage_coefficients
from planner.engines import get_engine
from planner.errors import BadInput
from planner.plan import Plan
from planner.search import Fixed, enumerate_candidates, placement, search, solve_candidate, to_plan
from planner.specs import Cluster, Model


def tiny_model(layers=8, hidden=1024, heads=8, kv=8, vocab=32000):
    return Model("tiny", num_layers=layers, hidden=hidden, ffn_hidden=4 * hidden,
                 num_heads=heads, num_kv_heads=kv, vocab_size=vocab, max_seq_len=4096)


def cluster_with_memory(gib, n=8, gpu="h100"):
    g = dataclasses.replace(get_gpu(gpu), memory_gib=gib)
    return Cluster(f"{gpu}x{n}", g, n, min(8, n))


def compositions(total, parts, least):
    """All ways to write total as `parts` integers, each at least `least`."""
    if parts == 1:
        if total >= least:
            yield [total]
        return
    for first in range(least, total - least * (parts - 1) + 1):
        for rest in compositions(total - first, parts - 1, least):
            yield [first] + rest


def engine_splits(total, pp, vpp, engine):
    """The splits an engine builds: each rank at least one layer a model chunk; under Megatron
    with chunks (its --account-for-embedding/loss-in-pipeline-split, transformer_block.py
    get_num_layers_to_build) the first rank's first chunk and the last rank's last may be
    empty: those two ranks need vpp - 1. Written here from Megatron's rule, not read from
    planner.rules."""
    ends_may_be_empty = engine == "megatron" and pp > 1 and vpp > 1
    for layers in compositions(total, pp, vpp - 1 if ends_may_be_empty else vpp):
        if all(n >= vpp for n in layers[1:-1]):
            yield layers


def searched_splits(model, pp, vpp, engine):
    """The splits the search places: the engine's (engine_splits), but every chunk of an MoE
    model holds a layer (planner.search.bounds.Rules.least_layers: Megatron's empty end chunks
    are searched for dense models only, a limit of the MoE placement model)."""
    if model.is_moe:
        return compositions(model.num_layers, pp, vpp)
    return engine_splits(model.num_layers, pp, vpp, engine)


def both_placements(model, cluster, c, **kw) -> list:
    """[(Result, fits)] of solve_candidate as the search calls it (a candidate with few splits
    is placed by pricing each: placement.MAX_PRICED_SPLITS) and of its CP-SAT model forced, so
    that a brute force checks both ways of placing layers."""
    with mock.patch.object(placement, "MAX_PRICED_SPLITS", 0):
        forced = solve_candidate(model, cluster, c, **kw)
    return [solve_candidate(model, cluster, c, **kw), forced]


def brute_force(model, cluster, c, all_layers_recomputed=False, engine="runtime", margin_gib=None):
    """Best estimate over every split and every recompute count the engine allows: any count
    per rank (runtime), or one count R per model chunk, a rank recomputing min(v*R, n)
    (Megatron's --recompute-num-layers)."""
    coeffs = stage_coefficients(model, cluster, c, engine)
    per_chunk = get_engine(engine).recompute_count(c.recompute) == "per_chunk"
    best = None
    for layers in engine_splits(model.num_layers, c.pp, c.vpp, engine):
        if c.recompute == "none":
            options = [[0] * c.pp]
        elif all_layers_recomputed:
            options = [layers]
        elif per_chunk:
            options = [[min(c.vpp * r, n) for n in layers] for r in range(max(layers) + 1)]
        else:   # every count, but an activation offload keeps a layer on the GPU
            kept = 1 if c.recompute == "offload" else 0
            options = itertools.product(*[range(n + 1 - kept) for n in layers])
        for rec in options:
            e = evaluate(model, cluster, c, layers, list(rec), coeffs, engine, margin_gib)
            if e.fits and (best is None or e.step_time_s < best.step_time_s):
                best = e
    return best


def test_pipeline_formula_reduces_to_bubble_fraction():
    p, m, v, t = 4, 8, 2, 1.0
    step, bubble = pipeline_time([t] * p, m, v)
    assert bubble / (m * t) == pytest.approx((p - 1) / (v * m))
    step1, _ = pipeline_time([1.0, 2.0, 1.5], 5, 1)
    assert step1 == pytest.approx(4.5 + 4 * 2.0)   # sum + (m - 1) * slowest


def test_in_flight_counts():
    assert [in_flight("1f1b", 4, r, 8) for r in range(4)] == [4, 3, 2, 1]
    assert in_flight("1f1b", 4, 0, 2) == 2
    assert in_flight("gpipe", 4, 3, 8) == 8
    # Megatron interleaved warm-up: (p - r - 1) * 2 + (v - 1) * p, plus one, in chunks
    assert in_flight("interleaved", 4, 0, 8, 2) == pytest.approx(((3 * 2) + 4 + 1) / 2)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers=st.integers(2, 8), pp=st.integers(2, 4), sched=st.sampled_from(["1f1b", "gpipe", "interleaved"]),
       v=st.sampled_from([1, 2]), m=st.sampled_from([1, 2, 4, 8]), zero=st.integers(0, 3),
       dp=st.sampled_from([1, 2]), rec=st.sampled_from(["full", "none"]),
       frac=st.floats(0.05, 1.2), mbs=st.sampled_from([1, 2]),
       engine=st.sampled_from(["runtime", "megatron"]))
def test_cpsat_equals_brute_force(layers, pp, sched, v, m, zero, dp, rec, frac, mbs, engine):
    if sched != "interleaved":
        v = 1
    assume(pp * v <= layers and not (sched == "interleaved" and m % pp))
    if dp == 1:
        zero = 0
    model = tiny_model(layers=layers)
    c = Candidate(tp=1, pp=pp, dp=dp, zero=zero, sp=False, mbs=mbs, seq_len=2048,
                  global_batch=dp * mbs * m, schedule=sched, vpp=v, recompute=rec)
    # memory between "nothing fits" and "everything fits without recompute"
    big = cluster_with_memory(10_000, n=pp * dp)
    k = stage_coefficients(model, big, c, engine)
    need = max(kk.memory(layers, 0)["needed"] for kk in k) / GIB
    floor = min(kk.needed_fixed() for kk in k) / GIB
    budget = memory_budget(big, engine, 0.0)
    gib = budget.context_gib + floor + frac * (need - floor)
    cluster = cluster_with_memory(gib, n=pp * dp)
    want = brute_force(model, cluster, c, engine=engine, margin_gib=0.0)
    for res, fits in both_placements(model, cluster, c, engine=engine, margin_gib=0.0):
        assert fits == (want is not None)
        if want is not None:
            assert res.estimate.step_time_s == pytest.approx(want.step_time_s, rel=1e-5)
            assert res.estimate.fits


def test_searched_plan_never_beaten_by_a_fixed_configuration():
    model = tiny_model(layers=8, hidden=2048, heads=16, kv=8)
    cluster = cluster_with_memory(24.0, n=8)
    rep = search(model, cluster, seq_len=2048, global_batch=32, top=1)
    best = rep.best.estimate.step_time_s
    checked = 0
    for c in enumerate_candidates(model, cluster, Fixed(), 2048, 32):
        res, fits = solve_candidate(model, cluster, c)
        if fits:
            checked += 1
            assert res.estimate.step_time_s >= best * (1 - 1e-9), c
    assert checked > 10
    # and each fixed what-if through the public search agrees
    c = rep.best.candidate
    again = search(model, cluster, Fixed(tp=c.tp, pp=c.pp, dp=c.dp, zero=c.zero, mbs=c.mbs,
                                         sp=c.sp, schedule=c.schedule, vpp=c.vpp), 2048, 32)
    # one layout, recomputing "full", or at pp 1 offloading too (Megatron's
    # --cpu-offloading-num-layers, which it runs without pipelining)
    assert again.candidates == (2 if c.pp == 1 else 1)
    assert again.best.estimate.step_time_s == pytest.approx(best)


def test_plan_roundtrip_and_estimate_consistency(tmp_path):
    model, cluster = get_model("llama70b"), get_cluster("h100x32")
    rep = search(model, cluster, Fixed(tp=8, pp=4), 4096, 64)
    plan = to_plan(model, cluster, rep.best, rep)
    path = tmp_path / "p.json"
    plan.save(path)
    back = Plan.load(path)
    assert back.to_dict() == plan.to_dict()
    assert back.layer_counts() == rep.best.layers
    bd = plan.estimate["time_breakdown_s"]
    assert sum(bd.values()) == pytest.approx(plan.estimate["step_time_s"], rel=1e-9)
    assert all(s.memory_gib["total"] <= plan.estimate["capacity_gib"] for s in plan.stages)


def test_more_memory_never_slower():
    model = get_model("llama8b")
    small = search(model, cluster_with_memory(40.0), seq_len=4096, global_batch=64).best
    large = search(model, cluster_with_memory(80.0), seq_len=4096, global_batch=64).best
    assert large.estimate.step_time_s <= small.estimate.step_time_s * (1 + 1e-9)


def test_recompute_appears_only_under_memory_pressure():
    model = tiny_model(layers=8)
    roomy = search(model, cluster_with_memory(1000.0), Fixed(tp=1, pp=2, dp=4), 2048, 32).best
    assert sum(roomy.recompute) == 0


@pytest.mark.parametrize("cluster, fixed, msg", [
    ("h100x16", Fixed(tp=3), "does not divide the cluster"),
    ("h100x16", Fixed(tp=16), "does not divide the model"),
    ("h100x64", Fixed(pp=64), "exceeds the model's 32 layers"),
    ("h100x16", Fixed(tp=4, pp=2, dp=1), "use them all"),
    ("h100x16", Fixed(dp=8, mbs=3), "not divisible"),
    ("h100x16", Fixed(vpp=2, schedule="1f1b"), "interleaved"),
])
def test_fixed_choices_that_cannot_work(cluster, fixed, msg):
    with pytest.raises(BadInput, match=msg):
        search(get_model("llama8b"), get_cluster(cluster), fixed, 4096, 64)


def test_published_gqa_405b_at_scale_finds_a_plan():
    rep = search(get_model("llama405b"), get_cluster("h100x16384"))
    assert rep.best is not None and rep.best.estimate.fits
    assert rep.best.status == "OPTIMAL"
    c = rep.best.candidate
    assert c.tp * c.cp * c.pp * c.dp == 16384


@pytest.mark.parametrize("engine", ["megatron", "runtime"])
def test_cutoff_at_the_kth_best_changes_no_ranked_plan(engine, monkeypatch):
    """The search tells CP-SAT to look only below the K-th best step so far; the ranked plans
    are those of the search without that cutoff."""
    import planner.search as S
    model = tiny_model(layers=16, hidden=4096, heads=32, kv=8)
    # tight: pipelined candidates need CP-SAT (a small batch: torch's pipelining, the runtime's,
    # holds receive buffers per micro-batch, which at 64 sequences leave no pipeline room)
    cluster = cluster_with_memory(13.0, n=8)
    with_cutoff = S.search(model, cluster, seq_len=2048, global_batch=16, engine=engine)
    assert with_cutoff.solved > 0
    orig = S.solve_candidate
    monkeypatch.setattr(S, "solve_candidate",
                        lambda *a, **k: orig(*a, **{**k, "cutoff_s": None}))
    without = S.search(model, cluster, seq_len=2048, global_batch=16, engine=engine)
    assert [r.estimate.step_time_s for r in with_cutoff.ranked] == pytest.approx(
        [r.estimate.step_time_s for r in without.ranked], rel=1e-9)
