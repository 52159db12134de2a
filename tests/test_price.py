"""The one price of a placement: what the stage table and the plot show per pipeline rank is
what the estimate's pipeline was priced with (planner.cost.price)."""
import pytest

from planner.catalog import get_cluster, get_model
from planner.cost.price import price
from planner.cost.stage import Candidate


@pytest.mark.parametrize("name,layers", [
    ("deepseek-v3", [15, 16, 15, 15]),       # 3 dense layers, then MoE: rank 0 mixes kinds
    ("llama4-maverick", [12, 12, 12, 12]),   # MoE every other layer
    ("llama3-8b", [8, 8, 8, 8]),              # dense: no MoE share
])
def test_rank_times_are_the_estimates_stage_times(name, layers):
    model = get_model(name)
    moe = model.is_moe
    c = Candidate(tp=8, pp=4, dp=8 if moe else 1, zero=1, sp=True, mbs=1, seq_len=4096,
                  global_batch=256, ep=8 if moe else 1)
    cluster = get_cluster(f"h100x{c.tp * c.pp * c.dp}")
    recompute = [0, 2, 0, 1]
    p = price(model, cluster, c, layers, recompute)
    ranks = p.rank_times()
    assert [r.total for r in ranks] == pytest.approx(p.estimate.stage_time_s, rel=1e-12)
    for r in ranks:
        assert 0 < r.fwd < r.total and r.bwd == pytest.approx(r.total - r.fwd)
    if moe:   # an MoE layer costs more than a dense one: the MoE share is really in there
        dense_only = [k.time(n, rr) for k, n, rr in zip(p.coeffs, layers, recompute)]
        assert all(r.total > d for r, d in zip(ranks, dense_only))
