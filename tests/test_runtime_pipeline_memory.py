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


# ---- ZeRO 0/1 under autocast: one bf16 copy of each weight for the step ----------------------

def test_autocast_keeps_one_bf16_copy_of_each_weight_for_the_step():
    """What `autocast_copy_bytes` prices (runtime/train.py runs ZeRO 0/1 on CUDA under one bf16
    autocast region per step): autocast casts a weight once and every micro-batch saves that
    same 2-byte-per-element copy; it lives for the step (without the cache each micro-batch
    would keep its own). Checked with CPU autocast, the same cast cache."""
    lin = torch.nn.Linear(16, 32, bias=False)
    saved = []

    def pack(t):
        saved.append(t)
        return t
    for cache in (True, False):
        saved.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=cache), \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            for _ in range(2):                      # two micro-batches
                lin(torch.randn(4, 16, requires_grad=True)).float().sum().backward()
        copies = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                  for t in saved if t.dtype == torch.bfloat16 and t.numel() == lin.weight.numel()}
        assert len(copies) == (1 if cache else 2)
        assert set(copies.values()) == {2 * lin.weight.numel()}


def _planned_params_gib(gpu: str, zero: int):
    from planner.catalog import get_gpu
    from planner.plan import Batch, Parallelism, Plan, make_stages
    model = Model("tiny", num_layers=2, hidden=64, ffn_hidden=128, num_heads=4, num_kv_heads=4,
                  vocab_size=128, max_seq_len=64, tied_embeddings=False)
    cluster = Cluster(f"{gpu}x2", get_gpu(gpu), 2, 2)
    report = search(model, cluster, Fixed(zero=zero, pp=1, tp=1, dp=2), seq_len=32,
                    global_batch=8, engine="runtime")
    best = report.ranked[0]
    return model, best.estimate.stage_memory_gib[0]["params"]


@pytest.mark.parametrize("zero", [0, 1])
def test_runtime_engine_prices_the_autocast_copy_on_gpus_only(zero):
    """ZeRO 0/1 keep whole fp32 parameters (4 B); on a GPU the runtime adds autocast's bf16
    copy (2 B), on a CPU (fp32, no autocast) nothing. Parameters counted by torch from the
    runtime's own model on the meta device."""
    from runtime.model import Transformer
    model, gpu_gib = _planned_params_gib("h100", zero)
    _, cpu_gib = _planned_params_gib("cpu", zero)
    with torch.device("meta"):
        n = sum(p.numel() for p in Transformer(model).parameters())
    assert cpu_gib == pytest.approx(4 * n / 2**30, rel=1e-6)
    assert gpu_gib == pytest.approx(6 * n / 2**30, rel=1e-6)


# ---- ZeRO 0/1: the dp all-reduce overlaps the last micro-batch's backward --------------------

_OVERLAP = r"""
import os, torch, torch.distributed as dist
from runtime.data_parallel import GradAllReduce
dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:%d" % int(os.environ["PORT"]))
torch.manual_seed(0)
net = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(4)])
ps = list(net.parameters())
# small buckets so that one backward fills several; dp 2 over a world of one: the average is
# the local gradient halved
sync = GradAllReduce(ps, dist.group.WORLD, 2, chunks=[ps], bucket_bytes=4 * 32 * 33,
                     first_bucket_bytes=4 * 32 * 33)
xs = torch.randn(2, 8, 32)
launched = []
for i, x in enumerate(xs):
    if i == 1:
        sync.arm(0)
    net(x).pow(2).sum().backward()
    launched.append(sum(sync._launched.values()))
ref = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(4)])
ref.load_state_dict(net.state_dict())
for x in xs:
    ref(x).pow(2).sum().backward()
sync()
assert launched[0] == 0, launched                  # not before the last micro-batch
assert launched[1] == len(sync.chunks[0]) == 4, (launched, len(sync.chunks[0]))
for p, q in zip(ps, ref.parameters()):
    torch.testing.assert_close(p.grad, q.grad / 2, rtol=0, atol=0)
print("ok")
"""


def test_zero01_gradient_allreduce_is_launched_during_the_last_backward():
    """Every bucket's all-reduce is launched from the gradient hooks of the last micro-batch's
    backward (none during earlier ones), and the result is the accumulated gradient averaged
    (checked against an unsynchronised copy of the same model)."""
    import os
    import subprocess
    import sys
    from runtime.train import _free_port
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "PORT": str(_free_port()),
           "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", _OVERLAP], cwd=root, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


# ---- full recompute, tp 2 x pp 2: the last stage's logits ---------------------------------

@pytest.mark.slow
def test_full_recompute_last_stage_holds_what_the_plan_prices():
    """A Llama-style model (4 layers, hidden 512, vocabulary 16000) on 4 CPU processes at
    tp 2, pp 2, 1F1B, full recompute: the last stage's measured activations are the plan's
    within 5%. They were 0.53x the plan (issue 22: "saves 1.1 MiB against 2.0 MiB planned"):
    the plan was right, the measurement missed the logits torch.distributed.pipelining keeps
    in the stage's fwd_cache from a micro-batch's forward to its backward (runtime/memory.py
    now counts the kept stage outputs; the vocabulary-parallel loss saves its softmax beside
    them, 4 + 4 bytes per logit on CPU, planner.engines.runtime pipeline_keeps_logits)."""
    from tests.test_runtime_searched import run_best
    model = Model("llama-512", num_layers=4, hidden=512, ffn_hidden=1280, num_heads=8,
                  num_kv_heads=2, vocab_size=16000, max_seq_len=128)
    cluster = Cluster("cpux4", get_gpu("cpu"), 4, 4)
    _, best, measured = run_best(model, cluster, dict(tp=2, pp=2, dp=1, zero=0, sp=True,
                                                      recompute="full", schedule="1f1b"),
                                 128, 8, "pp-rec-")
    last = [m["activations"] for m in measured if m["pp_rank"] == 1]
    planned = best.estimate.stage_memory_gib[1]["activations"]
    assert len(last) == 2 and all(abs(a / planned - 1) <= 0.05 for a in last), (last, planned)
