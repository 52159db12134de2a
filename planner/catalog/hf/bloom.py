"""BLOOM (transformers models/bloom): ALiBi positions, LayerNorm, plain GELU MLP, biases."""
from planner.catalog.hf.config import EPS, HfConfig
from planner.specs import MODEL_FIELDS

MODEL_TYPES = ("bloom",)


def fields(r: HfConfig) -> dict:
    i = MODEL_FIELDS
    h = r.first(("hidden_size", "n_embed"), i["hidden"])
    heads = r.first(("n_head", "num_attention_heads"), i["num_heads"])
    return dict(
        num_layers=r.first(("n_layer", "num_hidden_layers"), i["num_layers"]), hidden=h,
        ffn_hidden=4 * h, num_heads=heads, num_kv_heads=heads,
        vocab_size=r.get("vocab_size", i["vocab_size"]),
        max_seq_len=r.get("seq_length", i["max_seq_len"], 2048), gated_mlp=False,
        activation="gelu", norm="layernorm", position="alibi", tied_embeddings=True,
        attn_bias=True, linear_bias=True, norm_eps=r.get("layer_norm_epsilon", EPS, 1e-5))
