"""Catalog models. Shapes are copied from the published configs named beside each entry."""
from planner.specs import Model, yarn_attention_factor

_LLAMA = dict(gated_mlp=True, activation="silu", norm="rmsnorm", position="rope",
              tied_embeddings=False)

MODELS = {
    # Touvron et al. 2023, "Llama 2", Table 1 / HF meta-llama/Llama-2-7b-hf config.json
    "llama2-7b": Model("llama2-7b", num_layers=32, hidden=4096, ffn_hidden=11008, num_heads=32,
                       num_kv_heads=32, vocab_size=32000, max_seq_len=4096, **_LLAMA),
    # HF meta-llama/Llama-2-13b-hf config.json
    "llama2-13b": Model("llama2-13b", num_layers=40, hidden=5120, ffn_hidden=13824, num_heads=40,
                        num_kv_heads=40, vocab_size=32000, max_seq_len=4096, **_LLAMA),
    # HF meta-llama/Llama-2-70b-hf config.json (GQA, 8 KV heads)
    "llama2-70b": Model("llama2-70b", num_layers=80, hidden=8192, ffn_hidden=28672, num_heads=64,
                        num_kv_heads=8, vocab_size=32000, max_seq_len=4096, **_LLAMA),
    # Llama 3 herd paper (Dubey et al. 2024), Table 3 / HF meta-llama/Meta-Llama-3-8B config.json
    "llama3-8b": Model("llama3-8b", num_layers=32, hidden=4096, ffn_hidden=14336, num_heads=32,
                       num_kv_heads=8, vocab_size=128256, max_seq_len=8192,
                       rope_theta=500000.0, **_LLAMA),
    # Dubey et al. 2024, Table 3 / HF meta-llama/Meta-Llama-3-70B config.json
    "llama3-70b": Model("llama3-70b", num_layers=80, hidden=8192, ffn_hidden=28672, num_heads=64,
                        num_kv_heads=8, vocab_size=128256, max_seq_len=8192,
                        rope_theta=500000.0, **_LLAMA),
    # Dubey et al. 2024, Table 3 / HF meta-llama/Llama-3.1-405B config.json
    "llama3-405b": Model("llama3-405b", num_layers=126, hidden=16384, ffn_hidden=53248,
                         num_heads=128, num_kv_heads=8, vocab_size=128256, max_seq_len=131072,
                         rope_theta=500000.0, **_LLAMA),
    # ---- Llama 3.1 / 3.2 / 3.3: 128K context by rope scaling -------------------------------
    # HF meta-llama/Llama-3.1-8B and Llama-3.1-70B config.json: the Llama 3 shapes with
    # max_position_embeddings 131072 and rope_scaling {"rope_type": "llama3", "factor": 8.0,
    # "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings":
    # 8192}, rope_theta 500000 (Dubey et al. 2024, Sec. 3.4.2: context extended to 128K in
    # continued pre-training). The scaling changes the rotation frequencies only, not the
    # FLOPs or the memory the planner prices; llama3-405b above is Llama 3.1 405B.
    "llama3.1-8b": Model("llama3.1-8b", num_layers=32, hidden=4096, ffn_hidden=14336,
                         num_heads=32, num_kv_heads=8, vocab_size=128256, max_seq_len=131072,
                         rope_theta=500000.0, **_LLAMA),
    "llama3.1-70b": Model("llama3.1-70b", num_layers=80, hidden=8192, ffn_hidden=28672,
                          num_heads=64, num_kv_heads=8, vocab_size=128256, max_seq_len=131072,
                          rope_theta=500000.0, **_LLAMA),
    # HF meta-llama/Llama-3.1-405B config.json (the same model as llama3-405b)
    "llama3.1-405b": Model("llama3.1-405b", num_layers=126, hidden=16384, ffn_hidden=53248,
                           num_heads=128, num_kv_heads=8, vocab_size=128256,
                           max_seq_len=131072, rope_theta=500000.0, **_LLAMA),
    # HF meta-llama/Llama-3.2-1B config.json: 16 layers, hidden 2048, intermediate 8192, 32
    # heads of head_dim 64, 8 KV heads, tie_word_embeddings true, 131072 positions
    # (rope_scaling llama3, factor 32, original 8192)
    "llama3.2-1b": Model("llama3.2-1b", num_layers=16, hidden=2048, ffn_hidden=8192,
                         num_heads=32, num_kv_heads=8, vocab_size=128256, max_seq_len=131072,
                         rope_theta=500000.0, **{**_LLAMA, "tied_embeddings": True}),
    # HF meta-llama/Llama-3.2-3B config.json: 28 layers, hidden 3072, intermediate 8192, 24
    # heads of head_dim 128, 8 KV heads, tied, 131072 positions (rope_scaling llama3, factor 32)
    "llama3.2-3b": Model("llama3.2-3b", num_layers=28, hidden=3072, ffn_hidden=8192,
                         num_heads=24, num_kv_heads=8, vocab_size=128256, max_seq_len=131072,
                         rope_theta=500000.0, **{**_LLAMA, "tied_embeddings": True}),
    # HF meta-llama/Llama-3.3-70B-Instruct config.json: Llama 3.1 70B's shape and rope scaling
    "llama3.3-70b": Model("llama3.3-70b", num_layers=80, hidden=8192, ffn_hidden=28672,
                          num_heads=64, num_kv_heads=8, vocab_size=128256, max_seq_len=131072,
                          rope_theta=500000.0, **_LLAMA),

    # Brown et al. 2020, Table 2.1 (GPT-3 175B); vocabulary padded to 51200 as in Megatron-LM
    "gpt3-175b": Model("gpt3-175b", num_layers=96, hidden=12288, ffn_hidden=49152, num_heads=96,
                       num_kv_heads=96, vocab_size=51200, max_seq_len=2048, gated_mlp=False,
                       activation="gelu", norm="layernorm", position="learned",
                       tied_embeddings=True, attn_bias=True, linear_bias=True, dropout=0.1),

    # ---- Qwen2.5 dense (Qwen2.5 technical report, arXiv 2412.15115, Table 1; HF
    # Qwen/Qwen2.5-<size> config.json): q/k/v biases, rope_theta 1e6, rms_norm_eps 1e-6;
    # 0.5B-3B tie the embeddings (vocab 151936, 32768 positions), 7B-72B do not (vocab
    # 152064, 131072 positions)
    **{name: Model(name, num_layers=L, hidden=h, ffn_hidden=f, num_heads=a, num_kv_heads=kv,
                   vocab_size=151936 if tied else 152064,
                   max_seq_len=32768 if tied else 131072, rope_theta=1e6, norm_eps=1e-6,
                   attn_bias=True, **{**_LLAMA, "tied_embeddings": tied})
       for name, L, h, f, a, kv, tied in (
           ("qwen2.5-0.5b", 24, 896, 4864, 14, 2, True),
           ("qwen2.5-1.5b", 28, 1536, 8960, 12, 2, True),
           ("qwen2.5-3b", 36, 2048, 11008, 16, 2, True),
           ("qwen2.5-7b", 28, 3584, 18944, 28, 4, False),
           ("qwen2.5-14b", 48, 5120, 13824, 40, 8, False),
           ("qwen2.5-32b", 64, 5120, 27648, 40, 8, False),
           ("qwen2.5-72b", 80, 8192, 29568, 64, 8, False))},
    # ---- Qwen3 dense (Qwen3 technical report, arXiv 2505.09388, Table 1; HF
    # Qwen/Qwen3-<size> config.json): head_dim 128, no q/k/v bias (q/k RMSNorm, not priced:
    # 2 x 128 per head), rope_theta 1e6, rms_norm_eps 1e-6, vocab 151936,
    # max_position_embeddings 40960; 0.6B-4B tie the embeddings
    **{name: Model(name, num_layers=L, hidden=h, ffn_hidden=f, num_heads=a, num_kv_heads=8,
                   vocab_size=151936, max_seq_len=40960, rope_theta=1e6, norm_eps=1e-6,
                   head_dim_override=128, **{**_LLAMA, "tied_embeddings": tied})
       for name, L, h, f, a, tied in (
           ("qwen3-0.6b", 28, 1024, 3072, 16, True),
           ("qwen3-1.7b", 28, 2048, 6144, 16, True),
           ("qwen3-4b", 36, 2560, 9728, 32, True),
           ("qwen3-8b", 36, 4096, 12288, 32, False),
           ("qwen3-14b", 40, 5120, 17408, 40, False),
           ("qwen3-32b", 64, 5120, 25600, 64, False))},

    # ---- mixtures of experts (the Hugging Face config.json of the repository named) ----
    # deepseek-ai/DeepSeek-V2-Lite config.json: 27 layers, hidden 2048, 16 heads,
    # first_k_dense_replace 1 (intermediate_size 10944), n_routed_experts 64 of
    # moe_intermediate_size 1408, top 6, n_shared_experts 2, MLA without a query LoRA
    # (q_lora_rank null), kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128,
    # v_head_dim 128, vocab 102400, max_position_embeddings 163840 (yarn factor 40 x 4096)
    "deepseek-v2-lite": Model("deepseek-v2-lite", num_layers=27, hidden=2048, ffn_hidden=10944,
                              num_heads=16, num_kv_heads=16, vocab_size=102400,
                              max_seq_len=163840, norm_eps=1e-6, num_experts=64,
                              experts_per_token=6, moe_ffn_hidden=1408,
                              shared_expert_ffn_hidden=2 * 1408, first_dense_layers=1,
                              kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
                              v_head_dim=128, **_LLAMA),
    # mistralai/Mixtral-8x7B-v0.1 config.json: 8 experts (num_local_experts) of 14336, top 2,
    # rope_theta 1e6, max_position_embeddings 32768, sliding_window null
    "mixtral-8x7b": Model("mixtral-8x7b", num_layers=32, hidden=4096, ffn_hidden=14336,
                          num_heads=32, num_kv_heads=8, vocab_size=32000, max_seq_len=32768,
                          rope_theta=1e6, num_experts=8, experts_per_token=2,
                          moe_ffn_hidden=14336, **_LLAMA),
    # mistralai/Mixtral-8x22B-v0.1 config.json: 8 experts of 16384, top 2, 65536 positions
    "mixtral-8x22b": Model("mixtral-8x22b", num_layers=56, hidden=6144, ffn_hidden=16384,
                           num_heads=48, num_kv_heads=8, vocab_size=32000, max_seq_len=65536,
                           rope_theta=1e6, num_experts=8, experts_per_token=2,
                           moe_ffn_hidden=16384, **_LLAMA),
    # deepseek-ai/DeepSeek-V3 config.json: 61 layers, first_k_dense_replace 3 (dense
    # intermediate_size 18432), n_routed_experts 256 of moe_intermediate_size 2048, top 8,
    # n_shared_experts 1, MLA q_lora_rank 1536, kv_lora_rank 512, qk_rope_head_dim 64,
    # qk_nope_head_dim 128, v_head_dim 128, num_nextn_predict_layers 1, rms_norm_eps 1e-6,
    # max_position_embeddings 163840 (yarn factor 40 x 4096)
    "deepseek-v3": Model("deepseek-v3", num_layers=61, hidden=7168, ffn_hidden=18432,
                         num_heads=128, num_kv_heads=128, vocab_size=129280,
                         max_seq_len=163840, norm_eps=1e-6, num_experts=256,
                         experts_per_token=8, moe_ffn_hidden=2048,
                         shared_expert_ffn_hidden=2048, first_dense_layers=3, q_lora_rank=1536,
                         kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
                         v_head_dim=128, mtp_layers=1, **_LLAMA),
    # Qwen/Qwen3-30B-A3B config.json: 48 layers, head_dim 128 (queries 4096 wide at hidden
    # 2048), num_experts 128 of moe_intermediate_size 768, top 8, decoder_sparse_step 1,
    # mlp_only_layers [], rope_theta 1e6, max_position_embeddings 40960
    "qwen3-30b-a3b": Model("qwen3-30b-a3b", num_layers=48, hidden=2048, ffn_hidden=6144,
                           num_heads=32, num_kv_heads=4, vocab_size=151936, max_seq_len=40960,
                           rope_theta=1e6, norm_eps=1e-6, head_dim_override=128,
                           num_experts=128, experts_per_token=8, moe_ffn_hidden=768, **_LLAMA),
    # Qwen/Qwen3-235B-A22B config.json: 94 layers, head_dim 128, 128 experts of 1536, top 8
    "qwen3-235b-a22b": Model("qwen3-235b-a22b", num_layers=94, hidden=4096, ffn_hidden=12288,
                             num_heads=64, num_kv_heads=4, vocab_size=151936,
                             max_seq_len=40960, rope_theta=1e6, norm_eps=1e-6,
                             head_dim_override=128, num_experts=128, experts_per_token=8,
                             moe_ffn_hidden=1536, **_LLAMA),
    # openai/gpt-oss-20b config.json: 24 layers, hidden 2880, head_dim 64, 64 heads, 8 KV
    # heads, 32 experts (num_local_experts) of intermediate_size 2880 with biases, top 4,
    # attention_bias true, sinks, layer_types alternating sliding (sliding_window 128) and
    # full, rope_theta 150000, max_position_embeddings 131072 (yarn factor 32 x 4096: attention
    # factor 0.1 ln 32 + 1), swiglu_limit 7.0
    "gpt-oss-20b": Model("gpt-oss-20b", num_layers=24, hidden=2880, ffn_hidden=2880,
                         num_heads=64, num_kv_heads=8, vocab_size=201088, max_seq_len=131072,
                         rope_theta=150000.0, head_dim_override=64, attn_bias=True,
                         attention_sinks=True, sliding_window=128, full_attention_interval=2,
                         num_experts=32, experts_per_token=4, moe_ffn_hidden=2880,
                         expert_bias=True, rope_attention_factor=yarn_attention_factor(32.0),
                         activation_clamp=7.0, **_LLAMA),
    # openai/gpt-oss-120b config.json: as gpt-oss-20b with 36 layers and 128 experts
    "gpt-oss-120b": Model("gpt-oss-120b", num_layers=36, hidden=2880, ffn_hidden=2880,
                          num_heads=64, num_kv_heads=8, vocab_size=201088, max_seq_len=131072,
                          rope_theta=150000.0, head_dim_override=64, attn_bias=True,
                          attention_sinks=True, sliding_window=128, full_attention_interval=2,
                          num_experts=128, experts_per_token=4, moe_ffn_hidden=2880,
                          expert_bias=True, rope_attention_factor=yarn_attention_factor(32.0),
                          activation_clamp=7.0, **_LLAMA),
    # meta-llama/Llama-4-Scout-17B-16E config.json text_config (the language model only):
    # 48 layers, head_dim 128, 16 experts (num_local_experts) of intermediate_size 8192 and a
    # shared expert of 8192, top 1, interleave_moe_layer_step 1, rope_theta 500000,
    # max_position_embeddings 10485760; its chunked attention (attention_chunk_size 8192) is
    # priced as full attention
    "llama4-scout": Model("llama4-scout", num_layers=48, hidden=5120, ffn_hidden=16384,
                          num_heads=40, num_kv_heads=8, vocab_size=202048,
                          max_seq_len=10485760, rope_theta=500000.0,
                          num_experts=16, experts_per_token=1, moe_ffn_hidden=8192,
                          shared_expert_ffn_hidden=8192, **_LLAMA),
    # meta-llama/Llama-4-Maverick-17B-128E config.json text_config: 128 experts, MoE on every
    # second layer (interleave_moe_layer_step 2), the others dense of intermediate_size_mlp
    # 16384, max_position_embeddings 1048576
    "llama4-maverick": Model("llama4-maverick", num_layers=48, hidden=5120, ffn_hidden=16384,
                             num_heads=40, num_kv_heads=8, vocab_size=202048,
                             max_seq_len=1048576, rope_theta=500000.0, num_experts=128,
                             experts_per_token=1, moe_ffn_hidden=8192,
                             shared_expert_ffn_hidden=8192, moe_layer_interval=2, **_LLAMA),
}

ALIASES = {"llama8b": "llama3-8b", "llama70b": "llama3-70b", "llama405b": "llama3-405b",
           "gpt3": "gpt3-175b", "mixtral": "mixtral-8x7b", "deepseekv3": "deepseek-v3"}
