"""Qwen2, Qwen3 and their MoE models (transformers models/qwen2, qwen3, qwen2_moe, qwen3_moe)."""
from planner import limits as B
from planner import filecheck as S
from planner.catalog.hf.config import COUNT, FLAG, NO_WINDOW, HfConfig, dense_prefix
from planner.specs import MODEL_FIELDS

MODEL_TYPES = ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe")


def qwen_windows(r: HfConfig) -> dict:
    """Qwen2/3 (configuration_qwen2.py): the window applies only with use_sliding_window,
    to layers i >= max_window_layers."""
    if not r.get("use_sliding_window", FLAG, False):
        return dict(NO_WINDOW)
    first_sliding = r.get("max_window_layers", S.Int(0, B.MAX_LAYERS), 0)
    if first_sliding >= r.layers_n:
        return dict(NO_WINDOW)
    if first_sliding == 0 or "layer_types" in r.cfg:
        return r.windows(all_layers=True)
    r.warn(f"use_sliding_window from layer {first_sliding} on is not modelled; "
           f"every layer priced as full attention")
    return dict(NO_WINDOW)


def fields(r: HfConfig) -> dict:
    mt = r.model_type
    if mt in ("qwen2", "qwen3"):
        # Llama's block; Qwen2 has q/k/v biases
        return dict(r.llama_like(4096, attn_bias=mt == "qwen2"), **qwen_windows(r))
    # modeling_qwen2_moe.py / modeling_qwen3_moe.py: layer i is sparse when i is not in
    # mlp_only_layers and (i + 1) % decoder_sparse_step == 0; dense layers use
    # intermediate_size. Qwen2-MoE adds a shared expert (shared_expert_intermediate_size)
    # behind a sigmoid gate Linear(hidden, 1) (not counted: hidden per layer) and q/k/v
    # biases; Qwen3-MoE has neither (and RMSNorm q/k norms of head_dim, not counted).
    dense = r.get("mlp_only_layers", S.List(S.Int(0, B.MAX_LAYERS)), [])
    prefix = dense_prefix(dense, r.layers_n)
    if prefix is None:
        r.warn(f"mlp_only_layers {S.show(dense)} are not the first layers; they "
               f"are priced as MoE layers")
        prefix = 0
    kw = dict(r.llama_like(32768, attn_bias=mt == "qwen2_moe"), **qwen_windows(r),
              **r.routed(("num_experts",)), first_dense_layers=prefix,
              moe_layer_interval=r.get("decoder_sparse_step",
                                       MODEL_FIELDS["moe_layer_interval"], 1))
    if mt == "qwen2_moe":
        kw["shared_expert_ffn_hidden"] = r.get("shared_expert_intermediate_size", COUNT, 0)
    if prefix and kw["moe_layer_interval"] > 1:
        r.warn("mlp_only_layers with decoder_sparse_step > 1: the sparse layers "
               "are counted from the first non-dense layer")
    return kw
