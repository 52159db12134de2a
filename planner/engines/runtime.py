"""Our runtime (runtime/): init_device_mesh, DTensor TP/SP, FSDP2, torch.distributed.pipelining.

What it runs (runtime/parallelize.py, runtime/pipeline.py): ZeRO 0-3 with or without
pipelining (ZeRO-0/1 its own bucketed gradient all-reduce, launched from the gradient hooks of
each chunk's last micro-batch backward as DDP's, ZeRO-2/3 FSDP2 with
reshard_after_forward False / True, gradients reduce-scattered every micro-batch; ZeRO-2 keeps
the parameters gathered until the step's last micro-batch, so they are gathered once a step);
TP with or without SP (MoE models with SP only, as the search offers them); MoE layers with
ep carved out of dp and, under tp, each expert split over the tp ranks (etp = tp, Megatron's
flow: tokens routed per tp rank, all-to-all over ep, all-gathered over etp, reduce-scattered
back); GPipe, 1F1B (as GPipe when there are
fewer micro-batches than stages), interleaved 1F1B and torch's zero-bubble schedules
(ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble, ScheduleDualPipeV: runtime/pipeline.py
build_schedule); any contiguous split; full or selective
recompute of any number of each stage's first layers.

TP groups sit inside one host (its world check), also inside an NVL72 rack. Overlapped: the
ZeRO-0/1 gradient reduction with the last micro-batch's backward (runtime/parallelize.py
GradAllReduce: reverse-order buckets, DDP's 1 MiB first bucket, then 64 MiB, at most two in
flight, so within the plan's data-parallel bucket under `other`). Not overlapped: the ZeRO-1
parameter broadcast after the step.

How fast: eager PyTorch as torchtitan (the same kernels), until `python -m profiler` measures
it (`plan --profile`). Memory: fp32 parameters under autocast (4 B), fp32 gradients, AdamW's m
and v (8 B). Saved activations as the cost model counts them (runtime/model.py: the RMSNorm and
the gated MLP save only their inputs, SDPA keeps K/V grouped). On CPUs it computes in fp32 (no
bf16 autocast: `fp32_compute_on`), so there every activation, gathered parameter copy and TP/PP
message is 4 bytes an element (planner.cost.facts.CatalogFacts.compute_elem_bytes), and
MLA's attention (values narrower than its query heads) runs SDPA's math path, which keeps the
softmax (`math_attention_for_unequal_heads_on`).
Under ZeRO 0/1 on CUDA it computes under bf16 autocast (runtime/train.py), whose cache keeps a
bf16 cast of every weight a matmul uses until the step's autocast region ends: 2 bytes per
parameter beside the fp32 weights (`autocast_copy_bytes`; counted for all parameters, so the
fp32-only embedding lookup and norms make it an upper bound by 2 bytes per embedding parameter
on the first stage when the embedding is untied). ZeRO 2 keeps FSDP2's gathered bf16 copy
(`compute_copy_bytes`), ZeRO 3 the gathered layers (counted under `other`). The loss: eager
cross entropy at tp 1, runtime/pipeline.py's vocabulary-parallel one under tp (planner.engines.
spec LossMemory, measured); the pipeline's last stage keeps its logits to its backward.
Precision: bf16 only (runtime/ has no FP8 path).
What it refuses (read by planner.rules, so the search never emits it and the pre-flight
refuses it in one line): multi-token prediction and ALiBi (`model_lacks`: runtime/model.py
builds neither), MLA with tp > 1 (`mla_with_tp`), an MoE model under tp without sequence
parallelism (`moe_tp_needs_sp`), etp != tp (`moe_etp`), and a plan priced for another engine.
No context parallelism: PyTorch's context_parallel needs the CUDA SDPA flash / efficient
backends and the runtime does not wire it; the search never chooses cp > 1 here and the
runtime's preflight refuses a cp > 1 plan in one line (planner.rules, cp_comm_types).
"""
from planner.engines.spec import (ALLOCATOR_RESERVE, ANY_SPLIT, CONTEXT_GIB,
                                  EAGER_LOSS, PER_STAGE,
                                  RUNTIME_VOCAB_PARALLEL_LOSS, Engine)
from planner.engines.eager import (EAGER_ATTN_SCALE, EAGER_ELEMENTWISE_TRAFFIC, EAGER_GEMM_SCALE,
                                    EAGER_LAYER_OVERHEAD_S, RUNTIME_KERNELS)
from planner.engines.trust import validation_of

