"""The decoder the runtime trains, built from a `planner.specs.Model`.

Plain PyTorch and nothing about parallelism (torchtitan style): `runtime.parallelize` and
`runtime.pipeline` apply TP/SP, FSDP, activation checkpointing and pipeline splitting from
outside. The layout-relevant conventions are:

* layers live in `Transformer.layers`, an `nn.ModuleDict` keyed by the *global* layer index, so a
  pipeline stage that keeps only some layers keeps the fully-qualified parameter names;
* attention reshapes with `-1` heads, so column-sharded q/k/v projections just work;
* `tok_embeddings`, `pos_embeddings`, `norm` and `output` may be `None` (pipeline stages);
* with tied embeddings `output.weight` *is* `tok_embeddings.weight` in a whole model; a pipeline
  stage that has the output but not the embedding keeps its own copy (see `runtime.pipeline`).

Covers the Llama family (RMSNorm, RoPE, GQA, SwiGLU) and the GPT family (LayerNorm, GELU MLP,
learned positions, biases), relu2 activations and parallel residuals, and mixtures of experts
(`MoEFeedForward` on the layers `Model.moe_layer` names: top-k router, stacked expert weights,
shared experts, expert/router biases; `runtime.expert` splits the experts over ep ranks
and each expert over the tp ranks), and
attention beyond Llama's: an explicit head_dim (`Model.head_dim_override`), sliding windows on
`Model.sliding_layer(i)`, attention sinks, multi-head latent attention (`MLAttention`). ALiBi
and multi-token prediction are refused.

Parameters are initialised by `init_full_tensor(name, shape, spec, seed)`: each full tensor comes
from a generator seeded by (seed, parameter name), so every layout starts from the same weights.
"""
from __future__ import annotations

import hashlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from planner.specs import Model


class UnsupportedModel(ValueError):
    pass


def check_supported(spec: Model) -> None:
    if spec.position == "alibi":
        raise UnsupportedModel(f"model {spec.name}: ALiBi position embeddings are not supported by "
                               f"the runtime (rope and learned are)")


class _RMSNormFn(torch.autograd.Function):
    """RMSNorm in fp32 that saves only its input for backward (the cost model's 2 bytes per
    element of the norm input, planner.cost.memory.activation_terms) and recomputes the
    reciprocal RMS there; autograd through the eager ops would also keep the fp32 copy, the
    normalised output and the RMS (about 3x the input in bf16)."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        ctx.eps = eps
        ctx.save_for_backward(x, weight)
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        # the output in the input's dtype (a bf16 stream stays bf16 under autocast with fp32
        # weights, so the linears that read it save it once, not one autocast copy each)
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) \
            * weight.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        f32 = torch.promote_types(x.dtype, torch.float32)
        xf = x.to(f32)
        r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + ctx.eps)
        n = xf * r
        grad_w = (grad * n.type_as(x)).to(f32).sum(dim=tuple(range(grad.dim() - 1)))
        dn = (grad * weight.to(grad.dtype)).to(f32)
        grad_x = r * (dn - n * (dn * n).mean(-1, keepdim=True))
        return grad_x.type_as(x), grad_w.to(weight.dtype), None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return _RMSNormFn.apply(x, self.weight, self.eps)


def make_norm(spec: Model) -> nn.Module:
    if spec.norm == "rmsnorm":
        return RMSNorm(spec.hidden, spec.norm_eps)
    return nn.LayerNorm(spec.hidden, eps=spec.norm_eps)


def rope_cos_sin(seq_len: int, head_dim: int, theta: float, device):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32)
                           / head_dim))
    t = torch.arange(seq_len, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv)                       # [s, hd/2]
    return freqs.cos(), freqs.sin()


def apply_rope(x, cos, sin):
    """x: [b, s, h, hd]; rotate-half (NeoX/HF) convention on pairs (i, i + hd/2)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    c = cos[None, :, None, :]
    s = sin[None, :, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).type_as(x)


