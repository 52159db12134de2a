"""What the planner reasons about: a model, a GPU, a cluster.

Plain frozen dataclasses, their fields' checkers and JSON schemas. Catalog entries, and the
readers of model and cluster files (a Hugging Face `config.json`, a cluster JSON, a plan's
cluster), live in `planner.catalog`: this module imports nothing that imports it.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from planner import limits as B
from planner import filecheck as S
from planner.errors import BadInput
from planner.power import power_scale

ACTIVATIONS = ("silu", "gelu", "relu2")
NORMS = ("rmsnorm", "layernorm")
POSITIONS = ("rope", "learned", "alibi")

# Every Model field: its type and range (planner.filecheck checkers). Model.__post_init__ checks
# them whoever builds a Model (catalog, config.json, a plan, a profile); MODEL_SCHEMA checks the
# JSON form with unknown and missing keys.
MODEL_FIELDS = {
    "name": S.Name(),
    "num_layers": S.Int(1, B.MAX_LAYERS),
    "hidden": S.Int(1, B.MAX_HIDDEN),
    "ffn_hidden": S.Int(1, 4 * B.MAX_HIDDEN),
    "num_heads": S.Int(1, B.MAX_HEADS),
    "num_kv_heads": S.Int(1, B.MAX_HEADS),
    "vocab_size": S.Int(1, B.MAX_VOCAB),
    "max_seq_len": S.Int(1, B.MAX_SEQ_LEN),
    "gated_mlp": S.Bool(),
    "activation": S.Enum(*ACTIVATIONS),
    "norm": S.Enum(*NORMS),
    "position": S.Enum(*POSITIONS),
    "tied_embeddings": S.Bool(),
    "attn_bias": S.Bool(),
    "linear_bias": S.Bool(),
    "parallel_residual": S.Bool(),
    "dropout": S.Num(ge=0.0, lt=1.0),
    "norm_eps": S.Num(gt=0.0, le=1.0),
    "rope_theta": S.Num(gt=0.0, le=1e12),
    "rope_attention_factor": S.Num(gt=0.0, le=100.0),
    "activation_clamp": S.Num(ge=0.0, le=1e6),
    "num_experts": S.Int(0, B.MAX_EXPERTS),
    "experts_per_token": S.Int(0, B.MAX_EXPERTS),
    "moe_ffn_hidden": S.Int(0, 4 * B.MAX_HIDDEN),
    "shared_expert_ffn_hidden": S.Int(0, 4 * B.MAX_HIDDEN),
    "first_dense_layers": S.Int(0, B.MAX_LAYERS),
    "moe_layer_interval": S.Int(1, B.MAX_LAYERS),
    "expert_bias": S.Bool(),
    "head_dim_override": S.Int(0, B.MAX_HIDDEN),
    "q_lora_rank": S.Int(0, B.MAX_HIDDEN),
    "kv_lora_rank": S.Int(0, B.MAX_HIDDEN),
    "qk_rope_head_dim": S.Int(0, B.MAX_HIDDEN),
    "qk_nope_head_dim": S.Int(0, B.MAX_HIDDEN),
    "v_head_dim": S.Int(0, B.MAX_HIDDEN),
    "attention_sinks": S.Bool(),
    "sliding_window": S.Int(0, B.MAX_SEQ_LEN),
    "full_attention_interval": S.Int(0, B.MAX_LAYERS),
    "mtp_layers": S.Int(0, B.MAX_LAYERS),
}


def yarn_attention_factor(factor: float, mscale: float | None = None,
                          mscale_all_dim: float | None = None) -> float:
    """YaRN's attention factor for a context scaled by `factor` (Peng et al. 2023, Sec. 3.4:
    0.1 ln s + 1), or the ratio of its two mscale forms where a config gives both (DeepSeek's
    mscale and mscale_all_dim): transformers modeling_rope_utils _compute_yarn_parameters."""
    def get_mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
    if mscale and mscale_all_dim:
        return get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
    return get_mscale(factor)


def _who(kind: str, name) -> str:
    """"model llama3-8b" for messages, whatever `name` holds (escaped, shortened)."""
    return f"{kind} {S.show_path(name) if isinstance(name, str) else S.show(name)}"


@dataclass(frozen=True)
class Model:
    """A decoder-only transformer, as much of it as cost and runtime need."""

    name: str
    num_layers: int
    hidden: int
    ffn_hidden: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    max_seq_len: int
    gated_mlp: bool = True          # SwiGLU-style (gate, up, down) vs plain (fc1, fc2)
    activation: str = "silu"        # silu | gelu | relu2
    norm: str = "rmsnorm"           # rmsnorm | layernorm
    position: str = "rope"          # rope | learned | alibi
    tied_embeddings: bool = False
    attn_bias: bool = False         # bias on q/k/v projections
    linear_bias: bool = False       # bias on the other linears (out proj, MLP)
    parallel_residual: bool = False  # GPT-NeoX: x + attn(ln1 x) + mlp(ln2 x)
    dropout: float = 0.0
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # the factor YaRN RoPE scales the rotated queries and keys by (its "attention factor",
    # mscale: yarn_attention_factor); 1 for any other RoPE (gpt-oss: 1.347)
    rope_attention_factor: float = 1.0
    # the gated activation clamps its gate half (above) and its linear half (both sides) at
    # this value before the product (gpt-oss's swiglu_limit, 7.0: GptOssExperts); 0: none
    activation_clamp: float = 0.0
    # mixture of experts; num_experts 0: a dense model. Hugging Face names: num_local_experts /
    # n_routed_experts / num_experts, num_experts_per_tok, moe_intermediate_size, the shared
    # experts' width (DeepSeek n_shared_experts x moe_intermediate_size, Qwen2-MoE
    # shared_expert_intermediate_size), first_k_dense_replace, interleave_moe_layer_step.
    num_experts: int = 0            # routed experts per MoE layer
    experts_per_token: int = 0      # top-k
    moe_ffn_hidden: int = 0         # one routed expert's FFN width
    shared_expert_ffn_hidden: int = 0   # the shared experts together, run by every token
    first_dense_layers: int = 0     # the first k layers have a dense FFN of ffn_hidden
    moe_layer_interval: int = 1     # after them every k-th layer is MoE, the others dense
    # the routed experts' linears and the router have biases (gpt-oss: gate_up_proj_bias,
    # down_proj_bias, router.bias; transformers models/gpt_oss/modeling_gpt_oss.py GptOssExperts)
    expert_bias: bool = False
    # ---- attention shape ----
    # head width when it is not hidden / num_heads (Hugging Face `head_dim`: Mistral-Nemo 128 at
    # hidden 5120 and 32 heads; Qwen3, Gemma, gpt-oss); 0: hidden // num_heads. The query and
    # output projections are num_heads * head_dim wide (transformers LlamaAttention q_proj,
    # o_proj). Read it as `head_dim`.
    head_dim_override: int = 0
    # multi-head latent attention (DeepSeek-V2/V3; transformers models/deepseek_v3/
    # modeling_deepseek_v3.py DeepseekV3Attention); kv_lora_rank 0: not MLA. Queries:
    # q_a_proj hidden -> q_lora_rank, q_a_layernorm, q_b_proj -> heads * (nope + rope)
    # (q_lora_rank 0: one q_proj hidden -> heads * (nope + rope)); keys and values:
    # kv_a_proj_with_mqa hidden -> kv_lora_rank + rope, kv_a_layernorm, kv_b_proj kv_lora_rank
    # -> heads * (nope + v_head_dim); o_proj heads * v_head_dim -> hidden.
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # one learned logit per head joining each softmax (gpt-oss `sinks`, GptOssAttention)
    attention_sinks: bool = False
    # local attention: a query sees the last `sliding_window` keys (itself included); 0: every
    # layer attends to the whole causal prefix. full_attention_interval k: layers i with
    # (i + 1) % k == 0 attend fully, the others use the window (Gemma 2 and gpt-oss k = 2,
    # Gemma 3 k = 6); 0: every layer uses the window (Mistral 7B v0.1, Phi-3).
    sliding_window: int = 0
    full_attention_interval: int = 0
    # multi-token prediction modules after the last layer (DeepSeek-V3 num_nextn_predict_layers,
    # Megatron --mtp-num-layers): each a projection of [norm(h); norm(emb)] 2*hidden -> hidden,
    # two norms, one more layer of the last layer's kind and a final norm; the embedding and
    # output head are shared with the main model (DeepSeek-V3 report, Sec. 2.2). Counted in
    # num_params and active_params, not in num_layers.
    mtp_layers: int = 0

    def __post_init__(self):
        who = _who("model", self.name)
        for f, checker in MODEL_FIELDS.items():
            try:
                checker(getattr(self, f), f)
            except S.Invalid as e:
                raise BadInput(f"{who}: {e}") from None
        if self.is_mla:
            if not (self.qk_rope_head_dim and self.qk_nope_head_dim and self.v_head_dim):
                raise BadInput(f"{who}: multi-head latent attention (kv_lora_rank "
                               f"{self.kv_lora_rank}) needs qk_rope_head_dim, qk_nope_head_dim "
                               f"and v_head_dim >= 1")
            if self.head_dim_override:
                raise BadInput(f"{who}: head_dim_override does not apply to multi-head latent "
                               f"attention (its head is qk_nope_head_dim + qk_rope_head_dim)")
        elif self.q_lora_rank or self.qk_rope_head_dim or self.qk_nope_head_dim or self.v_head_dim:
            raise BadInput(f"{who}: q_lora_rank, qk_rope_head_dim, qk_nope_head_dim and "
                           f"v_head_dim are multi-head latent attention fields: they need "
                           f"kv_lora_rank >= 1")
        if self.full_attention_interval and not self.sliding_window:
            raise BadInput(f"{who}: full_attention_interval {self.full_attention_interval} "
                           f"needs a sliding_window")
        if not (self.head_dim_override or self.is_mla) and self.hidden % self.num_heads:
            raise BadInput(f"{who}: hidden {self.hidden} is not divisible by "
                           f"num_heads {self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise BadInput(f"{who}: num_heads {self.num_heads} is not divisible by "
                           f"num_kv_heads {self.num_kv_heads}")
        if self.num_experts:
            if not 1 <= self.experts_per_token <= self.num_experts:
                raise BadInput(f"{who}: experts_per_token {self.experts_per_token} must be "
                               f"1..num_experts {self.num_experts}")
            if self.moe_ffn_hidden < 1:
                raise BadInput(f"{who}: an MoE model needs moe_ffn_hidden >= 1")
            if self.num_moe_layers < 1:
                raise BadInput(f"{who}: first_dense_layers {self.first_dense_layers} and "
                               f"moe_layer_interval {self.moe_layer_interval} leave no MoE layer")
        elif (self.experts_per_token or self.moe_ffn_hidden or self.shared_expert_ffn_hidden
              or self.expert_bias):
            raise BadInput(f"{who}: experts_per_token, moe_ffn_hidden, "
                           f"shared_expert_ffn_hidden and expert_bias need num_experts >= 1")

    # ---- layer kinds ------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def moe_layer(self, i: int) -> bool:
        """Layer i (0-based) has a routed-expert FFN: after the first dense layers, every
        moe_layer_interval-th one (Hugging Face Llama 4: layers step-1, 2*step-1, ...)."""
        j = i - self.first_dense_layers
        return self.is_moe and j >= 0 and (j + 1) % self.moe_layer_interval == 0

    @property
    def num_moe_layers(self) -> int:
        return sum(self.moe_layer(i) for i in range(self.num_layers))

    def sliding_layer(self, i: int) -> bool:
        """Layer i (0-based) attends to a sliding window, not the whole prefix."""
        k = self.full_attention_interval
        return self.sliding_window > 0 and not (k and (i + 1) % k == 0)

    @property
    def num_sliding_layers(self) -> int:
        return sum(self.sliding_layer(i) for i in range(self.num_layers))

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def head_dim(self) -> int:
        """A query / key head's width (MLA: nope + rope part)."""
        if self.is_mla:
            return self.qk_nope_head_dim + self.qk_rope_head_dim
        return self.head_dim_override or self.hidden // self.num_heads

    @property
    def value_head_dim(self) -> int:
        return self.v_head_dim if self.is_mla else self.head_dim

    @property
    def q_dim(self) -> int:
        """Width of the queries (the q projection's output)."""
        return self.num_heads * self.head_dim

    @property
    def attn_out_dim(self) -> int:
        """Width of the attention output (the output projection's input)."""
        return self.num_heads * self.value_head_dim

    @property
    def kv_heads(self) -> int:
        """Key / value heads attention reads: num_kv_heads (MLA: one per query head)."""
        return self.num_heads if self.is_mla else self.num_kv_heads

    @property
    def kv_dim(self) -> int:
        """Width of the keys (and, but for MLA, of the values) attention reads."""
        return self.kv_heads * self.head_dim

    @property
    def value_dim(self) -> int:
        """Width of the values attention reads (MLA: v_head_dim per head)."""
        return self.kv_heads * self.value_head_dim

    def attention_feature_map(self) -> dict:
        """What this model has beyond Llama's attention (heads hidden / num_heads wide, every
        layer full causal, no sinks) and layers, by key ("head_dim", "mla", "sliding_window",
        "sinks", "mtp"), one phrase each: what an export or the runtime must carry, or refuse
        the plan over."""
        out = {}
        if self.head_dim_override:
            out["head_dim"] = f"head_dim {self.head_dim} (not hidden / num_heads)"
        if self.is_mla:
            out["mla"] = (f"multi-head latent attention (kv_lora_rank {self.kv_lora_rank}, "
                          f"q_lora_rank {self.q_lora_rank})")
        if self.sliding_window:
            out["sliding_window"] = (f"sliding-window attention ({self.sliding_window} tokens "
                                     f"on {self.num_sliding_layers} of {self.num_layers} layers)")
        if self.attention_sinks:
            out["sinks"] = "attention sinks"
        if self.mtp_layers:
            out["mtp"] = f"{self.mtp_layers} multi-token prediction layer(s)"
        return out

    def attention_features(self) -> list:
        """The phrases of attention_feature_map."""
        return list(self.attention_feature_map().values())

    # ---- parameter counts -------------------------------------------------
    def norm_params(self) -> int:
        return self.hidden * (2 if self.norm == "layernorm" else 1)

    def attn_matmul_params(self) -> int:
        """q, k, v and output projection weights (MLA: its down and up projections)."""
        h = self.hidden
        if self.is_mla:
            q = (h * self.q_lora_rank + self.q_lora_rank * self.q_dim if self.q_lora_rank
                 else h * self.q_dim)
            kv = (h * (self.kv_lora_rank + self.qk_rope_head_dim)
                  + self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim))
            return q + kv + self.attn_out_dim * h
        return h * (self.q_dim + 2 * self.kv_dim) + self.attn_out_dim * h

    def tp_replicated_attn_params(self) -> int:
        """Of attn_matmul_params, what every tensor-parallel rank holds whole: MLA's down
        projections (q_a, kv_a), which Megatron-Core builds duplicated over tp
        (megatron/core/transformer/multi_latent_attention.py: linear_q_down_proj /
        linear_kv_down_proj as TELinear with parallel_mode="duplicated"; torchtitan's
        DeepSeek-V3 leaves wq_a / wkv_a unsharded likewise)."""
        if not self.is_mla:
            return 0
        return self.hidden * (self.q_lora_rank + self.kv_lora_rank + self.qk_rope_head_dim)

    def attn_matmul_params_on_rank(self, tp: int) -> float:
        """attn_matmul_params on one of `tp` tensor-parallel ranks: sharded but the
        replicated down projections (tp_replicated_attn_params)."""
        rep = self.tp_replicated_attn_params()
        return (self.attn_matmul_params() - rep) / tp + rep

    def attn_extra_params(self) -> int:
        """MLA's q_a / kv_a RMSNorms and gpt-oss's per-head sinks."""
        mla = (self.q_lora_rank + self.kv_lora_rank) if self.is_mla else 0
        return mla + (self.num_heads if self.attention_sinks else 0)

    def attn_bias_params(self) -> int:
        """q/k/v biases (MLA: on q_a_proj and kv_a_proj_with_mqa, DeepseekV3Attention)."""
        if not self.attn_bias:
            return 0
        if self.is_mla:
            return (self.q_lora_rank or self.q_dim) + self.kv_lora_rank + self.qk_rope_head_dim
        return self.q_dim + 2 * self.kv_dim

    def mlp_matmul_params(self) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden * self.ffn_hidden

    def bias_params(self) -> int:
        n = self.attn_bias_params()
        if self.linear_bias:
            n += self.hidden + (2 if self.gated_mlp else 1) * self.ffn_hidden + self.hidden
        return n

    def layer_params(self) -> int:
        """A dense layer (every layer of a dense model)."""
        return (self.attn_matmul_params() + self.mlp_matmul_params() + self.bias_params()
                + 2 * self.norm_params() + self.attn_extra_params())

    def expert_params(self) -> int:
        """One routed expert's FFN weights (gated like the dense FFN), with its biases where
        expert_bias (gpt-oss: gate_up 2 x moe_ffn_hidden, down hidden)."""
        bias = ((2 if self.gated_mlp else 1) * self.moe_ffn_hidden + self.hidden
                if self.expert_bias else 0)
        return (3 if self.gated_mlp else 2) * self.hidden * self.moe_ffn_hidden + bias

    def router_params(self) -> int:
        return (self.hidden + (1 if self.expert_bias else 0)) * self.num_experts

    def shared_expert_params(self) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden * self.shared_expert_ffn_hidden

    def moe_layer_params(self) -> int:
        """An MoE layer: attention, norms, router, shared experts and every routed expert."""
        return (self.attn_matmul_params() + 2 * self.norm_params() + self.router_params()
                + self.shared_expert_params() + self.num_experts * self.expert_params()
                + self.attn_bias_params() + self.attn_extra_params())

    def moe_layer_active_params(self) -> int:
        """What one token runs through in an MoE layer: top-k experts, not all."""
        return (self.moe_layer_params()
                - (self.num_experts - self.experts_per_token) * self.expert_params())

    def embedding_params(self) -> int:
        """Token (and learned position) embeddings: held by the first stage."""
        pos = self.max_seq_len * self.hidden if self.position == "learned" else 0
        return self.vocab_size * self.hidden + pos

    def head_params(self) -> int:
        """Final norm plus the output projection (untied) held by the last stage."""
        return self.norm_params() + (0 if self.tied_embeddings else self.vocab_size * self.hidden)

    def mtp_extra_params(self) -> int:
        """One MTP module beside its layer: the 2*hidden -> hidden projection (eh_proj), its
        two input norms (enorm, hnorm) and its final norm."""
        return 2 * self.hidden * self.hidden + 3 * self.norm_params()

    def mtp_params(self) -> int:
        """All MTP modules; each holds one layer of the last layer's kind."""
        last = (self.moe_layer_params() if self.moe_layer(self.num_layers - 1)
                else self.layer_params())
        return self.mtp_layers * (last + self.mtp_extra_params())

    def mtp_active_params(self) -> int:
        last = (self.moe_layer_active_params() if self.moe_layer(self.num_layers - 1)
                else self.layer_params())
        return self.mtp_layers * (last + self.mtp_extra_params())

    def num_params(self) -> int:
        """Every trained parameter, MTP modules included (embedding and head once)."""
        moe = self.num_moe_layers
        return ((self.num_layers - moe) * self.layer_params() + moe * self.moe_layer_params()
                + self.embedding_params() + self.head_params() + self.mtp_params())

    def active_params(self) -> int:
        """Parameters one token runs through (num_params for a dense model), the embedding
        table and the MTP modules included (subtract embedding_params() / mtp_active_params()
        for the conventions that leave them out)."""
        moe = self.num_moe_layers
        return ((self.num_layers - moe) * self.layer_params()
                + moe * self.moe_layer_active_params()
                + self.embedding_params() + self.head_params() + self.mtp_active_params())

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict, what: str = "model spec") -> "Model":
        """A Model from its JSON form: unknown keys refused (the known ones listed), required
        keys present, every value type- and range-checked; BadInput "what: ..." otherwise."""
        return cls(**S.check(MODEL_SCHEMA, d, what))

    def scaled(self, **changes) -> "Model":
        return dataclasses.replace(self, **changes)


