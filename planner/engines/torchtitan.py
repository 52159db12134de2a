"""torchtitan: FSDP2 + DTensor TP/SP + torch.distributed.pipelining (+ CP), eager PyTorch.

What it runs (torchtitan/config/job_config.py, torchtitan/distributed/parallel_dims.py):
- data parallel: FSDP2 `fully_shard` (data_parallel_shard_degree) with
  fsdp_reshard_after_forward "always" (ZeRO-3) or "never" (ZeRO-2 as SHARD_GRAD_OP: parameters
  gathered again every micro-batch and kept to its backward); DDP (replicate) only as 1-D data
  parallelism ("DDP has not supported > 1D parallelism"). No optimizer-only sharding (ZeRO-1).
- tensor parallel always shards the sequence (SequenceParallel on norms): sp only.
- pipelining: GPipe, 1F1B, Interleaved1F1B and the zero-bubble InterleavedZeroBubble,
  ZBVZeroBubble and DualPipeV ([parallelism] pipeline_parallel_schedule, any name of torch's
  get_schedule_class; torchtitan/distributed/pipeline_parallel.py builds 2 stages per rank
  laid out as a V for the last two), any contiguous split through module_fqns_per_model_part.
- recompute ([activation_checkpoint] mode): "full" (every layer) or "selective" with option
  "op" (the per-op policy, planner.cost.compute.op_recomputed_gemms) on every layer.
- FSDP2 reduce-scatters gradients in backward and prefetches the next all-gather.
- Context parallelism ([parallelism] context_parallel_degree, context_parallel_rotate_method
  "allgather" (default) | "alltoall"): PyTorch's context_parallel
  (torch/distributed/tensor/experimental/_attention.py) with the head-tail (zigzag) load
  balancer for causal masks; "allgather" gathers K,V (_AllGatherRotater), "alltoall" passes
  the K,V chunks around the ring one all_to_all_single per step (_AllToAllRotater): priced as
  all_gather and p2p (planner.cost.context). FSDP shards over dp_shard x cp
  (torchtitan/distributed/parallel_dims.py, the dp_shard_cp mesh). No Ulysses.

How fast: eager PyTorch kernels (no torch.compile in the planner's figures): cuBLAS GEMMs,
SDPA flash attention, torch's fused RMSNorm and RoPE and SwiGLU as their eager tensor
expressions (planner.engines.eager TORCHTITAN_EAGER_KERNELS); the eager figures of
planner.engines.eager, fitted on FSDP rows only; every torchtitan row is held out.

Precision: float8 through torchao (`[model] converters = ["quantize.linear.float8"]`,
`[quantize.linear.float8]` recipe_name tensorwise (default, FP8 all-gather under FSDP2 with
enable_fsdp_float8_all_gather) or rowwise; `[float8]` in releases before the quantize
sections), MXFP8 on Blackwell (converter "quantize.linear.mx", recipe mxfp8_cublas):
torchtitan docs/float8.md and docs/mxfp8.md. The `output` projection stays bf16.

Memory: FSDP2 mixed precision (param bf16, reduce fp32): the sharded fp32 parameter is the
master (4 B), Adam's m and v (8 B), fp32 sharded gradients (4 B); bf16 unsharded parameters
(2 B) while a layer computes, for every layer between forward and backward under ZeRO-2.
Under pipelining (pp > 1) torch's PipelineStage holds each rank's unsharded parameters and
its unsharded gradients in an fp32 accumulator through the step, under ZeRO-2 and ZeRO-3
(planner.engines.spec pp_keeps_unsharded_grads). The loss: eager cross entropy over the bf16
logits, DTensor's loss_parallel under tp (12 and 16 bytes per logit at their backward peaks,
planner.engines.spec LossMemory); the pipeline's last stage keeps its logits to its backward.
"""
from planner.engines.spec import (ALLOCATOR_RESERVE, ALL_OR_NONE, ANY_SPLIT, CONTEXT_GIB,
                                  EAGER_LOSS, LOSS_PARALLEL_LOSS, Engine)
