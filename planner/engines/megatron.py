"""Megatron-LM / Megatron-Core (also as NeMo and Megatron-Bridge run it), current releases.

What it runs (megatron/training/arguments.py, megatron-core >= 0.14):
- ZeRO-1 is the distributed optimizer (--use-distributed-optimizer); ZeRO-2/3 are Megatron-FSDP
  (--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads / optim_grads_params),
  which does not combine with pipeline parallelism.
- Schedules: 1F1B and interleaved 1F1B (--num-virtual-stages-per-pipeline-rank); no GPipe
  (megatron/core/pipeline_parallel/schedules.py), no zero-bubble schedule (ZB, ZB-V) and no
  DualPipe(V): the port of DeepSeek's DualPipe (NVIDIA/Megatron-LM pull request 5254) was closed
  unmerged; its MoE overlap is the combined 1F1B instead (issue 1524). Any contiguous split of the layers over the
  pipeline through --pipeline-model-parallel-layout.
- Recompute: --recompute-granularity full --recompute-method block --recompute-num-layers N
  recomputes the first N layers of every model chunk, one N for all chunks; selective
  recompute applies to every layer, of the modules --recompute-modules names (the attention
  core by default; planner.cost.recompute prices each).
- Overlaps: --overlap-grad-reduce and --overlap-param-gather (the exports set both).
- TP communication overlap: --tp-comm-overlap (needs --sequence-parallel and Transformer
  Engine) runs the TP all-gathers and reduce-scatters as userbuffers chunks pipelined with the
  layer's GEMMs (megatron/training/arguments.py; transformer_engine/pytorch/module/base.py
  initialize_ub). Megatron-Bridge's performance recipes set it (scripts/performance, e.g.
  userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192). The search sets it wherever tp > 1 with sp
  (it only hides time); `plan --no-tp-comm-overlap` prices and exports without it.
- Context parallelism: --context-parallel-size N with --cp-comm-type p2p (default) |
  all_gather | a2a | a2a+p2p (megatron/training/arguments.py; Transformer Engine's
  context_parallel.py runs them). Ranks are ordered tp-cp-ep-dp-pp
  (megatron/core/parallel_state.py); gradients are reduced and the distributed optimizer
  sharded over the data-parallel group with cp. The hierarchical a2a+p2p (which also needs
  --hierarchical-context-parallel-sizes) is not priced, so not offered.

How fast: the GPU catalog's efficiencies were chosen on published Megatron runs
(benchmarks/README.md, fidelity), so every scale factor here is 1.
Precision: FP8 through Transformer Engine (--fp8-format hybrid --fp8-recipe tensorwise|delayed;
Megatron-Bridge's "FP8-CS" is current scaling, `tensorwise`), MXFP8 and NVFP4 on Blackwell
(--fp8-recipe mxfp8; --fp4-format e2m1 --fp4-recipe nvfp4): megatron/training/arguments.py,
_add_transformer_engine_args. Only the TE linears of the decoder run low precision.

MoE (megatron/core/transformer/moe): --num-experts, --moe-router-topk, --moe-ffn-hidden-size,
--moe-shared-expert-intermediate-size, --moe-layer-freq, --expert-model-parallel-size and
--expert-tensor-parallel-size (MoE parallel folding), --moe-grouped-gemm, and the alltoall or
allgather token dispatcher.

Memory: bf16 weights, fp32 gradient accumulation and reduction (accumulate_allreduce_grads_in_fp32
is set for --bf16), 12 B of Adam state with the fp32 master: 18 B per parameter, 6 + 12/d with
the distributed optimizer (Megatron-LM docs, distributed optimizer).
"""
from planner.cost.compute import FUSED_GATED_ACT_BYTES, ElementwiseKernels
from planner.engines.eager import RELU2_EAGER_BYTES
from planner.engines.spec import (ALL_OR_NONE, ALLOCATOR_RESERVE, ANY_SPLIT, CONTEXT_GIB,
                                  PER_CHUNK, PER_STAGE, Engine)
from planner.engines.trust import validation_of
# --recompute-modules choices, default ["core_attn"] (planner.vocab)
from planner.vocab import RECOMPUTE_MODULES

