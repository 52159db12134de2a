"""Mistral and Mixtral (transformers models/mistral, models/mixtral)."""
from planner.catalog.hf.config import HfConfig

MODEL_TYPES = ("mistral", "mixtral")


def fields(r: HfConfig) -> dict:
    if r.model_type == "mistral":
        # modeling_mistral.py applies sliding_window to every layer
        return dict(r.llama_like(4096, attn_bias=False), **r.windows(all_layers=True))
    # modeling_mixtral.py MixtralSparseMoeBlock: num_local_experts experts of
    # intermediate_size, top num_experts_per_tok, router gate Linear(hidden, experts,
    # bias=False); every layer MoE; sliding_window (null in Mixtral-8x7B-v0.1) on all layers
    return dict(r.llama_like(4096 * 32, attn_bias=False), **r.windows(all_layers=True),
                **r.routed(("num_local_experts",), "intermediate_size"))
