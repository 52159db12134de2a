"""Compute time of one transformer layer, the embedding, the LM head and the optimizer step.

Per GPU (one tensor-parallel shard), per micro-batch of `b` sequences of `s` tokens.
Matmuls run at a shape-dependent fraction of peak, attention at the flash-attention fraction,
element-wise work at HBM bandwidth.
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.specs import Gpu, Model

BF16 = 2  # bytes per activation / weight element in mixed-precision training

# Backward of a matmul is two matmuls of the forward's size (grad wrt input and wrt weight):
# the standard 2x (Narayanan et al. 2021, Sec. 5.1: "backward pass is twice the forward").
GEMM_BWD_FACTOR = 2.0
# FlashAttention-2's backward does 5 matmuls against the forward's 2 (Dao 2023, Sec. 3.1).
ATTN_BWD_FACTOR = 2.5
# Element-wise kernels in backward read the saved input and the incoming gradient and write a
# gradient: about twice the forward's traffic.
ELEMENTWISE_BWD_FACTOR = 2.0

# A GEMM whose smallest dimension is d runs at d / (d + GEMM_HALF_DIM) of the large-GEMM
# efficiency: cuBLAS/CUTLASS tiles are 128-256 wide, so a dimension of a few tiles leaves
# SMs idle and waves partly empty (NVIDIA "Matrix Multiplication Background" user guide,
# sections on tile and wave quantization). 128 = one tile: half efficiency at one tile.
GEMM_HALF_DIM = 128.0

# A layer launches about twice as many kernels in backward as in forward (each matmul's two
# gradient GEMMs, element-wise backward kernels): a third of the per-layer host overhead is
# taken in forward.
OVERHEAD_FWD_SHARE = 1.0 / 3.0

# Adam step per parameter (fp32 master weights): read param, grad, m, v (16 B), write param,
# m, v (12 B) and the bf16 copy (2 B), plus the gradient-norm read for clipping (4 B).
OPTIMIZER_BYTES_PER_PARAM = 34.0


def gemm_time(gpu: Gpu, m: float, n: float, k: float, count: float = 1.0, lp=None) -> float:
    """Seconds for `count` GEMMs of (m x k) @ (k x n): the slower of compute and memory.

    `lp` (planner.precision.LowPrecision): the GEMM runs in FP8 / MXFP8 / NVFP4 at that
    format's peak and the recipe's share of the bf16 efficiency, reading quantised operands
    and writing a bf16 output."""
    flops = 2.0 * m * n * k * count
    d = min(m, n, k)
    shape = d / (d + GEMM_HALF_DIM)
    if lp is None:
        t_compute = flops / (gpu.tensor_peak_tflops * 1e12 * gpu.gemm_efficiency * shape)
        t_memory = BF16 * (m * k + k * n + m * n) * count / (gpu.hbm_gbps * 1e9)
    else:
        eff = gpu.gemm_efficiency * lp.recipe.gemm_scale * shape
        t_compute = flops / (lp.peak_tflops * 1e12 * eff)
        t_memory = (lp.element_bytes * (m * k + k * n) + BF16 * m * n) * count \
            / (gpu.hbm_gbps * 1e9)
    return max(t_compute, t_memory)


@dataclass(frozen=True)
class LayerTime:
    """Seconds for one layer and one micro-batch on one GPU."""
    gemm_fwd: float
    attn_fwd: float
    elem_fwd: float
    # forward GEMMs that torchtitan's per-op recompute policy ("op") runs again (planner.cost.
    # compute.op_recomputed_gemms)
    gemm_op_recomputed: float = 0.0
    # host-side cost per layer and micro-batch (kernel launches, hooks), forward + backward
    overhead: float = 0.0
    # low precision: the amax / quantising casts of the linears' operands (planner.precision
    # Recipe), forward and backward seconds
    cast_fwd: float = 0.0
    cast_bwd: float = 0.0
    # the "op" policy runs the attention's forward again (planner.engines.spec
    # op_recomputes_attention)
    op_recomputes_attention: bool = False
    # Profile hook: seconds measured by `python -m profiler` ({"fwd", "bwd", and the extra
    # backward of "selective" / "full" recompute}, planner.profile.Measured.layer_time). When
    # set they replace the modelled figures below; None = the catalog model.
    measured: dict | None = None

    @property
    def fwd(self) -> float:
        if self.measured is not None:
            return self.measured["fwd"]
        return (self.gemm_fwd + self.attn_fwd + self.elem_fwd + self.cast_fwd
                + OVERHEAD_FWD_SHARE * self.overhead)

    @property
    def bwd(self) -> float:
        if self.measured is not None:
            return self.measured["bwd"]
        return (GEMM_BWD_FACTOR * self.gemm_fwd + ATTN_BWD_FACTOR * self.attn_fwd
                + ELEMENTWISE_BWD_FACTOR * self.elem_fwd + self.cast_bwd
                + (1 - OVERHEAD_FWD_SHARE) * self.overhead)

    def recompute(self, mode: str) -> float:
        """Extra forward work that recomputation adds to the backward."""
        if self.measured is not None and mode in self.measured:
            return self.measured[mode]
        if mode == "full":
            return self.fwd
        if mode == "selective":   # only the attention core (Korthikanti et al. 2022, Sec. 4.2)
            return self.attn_fwd
        if mode == "op":          # every op but the saved matmuls (and attention)
            return (self.gemm_op_recomputed + self.elem_fwd + self.cast_fwd
                    + (self.attn_fwd if self.op_recomputes_attention else 0.0)
                    + OVERHEAD_FWD_SHARE * self.overhead)
        return 0.0


# ---- the model's attention shape (head_dim, MLA, sliding window): planner.specs.Model ----
def attention_width(model: Model) -> float:
    """The "h" of the attention-core FLOP formulas: heads x (query-key head + value head) / 2,
    which is hidden for a model whose heads are hidden / num_heads wide (MLA: 192 and 128)."""
    return model.num_heads * (model.head_dim + model.value_head_dim) / 2.0


def attended_keys(s: int, window: int = 0, causal: bool = True) -> float:
    """Keys a query attends to, averaged over the queries of a sequence of `s`: s/2 causal (s
    non-causal, as Megatron-LM counts model FLOPs); under a sliding window w < s a query sees
    at most w keys: (s*w - w^2/2)/s causal, w non-causal."""
    if not window or window >= s:
        return s / 2.0 if causal else float(s)
    return (s * window - window * window / 2.0) / s if causal else float(window)


def mean_attended_keys(model: Model, s: int, causal: bool = True) -> float:
    """Keys a query attends to, averaged over the queries and the layers (a sliding window's
    layers and the full-attention ones)."""
    full, w = attended_keys(s, 0, causal), model.sliding_window
    if not w or w >= s:
        return full
    share = model.num_sliding_layers / model.num_layers
    return share * attended_keys(s, w, causal) + (1.0 - share) * full


def attention_rolloff(gpu: Gpu, keys: float) -> float:
    """keys / (keys + gpu.attn_half_keys): the share of its long-sequence rate fused attention
    keeps when each query attends `keys` keys. A query's key loop is the kernel's inner loop;
    its fixed work per query tile (loading Q, the softmax's final rescale, writing O) and the
    partly masked tiles on a causal diagonal or a window's edge are amortised over it, so the
    rate falls with fewer keys (measured: planner.catalog.gpus, Blackwell). attn_half_keys 0:
    1 at every length."""
    h = gpu.attn_half_keys
    return keys / (keys + h) if h > 0 else 1.0


def attention_efficiency(gpu: Gpu, keys: float) -> float:
    """The fraction of the tensor-core peak fused attention reaches when each query attends
    `keys` keys: gpu.attn_efficiency, the long-sequence figure, times attention_rolloff."""
    return gpu.attn_efficiency * attention_rolloff(gpu, keys)


def attention_flops(model: Model, b: int, s: int) -> float:
    """Forward FLOPs of QK^T and PV of one (average) layer for a causal mask: 2 matmuls of
    2*b*s*keys*width each; 4*b*s*(s/2)*h for full attention (flash skips the masked half)."""
    return 4.0 * b * s * mean_attended_keys(model, s) * attention_width(model)


def attention_projection_times(model: Model, gpu: Gpu, tokens: float, tp: int, lp=None) -> tuple:
    """(q, k, v, out) forward GEMM seconds of one layer's attention projections on one GPU:
    q num_heads*head_dim wide, k and v kv_dim, out from num_heads*value_head_dim. MLA
    (Model.q_lora_rank): the down projections (q_a, kv_a) replicated across tensor parallel
    ranks as Megatron-LM's MLASelfAttention builds them (linear_q_down_proj,
    linear_kv_down_proj), the up projections and the output sharded by heads; q counts
    q_a + q_b, k kv_a, v kv_b."""
    h = model.hidden
    if model.is_mla:
        r = model.q_lora_rank
        q_up, v = mla_up_projection_times(model, gpu, tokens, tp, lp)
        q = gemm_time(gpu, tokens, r, h, lp=lp) + q_up if r else q_up
        k = gemm_time(gpu, tokens, model.kv_lora_rank + model.qk_rope_head_dim, h, lp=lp)
    else:
        q = gemm_time(gpu, tokens, model.q_dim / tp, h, lp=lp)
        k = v = gemm_time(gpu, tokens, model.kv_dim / tp, h, lp=lp)
    out = gemm_time(gpu, tokens, h, model.attn_out_dim / tp, lp=lp)
    return q, k, v, out


def mla_up_projection_times(model: Model, gpu: Gpu, tokens: float, tp: int, lp=None) -> tuple:
    """(q, kv) forward GEMM seconds of MLA's up projections on one GPU (sharded by heads):
    q_b from the q latent (q_lora_rank 0: the one q projection from the hidden state), kv_b
    from the kv latent to each head's k_nope and value."""
    src = model.q_lora_rank or model.hidden
    q = gemm_time(gpu, tokens, model.q_dim / tp, src, lp=lp)
    kv = gemm_time(gpu, tokens, model.num_heads * (model.qk_nope_head_dim + model.v_head_dim)
                   / tp, model.kv_lora_rank, lp=lp)
    return q, kv


