"""gpt-oss (transformers models/gpt_oss)."""
from planner.catalog.hf.config import HfConfig
from planner.specs import MODEL_FIELDS

MODEL_TYPES = ("gpt_oss",)


def fields(r: HfConfig) -> dict:
    # modeling_gpt_oss.py: GptOssAttention (head_dim, q/k/v/o biases = attention_bias,
    # per-head `sinks`), layer_types alternating sliding / full (sliding_window 128);
    # GptOssExperts: num_local_experts of intermediate_size with gate_up and down biases;
    # GptOssTopKRouter with a bias; every layer MoE. The o_proj bias (hidden per layer)
    # is not counted. The experts' gated activation clamps at swiglu_limit (7.0 in both
    # published configs).
    return dict(r.llama_like(131072, attn_bias=True), **r.windows(all_layers=False, every=2),
                **r.routed(("num_local_experts", "num_experts"), "intermediate_size"),
                expert_bias=True, attention_sinks=True,
                activation_clamp=r.get("swiglu_limit", MODEL_FIELDS["activation_clamp"], 7.0))
