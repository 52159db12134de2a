"""What the planner reasons about: a model, a GPU, a cluster.

Plain frozen dataclasses. Catalog entries live in `planner.catalog`; this module
also reads a Hugging Face `config.json` and a cluster JSON into these types.
"""
from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from planner import bounds as B
from planner import schema as S
from planner.errors import BadInput

ACTIVATIONS = ("silu", "gelu", "relu2")
NORMS = ("rmsnorm", "layernorm")
POSITIONS = ("rope", "learned", "alibi")

# Every Model field: its type and range (planner.schema checkers). Model.__post_init__ checks
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
    "nvlink_busbw_gbps": _BW,
    "nvlink_p2p_gbps": _BW,
    "nvlink_latency_us": _LAT,
    "internode_gbps_per_gpu": _BW,
    "internode_latency_us": _LAT,
    "overlap_slowdown": S.Num(ge=0.0, le=2.0),
}


@dataclass(frozen=True)
class Gpu:
    """One accelerator. Every figure is cited in `planner.catalog.gpus`."""

    name: str
    peak_tflops: float            # dense bf16 (fp32 for the cpu entry)
    memory_gib: float             # capacity as the driver reports it
    hbm_gbps: float               # memory bandwidth, GB/s
    gemm_efficiency: float        # fraction of peak a large GEMM reaches
    attn_efficiency: float        # fraction of peak flash attention reaches
    nvlink_busbw_gbps: float      # intra-node all-reduce bus bandwidth, GB/s
    nvlink_p2p_gbps: float        # intra-node point-to-point, GB/s, one direction
    nvlink_latency_us: float
    internode_gbps_per_gpu: float  # one NIC per GPU, GB/s, one direction
    internode_latency_us: float
    # compute slowdown while a collective runs beside it, as a fraction of the collective's time
    overlap_slowdown: float = 0.15

    def __post_init__(self):
        who = _who("gpu", self.name)
        for f, checker in GPU_FIELDS.items():
            try:
                checker(getattr(self, f), f)
            except S.Invalid as e:
                raise BadInput(f"{who}: {e}") from None


GPU_SCHEMA = _schema_of(Gpu, GPU_FIELDS)
GPU_OVERRIDES = tuple(f for f in GPU_FIELDS if f != "name")
# a GPU in a file: all its figures, or "base": a catalog GPU and the figures that differ
GPU_OBJECT = S.Obj({"base": (S.Name(), None),
                    **{k: (v, None) for k, v in GPU_FIELDS.items()}})


