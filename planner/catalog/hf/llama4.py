"""Llama 4's language model (transformers models/llama4, Llama4TextConfig)."""
from planner.catalog.hf.config import HfConfig
from planner.specs import MODEL_FIELDS

MODEL_TYPES = ("llama4_text",)


def fields(r: HfConfig) -> dict:
    # modeling_llama4.py: Llama4TextMoe (num_local_experts of intermediate_size, top
    # num_experts_per_tok, a shared expert Llama4TextMLP of intermediate_size) on layers
    # config.moe_layers (default step-1, 2*step-1, ...: interleave_moe_layer_step), the
    # other layers a dense Llama4TextMLP of intermediate_size_mlp.
    step = r.get("interleave_moe_layer_step", MODEL_FIELDS["moe_layer_interval"], 1)
    moe_at = r.cfg.get("moe_layers")
    if isinstance(moe_at, list) and moe_at != list(range(step - 1, r.layers_n, step)):
        r.warn("moe_layers differs from interleave_moe_layer_step's pattern; "
               "priced as that pattern")
    moe = r.routed(("num_local_experts",), "intermediate_size")
    return dict(r.llama_like(4096 * 32, attn_bias=False), **moe,
                shared_expert_ffn_hidden=moe["moe_ffn_hidden"],
                ffn_hidden=r.get("intermediate_size_mlp", MODEL_FIELDS["ffn_hidden"]),
                moe_layer_interval=step)
