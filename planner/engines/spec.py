"""The training engine as a spec: what it can run, how fast it runs it, what memory it keeps.

A plan is priced for the engine that will run it (Megatron-LM, torchtitan, DeepSpeed, plain
FSDP, or our runtime): the search offers only what that engine can express, and the cost model
reads every engine-dependent figure from here. Each engine's figures and their sources live in
its own module (planner/engines/<name>.py); a profile (`python -m profiler`) becomes measured
facts of an engine on a machine through `planner.cost.facts`.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

# what selective recompute recomputes where nothing else is asked for (planner.vocab)
from planner.cost.compute import CE_BYTES_BWD, CE_BYTES_FWD, FUSED_KERNELS, ElementwiseKernels
from planner.vocab import DEFAULT_RECOMPUTE_MODULES

# How many layers a pipeline rank may recompute (`Engine.recompute_count`):
PER_STAGE = "per_stage"   # any count per rank (our runtime)
PER_CHUNK = "per_chunk"   # one count for every model chunk (Megatron's --recompute-num-layers)
ALL_OR_NONE = "all"       # every layer or none (torchtitan, DeepSpeed, FSDP wrappers)

# How a pipeline's layers may be split over its ranks (`Engine.stage_layers`):
ANY_SPLIT = "any"         # any contiguous split (Megatron's layout, torchtitan's module fqns)
# counts that differ by at most one layer: what DeepSpeed's PipelineModule partitions produce
# (deepspeed/runtime/pipe/module.py _partition_layers: 'uniform' is deepspeed/runtime/utils.py
# partition_uniform, the first num_layers % pp stages one layer more; 'parameters' and
# 'type:<regex>' are partition_balanced over the layers' weights, e.g. BLOOM-176B's 70 layers
# over 12 stages as 5, 6 x 10, 5 with 'type:transformer|embedding')
BALANCED_SPLIT = "balanced"


# ---- figures every PyTorch-based engine shares --------------------------------------------
# CUDA context (~0.5 GiB), NCCL communicator buffers (~1 GiB for a few communicators at the default
# NCCL_BUFFSIZE of 4 MiB per channel and peer) and cuBLAS workspaces: a documented allowance,
# the figure the planner has always reserved.
CONTEXT_GIB = 2.0
# PyTorch's caching allocator rounds large blocks up to 2 MiB segments and keeps freed blocks
# cached; the reserve at peak is taken as 5% of the bytes allocated (checked against the
# max_memory_reserved figures torchtitan publishes, benchmarks/results fidelity table). What
# decides a fit takes it on the churned bytes only (planner.cost.stage MemoryBudget).
ALLOCATOR_RESERVE = 0.05


# (model, padded vocabulary) -> (model, the model as built): Engine.built_model's memo
_BUILT: dict = {}


@dataclass(frozen=True)
class LossMemory:
    """Bytes per logit the cross entropy over a rank's logits holds: what it saves for its
    backward, the peak of its forward and the peak of its backward (the logits included where
    the loss holds them), with the logits themselves dropped before the backward (torchtitan's
    train step `del pred`; our runtime never names them), for bf16 logits and for fp32 ones
    (our runtime on CPUs). A pipeline stage that keeps its output until its backward
    (torch.distributed.pipelining) adds the logits' own bytes to what is held and to the
    backward's peak."""
    saved: float
    forward: float
    backward: float
    forward_fp32: float
    backward_fp32: float
    # bytes per logit the loss's kernels move in forward and in backward, its time over the
    # GPU's memory bandwidth (planner.cost.compute.head_time): an unfused fp32 cross entropy's
    # unless the kernel is known to move fewer
    traffic_fwd: float = CE_BYTES_FWD
    traffic_bwd: float = CE_BYTES_BWD

    @property
    def traffic(self) -> tuple:
        """(forward, backward) bytes per logit: planner.cost.compute.head_time's ce_bytes."""
        return self.traffic_fwd, self.traffic_bwd

    def peak(self, logit_bytes: float, logits_kept: bool = False) -> float:
        fwd, bwd = ((self.forward_fp32, self.backward_fp32) if logit_bytes == 4.0
                    else (self.forward, self.backward))
        return max(fwd, bwd + (logit_bytes if logits_kept else 0.0))

    def held(self, logit_bytes: float, logits_kept: bool = False) -> float:
        """Held from the loss's forward to its backward: its saved tensors and kept logits."""
        return self.saved + (logit_bytes if logits_kept else 0.0)