def _schema_of(cls, fields: dict) -> S.Obj:
    """An Obj schema of a dataclass: its fields' checkers, required unless they have a
    default."""
    return S.Obj({f.name: fields[f.name] if f.default is dataclasses.MISSING
                  else (fields[f.name], f.default) for f in dataclasses.fields(cls)})


MODEL_SCHEMA = _schema_of(Model, MODEL_FIELDS)

_BW = S.Num(gt=0.0, le=1e8)          # GB/s
_LAT = S.Num(ge=0.0, le=1e7)         # microseconds
GPU_FIELDS = {
    "name": S.Name(),
    "peak_tflops": S.Num(gt=0.0, le=1e7),
    "memory_gib": S.Num(gt=0.0, le=1e7),
    "hbm_gbps": _BW,
    "gemm_efficiency": S.Num(gt=0.0, le=1.0),
    "attn_efficiency": S.Num(gt=0.0, le=1.0),
    "attn_half_keys": S.Num(ge=0.0, le=1e9),
    "nvlink_busbw_gbps": _BW,
    "nvlink_p2p_gbps": _BW,
    "nvlink_latency_us": _LAT,
    "internode_gbps_per_gpu": _BW,
    "internode_latency_us": _LAT,
    "overlap_slowdown": S.Num(ge=0.0, le=2.0),
    # the host and its storage (offload: planner.cost.offload); 0: not known, so nothing is
    # offloaded there
    "host_memory_gib": S.Num(ge=0.0, le=1e7),
    "host_link_gbps": S.Num(ge=0.0, le=1e8),
    "host_memory_gbps": S.Num(ge=0.0, le=1e8),
    "nvme_gbps": S.Num(ge=0.0, le=1e8),
    "nvme_tib": S.Num(ge=0.0, le=1e7),
    # the board power limit the GPUs run under (nvidia-smi -pl), W; 0: the part's rated power
    "power_limit_w": S.Num(ge=0.0, le=1e5),
}


