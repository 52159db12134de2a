"""The mixed search's bound (planner.search.groups prunes with bounds.lower_bound over each
rank's own GPU and memory) against a brute force over placements."""
import math

from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from planner.engines import get_engine



@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers=st.integers(3, 7), pp_fast=st.integers(1, 2), pp_slow=st.integers(1, 2),
       order=st.booleans(), m=st.sampled_from([1, 2, 4]), rec=st.sampled_from(["none", "full"]),
       frac=st.floats(0.3, 1.3))
@example(layers=5, pp_fast=2, pp_slow=1, order=True, m=4, rec="full", frac=0.6)
def test_the_mixed_bound_is_below_every_placement(layers, pp_fast, pp_slow, order, m, rec, frac):
    """lower_bound with each rank's own memory (bounds.per_rank), as the mixed search prunes
    with it, never exceeds the fastest placement a brute force finds: every split of the
    layers over the ranks, every recompute count on every rank (the runtime recomputes any
    count per rank)."""
    engine = "runtime"
    import dataclasses
    import itertools
    from planner.catalog import get_gpu
    from planner.cost.groups import mixed_coefficients
    from planner.cost.price import price
    from planner.cost.stage import Candidate, rank_budgets
    from planner.search.bounds import lower_bound, rules_for
    from planner.search.enumeration import Fixed
    from planner.specs import Cluster, MixedCluster, Model
    pp = pp_fast + pp_slow
    assume(pp <= layers)
    model = Model("tiny", num_layers=layers, hidden=1024, ffn_hidden=4096, num_heads=8,
                  num_kv_heads=8, vocab_size=32000, max_seq_len=4096)
    c = Candidate(tp=1, pp=pp, dp=1, zero=0, sp=False, mbs=1, seq_len=2048,
                  global_batch=m, recompute=rec)
    pipeline = [0] * pp_fast + [1] * pp_slow if order else [1] * pp_slow + [0] * pp_fast

    def mixed_with(gib_fast, gib_slow):
        fast = dataclasses.replace(get_gpu("h100"), memory_gib=gib_fast)
        slow = dataclasses.replace(get_gpu("a100"), memory_gib=gib_slow)
        return MixedCluster("m", (Cluster("fast", fast, pp_fast, 1),
                                  Cluster("slow", slow, pp_slow, 1))).with_pipeline(pipeline)

    big = mixed_with(10_000, 10_000)
    k = mixed_coefficients(model, big, c, engine)
    need = max(kk.memory(layers, 0)["needed"] for kk in k) / 2 ** 30
    floor = max(kk.needed_fixed() for kk in k) / 2 ** 30
    gib = 2.0 + floor + frac * (need - floor)
    cl = mixed_with(gib, gib * 0.8)
    coeffs = mixed_coefficients(model, cl, c, engine)
    caps = [b.usable_bytes for b in rank_budgets(cl, engine, 0.0, pp)]
    rules = rules_for(get_engine(engine), c, Fixed())
    bound = lower_bound(coeffs, c, layers, caps, rules)
    best = math.inf
    for cut in itertools.combinations(range(1, layers), pp - 1):
        split = [b - a for a, b in zip((0,) + cut, cut + (layers,))]
        for rec_counts in itertools.product(*[range(n + 1) if rec != "none" else [0]
                                              for n in split]):
            est = price(model, cl, c, split, list(rec_counts), engine=engine,
                        margin_gib=0.0).estimate
            if est.fits:
                best = min(best, est.step_time_s)
    assert bound <= best * (1 + 1e-9), (bound, best)