# Measured on CPU (tests/test_loss_memory.py measures every figure again on the installed
# torch: saved with saved-tensor hooks, peaks with torch's MemTracker, torch.distributed._tools.
# mem_tracker): saved; forward, backward for bf16 logits; then for fp32 ones. Each saves one
# fp32 tensor as large as the logits (4). Eager PyTorch's F.cross_entropy(logits.float()):
# forward the logits, their fp32 copy and the saved log-softmax (10; fp32: 8); backward the
# saved log-softmax, nll_loss's fp32 gradient and log_softmax's (12).
EAGER_LOSS = LossMemory(4.0, 10.0, 12.0, 8.0, 12.0)
# The same under DTensor's loss_parallel over vocabulary-sharded logits (torch.distributed.
# tensor.parallel.loss_parallel, which torchtitan enables under tensor parallelism): its
# log-softmax and nll backward keep more fp32 temporaries (forward 14 / 12, backward 16).
LOSS_PARALLEL_LOSS = LossMemory(4.0, 14.0, 16.0, 12.0, 16.0)
# Our runtime's vocabulary-parallel cross entropy (runtime/pipeline.py
# _VocabParallelCrossEntropy): forward the logits, their fp32 copy, the shifted logits and
# their exponentials (14; fp32: 12), backward the saved softmax and its gradient (8).
RUNTIME_VOCAB_PARALLEL_LOSS = LossMemory(4.0, 14.0, 8.0, 12.0, 8.0)
# Megatron's vocabulary-parallel cross entropy (megatron/core/tensor_parallel/cross_entropy.py,
# from the source, not measured): it computes on an fp32 copy of the logits in place (exp,
# divide) and saves that softmax (4); forward the bf16 logits and the copy (6), backward the
# softmax turned into the gradient in place and its bf16 cast (6); fp32 logits: 4 throughout.
MEGATRON_VOCAB_PARALLEL_LOSS = LossMemory(4.0, 6.0, 6.0, 4.0, 4.0)
# Transformer Engine's fused cross entropy (transformer_engine/pytorch/triton/cross_entropy.py,
# parallel_cross_entropy; Megatron-Core --cross-entropy-loss-fusion with
# --cross-entropy-fusion-impl te, language_module.py compute_language_model_loss), from the
# source, not measured: an online-softmax pass reads the bf16 logits (2), a second reads them
# again and writes the gradient in place over them (2 + 2), which is all it keeps (2); its
# backward scales that gradient in place by the incoming one (2 + 2, element_mul_kernel). As TE
# ran it from 8ca2caf8a (2025-02-25, #1456) until 01bbe3eea (2026-07-09, #3193), which keeps the
# gradient in fp32 instead; fp32 logits: 4 throughout.
TE_FUSED_LOSS = LossMemory(2.0, 2.0, 2.0, 4.0, 4.0, traffic_fwd=6.0, traffic_bwd=4.0)
# The same kernels from 01bbe3eea (2026-07-09, #3193; TE 2.18, the branch
# release_v2.18_nemo_26.08): the gradient written to a new fp32 tensor (2 + 2 + 4) and kept
# (4) beside the logits while the forward runs (2 + 4), scaled in place in backward (4 + 4) and
# cast by autograd to the bf16 logits' dtype (4 + 2; it holds 4 + 2). fp32 logits: the forward
# holds 4 + 4, the backward 4, no cast.
TE_FUSED_FP32_GRAD_LOSS = LossMemory(4.0, 6.0, 6.0, 8.0, 4.0, traffic_fwd=8.0, traffic_bwd=14.0)
# flash-attn's fused cross entropy (flash_attn/losses/cross_entropy.py, llm-foundry's default
# `loss_fn: fused_crossentropy`; from the source, not measured): its kernel reads the bf16
# logits and saves them with the rows' log-sum-exp (2); backward writes a new bf16 gradient
# beside them (4, no inplace_backward); fp32 logits: 4 and 8.
FLASH_ATTN_LOSS = LossMemory(2.0, 2.0, 4.0, 4.0, 8.0)
# torchtitan's loss under torch.compile (torchtitan/components/loss.py wraps its
# cross_entropy_loss, F.cross_entropy(pred.flatten(0, 1).float(), ...), in torch.compile when
# training.compile is set: since torchtitan bbb1b616e, 2025-04-02, #1033; before it the loss ran
# eager, EAGER_LOSS). Inductor fuses the fp32 upcast and the log-softmax: the forward keeps the
# logits and two per-row fp32 figures (2; fp32 logits 4) and allocates nothing as large as the
# logits; the backward writes one gradient in the logits' dtype beside them (4; 8). Measured on
# CPU (tests/test_loss_memory.py: the saved tensors, and the buffers Inductor's code allocates).
COMPILED_LOSS = LossMemory(2.0, 2.0, 4.0, 4.0, 8.0)