@dataclass(frozen=True)
class Gpu:
    """One accelerator. Every figure is cited in `planner.catalog.gpus`."""

    name: str
    peak_tflops: float            # dense bf16 (fp32 for the cpu entry)
    memory_gib: float             # capacity as the driver reports it
    hbm_gbps: float               # memory bandwidth, GB/s
    gemm_efficiency: float        # fraction of peak a large GEMM reaches
    attn_efficiency: float        # fraction of peak flash attention reaches (long sequences)
    nvlink_busbw_gbps: float      # intra-node all-reduce bus bandwidth, GB/s
    nvlink_p2p_gbps: float        # intra-node point-to-point, GB/s, one direction
    nvlink_latency_us: float
    internode_gbps_per_gpu: float  # one NIC per GPU, GB/s, one direction
    internode_latency_us: float
    # compute slowdown while a collective runs beside it, as a fraction of the collective's time
    overlap_slowdown: float = 0.15
    # the keys per query at which attention runs at half attn_efficiency
    # (planner.cost.compute.attention_efficiency); 0: the same rate at every length
    attn_half_keys: float = 0.0
    # ---- the host and its storage, per node of the GPU's catalog system (cited in
    # planner.catalog.gpus; a cluster JSON overrides them like any figure). 0: not known --
    # nothing is offloaded there (planner.rules.offload_problems).
    host_memory_gib: float = 0.0   # CPU memory of one node, GiB
    host_link_gbps: float = 0.0    # one GPU <-> host, GB/s, one direction (PCIe / NVLink-C2C)
    host_memory_gbps: float = 0.0  # the node's CPU memory bandwidth, GB/s (CPU Adam is bound by it)
    nvme_gbps: float = 0.0         # the node's local NVMe, GB/s, the slower of read and write
    nvme_tib: float = 0.0          # the node's local NVMe capacity, TiB
    # the board power limit it runs under, W (nvidia-smi -pl); 0: its rated power
    power_limit_w: float = 0.0

    def __post_init__(self):
        who = _who("gpu", self.name)
        for f, checker in GPU_FIELDS.items():
            try:
                checker(getattr(self, f), f)
            except S.Invalid as e:
                raise BadInput(f"{who}: {e}") from None
        if self.power_limit_w:
            self.tensor_peak_tflops     # a limit no datasheet prices is refused here

    @property
    def tensor_peak_tflops(self) -> float:
        """The dense bf16 tensor-core peak at the board's power limit: `peak_tflops` (the rated
        part's) in the ratio its silicon's datasheet ratings give at that power
        (planner.power power_scale); every precision's peak scales alike."""
        if not self.power_limit_w:
            return self.peak_tflops
        return self.peak_tflops * power_scale(self.name, self.power_limit_w)


