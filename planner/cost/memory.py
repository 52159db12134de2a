"""Memory per GPU: model states under ZeRO and saved activations per layer.

Model states: Rajbhandari et al. 2020 (ZeRO), Sec. 3.1 and Fig. 1, mixed-precision Adam:
2 bytes of bf16 weights, 2 of bf16 gradients and K = 12 of optimizer state (fp32 master
weights, momentum, variance) per parameter, divided over the Nd data-parallel ranks by stage.

Activations: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models"), Sec. 4 and Table 2, generalised term by term to grouped-query attention, gated
MLPs, heads whose width is not hidden / heads (an explicit head_dim; MLA's nope + rope keys and
v_head_dim values) and MLA's compressed latents; for a GPT layer (no GQA, 4h plain MLP,
dropout) it reduces to the paper's s*b*h*(34 + 5*a*s/h) bytes.
"""
from __future__ import annotations

from planner.specs import Model

GIB = 2.0 ** 30
ADAM_K = 12            # bytes of optimizer state per parameter (ZeRO paper, K = 12)
WEIGHT_BYTES = 2       # bf16 weights
GRAD_BYTES = 2         # bf16 gradients (ZeRO paper's accounting)


def gathered_copies_whole(engine, lp, recompute: str) -> bool:
    """Whether a plan's quantised copies of its ZeRO-3-gathered weights are held whole, every
    layer's (Engine.gathered_lowp_copies): cached for the step (Megatron-Core's TE modules
    under Megatron-FSDP), or saved for the backward by layers not recomputed (llm-foundry's,
    whose recompute is every layer or none); never beside FP8 primary weights."""
    if lp is None or lp.primary_weights:
        return False
    kept = engine.gathered_lowp_copies
    return kept == "cached" or (kept == "saved" and recompute == "none")


def weight_copy_bytes(lp, zero: int, *linears: tuple, whole: bool = False) -> float:
    """Bytes per GPU of a low-precision recipe's quantised weight copies (planner.precision
    Recipe.weight_copy_bytes: Transformer Engine's cached FP8 weights, negative where FP8
    primary weights are smaller than bf16 ones) of `linears`, (linear parameters on this GPU,
    the ZeRO shard group they are sharded over) pairs: the shard this GPU holds under ZeRO-3,
    or the whole copy where the copies of the gathered weights are held (`whole`:
    gathered_copies_whole)."""
    if lp is None or not lp.recipe.weight_copy_bytes:
        return 0.0
    sharded = zero >= 3 and not whole
    return lp.recipe.weight_copy_bytes * sum(n / (shards if sharded else 1)
                                             for n, shards in linears)


# Transformer Engine's userbuffers for the TP overlap (transformer_engine/pytorch/module/
# base.py initialize_ub @d0067d0da): one communicator for each of 12 GEMMs of a layer (qkv,
# proj, fc1, fc2 x fprop, dgrad, wgrad), each with a buffer of the whole gathered input shape
# (common/comm_gemm_overlap/comm_gemm_overlap.cpp: CommOverlapBase and CommOverlapP2PBase
# allocate shape[0] x shape[1] elements, more only for a ring-exchange reduce-scatter, which
# no default is), allocated by userbuffers itself (userbuffers-host.cpp
# register_user_buffer_collective: cudaMalloc / cuMemCreate), outside PyTorch's allocator.
# Under FP8 the 8 all-gather overlaps' buffers are FP8 (1 byte: layers_all_gather_overlap,
# fp8_buf) and the 4 reduce-scatter ones' bf16; in bf16 (and NVFP4, whose quantization mode is
# NONE: Megatron passes FP8 only with --fp8-format) all 12 are bf16.
USERBUFFER_AG_GEMMS = 8
USERBUFFER_RS_GEMMS = 4


def userbuffer_bytes(tokens: float, hidden: int, fp8: bool) -> float:
    """Bytes of Transformer Engine's TP-overlap userbuffers on one GPU, for `tokens` (a
    micro-batch's sequence on this context-parallel rank, seq x micro-batch / cp, the shape
    Megatron gives initialize_ub) of `hidden` wide; `fp8`: the plan runs an FP8 recipe
    (per-tensor or MXFP8)."""
    ag = 1.0 if fp8 else 2.0
    return tokens * hidden * (USERBUFFER_AG_GEMMS * ag + USERBUFFER_RS_GEMMS * 2.0)