@dataclass(frozen=True)
class Validation:
    """How well the engine's predictions matched its published runs (benchmarks/fidelity)."""
    runs: int
    median_abs_error_pct: float
    table: str                      # the committed result this figure was read from

    def describe(self, engine: str) -> str:
        return (f"+/-{self.median_abs_error_pct:.0f}% (median over {self.runs} published "
                f"{engine} runs)")


# the groupings of the embedding and head Engine.fsdp_outer_wrap names
FSDP_OUTER_WRAPS = ("root", "split")


@dataclass(frozen=True)
class Engine:
    name: str
    title: str
    # ---- what it can run --------------------------------------------------------------
    zero_stages: tuple              # ZeRO stages offered without pipelining (pp = 1)
    zero_stages_with_pp: tuple      # ... and with pp > 1
    max_tp: int | None              # None: up to a node; 1: no tensor parallelism
    sp_choices: tuple               # sequence-parallel settings it offers with tp > 1
    schedules: tuple                # pipeline schedules with pp > 1 (empty: no pipelining)
    stage_layers: str               # ANY_SPLIT | BALANCED_SPLIT (its partition methods)
    # granularities it offers, each with how many layers of a rank it may cover:
    # (("full", PER_CHUNK), ("selective", ALL_OR_NONE)), ...; "op" is torchtitan's per-op policy
    recompute: tuple
    # data-parallel gradient reduction overlapped with backward (per-bucket / per-layer)
    overlap_grad_reduce: bool
    # ZeRO-1/2 parameter all-gather after the optimizer step overlapped with the next forward
    overlap_param_gather: bool
    # ZeRO-2 as FSDP SHARD_GRAD_OP: parameters all-gathered again in every micro-batch's
    # forward (kept unsharded to its backward) instead of once after the step
    zero2_gathers_every_microbatch: bool
    # its own names for a granularity, as (its name, the granularity priced): torchtitan's
    # "selective" is its per-op policy, priced as "op" (`native_recompute`)
    recompute_aliases: tuple = ()
    # BALANCED_SPLIT: (num_layers, pp) -> {partition method: decoder layers per stage}, the
    # splits its partition methods give (planner.engines.deepspeed.transformer_counts)
    stage_partitions: object = field(default=None, compare=False, repr=False)
    # the embedding and the loss may stand for a decoder layer in the pipeline split, so the
    # first model chunk of the first rank and the last of the last rank may hold no decoder
    # layer (Megatron's --account-for-embedding-in-pipeline-split /
    # --account-for-loss-in-pipeline-split; `sources` "end_chunks_may_be_empty")
    end_chunks_may_be_empty: bool = False
    # TP groups must sit inside one host (torchrun's local ranks), not just one NVLink domain
    tp_within_host: bool = False
    # what its "selective" recompute may recompute of every layer (planner.cost.recompute
    # MODULES): the attention core only, unless it offers Megatron's --recompute-modules
    recompute_modules: tuple = DEFAULT_RECOMPUTE_MODULES
    # context parallelism: the K/V exchanges it runs (planner.cost.context.CP_COMM_TYPES), the
    # first its default; empty: no context parallelism
    cp_comm_types: tuple = ()
    # tensor-parallel collectives overlapped with the layer's GEMMs when tp > 1 with sequence
    # parallelism (Megatron-Core --tp-comm-overlap: Transformer Engine userbuffers split the
    # all-gathers / reduce-scatters into chunks pipelined with the QKV/FC1 and out-proj/FC2
    # GEMMs; transformer_engine/pytorch/module/base.py initialize_ub)
    tp_comm_overlap: bool = False
    # the EP dispatch / combine of one micro-batch overlapped with another's compute
    # (Megatron-Core --overlap-moe-expert-parallel-comm with --delay-wgrad-compute:
    # megatron/core/pipeline_parallel/combined_1f1b.py); where the layout allows
    # (planner.rules.ep_comm_overlap_blockers)
    ep_comm_overlap: bool = False
    # MoE token dropping with every expert padded to capacity (Megatron
    # --moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity); False: dropless only
    moe_capacity_factor: bool = False
    # the MoE combine weighs the experts' outputs by the routing probabilities and so keeps
    # the outputs (k per token) for backward (our runtime: runtime/model.py MoEFeedForward;
    # torchtitan taken so); False where the probabilities are applied inside the experts'
    # activation instead (Megatron-Core's TEGroupedMLP.bias_act_func, weighted_bias_swiglu:
    # megatron/core/transformer/moe/experts.py), so the unpermute keeps nothing
    moe_saves_expert_outputs: bool = True
    # data parallelism with tp or pp (False: DDP only as 1-D data parallelism)
    zero0_with_tp_pp: bool = True
    # mixture-of-experts token dispatchers it runs (planner.cost.moe.DISPATCHERS); empty: it
    # runs no MoE layers as the planner prices them
    moe_dispatchers: tuple = ()
    # expert tensor parallel degrees it allows: "any" (Megatron's
    # --expert-tensor-parallel-size), "tp" (etp = 1 or etp = tp: torchtitan), "equal_tp" (etp
    # = tp always, each expert split over the tp ranks: our runtime), "none" (etp = 1)
    moe_etp: str = "none"
    # expert parallelism only over sharded data parallelism (torchtitan: ep borrows from
    # dp_shard x cp, and from tp when etp = 1; DDP replicas cannot hold experts)
    ep_needs_sharded_dp: bool = False
    # MoE layers under tensor parallelism (False: an MoE model runs at tp 1 only)
    moe_with_tp: bool = True
    # Under sequence parallelism the column-parallel linears (QKV, MLP-in) keep their
    # all-gathered input for the weight gradient: PyTorch's DTensor TP (ColwiseParallel after
    # SequenceParallel redistributes the input to Replicate, and the matmul saves that), so
    # b*s*h each instead of Megatron's b*s*h/tp, which it all-gathers again in backward
    # (Korthikanti et al. 2022, Sec. 4.2.2). Measured in our runtime
    # (tests/test_runtime_searched.py).
    sp_keeps_gathered_inputs: bool = False
    # Under pipelining its FSDP2 ranks hold their layers' unsharded gradients, accumulated in
    # the reduce dtype, and unsharded parameters through the whole step:
    # torch.distributed.pipelining's stage (stage.py backward_maybe_with_nosync) turns FSDP's
    # gradient sync and resharding off for every micro-batch's backward and reduces once
    # after the last; FSDP2 then keeps an fp32 accumulator per unsharded parameter
    # (torch/distributed/fsdp/_fully_shard/_fsdp_param.py to_accumulated_grad_if_needed).
    # torchtitan runs that stage as it is; our runtime reduce-scatters every micro-batch
    # instead (runtime/pipeline.py _sharded_grad_stage).
    pp_keeps_unsharded_grads: bool = False
    # Set for an engine whose ZeRO-3 is FSDP2's: how it groups the embedding and the head,
    # which decides what is unsharded while the layers' activations are held and at the
    # backward's end (planner.cost.dataparallel zero3_unsharded_bytes, zero3_end_bytes):
    # "root": the embedding, final norm and head in FSDP2's root group, whose post-backward is
    # the backward's final callback (torch/distributed/fsdp/_fully_shard/_fsdp_state.py), so
    # they stay gathered from the backward's start to its end and the head's gradient is held
    # (in the compute dtype) until the root's reduce-scatter after the last layer; "split":
    # the embedding its own group resharded after its forward, [norm, head] one group reduced
    # as soon as its backward ran (torchtitan since 83e694105, #1094, 2025-07-28); None: not
    # FSDP2's, the embedding and head counted gathered with their gradients beside every
    # layer's (no finer claim made).
    fsdp_outer_wrap: str | None = None     # one of FSDP_OUTER_WRAPS, or None
    # Whether its per-op recompute policy ("op") recomputes the attention kernel in backward:
    # torchtitan's save list named the flash and memory-efficient SDPA kernels only until
    # b39377f9f (#2095, 2025-12-01), while from #1196 (2025-05-14) it ran cuDNN's on B200
    # (compute capability 10), which the policy then recomputed: the attention's output and
    # log-sum-exp not saved, its forward run again in backward.
    op_recomputes_attention: bool = False
    # the model's attention features beyond Llama's (planner.specs.Model.attention_feature_map
    # keys) its export writes into the model's definition; None: its export leaves the
    # architecture to the user's model code (torchtitan's [model] flavor, a DeepSpeed or FSDP
    # script), so any is carried there
    model_features: tuple | None = None
    # ---- what its model code builds (read by planner.rules, the one rules layer) ------
    # parts of a model it does not build (planner.rules.MODEL_PARTS keys: "mtp", "alibi")
    model_lacks: tuple = ()
    # multi-head latent attention under tensor parallelism (False: MLA at tp 1 only)
    mla_with_tp: bool = True
    # an MoE model under tensor parallelism needs sequence parallelism (Megatron-Core asserts
    # "sequence parallel must be used with MoE and tensor parallel"; torchtitan always shards
    # the sequence under tp; our runtime's experts take the tp rank's share of the tokens)
    moe_tp_needs_sp: bool = True
    # how its tensor parallelism splits the vocabulary (`built_vocab`): "pad" -- the training
    # script pads it to a multiple of vocab_pad_multiple x tp (Megatron-LM's
    # --make-vocab-size-divisible-by, default 128: megatron/core/tokenizers/utils/
    # build_tokenizer.py vocab_size_with_padding; Megatron-DeepSpeed's
    # megatron/tokenizer/tokenizer.py _vocab_size_with_padding), so any vocabulary runs at any
    # tp; "uneven" -- DTensor shards it as torch.chunk does, ceil(V / tp) rows a rank (the
    # vocabulary-parallel embedding and loss mask by each shard's own range:
    # torch/distributed/tensor/placement_types.py MaskPartial._partition_value,
    # Shard.local_shard_size_and_offset); "even" -- tp must divide it
    vocab_split: str = "even"
    vocab_pad_multiple: int = 1
    # where it states its limits, as ((rule, file or document), ...): the `source` of the
    # planner.rules Problem for that rule
    sources: tuple = ()
    # ---- hybrid sharding (HSDP: planner.cost.dataparallel) -----------------------------
    # the ZeRO stages it shards inside groups of the data-parallel ranks, replicated across
    # them (empty: none)
    hsdp_zero_stages: tuple = ()
    # ZeRO++ under ZeRO-3 (zero_quantized_weights, zero_hpz_partition_size,
    # zero_quantized_gradients: planner.cost.dataparallel.ZeroPP)
    zeropp: bool = False
    # ---- offload (planner.cost.offload) ------------------------------------------------
    # where it offloads the optimizer states with their fp32 master weights, the optimizer
    # step then running on the CPU ("cpu", "nvme"; empty: it does not), and the parameters
    # (ZeRO-Infinity's offload_param)
    offload_optimizer_devices: tuple = ()
    offload_param_devices: tuple = ()
    # the parameters offload only under ZeRO-3 (DeepSpeed's offload_param is a ZeRO-3 setting)
    offload_param_zero3: bool = True
    # the ZeRO stages it offloads under (None: any it runs)
    offload_zero_stages: tuple | None = None
    # the optimizer offloads only together with the parameters (FSDP2's CPUOffloadPolicy
    # moves parameters, gradients and optimizer states at once)
    offload_optimizer_with_params: bool = False
    # the optimizer's gradients live on the host: copied out in every micro-batch's backward
    # (DeepSpeed's partitioned gradients under offload, accumulated on the CPU), instead of
    # kept on the GPU and copied once per step (Megatron's HybridDeviceOptimizer)
    offload_grads_each_microbatch: bool = False
    # the gradient copy out, the CPU step and the parameter copy back run concurrently
    # (Megatron --overlap-cpu-optimizer-d2h-h2d); False: one after the other
    offload_overlaps_step: bool = False
    # optimizer offload only with its distributed optimizer (ZeRO-1 or more where dp x cp > 1;
    # over one rank the export still names it)
    offload_needs_distributed_optimizer: bool = False
    # bytes per parameter it moves to the host (gradients) and back (updated parameters)
    offload_transfer_bytes: tuple = (2.0, 2.0)
    # ---- how fast ----------------------------------------------------------------------
    gemm_scale: float = 1.0         # x the GPU's large-GEMM efficiency (planner.catalog.gpus)
    attn_scale: float = 1.0         # x the GPU's attention-kernel efficiency
    elementwise_traffic: float = 1.0  # x the element-wise HBM traffic (eager: fitted)
    # how its model code runs norms, RoPE and the gated activation (fused, or one eager
    # kernel per tensor expression: planner.engines.eager)
    elementwise_kernels: ElementwiseKernels = FUSED_KERNELS
    # the engine can run its model (and loss) under torch.compile (`plan --compile`, the
    # plan's `compile`; priced by with_compile), and whether this spec is that variant
    compile_option: bool = False
    compiled: bool = False
    # the TP overlap it runs only under torch.compile (torchtitan's async TP: Inductor's
    # micro-pipeline pass); with_compile turns it on as tp_comm_overlap
    compiled_tp_comm_overlap: bool = False
    # the passes whose TP collectives the overlap hides ("fwd", "bwd": Megatron-Core's
    # userbuffers overlap both, planner.cost.stage)
    tp_comm_overlap_passes: tuple = ("fwd", "bwd")
    # its TP overlap runs on Transformer Engine's userbuffers, GPU memory it allocates outside
    # PyTorch's caching allocator (planner.cost.memory userbuffer_bytes)
    tp_overlap_userbuffers: bool = False
    layer_overhead_s: float = 0.0   # per layer and micro-batch, forward + backward
    # per MoE layer and forward run (a full recompute runs it again): the sync of dropless
    # routing, whose dispatcher waits for the device-to-host copy of the token counts before
    # its all-to-all (megatron/core/transformer/moe/token_dispatcher.py,
    # _maybe_dtoh_and_synchronize at cuda_sync_point "before_ep_alltoall"): the round trip
    # with the GPU drained
    moe_layer_overhead_s: float = 0.0
    # host time per local expert to issue an MoE layer's forward (dropless only): a grouped
    # linear's host work is per GEMM, one per local expert (Transformer Engine transformer_
    # engine/pytorch/module/grouped_linear.py, _GroupedLinear.forward: the host list m_splits,
    # a quantizer per GEMM, general_grouped_gemm over num_gemms). Between two syncs the GPU
    # runs only what the host has issued, so what of it one layer's forward GPU work does not
    # cover is exposed (planner.cost.moe.dropless_host_stall); in the backward no sync drains
    # the queue and the host runs ahead (counting it there too fitted the published rows
    # worse: a --fit-moe trial before the hiding was priced, loss 0.0082 against 0.0074
    # for the forward alone)
    moe_expert_overhead_s: float = 0.0
    overlap_slowdown: float | None = None   # None: the GPU's figure
    # ---- what memory it keeps ----------------------------------------------------------
    # Bytes per parameter of the persistent states. Megatron/DeepSpeed: bf16 weights, fp32
    # gradients (or bf16), 12 B of Adam state incl. the fp32 master. FSDP2: the sharded fp32
    # parameter is the master, Adam keeps 8 B (m, v), gradients fp32.
    weight_bytes: float = 2.0
    grad_bytes: float = 4.0
    optimizer_bytes: float = 12.0
    # bf16 unsharded copy of the parameters held while computing, where the persistent weights
    # are fp32 (FSDP mixed precision): per parameter of the unsharded layers it keeps
    compute_copy_bytes: float = 0.0
    # bf16 copy of the whole parameters held for the step under ZeRO 0/1 where the persistent
    # weights are fp32 and bf16 compute is autocast's (its weight-cast cache lives until the
    # autocast region ends); 0 where the engine computes in fp32 (`fp32_compute_on`)
    autocast_copy_bytes: float = 0.0
    # catalog GPU names (device types) on which the engine computes in fp32, without bf16
    # autocast: its saved activations, gathered parameter copies and TP/PP messages are 4 bytes
    # an element there, not 2 (planner.cost.facts.CatalogFacts.compute_elem_bytes)
    fp32_compute_on: tuple = ()
    # catalog GPU names on which the engine's attention keeps the b x heads x s x s softmax
    # for backward where the values are narrower or wider than the queries' heads (MLA):
    # PyTorch's CPU flash kernel needs one head width for q, k and v, so SDPA runs its math
    # path there (measured: tests/test_memory.py); CUDA's memory-efficient kernel does not need
    # it, so the fused attention's log-sum-exp is all it keeps
    math_attention_for_unequal_heads_on: tuple = ()
    # what the loss holds per logit (LossMemory), at tp 1 and, where it differs, under tensor
    # parallelism (None: the same); and whether its pipeline schedule keeps the last stage's
    # output, the logits, until that micro-batch's backward (torch.distributed.pipelining's
    # PipelineStage keeps every stage's forward outputs for stage_backward)
    loss_memory: LossMemory = MEGATRON_VOCAB_PARALLEL_LOSS
    tp_loss_memory: LossMemory | None = None
    pipeline_keeps_logits: bool = False
    # torch.distributed.pipelining's PipelineStage allocates, for every micro-batch of the step,
    # a receive buffer for the stage's input (every stage but the first: stage.py
    # _setup_forward_recv_info, args_recv_info[chunk]) and one for its output's gradient (every
    # stage but the last: _setup_backward_recv_info, grad_recv_info[mb]), kept from the first
    # step on, and keeps each micro-batch's stage output (fwd_cache) until its backward
    # (planner.cost.schedule stage_buffer_bytes). Megatron receives into a tensor made per
    # transfer (megatron/core/pipeline_parallel/p2p_communication.py), its stage input.
    pipeline_recv_buffers: bool = False
    # ... and whether its schedule keeps every micro-batch's last-stage output, the logits, to
    # return them merged from step(): torch's schedules do unless step(return_outputs=False)
    # (pytorch #165822; stage.py forward_one_chunk: output_chunks, detached after the
    # micro-batch's backward, cleared at the next step), which torchtitan passes since
    # e5ef99aab (#1922, 2025-10-22) and our runtime passes (runtime/train.py)
    pipeline_returns_outputs: bool = False
    # ... and whether each received input's gradient stays on its receive buffer to the step's
    # end under every schedule: torch's stage_backward left it there (val.grad) until the next
    # step's clear_runtime_states released it, before pytorch #164329 ("Optimize memory by
    # early releasing stage inputs' gradients", 2025-10; torch 2.13's _backward.py sets
    # val.grad = None once read). The zero-bubble schedules' split backward
    # (stage_backward_input) still leaves it (planner.cost.schedule stage_buffer_bytes).
    pipeline_keeps_input_grads: bool = False
    context_gib: float = 0.0        # CUDA context, cuBLAS workspaces, NCCL buffers
    # caching-allocator reserve at peak, as a fraction of the bytes allocated: what
    # torch.cuda.max_memory_reserved shows beyond max_memory_allocated; what a plan needs takes
    # it on the activations and working buffers only (planner.cost.stage MemoryBudget)
    allocator_reserve: float = 0.0
    # 1F1B with fewer micro-batches than stages runs as GPipe (all m forwards held)
    short_1f1b_as_gpipe: bool = False
    # the ZeRO stages it runs the zero-bubble schedules (planner.vocab.ZERO_BUBBLE_SCHEDULES)
    # with; None: every stage it pipelines with
    zero_bubble_zero_stages: tuple | None = None
    # ---- precision (planner.precision) -------------------------------------------------
    # (precision, recipes it offers for it, the default first); bf16 always
    precisions: tuple = (("bf16", ()),)
    # the low-precision kernel library whose recipes it runs: "te" (Transformer Engine) or
    # "torchao" (planner.precision.LIBRARIES); None: bf16 only
    lowp_library: str | None = None
    # how its Transformer Engine modules keep each bf16 weight's quantised copy beyond the
    # layer's forward: "cached" for the step (every layer's), "saved" for the backward (the
    # layers not recomputed), "" not at all; under ZeRO-3 that copy is of the gathered weight,
    # so held whole (planner.cost.memory weight_copy_bytes)
    gathered_lowp_copies: str = ""
    # whether its ZeRO-3 runs FP8 primary weights (planner.precision fp8_primary_weights):
    # what it exports and what is priced
    zero3_fp8_primary_weights: bool = False
    # whether its ZeRO-3 keeps per-tensor FP8 primary weights without their transposes (made
    # again for each gathered weight's backward): 1 byte a sharded linear weight on any GPU
    zero3_drops_fp8_transposes: bool = False
    validation: Validation | None = None
    # figures measured by `python -m profiler` (planner.profile.Measured), set by
    # planner.profile.apply_profile; read through planner.cost.facts
    measured: object = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.fsdp_outer_wrap not in (None,) + FSDP_OUTER_WRAPS:
            raise ValueError(f"engine {self.name}: fsdp_outer_wrap {self.fsdp_outer_wrap!r} "
                             f"is none of {FSDP_OUTER_WRAPS}")

    @property
    def zero3_is_fsdp2(self) -> bool:
        """Its ZeRO-3 is FSDP2's (fsdp_outer_wrap set): unsharded gradients in the compute
        dtype beside the reduce-scatter input (planner.cost.dataparallel zero3_layer_bytes)."""
        return self.fsdp_outer_wrap is not None

    # ---- capabilities as predicates the search and plan validation share --------------
    def zero_ok(self, zero: int, tp: int, pp: int, dp: int, cp: int = 1) -> bool:
        """ZeRO shards over dp x cp (weights are replicated over cp)."""
        if dp * cp == 1:
            return zero == 0
        if zero == 0 and not self.zero0_with_tp_pp and (tp > 1 or pp > 1 or cp > 1):
            return False
        return zero in (self.zero_stages if pp == 1 else self.zero_stages_with_pp)

    def etp_ok(self, etp: int, tp: int) -> bool:
        if self.moe_etp == "equal_tp":
            return etp == tp
        return etp == 1 or self.moe_etp == "any" or (self.moe_etp == "tp" and etp == tp)

    def ep_layout_ok(self, ep: int, etp: int, tp: int, zero: int, moe: bool = True) -> bool:
        """The engine can lay out ep x etp experts on this grid with this ZeRO stage (`moe`:
        the model has experts; a dense model's (1, 1) is always fine)."""
        if moe and tp > 1 and not self.moe_with_tp:
            return False
        if moe and not self.etp_ok(etp, tp):
            return False
        return not (self.ep_needs_sharded_dp and zero < 2 and tp % (ep * etp))

    def tp_domain(self, cluster) -> int:
        """GPUs a tensor-parallel group may span: the NVLink domain (NVL72 trays share one), or
        the host where the engine places TP groups per host."""
        return cluster.gpus_per_node if self.tp_within_host else cluster.nvlink_domain

    def tp_fits(self, cluster, tp: int) -> bool:
        """A tp group fits in the domain a TP group may span (`tp_domain`): the one answer to
        where a TP group may live, read by the search, the rules and explain."""
        return self.tp_domain(cluster) % tp == 0

    def built_vocab(self, vocab: int, tp: int) -> int:
        """The vocabulary rows its model builds at tensor parallel degree `tp`, over all tp
        ranks (what the embedding and the output layer hold and compute): padded, or tp times
        the largest uneven shard, or the vocabulary itself (`vocab_split`)."""
        if self.vocab_split == "pad":
            multiple = self.vocab_pad_multiple * tp
            return -(-vocab // multiple) * multiple
        if self.vocab_split == "uneven":
            return -(-vocab // tp) * tp
        return vocab

    def vocab_splits(self, vocab: int, tp: int) -> bool:
        """Its tensor parallelism splits a vocabulary of `vocab` tokens over `tp` ranks."""
        return self.vocab_split != "even" or vocab % tp == 0

    def built_model(self, model, tp: int):
        """`model` as this engine builds it at tp: the vocabulary `built_vocab` (what the cost
        model prices: the embedding, the output layer and the loss)."""
        vocab = self.built_vocab(model.vocab_size, tp)
        if vocab == model.vocab_size:
            return model
        # one built model per (model, vocabulary): the cost model's caches key on the model
        key = (id(model), vocab)
        got = _BUILT.get(key)
        if got is None or got[0] is not model:
            got = _BUILT[key] = (model, replace(model, vocab_size=vocab))
        return got[1]

    def tp_runs(self, cluster, tp: int) -> bool:
        """The engine runs tp groups of `tp` ranks on this cluster at all: inside one host where
        it places TP per host (our runtime: runtime/train.py check_world), anywhere for the
        others -- Megatron-Core's tp groups are consecutive ranks and span nodes where tp
        exceeds them (megatron/core/parallel_state.py; Narayanan et al. 2021 ran tp 16 and 32
        on 8-GPU DGX A100 nodes, Megatron-LM examples/academic_paper_scripts/sc21/
        run_figure_15.sh), priced over the inter-node links (planner.cost.comm.group_link).
        Where the search looks for tp is `tp_fits` / `tp_limit`, a search choice."""
        return self.tp_fits(cluster, tp) or not self.tp_within_host

    def source_of(self, rule: str, default: str = "") -> str:
        """The file or document where this engine states `rule` (`sources`)."""
        return dict(self.sources).get(rule, default)

    def tp_limit(self, cluster) -> int:
        """The largest tensor-parallel group the engine runs on this cluster."""
        room = self.tp_domain(cluster)
        return room if self.max_tp is None else min(self.max_tp, room)

    @property
    def pipelines(self) -> bool:
        return bool(self.schedules)

    def native_recompute(self, recompute: str | None) -> str | None:
        """The granularity priced for `recompute` in this engine's own words (its
        `recompute_aliases`), else `recompute` itself."""
        return dict(self.recompute_aliases).get(recompute, recompute)

    @property
    def recompute_modes(self) -> tuple:
        return tuple(g for g, _ in self.recompute)

    def recompute_count(self, recompute: str) -> str:
        """PER_STAGE, PER_CHUNK or ALL_OR_NONE for a granularity it offers."""
        return dict(self.recompute).get(recompute, ALL_OR_NONE)

    def all_layers_recomputed(self, recompute: str) -> bool:
        """True when a granularity applies to every layer of a plan or to none."""
        return recompute != "none" and self.recompute_count(recompute) == ALL_OR_NONE

    def effective_schedule(self, schedule: str, pp: int, m: int) -> str:
        """The schedule that runs: 1F1B with m < p runs as GPipe where the engine does that."""
        if schedule == "1f1b" and self.short_1f1b_as_gpipe and m < pp:
            return "gpipe"
        return schedule

    def trust(self) -> str:
        return self.validation.describe(self.name) if self.validation else "not validated"


def with_compile(engine: Engine) -> Engine:
    """`engine` with its model and loss under torch.compile: Inductor fuses the element-wise
    ops into a few kernels (planner.cost.compute FUSED_KERNELS: torchtitan's eager 8B rows ran
    15.7% / 16.2% slower than their compiled twins, the element-wise kernels counted so 14.5% /
    14.4%, benchmarks/results/fidelity_2026-12-05.md) and its eager loss becomes COMPILED_LOSS
    (torchtitan compiles the loss with the model, compile.components ["model", "loss"]; a
    vocabulary-parallel loss keeps its own figure); the TP overlap it runs only compiled is
    offered (Engine.compiled_tp_comm_overlap)."""
    loss = COMPILED_LOSS if engine.loss_memory == EAGER_LOSS else engine.loss_memory
    return replace(engine, compiled=True, elementwise_kernels=FUSED_KERNELS, loss_memory=loss,
                   tp_comm_overlap=engine.tp_comm_overlap or engine.compiled_tp_comm_overlap)
