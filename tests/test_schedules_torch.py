"""Our zero-bubble action orders and makespans against torch.distributed.pipelining's own.

planner.cost.schedule generates the orders without torch; here torch's schedule classes
generate them (torch/distributed/pipelining/_schedule_visualizer.get_schedule_ops, which
instantiates the class on mock stages) and lay them out on unit time steps
(add_schedule_op_spacing): our simulator, every action one unit long, must take as many steps.
"""
import pytest

torch = pytest.importorskip("torch")
viz = pytest.importorskip("torch.distributed.pipelining._schedule_visualizer")

from planner.cost.schedule import rank_orders, simulate  # noqa: E402

TORCH_NAME = {"zbv": "ZBVZeroBubble", "interleaved-zb": "InterleavedZeroBubble",
              "dualpipev": "DualPipeV"}


def _flat(rank_actions) -> list:
    out = []
    for a in rank_actions:
        if a is None:
            continue
        subs = a.sub_actions if a.sub_actions is not None else (a,)
        out += [(s.stage_index, s.computation_type.value, s.microbatch_index) for s in subs]
    return out


CASES = ([("zbv", p, m, 2) for p in (2, 3, 4) for m in (1, 2, 3, 4, 6, 8, 9)]
         + [("dualpipev", p, m, 2) for p in (2, 3, 4) for m in range(2 * p, 2 * p + 5)]
         + [("interleaved-zb", p, m, v) for p in (2, 3, 4) for v in (2, 3)
            for m in (2, 4, 6, 8, 12) if m % max(1, m // p) == 0])


@pytest.mark.parametrize("schedule,p,m,v", CASES)
def test_orders_match_torch(schedule, p, m, v):
    theirs = viz.get_schedule_ops(TORCH_NAME[schedule], p, m, v)
    ours = rank_orders(schedule, p, m, v)
    assert [tuple(_flat(r)) for r in theirs] == list(ours)


@pytest.mark.parametrize("schedule,p,m,v", [c for c in CASES if c[0] != "dualpipev"])
def test_unit_makespan_matches_torch_spacing(schedule, p, m, v):
    spaced = viz.get_schedule_ops(TORCH_NAME[schedule], p, m, v, add_spacing=True)
    steps = max(len(r) - next((i for i, a in enumerate(reversed(r)) if a is not None), 0)
                for r in spaced)
    makespan, _ = simulate(schedule, rank_orders(schedule, p, m, v), [(1.0, 1.0, 1.0)] * p,
                           first_stage_in_w=False)
    assert makespan == steps