def attention_mask(s: int, window: int, device):
    """[s, s] bool, True where query i may attend key j: causal, and within a sliding window of
    `window` keys when window > 0: i - window < j <= i (transformers masking_utils.py
    `sliding_window_overlay`: kv_idx > q_idx - sliding_window, and'ed with
    `causal_mask_function`: kv_idx <= q_idx), so a query sees `window` keys, itself included."""
    i = torch.arange(s, device=device)
    d = i[:, None] - i[None, :]
    ok = d >= 0
    if window:
        ok = ok & (d < window)
    return ok


class AttentionCore(nn.Module):
    """softmax(q k^T / sqrt(d) + mask) v with a causal (or sliding-window causal) mask; no
    parameters. Selective recompute checkpoints exactly this module.

    `window` > 0: a banded causal mask (`attention_mask`). `sinks` ([heads] logits, gpt-oss):
    each head's softmax gets one more logit that no value is read for (transformers
    modeling_gpt_oss.py eager_attention_forward: logits concatenated with the sink, softmax,
    the sink's column dropped), done inside SDPA as one extra key of zeros (logit q.0 = 0) and
    value of zeros whose additive mask entry is the head's sink. The scale is 1/sqrt of q's
    head width (MLA: qk_nope + qk_rope), SDPA's default."""

    def __init__(self, window: int = 0):
        super().__init__()
        self.window = window

    def forward(self, q, k, v, sinks=None):
        # q: [b, hq, s, hd], k/v: [b, hkv, s, hd]; grouped-query attention inside SDPA, so no
        # repeated copy of k/v is made (or saved for backward) outside the kernel
        s = q.shape[2]
        gqa = q.shape[1] != k.shape[1]
        window = self.window if self.window and self.window < s else 0
        if sinks is None and not window:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        ok = attention_mask(s, window, q.device)
        if sinks is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=ok, enable_gqa=gqa)
        b, hkv = k.shape[0], k.shape[1]
        k = torch.cat([k, k.new_zeros(b, hkv, 1, k.shape[-1])], dim=2)
        v = torch.cat([v, v.new_zeros(b, hkv, 1, v.shape[-1])], dim=2)
        bias = torch.zeros(s, s, dtype=q.dtype, device=q.device).masked_fill(~ok, float("-inf"))
        mask = torch.cat([bias.expand(q.shape[1], s, s),
                          sinks.to(q.dtype)[:, None, None].expand(-1, s, 1)], dim=-1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


class Attention(nn.Module):
    """Multi-head / grouped-query attention: wq hidden -> q_dim (num_heads * head_dim), wk/wv
    hidden -> kv_dim, wo attn_out_dim -> hidden (head_dim may differ from hidden / num_heads:
    `Model.head_dim_override`); a sliding window on the layers `Model.sliding_layer` names
    (`layer` is the global layer index); per-head sink logits `sinks` with
    `Model.attention_sinks`. Exactly `Model.attn_matmul_params + attn_bias_params +
    attn_extra_params` (+ the wo bias with linear_bias)."""

    def __init__(self, spec: Model, layer: int = 0):
        super().__init__()
        self.head_dim = spec.head_dim
        self.rope = spec.position == "rope"
        self.rope_theta = spec.rope_theta
        self.wq = nn.Linear(spec.hidden, spec.q_dim, bias=spec.attn_bias)
        self.wk = nn.Linear(spec.hidden, spec.kv_dim, bias=spec.attn_bias)
        self.wv = nn.Linear(spec.hidden, spec.kv_dim, bias=spec.attn_bias)
        self.wo = nn.Linear(spec.attn_out_dim, spec.hidden, bias=spec.linear_bias)
        self.sinks = nn.Parameter(torch.empty(spec.num_heads)) if spec.attention_sinks else None
        self.core = AttentionCore(spec.sliding_window if spec.sliding_layer(layer) else 0)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        if self.rope:
            cos, sin = rope_cos_sin(s, self.head_dim, self.rope_theta, x.device)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        sinks = _local(self.sinks) if self.sinks is not None else None   # tp: this rank's heads
        o = self.core(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), sinks)
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class MLAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-V2/V3; transformers models/deepseek_v3/
    modeling_deepseek_v3.py DeepseekV3Attention), the weights `Model.attn_matmul_params` counts:

    * queries: `wq_a` hidden -> q_lora_rank, RMSNorm `q_a_norm`, `wq_b` -> heads * (nope + rope)
      (q_lora_rank 0: one `wq` hidden -> heads * (nope + rope));
    * `wkv_a` (kv_a_proj_with_mqa) hidden -> kv_lora_rank + rope: the latent and one shared
      rope key k_pe; RMSNorm `kv_a_norm` on the latent; `wkv_b` kv_lora_rank -> heads * (nope +
      v_head_dim): each head's k_nope and value;
    * RoPE on the rope part only (q_rot per head, k_pe shared by every head), k = [k_nope; k_pe],
      q = [q_nope; q_rot]; softmax scale 1/sqrt(nope + rope); `wo` heads * v_head_dim -> hidden.

    Biases with attn_bias on wq_a (or wq) and wkv_a (`Model.attn_bias_params`), on wo with
    linear_bias. RoPE is rotate-half on the rope part (HF's default `rope_interleave` pairs
    adjacent dims instead: a fixed permutation of wq/wkv_a's rope columns, the same model
    trained from scratch); no YaRN mscale. Tensor parallelism is refused (planner.engines.runtime: mla_with_tp)."""

    def __init__(self, spec: Model, layer: int = 0):
        super().__init__()
        h, n = spec.hidden, spec.num_heads
        self.nope, self.rope_dim, self.v_dim = (spec.qk_nope_head_dim, spec.qk_rope_head_dim,
                                                spec.v_head_dim)
        self.kv_lora_rank = spec.kv_lora_rank
        self.rope = spec.position == "rope"
        self.rope_theta = spec.rope_theta
        qk = self.nope + self.rope_dim
        if spec.q_lora_rank:
            self.wq_a = nn.Linear(h, spec.q_lora_rank, bias=spec.attn_bias)
            self.q_a_norm = RMSNorm(spec.q_lora_rank, spec.norm_eps)
            self.wq_b = nn.Linear(spec.q_lora_rank, n * qk, bias=False)
            self.wq = None
        else:
            self.wq_a = self.q_a_norm = self.wq_b = None
            self.wq = nn.Linear(h, n * qk, bias=spec.attn_bias)
        self.wkv_a = nn.Linear(h, spec.kv_lora_rank + self.rope_dim, bias=spec.attn_bias)
        self.kv_a_norm = RMSNorm(spec.kv_lora_rank, spec.norm_eps)
        self.wkv_b = nn.Linear(spec.kv_lora_rank, n * (self.nope + self.v_dim), bias=False)
        self.wo = nn.Linear(n * self.v_dim, h, bias=spec.linear_bias)
        self.sinks = nn.Parameter(torch.empty(n)) if spec.attention_sinks else None
        self.core = AttentionCore(spec.sliding_window if spec.sliding_layer(layer) else 0)

    def forward(self, x):
        b, s, _ = x.shape
        q = (self.wq(x) if self.wq is not None
             else self.wq_b(self.q_a_norm(self.wq_a(x)))).view(b, s, -1, self.nope + self.rope_dim)
        q_nope, q_rot = q.split([self.nope, self.rope_dim], dim=-1)
        latent, k_rot = self.wkv_a(x).split([self.kv_lora_rank, self.rope_dim], dim=-1)
        kv = self.wkv_b(self.kv_a_norm(latent)).view(b, s, -1, self.nope + self.v_dim)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        k_rot = k_rot.view(b, s, 1, self.rope_dim)
        if self.rope:
            cos, sin = rope_cos_sin(s, self.rope_dim, self.rope_theta, x.device)
            q_rot, k_rot = apply_rope(q_rot, cos, sin), apply_rope(k_rot, cos, sin)
        q = torch.cat([q_nope, q_rot], dim=-1)
        k = torch.cat([k_nope, k_rot.expand(-1, -1, k_nope.shape[2], -1)], dim=-1)
        sinks = _local(self.sinks) if self.sinks is not None else None
        o = self.core(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), sinks)
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


def make_attention(spec: Model, layer: int = 0) -> nn.Module:
    return MLAttention(spec, layer) if spec.is_mla else Attention(spec, layer)


def _activation(name: str):
    if name == "silu":
        return F.silu
    if name == "gelu":
        return lambda x: F.gelu(x, approximate="tanh")
    return lambda x: torch.square(F.relu(x))      # relu2


class _GatedActFn(torch.autograd.Function):
    """act(a) * b saving only a and b (the cost model's gate and up outputs; w2 saves the
    product): act(a) is recomputed in backward. Autograd through the eager ops would also keep
    act(a), 8f bytes per token in bf16 where 6f are counted."""

    @staticmethod
    def forward(ctx, a, b, act):
        ctx.act = act
        ctx.save_for_backward(a, b)
        return act(a) * b

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        with torch.enable_grad():
            a_ = a.detach().requires_grad_(True)
            h = ctx.act(a_)
            (grad_a,) = torch.autograd.grad(h, a_, grad * b)
        return grad_a, grad * h.detach(), None


class FeedForward(nn.Module):
    """Gated: w2(act(w1 x) * w3 x); plain: w2(act(w1 x)). `width`/`bias` default to the dense
    FFN's (`ffn_hidden`, `linear_bias`); an MoE layer's shared experts are one FeedForward of
    `shared_expert_ffn_hidden` without biases (as `Model.shared_expert_params` counts them)."""

    def __init__(self, spec: Model, width: int | None = None, bias: bool | None = None):
        super().__init__()
        width = spec.ffn_hidden if width is None else width
        bias = spec.linear_bias if bias is None else bias
        self.act = _activation(spec.activation)
        self.w1 = nn.Linear(spec.hidden, width, bias=bias)
        self.w2 = nn.Linear(width, spec.hidden, bias=bias)
        self.w3 = nn.Linear(spec.hidden, width, bias=bias) if spec.gated_mlp else None

    def forward(self, x):
        if self.w3 is not None:
            return self.w2(_GatedActFn.apply(self.w1(x), self.w3(x), self.act))
        return self.w2(self.act(self.w1(x)))


def _local(t):
    """A parameter's local tensor: expert parallelism (`runtime.expert`) makes the stacked expert
    weights DTensors split over the ep ranks; the grouped matmul runs on this rank's experts."""
    return t.to_local() if hasattr(t, "to_local") else t