# HBM bytes per element of a fused element-wise kernel's forward: it reads its bf16 input once
# and writes its bf16 output once (a norm, RoPE, a GELU); the gated activation reads the gate
# and up outputs and writes one, 6 bytes per element of the MLP width.
FUSED_OP_BYTES = 2 * BF16
FUSED_GATED_ACT_BYTES = 3 * BF16


@dataclass(frozen=True)
class ElementwiseKernels:
    """How an engine's model code runs the element-wise ops whose kernels differ between
    engines: HBM bytes per element of each op's forward. The default is fused (Transformer
    Engine and Megatron's fusions, or torch.compile's Inductor): one kernel per op. Eager
    PyTorch runs an op written as several tensor expressions as one kernel per expression,
    each reading and writing the whole tensor (planner.engines.eager: which code runs which).
    LayerNorm, GELU and the residual adds are one kernel either way (aten's native layer_norm
    and gelu)."""
    rmsnorm: float = FUSED_OP_BYTES         # per element of the hidden state
    rope: float = FUSED_OP_BYTES            # per element of the rotated queries and keys
    # per element of the rotated queries and keys where the RoPE scales them by an attention
    # factor other than 1 (YaRN's: Model.rope_attention_factor) and the engine's fused kernel
    # does not take one; None: `rope`
    scaled_rope: float | None = None
    gated_act: float = FUSED_GATED_ACT_BYTES  # per element of the MLP width
    # per element of the MLP width: the gated activation with a clamp (Model.activation_clamp,
    # gpt-oss's: the one catalog model with a clamp, whose GLU Megatron runs as quick-GEGLU with
    # the clamp apart) where the engine runs the clamp apart; None: `gated_act`
    clamped_gated_act: float | None = None
    relu2: float = FUSED_OP_BYTES           # per element of the MLP width: squared ReLU
    # per element of the routed experts' output rows (rows x hidden): the down projection's
    # bias weighted by the routing probability (gpt-oss), forward; its backward moves as much.
    # 0: not priced (an engine whose bias add is not known; Megatron's is its eager loop,
    # planner.engines.megatron)
    expert_bias: float = 0.0
    # the same where the routing probabilities are fp32 (the flex dispatcher's); None: as
    # `expert_bias`
    expert_bias_fp32_probs: float | None = None
    # per element of the routed experts' rows (rows x hidden) under a low-precision recipe:
    # the copies that pad each expert's rows to the quantisation's alignment before the
    # grouped GEMM and unpad its output, where the dispatcher leaves them unaligned (the
    # alltoall); forward, and as much again in backward
    lowp_expert_padding: float = 0.0


