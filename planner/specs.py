"""What the planner reasons about: a model, a GPU, a cluster.

Plain frozen dataclasses. Catalog entries live in `planner.catalog`; this module
also reads a Hugging Face `config.json` and a cluster JSON into these types.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from planner.errors import BadInput


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

    def __post_init__(self):
        for f in ("num_layers", "hidden", "ffn_hidden", "num_heads", "num_kv_heads",
                  "vocab_size", "max_seq_len"):
            v = getattr(self, f)
            if not isinstance(v, int) or v <= 0:
                raise BadInput(f"model {self.name}: {f} must be a positive integer, got {v!r}")
        if self.hidden % self.num_heads:
            raise BadInput(f"model {self.name}: hidden {self.hidden} is not divisible by "
                           f"num_heads {self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise BadInput(f"model {self.name}: num_heads {self.num_heads} is not divisible by "
                           f"num_kv_heads {self.num_kv_heads}")
        if self.activation not in ("silu", "gelu", "relu2"):
            raise BadInput(f"model {self.name}: unknown activation {self.activation!r}")
        if self.norm not in ("rmsnorm", "layernorm"):
            raise BadInput(f"model {self.name}: unknown norm {self.norm!r}")
        if self.position not in ("rope", "learned", "alibi"):
            raise BadInput(f"model {self.name}: unknown position embedding {self.position!r}")

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
        return (self.attn_matmul_params() + self.mlp_matmul_params() + self.bias_params()
                + 2 * self.norm_params())

    def embedding_params(self) -> int:
        """Token (and learned position) embeddings: held by the first stage."""
        pos = self.max_seq_len * self.hidden if self.position == "learned" else 0
        return self.vocab_size * self.hidden + pos

    def head_params(self) -> int:
        """Final norm plus the output projection (untied) held by the last stage."""
        return self.norm_params() + (0 if self.tied_embeddings else self.vocab_size * self.hidden)

    def num_params(self) -> int:
        return self.num_layers * self.layer_params() + self.embedding_params() + self.head_params()

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Model":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise BadInput(f"model spec has unknown fields: {', '.join(sorted(unknown))}")
        try:
            return cls(**d)
        except TypeError as e:
            raise BadInput(f"model spec is incomplete: {e}") from None

    def scaled(self, **changes) -> "Model":
        return dataclasses.replace(self, **changes)


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


@dataclass(frozen=True)
class Cluster:
    name: str
    gpu: Gpu
    num_gpus: int
    gpus_per_node: int = 8
    # Figures measured by `python -m profiler` (a planner.profile.Measured, set by
    # planner.profile.apply_profile); the cost model uses them in place of catalog formulas.
    # Not part of the plan JSON.
    measured: object = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.num_gpus <= 0:
            raise BadInput(f"cluster {self.name}: num_gpus must be positive, got {self.num_gpus}")
        if self.gpus_per_node <= 0:
            raise BadInput(f"cluster {self.name}: gpus_per_node must be positive")

    @property
    def num_nodes(self) -> int:
        return math.ceil(self.num_gpus / self.gpus_per_node)

    def to_dict(self) -> dict:
        return {"name": self.name, "num_gpus": self.num_gpus, "gpus_per_node": self.gpus_per_node,
                "gpu": self.gpu.name, "gpu_memory_gib": self.gpu.memory_gib,
                "gpu_spec": dataclasses.asdict(self.gpu)}

    @classmethod
    def from_dict(cls, d: dict) -> "Cluster":
        gpu = Gpu(**d["gpu_spec"]) if "gpu_spec" in d else None
        if gpu is None:
            from planner.catalog import get_gpu
            gpu = get_gpu(d["gpu"])
        return cls(name=d["name"], gpu=gpu, num_gpus=int(d["num_gpus"]),
                   gpus_per_node=int(d.get("gpus_per_node", 8)))


# ---- Hugging Face config.json ----------------------------------------------

HF_MODEL_TYPES = ("llama", "mistral", "qwen2", "gpt2", "gpt_neox", "bloom", "nemotron")


def _act(name: str) -> str:
    name = (name or "").lower()
    if name in ("silu", "swish"):
        return "silu"
    if name.startswith("gelu"):
        return "gelu"
    if name in ("relu2", "squared-relu", "squared_relu", "relu_squared"):
        return "relu2"
    raise BadInput(f"unsupported activation {name!r} in config")


def model_from_hf_config(cfg: dict, name: str) -> Model:
    """Map a Hugging Face config.json onto a Model."""
    mt = cfg.get("model_type")
    if mt not in HF_MODEL_TYPES:
        raise BadInput(f"config {name}: model_type {mt!r} is not supported "
                       f"(supported: {', '.join(HF_MODEL_TYPES)})")
    g = cfg.get
    try:
        if mt in ("llama", "mistral", "qwen2"):
            heads = g("num_attention_heads")
            return Model(
                name=name, num_layers=g("num_hidden_layers"), hidden=g("hidden_size"),
                ffn_hidden=g("intermediate_size"), num_heads=heads,
                num_kv_heads=g("num_key_value_heads") or heads, vocab_size=g("vocab_size"),
                max_seq_len=g("max_position_embeddings", 4096), gated_mlp=True,
                activation=_act(g("hidden_act", "silu")), norm="rmsnorm", position="rope",
                tied_embeddings=bool(g("tie_word_embeddings", False)),
                attn_bias=bool(g("attention_bias", mt == "qwen2")), linear_bias=False,
                norm_eps=float(g("rms_norm_eps", 1e-5)), rope_theta=float(g("rope_theta", 10000.0)))
        if mt == "gpt2":
            h = g("n_embd")
            return Model(
                name=name, num_layers=g("n_layer"), hidden=h, ffn_hidden=g("n_inner") or 4 * h,
                num_heads=g("n_head"), num_kv_heads=g("n_head"), vocab_size=g("vocab_size"),
                max_seq_len=g("n_positions", 1024), gated_mlp=False,
                activation=_act(g("activation_function", "gelu_new")), norm="layernorm",
                position="learned", tied_embeddings=bool(g("tie_word_embeddings", True)),
                attn_bias=True, linear_bias=True, dropout=float(g("resid_pdrop", 0.1)),
                norm_eps=float(g("layer_norm_epsilon", 1e-5)))
        if mt == "gpt_neox":
            h = g("hidden_size")
            return Model(
                name=name, num_layers=g("num_hidden_layers"), hidden=h,
                ffn_hidden=g("intermediate_size"), num_heads=g("num_attention_heads"),
                num_kv_heads=g("num_attention_heads"), vocab_size=g("vocab_size"),
                max_seq_len=g("max_position_embeddings", 2048), gated_mlp=False,
                activation=_act(g("hidden_act", "gelu")), norm="layernorm", position="rope",
                tied_embeddings=bool(g("tie_word_embeddings", False)), attn_bias=True,
                linear_bias=True, parallel_residual=bool(g("use_parallel_residual", True)),
                norm_eps=float(g("layer_norm_eps", 1e-5)),
                rope_theta=float(g("rotary_emb_base", 10000.0)))
        if mt == "bloom":
            h = g("hidden_size") or g("n_embed")
            heads = g("n_head") or g("num_attention_heads")
            return Model(
                name=name, num_layers=g("n_layer") or g("num_hidden_layers"), hidden=h,
                ffn_hidden=4 * h, num_heads=heads, num_kv_heads=heads, vocab_size=g("vocab_size"),
                max_seq_len=g("seq_length", 2048), gated_mlp=False, activation="gelu",
                norm="layernorm", position="alibi", tied_embeddings=True, attn_bias=True,
                linear_bias=True, norm_eps=float(g("layer_norm_epsilon", 1e-5)))
        if mt == "nemotron":
            heads = g("num_attention_heads")
            return Model(
                name=name, num_layers=g("num_hidden_layers"), hidden=g("hidden_size"),
                ffn_hidden=g("intermediate_size"), num_heads=heads,
                num_kv_heads=g("num_key_value_heads") or heads, vocab_size=g("vocab_size"),
                max_seq_len=g("max_position_embeddings", 4096), gated_mlp=False,
                activation=_act(g("hidden_act", "relu2")), norm="layernorm", position="rope",
                tied_embeddings=bool(g("tie_word_embeddings", False)),
                attn_bias=bool(g("attention_bias", False)), linear_bias=bool(g("mlp_bias", False)),
                norm_eps=float(g("norm_eps", 1e-5)), rope_theta=float(g("rope_theta", 10000.0)))
    except BadInput:
        raise
    except (TypeError, ValueError) as e:
        raise BadInput(f"config {name}: malformed ({e})") from None
    raise AssertionError(mt)


def read_json_object(path, what: str) -> dict:
    """A JSON object from `path`, or BadInput naming `what` the file was meant to be."""
    try:
        d = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise BadInput(f"{what} {path}: no such file") from None
    except OSError as e:
        raise BadInput(f"{what} {path}: cannot read ({e.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadInput(f"{what} {path}: not valid JSON ({e})") from None
    if not isinstance(d, dict):
        raise BadInput(f"{what} {path}: not a {what} (expected a JSON object)")
    return d


def load_model_file(path: str) -> Model:
    p = Path(path)
    cfg = read_json_object(path, "model config")
    name = cfg.get("_name") or cfg.get("name") or p.stem
    if "model_type" not in cfg and "num_layers" in cfg:   # our own Model JSON
        return Model.from_dict({**cfg, "name": name})
    return model_from_hf_config(cfg, name)


def load_cluster_file(path: str) -> Cluster:
    p = Path(path)
    d = read_json_object(path, "cluster file")
    from planner.catalog import get_gpu
    try:
        gpu_field = d["gpu"]
        if isinstance(gpu_field, str):
            base = get_gpu(gpu_field)
            overrides = {k: v for k, v in d.items()
                         if k in {f.name for f in dataclasses.fields(Gpu)} and k != "name"}
            gpu = dataclasses.replace(base, **overrides)
        else:
            gpu = Gpu(**gpu_field)
        return Cluster(name=d.get("name", p.stem), gpu=gpu, num_gpus=int(d["num_gpus"]),
                       gpus_per_node=int(d.get("gpus_per_node", 8)))
    except KeyError as e:
        raise BadInput(f"cluster file {path}: missing field {e}") from None
    except (TypeError, ValueError) as e:
        raise BadInput(f"cluster file {path}: malformed ({e})") from None
