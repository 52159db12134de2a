"""What the planner reasons about: a model, a GPU, a cluster.

Plain frozen dataclasses. Catalog entries live in `planner.catalog`; this module
also reads a Hugging Face `config.json` and a cluster JSON into these types.
"""
from __future__ import annotations

import dataclasses
import math
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

    def __post_init__(self):
        who = _who("model", self.name)
        for f, checker in MODEL_FIELDS.items():
            try:
                checker(getattr(self, f), f)
            except S.Invalid as e:
                raise BadInput(f"{who}: {e}") from None
        if self.hidden % self.num_heads:
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
        elif self.experts_per_token or self.moe_ffn_hidden or self.shared_expert_ffn_hidden:
            raise BadInput(f"{who}: experts_per_token, moe_ffn_hidden and "
                           f"shared_expert_ffn_hidden need num_experts >= 1")

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

    @property
    def head_dim(self) -> int:
        return self.hidden // self.num_heads

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    # ---- parameter counts -------------------------------------------------
    def norm_params(self) -> int:
        return self.hidden * (2 if self.norm == "layernorm" else 1)

    def attn_matmul_params(self) -> int:
        """q, k, v and output projection weights."""
        return self.hidden * (self.hidden + 2 * self.kv_dim) + self.hidden * self.hidden

    def mlp_matmul_params(self) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden * self.ffn_hidden

    def bias_params(self) -> int:
        n = (self.hidden + 2 * self.kv_dim) if self.attn_bias else 0
        if self.linear_bias:
            n += self.hidden + (2 if self.gated_mlp else 1) * self.ffn_hidden + self.hidden
        return n

    def layer_params(self) -> int:
        """A dense layer (every layer of a dense model)."""
        return (self.attn_matmul_params() + self.mlp_matmul_params() + self.bias_params()
                + 2 * self.norm_params())

    def expert_params(self) -> int:
        """One routed expert's FFN weights (gated like the dense FFN)."""
        return (3 if self.gated_mlp else 2) * self.hidden * self.moe_ffn_hidden

    def router_params(self) -> int:
        return self.hidden * self.num_experts

    def shared_expert_params(self) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden * self.shared_expert_ffn_hidden

    def moe_layer_params(self) -> int:
        """An MoE layer: attention, norms, router, shared experts and every routed expert."""
        return (self.attn_matmul_params() + 2 * self.norm_params() + self.router_params()
                + self.shared_expert_params() + self.num_experts * self.expert_params()
                + ((self.hidden + 2 * self.kv_dim) if self.attn_bias else 0))

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

    def num_params(self) -> int:
        moe = self.num_moe_layers
        return ((self.num_layers - moe) * self.layer_params() + moe * self.moe_layer_params()
                + self.embedding_params() + self.head_params())

    def active_params(self) -> int:
        """Parameters one token runs through (num_params for a dense model)."""
        moe = self.num_moe_layers
        return ((self.num_layers - moe) * self.layer_params()
                + moe * self.moe_layer_active_params()
                + self.embedding_params() + self.head_params())

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

HF_MODEL_TYPES = ("llama", "mistral", "qwen2", "gpt2", "gpt_neox", "bloom", "nemotron")
_MISSING = object()


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


def model_from_hf_config(cfg: dict, name: str, where: str | None = None) -> Model:
    """Map a Hugging Face config.json onto a Model. Keys the planner does not read are
    ignored (config.json files carry many); every key it reads is type- and range-checked,
    and null means "not given" (the default)."""
    where = where or f"config {S.show_path(name)}"
    if not isinstance(cfg, dict):
        raise BadInput(f"{where}: not a config (expected a JSON object)")
    mt = cfg.get("model_type")
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

    i = MODEL_FIELDS
    flag, eps, theta = S.Bool(), MODEL_FIELDS["norm_eps"], MODEL_FIELDS["rope_theta"]
    def standard(max_pos: int, grouped_kv: bool) -> dict:
        """The fields every config with Hugging Face's usual key names shares."""
        heads = get("num_attention_heads", i["num_heads"])
        return dict(
            num_layers=get("num_hidden_layers", i["num_layers"]),
            hidden=get("hidden_size", i["hidden"]),
            ffn_hidden=get("intermediate_size", i["ffn_hidden"]), num_heads=heads,
            num_kv_heads=(get("num_key_value_heads", i["num_kv_heads"], heads) if grouped_kv
                          else heads),
            vocab_size=get("vocab_size", i["vocab_size"]),
            max_seq_len=get("max_position_embeddings", i["max_seq_len"], max_pos),
            position="rope", tied_embeddings=get("tie_word_embeddings", flag, False))

    if mt in ("llama", "mistral", "qwen2"):
        kw = dict(
            standard(4096, grouped_kv=True), gated_mlp=True,
            activation=act("hidden_act", "silu"), norm="rmsnorm",
            attn_bias=get("attention_bias", flag, mt == "qwen2"), linear_bias=False,
            norm_eps=get("rms_norm_eps", eps, 1e-5), rope_theta=get("rope_theta", theta, 10000.0))
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


def load_model_file(path: str) -> Model:
    p = Path(path)
    cfg = read_json_object(path, "model config")
    where = f"model config {S.show_path(path)}"
    name = cfg.get("_name") or cfg.get("name") or p.stem
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