def model_state_bytes(params: float, dp: int, zero: int, grad_bytes: float = GRAD_BYTES,
                      weight_bytes: float = WEIGHT_BYTES, optimizer_bytes: float = ADAM_K,
                      compute_copy_bytes: float = 0.0, autocast_copy_bytes: float = 0.0) -> tuple:
    """(weights, gradients, optimizer) bytes per GPU for `params` parameters on this GPU.

    Defaults are the ZeRO paper's 2 + 2 + 12. `grad_bytes` 4: engines that accumulate fp32
    gradients (Megatron-LM in bf16) keep 18 bytes per parameter without and 6 + 12/d with the
    distributed optimizer (Megatron-LM docs, distributed optimizer). FSDP engines keep the fp32
    sharded parameter as the master (`weight_bytes` 4, `optimizer_bytes` 8: Adam's m and v) and,
    where ZeRO-2 keeps the parameters gathered (SHARD_GRAD_OP), a bf16 unsharded copy of
    `compute_copy_bytes` per parameter; ZeRO-1 shards the optimizer state, ZeRO-2 also the
    gradients, ZeRO-3 also the weights. Under ZeRO-0/1 an engine that keeps fp32 weights and
    computes under bf16 autocast also holds autocast's cached bf16 casts of them for the step,
    `autocast_copy_bytes` per parameter."""
    w, g, o = weight_bytes * params, grad_bytes * params, optimizer_bytes * params
    if zero >= 1:
        o /= dp
    if zero >= 2:
        g /= dp
    if zero >= 3 or (zero == 2 and compute_copy_bytes):
        w /= dp
    if zero == 2:
        w += compute_copy_bytes * params
    if zero <= 1:
        w += autocast_copy_bytes * params
    return w, g, o


def activation_terms(model: Model) -> tuple:
    """Saved bytes per token of one layer, split into parts (per 1 token, batch 1).

    Returns (replicated, sharded, scores_per_token_per_seq):
      replicated  -- tensors outside the tensor-parallel region (norm inputs, the inputs of the
                     QKV and MLP-in projections, dropout masks after row-parallel linears):
                     divided by t only under sequence parallelism;
      sharded     -- tensors inside the region (Q, K, V, the out-proj input, MLP
                     intermediates): divided by t;
      scores      -- bytes per token per attended position for the attention matrix
                     (softmax output, dropout mask and output), times s*a/t; zero under flash
                     attention or selective recompute.
    """
    h, f = model.hidden, model.ffn_hidden
    drop = model.dropout > 0
    # norms (2 inputs, 2 B each) + QKV input + MLP input, + 2 one-byte dropout masks
    replicated = 2 * h + 2 * h + 2 * h + 2 * h + (2 * h if drop else 0)
    # Q and K for QK^T, V, the out-proj input, each as wide as the model's heads make it
    # (head_dim need not be hidden / num_heads; MLA's keys are nope + rope, its values v_head_dim)
    attn = 2 * model.q_dim + 2 * model.kv_dim + 2 * model.value_dim + 2 * model.attn_out_dim
    # gated: gate and up outputs + activation output (3 x 2f); plain: act input + output (2 x 2f)
    mlp = 6 * f if model.gated_mlp else 4 * f
    sharded = attn + mlp
    # per head per attended position: softmax output 2 B (+ dropout mask 1 B + output 2 B)
    scores = 5 if drop else 2
    return replicated, sharded, scores


def activation_bytes(model: Model, b: int, s: int, tp: int, sp: bool, mode: str,
                     flash: bool = True, gathered_inputs: bool = False,
                     op_recomputes_attention: bool = False) -> float:
    """Saved-activation bytes of one layer for one micro-batch, on one GPU.

    mode: "none" keeps everything; "selective" recomputes the attention core, so the s^2 score
    terms are not kept; "full" keeps only the layer input (2sbh, /t under sequence parallel);
    "op" is torchtitan's per-op policy (`op_saved_terms`); "offload" keeps nothing on the GPU
    (planner.cost.offload).
    `flash=False` reproduces the paper, which materialises the attention scores.
    `gathered_inputs`: under sequence parallelism the QKV and MLP-in linears keep their
    all-gathered input (planner.engines.spec sp_keeps_gathered_inputs), not a 1/t shard.
    `op_recomputes_attention`: the "op" policy recomputes the attention kernel, whose output
    and log-sum-exp are then not kept (planner.engines.spec op_recomputes_attention).
    """
    tokens = b * s
    if mode == "offload":     # every tensor the layer saves goes to the host (offload.py)
        return 0.0
    if mode == "full":
        return 2.0 * tokens * model.hidden / (tp if sp else 1)
    rep, shard, scores = (op_saved_terms(model, op_recomputes_attention) if mode == "op"
                          else activation_terms(model))
    total = tokens * (rep / (tp if sp else 1) + shard / tp + mla_latent_bytes(model))
    if sp and gathered_inputs and tp > 1 and mode in ("none", "selective"):
        total += tokens * sp_gathered_input_bytes(model) * (1 - 1 / tp)
    if not flash and mode == "none":
        total += scores * model.num_heads * s * tokens / tp
    return total + saved_lse_bytes(model, tokens, tp, mode, flash, op_recomputes_attention)


def saved_lse_bytes(model: Model, tokens: float, tp: int, mode: str, fused: bool,
                    op_recomputes_attention: bool = False) -> float:
    """The fp32 log-sum-exp per head and token a fused (flash) attention keeps for its
    backward (Dao et al. 2022), where the attention's outputs are saved: not under full
    recompute, nor under selective recompute (the attention core runs again in backward, so
    its kernel saves nothing: Megatron-Core's checkpointed core attention), nor under the "op"
    policy where it recomputes the attention kernel."""
    if not fused or mode in ("full", "selective") or (mode == "op" and op_recomputes_attention):
        return 0.0
    return 4.0 * model.num_heads * tokens / tp