def gpu_from_json(v, where: str, path: str = "gpu") -> "Gpu":
    """A Gpu from a file's `gpu` value: a catalog name ("h100"), or an object with either all
    the figures or "base" plus the figures that differ."""
    from planner.catalog import get_gpu
    try:
        if not isinstance(v, (str, dict)):
            raise S.Invalid(path, f"must be a catalog GPU name or an object of GPU figures, "
                                  f"got {S.show(v)}")
        if isinstance(v, str):
            S.Name()(v, path)
        else:
            d = GPU_OBJECT(v, path)
    except S.Invalid as e:
        raise BadInput(f"{where}: {e}") from None
    if isinstance(v, str):
        try:
            return get_gpu(v)
        except BadInput as e:
            raise BadInput(f"{where}: {path}: {e}") from None
    base = d.pop("base", None)
    if base is not None:
        try:
            start = get_gpu(base)
        except BadInput as e:
            raise BadInput(f"{where}: {path}.base: {e}") from None
        try:
            return dataclasses.replace(start, **d)
        except BadInput as e:
            raise BadInput(f"{where}: {path}: {e}") from None
    missing = [k for k, f in GPU_SCHEMA.fields.items() if f[1] is S.REQUIRED and k not in d]
    if missing:
        raise BadInput(f"{where}: {path} is missing {', '.join(missing)}; give them all, or "
                       f"\"base\": \"<catalog gpu>\" and only the figures that differ")
    try:
        return Gpu(**d)
    except BadInput as e:
        raise BadInput(f"{where}: {path}: {e}") from None


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
    def tp_domain(self) -> int:
        """The most GPUs a tensor-parallel group may span and still talk over NVLink."""
        return self.nvlink_domain

    def to_dict(self) -> dict:
        return {"name": self.name, "num_gpus": self.num_gpus, "gpus_per_node": self.gpus_per_node,
                "nvlink_domain": self.nvlink_domain, "gpu": self.gpu.name,
                "gpu_memory_gib": self.gpu.memory_gib, "gpu_spec": dataclasses.asdict(self.gpu)}

    @classmethod
    def from_dict(cls, d: dict, what: str = "cluster") -> "Cluster":
        """The plan's form (to_dict): `gpu_spec` holds the GPU's figures (else the catalog's
        `gpu`); `gpu` and `gpu_memory_gib`, written for readers, must agree with it."""
        d = S.check(PLAN_CLUSTER, d, what)
        if "gpu_spec" in d:
            gpu = gpu_from_json(d["gpu_spec"], what, "gpu_spec")
        elif "gpu" in d:
            gpu = gpu_from_json(d["gpu"], what, "gpu")
        else:
            raise BadInput(f"{what}: missing 'gpu_spec' (or a catalog 'gpu')")
        if "gpu_spec" in d and "gpu" in d and d["gpu"] != gpu.name:
            raise BadInput(f"{what}: gpu {S.show_path(d['gpu'])!r} is not gpu_spec's "
                           f"{gpu.name!r}; edit gpu_spec, the figures the planner uses")
        mem = d.get("gpu_memory_gib")
        if mem is not None and not math.isclose(mem, gpu.memory_gib, rel_tol=1e-9):
            raise BadInput(f"{what}: gpu_memory_gib {mem:g} differs from gpu_spec.memory_gib "
                           f"{gpu.memory_gib:g}; edit gpu_spec, the figures the planner uses")
        n = d["num_gpus"]
        gpn = d.get("gpus_per_node")
        try:       # plans written before nvlink_domain: the node is the NVLink domain
            return cls(name=d["name"], gpu=gpu, num_gpus=n,
                       gpus_per_node=min(8, n) if gpn is None else gpn,
                       nvlink_domain=d.get("nvlink_domain"))
        except BadInput as e:
            raise BadInput(f"{what}: {e}") from None


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
                      "gpu_memory_gib": (S.Num(), None), "gpu_spec": (S.Anything(), None)})


# ---- Hugging Face config.json ----------------------------------------------
# Each model type's fields are read as its transformers configuration and modeling source reads
# them (src/transformers/models/<type>/configuration_<type>.py and modeling_<type>.py, named at
# each branch below).

HF_MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe",
                  "gemma", "gemma2", "gemma3_text", "phi3", "deepseek_v2", "deepseek_v3",
                  "gpt_oss", "llama4_text", "gpt2", "gpt_neox", "bloom", "nemotron")
# multimodal configs whose language model is their `text_config` (Gemma3Config, Llama4Config)
HF_TEXT_WRAPPERS = {"gemma3": "gemma3_text", "llama4": "llama4_text"}
_MISSING = object()

# Fields that change a model's parameters, FLOPs or function but that the planner does not
# model: present (and not their no-op value) they draw a one-line warning.
HF_UNMODELLED = {
    # Llama 4: RoPE layers attend within chunks of this many tokens (Llama4TextAttention);
    # priced here as full causal attention
    "attention_chunk_size": None,
    # RoPE on part of each head (Phi-3, StableLM, GLM): element-wise only
    "partial_rotary_factor": 1.0,
    # pre-quantised checkpoints (gpt-oss MXFP4 experts, DeepSeek-V3 FP8): planned as bf16
    # training weights
    "quantization_config": None,
}


def hf_warn(where: str, message: str) -> None:
    """The one-line warning for a config field the planner reads approximately or not at all."""
    print(f"warning: {where}: {message}", file=sys.stderr)


def _act(name: str, key: str = "hidden_act") -> str:
    n = name.lower()
    if n in ("silu", "swish"):
        return "silu"
    if n.startswith("gelu"):
        return "gelu"
    if n in ("relu2", "squared-relu", "squared_relu", "relu_squared"):
        return "relu2"
    raise BadInput(f"{key} {S.show(name)} is not supported (supported: silu/swish, gelu*, "
                   f"relu2)")


