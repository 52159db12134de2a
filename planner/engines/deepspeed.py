"""DeepSpeed (ZeRO 1-3 and its pipeline engine), with Megatron-DeepSpeed model code for TP.

What it runs: ZeRO stages 0-3 without pipelining; with the PipelineEngine only stages 0 and 1
(deepspeed/runtime/pipe/engine.py asserts zero stage < 2). Its pipeline schedule is its own
1F1B-style TrainSchedule (deepspeed/runtime/pipe/schedule.py), no interleaving, no zero-bubble
or DualPipeV schedule (deepspeedai/DeepSpeed pull request 8576, "Add DualPipeV", is not
merged). PipelineModule partitions layers 'uniform', by 'parameters' or by 'type:<regex>'
(deepspeed/runtime/pipe/module.py _partition_layers): 'uniform' gives the first
num_layers % pp stages one layer more (deepspeed/runtime/utils.py partition_uniform), the
others balance the layers' weights (partition_balanced): the stages' decoder layers differ by
at most one (BALANCED_SPLIT; BLOOM-176B ran 70 layers over 12 stages). The export names the
method that gives the plan's split.
The vocabulary: Megatron-DeepSpeed pads it to a multiple of --make-vocab-size-divisible-by
(128) x tp as Megatron-LM (megatron/tokenizer/tokenizer.py _vocab_size_with_padding).
Recompute: activation_checkpoint_interval = 1 checkpoints every layer
(no per-stage count); selective recompute is Megatron-DeepSpeed's model-code option for every
layer. Gradient reduction overlaps backward with zero_optimization.overlap_comm (the export sets
it); the parameter all-gather after the step is not overlapped with the next forward.

How fast: Megatron-DeepSpeed runs Megatron's fused kernels, so Megatron's figures (1) apply.
Not validated against published runs: none are in the validation set.
Memory: bf16 weights, fp32 gradient accumulation (the export sets data_types.grad_accum_dtype
"fp32"), 12 B of Adam state with the fp32 master (Rajbhandari et al. 2020, K = 12).
No context parallelism: DeepSpeed-Ulysses is model code (deepspeed.sequence.layer.
DistributedAttention wrapping the attention, Megatron-DeepSpeed's --ds-sequence-parallel-size),
not a setting of the DeepSpeed config this planner exports, so an export could not carry it.
Precision: bf16 only (DeepSpeed's own engine has no FP8 training path found in its sources; FP8
through Transformer Engine would be model code, not a DeepSpeed setting).
"""
import functools

from planner.engines.megatron import MAKE_VOCAB_SIZE_DIVISIBLE_BY
from planner.engines.spec import (ALLOCATOR_RESERVE, ALL_OR_NONE, BALANCED_SPLIT, CONTEXT_GIB,
                                  Engine)
from planner.engines.trust import validation_of



def partition_uniform(num_items: int, num_parts: int) -> list:
    """deepspeed/runtime/utils.py partition_uniform: part boundaries, the first
    num_items % num_parts parts one item larger."""
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    chunk, residual = divmod(num_items, num_parts)
    return [p * chunk + min(p, residual) for p in range(num_parts + 1)]


@functools.lru_cache(maxsize=256)
def partition_balanced(weights: tuple, num_parts: int) -> tuple:
    """deepspeed/runtime/utils.py partition_balanced, as it is: the contiguous partition
    minimising the heaviest minus the lightest part's weight (its dynamic programme, its
    tie-breaking: the last cut of equal cost), as part boundaries."""
    n, m = len(weights), num_parts
    if n <= m:
        return tuple(partition_uniform(n, m))
    inf = float("inf")
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    dp_max = [[inf] * (m + 1) for _ in range(n + 1)]
    dp_min = [[inf] * (m + 1) for _ in range(n + 1)]
    dp_cost = [[inf] * (m + 1) for _ in range(n + 1)]
    position = [[0] * (m + 1) for _ in range(n + 1)]
    dp_max[0][0] = dp_cost[0][0] = 0
    for i in range(1, n + 1):
        for j in range(1, min(i, m) + 1):
            for k in range(i):
                part = prefix[i] - prefix[k]
                hi, lo = max(dp_max[k][j - 1], part), min(dp_min[k][j - 1], part)
                if dp_cost[i][j] >= hi - lo:
                    dp_cost[i][j], dp_max[i][j], dp_min[i][j] = hi - lo, hi, lo
                    position[i][j] = k
    parts = [n]
    for j in range(m, 0, -1):
        parts.append(position[parts[-1]][j])
    return tuple(reversed(parts))