GPU_SCHEMA = _schema_of(Gpu, GPU_FIELDS)
GPU_OVERRIDES = tuple(f for f in GPU_FIELDS if f != "name")
# the host and storage figures (offload: planner.cost.offload)
HOST_FIELDS = ("host_memory_gib", "host_link_gbps", "host_memory_gbps", "nvme_gbps", "nvme_tib")


@dataclass(frozen=True)
class Cluster:
    """`num_gpus` GPUs, `gpus_per_node` to a host (what torchrun's --nproc-per-node launches),
    `nvlink_domain` of them sharing one NVLink (or xGMI) fabric: the host by default; a whole
    GB200/GB300 NVL72 rack (72 GPUs over 18 trays of 4) where NVLink switches join the hosts.
    Ranks are laid out in order over hosts and domains (rank r on host r // gpus_per_node, in
    domain r // nvlink_domain), as torchrun's node ranks are when a scheduler hands out a
    rack's hosts together (e.g. Slurm's topology/block plugin)."""
    name: str
    gpu: Gpu
    num_gpus: int
    gpus_per_node: int = 8
    # GPUs sharing NVLink; None: gpus_per_node. A multiple of gpus_per_node that divides num_gpus.
    nvlink_domain: int | None = None

    def __post_init__(self):
        who = _who("cluster", self.name)
        try:
            S.Name()(self.name, "name")
            S.Int(1, B.MAX_GPUS)(self.num_gpus, "num_gpus")
            S.Int(1, B.MAX_GPUS)(self.gpus_per_node, "gpus_per_node")
        except S.Invalid as e:
            if e.path == "num_gpus" and isinstance(self.num_gpus, int) and self.num_gpus > 0:
                raise BadInput(f"{who}: {S.show(self.num_gpus)} GPUs is more than this planner "
                               f"plans for (at most {B.MAX_GPUS})") from None
            raise BadInput(f"{who}: {e}") from None
        if self.gpus_per_node > self.num_gpus:
            raise BadInput(f"{who}: gpus_per_node {self.gpus_per_node} is more than num_gpus "
                           f"{self.num_gpus}")
        if self.nvlink_domain is None:
            object.__setattr__(self, "nvlink_domain", self.gpus_per_node)
        why = nvlink_domain_problem(self.nvlink_domain, self.gpus_per_node, self.num_gpus)
        if why:
            raise BadInput(f"{who}: {why}")
        if not isinstance(self.gpu, Gpu):
            raise BadInput(f"{who}: gpu must be a Gpu, got {S.show(self.gpu)}")

    @property
    def num_nodes(self) -> int:
        return math.ceil(self.num_gpus / self.gpus_per_node)

    @property
    def peak_tflops_per_gpu(self) -> float:
        """The peak an MFU is measured against, per GPU."""
        return self.gpu.peak_tflops

    def rank_gpus(self, pp: int) -> list:
        """The GPU of each of `pp` pipeline ranks: this cluster's one GPU."""
        return [self.gpu] * pp

    def to_dict(self) -> dict:
        return {"name": self.name, "num_gpus": self.num_gpus, "gpus_per_node": self.gpus_per_node,
                "nvlink_domain": self.nvlink_domain, "gpu": self.gpu.name,
                "gpu_memory_gib": self.gpu.memory_gib, "gpu_spec": dataclasses.asdict(self.gpu)}


