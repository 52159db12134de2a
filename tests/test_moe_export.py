"""MoE exports are exact: parse the Megatron flags and the torchtitan TOML back with the engines'
own types and check every expert setting against the plan; engines that do not run MoE as priced
refuse in one line."""
import argparse
import tomllib

import pytest

from planner.catalog import get_cluster
from planner.errors import BadInput
from planner.export import export
from planner.plan import Batch, Parallelism, Plan, make_stages
from planner.search import Fixed, search, to_plan
from planner.specs import Model
from tests.test_export import megatron_parser, megatron_tokens
from tests.test_moe_planner import MIXTRAL

# A DeepSeek-V3-shaped layer pattern on a small model: 2 dense layers first, then MoE layers,
# shared experts (sizes are the test's, not DeepSeek's).
MIXED = Model("mixed-moe", num_layers=8, hidden=1024, ffn_hidden=4096, num_heads=8,
              num_kv_heads=8, vocab_size=32000, max_seq_len=4096, num_experts=16,
              experts_per_token=8, moe_ffn_hidden=512, shared_expert_ffn_hidden=512,
              first_dense_layers=2)


def moe_freq_type(x):
    """megatron/training/arguments.py moe_freq_type: an int N (every N-th layer MoE) or a
    Python list expression of 1 (MoE) and 0 (dense) per layer."""
    try:
        return int(x)
    except ValueError:
        return eval(x)   # what Megatron does with the string


def moe_parser():
    """megatron_parser plus the MoE flags with Megatron's types, defaults and choices
    (megatron/training/arguments.py, _add_moe_args)."""
    ap = megatron_parser()
    a = ap.add_argument
    a("--num-experts", type=int, default=None)
    a("--moe-router-topk", type=int, default=2)
    a("--moe-ffn-hidden-size", type=int, default=None)
    a("--moe-shared-expert-intermediate-size", type=int, default=None)
    a("--moe-layer-freq", type=moe_freq_type, default=1)
    a("--expert-model-parallel-size", type=int, default=1)
    a("--expert-tensor-parallel-size", type=int, default=None)
    a("--moe-grouped-gemm", action="store_true")
    a("--moe-token-dispatcher-type", type=str, default="allgather",
      choices=["allgather", "alltoall", "flex"])
    # megatron-core >= 0.15 (TransformerConfig fields as flags): the flex dispatcher's backend,
    # and the EP all-to-all overlap across micro-batches (>= 0.14, megatron/core/transformer/moe/
    # README.md "Batch-level overlapping to hide EP-A2A communication")
    a("--moe-flex-dispatcher-backend", type=str, default="deepep", choices=["deepep", "hybridep"])
    a("--overlap-moe-expert-parallel-comm", action="store_true")
    a("--delay-wgrad-compute", action="store_true")
    return ap


def moe_layers_of(freq, num_layers):
    """Megatron's reading of --moe-layer-freq (TransformerConfig.moe_layer_freq)."""
    if isinstance(freq, int):
        return [i % freq == 0 for i in range(num_layers)]
    assert len(freq) == num_layers
    return [bool(x) for x in freq]


def hand_plan(model, cluster, *, tp, pp, dp, ep, etp, zero=1, mbs=1, nmb=8, seq=4096,
              engine="megatron"):
    return Plan(model=model, cluster=get_cluster(cluster),
                parallelism=Parallelism(tp=tp, pp=pp, dp=dp, ep=ep, etp=etp, zero_stage=zero,
                                        sequence_parallel=tp > 1),
                batch=Batch(seq_len=seq, global_batch_size=mbs * nmb * dp,
                            micro_batch_size=mbs, num_microbatches=nmb),
                stages=make_stages(model.num_layers, pp), engine=engine)


@pytest.fixture(scope="module")
def mixtral_plan():
    m = Model(**MIXTRAL)
    cl = get_cluster("h100x64")
    rep = search(m, cl, Fixed(pp=2, mbs=1), seq_len=4096, global_batch=256, engine="megatron")
    return to_plan(m, cl, rep.best, rep)