FUSED_KERNELS = ElementwiseKernels()


def rope_width(model: Model, tp: int) -> float:
    """Elements per token RoPE rotates on one tensor-parallel rank: the rope part of the heads
    (MLA: qk_rope_head_dim of every query head and the one shared key; else the whole head of
    the q and k heads); 0 without RoPE."""
    if model.position != "rope":
        return 0.0
    if model.is_mla:
        return (model.num_heads / tp + 1) * model.qk_rope_head_dim
    return (model.q_dim + model.kv_dim) / tp


def rope_bytes(model: Model, kernels: ElementwiseKernels = FUSED_KERNELS) -> float:
    """HBM bytes per rotated element of the model's RoPE forward as the engine runs it: its
    scaled kernel where YaRN's attention factor is not 1."""
    if model.rope_attention_factor != 1.0 and kernels.scaled_rope is not None:
        return kernels.scaled_rope
    return kernels.rope


def rope_time(model: Model, gpu: Gpu, tokens: float, tp: int,
              kernels: ElementwiseKernels = FUSED_KERNELS) -> float:
    """Forward seconds of RoPE on this rank's queries and keys as the engine runs it
    (rope_bytes): what Megatron's selective recompute of MLA's up projections runs again."""
    return rope_bytes(model, kernels) * tokens * rope_width(model, tp) / (gpu.hbm_gbps * 1e9)


