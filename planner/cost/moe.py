"""Mixture-of-experts layers: router, token dispatch and combine, routed experts, shared experts.

Per GPU and per micro-batch, for one MoE layer, as Megatron-Core runs it
(megatron/core/transformer/moe/: router.py, token_dispatcher.py, experts.py GroupedMLP) under
MoE parallel folding (megatron/core/parallel_state.py): the routed experts are split over `ep`
ranks and each expert's FFN over `etp` ranks; the expert grid etp x ep x expert-dp covers the
same ranks as the dense grid tp x cp x dp (planner.rules.ep_blockers), laid out etp
innermost, then ep, then expert-dp.

Tokens: with tensor parallelism Megatron requires sequence parallelism for MoE (megatron/
training/arguments.py: "sequence parallel must be used with MoE and tensor parallel"), so a GPU
enters the MoE layer with T = b*s/tp tokens (b*s without tp). With top-k routing each token
goes to k experts (Shazeer et al. 2017; GShard, Lepikhin et al. 2021; Switch, Fedus et al.
2022): the GPU sends T*k token copies of `hidden` elements.

Dispatchers (Megatron --moe-token-dispatcher-type):
- alltoall (MoEAlltoAllTokenDispatcher): an all-to-all over the ep group to dispatch and one to
  combine in forward, the same two transposed in backward; with etp > 1 the received tokens
  are all-gathered over the etp group and the expert outputs reduce-scattered back.
- allgather (MoEAllGatherTokenDispatcher): every rank all-gathers the hidden states of its
  ep x etp group (T*hidden each, not T*k), computes its local experts on the tokens routed to
  them, and reduce-scatters the outputs; cheaper than all-to-all when k > ep roughly.
- flex (MoEFlexTokenDispatcher with DeepEP or HybridEP, --moe-flex-dispatcher-backend;
  megatron/core/transformer/moe/fused_a2a.py): a token is sent once to each GPU holding one
  of its k experts (T * hidden * E[GPUs hit] where the all-to-all sends T * k * hidden);
  across domains it crosses the network once per other domain holding one of its experts
  and is copied to them over NVLink there (DeepEP's internode "normal" kernels), so the NIC
  carries T * hidden * E[remote domains] (`flex_all_to_all`, `groups_per_token`,
  `remote_domains_per_token`).
The planner prices them and uses the cheapest the engine has (`dispatcher`; alltoall on ties),
or the user's (--moe-dispatcher); the plan records it and the export names it.

EP communication overlap (Megatron-Core --overlap-moe-expert-parallel-comm, with
--delay-wgrad-compute; megatron/core/pipeline_parallel/combined_1f1b.py): the forward of one
micro-batch and the backward of another run as one step, each pass's dispatch and combine
beside the other pass's compute; what sticks out of it, plus the GPU's overlap slowdown, is
priced (`overlapped_ep_comm`). Megatron allows it with ep > 1, the alltoall or flex
dispatcher, no full recompute and, under pp > 1, the interleaved schedule
(planner.rules.ep_comm_overlap_blockers). The warm-up forwards and cool-down backwards,
which have no partner pass, are priced exposed (`unpaired_pass_share`).

Routing is taken balanced and dropless, as the benchmarks run it (Megatron-Bridge performance
configs set moe_router_force_load_balancing=true, e.g. scripts/moe_model_zoo/examples/qwen3/
launch_qwen235b.sh; dropless = no capacity factor, Megatron's default
moe_expert_capacity_factor=None). `imbalance` >= 1 scales the busiest rank's share of the
all-to-all and of the expert GEMMs (the slowest rank sets the pace of the collective); a
capacity factor (--moe-capacity-factor: Megatron --moe-expert-capacity-factor with
--moe-pad-expert-input-to-capacity) pads or cuts every expert's tokens to capacity_factor x
the balanced share (GShard Sec. 2.2, Switch Sec. 2.2), whatever the routing.

Host stall: dropless routing copies the token counts to the host and waits for them before
the all-to-all (token_dispatcher.py, _maybe_dtoh_and_synchronize at cuda_sync_point; the
grouped GEMM needs them too), once per MoE layer forward: the GPU drains and then waits on
the host for the kernels launched after, the grouped GEMMs among them, whose host work is per
local expert. Added to every MoE layer forward and recomputed forward (`dropless_host_stall`):
the engine's `moe_layer_overhead_s`, and of `moe_expert_overhead_s` x local experts what one
layer's forward work on the GPU does not hide (Megatron: both fitted, planner.engines.megatron);
with drop-and-pad the counts are known on the host and neither is.

Not modelled yet (benchmarks/results/fidelity_moe_*.md): the GPU side of a grouped GEMM at few
tokens per expert beyond the tile roll-off of planner.cost.compute.gemm_time, the shared
expert's overlap (--moe-shared-expert-overlap), CUDA graphs of the router and dispatch
preprocessing (cuda_graph_scope moe_router / moe_preprocess) that shrink the host stall, and
full-iteration CUDA graphs with static MoE shapes (HybridEP's moe_expert_rank_capacity_factor,
paged stash) that remove it, which the planner neither prices nor exports (the fidelity
benchmark prices its published rows that ran them without the stall: benchmarks/fidelity.py
engine_of),
HybridEP's own figures and the precision-aware
optimizer's bf16 moments (Megatron's fine-grained recompute modules: planner.cost.recompute).
An MTP module's MoE layer is this module's layer, added to the last pipeline rank
(planner.cost.stage, _with_mtp_modules).
"""
from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass

from planner.cost import comm
from planner.cost.compute import (BF16, ELEMENTWISE_BWD_FACTOR, FUSED_KERNELS,
                                  GEMM_BWD_FACTOR, activation_bytes_per_element, gemm_time,
                                  linear_cast_times, mlp_activation_bytes, mlp_io_elements)
from planner.cost.dataparallel import (dp_collectives, pipelined_fsdp_unsharded,
                                       weight_gather_bytes, zero3_layer_bytes)
from planner.cost.memory import (gathered_copies_whole, model_state_bytes,
                                 sp_gathered_input_bytes, weight_copy_bytes)
from planner.cost.recompute import Rerun, applying, moe_mlp_rerun, norm_rerun
from planner.layout import make_stages
from planner.specs import Cluster, Model
from planner.rules import flex_ok
from planner.vocab import DISPATCHERS

