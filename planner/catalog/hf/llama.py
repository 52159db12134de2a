"""Llama (transformers models/llama: LlamaAttention, LlamaMLP gated, RMSNorm): the block
Mistral, Qwen, Gemma, Phi-3 and the MoE families build on (HfConfig.llama_like)."""
from planner.catalog.hf.config import NO_WINDOW, HfConfig

MODEL_TYPES = ("llama",)


def fields(r: HfConfig) -> dict:
    return dict(r.llama_like(4096, attn_bias=False), **NO_WINDOW)