class GroupedExperts(nn.Module):
    """The routed experts of an MoE layer as stacked weights: `w1` (and `w3` when gated)
    [experts, hidden, moe_ffn_hidden], `w2` [experts, moe_ffn_hidden, hidden], biases
    `w1_bias`/`w3_bias` [experts, moe_ffn_hidden] and `w2_bias` [experts, hidden] only with
    `expert_bias` (as `Model.expert_params` counts them). `forward(x, counts)`: the rows of `x` are sorted by
    expert, `counts[e]` rows for expert e; each expert's rows go through its FFN (a grouped
    matmul as one matmul per expert on its slice of rows; torch._grouped_mm has no CPU
    backward in torch 2.13); gated, the activation saves only the gate and up outputs
    (`_GatedActFn`), the three intermediates planner.cost.moe counts.

    `w2_bias_share`: None, or (under expert tensor parallelism, set by `runtime.expert`) a
    function of the local `w2_bias` returning what this rank adds of it, so that the outputs
    summed over the etp ranks hold it once."""

    w2_bias_share = None

    def __init__(self, spec: Model):
        super().__init__()
        e, h, f = spec.num_experts, spec.hidden, spec.moe_ffn_hidden
        self.act = _activation(spec.activation)
        self.w1 = nn.Parameter(torch.empty(e, h, f))
        self.w2 = nn.Parameter(torch.empty(e, f, h))
        self.w3 = nn.Parameter(torch.empty(e, h, f)) if spec.gated_mlp else None
        # expert_bias (gpt-oss gate_up_proj_bias, down_proj_bias): [experts, width] each
        bias = spec.expert_bias
        self.w1_bias = nn.Parameter(torch.empty(e, f)) if bias else None
        self.w2_bias = nn.Parameter(torch.empty(e, h)) if bias else None
        self.w3_bias = nn.Parameter(torch.empty(e, f)) if bias and spec.gated_mlp else None

    def forward(self, x, counts: list):
        w1, w2 = _local(self.w1), _local(self.w2)
        w3 = _local(self.w3) if self.w3 is not None else None
        b1, b2, b3 = (_local(b) if b is not None else None
                      for b in (self.w1_bias, self.w2_bias, self.w3_bias))
        if b2 is not None and self.w2_bias_share is not None:
            b2 = self.w2_bias_share(b2)
        out = []
        for e, rows in enumerate(torch.split(x, counts)):
            h = rows @ w1[e]
            h = h + b1[e] if b1 is not None else h
            if w3 is not None:   # act(gate) * up saving only gate and up, as the dense MLP
                g = rows @ w3[e]
                h = _GatedActFn.apply(h, g + b3[e] if b3 is not None else g, self.act)
            else:
                h = self.act(h)
            y = h @ w2[e]
            out.append(y + b2[e] if b2 is not None else y)
        return torch.cat(out) if out else x[:0]