# the dispatchers that Megatron-Core's EP communication overlap runs with
# (megatron/core/transformer/transformer_config.py: overlap_moe_expert_parallel_comm "is
# supported with alltoall/flex token dispatcher")
OVERLAPPABLE_DISPATCHERS = ("alltoall", "flex")
# the dispatchers that pad every expert to capacity: alltoall (Megatron-Bridge's
# apply_moe_token_drop asserts it; megatron-core's flex dispatcher asserts
# moe_pad_expert_input_to_capacity is False)
PADDED_DISPATCHERS = ("alltoall",)
# the dispatchers after which Megatron-Core pads each expert's rows to a low-precision grouped
# GEMM's alignment (experts.py quantization_padding): the alltoall; the flex dispatcher is
# priced as HybridEP's, whose dispatch pads them (moe_utils.py skip_routed_expert_padding), as
# the published rows ran it. With DeepEP, what planner.export.megatron writes, Megatron pads
# too unless --moe-use-grouped-tensor: those copies (planner.engines.megatron
# LOWP_EXPERT_PADDING_BYTES, about 1% of an FP8 MoE step) are not priced; pricing them on the
# flex rows raised the stall fit's loss 0.0179 to 0.0191, the rows having run HybridEP.
LOWP_PADDED_DISPATCHERS = ("alltoall",)
# Balanced routing (moe_router_force_load_balancing, the benchmark rows): the busiest rank gets
# exactly its share. A real run's imbalance is the user's figure (see module docstring).
BALANCED = 1.0
# Router: a (T x hidden) @ (hidden x E) GEMM in fp32 (Megatron --moe-router-dtype fp32, the
# Megatron-Bridge default for the DeepSeek/Qwen3 recipes) and the softmax/top-k over T x E
# scores, memory-bound: read the logits, write probabilities and the top-k (4 + 4 + 4 bytes).
ROUTER_SCORE_BYTES = 12.0
FP32 = 4


def permutation_elements(dispatcher: str, T: float, k: int, rows: float, received: float,
                         hidden: int, local_experts: int) -> float:
    """bf16 elements one MoE layer's token permutations read and write in forward, on one GPU
    (Megatron-Core megatron/core/transformer/moe/token_dispatcher.py; each one kernel with
    --moe-permute-fusion); a permutation's backward is the inverse permutation, as many bytes
    again. `T` tokens in, `rows` expert copies computed here, `received` rows the flex
    dispatcher delivers (one per token and GPU).
    alltoall (MoEAlltoAllTokenDispatcher): permute the T tokens into their T*k expert-ordered
    copies before the all-to-all (dispatch_preprocess, permute) and sort the received copies
    by local expert (sort_chunks_by_idxs, with more than one local expert); after the experts
    the inverse two (sort_chunks_by_idxs, unpermute).
    flex (MoEFlexTokenDispatcher, DeepEP / HybridEP): each received row permuted into its
    local expert copies (permute) and back (unpermute).
    allgather: the gathered tokens' copies for the local experts selected, and scattered back
    (permute, unpermute of the rows).
    Megatron-Core's structure, priced so for every engine that dispatches this way (the other
    engines' MoE code is not read here)."""
    h = hidden
    if dispatcher == "alltoall":
        out = 2 * (T * h + T * k * h)
        if local_experts > 1:
            out += 2 * 2 * rows * h
        return out
    if dispatcher == "flex":
        return 2 * (received * h + rows * h)
    return 2 * 2 * rows * h


def tokens_in(b: int, s: int, tp: int) -> float:
    """Tokens a GPU holds entering the MoE layer (sequence parallel under tp)."""
    return b * s / tp


