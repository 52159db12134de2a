"""Nemotron (transformers models/nemotron): squared-ReLU plain MLP, LayerNorm."""
from planner.catalog.hf.config import EPS, FLAG, THETA, HfConfig

MODEL_TYPES = ("nemotron",)


def fields(r: HfConfig) -> dict:
    return dict(
        r.standard(4096, grouped_kv=True), gated_mlp=False,
        activation=r.act("hidden_act", "relu2"), norm="layernorm",
        attn_bias=r.get("attention_bias", FLAG, False),
        linear_bias=r.get("mlp_bias", FLAG, False),
        norm_eps=r.get("norm_eps", EPS, 1e-5), rope_theta=r.get("rope_theta", THETA, 10000.0))
