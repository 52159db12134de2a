"""Offload: optimizer states and parameters kept in host memory or on NVMe, priced per GPU.

What moves (per GPU, for its shard of the parameters: `local` parameters, after tensor
parallelism and, where ZeRO shards them, data parallelism):

- optimizer offload (ZeRO-Offload, Ren et al. 2021, "ZeRO-Offload: Democratizing
  Billion-Scale Model Training", Sec. 4; Megatron's HybridDeviceOptimizer; FSDP2's
  CPUOffloadPolicy): the fp32 master weights and Adam's moments (the engine's
  `optimizer_bytes`) leave the GPU, with an fp32 gradient copy on the host; each step the
  gradients go down the GPU's host link, the CPU runs Adam, the updated parameters come back
  (the engine's `offload_transfer_bytes`). Where the engine keeps its gradients on the host
  (DeepSpeed), they also leave GPU memory and go down in every micro-batch's backward.
- parameter offload (ZeRO-Infinity, Rajbhandari et al. 2021, "ZeRO-Infinity: Breaking the GPU
  Memory Wall for Extreme Scale Deep Learning", Sec. 5): under ZeRO-3 the bf16 parameter
  shard lives on the host (or NVMe) and comes up before each all-gather, in the forward and
  again in the backward of every micro-batch.
- activation offload (Megatron-Core --cpu-offloading-num-layers N, Transformer Engine's
  cpu_offload context: megatron/core/transformer/transformer_block.py get_cpu_offload_context):
  the tensors the first N layers of a rank save for backward go to pinned host memory on a
  side stream once each layer's forward ends, and come back one layer ahead of its backward.
  Priced as a recompute mode, "offload" (planner.vocab RECOMPUTE; Megatron refuses it with
  recompute): a rank's offloaded layers keep no activations on the GPU but one layer's, whose
  copy may be in flight (planner.cost.stage), and the copies cost what of them the compute
  does not hide on Transformer Engine's schedule (`activation_offload_stall`).
- NVMe (ZeRO-Infinity): what lives there is read and written through host memory at the
  node's NVMe bandwidth, shared by its GPUs; DeepSpeed pipelines the optimizer's swap with
  the CPU step (its pipeline_read / pipeline_write), so the slower of the two counts.

The CPU step is bound by host memory bandwidth, shared by the node's GPUs' processes:
CPU_ADAM_BYTES per parameter.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from planner.cost.memory import GIB

# Bytes of host memory traffic per parameter of one CPU Adam step: it reads the fp32 master
# weight, gradient and both moments (16) and writes the weight and moments back (12) and the
# bf16 copy the GPU gets (2), the loop of DeepSpeed's CPU Adam (csrc/adam/cpu_adam_impl.cpp
# Step_AVX) and of torch's fused CPU AdamW alike; memory-bound (the ZeRO-Offload paper,
# Sec. 5.1, vectorises it to run at memory speed).
CPU_ADAM_BYTES = 30.0
# fp32 gradients kept on the host beside the optimizer states: DeepSpeed's offloaded fp32
# gradient partition, Megatron's pinned CPU gradients (pin_cpu_grads)
HOST_GRAD_BYTES = 4.0
# Host memory the offloaded states take, as a multiple of their bytes: DeepSpeed's own
# estimate of the CPU memory ZeRO offload needs uses additional_buffer_factor 1.5
# (deepspeed/runtime/zero/stage_1_and_2.py estimate_zero2_model_states_mem_needs,
# deepspeed/runtime/zero/stage3.py estimate_zero3_model_states_mem_needs): pinned staging
# buffers, the allocator and the processes around them.
HOST_BUFFER_FACTOR = 1.5


@dataclass(frozen=True)
class OffloadCosts:
    """Seconds per parameter of this GPU's shard that an offload adds (per_param)."""
    fwd_s: float = 0.0        # per micro-batch, beside the forward (parameters up)
    bwd_s: float = 0.0        # per micro-batch, beside the backward (parameters up, gradients down)
    step_cpu_s: float = 0.0   # once per step: the CPU optimizer step
    step_move_s: float = 0.0  # once per step: what of the transfers the step waits for


def offloads(c) -> bool:
    """Whether candidate or parallelism `c` offloads anything."""
    return (getattr(c, "offload_optimizer", "none") != "none"
            or getattr(c, "offload_params", "none") != "none")


def gpu_state_bytes(engine, states: dict, c) -> dict:
    """model_state_bytes keywords (planner.cost.memory) of what stays in GPU memory under `c`'s
    offload: no optimizer states when the optimizer is offloaded, no gradients where the engine
    keeps them on the host, no persistent parameters when they are offloaded (the gathered
    working copies of ZeRO-3 are counted where the layers run, planner.cost.stage)."""
    out = dict(states)
    if c.offload_optimizer != "none":
        out["optimizer_bytes"] = 0.0
        if engine.offload_grads_each_microbatch and c.zero >= 2:
            out["grad_bytes"] = 0.0
    if c.offload_params != "none":
        out["weight_bytes"] = 0.0
    return out


