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