def _interval_of(full: list) -> int | None:
    """k such that layer i is full attention exactly when (i + 1) % k == 0 (0: none is), or
    None when the flags follow no such pattern."""
    if not any(full):
        return 0
    k = full.index(True) + 1
    return k if all(f == ((i + 1) % k == 0) for i, f in enumerate(full)) else None


def _dense_prefix(layers, n: int) -> int | None:
    """len(layers) when `layers` (indices) are exactly the first ones 0..k-1, else None."""
    s = sorted(set(layers))
    return len(s) if s == list(range(len(s))) and len(s) <= n else None


def model_from_hf_config(cfg: dict, name: str, where: str | None = None) -> Model:
    """Map a Hugging Face config.json onto a Model. Keys the planner does not read are
    ignored (config.json files carry many), but a key that changes the math and is not
    modelled draws a one-line warning (hf_warn); every key it reads is type- and
    range-checked, and null means "not given" (the default)."""
    where = where or f"config {S.show_path(name)}"
    if not isinstance(cfg, dict):
        raise BadInput(f"{where}: not a config (expected a JSON object)")
    mt = cfg.get("model_type")
    if isinstance(mt, str) and mt in HF_TEXT_WRAPPERS:
        text = cfg.get("text_config")
        if not isinstance(text, dict):
            raise BadInput(f"{where}: model_type {mt!r} needs a text_config object")
        hf_warn(where, f"{mt}: only the language model (text_config) is planned, not the "
                       f"vision encoder")
        cfg = {"model_type": HF_TEXT_WRAPPERS[mt], **text}
        mt = cfg["model_type"]
    if mt is None:
        raise BadInput(f"{where}: neither a Hugging Face config.json (no model_type) nor a "
                       f"planner model spec (no num_layers)")
    if not isinstance(mt, str) or mt not in HF_MODEL_TYPES:
        raise BadInput(f"{where}: model_type {S.show(mt)} is not supported "
                       f"(supported: {', '.join(HF_MODEL_TYPES)})")

    def get(key, checker, default=_MISSING):
        v = cfg.get(key)
        if v is None:
            if default is _MISSING:
                raise BadInput(f"{where}: missing {key!r}")
            return default
        try:
            return checker(v, key)
        except S.Invalid as e:
            raise BadInput(f"{where}: {e}") from None

    def first(keys, checker, default=_MISSING):
        for k in keys:
            if cfg.get(k) is not None:
                return get(k, checker)
        if default is _MISSING:
            raise BadInput(f"{where}: missing {' or '.join(repr(k) for k in keys)}")
        return default

    def act(key, default):
        try:
            return _act(get(key, S.Str(100), default), key)
        except BadInput as e:
            if str(e).startswith(where):
                raise
            raise BadInput(f"{where}: {e}") from None

    for key, noop in HF_UNMODELLED.items():
        if cfg.get(key) is not None and cfg.get(key) != noop:
            shown = "given" if isinstance(cfg[key], (dict, list)) else S.show(cfg[key])
            hf_warn(where, f"{key} ({shown}) changes the math but is not modelled; ignored")

    i = MODEL_FIELDS
    flag, eps, theta = S.Bool(), MODEL_FIELDS["norm_eps"], MODEL_FIELDS["rope_theta"]
    count = S.Int(0, B.MAX_HIDDEN)
    layers_n = get("num_hidden_layers", i["num_layers"], 1)     # for layer patterns

    def max_seq(max_pos: int) -> int:
        """max_position_embeddings, or what rope scaling stretches the trained context to:
        factor x original_max_position_embeddings (transformers modeling_rope_utils: linear,
        dynamic, yarn, llama3, longrope all scale the original context by `factor`)."""
        n = get("max_position_embeddings", i["max_seq_len"], max_pos)
        rs = cfg.get("rope_scaling")
        if rs is None:
            rs = cfg.get("rope_parameters")
        if isinstance(rs, dict) and isinstance(rs.get("rope_type", rs.get("type")), str):
            kind = rs.get("rope_type", rs.get("type"))
            fac, orig = rs.get("factor"), rs.get("original_max_position_embeddings")
            known = ("default", "linear", "dynamic", "yarn", "llama3", "longrope", "su",
                     "mrope", "proportional")
            if kind not in known:
                hf_warn(where, f"rope_scaling type {S.show(kind)} is not understood; the "
                               f"context stays max_position_embeddings {n}")
            elif (isinstance(fac, (int, float)) and not isinstance(fac, bool)
                  and isinstance(orig, int) and not isinstance(orig, bool) and fac > 0 < orig):
                n = max(n, min(int(fac * orig), B.MAX_SEQ_LEN))
        elif rs is not None:
            hf_warn(where, "rope_scaling is not an object with a rope_type; ignored")
        return n

    def rope_theta(default: float) -> float:
        rp = cfg.get("rope_parameters")        # transformers v5 keeps rope_theta in here
        if isinstance(rp, dict) and rp.get("rope_theta") is not None and "rope_theta" not in cfg:
            try:
                return theta(rp["rope_theta"], "rope_parameters.rope_theta")
            except S.Invalid as e:
                raise BadInput(f"{where}: {e}") from None
        return get("rope_theta", theta, default)

    def head_dim(hidden: int, heads: int) -> int:
        """`head_dim` when it is not hidden / heads (stored as head_dim_override)."""
        d = get("head_dim", count, 0)
        return 0 if d == 0 or (hidden % heads == 0 and d == hidden // heads) else d

    def windows(all_layers: bool, every: int = 0) -> dict:
        """sliding_window and full_attention_interval: from `layer_types` where the config has
        it (transformers >= 4.53: "sliding_attention" / "full_attention" per layer), else every
        layer (all_layers) or the model type's fixed pattern (`every`)."""
        w = get("sliding_window", S.Int(1, B.MAX_SEQ_LEN), 0)
        lt = cfg.get("layer_types")
        if isinstance(lt, list) and lt and all(isinstance(x, str) for x in lt):
            sliding = [x in ("sliding_attention", "chunked_attention") for x in lt]
            if not any(sliding):
                return dict(sliding_window=0, full_attention_interval=0)
            k = _interval_of([not x for x in sliding])
            if w == 0 or k is None or len(lt) != layers_n:
                hf_warn(where, "layer_types mixes sliding and full attention in a pattern the "
                               "planner does not model; every layer priced as full attention")
                return dict(sliding_window=0, full_attention_interval=0)
            return dict(sliding_window=w, full_attention_interval=k)
        if w == 0:
            return dict(sliding_window=0, full_attention_interval=0)
        return dict(sliding_window=w, full_attention_interval=0 if all_layers else every)

    def qwen_windows() -> dict:
        """Qwen2/3 (configuration_qwen2.py): the window applies only with use_sliding_window,
        to layers i >= max_window_layers."""
        if not get("use_sliding_window", flag, False):
            return dict(sliding_window=0, full_attention_interval=0)
        first_sliding = get("max_window_layers", S.Int(0, B.MAX_LAYERS), 0)
        if first_sliding >= layers_n:
            return dict(sliding_window=0, full_attention_interval=0)
        if first_sliding == 0 or "layer_types" in cfg:
            return windows(all_layers=True)
        hf_warn(where, f"use_sliding_window from layer {first_sliding} on is not modelled; "
                       f"every layer priced as full attention")
        return dict(sliding_window=0, full_attention_interval=0)

    def standard(max_pos: int, grouped_kv: bool) -> dict:
        """The fields every config with Hugging Face's usual key names shares."""
        heads = get("num_attention_heads", i["num_heads"])
        hidden = get("hidden_size", i["hidden"])
        return dict(
            num_layers=get("num_hidden_layers", i["num_layers"]), hidden=hidden,
            ffn_hidden=get("intermediate_size", i["ffn_hidden"]), num_heads=heads,
            num_kv_heads=(get("num_key_value_heads", i["num_kv_heads"], heads) if grouped_kv
                          else heads),
            vocab_size=get("vocab_size", i["vocab_size"]),
            max_seq_len=max_seq(max_pos), head_dim_override=head_dim(hidden, heads),
            position="rope", tied_embeddings=get("tie_word_embeddings", flag, False))

    def llama_like(max_pos: int, attn_bias: bool, act_default: str = "silu",
                   act_key: str = "hidden_act", tied: bool = False) -> dict:
        """Llama's block (LlamaAttention, LlamaMLP: gated, RMSNorm), shared by Mistral, Qwen,
        Gemma, Phi-3 and the MoE types below."""
        kw = standard(max_pos, grouped_kv=True)
        if get("mlp_bias", flag, False):
            hf_warn(where, "mlp_bias: the MLP's biases are not counted")
        return dict(kw, gated_mlp=True, activation=act(act_key, act_default), norm="rmsnorm",
                    attn_bias=get("attention_bias", flag, attn_bias), linear_bias=False,
                    norm_eps=get("rms_norm_eps", eps, 1e-6 if mt.startswith("gemma") else 1e-5),
                    rope_theta=rope_theta(10000.0),
                    tied_embeddings=get("tie_word_embeddings", flag, tied))

    def routed(experts_key, width_key="moe_intermediate_size") -> dict:
        n = first(experts_key, i["num_experts"])
        return dict(num_experts=n,
                    experts_per_token=first(("num_experts_per_tok", "experts_per_token"),
                                            i["experts_per_token"]),
                    moe_ffn_hidden=get(width_key, i["moe_ffn_hidden"]))

    if mt in ("llama", "mistral", "qwen2", "qwen3", "phi3"):
        # Mistral (modeling_mistral.py) and Phi-3 (modeling_phi3.py: fused qkv_proj and
        # gate_up_proj, the same weights) apply sliding_window to every layer; Qwen2/3 only
        # with use_sliding_window (qwen_windows)
        kw = dict(llama_like(4096, attn_bias=mt == "qwen2"),
                  **(qwen_windows() if mt in ("qwen2", "qwen3")
                     else windows(all_layers=True) if mt in ("mistral", "phi3")
                     else dict(sliding_window=0, full_attention_interval=0)))
    elif mt in ("gemma", "gemma2", "gemma3_text"):
        # modeling_gemma*.py: head_dim 256 (not hidden / heads), GELU-tanh gated MLP
        # (`hidden_activation`), tied embeddings. Gemma 2: layer i slides when i is even
        # (Gemma2DecoderLayer is_sliding = not bool(layer_idx % 2)); Gemma 3: 5 local to 1
        # global (sliding_window_pattern 6, (i + 1) % 6 == 0 global). Their extra
        # post-attention / post-feed-forward RMSNorms (2 x hidden per layer) and Gemma 3's
        # q/k norms (2 x head_dim) are not counted (< 0.01% of the model).
        every = 2 if mt == "gemma2" else get("sliding_window_pattern", S.Int(1, B.MAX_LAYERS), 6)
        kw = dict(llama_like(8192, attn_bias=False, act_default="gelu_pytorch_tanh",
                             act_key="hidden_activation" if cfg.get("hidden_activation")
                             else "hidden_act", tied=True),
                  **(windows(all_layers=False, every=every) if mt != "gemma"
                     else dict(sliding_window=0, full_attention_interval=0)))
    elif mt == "mixtral":
        # modeling_mixtral.py MixtralSparseMoeBlock: num_local_experts experts of
        # intermediate_size, top num_experts_per_tok, router gate Linear(hidden, experts,
        # bias=False); every layer MoE; sliding_window (null in Mixtral-8x7B-v0.1) on all layers
        kw = dict(llama_like(4096 * 32, attn_bias=False), **windows(all_layers=True),
                  **routed(("num_local_experts",), "intermediate_size"))
    elif mt in ("qwen2_moe", "qwen3_moe"):
        # modeling_qwen2_moe.py / modeling_qwen3_moe.py: layer i is sparse when i is not in
        # mlp_only_layers and (i + 1) % decoder_sparse_step == 0; dense layers use
        # intermediate_size. Qwen2-MoE adds a shared expert (shared_expert_intermediate_size)
        # behind a sigmoid gate Linear(hidden, 1) (not counted: hidden per layer) and q/k/v
        # biases; Qwen3-MoE has neither (and RMSNorm q/k norms of head_dim, not counted).
        dense = get("mlp_only_layers", S.List(S.Int(0, B.MAX_LAYERS)), [])
        prefix = _dense_prefix(dense, layers_n)
        if prefix is None:
            hf_warn(where, f"mlp_only_layers {S.show(dense)} are not the first layers; they "
                           f"are priced as MoE layers")
            prefix = 0
        kw = dict(llama_like(32768, attn_bias=mt == "qwen2_moe"), **qwen_windows(),
                  **routed(("num_experts",)), first_dense_layers=prefix,
                  moe_layer_interval=get("decoder_sparse_step", i["moe_layer_interval"], 1))
        if mt == "qwen2_moe":
            kw["shared_expert_ffn_hidden"] = get("shared_expert_intermediate_size", count, 0)
        if prefix and kw["moe_layer_interval"] > 1:
            hf_warn(where, "mlp_only_layers with decoder_sparse_step > 1: the sparse layers "
                           "are counted from the first non-dense layer")
    elif mt in ("deepseek_v2", "deepseek_v3"):
        # modeling_deepseek_v3.py: DeepseekV3Attention (MLA, see Model.q_lora_rank), the
        # first first_k_dense_replace layers dense (intermediate_size), the rest
        # DeepseekV3MoE: n_routed_experts of moe_intermediate_size, top num_experts_per_tok,
        # shared experts DeepseekV3MLP(moe_intermediate_size * n_shared_experts). The gate's
        # e_score_correction_bias (n_routed_experts per layer) is not counted.
        # num_nextn_predict_layers: the MTP modules (DeepSeek's modeling code; HF does not
        # build them but the checkpoint holds them, layer 61 of DeepSeek-V3).
        moe = routed(("n_routed_experts",))
        if get("moe_layer_freq", S.Int(1, B.MAX_LAYERS), 1) != 1:
            hf_warn(where, "moe_layer_freq > 1 (MoE on layers i % freq == 0) is priced as "
                           "every layer after first_k_dense_replace being MoE")
        heads = get("num_attention_heads", i["num_heads"])
        kw = dict(llama_like(4096, attn_bias=False), **moe,
                  shared_expert_ffn_hidden=get("n_shared_experts", count, 0)
                  * moe["moe_ffn_hidden"],
                  first_dense_layers=get("first_k_dense_replace", S.Int(0, B.MAX_LAYERS), 0),
                  q_lora_rank=get("q_lora_rank", count, 0),
                  kv_lora_rank=get("kv_lora_rank", S.Int(1, B.MAX_HIDDEN)),
                  qk_rope_head_dim=get("qk_rope_head_dim", S.Int(1, B.MAX_HIDDEN)),
                  qk_nope_head_dim=get("qk_nope_head_dim", S.Int(1, B.MAX_HIDDEN)),
                  v_head_dim=get("v_head_dim", S.Int(1, B.MAX_HIDDEN)),
                  head_dim_override=0, num_kv_heads=heads,
                  mtp_layers=get("num_nextn_predict_layers", S.Int(0, B.MAX_LAYERS), 0))
    elif mt == "gpt_oss":
        # modeling_gpt_oss.py: GptOssAttention (head_dim, q/k/v/o biases = attention_bias,
        # per-head `sinks`), layer_types alternating sliding / full (sliding_window 128);
        # GptOssExperts: num_local_experts of intermediate_size with gate_up and down biases;
        # GptOssTopKRouter with a bias; every layer MoE. The o_proj bias (hidden per layer)
        # is not counted.
        kw = dict(llama_like(131072, attn_bias=True), **windows(all_layers=False, every=2),
                  **routed(("num_local_experts", "num_experts"), "intermediate_size"),
                  expert_bias=True, attention_sinks=True)
    elif mt == "llama4_text":
        # modeling_llama4.py: Llama4TextMoe (num_local_experts of intermediate_size, top
        # num_experts_per_tok, a shared expert Llama4TextMLP of intermediate_size) on layers
        # config.moe_layers (default step-1, 2*step-1, ...: interleave_moe_layer_step), the
        # other layers a dense Llama4TextMLP of intermediate_size_mlp.
        step = get("interleave_moe_layer_step", i["moe_layer_interval"], 1)
        moe_at = cfg.get("moe_layers")
        if isinstance(moe_at, list) and moe_at != list(range(step - 1, layers_n, step)):
            hf_warn(where, "moe_layers differs from interleave_moe_layer_step's pattern; "
                           "priced as that pattern")
        moe = routed(("num_local_experts",), "intermediate_size")
        kw = dict(llama_like(4096 * 32, attn_bias=False), **moe,
                  shared_expert_ffn_hidden=moe["moe_ffn_hidden"],
                  ffn_hidden=get("intermediate_size_mlp", i["ffn_hidden"]),
                  moe_layer_interval=step)
    elif mt == "gpt2":
        h = get("n_embd", i["hidden"])
        heads = get("n_head", i["num_heads"])
        kw = dict(
            num_layers=get("n_layer", i["num_layers"]), hidden=h,
            ffn_hidden=get("n_inner", i["ffn_hidden"], 4 * h), num_heads=heads,
            num_kv_heads=heads, vocab_size=get("vocab_size", i["vocab_size"]),
            max_seq_len=get("n_positions", i["max_seq_len"], 1024), gated_mlp=False,
            activation=act("activation_function", "gelu_new"), norm="layernorm",
            position="learned", tied_embeddings=get("tie_word_embeddings", flag, True),
            attn_bias=True, linear_bias=True,
            dropout=get("resid_pdrop", MODEL_FIELDS["dropout"], 0.1),
            norm_eps=get("layer_norm_epsilon", eps, 1e-5))
    elif mt == "gpt_neox":
        kw = dict(
            standard(2048, grouped_kv=False), gated_mlp=False,
            activation=act("hidden_act", "gelu"), norm="layernorm", attn_bias=True,
            linear_bias=True, parallel_residual=get("use_parallel_residual", flag, True),
            norm_eps=get("layer_norm_eps", eps, 1e-5),
            rope_theta=get("rotary_emb_base", theta, 10000.0))
        if get("rotary_pct", S.Num(gt=0.0, le=1.0), 1.0) != 1.0:
            hf_warn(where, "rotary_pct (RoPE on part of each head) is not modelled; ignored")
    elif mt == "bloom":
        h = first(("hidden_size", "n_embed"), i["hidden"])
        heads = first(("n_head", "num_attention_heads"), i["num_heads"])
        kw = dict(
            num_layers=first(("n_layer", "num_hidden_layers"), i["num_layers"]), hidden=h,
            ffn_hidden=4 * h, num_heads=heads, num_kv_heads=heads,
            vocab_size=get("vocab_size", i["vocab_size"]),
            max_seq_len=get("seq_length", i["max_seq_len"], 2048), gated_mlp=False,
            activation="gelu", norm="layernorm", position="alibi", tied_embeddings=True,
            attn_bias=True, linear_bias=True, norm_eps=get("layer_norm_epsilon", eps, 1e-5))
    else:   # nemotron
        kw = dict(
            standard(4096, grouped_kv=True), gated_mlp=False,
            activation=act("hidden_act", "relu2"), norm="layernorm",
            attn_bias=get("attention_bias", flag, False), linear_bias=get("mlp_bias", flag, False),
            norm_eps=get("norm_eps", eps, 1e-5), rope_theta=get("rope_theta", theta, 10000.0))
    try:
        return Model(name=name, **kw)
    except BadInput as e:
        raise BadInput(f"{where}: {e}") from None


def read_json_object(path, what: str) -> dict:
    """A JSON object from `path`, or BadInput naming `what` the file was meant to be
    (planner.schema.read_json_object: size, depth, finite numbers, no duplicate keys)."""
    return S.read_json_object(path, what)


def model_name_of(cfg: dict, path: Path) -> str:
    """A plan's name for a model file: the config's own name ("_name", "name", or the last
    part of Hugging Face's "_name_or_path"), else the model directory's name for a
    config.json (in it or given as the directory), else the file's stem."""
    for key in ("_name", "name"):
        if isinstance(cfg.get(key), str) and cfg[key].strip():
            return cfg[key]
    nop = cfg.get("_name_or_path")
    if isinstance(nop, str) and nop.strip("/ ").strip():
        return nop.rstrip("/").rsplit("/", 1)[-1]
    if path.name == "config.json":
        return path.resolve().parent.name or "model"
    return path.stem


def load_model_file(path: str) -> Model:
    """A model from a config.json, a model directory holding one, or a planner model spec."""
    p = Path(path)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise BadInput(f"model directory {S.show_path(path)} has no config.json")
        p = p / "config.json"
        path = str(p)
    cfg = read_json_object(path, "model config")
    where = f"model config {S.show_path(path)}"
    name = model_name_of(cfg, p)
    if S.bad_name_reason(name):
        raise BadInput(f"{where}: name {S.bad_name_reason(name)}")
    if "model_type" not in cfg and "num_layers" in cfg:   # our own Model JSON
        return Model.from_dict({**cfg, "name": name}, where)
    return model_from_hf_config(cfg, name, where)


# A cluster file: a catalog GPU ("gpu": "h100" or "base": "h100") with the figures that differ
# at the top level, or "gpu": {all the figures} / {"base": ..., figures}.
CLUSTER_FILE = S.Obj({"name": (S.Name(), None), "num_gpus": S.Int(1, None),
                      "gpus_per_node": (S.Int(1, None), None),
                      "nvlink_domain": (S.Int(1, None), None), "gpu": (S.Anything(), None),
                      "base": (S.Name(), None),
                      **{k: (GPU_FIELDS[k], None) for k in GPU_OVERRIDES}})


def load_cluster_file(path: str) -> Cluster:
    where = f"cluster file {S.show_path(path)}"
    d = S.check(CLUSTER_FILE, read_json_object(path, "cluster file"), where)
    if ("gpu" in d) == ("base" in d):
        raise BadInput(f"{where}: give " + ("either 'gpu' or 'base', not both" if "gpu" in d else
                                            "'gpu' (a catalog GPU or an object of its figures) "
                                            "or 'base' (a catalog GPU) with the figures that "
                                            "differ"))
    gpu = gpu_from_json(d["gpu"] if "gpu" in d else d["base"], where,
                        "gpu" if "gpu" in d else "base")
    overrides = {k: d[k] for k in GPU_OVERRIDES if k in d}
    if overrides:
        try:
            gpu = dataclasses.replace(gpu, **overrides)
        except BadInput as e:
            raise BadInput(f"{where}: {e}") from None
    n = d["num_gpus"]
    gpn = d.get("gpus_per_node")
    if gpn is not None and gpn > n:
        raise BadInput(f"{where}: gpus_per_node {gpn} is more than num_gpus {n}")
    if n > B.MAX_GPUS:
        raise BadInput(f"{where}: {S.show(n)} GPUs is more than this planner plans for "
                       f"(at most {B.MAX_GPUS})")
    name = d.get("name") or Path(path).stem
    domain = d.get("nvlink_domain")
    # what is not given comes from the GPU's catalog system (planner.catalog.SYSTEMS: 8 to a
    # host and an NVLink domain; GB200/GB300 NVL72: 4 to a host, 72 to a domain); a given
    # gpus_per_node alone is also the NVLink domain
    from planner.catalog import host_size, system_layout
    if gpn is None and domain is None:
        try:
            gpn, domain = system_layout(gpu.name, n)
        except BadInput as e:
            raise BadInput(f"{where}: {e}; or give gpus_per_node and nvlink_domain") from None
    elif gpn is None:
        gpn = host_size(gpu.name, n)
    try:
        return Cluster(name=name, gpu=gpu, num_gpus=n, gpus_per_node=gpn, nvlink_domain=domain)
    except BadInput as e:
        raise BadInput(f"{where}: {e}") from None