def _per_gpu(node_gbps: float, gpus_per_node: int) -> float:
    """Bytes/s one GPU's process gets of a node's shared bandwidth."""
    return node_gbps * 1e9 / gpus_per_node


def activation_offload_stall(fwd: list, bwd: list, copy: list, offloaded: int) -> float:
    """Seconds per micro-batch a rank's activation offload adds, its layers' forward and
    backward passes `fwd` / `bwd` and the host copy of each one's activations `copy` (seconds,
    each way) in model order, the first `offloaded` of them offloaded, on Transformer Engine's
    schedule (transformer_engine/pytorch/cpu_offload.py DefaultOffloadSynchronizer, TE >= 2.10,
    what Megatron-Core's --cpu-offloading-num-layers drives): with K = layers - offloaded, layer
    i's copy to the host runs on one side stream after the previous copy and must end before
    layer K + i's forward, which waits for it; its reload starts before layer K - 1 + i's
    backward and must end before its own backward. The copies run on the copy engines beside
    the compute, which they do not slow; what the compute waits for is the stall. Taken to
    start once the layer's forward ends: TE starts each tensor's copy as soon as the tensor is
    saved (an event per tensor, cpu_offload.py start_offload), during the layer, so this is
    an upper bound on the stall."""
    n = len(fwd)
    keep = n - offloaded
    if not 0 <= offloaded < max(n, 1):     # the engine keeps a layer (rules.OFFLOAD_KEPT_LAYERS)
        raise ValueError(f"{offloaded} of a rank's {n} layers offloaded: the engine offloads "
                         f"0 to {max(n - 1, 0)} of them (planner.rules OFFLOAD_KEPT_LAYERS)")
    t, stream, done = 0.0, 0.0, {}
    for j in range(n):
        if 1 <= j <= offloaded:          # fwd_step(j) starts layer j - 1's copy
            stream = max(t, stream) + copy[j - 1]
            done[j - 1] = stream
        if 0 <= j - keep < offloaded:    # ... and waits for layer j - K's to finish
            t = max(t, done[j - keep])
        t += fwd[j]
    stall = t - sum(fwd)
    t, stream, ready = 0.0, 0.0, {}
    for j in reversed(range(n)):
        i = j - (keep - 1)               # bwd_step(j) starts layer i's reload
        if 0 <= i < offloaded:
            stream = max(t, stream) + copy[i]
            ready[i] = stream
        if j < offloaded:                # its backward waits for its activations
            t = max(t, ready[j])
        t += bwd[j]
    return stall + t - sum(bwd)


def per_param(engine, cluster, c) -> OffloadCosts:
    """Seconds per parameter of this GPU's shard (the shard ZeRO-`c.zero` keeps of the
    optimizer states; parameters are offloaded under ZeRO-3, each GPU its shard): the host
    copies beside every micro-batch, the CPU step (with its NVMe swap) and what of the step's
    copies it waits for. The host's memory bandwidth and NVMe are shared by the node's GPUs;
    the host link is each GPU's own."""
    if not offloads(c):
        return OffloadCosts()
    g, n = cluster.gpu, cluster.gpus_per_node
    link = g.host_link_gbps * 1e9
    host_mem = _per_gpu(g.host_memory_gbps, n)
    nvme = _per_gpu(g.nvme_gbps, n) if g.nvme_gbps > 0 else 0.0
    down, up = engine.offload_transfer_bytes
    fwd = bwd = cpu = move = 0.0
    if c.offload_optimizer != "none":
        cpu = CPU_ADAM_BYTES / host_mem
        states = engine.optimizer_bytes + HOST_GRAD_BYTES
        if c.offload_optimizer == "nvme":
            # read and written back every step, pipelined with the CPU step: the slower counts
            cpu = max(cpu, 2 * states / nvme)
        grads_down = down / link
        params_up = up / link if c.offload_params == "none" else 0.0
        if engine.offload_grads_each_microbatch and c.zero >= 2:
            bwd += grads_down          # every micro-batch, beside its backward
            step_moves = (params_up,)
        else:
            step_moves = (grads_down, params_up)
        if engine.offload_overlaps_step:
            move = max(0.0, max(cpu, *step_moves) - cpu)
        else:
            move = sum(step_moves)
    if c.offload_params != "none":
        w = engine.weight_bytes        # the persistent parameter, as the engine keeps it
        rate = link if c.offload_params == "cpu" else min(link, nvme)
        fwd += w / rate
        bwd += w / rate
    return OffloadCosts(fwd_s=fwd, bwd_s=bwd, step_cpu_s=cpu, step_move_s=move)


