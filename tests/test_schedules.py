"""The zero-bubble schedules (interleaved-zb, zbv, dualpipev): their simulated price, their
memory, the search, the export, the refusals and the picture."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cost.schedule import (in_flight, pipeline_time, rank_orders, simulate,
                                   stage_rank)
from tests.cli_helpers import one_line, run

LLAMA70B = ("--model", "llama70b", "--cluster", "h100x64", "--engine", "torchtitan",
            "--tp", "8", "--pp", "8", "--global-batch", "64")


def _plan(capsys, *extra):
    code, out, err = run(capsys, *LLAMA70B, *extra, "--json", limit_s=60)
    assert code == 0, err
    return json.loads(out)


@settings(max_examples=60, deadline=None)
@given(sched=st.sampled_from(["zbv", "dualpipev", "interleaved-zb"]),
       p=st.integers(2, 5), extra=st.integers(0, 6),
       durs=st.lists(st.tuples(*[st.floats(0.01, 3.0)] * 3), min_size=5, max_size=5))
def test_makespan_between_the_busiest_rank_and_serial(sched, p, extra, durs):
    """Whatever the durations: no faster than the busiest rank's own work, no slower than
    every action one after another; every action runs once, in its rank's order, after its
    inputs (F after the previous stage's F, I/B after the next stage's, W after I)."""
    v = 2 if sched != "interleaved-zb" else 2 + extra % 2
    m = 2 * p + extra if sched != "interleaved-zb" else p * (1 + extra % 3)
    d = durs[:p]
    orders = rank_orders(sched, p, m, v)
    span, acts = simulate(sched, orders, d)
    work = [sum(a[1] - a[0] for a in rank) for rank in acts]
    assert span >= max(work) * (1 - 1e-9)
    assert span <= sum(work) * (1 + 1e-9)
    end = {}
    for rank, order in zip(acts, orders):
        assert [a[2] for a in rank] == list(order)
        for start, stop, (s, kind, mb) in rank:
            end[(s, kind, mb)] = (start, stop)
    n = v * p
    for (s, kind, mb), (start, _) in end.items():
        if kind == "F" and s > 0:
            assert start >= end[(s - 1, "F", mb)][1] - 1e-12
        if kind in ("I", "B") and s < n - 1:
            nxt = end.get((s + 1, "I", mb)) or end[(s + 1, "B", mb)]
            assert start >= nxt[1] - 1e-12
        if kind == "W":
            assert start >= end[(s, "I", mb)][1] - 1e-12
    assert {(s, mb) for s, k, mb in end if k in ("W", "B")} == \
        {(s, mb) for s in range(n) for mb in range(m)}


@settings(max_examples=200, deadline=None)
@given(sched=st.sampled_from(["zbv", "dualpipev", "interleaved-zb"]),
       p=st.integers(2, 6), m=st.integers(1, 14), extra=st.integers(0, 1),
       parts=st.lists(st.tuples(*[st.floats(0.0, 3.0)] * 3), min_size=6, max_size=6))
def test_zero_bubble_floor_is_below_the_simulated_schedule(sched, p, m, extra, parts):
    """planner.search.bounds.zero_bubble_floor, from each rank's time, forward and weight
    gradients per micro-batch, never exceeds the simulated pipeline (any rank times, micro-
    batch counts torch accepts, one micro-batch included; 15,000 random instances checked
    likewise when it was written)."""
    from planner.cost.schedule import schedule_problem, zero_bubble_time
    from planner.search.bounds import zero_bubble_floor
    v = 2 if sched != "interleaved-zb" else 2 + extra
    if schedule_problem(sched, p, m, v):
        return
    fwd = [f for f, _, _ in parts[:p]]
    wgrad = [w for _, _, w in parts[:p]]
    times = [f + i + w for f, i, w in parts[:p]]
    span, _ = zero_bubble_time(sched, times, fwd, wgrad, m, v)
    floor = zero_bubble_floor(m, max(times), sum(times), sum(wgrad))
    assert floor <= span * (1 + 1e-9) + 1e-12


@pytest.mark.parametrize("p", [2, 4, 8])
def test_zbv_holds_1f1b_peak_on_its_first_rank(p):
    """Qi et al. 2024 Sec. 6: ZB-V's peak activation memory is 1F1B's (p micro-batches, the
    first rank's), here with activations counted until W."""
    m = 4 * p
    assert in_flight("zbv", p, 0, m, 2) == in_flight("1f1b", p, 0, m) == p


def test_v_layout_is_torchs():
    assert [stage_rank("zbv", 4, i) for i in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert [stage_rank("interleaved-zb", 4, i) for i in range(8)] == [0, 1, 2, 3] * 2


def test_no_w_share_no_gain_on_the_v():
    """A backward with no weight gradient leaves nothing to fill the bubble with: zbv then
    is no faster than interleaving over the same 2 chunks (Narayanan's (p - 1) / (v m))."""
    p, m = 4, 8
    step, _ = pipeline_time([1.0] * p, m, 2, "zbv", [1 / 3] * p, [0.0] * p)
    assert step >= pipeline_time([1.0] * p, m, 2)[0] * (1 - 1e-9)


def test_llama70b_zbv_beats_1f1b_and_is_searched(capsys):
    one = _plan(capsys, "--schedule", "1f1b")
    zbv = _plan(capsys, "--schedule", "zbv")
    assert zbv["parallelism"]["vpp"] == 2
    assert zbv["estimate"]["time_breakdown_s"]["bubble"] < \
        one["estimate"]["time_breakdown_s"]["bubble"]
    assert zbv["estimate"]["step_time_s"] < one["estimate"]["step_time_s"]
    best = _plan(capsys)
    assert best["parallelism"]["schedule"] in ("interleaved-zb", "zbv", "dualpipev")
    assert best["estimate"]["step_time_s"] <= zbv["estimate"]["step_time_s"] * (1 + 1e-9)


def test_export_names_torchs_schedule(capsys):
    code, out, err = run(capsys, *LLAMA70B, "--schedule", "zbv", "--export", "torchtitan",
                         limit_s=60)
    assert code == 0, err
    assert 'pipeline_parallel_schedule = "ZBVZeroBubble"' in out
    assert "2 stages per rank" in out


@pytest.mark.parametrize("args,needle", [
    (("--engine", "megatron", "--schedule", "zbv"), "no zbv schedule"),
    (("--engine", "deepspeed", "--schedule", "dualpipev"), "no dualpipev schedule"),
    (("--engine", "torchtitan", "--schedule", "zbv", "--vpp", "3"), "exactly 2 model chunks"),
    (("--engine", "torchtitan", "--schedule", "dualpipev", "--vpp", "4"), "exactly 2"),
    (("--engine", "torchtitan", "--schedule", "dualpipev", "--pp", "8",
      "--global-batch", "8"), "at least 2 x pp"),
    (("--engine", "torchtitan", "--schedule", "zbv", "--pp", "1"), "needs --pp > 1"),
    (("--engine", "runtime", "--schedule", "zbv", "--zero", "3"), "ZeRO 0/1 only"),
])
def test_refused_in_one_line(capsys, args, needle):
    code, _, err = run(capsys, "--model", "llama70b", "--cluster", "h100x64", *args)
    one_line(code, err, 2, needle)


def test_plot_draws_w_blocks(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from planner.plan import Plan
    from planner.plot import plan_figure
    path = tmp_path / "zbv.json"
    code, _, err = run(capsys, *LLAMA70B, "--schedule", "zbv", "--out", path, limit_s=60)
    assert code == 0, err
    plan = Plan.load(path)
    fig = plan_figure(plan)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "W: weight-gradient backward" in labels
    from planner.plot import zero_bubble_ops
    from planner.cost.price import price_plan
    ops = zero_bubble_ops(plan, price_plan(plan), plan.batch.num_microbatches)
    kinds = {k for _, k, *_ in ops}
    assert kinds == {"F", "B", "W"}
    # the drawn timeline is the priced one: its last block ends at the step less the tail
    span = max(e for *_, e in ops)
    est = plan.estimate
    tail = est["step_time_s"] - span
    assert 0 <= tail < 0.05 * est["step_time_s"]


@settings(max_examples=40, deadline=None)
@given(p=st.integers(2, 8), k=st.integers(2, 5),
       fiw=st.tuples(st.floats(0.1, 3.0), st.floats(0.1, 3.0), st.floats(0.0, 3.0)))
def test_zb1p_bubble_is_the_published_formula(p, k, fiw):
    """torch's InterleavedZeroBubble at one chunk per rank is ZB-H1 / ZB1P: its bubble is
    (PP-1)(F+B-2W) with B the full backward (Qi et al. 2024; DeepSeek-V3 report Table 2 and
    github.com/deepseek-ai/DualPipe README), whenever W <= F and W <= I (the handcrafted
    schedule's assumption)."""
    f, i, w = fiw
    if w > min(f, i):
        w = min(f, i)
    m = k * p
    span, _ = simulate("interleaved-zb", rank_orders("interleaved-zb", p, m, 1),
                       [(f, i, w)] * p, first_stage_in_w=False)
    bubble = span - m * (f + i + w)
    assert bubble == pytest.approx((p - 1) * (f + (i + w) - 2 * w), rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_activation_memory_is_the_published_table(p):
    """DualPipe README (DeepSeek-V3 Table 2), activation per device in stage-micro-batches:
    1F1B PP, ZB1P PP, DualPipeV PP + 1 with PP = 2p stages on p devices."""
    m = 4 * p
    assert max(in_flight("interleaved-zb", p, r, m, 1) for r in range(p)) == p
    assert max(in_flight("dualpipev", p, r, m, 2) for r in range(p)) * 2 == 2 * p + 1