@dataclass(frozen=True)
class MixedCluster:
    """GPU groups of different kinds in one job (issue 24): each group a homogeneous Cluster
    (its own GPU, hosts, NVLink domain and NICs, named for the group), joined by one network
    between groups. `link_gbps` (per GPU, one direction) and `link_latency_us` price what
    crosses it; None: the slower side's NIC (the least internode_gbps_per_gpu and the largest
    internode latency of the groups). `pipeline`: the group of each pipeline rank in rank
    order, set by a plan (a cluster file has none); ranks are laid out pp outermost, so the
    groups' hosts come in that order. A one-group cluster is a plain Cluster, never this."""
    name: str
    groups: tuple
    link_gbps: float | None = None
    link_latency_us: float | None = None
    pipeline: tuple = ()

    def __post_init__(self):
        who = _who("cluster", self.name)
        try:
            S.Name()(self.name, "name")
            if self.link_gbps is not None:
                _BW(self.link_gbps, "link_gbps")
            if self.link_latency_us is not None:
                _LAT(self.link_latency_us, "link_latency_us")
        except S.Invalid as e:
            raise BadInput(f"{who}: {e}") from None
        object.__setattr__(self, "groups", tuple(self.groups))
        object.__setattr__(self, "pipeline", tuple(self.pipeline))
        if len(self.groups) < 2 or not all(isinstance(g, Cluster) for g in self.groups):
            raise BadInput(f"{who}: groups must be two or more clusters")
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            raise BadInput(f"{who}: group names {', '.join(names)} repeat; name each group")
        if self.num_gpus > B.MAX_GPUS:
            raise BadInput(f"{who}: {self.num_gpus} GPUs is more than this planner plans for "
                           f"(at most {B.MAX_GPUS})")
        if any(not isinstance(g, int) or isinstance(g, bool) or not 0 <= g < len(self.groups)
               for g in self.pipeline):
            raise BadInput(f"{who}: pipeline must list group indices 0..{len(self.groups) - 1}")

    @property
    def num_gpus(self) -> int:
        return sum(g.num_gpus for g in self.groups)

    @property
    def gpu(self) -> Gpu:
        """The slowest group's GPU (least peak; of equal peaks, the least memory bandwidth,
        then memory: H100 before H200): what a reader that needs one GPU assumes."""
        return min((g.gpu for g in self.groups),
                   key=lambda x: (x.tensor_peak_tflops, x.hbm_gbps, x.memory_gib))

    @property
    def gpus_per_node(self) -> int:
        return min(g.gpus_per_node for g in self.groups)

    @property
    def nvlink_domain(self) -> int:
        return min(g.nvlink_domain for g in self.groups)

    @property
    def num_nodes(self) -> int:
        return sum(g.num_nodes for g in self.groups)

    @property
    def peak_tflops_per_gpu(self) -> float:
        """The GPUs' mean peak: an MFU over a mixed cluster is of their summed peaks."""
        return sum(g.gpu.peak_tflops * g.num_gpus for g in self.groups) / self.num_gpus

    @property
    def inter_gbps(self) -> float:
        return (self.link_gbps if self.link_gbps is not None
                else min(g.gpu.internode_gbps_per_gpu for g in self.groups))

    @property
    def inter_latency_us(self) -> float:
        return (self.link_latency_us if self.link_latency_us is not None
                else max(g.gpu.internode_latency_us for g in self.groups))

    def segments(self) -> list:
        """The pipeline's runs of one group: (group index, first pipeline rank, last), in rank
        order (pp is the outermost rank dimension, so each run's global ranks, and the node
        ranks of its hosts, follow one another)."""
        out, start = [], 0
        for i, g in enumerate(self.pipeline):
            if i == len(self.pipeline) - 1 or self.pipeline[i + 1] != g:
                out.append((g, start, i))
                start = i + 1
        return out

    def rank_gpus(self, pp: int) -> list:
        """The GPU of each pipeline rank (the pipeline's groups; the slowest without one)."""
        if len(self.pipeline) == pp:
            return [self.groups[g].gpu for g in self.pipeline]
        return [self.gpu] * pp

    def with_pipeline(self, pipeline) -> "MixedCluster":
        return dataclasses.replace(self, pipeline=tuple(pipeline))

    def to_dict(self) -> dict:
        return {"name": self.name, "num_gpus": self.num_gpus,
                "gpus_per_node": self.gpus_per_node, "gpu": self.gpu.name,
                "groups": [g.to_dict() for g in self.groups], "link_gbps": self.link_gbps,
                "link_latency_us": self.link_latency_us, "pipeline": list(self.pipeline)}