# Dropless routing's host stall (planner.engines.spec Engine moe_layer_overhead_s,
# moe_expert_overhead_s; planner.cost.moe.dropless_host_stall): per MoE layer forward the
# device-to-host sync on the token counts, and per local expert the host's issuing of the
# grouped GEMMs after it, exposed where the layer's forward GPU work does not cover it.
# Least-squares fitted together (`python -m benchmarks.fidelity --fit-moe`, or --fit-figures:
# mean squared log(predicted / published), Nelder-Mead) on the 13 Megatron-Bridge MoE rows of
# its latest two releases, 26.04 and 26.04.01 (H100 and B200; DeepSeek-V3, Qwen3-30B/235B,
# GPT-OSS-120B; 4 to 32 local experts); the 29 rows of 25.09, 25.11, 26.02, 26.02.01 and 26.06
# are held out (benchmarks/results/fidelity_moe_*.md reports both). Refitted (issue 22) after
# the rows were mended: bf16 gradient buffers as every Megatron-Bridge performance recipe runs
# them, and the GPT-OSS-120B B200 ep8 rows' recipe recompute (layernorm + moe_act); the fit was
# 4.33 ms / 0.213 ms before (loss 0.0307 on the mended rows, 0.0300 then: the GPT-OSS B200
# rows, 21-35% fast then, dominated it). 4.78 ms until a collective's latency counted its hops
# inside a node at the NVLink latency (planner.cost.comm, NCCL's model): the procedure,
# Nelder-Mead from the best point of a fixed grid (benchmarks/fidelity.py FIGURES), gave 4.80 ms /
# 0.200 ms (loss 0.0311); 4.77 ms / 0.199 ms (loss 0.0288) once the MoE layer's GPU work was
# priced as Megatron-Core runs it (planner.cost.moe: the flex dispatcher's one copy per GPU, the
# permutations per dispatcher and once in backward, the experts' casts, gpt-oss's eager expert
# bias, the alltoall's low-precision padding copies); 4.71 ms / 0.198 ms (0.0261) with gpt-oss's
# unfused scaled RoPE; 4.63 ms / 0.180 ms (0.0191) with its clamp run apart; 4.61 ms / 0.1803 ms
# (0.0179) with its expert bias in fp32 under the flex dispatcher (ROPE_SCALED_UNFUSED_BYTES,
# CLAMPED_GATED_ACT_BYTES, EXPERT_BIAS_EAGER_FP32_PROBS_BYTES below); 4.52 ms / 0.2031 ms
# (0.0177) once Blackwell's attention was priced as measured (planner.catalog.gpus
# BLACKWELL_ATTENTION, in place of H100's assumed figure); 4.39 ms / 0.1076 ms (0.0127) once
# Blackwell's GEMMs were (BLACKWELL_GEMM: B200 0.58 of peak where H100's 0.70 was assumed; the
# per-expert term now lowers the loss by 1e-8 only: the fit barely identifies it); 4.39 ms /
# 0.0864 ms (0.0127, the per-expert term again worth 1e-8) once FP8 primary weights were
# gathered as their 1-byte data (planner.precision Recipe.lowp_param_sync; the H100 Qwen3 FP8
# fit rows' ZeRO-1 gathers); 4.74 ms / 0.171 ms (0.0150) once the rows' heads were priced with
# the cross entropy their recipes ran, Transformer Engine's fused one (benchmarks/fidelity.py
# te_fused_cross_entropy; planner.engines.spec TE_FUSED_LOSS: 10 bytes a logit, not the unfused
# 52): the faster last stage raises the stall the rows need. Host time: the same seconds on
# every GPU.
MOE_LAYER_OVERHEAD_S = 4.737e-3
MOE_EXPERT_OVERHEAD_S = 0.1709e-3


