"""Phi-3 (transformers models/phi3/modeling_phi3.py): Llama's weights with a fused qkv_proj
and gate_up_proj; sliding_window applies to every layer."""
from planner.catalog.hf.config import HfConfig

MODEL_TYPES = ("phi3",)


def fields(r: HfConfig) -> dict:
    return dict(r.llama_like(4096, attn_bias=False), **r.windows(all_layers=True))
