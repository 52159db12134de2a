"""The runtime runs the zero-bubble schedules (torch's ScheduleZBVZeroBubble,
ScheduleDualPipeV, ScheduleInterleavedZeroBubble) with one process's losses and gradient norms
(1e-4), on CPU (gloo), and measures memory per rank as for the other schedules."""
import pytest

pytest.importorskip("torch")

from planner.catalog import get_gpu  # noqa: E402
from planner.cost.schedule import stage_rank  # noqa: E402
from planner.plan import Batch, Parallelism, Plan, make_stages  # noqa: E402
from planner.specs import Cluster  # noqa: E402
from planner.vocab import V_SCHEDULES  # noqa: E402
from tests.runtime_runs import ran, runs_of  # noqa: E402
from tests.runtime_runs import steps_of  # noqa: E402,F401
from tests.test_runtime_dist import (GPT, LLAMA, RUN, STEPS, assert_same_curve,  # noqa: E402,F401
                                     baseline, work)

pytestmark = pytest.mark.slow


def make_plan(path, model, schedule, pp=2, vpp=2):
    """tests.test_runtime_dist's plan (8 sequences of 16 tokens, one per micro-batch), with
    the stages laid out as `schedule` places them."""
    plan = Plan(model=model, cluster=Cluster("cpux8", get_gpu("cpu"), 8, 8),
                parallelism=Parallelism(tp=1, pp=pp, dp=1, vpp=vpp, schedule=schedule),
                batch=Batch(seq_len=16, global_batch_size=8, micro_batch_size=1,
                            num_microbatches=8),
                stages=make_stages(model.num_layers, pp, vpp,
                                   v_shape=schedule in V_SCHEDULES),
                engine="runtime", run=RUN)   # the one-process baseline's run options
    plan.validate()
    plan.save(path)
    return path


MATCHED = {f"{schedule}-{kind}": (schedule, model, kind)
           for schedule, model, kind in [("zbv", LLAMA, "llama"), ("dualpipev", LLAMA, "llama"),
                                         ("zbv", GPT, "gpt"), ("interleaved-zb", LLAMA, "llama")]}
MEASURED = ("zbv", "dualpipev")


def searched_plan(schedule):
    """The search's best pp 2 plan for `schedule` (a tiny model on cpux2) and its candidate."""
    from planner.search import Fixed, search, to_plan
    from planner.specs import Model
    model = Model("tiny", num_layers=8, hidden=64, ffn_hidden=128, num_heads=4, num_kv_heads=4,
                  vocab_size=128, max_seq_len=64)
    cluster = Cluster("cpux2", get_gpu("cpu"), 2, 2)
    report = search(model, cluster, Fixed(zero=0, pp=2, mbs=1, schedule=schedule,
                                          recompute="none"),
                    seq_len=32, global_batch=8, engine="runtime")
    best = report.ranked[0]
    return to_plan(model, cluster, best, report, engine="runtime"), best


@pytest.fixture(scope="module")
def two(work):
    """One 2-process launch (tests.runtime_runs) of every run below: the zero-bubble layouts
    for STEPS steps, the searched plans for one."""
    runs = {}
    for name, (schedule, model, _) in MATCHED.items():
        d = work / name
        d.mkdir()
        runs[name] = ["--plan", make_plan(d / "plan.json", model, schedule), "--steps", STEPS,
                      "--metrics", d / "m.jsonl"]
    searched = {}
    for schedule in MEASURED:
        d = work / f"{schedule}-mem"
        d.mkdir()
        searched[schedule] = searched_plan(schedule)
        searched[schedule][0].save(d / "plan.json")
        runs[f"{schedule}-mem"] = ["--plan", d / "plan.json", "--steps", 1,
                                   "--metrics", d / "m.jsonl"]
    return {**runs_of(2, runs, work), "searched": searched}


@pytest.mark.parametrize("name", sorted(MATCHED))
def test_pp2_zero_bubble_matches_one_process(work, baseline, two, name):
    schedule, _, kind = MATCHED[name]
    d = work / name
    stages = Plan.load(d / "plan.json").stages
    assert [s.pp_rank for s in stages] == [stage_rank(schedule, 2, i) for i in range(4)]
    ran(*two[name])
    want, _ = baseline(kind)
    got = steps_of(d / "m.jsonl")
    assert_same_curve(got, want, range(1, STEPS + 1))
    mem = got[1]["measured_memory_gib"]
    assert sorted(m["pp_rank"] for m in mem) == [0, 1]
    assert all(m["activations"] > 0 and m["peak"] > 0 for m in mem)


@pytest.mark.parametrize("schedule", MEASURED)
def test_measured_activations_are_the_plans(work, two, schedule):
    """pp 2 on 2 processes, a searched plan: each rank's measured saved activations on the
    first step are within 30% of the plan's (planner.cost.schedule counts a chunk-micro-batch
    until its W), as tests/test_runtime_pipeline_memory.py checks the other schedules."""
    from tests.test_runtime_searched import activations_as_planned, planned_activations
    plan, best = two["searched"][schedule]
    assert plan.parallelism.schedule == schedule and plan.batch.num_microbatches == 8
    ran(*two[f"{schedule}-mem"])
    measured = steps_of(work / f"{schedule}-mem" / "m.jsonl")[1]["measured_memory_gib"]
    for m in measured:
        want = planned_activations(plan, best, m["pp_rank"])
        assert activations_as_planned(m["activations"], *want), (m, want)
