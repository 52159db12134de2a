"""Catalog models. Shapes are copied from the published configs named beside each entry."""
from planner.specs import Model

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
    # Brown et al. 2020, Table 2.1 (GPT-3 175B); vocabulary padded to 51200 as in Megatron-LM
    "gpt3-175b": Model("gpt3-175b", num_layers=96, hidden=12288, ffn_hidden=49152, num_heads=96,
                       num_kv_heads=96, vocab_size=51200, max_seq_len=2048, gated_mlp=False,
                       activation="gelu", norm="layernorm", position="learned",
                       tied_embeddings=True, attn_bias=True, linear_bias=True, dropout=0.1),
}

ALIASES = {"llama8b": "llama3-8b", "llama70b": "llama3-70b", "llama405b": "llama3-405b",
           "gpt3": "gpt3-175b"}
