"""Data parallelism: the collectives over the data-parallel group and the FSDP states a
pipeline keeps unsharded, per pipeline rank (the StageCoeffs fields of planner.cost.stage).

ZeRO stages as Rajbhandari et al. 2020 (Sec. 5) run them: 0 all-reduces the gradients once per
step, 1 reduce-scatters them and all-gathers the updated weights, 2 reduce-scatters every
micro-batch, 3 all-gathers the weights for forward and again for backward.
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.cost import comm
from planner.engines.spec import Engine


def dp_collectives(zero: int, engine: Engine, dp: int, dp_link, g_layer: float, g_fixed: float,
                   w_layer: float, w_fixed: float, replicas: int = 1,
                   replica_link=None, zeropp: "ZeroPP | None" = None) -> dict:
    """Seconds of the data-parallel collectives over `dp` ranks for gradients of g_* bytes and
    weights of w_* bytes, per layer and fixed, by where they run (StageCoeffs fields).

    Hybrid sharding (HSDP: FSDP2 over a 2-D replicate x shard mesh, DeepSpeed's MiCS,
    Megatron's distributed-optimizer instances): `dp` is then the shard group, the states
    sharded over it, and `replicas` copies of it; the gradients are reduce-scattered inside the
    shard group and the 1/dp shard all-reduced across the replicas over `replica_link`
    (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py foreach_reduce: reduce-scatter,
    then all_reduce on the replicate group), the parameters all-gathered inside the shard
    group only (Zhang et al. 2022, MiCS, Sec. 3)."""
    z = dict(zf_layer=0.0, zf_fixed=0.0, zb_layer=0.0, zb_fixed=0.0, grad_layer=0.0,
             grad_fixed=0.0, gather_layer=0.0, gather_fixed=0.0)
    if dp > 1 or replicas > 1:
        def rs(x):
            shard = comm.reduce_scatter(x, dp, dp_link) if dp > 1 else 0.0
            return shard + (comm.all_reduce(x / dp, replicas, replica_link)
                            if replicas > 1 else 0.0)
        ar = lambda x: comm.all_reduce(x, dp, dp_link)        # noqa: E731
        ag = lambda x: comm.all_gather(x, dp, dp_link) if dp > 1 else 0.0   # noqa: E731
        if zero == 0:
            z.update(grad_layer=ar(g_layer), grad_fixed=ar(g_fixed))
        elif zero == 1:
            z.update(grad_layer=rs(g_layer), grad_fixed=rs(g_fixed),
                     gather_layer=ag(w_layer), gather_fixed=ag(w_fixed))
        elif zero == 2:
            # gradients reduce-scattered every micro-batch (sharded gradients cannot
            # accumulate unsharded); parameters gathered once after the step, or (FSDP's
            # SHARD_GRAD_OP) again in every micro-batch's forward
            z.update(zb_layer=rs(g_layer), zb_fixed=rs(g_fixed))
            if engine.zero2_gathers_every_microbatch:
                z.update(zf_layer=ag(w_layer), zf_fixed=ag(w_fixed))
            else:
                z.update(gather_layer=ag(w_layer), gather_fixed=ag(w_fixed))
        elif zeropp is not None:
            # ZeRO++ (Wang et al. 2023, Sec. 3): the forward all-gather in int8 (qwZ), the
            # backward one inside the node from the secondary partition (hpZ), the gradients
            # as int4 (qgZ)
            q = zeropp
            hp = lambda x: comm.all_gather(x, q.hpz, q.hpz_link)   # noqa: E731
            z.update(zf_layer=ag(w_layer * q.weight_ratio), zf_fixed=ag(w_fixed * q.weight_ratio),
                     zb_layer=hp(w_layer) + rs(g_layer * q.grad_ratio),
                     zb_fixed=hp(w_fixed) + rs(g_fixed * q.grad_ratio))
        else:
            # ZeRO-3: all-gather for forward and again for backward, reduce-scatter grads,
            # every micro-batch (Rajbhandari et al. 2020, Sec. 5.3)
            z.update(zf_layer=ag(w_layer), zf_fixed=ag(w_fixed),
                     zb_layer=ag(w_layer) + rs(g_layer), zb_fixed=ag(w_fixed) + rs(g_fixed))
    return z


def weight_gather_bytes(lp, zero: int, elem: float, params: float, linear: float) -> float:
    """Bytes a data-parallel all-gather of `params` weights moves (`linear` of them the block
    linears' a low-precision recipe quantises): `elem` each (the compute dtype), but the
    linears' quantised where the recipe gathers them so: FSDP's float8 all-gather under ZeRO-2/3
    (Recipe.fsdp_lowp_all_gather), FP8 primary weights' 1-byte data wherever parameters are
    gathered (Recipe.lowp_param_sync; ZeRO-1 gathers the updated parameters too, Megatron's
    distributed optimizer and NeMo's distributed Adam alike)."""
    out = elem * params
    if lp is not None and ((lp.recipe.lowp_param_sync and zero >= 1)
                           or (lp.recipe.fsdp_lowp_all_gather and zero >= 2)):
        out -= (elem - lp.element_bytes) * linear
    return out


# ZeRO++ (Wang et al. 2023, "ZeRO++: Extremely Efficient Collective Communication for Giant
# Model Training", arXiv 2306.10209): qwZ gathers weights as int8 (1 byte an element, "half
# the communication volume" of fp16: Sec. 3.1; the per-block scales, one fp32 per 2048
# elements in DeepSpeed's quantizer, left out), qgZ reduces gradients as int4 (0.5 bytes an
# element, "a quarter" of fp16's volume: Sec. 3.3), hpZ keeps a secondary bf16 partition of
# the weights over the GPUs of one node for the backward all-gather (Sec. 3.2).
QWZ_BYTES = 1.0
QGZ_BYTES = 0.5
# HBM bytes of the (de)quantization kernels (memory-bound: the paper's fused kernels, Sec. 4;
# ZeroPP.kernel_times): qwZ quantizes the rank's shard (read the weight, write int8: 2 + 1 per
# shard element in bf16) and dequantizes the gathered weight (read int8, write the weight:
# 1 + 2 per element); qgZ quantizes the gradient (read it, write int4: 4 + 0.5 in fp32) and
# dequantizes and reduces what it receives (read int4, write the gradient: 0.5 + 4), per
# element of the layer, every micro-batch: the element sizes are the plan's (bf16 or fp32
# gradients alike). The planner's derivation from those kernels' reads and writes, not measured.


def hpz_size(shard: int, gpus_per_node: int, tp: int) -> int:
    """hpZ's group (DeepSpeed zero_hpz_partition_size) as the planner prices and exports it:
    the data-parallel ranks of one node, of the `shard` ranks ZeRO shards over."""
    return min(shard, max(1, gpus_per_node // tp))


@dataclass(frozen=True)
class ZeroPP:
    """ZeRO++ of one candidate: the hpZ group (`hpz` data-parallel ranks of a node, over
    `hpz_link`) and the quantized bytes as a fraction of the unquantized ones."""
    hpz: int
    hpz_link: object
    weight_ratio: float
    grad_ratio: float

    def kernel_times(self, params: float, shard: int, hbm_gbps: float) -> tuple:
        """(forward, backward) seconds of the (de)quantization kernels for `params`
        parameters (this rank's tp share of a layer) gathered over `shard` ranks: the bytes
        each element's quantizing and dequantizing kernels read and write, the unquantized
        sizes being QWZ_BYTES / weight_ratio and QGZ_BYTES / grad_ratio."""
        bw = hbm_gbps * 1e9
        weight, grad = QWZ_BYTES / self.weight_ratio, QGZ_BYTES / self.grad_ratio
        return ((weight + QWZ_BYTES) * params * (1 + 1 / shard) / bw,
                2 * (grad + QGZ_BYTES) * params / bw)


def pipelined_fsdp_unsharded(engine: Engine, c, params: float, states: dict,
                             shards: int) -> tuple:
    """(weight, gradient) bytes beyond the ZeRO accounting of `params` parameters where the
    engine's pipeline stage keeps FSDP unsharded through the step (planner.engines.spec
    pp_keeps_unsharded_grads): an accumulator of every unsharded gradient in the gradient
    dtype in place of the sharded gradients (those appear only at the step's one reduce,
    after the optimizer's zero_grad freed the last ones), and under ZeRO-3 the unsharded
    compute copy of every parameter, as ZeRO-2 keeps it. `shards`: the group FSDP shards
    them over (dp x cp; expert-dp for routed experts)."""
    if not (engine.pp_keeps_unsharded_grads and c.pp > 1 and c.zero >= 2 and shards > 1):
        return 0.0, 0.0
    w = states["compute_copy_bytes"] * params if c.zero >= 3 else 0.0
    return w, states["grad_bytes"] * params * (1 - 1 / shards)


def zero3_unsharded_bytes(fsdp2: bool, wrap: str | None, layer_params: float,
                          emb_params: float, head_params: float, w_layer: float, elem: float,
                          grad_bytes: float) -> float:
    """Bytes ZeRO-3 holds unsharded beyond the shards while the layers' activations are held
    (the step's peak), for one pipeline rank holding `emb_params` of embedding and
    `head_params` of head (0 where it holds none). `fsdp2`: the engine's ZeRO-3 is FSDP2's
    (Engine.zero3_is_fsdp2); `wrap`: how it groups the embedding and head, where that
    was worked out for this rank (effective_fsdp_outer_wrap); `w_layer`: one layer's gathered
    weights, `elem`: the compute dtype's bytes (the unsharded gradients' dtype under FSDP2's
    mixed precision), `grad_bytes`: the reduce dtype's (its reduce-scatter input).

    A layer's backward holds its gathered weights, the next layer's all-gathered ones
    (prefetch), its unsharded gradients and the reduce-scatter input of the one before
    (zero3_layer_bytes): the moments FSDPMemTracker shows (tests/test_fsdp_wrap_memory.py).
    What the embedding and the head add depends on `wrap`: "root" keeps both gathered from
    the backward's start to its end (the root's post-backward is the backward's final
    callback) and the head's gradient held through every layer's backward; "split" gathers
    the head, with its gradient and the reduce-scatter input of it, only while its own
    backward runs (the last layer prefetched beside it), and the embedding after every layer's
    activations are freed (zero3_end_bytes); None counts the embedding and head gathered with
    their gradients beside a layer's, as a sum of every moment's."""
    layer = zero3_layer_bytes(fsdp2, layer_params, w_layer, elem, grad_bytes)
    if wrap == "root":
        return layer + elem * (emb_params + head_params) + elem * head_params
    if wrap == "split":
        head = (2 * elem + grad_bytes) * head_params + w_layer if head_params else 0.0
        return max(layer, head)
    return layer + (elem + grad_bytes) * (emb_params + head_params)


def zero3_end_bytes(wrap: str | None, layer_params: float, emb_params: float,
                    head_params: float, elem: float, grad_bytes: float) -> float:
    """What ZeRO-3 holds unsharded at the backward's end, once the layers' activations are
    freed: the reduce-scatter of the last group to reduce (the root's embedding and head under
    "root", the embedding's own group under "split"), whose unsharded gradients and reduce-
    scatter input are both live while FSDP2 copies one into the other (torch/distributed/fsdp/
    _fully_shard/_fsdp_collectives.py foreach_reduce: foreach_reduce_scatter_copy_in), with
    the first layer's reduce-scatter input still in flight. 0 where `wrap` is None
    (zero3_unsharded_bytes then counts them at the peak)."""
    last = {"root": emb_params + head_params, "split": emb_params}.get(wrap, 0.0)
    return (elem + grad_bytes) * last + grad_bytes * layer_params if last else 0.0


def zero3_layer_bytes(fsdp2: bool, layer_params: float, w_layer: float, elem: float,
                      grad_bytes: float) -> float:
    """A layer's moment of zero3_unsharded_bytes: its gathered weights and the next layer's
    all-gathered ones (`w_layer` each), and its unsharded gradients: under FSDP2 (`fsdp2`) in
    the compute dtype beside the reduce-scatter's input in the reduce dtype, as FSDPMemTracker
    measures them, else in the gradient dtype alone."""
    return 2 * w_layer + ((elem + grad_bytes) if fsdp2 else grad_bytes) * layer_params


def effective_fsdp_outer_wrap(engine: Engine, model, pp: int) -> str | None:
    """The grouping of the embedding and head (Engine.fsdp_outer_wrap) that zero3_unsharded_
    bytes may use: where it was worked out, one pipeline stage (a pipelined stage keeps its
    groups gathered, pipelined_fsdp_unsharded) and untied embeddings (a tied weight's gradient
    gathers the head's and the embedding's, held from the first backward op to the last);
    None elsewhere."""
    if pp > 1 or model.tied_embeddings:
        return None
    return engine.fsdp_outer_wrap