# The routed experts' down-projection bias (gpt-oss, --add-bias-linear) weighted by the routing
# probability, as Megatron-Core's TEGroupedMLP applies it outside Transformer Engine's grouped
# linear: per local expert `t + b * p` over its rows, then one torch.cat (megatron/core/
# transformer/moe/experts.py _apply_bias @d98e8a64, eager, in place since a329dd6da5,
# 2025-09-22): write b * p (2), read t and it and write the sum (6), the cat's read and write
# (4): 12 bytes per element of the rows x hidden output, forward; its backward (the bias and
# probability gradients' reductions and the split of the output gradient) about as much.
EXPERT_BIAS_EAGER_BYTES = 12.0
# The same with fp32 probabilities (the flex dispatcher's: DeepEP and HybridEP take only fp32,
# megatron/core/transformer/moe/token_dispatcher.py @d98e8a64): b * p is an fp32 rows x hidden
# tensor (4), t + it reads 2 + 4 and writes fp32 (4), the cat reads and writes fp32 (8), the
# cast back to bf16 reads 4 and writes 2: 28 bytes per element.
EXPERT_BIAS_EAGER_FP32_PROBS_BYTES = 28.0
# FP8 / MXFP8 grouped GEMMs need each expert's rows aligned (16 / 32): on the alltoall path
# Megatron-Core pads the permuted rows and probabilities before the grouped linear and unpads
# its output (experts.py quantization_padding, Transformer Engine Fp8Padding / Fp8Unpadding:
# a copy whenever a count is unaligned, as forced-balanced random routing leaves them),
# unless the router pads (--moe-router-padding-for-quantization) or HybridEP's dispatch does
# (moe_utils.py skip_routed_expert_padding; which dispatchers pay it: planner.cost.moe
# LOWP_PADDED_DISPATCHERS): the input's and
# the output's copy, read and write, 2 x (2 + 2) bytes per element of rows x hidden, forward
# and again in backward.
LOWP_EXPERT_PADDING_BYTES = 8.0
# RoPE with YaRN's attention factor other than 1 (gpt-oss: 1.347): Megatron-Core's
# apply_rotary_pos_emb takes the unfused path whatever --apply-rope-fusion says ("mscale=...
# is not supported by TE's fused RoPE. Using unfused implementation.", megatron/core/models/
# common/embeddings/rope_utils.py @d98e8a64, since 987395813b "Fixes for gpt-oss",
# 2025-11-22, and on core_dev_r0.15.0 as b1c616c9c2, the 25.11 container's),
# _apply_rotary_pos_emb_bshd in bf16: t * cos (read 2, write 2), the rotated half
# (-x2: 1 + 1, the cat: 2 + 2), * sin (2 + 2), the add (4 + 2), the final cat with the
# unrotated tail (2 + 2): 24 bytes per rotated element, where the fused kernel moves 4.
ROPE_SCALED_UNFUSED_BYTES = 24.0
# The clamped gated activation (gpt-oss, --activation-func-clamp-value): Megatron-Core clamps
# outside its fused kernel, x_glu.clamp and x_linear.clamp of the two halves then a torch.cat
# (megatron/core/fusions/fused_bias_geglu.py weighted_bias_quick_geglu_impl @d98e8a64): read
# and write each half (2 + 2, twice) and the cat's read and write of both (4 + 4), 16 bytes per
# element of the MLP width before the fused weighted GEGLU's own 6 (FUSED_GATED_ACT_BYTES).
CLAMPED_GATED_ACT_BYTES = FUSED_GATED_ACT_BYTES + 16.0


# --make-vocab-size-divisible-by's default (megatron/training/arguments.py)
MAKE_VOCAB_SIZE_DIVISIBLE_BY = 128


