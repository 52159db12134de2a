"""Reading one Hugging Face config.json: typed getters and the blocks model families share.

Each model type's fields are read as its transformers configuration and modeling source reads
them (src/transformers/models/<type>/configuration_<type>.py and modeling_<type>.py, named in
each family's module). Keys the planner does not read are ignored (config.json files carry
many); every key it reads is type- and range-checked (planner.specs.MODEL_FIELDS), and null
means "not given" (the default).
"""
from __future__ import annotations

import sys

from planner import limits as B
from planner import filecheck as S
from planner.errors import BadInput
from planner.specs import MODEL_FIELDS, yarn_attention_factor

_MISSING = object()
# the checkers of the fields most families read
FLAG = S.Bool()
EPS = MODEL_FIELDS["norm_eps"]
THETA = MODEL_FIELDS["rope_theta"]
COUNT = S.Int(0, B.MAX_HIDDEN)
NO_WINDOW = dict(sliding_window=0, full_attention_interval=0)


def hf_warn(where: str, message: str) -> None:
    """The one-line warning for a config field the planner reads approximately or not at all."""
    print(f"warning: {where}: {message}", file=sys.stderr)


def activation_of(name: str, key: str = "hidden_act") -> str:
    """The planner's activation (planner.specs.ACTIVATIONS) for a config's activation name."""
    n = name.lower()
    if n in ("silu", "swish"):
        return "silu"
    if n.startswith("gelu"):
        return "gelu"
    if n in ("relu2", "squared-relu", "squared_relu", "relu_squared"):
        return "relu2"
    raise BadInput(f"{key} {S.show(name)} is not supported (supported: silu/swish, gelu*, "
                   f"relu2)")


def interval_of(full: list) -> int | None:
    """k such that layer i is full attention exactly when (i + 1) % k == 0 (0: none is), or
    None when the flags follow no such pattern."""
    if not any(full):
        return 0
    k = full.index(True) + 1
    return k if all(f == ((i + 1) % k == 0) for i, f in enumerate(full)) else None


def dense_prefix(layers, n: int) -> int | None:
    """len(layers) when `layers` (indices) are exactly the first ones 0..k-1, else None."""
    s = sorted(set(layers))
    return len(s) if s == list(range(len(s))) and len(s) <= n else None