def mlp_activation_bytes(model: Model, tokens: float, tp: int,
                         kernels: ElementwiseKernels = FUSED_KERNELS) -> float:
    """HBM bytes of one dense MLP's activation in forward on one tensor-parallel shard: the
    gated activation (SwiGLU: silu of the gate times the up output) or the plain one."""
    return tokens * activation_bytes_per_element(model, kernels) * model.ffn_hidden / tp


def activation_bytes_per_element(model: Model,
                                 kernels: ElementwiseKernels = FUSED_KERNELS) -> float:
    """HBM bytes of an MLP activation's forward per element of its width (a dense MLP's, an
    expert's, a shared expert's): the gated one and squared ReLU as the engine runs them, any
    other plain one a kernel (GELU: aten's own)."""
    if model.gated_mlp:
        if model.activation_clamp and kernels.clamped_gated_act is not None:
            return kernels.clamped_gated_act
        return kernels.gated_act
    return kernels.relu2 if model.activation == "relu2" else FUSED_OP_BYTES


def elementwise_bytes(model: Model, tokens: float, tp: int, sp: bool,
                      traffic: float = 1.0,
                      kernels: ElementwiseKernels = FUSED_KERNELS) -> float:
    """HBM bytes moved by one layer's element-wise kernels in forward.

    Norms and residual adds see the full hidden state (sharded only under sequence parallel);
    rotary embedding and the MLP activation see the tensor-parallel shard. `kernels`: how the
    engine's code runs the norms, RoPE and the gated activation (ElementwiseKernels);
    `traffic` scales the whole for what else eager code moves (the engine's fitted
    `elementwise_traffic`).
    """
    h = model.hidden
    rep = 1.0 / tp if sp else 1.0
    norm = kernels.rmsnorm if model.norm == "rmsnorm" else FUSED_OP_BYTES
    norms = 2 * norm * h                                 # two norms
    residual = BF16 * 2 * (3 * h)                        # two adds: read 2, write 1
    dropout = BF16 * 2 * (2 * h + h) if model.dropout > 0 else 0  # read, write, mask
    rope = rope_bytes(model, kernels) * rope_width(model, tp)
    return traffic * (tokens * ((norms + residual + dropout) * rep + rope)
                      + mlp_activation_bytes(model, tokens, tp, kernels))


# Unfused attention (Megatron-LM before FlashAttention, 2022): per score element the fused
# scale-mask-softmax kernel reads the fp16 scores and writes the probabilities (2 + 2 bytes), and
# dropout writes a 1-byte mask and the 2-byte output, read again by the PV matmul (2 bytes).
EAGER_SOFTMAX_BYTES = 2 + 2 + 1 + 2 + 2


