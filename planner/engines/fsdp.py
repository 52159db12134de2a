"""Plain PyTorch FSDP / FSDP2 data parallelism, as llm-foundry, HF accelerate or NeMo AutoModel
run it: no tensor or pipeline parallelism.

What it runs: sharding strategy NO_SHARD / DDP (ZeRO-0), SHARD_GRAD_OP (ZeRO-2: parameters
gathered every micro-batch and kept from forward to backward) or FULL_SHARD (ZeRO-3)
(torch.distributed.fsdp.ShardingStrategy); activation checkpointing wraps every block or none
(llm-foundry `activation_checkpointing`). Backward prefetch overlaps the next all-gather and
the reduce-scatter with backward.

No context parallelism (the wrappers shard data only).

How fast: eager PyTorch model code with FlashAttention (llm-foundry's MPT): the eager figures
of planner.engines.eager, fitted on llm-foundry's 8-64 GPU table (its 128-512 GPU table held
out).

Precision: FP8 as llm-foundry runs it (`precision: amp_fp8`: Composer wraps the step in
Transformer Engine's te.fp8_autocast with DelayedScaling, format HYBRID; composer/core/
precision.py) -- the published llm-foundry H100 FP8 table. No MXFP8/NVFP4 row or source here.

Memory: FSDP mixed precision with fp32 sharded master parameters, as torchtitan.
"""
from planner.engines.spec import (ALLOCATOR_RESERVE, ALL_OR_NONE, ANY_SPLIT, CONTEXT_GIB,
                                  FLASH_ATTN_LOSS, Engine)
from planner.engines.eager import (EAGER_ATTN_SCALE, EAGER_ELEMENTWISE_TRAFFIC, EAGER_GEMM_SCALE,
                                    EAGER_LAYER_OVERHEAD_S, HF_EAGER_KERNELS)
from planner.engines.trust import validation_of


FSDP = Engine(
    name="fsdp", title="PyTorch FSDP (llm-foundry, accelerate, NeMo AutoModel)",
    zero_stages=(0, 2, 3), zero_stages_with_pp=(),
    max_tp=1, sp_choices=(False,),
    schedules=(), stage_layers=ANY_SPLIT,
    recompute=(("full", ALL_OR_NONE),),
    overlap_grad_reduce=True, overlap_param_gather=True,
    zero2_gathers_every_microbatch=True,
    gemm_scale=EAGER_GEMM_SCALE, attn_scale=EAGER_ATTN_SCALE,
    elementwise_traffic=EAGER_ELEMENTWISE_TRAFFIC, layer_overhead_s=EAGER_LAYER_OVERHEAD_S,
    elementwise_kernels=HF_EAGER_KERNELS,
    weight_bytes=4.0, grad_bytes=4.0, optimizer_bytes=8.0, compute_copy_bytes=2.0,
    loss_memory=FLASH_ATTN_LOSS, context_gib=CONTEXT_GIB,
    allocator_reserve=ALLOCATOR_RESERVE,
    precisions=(("bf16", ()), ("fp8", ("delayed",))),
    lowp_library="te",
    # llm-foundry's FSDP (FSDP1) calls TE's linears without is_first_microbatch, so no copy
    # is cached, but each layer's forward saves its FP8 weight copy (with the transpose) for
    # the backward (transformer_engine/pytorch/module/linear.py @v1.9: save_for_backward(...,
    # weight_fp8, ...), scattered over an FSDP group only where TE's own
    # prepare_te_modules_for_fsdp set one): the gathered weight's copy, held whole until the
    # layer's backward, every layer's at the end of a forward without recompute (a
    # checkpointed forward saves nothing). An upper bound on torch's FSDP2 from TE 2.16, which
    # saves none (0a088c1d5, "Fix FSDP2 memory leaks for FP8 weight workspaces").
    gathered_lowp_copies="saved",
    validation=validation_of("fsdp"),
)
