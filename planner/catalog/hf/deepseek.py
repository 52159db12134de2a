"""DeepSeek-V2 and V3 (transformers models/deepseek_v2, deepseek_v3)."""
from planner import limits as B
from planner import filecheck as S
from planner.catalog.hf.config import COUNT, HfConfig
from planner.specs import MODEL_FIELDS

MODEL_TYPES = ("deepseek_v2", "deepseek_v3")


def fields(r: HfConfig) -> dict:
    # modeling_deepseek_v3.py: DeepseekV3Attention (MLA, see Model.q_lora_rank), the
    # first first_k_dense_replace layers dense (intermediate_size), the rest
    # DeepseekV3MoE: n_routed_experts of moe_intermediate_size, top num_experts_per_tok,
    # shared experts DeepseekV3MLP(moe_intermediate_size * n_shared_experts). The gate's
    # e_score_correction_bias (n_routed_experts per layer) is not counted.
    # num_nextn_predict_layers: the MTP modules (DeepSeek's modeling code; HF does not
    # build them but the checkpoint holds them, layer 61 of DeepSeek-V3).
    moe = r.routed(("n_routed_experts",))
    if r.get("moe_layer_freq", S.Int(1, B.MAX_LAYERS), 1) != 1:
        r.warn("moe_layer_freq > 1 (MoE on layers i % freq == 0) is priced as "
               "every layer after first_k_dense_replace being MoE")
    heads = r.get("num_attention_heads", MODEL_FIELDS["num_heads"])
    dim = S.Int(1, B.MAX_HIDDEN)
    return dict(r.llama_like(4096, attn_bias=False), **moe,
                shared_expert_ffn_hidden=r.get("n_shared_experts", COUNT, 0)
                * moe["moe_ffn_hidden"],
                first_dense_layers=r.get("first_k_dense_replace", S.Int(0, B.MAX_LAYERS), 0),
                q_lora_rank=r.get("q_lora_rank", COUNT, 0),
                kv_lora_rank=r.get("kv_lora_rank", dim),
                qk_rope_head_dim=r.get("qk_rope_head_dim", dim),
                qk_nope_head_dim=r.get("qk_nope_head_dim", dim),
                v_head_dim=r.get("v_head_dim", dim),
                head_dim_override=0, num_kv_heads=heads,
                mtp_layers=r.get("num_nextn_predict_layers", S.Int(0, B.MAX_LAYERS), 0))