def attention_time(model: Model, gpu: Gpu, b: int, s: int, tp: int, flash: bool = True,
                   cp: int = 1) -> float:
    """Forward seconds of the attention core (QK^T, softmax, PV) on one GPU. Flash: the FLOPs
    (attention_flops) at the efficiency of the keys a query attends, the layers' mean: a layer
    kind's seconds are its FLOPs over a rate proportional to keys / (keys + attn_half_keys),
    so linear in its keys, and the mean prices a mix of windowed and full layers exactly.
    `cp`: a context-parallel rank's share, 1/cp of the FLOPs (load-balanced) at the whole
    sequence's rate. Ulysses (a2a) and the all-gather kind attend the whole sequence; the p2p
    ring's kernels attend one chunk of s/cp keys a step, which where the GPU has a roll-off
    (attention_rolloff) runs a little slower, not priced: at most 3% on GB200 for cp 2-8 at
    8K-128K tokens."""
    heads = model.num_heads / tp
    if flash:
        return attention_flops(model, b, s) / tp / cp / (
            gpu.tensor_peak_tflops * 1e12
            * attention_efficiency(gpu, mean_attended_keys(model, s)))
    d = model.head_dim
    # two batched GEMMs over the full (unmasked) s x s scores, k = head_dim for QK^T
    gemms = gemm_time(gpu, s, s, d, b * heads) + gemm_time(gpu, s, d, s, b * heads)
    drop = EAGER_SOFTMAX_BYTES if model.dropout > 0 else EAGER_SOFTMAX_BYTES - 3
    softmax = drop * b * heads * s * s / (gpu.hbm_gbps * 1e9)
    return (gemms + softmax) / cp


def layer_time(model: Model, gpu: Gpu, b: int, s: int, tp: int, sp: bool,
               flash: bool = True, elementwise_traffic: float = 1.0,
               overhead: float = 0.0, lp=None, cp: int = 1,
               kernels: ElementwiseKernels = FUSED_KERNELS) -> LayerTime:
    """`lp` (planner.precision.LowPrecision): the block linears run in low precision with
    their scaling casts; attention, norms and the other element-wise work stay bf16.

    `cp`: context parallelism. Every linear, norm and element-wise op of a CP rank sees its
    s/cp tokens; causal attention is load-balanced by splitting the sequence into 2*cp chunks
    and giving rank i chunks i and 2*cp-1-i (Megatron-Core / Transformer Engine's zigzag
    layout, megatron/core/utils.py get_batch_on_this_cp_rank; torch's _HeadTailLoadBalancer),
    so each rank does 1/cp of the causal attention FLOPs -- in p2p and all-gather CP as in
    Ulysses (a2a), where each rank attends the whole sequence with heads/cp."""
    tokens = b * s / cp
    h, f = model.hidden, model.ffn_hidden
    q, k, v, out = attention_projection_times(model, gpu, tokens, tp, lp)
    up = gemm_time(gpu, tokens, f / tp, h, lp=lp)           # each of up and gate
    down = gemm_time(gpu, tokens, h, f / tp, lp=lp)
    gated = model.gated_mlp
    gemm = q + k + v + out + (2 if gated else 1) * up + down
    attn = attention_time(model, gpu, b, s, tp, flash, cp)
    elem = elementwise_bytes(model, tokens, tp, sp, elementwise_traffic, kernels) \
        / (gpu.hbm_gbps * 1e9)
    cast_fwd, cast_bwd = cast_times(model, gpu, tokens, tp, lp)
    return LayerTime(gemm, attn, elem, op_recomputed_gemms(k, out, up, down, gated), overhead,
                     cast_fwd=cast_fwd, cast_bwd=cast_bwd)


def linear_io_elements(model: Model, tokens: float, tp: int) -> tuple:
    """(input elements, output elements) of one layer's block linears on one GPU, per
    micro-batch: QKV and MLP-in read the full hidden state, out-proj and MLP-down their
    tensor-parallel shard."""
    h, kv = model.hidden, model.kv_dim
    mlp_in, mlp_out = mlp_io_elements(tokens, h, model.ffn_hidden / tp, model.gated_mlp)
    inputs = tokens * (h + model.attn_out_dim / tp) + mlp_in     # qkv, proj, fc1, fc2
    outputs = tokens * ((model.q_dim + 2 * kv) / tp + h) + mlp_out
    return inputs, outputs


def mlp_io_elements(tokens: float, hidden: int, ffn: float, gated: bool) -> tuple:
    """(input elements, output elements) of one MLP's two linears (fc1 from the hidden state,
    fc2 from its `ffn`-wide shard; a gated fc1 twice as wide) over `tokens` rows."""
    return tokens * (hidden + ffn), tokens * ((2 if gated else 1) * ffn + hidden)


