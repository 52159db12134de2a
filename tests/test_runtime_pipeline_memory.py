"""The first step's measured activations under pipelining are the plan's, not the plan's plus a
graph that was never backpropagated.

torch.distributed.pipelining infers stage shapes on the first step by running stage 0's
forward once on real data with grad enabled and dropping it without a backward. Without
saved-tensor hooks autograd frees that graph when its outputs go; the measurement's hooks once
held each saved tensor itself, which ties a saved output to its own autograd node in a cycle
only a backward breaks, so the graph stayed and pipeline rank 0 measured one extra micro-batch
(1.82x the plan at pp 2, m = 1)."""
import gc
import tempfile
import weakref
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from planner.catalog import get_gpu  # noqa: E402
from planner.search import Fixed, search, to_plan  # noqa: E402
from planner.specs import Cluster, Model  # noqa: E402


def _graph_without_backward(hooks):
    """Build a graph that saves an input (matmul) and an output (exp), drop it without a
    backward, and say whether the saved input was freed."""
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(8, 8)
    saved = weakref.ref(x)
    with hooks:
        y = (x @ w).exp()
    del x, y
    gc.collect()
    return saved() is None


def test_measurement_hooks_free_a_graph_never_backpropagated():
    from contextlib import nullcontext

    from runtime.memory import StepMemory
    assert _graph_without_backward(nullcontext())        # what autograd does on its own
    mem = StepMemory([], [], on_gpu=False)
    assert _graph_without_backward(mem.hooks())
    assert mem.live_bytes == 0 and mem.act_peak > 0


@pytest.mark.slow
def test_first_pipeline_rank_holds_one_microbatch_at_m1():
    """pp 2 x dp 2, GPipe, one micro-batch: each rank's measured saved activations on the first
    step (which includes pipelining's shape inference) are within 30% of the plan's."""
    from tests.test_runtime_searched import (activations_as_planned, launch, planned_activations,
                                             steps_of)
    model = Model("tiny", num_layers=6, hidden=64, ffn_hidden=128, num_heads=4, num_kv_heads=4,
                  vocab_size=128, max_seq_len=64)
    cluster = Cluster("cpux4", get_gpu("cpu"), 4, 4)
    report = search(model, cluster, Fixed(zero=0, pp=2, dp=2, mbs=8, schedule="gpipe"),
                    seq_len=32, global_batch=16, engine="runtime")
    best = report.ranked[0]
    plan = to_plan(model, cluster, best, report, engine="runtime")
    assert plan.batch.num_microbatches == 1 and plan.parallelism.pp == 2
    d = Path(tempfile.mkdtemp(prefix="pp-mem-"))
    plan.save(d / "plan.json")
    r = launch(4, "--plan", d / "plan.json", "--steps", 1, "--metrics", d / "m.jsonl")
    assert r.returncode == 0, r.stderr[-3000:]
    measured = steps_of(d / "m.jsonl")[1]["measured_memory_gib"]
    assert sorted(m["pp_rank"] for m in measured) == [0, 0, 1, 1]
    for rank, m in enumerate(measured):
        want = planned_activations(plan, best, m["pp_rank"])
        assert activations_as_planned(m["activations"], *want), (rank, m, want)