def expert_dp(tp: int, dp: int, ep: int, etp: int, cp: int = 1) -> int:
    """Expert data parallelism under MoE parallel folding: tp*cp*dp / (ep*etp)."""
    return max(1, tp * cp * dp // (ep * etp))


@dataclass(frozen=True)
class MoeLayer:
    """One MoE layer on one GPU for one micro-batch: seconds and bytes."""
    dispatcher: str
    router_fwd: float         # router GEMM and top-k
    experts_fwd: float        # routed experts' grouped GEMMs
    shared_fwd: float         # shared experts' GEMMs
    elem_fwd: float           # activation of the expert FFNs and token permutation
    comm_fwd: float           # dispatch + combine (and the etp gather / scatter)
    expert_params: float      # routed-expert parameters on this GPU
    dense_params: float       # attention, norms, router, shared experts on this GPU
    activation_bytes: float   # saved for backward beyond attention and norms (mode "none")
    tokens_per_expert: float
    # of elem_fwd, what moves the same bytes in backward (permutations, the experts' weighted
    # bias, the low-precision padding copies) where the rest moves twice its forward
    # (planner.cost.compute ELEMENTWISE_BWD_FACTOR)
    same_bytes_back_fwd: float = 0.0
    # a low-precision recipe's casts of the routed and shared experts' linears (forward,
    # backward; planner.cost.compute.linear_cast_times)
    cast_fwd: float = 0.0
    cast_bwd: float = 0.0
    # of dense_params and expert_params, the linears' weights a low-precision recipe
    # quantises (attention and shared experts; the routed experts), which its weight copies
    # follow (planner.precision Recipe.weight_copy_bytes)
    linear_params: float = 0.0
    expert_linear_params: float = 0.0


def groups_per_token(num_experts: int, k: int, groups: int) -> float:
    """Expected number of `groups` (ranks, or NVLink domains) that one token's k experts lie
    in: k distinct experts drawn uniformly from `num_experts` spread evenly over the groups
    (balanced routing, as the benchmarks force it), a given group holding none of them with
    probability C(E - E/g, k) / C(E, k)."""
    if groups <= 1:
        return 1.0
    per = num_experts // groups
    miss = math.comb(num_experts - per, k) / math.comb(num_experts, k)
    return groups * (1.0 - miss)


def remote_domains_per_token(num_experts: int, k: int, domains: int) -> float:
    """Expected number of NVLink domains other than its own that one token's k experts lie
    in (groups_per_token, less the token's own domain's share: by symmetry each domain is hit
    alike)."""
    if domains <= 1:
        return 0.0
    return groups_per_token(num_experts, k, domains) * (domains - 1) / domains


def flex_all_to_all(model: Model, cluster: Cluster, T: float, ep: int, etp: int,
                    imbalance: float) -> float:
    """One dispatch (or combine) of Megatron's flex dispatcher (--moe-token-dispatcher-type
    flex with DeepEP or HybridEP: megatron/core/transformer/moe/fused_a2a.py): a token is sent
    once to each GPU holding any of its experts (DeepEP's get_dispatch_layout:
    num_tokens_per_rank, is_token_in_rank; HybridEP dispatches from the same routing map,
    token_dispatcher.py _HybridEPManager) and permuted into its expert copies there, where
    NCCL's all-to-all sends every one of its k copies; across NVLink domains it is sent once to
    each other domain holding one of its experts, over the NICs (RDMA), and copied there over
    NVLink to the GPUs holding them (DeepEP, "normal" internode kernels: NVLink forwarding of
    RDMA-received tokens)."""
    h, k = model.hidden, model.experts_per_token
    # a token's copies on the wire: one per GPU its experts lie on (groups_per_token over the
    # ep ranks), where the all-to-all sends k
    x = imbalance * BF16 * T * h * groups_per_token(model.num_experts, k, ep)
    d = cluster.nvlink_domain
    span = ep * etp
    if span <= d and d % span == 0:
        return comm.all_to_all(x, ep, cluster, stride=etp)
    gpu = cluster.gpu
    members = max(1, min(ep, math.gcd(span, d) // etp))    # ep ranks sharing a domain
    remote = remote_domains_per_token(model.num_experts, k, ep // members)
    inter = imbalance * BF16 * T * h * remote / (gpu.internode_gbps_per_gpu * 1e9)
    intra = (members - 1) / members * x / (gpu.nvlink_p2p_gbps * 1e9)
    return max(inter, intra) + gpu.internode_latency_us * 1e-6


def _dispatch_comm(model: Model, cluster: Cluster, T: float, tp: int, ep: int, etp: int,
                   imbalance: float, dispatcher: str) -> float:
    """Forward seconds of dispatch + combine for one layer (backward moves the same)."""
    h, k = model.hidden, model.experts_per_token
    if dispatcher in ("alltoall", "flex"):
        # all-to-all over ep ranks etp apart: T*k token copies out, as many back
        a2a = (comm.all_to_all(imbalance * BF16 * T * k * h, ep, cluster, stride=etp)
               if dispatcher == "alltoall" else
               flex_all_to_all(model, cluster, T, ep, etp, imbalance))
        t = 2 * a2a
        if etp > 1:   # tokens gathered over the etp group for the sharded experts, and back
            link = comm.group_link(cluster, etp, 1)
            x = imbalance * BF16 * T * k * h * etp
            t += comm.all_gather(x, etp, link) + comm.reduce_scatter(x, etp, link)
        return t
    # allgather: hidden states of the ep*etp group gathered, outputs reduce-scattered
    n = ep * etp
    link = comm.group_link(cluster, n, 1)
    x = BF16 * T * h * n
    return comm.all_gather(x, n, link) + comm.reduce_scatter(x, n, link)


def dispatcher(model: Model, cluster: Cluster, b: int, s: int, tp: int, ep: int, etp: int,
               allowed=DISPATCHERS, imbalance: float = BALANCED) -> str:
    """The cheaper of the engine's dispatchers for this layout (alltoall on ties)."""
    T = tokens_in(b, s, tp)
    options = [d for d in DISPATCHERS if d in allowed] or ["alltoall"]
    return min(options, key=lambda d: (_dispatch_comm(model, cluster, T, tp, ep, etp,
                                                      imbalance, d), d != "alltoall"))


def allowed_dispatchers(c, engine) -> tuple:
    """The dispatchers a candidate may be priced with: the one the user fixed, else the
    engine's; under EP communication overlap only those it runs with."""
    allowed = (c.moe_dispatcher,) if c.moe_dispatcher else tuple(engine.moe_dispatchers)
    if not flex_ok(c.ep, c.etp):     # Megatron's flex dispatcher needs ep x etp > 1
        allowed = tuple(d for d in allowed if d != "flex")
    if c.moe_capacity_factor is not None:   # drop-and-pad runs on the alltoall dispatcher only
        allowed = tuple(d for d in allowed if d in PADDED_DISPATCHERS)
    if c.ep_comm_overlap:
        allowed = tuple(d for d in allowed if d in OVERLAPPABLE_DISPATCHERS)
    return allowed


def candidate_dispatcher(model: Model, cluster: Cluster, c, engine) -> str:
    """The dispatcher a candidate is priced with (what a plan records and an export names)."""
    return dispatcher(model, cluster, c.mbs, c.seq_len // c.cp, c.tp, c.ep, c.etp,
                      allowed_dispatchers(c, engine), c.moe_imbalance)


# the dispatchers a plan written before plans recorded theirs was priced among
LEGACY_DISPATCHERS = ("alltoall", "allgather")


def plan_dispatcher(plan) -> str:
    """The dispatcher a saved plan of an MoE model is priced and exported with: the one it
    records, else (a plan from before it did) the cheaper of LEGACY_DISPATCHERS, as it was
    priced then; "" for a dense model."""
    p, b = plan.parallelism, plan.batch
    if not plan.model.is_moe:
        return ""
    if p.moe_dispatcher:
        return p.moe_dispatcher
    allowed = PADDED_DISPATCHERS if p.moe_capacity_factor is not None else LEGACY_DISPATCHERS
    return dispatcher(plan.model, plan.cluster, b.micro_batch_size, b.seq_len // p.cp, p.tp,
                      p.ep, p.etp, allowed, p.moe_imbalance)


def overlapped_ep_comm(ep_fwd: float, fwd: float, bwd: float, slowdown: float) -> float:
    """Seconds of one layer's dispatch + combine (`ep_fwd` each pass) left exposed when
    Megatron-Core overlaps them across micro-batches (--overlap-moe-expert-parallel-comm,
    megatron/core/pipeline_parallel/combined_1f1b.py: the forward of one micro-batch and the
    backward of another run as one step, the forward's all-to-alls beside the backward's
    compute and the backward's beside the forward's): what sticks out of the other pass's
    compute, plus the slowdown of the compute it runs beside (the GPU's overlap_slowdown, as
    for every overlapped collective). Optimistic where one piece of the pass is short:
    Megatron pairs the pieces (TransformerLayerSchedulePlan.run: the combine's backward
    beside the forward attention, the dispatch beside the MLP's backward, ...), not whole
    passes."""
    out = 0.0
    for beside in (bwd, fwd):
        out += max(0.0, ep_fwd - beside) + slowdown * min(ep_fwd, beside)
    return out


def unpaired_pass_share(m: int, pp: int, vpp: int) -> float:
    """Share of a pipeline rank's forward and backward passes that the EP overlap finds no
    partner pass for: the warm-up forwards and the cool-down backwards. Megatron's combined
    1F1B schedules (megatron/core/pipeline_parallel/schedules.py) warm up with
    (pp - rank - 1) * 2 + (vpp - 1) * pp virtual micro-batches under interleaving, one more with
    the overlap; without pipelining the first forward and the last backward run alone. Rank 0,
    the longest warm-up, for every rank."""
    warm = 1 if pp == 1 else 2 * (pp - 1) + (vpp - 1) * pp + 1
    return min(1.0, warm / (m * vpp))


@functools.lru_cache(maxsize=4096)   # a search's recompute variants share their MoE layer
def moe_layer(model: Model, cluster: Cluster, gpu, b: int, s: int, tp: int, ep: int, etp: int,
              allowed=DISPATCHERS, imbalance: float = BALANCED,
              capacity_factor: float | None = None, elementwise_traffic: float = 1.0,
              lp=None, act_bytes: float = BF16, saves_expert_outputs: bool = True,
              kernels=FUSED_KERNELS) -> MoeLayer:
    """`gpu`: the GPU as the engine drives it (planner.cost.facts.engine_gpu);
    `kernels`: how the engine runs the experts' activation (planner.cost.compute
    ElementwiseKernels);
    `act_bytes`: the width of a saved activation element (the engine facts'
    compute_elem_bytes: fp32 where the engine computes in fp32, as our runtime on CPUs);
    `saves_expert_outputs`: the combine weighs the experts' outputs by the routing
    probabilities and keeps them for that product's gradient (planner.engines.spec)."""
    h, E, k, f = model.hidden, model.num_experts, model.experts_per_token, model.moe_ffn_hidden
    T = tokens_in(b, s, tp)
    # the slowest rank's share: imbalance, or a capacity factor's padding (dropless: none)
    # with a capacity factor every expert computes exactly its capacity (padded, or cut by
    # dropping), whatever the routing
    load = imbalance if capacity_factor is None else capacity_factor
    local_experts = E // ep
    # tokens each local expert computes: the ep*etp ranks' T*k copies spread over E experts
    per_expert = load * T * k * ep * etp / E
    gated = 3 if model.gated_mlp else 2
    # grouped GEMM (Megatron GroupedMLP, cutlass grouped GEMM; MegaBlocks, Gale et al. 2023):
    # one (tokens_per_expert x h) @ (h x f/etp) per local expert, each paying the tile
    # quantisation roll-off of planner.cost.compute.gemm_time on its token dimension
    up = gemm_time(gpu, per_expert, f / etp, h, local_experts, lp=lp)
    down = gemm_time(gpu, per_expert, h, f / etp, local_experts, lp=lp)
    experts = (gated - 1) * up + down
    sf = model.shared_expert_ffn_hidden
    shared = 0.0
    if sf:
        # the shared expert is a dense MLP over the layer's b*s tokens split over tp
        shared = ((gated - 1) * gemm_time(gpu, b * s, sf / tp, h, lp=lp)
                  + gemm_time(gpu, b * s, h, sf / tp, lp=lp))
    router = (gemm_time(gpu, T, E, h) * FP32 / BF16
              + ROUTER_SCORE_BYTES * T * E / (gpu.hbm_gbps * 1e9))
    rows = per_expert * local_experts               # token copies this GPU's experts compute
    disp = dispatcher(model, cluster, b, s, tp, ep, etp, allowed, imbalance)
    comm_fwd = _dispatch_comm(model, cluster, T, tp, ep, etp, load, disp)
    act_b = activation_bytes_per_element(model, kernels)
    hbm = gpu.hbm_gbps * 1e9
    received = load * T * groups_per_token(E, k, ep) * etp
    # the expert bias weighted by fp32 probabilities under the flex dispatcher (DeepEP and
    # HybridEP take only fp32 probabilities: megatron/core/transformer/moe/token_dispatcher.py
    # @d98e8a64 "HybridEP only supports float32 probs", "DeepEP only supports float32 probs"),
    # otherwise in the router's dtype: bf16 for gpt-oss, whose recipes set no
    # --moe-router-dtype (the router GEMM above is priced in fp32, DeepSeek's and Qwen3's)
    bias_b = (kernels.expert_bias_fp32_probs
              if disp == "flex" and kernels.expert_bias_fp32_probs is not None
              else kernels.expert_bias)
    same_both_ways = (BF16 * permutation_elements(disp, T, k, rows, received, h, local_experts)
                      + (bias_b * rows * h if model.expert_bias else 0.0)
                      + (kernels.lowp_expert_padding * rows * h
                         if lp is not None and disp in LOWP_PADDED_DISPATCHERS else 0.0))
    perm = elementwise_traffic * same_both_ways / hbm
    elem = elementwise_traffic * act_b * (rows * f / etp + b * s * sf / tp) / hbm + perm
    # the casts of the experts' linears (the routed ones' rows, the shared expert's tokens)
    r_in, r_out = mlp_io_elements(rows, h, f / etp, model.gated_mlp)
    s_in, s_out = mlp_io_elements(b * s, h, sf / tp, model.gated_mlp) if sf else (0.0, 0.0)
    expert_linear = local_experts * gated * h * f / etp
    cast_fwd, cast_bwd = linear_cast_times(
        gpu, lp, r_in + s_in, r_out + s_out,
        expert_linear + model.shared_expert_params() / tp)
    # each expert's FFN split over etp; its down-projection bias (gpt-oss) is not split
    down_bias = model.hidden if model.expert_bias else 0
    expert_params = local_experts * ((model.expert_params() - down_bias) / etp + down_bias)
    dense_params = (model.attn_matmul_params_on_rank(tp) + 2 * model.norm_params()
                    + model.router_params() + model.shared_expert_params() / tp
                    + ((h + 2 * model.kv_dim) / tp if model.attn_bias else 0))
    # saved for backward (bf16): the permuted expert inputs, the expert FFN intermediates
    # (gated: gate, up, activation output), the expert outputs before combine where the
    # combine weighs them, the router's fp32 probabilities; the shared expert like a dense MLP
    # (its input is the MLP input the dense terms already count)
    mlp_act = (3 if model.gated_mlp else 2) * act_bytes
    # where the probabilities are applied in the experts' activation instead, only the fused
    # weighted SwiGLU keeps nothing more (Megatron experts.py weighted_bias_swiglu_impl); its
    # unfused path multiplies after the activation and keeps the activation's output for
    # that product's gradient
    fused = model.gated_mlp and model.activation == "silu"
    outputs = (act_bytes * T * k * h if saves_expert_outputs else
               0.0 if fused else act_bytes * rows * f / etp)
    saved = (act_bytes * rows * h + mlp_act * rows * f / etp + outputs
             + FP32 * T * E + mlp_act * b * s * sf / tp)
    return MoeLayer(disp, router, experts, shared, elem, comm_fwd, expert_params,
                    dense_params, saved, per_expert, same_bytes_back_fwd=perm, cast_fwd=cast_fwd,
                    cast_bwd=cast_bwd,
                    linear_params=(model.attn_matmul_params_on_rank(tp)
                                   + model.shared_expert_params() / tp),
                    expert_linear_params=expert_linear)


def flops_per_token_layer(model: Model) -> float:
    """Matmul parameters one token runs through in an MoE layer (for model FLOPs, 6 x this
    per token): attention, router, shared experts and its top-k routed experts."""
    return (model.attn_matmul_params() + model.router_params() + model.shared_expert_params()
            + model.experts_per_token * model.expert_params())


def dense_mlp_fwd(model: Model, gpu, b: int, s: int, tp: int, lp=None,
                  elementwise_traffic: float = 1.0, kernels=FUSED_KERNELS) -> tuple:
    """(GEMM, element-wise) forward seconds of a dense layer's MLP: the terms of
    planner.cost.compute.layer_time and elementwise_bytes an MoE layer replaces."""
    tokens, h, f = b * s, model.hidden, model.ffn_hidden
    up = gemm_time(gpu, tokens, f / tp, h, lp=lp)
    down = gemm_time(gpu, tokens, h, f / tp, lp=lp)
    gemm = (2 if model.gated_mlp else 1) * up + down
    elem = (elementwise_traffic * mlp_activation_bytes(model, tokens, tp, kernels)
            / (gpu.hbm_gbps * 1e9))
    return gemm, elem


def dense_mlp_casts(model: Model, gpu, b: int, s: int, tp: int, lp=None) -> tuple:
    """(forward, backward) seconds of a low-precision recipe's casts of a dense layer's MLP
    linears: the part of planner.cost.compute.cast_times an MoE layer replaces with its
    experts' (MoeLayer cast_fwd, cast_bwd)."""
    m_in, m_out = mlp_io_elements(b * s, model.hidden, model.ffn_hidden / tp, model.gated_mlp)
    return linear_cast_times(gpu, lp, m_in, m_out, model.mlp_matmul_params() / tp)


def dense_mlp_saved(model: Model, b: int, s: int, tp: int, mode: str,
                    act_bytes: float = BF16) -> float:
    """Saved bytes of a dense layer's MLP intermediates under `mode` (planner.cost.memory:
    activation_terms' mlp term; op_saved_terms keeps w1's output): what an MoE layer replaces.
    `act_bytes` as in moe_layer (the facts scale the dense terms the same way)."""
    f = model.ffn_hidden
    if mode == "full":
        return 0.0
    if mode == "op":
        return b * s * f * act_bytes / tp
    return b * s * (3 * f if model.gated_mlp else 2 * f) * act_bytes / tp


# StageCoeffs fields that are per layer (what a layer kind changes)
LAYER_FIELDS = ("compute_layer", "compute_rec", "tp_layer", "tp_rec", "fwd_layer", "bwd_layer",
                "zf_layer", "zb_layer", "grad_layer", "gather_layer", "opt_layer", "ep_layer",
                "ep_rec", "mem_rec")


# what makes two ranks' dense layers alike for with_moe_layers (but for the activations)
_RANK_LAYER_KEY = operator.attrgetter(
    "grad_overlapped", "gather_overlapped", "overlap_slowdown",
    *(f for f in LAYER_FIELDS if f != "mem_rec"))


@dataclass(frozen=True)
class MoeCompute:
    """What one MoE layer's compute adds to its dense layer's on one GPU, per micro-batch:
    `fwd` and `bwd` seconds without the dropless host stall (dropless_host_stall), of which
    `cast_fwd` the experts' low-precision casts less the dense MLP's; `layer` the MoeLayer, its
    forward GEMM seconds (router, experts, shared expert: `gemm`) and the dense MLP's
    element-wise forward seconds it replaces (`dense_mlp_elem`)."""
    layer: MoeLayer
    fwd: float
    bwd: float
    cast_fwd: float
    gemm: float
    dense_mlp_elem: float


def moe_compute(model: Model, cluster: Cluster, c, engine, facts, lp) -> MoeCompute:
    """The MoE layer of candidate `c` and what its compute adds to the dense layer's (the
    experts', router's and shared expert's GEMMs, element-wise work and casts in place of the
    dense MLP's). `facts`: planner.cost.facts of the engine on the GPU; `lp`: the plan's low
    precision."""
    # a context-parallel rank holds s/cp tokens of each sequence (planner.cost.stage)
    b, s, t = c.mbs, c.seq_len // c.cp, c.tp
    gpu = facts.gpu
    ml = moe_layer(model, cluster, gpu, b, s, t, c.ep, c.etp, allowed_dispatchers(c, engine),
                   imbalance=c.moe_imbalance, capacity_factor=c.moe_capacity_factor,
                   elementwise_traffic=engine.elementwise_traffic, lp=lp,
                   kernels=engine.elementwise_kernels,
                   act_bytes=facts.compute_elem_bytes,
                   saves_expert_outputs=engine.moe_saves_expert_outputs)
    dm_gemm, dm_elem = dense_mlp_fwd(model, gpu, b, s, t, lp, engine.elementwise_traffic,
                                     engine.elementwise_kernels)
    gemm = ml.router_fwd + ml.experts_fwd + ml.shared_fwd
    # the casts: the experts' linears' in place of the dense MLP's
    dm_cast_fwd, dm_cast_bwd = dense_mlp_casts(model, gpu, b, s, t, lp)
    d_cast_fwd, d_cast_bwd = ml.cast_fwd - dm_cast_fwd, ml.cast_bwd - dm_cast_bwd
    fwd = gemm + ml.elem_fwd - dm_gemm - dm_elem + d_cast_fwd
    # backward: GEMMs twice their forward, element-wise work twice, permutations (and what
    # else moves the same bytes back, MoeLayer.same_bytes_back_fwd) once
    bwd = (GEMM_BWD_FACTOR * (gemm - dm_gemm)
           + ELEMENTWISE_BWD_FACTOR * (ml.elem_fwd - ml.same_bytes_back_fwd - dm_elem)
           + ml.same_bytes_back_fwd
           + d_cast_bwd)
    return MoeCompute(ml, fwd, bwd, d_cast_fwd, gemm, dm_elem)


def drops_mlp_tp(model: Model) -> bool:
    """Whether an MoE layer drops its dense layer's MLP tensor-parallel pair (half the layer's
    TP communication): each tp rank dispatches its own sequence-parallel tokens over its ep
    group and the etp gather of the received rows is the dispatcher's (Megatron-Core
    MoEAlltoAllTokenDispatcher; runtime/expert.py likewise), unless a shared expert, a
    TP-split MLP, needs the pair."""
    return not model.shared_expert_ffn_hidden


def moe_layer_floor(model: Model, cluster: Cluster, c, engine, facts, lp,
                    dense_tp: float) -> float:
    """At least what one MoE layer adds to a dense layer's time (planner.cost.stage
    StageCoeffs t_layer): moe_compute's forward and backward, the dropless host stall at its
    least (the sync alone, its issuing of the grouped GEMMs taken as covered by any forward),
    the dispatch and combine each way (overlapped: the slowdown of the compute beside them),
    less the MLP's TP pair where it goes, half of `dense_tp`, at most the dense layer's TP
    seconds."""
    mc = moe_compute(model, cluster, c, engine, facts, lp)
    stall = dropless_host_stall(engine, c, model.num_experts // c.ep, math.inf)
    # overlapped, each pass's all-to-alls at least slow down the compute they run beside
    # (overlapped_ep_comm: what sticks out of it, or the slowdown, of at most all of them)
    ep = 2 * mc.layer.comm_fwd * (min(1.0, facts.gpu.overlap_slowdown) if c.ep_comm_overlap
                                  else 1.0)
    return mc.fwd + mc.bwd + stall + ep - (dense_tp / 2 if drops_mlp_tp(model) else 0.0)


def with_moe_layers(model: Model, cluster: Cluster, c, engine, facts, coeffs: list, lp,
                    states: dict, tp_pass: tuple, infl: list, reruns: tuple) -> list:
    """Stage coefficients of an MoE model from those of its dense layer (`coeffs`): every
    layer MoE gives MoE-layer coefficients; dense and MoE layers mixed give the dense ones
    with `moe` = what an MoE layer adds (planner.cost.stage.StageCoeffs). `reruns`: the
    dense layer's planner.cost.stage.selective_reruns."""
    # a context-parallel rank holds s/cp tokens of each sequence (planner.cost.stage)
    b, s, t = c.mbs, c.seq_len // c.cp, c.tp
    gpu = facts.gpu
    mc = moe_compute(model, cluster, c, engine, facts, lp)
    ml, dm_elem, gemm = mc.layer, mc.dense_mlp_elem, mc.gemm
    # tensor parallelism (`tp_pass`: the dense layer's forward and backward share): the
    # attention's all-gather / reduce-scatter pair stays; the MLP's goes (drops_mlp_tp)
    mlp_tp = (tp_pass[0] / 2, tp_pass[1] / 2) if drops_mlp_tp(model) else (0.0, 0.0)
    # dropless routing's host stall, in forward and in a recomputed forward (the engine's
    # moe_layer_overhead_s and moe_expert_overhead_s; planner.engines.spec); with drop-and-pad
    # the token counts are known on the host (capacity x ranks; megatron/core/transformer/moe/
    # token_dispatcher.py skips the device-to-host copy): none. `fwd_layer` is a per-layer
    # figure, the same on every pipeline rank
    moe_fwd, d_bwd, d_cast_fwd = mc.fwd, mc.bwd, mc.cast_fwd
    stall = dropless_host_stall(engine, c, model.num_experts // c.ep,
                                coeffs[0].fwd_layer - mlp_tp[0] + moe_fwd + ml.comm_fwd)
    d_fwd = moe_fwd + stall
    # a recomputed layer runs its forward again: "full" all of it, dispatch included;
    # "selective" the modules asked for (planner.cost.recompute), the MoE side's in place of
    # the dense MLP's
    rec_mode, attn_rerun, dense_mlp_rerun = reruns
    eb = facts.compute_elem_bytes
    moe_rerun = _moe_rerun(model, c, facts, ml, gemm + ml.elem_fwd + ml.cast_fwd + stall,
                           b, s, t)
    d_rec = {"full": d_fwd, "op": ml.elem_fwd - dm_elem + d_cast_fwd, "offload": 0.0}.get(
        c.recompute, moe_rerun.fwd_s - dense_mlp_rerun.fwd_s)
    ep_fwd = ml.comm_fwd
    ep_rec = ep_fwd if c.recompute == "full" or moe_rerun.dispatch else 0.0
    # model states: attention, norms, router and shared experts over dp x cp; the routed experts
    # over expert-dp (Megatron's distributed optimizer shards each over its own group)
    edp = expert_dp(t, c.dp, c.ep, c.etp, c.cp)
    dp = c.dp_cp      # dense weights replicated over cp: reduced and sharded over dp x cp
    nonexpert, expert = ml.dense_params, ml.expert_params
    states_ne = model_state_bytes(nonexpert, dp, c.zero, **states)
    states_ex = model_state_bytes(expert, edp, c.zero, **states)
    wl, gl, ol = (a + x for a, x in zip(states_ne, states_ex))
    for params, shards in ((nonexpert, dp), (expert, edp)):
        wl, gl = (a + x for a, x in zip((wl, gl), pipelined_fsdp_unsharded(
            engine, c, params, states, shards)))
    # the quantised weight copies, as a dense layer's (planner.cost.stage), of the attention's
    # and shared experts' linears and of the routed experts': Megatron-Core's TEGroupedLinear
    # caches its FP8 weights across micro-batches as TELinear does (megatron/core/extensions/
    # transformer_engine.py @d98e8a64: is_first_microbatch passed unless
    # disable_parameter_transpose_cache; Transformer Engine's module/grouped_linear.py
    # @d0067d0da: cache_weight = is_first_microbatch is not None)
    wl += weight_copy_bytes(lp, c.zero, (ml.linear_params, dp), (ml.expert_linear_params, edp),
                            whole=gathered_copies_whole(engine, lp, c.recompute))
    gb = states["grad_bytes"]
    dp_link = comm.group_link(cluster, dp, t)
    edp_link = comm.group_link(cluster, edp, c.ep * c.etp)
    z_ne = dp_collectives(c.zero, engine, dp, dp_link, gb * nonexpert, 0.0,
                          weight_gather_bytes(lp, c.zero, BF16, nonexpert, ml.linear_params),
                          0.0)
    z_ex = dp_collectives(c.zero, engine, edp, edp_link, gb * expert, 0.0,
                          weight_gather_bytes(lp, c.zero, BF16, expert, ml.expert_linear_params),
                          0.0)
    local = (lambda x, d: x / d) if c.zero >= 1 else (lambda x, d: x)   # noqa: E731
    opt_layer = facts.optimizer_time(local(nonexpert, dp)) + facts.optimizer_time(
        local(expert, edp))
    # activations: the dense MLP's saved intermediates replaced by the MoE layer's
    act_none_d = facts.activation_bytes(model, b, s, t, c.sp, "none", c.flash, lp=lp)
    act_rec_d = (facts.activation_bytes(model, b, s, t, c.sp, rec_mode, c.flash, lp=lp)
                 - attn_rerun.freed_bytes - moe_rerun.freed_bytes)
    act_none = act_none_d - dense_mlp_saved(model, b, s, t, "none", eb) + ml.activation_bytes
    if c.sp and t > 1 and engine.sp_keeps_gathered_inputs and not model.shared_expert_ffn_hidden:
        # no column-parallel MLP-in linear gathers the tokens: the router and the dispatch
        # keep the rank's own sequence shard
        kept_whole = eb / BF16 * b * s * sp_gathered_input_bytes(model, qkv=False) * (1 - 1 / t)
        act_none -= kept_whole
        act_rec_d -= kept_whole if rec_mode in ("none", "selective") else 0.0
    act_rec = act_rec_d if c.recompute in ("full", "none") else (
        act_rec_d - dense_mlp_saved(model, b, s, t, c.recompute, eb) + ml.activation_bytes)
    if c.recompute == "none":
        act_rec = act_none
    elif c.recompute == "offload":
        # the attention's and norms' saved tensors go to the host (planner.cost.offload); the
        # MoE side's stay on the GPU: Transformer Engine's first offload handler, which
        # Megatron-Core drives for TE < 2.10 or with NVTE_CPU_OFFLOAD_V1=1 (Megatron-Bridge's
        # DeepSeek recipes set it), moves only tensors marked for it (cpu_offload_v1.py), and
        # neither the grouped linears' inputs (module/grouped_linear.py) nor Megatron's router
        # and permutations mark theirs
        act_rec = ml.activation_bytes
    dense_params = (model.attn_matmul_params_on_rank(t)
                    + (model.mlp_matmul_params() + model.bias_params()) / t
                    + 2 * model.norm_params())
    all_moe = layer_kinds(model) is None
    # working memory: the larger layer's full activations are live while it computes; under
    # ZeRO-3 a layer's unsharded weights and gradients (zero3_layer_bytes), the larger kind's
    other = max(0.0, act_none - act_none_d)
    if c.recompute == "offload":     # and the offloaded layer whose copy is in flight
        other *= 2                   # (planner.cost.stage, the dense layer's likewise)
    if c.zero == 3 and dp > 1:
        delta = nonexpert + expert - dense_params
        other += max(0.0, zero3_layer_bytes(engine.zero3_is_fsdp2, delta,
                                            eb * delta, eb, gb))
    ep_f = ep_b = ep_fwd     # what dispatch and combine add to each pass
    alone = unpaired_pass_share(c.m, c.pp, c.vpp) if c.ep_comm_overlap else None

    def layer_changes(k) -> tuple:
        """(the MoE layer's fields, what they add to k's: a StageCoeffs or None) of a rank
        whose dense layer is k's, but for the activations (in_flight_changes)."""
        fwd_pass, bwd_pass = k.fwd_layer + d_fwd - mlp_tp[0], k.bwd_layer + d_bwd - mlp_tp[1]
        f_ep, b_ep = ep_f, ep_b
        if c.ep_comm_overlap:    # a pass's all-to-alls beside the other micro-batch's pass
            # (the host stall stays in the forward pass: while the host waits for one
            # micro-batch's token counts the GPU runs the other's queued work, so how the two
            # interleave is not modelled either way)
            f_ep = b_ep = (alone * 2 * ep_fwd + (1 - alone) * overlapped_ep_comm(
                ep_fwd, fwd_pass, bwd_pass, gpu.overlap_slowdown)) / 2
        changes = dict(
            compute_layer=k.compute_layer + d_fwd + d_bwd,
            compute_rec=k.compute_rec + d_rec,
            tp_layer=k.tp_layer - mlp_tp[0] - mlp_tp[1],
            tp_rec=(k.tp_rec - (mlp_tp[0] if c.recompute == "full" else 0.0)
                    - (tp_pass[0] / 2 if dense_mlp_rerun.mlp_tp else 0.0)
                    + (tp_pass[0] / 2 - mlp_tp[0] if moe_rerun.dispatch else 0.0)),
            ep_layer=f_ep + b_ep, ep_rec=ep_rec,
            fwd_layer=fwd_pass + f_ep,
            bwd_layer=bwd_pass + b_ep,
            opt_layer=opt_layer,
            **{f: z_ne[f] + z_ex[f] for f in ("zf_layer", "zb_layer", "grad_layer",
                                             "gather_layer")})
        if all_moe:
            return changes, None
        # a StageCoeffs (planner.cost.stage, the class of `k`) of what an MoE layer adds
        delta = type(k)(rank=k.rank, compute_fixed=0.0, compute_layer=0.0, compute_rec=0.0,
                        tp_layer=0.0, tp_rec=0.0, pp_fixed=0.0, fwd_layer=0.0,
                        fwd_fixed=0.0, bwd_layer=0.0, bwd_fixed=0.0,
                        grad_overlapped=k.grad_overlapped,
                        gather_overlapped=k.gather_overlapped,
                        overlap_slowdown=k.overlap_slowdown, churn_reserve=k.churn_reserve)
        for f in LAYER_FIELDS:   # what an MoE layer changes (the fields it leaves: 0)
            if f in changes:
                setattr(delta, f, changes[f] - getattr(k, f))
        return changes, delta

    def in_flight_changes(k, fl, changes: dict, delta) -> tuple:
        """The activations' part of layer_changes: a rank with fl micro-batches in flight."""
        changes = dict(changes, mem_layer={"params": wl, "grads": gl, "optimizer": ol,
                                           "activations": act_none * fl},
                       mem_rec=(act_none - act_rec) * fl)
        if delta is None:
            return changes, None
        delta = replace_coeffs(delta, rank=k.rank, mem_rec=changes["mem_rec"] - k.mem_rec)
        moe_mem = changes["mem_layer"]
        delta.mem_layer = {key: moe_mem.get(key, 0.0) - k.mem_layer.get(key, 0.0)
                           for key in set(moe_mem) | set(k.mem_layer)}
        return changes, delta

    # ranks alike in their dense layer (the same per-layer fields) get the same MoE layer
    # but for its activations (the micro-batches each holds in flight): built once
    built = {}
    out = []
    for k, fl in zip(coeffs, infl):
        mem_fixed = dict(k.mem_fixed)
        mem_fixed["other"] = mem_fixed.get("other", 0.0) + other
        key = _RANK_LAYER_KEY(k)
        if key not in built:
            built[key] = layer_changes(k)
        changes, delta = in_flight_changes(k, fl, *built[key])
        if delta is None:
            out.append(replace_coeffs(k, mem_fixed=mem_fixed, **changes))
        else:
            out.append(replace_coeffs(k, mem_fixed=mem_fixed, moe=delta))
    return out


def syncs_token_counts(capacity_factor: float | None) -> bool:
    """Whether an MoE layer's forward waits on the host for its token counts: dropless routing
    does (the counts size the all-to-all and the grouped GEMMs, copied device to host and
    synchronised on: megatron/core/transformer/moe/token_dispatcher.py
    _maybe_dtoh_and_synchronize); drop-and-pad does not (a capacity factor with the experts'
    input padded to it, as planner.export.megatron exports it: the counts are capacity x ranks,
    made on the host, and the dispatcher skips the copy)."""
    return capacity_factor is None


def dropless_host_stall(engine, c, local_experts: int, layer_fwd_s: float) -> float:
    """Seconds one MoE layer forward waits on the host under dropless routing: the sync on the
    token counts (engine.moe_layer_overhead_s), and what of the host's issuing of the grouped
    GEMMs (engine.moe_expert_overhead_s per local expert) one layer's forward work on the GPU
    (`layer_fwd_s`: compute, TP and EP communication) does not cover: between two syncs the
    GPU runs only what the host has issued, so it waits when the host falls behind. The window
    is the whole layer forward (the MoE side of one layer and the attention of the next run
    between two syncs); the MoE side alone, dispatch to combine, fitted the published rows
    worse (benchmarks/fidelity.py MoE notes). 0 with a capacity factor (no sync)."""
    if not syncs_token_counts(c.moe_capacity_factor):
        return 0.0
    issue = engine.moe_expert_overhead_s * local_experts
    return engine.moe_layer_overhead_s + max(0.0, issue - layer_fwd_s)


def _moe_rerun(model: Model, c, facts, ml: MoeLayer, layer_fwd_s: float, b: int, s: int,
               t: int):
    """The MoE side's recomputed modules of one MoE layer (planner.cost.recompute):
    `layer_fwd_s` the MoE layer's forward compute (router, experts, shared expert, element-wise
    work, the host stall)."""
    if c.recompute != "selective":
        return Rerun()
    mods = applying(model, c.recompute_modules)
    eb, gpu = facts.compute_elem_bytes, facts.gpu
    hbm = gpu.hbm_gbps * 1e9
    traffic = facts.engine.elementwise_traffic
    # the experts' activation: its output (the second grouped GEMM's input) of every token
    # copy this GPU's experts compute; its forward reads the gate and up outputs (plain: the
    # input) and writes the output
    rows = ml.tokens_per_expert * (model.num_experts // c.ep)
    f = model.moe_ffn_hidden / c.etp
    act_b = activation_bytes_per_element(model, facts.engine.elementwise_kernels)
    sf = model.shared_expert_ffn_hidden / t
    shared_elems = (3 if model.gated_mlp else 2) * b * s * sf
    return moe_mlp_rerun(
        model, mods, norm_rerun(model, b * s, t, c.sp, hbm, eb),
        layer_saved_bytes=ml.activation_bytes, layer_fwd_s=layer_fwd_s,
        act_out_bytes=eb * rows * f, act_fwd_s=traffic * act_b * rows * f / hbm,
        shared_saved_bytes=eb * shared_elems,
        shared_fwd_s=ml.shared_fwd + traffic * act_b * b * s * sf / hbm)


def replace_coeffs(k, **changes):
    """dataclasses.replace for StageCoeffs (no __post_init__), without its cost: a shallow
    copy with `changes` set."""
    out = object.__new__(type(k))
    out.__dict__.update(k.__dict__)
    out.__dict__.update(changes)
    return out


def moe_counts(model: Model, pp: int, vpp: int, layers: list, recompute: list) -> tuple:
    """(MoE layers, recomputed MoE layers) per pipeline rank for per-rank layer and recompute
    counts, laid out as planner.layout.make_stages lays them (contiguous stages in model order,
    a stage recomputing its first `recompute_layers`)."""
    P = layer_kinds(model) or list(range(model.num_layers + 1)) if model.is_moe else None
    q, rq = [0] * pp, [0] * pp
    if P is None:
        return q, rq
    for st in make_stages(model.num_layers, pp, vpp, layers, recompute):
        a, e = st.layers
        q[st.pp_rank] += P[e] - P[a]
        rq[st.pp_rank] += P[a + st.recompute_layers] - P[a]
    return q, rq


@functools.lru_cache(maxsize=64)
def layer_kinds(model: Model) -> list | None:
    """Prefix counts of MoE layers (P[i] = MoE layers among the first i) of a model mixing
    dense and MoE layers; None when every layer is alike."""
    if not model.is_moe:
        return None
    P = [0]
    for i in range(model.num_layers):
        P.append(P[-1] + int(model.moe_layer(i)))
    return None if P[-1] == model.num_layers else P