RUNTIME = Engine(
    name="runtime", title="our PyTorch runtime (python -m runtime)",
    zero_stages=(0, 1, 2, 3), zero_stages_with_pp=(0, 1, 2, 3),
    # FSDP2's fully_shard over a 2-D (replicate, shard) mesh of the dp ranks
    # (runtime/data_parallel.py apply_fsdp)
    hsdp_zero_stages=(2, 3),
    max_tp=None, sp_choices=(False, True),
    sp_keeps_gathered_inputs=True,   # DTensor ColwiseParallel after SequenceParallel
    schedules=("gpipe", "1f1b", "interleaved", "interleaved-zb", "zbv", "dualpipev"),
    stage_layers=ANY_SPLIT,
    recompute=(("full", PER_STAGE), ("selective", PER_STAGE)),
    overlap_grad_reduce=True,    # ZeRO 0/1 (runtime/parallelize.py GradAllReduce)
    overlap_param_gather=False,
    zero2_gathers_every_microbatch=False, short_1f1b_as_gpipe=True,
    # runtime/pipeline.py ShardedGradStage reduce-scatters every micro-batch's gradients for
    # the full backward only; the split one (torch's stage_backward_input / _weight) would
    # keep FSDP2's unsharded gradients through the step, which the plan does not count
    zero_bubble_zero_stages=(0, 1),
    tp_within_host=True,   # runtime/train.py check_world: tp must divide the local world
    # runtime/expert.py: experts split over an ep dim carved out of dp, tokens dispatched with
    # all_to_all_single (gloo and NCCL); under tp each expert's FFN is split over the tp ranks
    # (etp = tp, never etp = 1 with tp > 1: planner.rules refuses that, moe_etp)
    moe_dispatchers=("alltoall",), moe_etp="equal_tp", moe_with_tp=True,
    # what runtime/model.py does not build (check_supported, check_whole_model_supported), and
    # what runtime/parallelize.py and runtime/expert.py cannot split: the runtime's refusals,
    # read by planner.rules (the search never emits them; the pre-flight refuses them)
    model_lacks=("mtp", "alibi"), mla_with_tp=False, moe_tp_needs_sp=True,
    sources=(("model_parts", "runtime/model.py check_whole_model_supported"),
             ("mla_with_tp", "runtime/parallelize.py apply_tp (MLA at tp 1 only)"),
             ("moe_tp_needs_sp", "runtime/expert.py (tokens enter the MoE layer split over tp)"),
             ("etp", "runtime/expert.py (each expert split over the tp ranks: etp = tp)"),
             ("cp", "planner/engines/runtime.py (PyTorch's context_parallel is not wired)"),
             ("zero_bubble_zero", "runtime/pipeline.py ShardedGradStage (per-micro-batch "
                                  "reduce-scatter for the full backward only)"),
             ("vocab_split", "runtime/pipeline.py loss_fn (a vocabulary tp does not divide "
                             "falls back to the full logits, full_tensor(), which the plan's "
                             "vocabulary-parallel loss does not count)"),
             ("tp_splits_model", "runtime/model.py Attention / runtime/tensor_parallel.py "
                                 "(local heads and FFN columns are the model's over tp)")),
    gemm_scale=EAGER_GEMM_SCALE, attn_scale=EAGER_ATTN_SCALE,
    elementwise_traffic=EAGER_ELEMENTWISE_TRAFFIC, layer_overhead_s=EAGER_LAYER_OVERHEAD_S,
    elementwise_kernels=RUNTIME_KERNELS,
    weight_bytes=4.0, grad_bytes=4.0, optimizer_bytes=8.0, compute_copy_bytes=2.0,
    autocast_copy_bytes=2.0,   # runtime/train.py: ZeRO 0/1 on CUDA, autocast's cache
    fp32_compute_on=("cpu",),   # runtime/train.py: autocast and bf16 FSDP only on CUDA
    math_attention_for_unequal_heads_on=("cpu",),   # runtime/model.py AttentionCore: SDPA
    # runtime/pipeline.py loss_fn: eager at tp 1, its own vocabulary-parallel cross entropy
    # under tp; torch.distributed.pipelining under pp
    loss_memory=EAGER_LOSS, tp_loss_memory=RUNTIME_VOCAB_PARALLEL_LOSS,
    pipeline_keeps_logits=True, context_gib=CONTEXT_GIB,
    pipeline_recv_buffers=True,
    allocator_reserve=ALLOCATOR_RESERVE,
    # runtime/data_parallel.py apply_fsdp: every layer its own group, the embedding, final norm
    # and output in the root group (gathered at every sampling point of the step:
    # tests/test_runtime_searched.py zero3_gathered_bounds)
    fsdp_outer_wrap="root",
    validation=validation_of("runtime"),
)