class MoEFeedForward(nn.Module):
    """Router, routed experts and shared experts (Mixtral / Qwen3-MoE / DeepSeek-V3 shape).

    Routing, dropless and deterministic: router logits (a linear, with a bias only with
    `expert_bias` as gpt-oss's router, fp32 softmax
    over all experts), the top-k experts of each token, their probabilities renormalised to
    sum to 1 (Mixtral; Qwen3-MoE with norm_topk_prob: softmax then top-k then normalise, which
    equals a softmax over the top-k logits). No token is dropped (no capacity factor) and no
    auxiliary load-balancing loss is added. The (token, expert) pairs are sorted by expert
    (stable), run through `experts`, put back in token order and summed with their weights;
    the shared experts (a dense FFN every token runs, on the block's input as it comes: under
    sequence parallelism `runtime.parallelize` gathers it there) are added."""

    def __init__(self, spec: Model):
        super().__init__()
        self.top_k = spec.experts_per_token
        self.num_experts = spec.num_experts
        self.router = nn.Linear(spec.hidden, spec.num_experts, bias=spec.expert_bias)
        self.experts = GroupedExperts(spec)
        self.shared_expert = (FeedForward(spec, spec.shared_expert_ffn_hidden, bias=False)
                              if spec.shared_expert_ffn_hidden else None)

    def forward(self, hidden):
        shape = hidden.shape
        x = hidden.reshape(-1, shape[-1])
        probs = torch.softmax(self.router(x).float(), dim=-1)
        weights, chosen = probs.topk(self.top_k, dim=-1)              # [tokens, k]
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        flat = chosen.flatten()                                        # pair j = token j // k
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        y = self.experts(x[order // self.top_k], counts)               # sorted by expert
        y = y[torch.argsort(order)].view(-1, self.top_k, shape[-1])    # back in pair order
        out = (y * weights.unsqueeze(-1)).sum(dim=1).view(shape)
        if self.shared_expert is not None:
            out = out + self.shared_expert(hidden)
        return out


class DecoderLayer(nn.Module):
    """One transformer block; constructible on its own from a Model spec (the profiler times it).

    Sequential residual: x + attn(n1 x), then + mlp(n2 .); parallel: x + attn(n1 x) + mlp(n2 x).
    `moe`: the FFN is an `MoEFeedForward` (layer i of a Transformer: `spec.moe_layer(i)`).
    """

    def __init__(self, spec: Model, moe: bool = False, layer: int = 0):
        super().__init__()
        check_supported(spec)
        self.parallel_residual = spec.parallel_residual
        self.attention_norm = make_norm(spec)
        self.attention = make_attention(spec, layer)
        self.ffn_norm = make_norm(spec)
        self.feed_forward = MoEFeedForward(spec) if moe else FeedForward(spec)
        self.dropout = nn.Dropout(spec.dropout) if spec.dropout > 0 else None

    def _drop(self, x):
        return self.dropout(x) if self.dropout is not None else x

    def forward(self, x):
        if self.parallel_residual:
            return (x + self._drop(self.attention(self.attention_norm(x)))
                    + self._drop(self.feed_forward(self.ffn_norm(x))))
        h = x + self._drop(self.attention(self.attention_norm(x)))
        return h + self._drop(self.feed_forward(self.ffn_norm(h)))


def check_whole_model_supported(spec: Model) -> None:
    """What a whole `Transformer` cannot build beyond `check_supported` (a lone DecoderLayer,
    as the profiler times, can)."""
    check_supported(spec)
    if spec.mtp_layers:
        raise UnsupportedModel(f"model {spec.name}: multi-token prediction ({spec.mtp_layers} "
                               f"mtp_layers) is not built by the runtime yet")


class Transformer(nn.Module):
    def __init__(self, spec: Model):
        super().__init__()
        check_whole_model_supported(spec)
        self.spec = spec
        self.tok_embeddings = nn.Embedding(spec.vocab_size, spec.hidden)
        self.pos_embeddings = (nn.Embedding(spec.max_seq_len, spec.hidden)
                               if spec.position == "learned" else None)
        self.emb_dropout = nn.Dropout(spec.dropout) if spec.dropout > 0 else None
        self.layers = nn.ModuleDict({str(i): DecoderLayer(spec, moe=spec.moe_layer(i), layer=i)
                                     for i in range(spec.num_layers)})
        self.norm = make_norm(spec)
        self.output = nn.Linear(spec.hidden, spec.vocab_size, bias=False)
        if spec.tied_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, x):
        """Token ids [b, s] -> logits [b, s, vocab]; in a pipeline stage without the embedding
        `x` is the hidden state [b, s, hidden] and without the output the hidden state is
        returned."""
        if self.tok_embeddings is not None:
            tokens = x
            x = self.tok_embeddings(tokens)
            if self.pos_embeddings is not None:
                pos = torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0)
                x = x + self.pos_embeddings(pos)
            if self.emb_dropout is not None:
                x = self.emb_dropout(x)
            if torch.is_autocast_enabled(x.device.type):
                # the residual stream in the autocast dtype (bf16), as the cost model counts
                # it; fp32 embedding weights would otherwise make it, and every norm input and
                # autocast copy of it, fp32
                x = x.to(torch.get_autocast_dtype(x.device.type))
        for layer in self.layers.values():
            x = layer(x)
        if self.norm is not None:
            x = self.norm(x)
        if self.output is not None:
            x = self.output(x)
        return x


