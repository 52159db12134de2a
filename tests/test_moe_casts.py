"""A low-precision MoE layer casts its experts' operands, not a dense MLP's: with every layer
MoE the model's dense FFN width runs nowhere, so it cannot change the step time."""
import dataclasses

import pytest

from planner.catalog import get_cluster
from planner.search import Fixed, search
from tests.test_moe_planner import tiny_moe


@pytest.mark.parametrize("precision", ["fp8", "bf16"])
def test_an_all_moe_model_does_not_pay_for_its_unused_dense_ffn(precision):
    """Before the fix, the MoE layers kept the dense MLP's FP8 casts (planner.cost.compute
    cast_times over ffn_hidden): an 8x wider dense FFN, used by no layer, made the FP8 step
    slower."""
    narrow = tiny_moe(layers=4, first_dense=0, experts=4)
    wide = dataclasses.replace(narrow, ffn_hidden=8 * narrow.ffn_hidden)
    cl = get_cluster("h100x8")
    fixed = Fixed(tp=1, pp=1, ep=4, mbs=1, recompute="none", zero=1, precision=precision)
    times = [search(m, cl, fixed, seq_len=4096, global_batch=32, engine="megatron",
                    top=1).best.estimate.step_time_s for m in (narrow, wide)]
    assert times[1] == pytest.approx(times[0], rel=1e-9)


def test_gpt_oss_expert_bias_is_dearer_with_the_flex_dispatchers_fp32_probabilities():
    """Megatron-Core applies gpt-oss's expert down-projection bias in an eager loop, weighted by
    the routing probabilities (experts.py _apply_bias); DeepEP and HybridEP take only fp32
    probabilities (token_dispatcher.py), which turn the loop's tensors fp32: the flex
    dispatcher's layer moves more bytes for the bias than the alltoall's, the difference being
    the two figures' over the expert rows."""
    from planner.cost.moe import moe_layer
    from planner.engines import get_engine
    from planner.engines.megatron import (EXPERT_BIAS_EAGER_BYTES,
                                          EXPERT_BIAS_EAGER_FP32_PROBS_BYTES)
    from planner.catalog.models import MODELS
    oss, cl = MODELS["gpt-oss-120b"], get_cluster("b200x8")
    k = get_engine("megatron").elementwise_kernels
    no_bias = dataclasses.replace(oss, expert_bias=False)

    def bias_s(disp):
        a, b = (moe_layer(m, cl, cl.gpu, 1, 4096, 1, 8, 1, allowed=(disp,), kernels=k)
                for m in (oss, no_bias))
        return a.same_bytes_back_fwd - b.same_bytes_back_fwd, a.tokens_per_expert * (oss.num_experts // 8)
    flex, rows = bias_s("flex")
    a2a, _ = bias_s("alltoall")
    hbm = cl.gpu.hbm_gbps * 1e9
    assert a2a == pytest.approx(EXPERT_BIAS_EAGER_BYTES * rows * oss.hidden / hbm)
    assert flex == pytest.approx(EXPERT_BIAS_EAGER_FP32_PROBS_BYTES * rows * oss.hidden / hbm)