MEGATRON = Engine(
    name="megatron", title="Megatron-LM / Megatron-Core",
    # what planner.export.megatron writes of the model's attention and MTP modules (its
    # _attention: --mtp-num-layers)
    model_features=("head_dim", "mla", "sliding_window", "sinks", "mtp"),
    zero_stages=(0, 1, 2, 3), zero_stages_with_pp=(0, 1),
    max_tp=None, sp_choices=(False, True),
    schedules=("1f1b", "interleaved"), stage_layers=ANY_SPLIT,
    # --account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split count
    # the embedding and the loss as a layer each: (L + 2) / pp per rank, the first virtual
    # stage one decoder layer fewer (it may hold none), the last likewise (get_num_layers_to_
    # build); Megatron-Bridge's Llama 3.1 405B recipes run 126 layers at pp 16, vpp 8 so
    end_chunks_may_be_empty=True,
    # --cpu-offloading-num-layers N: the activations of a rank's first N layers to host memory
    # (transformer_block.py get_cpu_offload_context), N < its layers, pp 1, no recompute
    # (transformer_config.py; planner.rules activation_offload_problem)
    recompute=(("full", PER_CHUNK), ("selective", ALL_OR_NONE), ("offload", PER_STAGE)),
    # --recompute-modules (megatron/core/transformer/transformer_config.py)
    recompute_modules=RECOMPUTE_MODULES,
    overlap_grad_reduce=True, overlap_param_gather=True, tp_comm_overlap=True,
    # --tp-comm-overlap: megatron/training/initialize.py _initialize_tp_communicators calls
    # TE's initialize_ub(shape=[seq x micro-batch / cp, hidden], ...)
    tp_overlap_userbuffers=True,
    zero2_gathers_every_microbatch=False,
    # --moe-token-dispatcher-type alltoall | allgather (megatron/core/transformer/moe/
    # token_dispatcher.py) | flex with --moe-flex-dispatcher-backend deepep (fused_a2a.py);
    # --expert-tensor-parallel-size any divisor (MoE parallel folding);
    # --overlap-moe-expert-parallel-comm (megatron-core >= 0.14)
    moe_dispatchers=("alltoall", "allgather", "flex"), moe_etp="any", ep_comm_overlap=True,
    # Megatron-LM pads the tokenizer's vocabulary to a multiple of
    # --make-vocab-size-divisible-by (128) x tp before it builds the model
    # (megatron/core/tokenizers/utils/build_tokenizer.py vocab_size_with_padding;
    # megatron/training/vocab_utils.py calculate_padded_vocab_size): GPT-2's 50257 tokens are
    # 50304 at tp 1 and 50688 at tp 4. Megatron-Core's VocabParallelEmbedding then divides the
    # padded vocabulary over tp (megatron/core/tensor_parallel/utils.py
    # VocabUtility.vocab_range_from_global_vocab_size).
    vocab_split="pad", vocab_pad_multiple=MAKE_VOCAB_SIZE_DIVISIBLE_BY,
    moe_tp_needs_sp=True,   # megatron/training/arguments.py: "sequence parallel must be used
    # with MoE and tensor parallel"
    sources=(("zero_with_pp", "megatron/training/arguments.py (\"--use-torch-fsdp2 is not "
                              "supported with pipeline parallelism\"); Megatron-FSDP likewise: "
                              "\"FSDP and PP are mutually exclusive in Megatron's standard "
                              "path\" (examples/multimodal_dev/scripts/run_qwen35_vl.sh, "
                              "NVIDIA/Megatron-LM#6081)"),
             ("stage_layers", "megatron/training/arguments.py --pipeline-model-parallel-layout"),
             ("offload_activations_pp",
              "megatron/core/transformer/transformer_config.py __post_init__ (\"Currently there "
              "is no support for Pipeline parallelism with CPU offloading\")"),
             ("offload_activations_kept",
              "megatron/core/transformer/transformer_config.py __post_init__ (\"CPU offloading "
              "can be done only for layers less than\" num_layers)"),
             ("end_chunks_may_be_empty",
              "megatron/core/transformer/transformer_block.py get_num_layers_to_build (\"Reduce "
              "the number of layers to construct by 1 on the first (or last) stage if the "
              "embedding (or loss) layer is included in the pipeline parallelism partition\"; "
              "transformer_config.py account_for_embedding_in_pipeline_split, "
              "account_for_loss_in_pipeline_split; NVIDIA/Megatron-LM @d98e8a64)"),
             ("tp_splits_model", "megatron/core/tensor_parallel/layers.py ColumnParallelLinear / "
                                 "megatron/core/transformer/attention.py: divide() asserts tp "
                                 "divides the heads, the query groups and the FFN "
                                 "(megatron/core/utils.py ensure_divisibility)"),
             ("schedule", "megatron/core/pipeline_parallel/schedules.py (1F1B and interleaved; "
                          "no zero-bubble or DualPipe schedule: NVIDIA/Megatron-LM PR 5254 "
                          "closed unmerged)"),
             ("moe_tp_needs_sp", "megatron/training/arguments.py"),
             ("hsdp", "megatron/training/arguments.py --num-distributed-optimizer-instances "
                      "(with --use-distributed-optimizer)"),
             ("offload", "megatron/training/arguments.py --optimizer-cpu-offload (the "
                         "optimizer to CPU memory: megatron/core/optimizer/cpu_offloading/"
                         "hybrid_optimizer.py; no NVMe, no parameter offload); "
                         "megatron/core/optimizer/optimizer_config.py (\"--use-precision-aware-"
                         "optimizer only supported with distributed optimizer\")")),
    moe_capacity_factor=True, moe_saves_expert_outputs=False,
    moe_layer_overhead_s=MOE_LAYER_OVERHEAD_S, moe_expert_overhead_s=MOE_EXPERT_OVERHEAD_S,
    cp_comm_types=("p2p", "all_gather", "a2a"),
    weight_bytes=2.0, grad_bytes=4.0, optimizer_bytes=12.0,
    context_gib=CONTEXT_GIB, allocator_reserve=ALLOCATOR_RESERVE,
    # fused norms, RoPE and GELU / SwiGLU (Transformer Engine, --apply-rope-fusion,
    # --bias-activation-fusion); squared ReLU runs eager (planner.engines.eager RELU2_EAGER_BYTES)
    elementwise_kernels=ElementwiseKernels(relu2=RELU2_EAGER_BYTES,
                                           scaled_rope=ROPE_SCALED_UNFUSED_BYTES,
                                           clamped_gated_act=CLAMPED_GATED_ACT_BYTES,
                                           expert_bias=EXPERT_BIAS_EAGER_BYTES,
                                           expert_bias_fp32_probs=(
                                               EXPERT_BIAS_EAGER_FP32_PROBS_BYTES),
                                           lowp_expert_padding=LOWP_EXPERT_PADDING_BYTES),
    # --optimizer-cpu-offload --optimizer-offload-fraction 1.0 (with
    # --use-precision-aware-optimizer, which megatron/training/arguments.py requires of it):
    # the HybridDeviceOptimizer (megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py)
    # keeps this rank's fp32 master parameters and Adam states in CPU memory and steps them
    # there; the fp32 gradient buffer stays on the GPU and is copied out once per step, the
    # updated fp32 parameters copied back (param_update_in_fp32), the three overlapped with
    # --overlap-cpu-optimizer-d2h-h2d (megatron/core/optimizer/cpu_offloading/README.md).
    # CPU memory only, no NVMe; parameters are not offloaded.
    # --num-distributed-optimizer-instances N: N copies of the distributed optimizer, each
    # sharded over dp / N ranks (megatron/training/arguments.py; megatron/core/parallel_state.py
    # the intra / inter distributed-optimizer-instance groups), the gradients reduce-scattered
    # inside an instance and all-reduced across them (megatron/core/distributed/
    # param_and_grad_buffer.py)
    hsdp_zero_stages=(1,),
    offload_optimizer_devices=("cpu",), offload_overlaps_step=True,
    # megatron/core/optimizer/optimizer_config.py OptimizerConfig.__post_init__:
    # "--use-precision-aware-optimizer only supported with distributed optimizer"
    offload_needs_distributed_optimizer=True,
    offload_transfer_bytes=(4.0, 4.0),
    precisions=(("bf16", ()), ("fp8", ("tensorwise", "delayed")), ("mxfp8", ("mxfp8",)),
                ("nvfp4", ("nvfp4",))),
    lowp_library="te",
    # Megatron-Core's TE linears pass is_first_microbatch (extensions/transformer_engine.py
    # @d98e8a64: None only with TransformerConfig.disable_parameter_transpose_cache, default
    # False and no command-line flag, arguments.py; the schedules set it on each step's first
    # micro-batch, pipeline_parallel/schedules.py), so Transformer
    # Engine keeps each weight's quantised copy in the module (module/linear.py @d0067d0da:
    # cache_name "weight" unless is_first_microbatch is None or the module is under torch's
    # FSDP2, self._fp8_workspaces). Megatron-FSDP is not torch's FSDP2 and releases only FP8
    # primary weights' transpose caches (megatron_fsdp.py release_params_fp8_transpose_cache),
    # so under ZeRO-3 with bf16 weights every layer's copy of its gathered weight stays
    # (TE's own fix for FSDP2, 0a088c1d5 "Fix FSDP2 memory leaks for FP8 weight workspaces",
    # 2026-04, names the same growth). FP8 primary weights (--fp8-param-gather) keep none.
    gathered_lowp_copies="cached",
    # ... so its ZeRO-3 (Megatron-FSDP) runs FP8 primary weights, as every Megatron-Bridge
    # FSDP FP8 recipe does (--fp8-param-gather: mixed_precision.py presets set
    # fp8_param_gather = True; megatron_fsdp.py keeps the FP8 shards and drops the transposes
    # after each forward unless keep_fp8_transpose_cache): no bf16 weight to cache a copy of
    zero3_fp8_primary_weights=True,
    # Megatron-FSDP drops a per-tensor FP8 weight's transpose after each forward and makes it
    # again for the backward (megatron_fsdp.py release_params_fp8_transpose_cache unless
    # keep_fp8_transpose_cache, default False; mixed_precision.py fp8_need_transpose_data:
    # only MXFP8 keeps its column-wise data)
    zero3_drops_fp8_transposes=True,
    validation=validation_of("megatron"),
)