def mla_latent_bytes(model: Model) -> float:
    """Saved bytes per token of multi-head latent attention's compressed latents (bf16), whole
    on every tensor-parallel rank: the down projections are replicated over tp and their
    outputs all-gathered under sequence parallelism (Megatron-Core multi_latent_attention.py;
    DeepseekV3Attention). The q latent twice (q_a_proj's output, the RMSNorm's input; the
    norm's output, q_b_proj's input), the kv one as kv_a_proj_with_mqa wrote it (latent + the
    shared rope key; the norm reads a view of it) and the normed latent kv_b_proj reads.
    Measured on our runtime (tests/test_memory.py)."""
    if not model.is_mla:
        return 0.0
    return 2.0 * (2 * model.q_lora_rank + model.kv_lora_rank + model.qk_rope_head_dim
                  + model.kv_lora_rank)


def sp_gathered_input_bytes(model: Model, qkv: bool = True, mlp_in: bool = True) -> float:
    """Bytes per token of the column-parallel linears' inputs (QKV and MLP-in, bf16) among
    `activation_terms`' replicated ones: what a TP that keeps them gathered holds whole."""
    return 2 * model.hidden * (int(qkv) + int(mlp_in))


def op_saved_terms(model: Model, recomputes_attention: bool = False) -> tuple:
    """Saved bytes per token of one layer under torchtitan's per-op checkpoint policy, split as
    `activation_terms` splits them.

    The policy (torchtitan/distributed/activation_checkpoint.py) saves the outputs of attention
    and of every odd-numbered `mm` in call order (wq, wv, w1, w2 for a gated MLP; wq, wv, fc1 for
    a plain one), and the checkpointed layer's input; everything else is recomputed.
    Replicated: the layer input and (gated) w2's output before its reduction; sharded: q, v, the
    attention output (not where the policy recomputes the attention kernel,
    `recomputes_attention`: planner.engines.spec op_recomputes_attention) and w1's output."""
    h, f = model.hidden, model.ffn_hidden
    replicated = 2 * h + (2 * h if model.gated_mlp else 0)
    sharded = (2 * model.q_dim + 2 * model.value_dim + 2 * f
               + (0 if recomputes_attention else 2 * model.attn_out_dim))
    return replicated, sharded, 0


def logits_bytes(model: Model, b: int, s: int, tp: int) -> float:
    """fp32 logits of the last stage for one micro-batch (vocabulary split over tp)."""
    return 4.0 * b * s * model.vocab_size / tp


def head_input_bytes(model: Model, b: int, s: int, tp: int, sp: bool, gathered: bool,
                     elem_bytes: float) -> tuple:
    """(norm, projection): what the last stage's final norm and output projection save for
    backward, one micro-batch: the norm's input (the last layer's output, which no layer's
    activations count; sequence-split under sequence parallelism) and the projection's input
    (under sequence parallelism sequence-split where the engine all-gathers it again in
    backward, Megatron's ColumnParallelLinear; whole where it keeps the all-gathered input,
    `gathered`: PyTorch's DTensor ColwiseParallel)."""
    tokens = elem_bytes * b * s * model.hidden
    return tokens / (tp if sp else 1), tokens / (tp if sp and not gathered else 1)


def lowp_saved_input_savings(model: Model, b: int, s: int, tp: int, sp: bool, mode: str,
                             element_bytes: float, gathered_inputs: bool = False,
                             attention_keeps_output: bool = False) -> float:
    """Bytes of one layer's saved activations that a recipe saving its linears' quantised
    inputs (Transformer Engine: the FP8 input of each linear for its weight gradient) does not
    keep in bf16: the QKV and MLP-in inputs (replicated; /t under sequence parallel), the
    out-proj and MLP-down inputs (sharded). Nothing under full recompute (only the layer input
    is kept).

    `attention_keeps_output`: a fused attention kernel saved its bf16 output for its own
    backward (flash-attn's and Transformer Engine's FusedAttnFunc `out_save`,
    transformer_engine/pytorch/attention.py @v1.8), and the out-proj's input is that output
    (a view of it): it stays, and the linear's quantised copy (`saved_inputmat`,
    transformer_engine/pytorch/module/linear.py @v1.8) comes on top of it. Not where the
    attention is recomputed (selective) and so saves nothing of its own."""
    if mode not in ("none", "selective"):
        return 0.0
    h, f = model.hidden, model.ffn_hidden
    d = 2.0 - element_bytes
    out_proj = -element_bytes if attention_keeps_output and mode == "none" else d
    return b * s * (d * 2 * h / (tp if sp and not gathered_inputs else 1)
                    + (out_proj * model.attn_out_dim + d * f) / tp)
