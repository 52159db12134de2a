"""DeepSpeed (ZeRO 1-3 and its pipeline engine), with Megatron-DeepSpeed model code for TP.

What it runs: ZeRO stages 0-3 without pipelining; with the PipelineEngine only stages 0 and 1
(deepspeed/runtime/pipe/engine.py asserts zero stage < 2). Its pipeline schedule is its own
1F1B-style TrainSchedule (deepspeed/runtime/pipe/schedule.py), no interleaving, no zero-bubble
or DualPipeV schedule (deepspeedai/DeepSpeed pull request 8576, "Add DualPipeV", is not merged). PipelineModule
partitions layers 'uniform', by 'parameters' or by 'type:<regex>'
(deepspeed/runtime/pipe/module.py):
the planner uses only splits with the same number of decoder layers on every stage, which all
three methods produce. Recompute: activation_checkpoint_interval = 1 checkpoints every layer
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
from planner.engines.spec import (ALLOCATOR_RESERVE, ALL_OR_NONE, CONTEXT_GIB, EQUAL_SPLIT, Engine)
from planner.engines.validation import validation_of

DEEPSPEED = Engine(
    name="deepspeed", title="DeepSpeed",
    zero_stages=(0, 1, 2, 3), zero_stages_with_pp=(0, 1),
    max_tp=None, sp_choices=(False, True),
    schedules=("1f1b",), stage_layers=EQUAL_SPLIT,
    sources=(("zero_with_pp", "deepspeed/runtime/pipe/engine.py (asserts zero stage < 2)"),
             ("stage_layers", "deepspeed/runtime/pipe/module.py PipelineModule partition_method "
                              "(the planner uses equal splits only)"),
             ("schedule", "deepspeed/runtime/pipe/schedule.py TrainSchedule (1F1B only; "
                          "DualPipeV is deepspeedai/DeepSpeed PR 8576, not merged)")),
    recompute=(("full", ALL_OR_NONE), ("selective", ALL_OR_NONE)),
    overlap_grad_reduce=True, overlap_param_gather=False,
    zero2_gathers_every_microbatch=False,
    weight_bytes=2.0, grad_bytes=4.0, optimizer_bytes=12.0,
    context_gib=CONTEXT_GIB, allocator_reserve=ALLOCATOR_RESERVE,
    validation=validation_of("deepspeed"),
)
