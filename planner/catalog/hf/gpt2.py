"""GPT-2 (transformers models/gpt2): learned positions, LayerNorm, plain GELU MLP, biases."""
from planner.catalog.hf.config import EPS, FLAG, HfConfig
from planner.specs import MODEL_FIELDS

MODEL_TYPES = ("gpt2",)


def fields(r: HfConfig) -> dict:
    i = MODEL_FIELDS
    h = r.get("n_embd", i["hidden"])
    heads = r.get("n_head", i["num_heads"])
    return dict(
        num_layers=r.get("n_layer", i["num_layers"]), hidden=h,
        ffn_hidden=r.get("n_inner", i["ffn_hidden"], 4 * h), num_heads=heads,
        num_kv_heads=heads, vocab_size=r.get("vocab_size", i["vocab_size"]),
        max_seq_len=r.get("n_positions", i["max_seq_len"], 1024), gated_mlp=False,
        activation=r.act("activation_function", "gelu_new"), norm="layernorm",
        position="learned", tied_embeddings=r.get("tie_word_embeddings", FLAG, True),
        attn_bias=True, linear_bias=True,
        dropout=r.get("resid_pdrop", i["dropout"], 0.1),
        norm_eps=r.get("layer_norm_epsilon", EPS, 1e-5))