def shard_params(model, c, layers: list | None = None) -> tuple:
    """(optimizer shard, parameter shard) of the busiest GPU, parameters: the most layers a
    pipeline rank holds (`layers` per rank; not given, ceil(L / pp), the even split) with the
    embedding and the head both (an upper bound wherever they sit), divided over tp, and over
    the ZeRO shard group where ZeRO shards them (the optimizer from ZeRO-1, the parameters
    at ZeRO-3)."""
    most = max(layers) if layers else math.ceil(model.num_layers / c.pp)
    layers = most * model.layer_params()
    fixed = model.embedding_params() + model.head_params()
    rank = (layers + fixed) / c.tp
    dpc = c.shard       # the ZeRO shard group (dp x cp but under HSDP)
    return rank / (dpc if c.zero >= 1 else 1), rank / (dpc if c.zero >= 3 else 1)


@dataclass(frozen=True)
class HostUse:
    """Host memory and NVMe one node's GPUs take for their offloaded states."""
    host_gib: float
    nvme_tib: float
    host_capacity_gib: float
    nvme_capacity_tib: float

    @property
    def fits(self) -> bool:
        return (self.host_gib <= self.host_capacity_gib
                and self.nvme_tib <= self.nvme_capacity_tib)


def _pow2_ceil_ratio(n: float) -> float:
    """PowerOf2Ceil(n) / n for a buffer of n bytes (1 for an empty one)."""
    n = int(math.ceil(n))
    return (1 << (n - 1).bit_length()) / n if n > 0 else 1.0


def pinned_round_factor(model, tokens: int, tp: int, sp: bool = False) -> float:
    """How much more pinned host memory than their bytes a dense layer's offloaded activations
    take: Transformer Engine copies each saved tensor into its own pinned buffer
    (cpu_offload.py: torch.empty_like(tensor, device="cpu", pin_memory=True)), which PyTorch's
    caching host allocator rounds up to a power of two (ATen/core/CachingHostAllocator.h
    allocate: PowerOf2Ceil under the default pinned_max_round_threshold, no limit). Each of
    the layer's saved tensors (`tokens`, this rank's micro-batch, x its width: the norms' and
    the QKV and MLP inputs at the hidden size, over tp under sequence parallelism; the fused
    QKV output TE offloads as one base tensor, start_offload offload_base_tensor; the
    attention output; the FFN's gate and up outputs and its activation output, over tp)
    rounded, weighted by its width (the rounding does not depend on the element's bytes: a
    power of two times 1, 2 or 4); 2, the most it can be, for an MoE model, whose expert
    tensors' rows vary with the routing."""
    if model.is_moe:
        return 2.0
    h = model.hidden / (tp if sp else 1)
    f = model.ffn_hidden / tp
    widths = [h] * 4 + [(model.q_dim + 2 * model.kv_dim) / tp, model.attn_out_dim / tp,
                        (2 if model.gated_mlp else 1) * f, f]
    return sum(w * _pow2_ceil_ratio(tokens * w) for w in widths) / sum(widths)


def host_use(model, cluster, c, engine, layers: list | None = None,
             activation_bytes: float = 0.0) -> HostUse:
    """What one node's GPUs hold on the host and its NVMe under `c`'s offload (each GPU its
    busiest rank's shard: shard_params, of the placement `layers` where given), the states in
    host memory with HOST_BUFFER_FACTOR, and the `activation_bytes` its busiest rank offloads
    (recompute "offload") in pinned buffers (pinned_round_factor)."""
    opt, par = shard_params(model, c, layers)
    act = (activation_bytes * pinned_round_factor(model, c.mbs * c.seq_len // c.cp, c.tp, c.sp)
           if activation_bytes else 0.0)
    host, nvme = 0.0, 0.0
    if c.offload_optimizer != "none":
        b = engine.optimizer_bytes + HOST_GRAD_BYTES
        if c.offload_optimizer == "nvme":
            nvme += b * opt
        else:
            host += b * opt
    if c.offload_params != "none":
        if c.offload_params == "nvme":
            nvme += engine.weight_bytes * par
        else:
            host += engine.weight_bytes * par
    n = min(cluster.gpus_per_node, c.tp * c.pp * c.dp * c.cp)
    g = cluster.gpu
    return HostUse(host_gib=n * (host * HOST_BUFFER_FACTOR + act) / GIB,
                   nvme_tib=n * nvme / 2 ** 40,
                   host_capacity_gib=g.host_memory_gib, nvme_capacity_tib=g.nvme_tib)