class HfConfig:
    """One config.json (`cfg`) of `model_type`, named `where` in messages."""

    def __init__(self, cfg: dict, where: str, model_type: str):
        self.cfg, self.where, self.model_type = cfg, where, model_type
        # the decoder's layer count, for layer patterns (1 when absent: `standard` then
        # refuses the config for the missing key)
        self.layers_n = self.get("num_hidden_layers", MODEL_FIELDS["num_layers"], 1)

    # ---- typed getters ------------------------------------------------------------------------
    def get(self, key, checker, default=_MISSING):
        v = self.cfg.get(key)
        if v is None:
            if default is _MISSING:
                raise BadInput(f"{self.where}: missing {key!r}")
            return default
        try:
            return checker(v, key)
        except S.Invalid as e:
            raise BadInput(f"{self.where}: {e}") from None

    def first(self, keys, checker, default=_MISSING):
        for k in keys:
            if self.cfg.get(k) is not None:
                return self.get(k, checker)
        if default is _MISSING:
            raise BadInput(f"{self.where}: missing {' or '.join(repr(k) for k in keys)}")
        return default

    def act(self, key, default):
        try:
            return activation_of(self.get(key, S.Str(100), default), key)
        except BadInput as e:
            if str(e).startswith(self.where):
                raise
            raise BadInput(f"{self.where}: {e}") from None

    def warn(self, message: str) -> None:
        hf_warn(self.where, message)

    # ---- what many families share -------------------------------------------------------------
    def max_seq(self, max_pos: int) -> int:
        """max_position_embeddings, or what rope scaling stretches the trained context to:
        factor x original_max_position_embeddings (transformers modeling_rope_utils: linear,
        dynamic, yarn, llama3, longrope all scale the original context by `factor`)."""
        cfg = self.cfg
        n = self.get("max_position_embeddings", MODEL_FIELDS["max_seq_len"], max_pos)
        rs = cfg.get("rope_scaling")
        if rs is None:
            rs = cfg.get("rope_parameters")
        if isinstance(rs, dict) and isinstance(rs.get("rope_type", rs.get("type")), str):
            kind = rs.get("rope_type", rs.get("type"))
            fac, orig = rs.get("factor"), rs.get("original_max_position_embeddings")
            known = ("default", "linear", "dynamic", "yarn", "llama3", "longrope", "su",
                     "mrope", "proportional")
            if kind not in known:
                self.warn(f"rope_scaling type {S.show(kind)} is not understood; the "
                          f"context stays max_position_embeddings {n}")
            elif (isinstance(fac, (int, float)) and not isinstance(fac, bool)
                  and isinstance(orig, int) and not isinstance(orig, bool) and fac > 0 < orig):
                n = max(n, min(int(fac * orig), B.MAX_SEQ_LEN))
        elif rs is not None:
            self.warn("rope_scaling is not an object with a rope_type; ignored")
        return n

    def rope_attention_factor(self) -> float:
        """YaRN's attention factor (planner.specs.yarn_attention_factor): rope_scaling's
        attention_factor where given, else from its factor and mscales; 1 for any other RoPE
        (transformers modeling_rope_utils _compute_yarn_parameters)."""
        rs = self.cfg.get("rope_scaling")
        if rs is None:
            rs = self.cfg.get("rope_parameters")
        if not isinstance(rs, dict) or rs.get("rope_type", rs.get("type")) != "yarn":
            return 1.0
        nums = {k: rs.get(k) for k in ("attention_factor", "factor", "mscale", "mscale_all_dim")}
        if any(v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or v < 0) for v in nums.values()):
            self.warn("rope_scaling's yarn figures are not numbers >= 0; its attention "
                      "factor is taken as 1")
            return 1.0
        if nums["attention_factor"]:
            return float(nums["attention_factor"])
        if not nums["factor"]:
            return 1.0
        return yarn_attention_factor(nums["factor"], nums["mscale"], nums["mscale_all_dim"])

    def rope_theta(self, default: float) -> float:
        cfg = self.cfg
        rp = cfg.get("rope_parameters")        # transformers v5 keeps rope_theta in here
        if isinstance(rp, dict) and rp.get("rope_theta") is not None and "rope_theta" not in cfg:
            try:
                return THETA(rp["rope_theta"], "rope_parameters.rope_theta")
            except S.Invalid as e:
                raise BadInput(f"{self.where}: {e}") from None
        return self.get("rope_theta", THETA, default)

    def head_dim(self, hidden: int, heads: int) -> int:
        """`head_dim` when it is not hidden / heads (stored as head_dim_override)."""
        d = self.get("head_dim", COUNT, 0)
        return 0 if d == 0 or (hidden % heads == 0 and d == hidden // heads) else d

    def windows(self, all_layers: bool, every: int = 0) -> dict:
        """sliding_window and full_attention_interval: from `layer_types` where the config has
        it (transformers >= 4.53: "sliding_attention" / "full_attention" per layer), else every
        layer (all_layers) or the model type's fixed pattern (`every`)."""
        w = self.get("sliding_window", S.Int(1, B.MAX_SEQ_LEN), 0)
        lt = self.cfg.get("layer_types")
        if isinstance(lt, list) and lt and all(isinstance(x, str) for x in lt):
            sliding = [x in ("sliding_attention", "chunked_attention") for x in lt]
            if not any(sliding):
                return dict(NO_WINDOW)
            k = interval_of([not x for x in sliding])
            if w == 0 or k is None or len(lt) != self.layers_n:
                self.warn("layer_types mixes sliding and full attention in a pattern the "
                          "planner does not model; every layer priced as full attention")
                return dict(NO_WINDOW)
            return dict(sliding_window=w, full_attention_interval=k)
        if w == 0:
            return dict(NO_WINDOW)
        return dict(sliding_window=w, full_attention_interval=0 if all_layers else every)

    def standard(self, max_pos: int, grouped_kv: bool) -> dict:
        """The fields every config with Hugging Face's usual key names shares."""
        i = MODEL_FIELDS
        heads = self.get("num_attention_heads", i["num_heads"])
        hidden = self.get("hidden_size", i["hidden"])
        return dict(
            num_layers=self.get("num_hidden_layers", i["num_layers"]), hidden=hidden,
            ffn_hidden=self.get("intermediate_size", i["ffn_hidden"]), num_heads=heads,
            num_kv_heads=(self.get("num_key_value_heads", i["num_kv_heads"], heads)
                          if grouped_kv else heads),
            vocab_size=self.get("vocab_size", i["vocab_size"]),
            max_seq_len=self.max_seq(max_pos), head_dim_override=self.head_dim(hidden, heads),
            position="rope", tied_embeddings=self.get("tie_word_embeddings", FLAG, False),
            rope_attention_factor=self.rope_attention_factor())

    def llama_like(self, max_pos: int, attn_bias: bool, act_default: str = "silu",
                   act_key: str = "hidden_act", tied: bool = False) -> dict:
        """Llama's block (LlamaAttention, LlamaMLP: gated, RMSNorm), shared by Mistral, Qwen,
        Gemma, Phi-3 and the MoE types."""
        kw = self.standard(max_pos, grouped_kv=True)
        if self.get("mlp_bias", FLAG, False):
            self.warn("mlp_bias: the MLP's biases are not counted")
        eps = 1e-6 if self.model_type.startswith("gemma") else 1e-5
        return dict(kw, gated_mlp=True, activation=self.act(act_key, act_default),
                    norm="rmsnorm", attn_bias=self.get("attention_bias", FLAG, attn_bias),
                    linear_bias=False, norm_eps=self.get("rms_norm_eps", EPS, eps),
                    rope_theta=self.rope_theta(10000.0),
                    tied_embeddings=self.get("tie_word_embeddings", FLAG, tied))

    def routed(self, experts_key, width_key="moe_intermediate_size") -> dict:
        """The routed experts: how many (the first of `experts_key` given), top-k, width."""
        i = MODEL_FIELDS
        n = self.first(experts_key, i["num_experts"])
        return dict(num_experts=n,
                    experts_per_token=self.first(("num_experts_per_tok", "experts_per_token"),
                                                 i["experts_per_token"]),
                    moe_ffn_hidden=self.get(width_key, i["moe_ffn_hidden"]))
