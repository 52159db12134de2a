"""GPT-NeoX and Pythia (transformers models/gpt_neox): parallel residual, LayerNorm, biases."""
from planner import filecheck as S
from planner.catalog.hf.config import EPS, FLAG, THETA, HfConfig

MODEL_TYPES = ("gpt_neox",)


def fields(r: HfConfig) -> dict:
    kw = dict(
        r.standard(2048, grouped_kv=False), gated_mlp=False,
        activation=r.act("hidden_act", "gelu"), norm="layernorm", attn_bias=True,
        linear_bias=True, parallel_residual=r.get("use_parallel_residual", FLAG, True),
        norm_eps=r.get("layer_norm_eps", EPS, 1e-5),
        rope_theta=r.get("rotary_emb_base", THETA, 10000.0))
    if r.get("rotary_pct", S.Num(gt=0.0, le=1.0), 1.0) != 1.0:
        r.warn("rotary_pct (RoPE on part of each head) is not modelled; ignored")
    return kw