def nvlink_domain_problem(domain, gpus_per_node: int, num_gpus: int) -> str | None:
    """Why `domain` cannot be the NVLink domain of a cluster of `num_gpus` GPUs,
    `gpus_per_node` to a host (None when it can): whole hosts, whole domains."""
    try:
        S.Int(1, B.MAX_GPUS)(domain, "nvlink_domain")
    except S.Invalid as e:
        return str(e)
    if domain > num_gpus:
        return f"nvlink_domain {domain} is more than num_gpus {num_gpus}"
    if domain % gpus_per_node:
        return (f"nvlink_domain {domain} is not a multiple of gpus_per_node {gpus_per_node} "
                f"(an NVLink domain holds whole hosts)")
    if domain != gpus_per_node and num_gpus % domain:
        return (f"num_gpus {num_gpus} is not a multiple of nvlink_domain {domain} (the cluster "
                f"is whole NVLink domains)")
    return None


PLAN_CLUSTER = S.Obj({"name": S.Name(), "num_gpus": S.Int(1, None),
                      "gpus_per_node": (S.Int(1, None), None),
                      "nvlink_domain": (S.Int(1, None), None), "gpu": (S.Name(), None),
                      "gpu_memory_gib": (S.Num(), None), "gpu_spec": (S.Anything(), None),
                      # a mixed cluster's (MixedCluster.to_dict): its groups, each a cluster
                      # of this form, the link between them and the pipeline's groups
                      "groups": (S.List(S.Anything(), 2, 64), None),
                      "link_gbps": (S.Nullable(_BW), None),
                      "link_latency_us": (S.Nullable(_LAT), None),
                      "pipeline": (S.List(S.Int(0, 63), 0, B.MAX_LAYERS), None)})
