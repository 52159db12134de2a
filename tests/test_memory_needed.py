"""What decides a fit (planner.cost.stage MemoryBudget): the memory a plan needs, its model
state as allocated and its activations and working buffers with the caching allocator's
reserve, not what the allocator reserves at the peak (torch.cuda.max_memory_reserved), which
counts cached segments the allocator frees and retries with before it runs out of memory
(c10/cuda/CUDACachingAllocator.cpp)."""
import dataclasses

import pytest

from planner.catalog import get_cluster, get_model
from planner.engines import get_engine
from planner.search import Fixed, search

KNOBS = dict(tp=1, pp=1, cp=1, zero=1, mbs=1, recompute="none", tp_comm_overlap=False,
             offload_optimizer="none", offload_params="none")


def _best(cluster):
    return search(get_model("llama3-8b"), cluster, Fixed(**KNOBS), 4096, 64, top=1,
                  engine="megatron", margin_gib=0.0, rejected=False).best


def test_needed_takes_the_reserve_on_the_churned_bytes_only():
    """Worked from the stage's categories: weights, gradients and optimizer state as
    allocated, activations and buffers x (1 + the engine's reserve); the reserved figure is
    every byte with it."""
    r = _best(get_cluster("h100x8"))
    m = r.estimate.stage_memory_gib[0]
    x = 1 + get_engine("megatron").allocator_reserve
    state = m["params"] + m["grads"] + m["optimizer"]
    churn = m["activations"] + m["other"]
    assert state > 0 and churn > 0
    assert m["needed"] == pytest.approx(state + x * churn, rel=1e-9)
    assert m["reserved"] == pytest.approx(x * (state + churn), rel=1e-9)
    assert r.estimate.peak_needed_gib == pytest.approx(m["needed"])


def test_a_plan_fits_between_what_it_needs_and_what_the_allocator_reserves():
    """On a GPU with room for what the plan needs but not for allocated x 1.05 (the verdict
    before: it refused Megatron-Bridge's DeepSeek-V3 MXFP8 runs and NeMo's GPT-3 20B, which
    ran), the plan fits, and the search finds it."""
    base = get_cluster("h100x8")
    m = _best(base).estimate.stage_memory_gib[0]
    context = get_engine("megatron").context_gib
    gpu = dataclasses.replace(base.gpu, memory_gib=context + (m["needed"] + m["reserved"]) / 2)
    r = _best(dataclasses.replace(base, gpu=gpu))
    assert r is not None and r.estimate.fits
    assert r.estimate.peak_reserved_gib > r.estimate.capacity_gib >= r.estimate.peak_needed_gib
    # just below what it needs, it does not
    gpu = dataclasses.replace(base.gpu, memory_gib=context + m["needed"] - 0.05)
    assert _best(dataclasses.replace(base, gpu=gpu)) is None