def check_megatron_moe(plan):
    text = export(plan, "megatron")
    a = moe_parser().parse_args(megatron_tokens(text))
    m, p = plan.model, plan.parallelism
    assert a.num_experts == m.num_experts
    assert a.moe_router_topk == m.experts_per_token
    assert a.moe_ffn_hidden_size == m.moe_ffn_hidden
    assert a.moe_shared_expert_intermediate_size == (m.shared_expert_ffn_hidden or None)
    assert moe_layers_of(a.moe_layer_freq, m.num_layers) == [m.moe_layer(i)
                                                             for i in range(m.num_layers)]
    assert a.expert_model_parallel_size == p.ep
    assert a.expert_tensor_parallel_size == p.etp
    assert a.moe_grouped_gemm
    assert a.tensor_model_parallel_size == p.tp and a.pipeline_model_parallel_size == p.pp
    # Megatron's MoE parallel folding: ep x etp divides tp x dp (x cp)
    assert (p.tp * p.dp) % (p.ep * p.etp) == 0
    # the dispatcher and EP overlap the plan was priced with, and Megatron's own checks of the
    # overlap (transformer_config.py: ep > 1, alltoall/flex, no full recompute, vpp with pp)
    if p.moe_dispatcher:     # a hand-made plan without one: the export takes the cheapest
        assert a.moe_token_dispatcher_type == p.moe_dispatcher
    assert a.overlap_moe_expert_parallel_comm == p.ep_comm_overlap
    assert a.delay_wgrad_compute == p.ep_comm_overlap
    # the overlap's all-to-all stream beside the compute needs more than one hardware queue
    assert ("CUDA_DEVICE_MAX_CONNECTIONS=32 " in text) == a.overlap_moe_expert_parallel_comm
    assert not (a.overlap_moe_expert_parallel_comm and "CUDA_DEVICE_MAX_CONNECTIONS=1 " in text)
    # Megatron's flex dispatcher asserts TP x EP > 1 (MoEFlexTokenDispatcher)
    assert a.moe_token_dispatcher_type != "flex" or (
        a.expert_tensor_parallel_size * a.expert_model_parallel_size > 1)
    if a.overlap_moe_expert_parallel_comm:
        assert a.expert_model_parallel_size > 1
        assert a.moe_token_dispatcher_type in ("alltoall", "flex")
        assert a.recompute_granularity != "full"
        assert a.pipeline_model_parallel_size == 1 or a.num_virtual_stages_per_pipeline_rank
    return a


def test_searched_mixtral_exports_its_experts(mixtral_plan):
    assert mixtral_plan.parallelism.ep > 1
    a = check_megatron_moe(mixtral_plan)
    # top-2 of 8 experts: all-to-all moves 2*(ep-1)/ep token copies per token, the all-gather
    # dispatcher (ep-1): all-to-all is the cheaper one
    assert a.moe_token_dispatcher_type == "alltoall"


def test_mixed_layers_export_layer_freq_and_shared_experts():
    plan = hand_plan(MIXED, "h100x8", tp=1, pp=2, dp=4, ep=2, etp=1)
    plan.validate()
    a = check_megatron_moe(plan)
    assert a.moe_layer_freq == [0, 0, 1, 1, 1, 1, 1, 1]
    # top-8 of 16 over ep=2: all-to-all moves 8*(1/2) = 4 token copies per token, the
    # all-gather 1: the all-gather dispatcher is priced and exported
    assert a.moe_token_dispatcher_type == "allgather"


def test_torchtitan_exports_expert_degrees():
    plan = hand_plan(MIXED, "h100x8", tp=2, pp=1, dp=4, ep=4, etp=2, zero=3,
                     engine="torchtitan")
    plan.validate()
    cfg = tomllib.loads(export(plan, "torchtitan"))
    assert cfg["parallelism"]["expert_parallel_degree"] == 4
    assert cfg["parallelism"]["expert_tensor_parallel_degree"] == 2
    assert cfg["parallelism"]["data_parallel_shard_degree"] == 4


def test_torchtitan_refuses_experts_on_ddp_replicas():
    plan = hand_plan(MIXED, "h100x8", tp=1, pp=1, dp=8, ep=4, etp=1, zero=0,
                     engine="torchtitan")
    with pytest.raises(BadInput, match="cannot lay out ep=4"):
        export(plan, "torchtitan")


def test_deepspeed_refuses_moe_in_one_line():
    plan = hand_plan(MIXED, "h100x8", tp=1, pp=1, dp=8, ep=1, etp=1, engine="deepspeed")
    with pytest.raises(BadInput) as e:
        export(plan, "deepspeed")
    assert "mixture-of-experts" in str(e.value)