def linear_cast_times(gpu: Gpu, lp, inputs: float, outputs: float, weights: float) -> tuple:
    """(forward, backward) seconds of a low-precision recipe's scaling and casts of linears
    with `inputs` input and `outputs` output elements and `weights` parameters
    (planner.precision.Recipe): every input in forward, every output gradient (and, where the
    library re-casts, the input) in backward, the weights where cast per micro-batch.
    Memory-bound, at HBM bandwidth."""
    if lp is None:
        return 0.0, 0.0
    r = lp.recipe
    bw = gpu.hbm_gbps * 1e9
    fwd = (r.cast_in_bytes * inputs + 0.5 * r.weight_cast_bytes * weights) / bw
    bwd = ((r.cast_grad_bytes * outputs + r.recast_in_bytes * inputs
            + 0.5 * r.weight_cast_bytes * weights) / bw)
    return fwd, bwd


def cast_times(model: Model, gpu: Gpu, tokens: float, tp: int, lp) -> tuple:
    """(forward, backward) seconds of a low-precision recipe's casts in one layer's block
    linears (linear_cast_times)."""
    if lp is None:
        return 0.0, 0.0
    inputs, outputs = linear_io_elements(model, tokens, tp)
    weights = model.attn_matmul_params_on_rank(tp) + model.mlp_matmul_params() / tp
    return linear_cast_times(gpu, lp, inputs, outputs, weights)


def op_recomputed_gemms(k: float, out: float, up: float, down: float, gated: bool) -> float:
    """Forward GEMM seconds that torchtitan's per-op policy recomputes.

    torchtitan's op-level selective checkpointing (torchtitan/distributed/activation_checkpoint.py,
    `_get_custom_policy`) saves the outputs of attention and of every second `mm` of a layer, in
    call order wq, wk, wv, wo, w1, w3, w2: the 2nd, 4th and 6th (wk, wo, w3) are recomputed, with
    every element-wise op. An ungated MLP (fc1, fc2) makes fc1 the 5th and fc2 the 6th."""
    return k + out + (up if gated else down)


# Vocabulary-parallel cross-entropy in fp32 (megatron/core/tensor_parallel/cross_entropy.py),
# bytes per logit. Forward: cast bf16 logits to fp32 (read 2, write 4), max (read 4), subtract
# the max (4 + 4), exp (4 + 4), sum (4), normalise to the saved softmax (4 + 4): 38.
# Backward: scale the saved softmax by the incoming gradient (4 + 4), cast to bf16 for the
# head's matmul (4 + 2): 14.
CE_BYTES_FWD = 38.0
CE_BYTES_BWD = 14.0


def head_time(model: Model, gpu: Gpu, b: int, s: int, tp: int,
              ce_bytes: tuple = (CE_BYTES_FWD, CE_BYTES_BWD)) -> tuple:
    """(forward, backward) seconds of final norm, LM head GEMM and cross-entropy, the loss's
    kernels moving `ce_bytes` (forward, backward) per logit (the engine's LossMemory traffic;
    the unfused fp32 one by default)."""
    tokens = b * s
    gemm = gemm_time(gpu, tokens, model.vocab_size / tp, model.hidden)
    logits = tokens * model.vocab_size / tp
    bw = gpu.hbm_gbps * 1e9
    norm = 2 * BF16 * tokens * model.hidden / bw
    fwd = gemm + ce_bytes[0] * logits / bw + norm
    return fwd, GEMM_BWD_FACTOR * gemm + ce_bytes[1] * logits / bw + ELEMENTWISE_BWD_FACTOR * norm


def embedding_time(model: Model, gpu: Gpu, b: int, s: int, tp: int) -> tuple:
    """(forward, backward): a gather of rows and its scatter-add, memory-bound."""
    t = BF16 * b * s * model.hidden / (gpu.hbm_gbps * 1e9)
    return t, 2 * t + BF16 * model.vocab_size * model.hidden / tp / (gpu.hbm_gbps * 1e9)


def optimizer_time(gpu: Gpu, params_local: float) -> float:
    return OPTIMIZER_BYTES_PER_PARAM * params_local / (gpu.hbm_gbps * 1e9)