def transformer_counts(num_layers: int, pp: int) -> dict:
    """Decoder layers per stage that PipelineModule's partition methods give a GPT of
    `num_layers` layers (deepspeed/runtime/pipe/module.py _partition_layers), by the
    partition_method that gives them: 'type:transformer' balances the transformer layers
    alone (the first stages one more); 'type:transformer|embedding' counts the tied embedding
    at both ends as a layer each (Megatron-DeepSpeed GPTModelPipe, as BLOOM-176B ran: 5, 6 x
    10, 5 over 12 stages)."""
    out = {}
    for method, weights in (("type:transformer", (1,) * num_layers),
                            ("type:transformer|embedding", (1,) + (1,) * num_layers + (1,))):
        bounds = partition_balanced(weights, pp)
        ends = 1 if method.endswith("embedding") else 0
        counts = []
        for a, b in zip(bounds, bounds[1:]):
            lo, hi = max(a, ends), min(b, ends + num_layers)
            counts.append(max(0, hi - lo))
        out.setdefault(tuple(counts), method)
    return {method: list(counts) for counts, method in out.items()}


DEEPSPEED = Engine(
    name="deepspeed", title="DeepSpeed",
    zero_stages=(0, 1, 2, 3), zero_stages_with_pp=(0, 1),
    max_tp=None, sp_choices=(False, True),
    schedules=("1f1b",), stage_layers=BALANCED_SPLIT, stage_partitions=transformer_counts,
    vocab_split="pad", vocab_pad_multiple=MAKE_VOCAB_SIZE_DIVISIBLE_BY,
    sources=(("zero_with_pp", "deepspeed/runtime/pipe/engine.py (asserts zero stage < 2)"),
             ("stage_layers", "deepspeed/runtime/pipe/module.py PipelineModule._partition_layers "
                              "('uniform': deepspeed/runtime/utils.py partition_uniform; "
                              "'parameters', 'type:<regex>': partition_balanced)"),
             ("schedule", "deepspeed/runtime/pipe/schedule.py TrainSchedule (1F1B only; "
                          "DualPipeV is deepspeedai/DeepSpeed PR 8576, not merged)"),
             ("zeropp", "deepspeed/runtime/zero/config.py (zero_quantized_weights, "
                        "zero_hpz_partition_size, zero_quantized_gradients: ZeRO-3's; "
                        "deepspeed.ai/tutorials/zeropp)"),
             ("hsdp", "deepspeed/runtime/zero/mics.py (MiCS_Init / MiCS_Optimizer: "
                      "mics_shard_size with ZeRO-3)"),
             ("offload", "deepspeed/runtime/zero/offload_config.py (offload_optimizer, "
                         "offload_param: device cpu | nvme; offload_param with ZeRO-3)")),
    recompute=(("full", ALL_OR_NONE), ("selective", ALL_OR_NONE)),
    overlap_grad_reduce=True, overlap_param_gather=False,
    zero2_gathers_every_microbatch=False,
    weight_bytes=2.0, grad_bytes=4.0, optimizer_bytes=12.0,
    context_gib=CONTEXT_GIB, allocator_reserve=ALLOCATOR_RESERVE,
    # ZeRO-Offload / ZeRO-Infinity: zero_optimization.offload_optimizer and offload_param,
    # device "cpu" or "nvme" (deepspeed/runtime/zero/offload_config.py OffloadDeviceEnum;
    # offload_param is ZeRO-3's: DeepSpeed config docs, "offload_param ... Valid only with
    # stage 3"). The partitioned gradients go to the host in every micro-batch's backward and
    # accumulate there (deepspeed/runtime/zero/stage_1_and_2.py
    # async_accumulate_grad_in_cpu_via_gpu; stage3.py partition_grads to the offloaded fp32
    # gradient buffer); the step runs on the CPU (DeepSpeedCPUAdam) and the updated bf16
    # partition comes back: 2 bytes a parameter each way (Ren et al. 2021, ZeRO-Offload,
    # Sec. 4.1: "fp16 gradients ... to CPU", "fp16 parameters ... back to GPU"), one after the
    # other (the one-step delayed update, DPU, is off by default).
    offload_optimizer_devices=("cpu", "nvme"), offload_param_devices=("cpu", "nvme"),
    # MiCS (zero_optimization.mics_shard_size, ZeRO-3): the states sharded inside groups of
    # mics_shard_size ranks, replicated across them (deepspeed/runtime/zero/mics.py; Zhang et
    # al. 2022, "MiCS: Near-linear Scaling for Training Gigantic Model on Public Cloud")
    hsdp_zero_stages=(3,),
    # ZeRO++ (deepspeed/runtime/zero/config.py zero_quantized_weights, zero_hpz_partition_size,
    # zero_quantized_gradients; stage 3: DeepSpeed's ZeRO++ tutorial)
    zeropp=True,
    offload_grads_each_microbatch=True, offload_transfer_bytes=(2.0, 2.0),
    offload_zero_stages=(1, 2, 3),   # ZeRO-Offload is a ZeRO optimizer's (stage 1-3)
    validation=validation_of("deepspeed"),
)