# ---- deterministic initialisation --------------------------------------------------------

def clean_name(name: str) -> str:
    """Parameter name without wrapper prefixes (activation checkpointing, compile, FSDP1)."""
    for w in ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module."):
        name = name.replace(w, "")
    return name


def canonical_name(name: str, spec: Model) -> str:
    """The name a parameter is initialised by: a tied output weight is the embedding."""
    name = clean_name(name)
    if spec.tied_embeddings and name == "output.weight":
        return "tok_embeddings.weight"
    return name


def _seed_of(seed: int, name: str) -> int:
    h = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def init_full_tensor(name: str, shape, spec: Model, seed: int, device="cpu") -> torch.Tensor:
    """The full (unsharded) fp32 initial value of parameter `name` (canonical name).

    Drawn on `device` from a generator seeded by (seed, name): the same values for every layout
    on one kind of device (CPU and CUDA generators differ; CUDA's is much faster for big
    tensors)."""
    leaf = name.rsplit(".", 1)[-1]
    parent = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else ""
    if leaf == "bias" or leaf.endswith("_bias"):        # also the experts' w1_bias, ...
        return torch.zeros(shape, device=device)
    if parent.endswith("norm"):     # attention_norm, ffn_norm, norm; MLA's q_a_norm, kv_a_norm
        return torch.ones(shape, device=device)
    g = torch.Generator(device=device).manual_seed(_seed_of(seed, name))
    std = 0.02
    if parent in ("wo", "w2") or (parent, leaf) == ("experts", "w2"):
        std = 0.02 / math.sqrt(2 * spec.num_layers)   # residual-branch outputs (GPT-2 scaling)
    t = torch.empty(shape, device=device)
    t.normal_(0.0, std, generator=g)
    return t