from planner.engines.eager import (EAGER_ATTN_SCALE, EAGER_ELEMENTWISE_TRAFFIC, EAGER_GEMM_SCALE,
                                    EAGER_LAYER_OVERHEAD_S, TORCHTITAN_EAGER_KERNELS)
from planner.engines.trust import validation_of


TORCHTITAN = Engine(
    name="torchtitan", title="torchtitan (FSDP2, DTensor TP, pipelining)",
    zero_stages=(0, 2, 3), zero_stages_with_pp=(2, 3), zero0_with_tp_pp=False,
    max_tp=None, sp_choices=(True,),
    sp_keeps_gathered_inputs=True,   # DTensor ColwiseParallel after SequenceParallel
    pp_keeps_unsharded_grads=True,   # torch's PipelineStage with FSDP2, as it is
    # torchtitan/models/llama3/infra/parallelize.py apply_fsdp since 83e694105 (#1094,
    # 2025-07-28): tok_embeddings resharded after forward, [norm, output] one group kept from
    # its forward to its backward (planner.engines.spec fsdp_outer_wrap)
    fsdp_outer_wrap="split",
    schedules=("gpipe", "1f1b", "interleaved", "interleaved-zb", "zbv", "dualpipev"),
    stage_layers=ANY_SPLIT,
    recompute=(("full", ALL_OR_NONE), ("op", ALL_OR_NONE)),
    # [activation_checkpoint] mode "selective" with selective_ac_option "op" is the per-op
    # policy priced as "op" (torchtitan/distributed/activation_checkpoint.py: "Valid options:
    # 'op' or a positive int representing layer frequency")
    recompute_aliases=(("selective", "op"),),
    # tok_embeddings RowwiseParallel and output ColwiseParallel (torchtitan/models/llama3/
    # parallelize.py apply_tp) shard the vocabulary as DTensor does, unevenly where tp does
    # not divide it (placement_types.py MaskPartial; loss_parallel likewise)
    vocab_split="uneven",
    sources=(("stage_layers", "torchtitan/distributed/pipeline_parallel.py "
                              "(module_fqns_per_model_part: any contiguous split; "
                              "pipeline_parallel_layers_per_stage, "
                              "pipeline_parallel_first_stage_less_layers)"),
             ("recompute", "torchtitan/distributed/activation_checkpoint.py (modes full, "
                           "selective: per-op SAC)"),
             ("zero0_with_tp_pp", "torchtitan/models/llama3/infra/parallelize.py "
                                  "parallelize_llama (releases 0.1-0.2: \"DDP has not supported "
                                  "> 1D parallelism\")"),
             ("schedule", "torch/distributed/pipelining/schedules.py (GPipe, 1F1B, "
                          "Interleaved1F1B)"),
             ("offload", "torchtitan/config/job_config.py [training] enable_cpu_offload (FSDP2 "
                         "CPUOffloadPolicy: parameters, gradients and optimizer states "
                         "together, with FSDP only)"),
             ("hsdp", "torchtitan/distributed/parallel_dims.py (data_parallel_replicate_degree "
                      "x data_parallel_shard_degree; the shard dimension is FSDP2's)"),
             ("engine_tp_comm_overlap", "torchtitan/config/job_config.py [parallelism] "
                                        "enable_async_tensor_parallel (\"only effective when "
                                        "compile is enabled\"); later torchtitan/config/"
                                        "configs.py CompileConfig raises \"Async TP requires "
                                        "'model' in --compile.components and "
                                        "--compile.enable\""),
             ("tp_comm_overlap_in_domain", "torch/distributed/_symmetric_memory (async TP's "
                                           "buffers are mapped between the tp group's GPUs "
                                           "over NVLink: one node)")),
    overlap_grad_reduce=True, overlap_param_gather=True,
    zero2_gathers_every_microbatch=True,
    # [parallelism] expert_parallel_degree (all-to-all dispatch) and
    # expert_tensor_parallel_degree, 1 or the tp degree (torchtitan/config/job_config.py)
    moe_dispatchers=("alltoall",), moe_etp="tp", ep_needs_sharded_dp=True,
    # its dispatch also waits for the split sizes on the host (torchtitan/distributed/
    # expert_parallel.py: output_splits copied with non_blocking=False, "this would incur a
    # device-to-host sync"), but no published torchtitan MoE run is there to set the stall
    # by: moe_layer_overhead_s stays 0 (layer_overhead_s below covers its hooks)
    cp_comm_types=("all_gather", "p2p"),
    gemm_scale=EAGER_GEMM_SCALE, attn_scale=EAGER_ATTN_SCALE,
    elementwise_traffic=EAGER_ELEMENTWISE_TRAFFIC, layer_overhead_s=EAGER_LAYER_OVERHEAD_S,
    elementwise_kernels=TORCHTITAN_EAGER_KERNELS,
    # [compile] enable with components ["model", "loss"] (torchtitan/config/job_config.py
    # Compile; planner.engines.spec with_compile)
    compile_option=True,
    # async TP ([parallelism] enable_async_tensor_parallel, "only effective when compile is
    # enabled": torchtitan/distributed/tensor_parallel.py maybe_enable_async_tp sets
    # Inductor's _micro_pipeline_tp, which rewrites each all-gather + matmul and matmul +
    # reduce-scatter into torch's symmetric-memory fused ops, pipelined over the tp ranks'
    # shards: torch/distributed/_symmetric_memory fused_all_gather_matmul,
    # fused_matmul_reduce_scatter), priced as planner.cost.stage prices Megatron's overlap,
    # in the forward pass: its authors measured up to ~29% / ~20% faster forward passes and
    # ~8% faster steps on Llama 3 8B / 70B ("[Distributed w/ TorchTitan] Introducing Async
    # Tensor Parallelism in PyTorch", discuss.pytorch.org/t/209487, 2024-09), a step gain that
    # a forward third of the step sped up so accounts for, and torchtitan's published pairs
    # gained 4-14% (benchmarks/data/published_runs_2.json, `tp_comm_overlap_source`)
    compiled_tp_comm_overlap=True, tp_comm_overlap_passes=("fwd",),
    weight_bytes=4.0, grad_bytes=4.0, optimizer_bytes=8.0, compute_copy_bytes=2.0,
    # [parallelism] data_parallel_shard_degree x data_parallel_replicate_degree: FSDP2 over
    # the 2-D (dp_replicate, dp_shard) mesh (torchtitan/distributed/parallel_dims.py;
    # torchtitan/models/llama3/infra/parallelize.py apply_fsdp "HSDP")
    hsdp_zero_stages=(2, 3),
    # [training] enable_cpu_offload: FSDP2's CPUOffloadPolicy on every fully_shard
    # (torchtitan/config/job_config.py; torch/distributed/fsdp/_fully_shard/_fsdp_api.py): the
    # sharded fp32 parameters, their gradients and the optimizer states live in CPU memory and
    # the optimizer steps there; each all-gather copies the fp32 shard up, each
    # reduce-scatter's fp32 shard comes down (4 bytes a parameter each way)
    offload_optimizer_devices=("cpu",), offload_param_devices=("cpu",),
    offload_optimizer_with_params=True, offload_param_zero3=False, offload_zero_stages=(2, 3),
    offload_grads_each_microbatch=True, offload_transfer_bytes=(4.0, 4.0),
    # train step: `del pred` before backward; loss_parallel under tp (torchtitan/distributed/
    # utils.py train_context); torch.distributed.pipelining under pp
    loss_memory=EAGER_LOSS, tp_loss_memory=LOSS_PARALLEL_LOSS, pipeline_keeps_logits=True,
    pipeline_recv_buffers=True,
    context_gib=CONTEXT_GIB,
    allocator_reserve=ALLOCATOR_RESERVE,
    precisions=(("bf16", ()), ("fp8", ("tensorwise", "rowwise")), ("mxfp8", ("mxfp8",))),
    lowp_library="torchao",
    validation=validation_of("torchtitan"),
)
