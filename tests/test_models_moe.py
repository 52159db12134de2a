"""Mixture-of-experts and newer dense models: Hugging Face config readers against the catalog,
and parameter counts against the figures their authors published."""
import dataclasses
import json
import math

import pytest

from planner.catalog import get_model
from planner.catalog.models import MODELS
from planner.errors import BadInput
from planner.catalog.hf import model_from_hf_config
from planner.specs import Model

# The config.json files below are copied (the fields that matter, values as published) from
# the Hugging Face repositories named.
HF_CONFIGS = {
    # mistralai/Mixtral-8x7B-v0.1
    "mixtral-8x7b": {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_act": "silu",
        "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 32768,
        "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": False,
        "rms_norm_eps": 1e-05, "rope_theta": 1e6, "router_aux_loss_coef": 0.02,
        "sliding_window": None, "tie_word_embeddings": False, "vocab_size": 32000},
    # mistralai/Mixtral-8x22B-v0.1
    "mixtral-8x22b": {
        "model_type": "mixtral", "hidden_act": "silu", "hidden_size": 6144,
        "intermediate_size": 16384, "max_position_embeddings": 65536,
        "num_attention_heads": 48, "num_experts_per_tok": 2, "num_hidden_layers": 56,
        "num_key_value_heads": 8, "num_local_experts": 8, "rms_norm_eps": 1e-05,
        "rope_theta": 1e6, "sliding_window": None, "tie_word_embeddings": False,
        "vocab_size": 32000},
    # deepseek-ai/DeepSeek-V3
    "deepseek-v3": {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
        "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840,
        "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8,
        "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
        "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
        "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                                "quant_method": "fp8", "weight_block_size": [128, 128]},
        "rms_norm_eps": 1e-06, "rope_scaling": {
            "beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 4096, "type": "yarn"},
        "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
        "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc",
        "v_head_dim": 128, "vocab_size": 129280},
    # Qwen/Qwen3-30B-A3B
    "qwen3-30b-a3b": {
        "model_type": "qwen3_moe", "attention_bias": False, "decoder_sparse_step": 1,
        "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 6144,
        "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
        "moe_intermediate_size": 768, "norm_topk_prob": True, "num_attention_heads": 32,
        "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
        "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False,
        "use_sliding_window": False, "vocab_size": 151936},
    # Qwen/Qwen3-235B-A22B
    "qwen3-235b-a22b": {
        "model_type": "qwen3_moe", "attention_bias": False, "decoder_sparse_step": 1,
        "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 12288,
        "max_position_embeddings": 40960, "max_window_layers": 94, "mlp_only_layers": [],
        "moe_intermediate_size": 1536, "num_attention_heads": 64, "num_experts": 128,
        "num_experts_per_tok": 8, "num_hidden_layers": 94, "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": None,
        "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 151936},
    # openai/gpt-oss-120b
    "gpt-oss-120b": {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
        "attention_bias": True, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
        "hidden_size": 2880, "initial_context_length": 4096, "intermediate_size": 2880,
        "layer_types": ["sliding_attention", "full_attention"] * 18,
        "max_position_embeddings": 131072, "num_attention_heads": 64,
        "num_experts_per_tok": 4, "num_hidden_layers": 36, "num_key_value_heads": 8,
        "num_local_experts": 128, "quantization_config": {
            "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                       "model.embed_tokens", "lm_head"],
            "quant_method": "mxfp4"},
        "rms_norm_eps": 1e-05, "rope_scaling": {
            "beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
            "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
        "rope_theta": 150000, "sliding_window": 128, "swiglu_limit": 7.0,
        "tie_word_embeddings": False, "vocab_size": 201088},
    # meta-llama/Llama-4-Maverick-17B-128E: the multimodal config, its text_config
    "llama4-maverick": {
        "model_type": "llama4", "architectures": ["Llama4ForConditionalGeneration"],
        "text_config": {
            "model_type": "llama4_text", "attention_chunk_size": 8192, "head_dim": 128,
            "hidden_act": "silu", "hidden_size": 5120, "interleave_moe_layer_step": 2,
            "intermediate_size": 8192, "intermediate_size_mlp": 16384,
            "max_position_embeddings": 1048576, "num_attention_heads": 40,
            "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8,
            "num_local_experts": 128, "rms_norm_eps": 1e-05, "rope_scaling": None,
            "rope_theta": 500000.0, "tie_word_embeddings": False, "use_qk_norm": False,
            "vocab_size": 202048},
        "vision_config": {"model_type": "llama4_vision_model", "hidden_size": 1408}},
}
# openai/gpt-oss-20b differs from gpt-oss-120b in these fields only
HF_CONFIGS["gpt-oss-20b"] = {**HF_CONFIGS["gpt-oss-120b"], "num_hidden_layers": 24,
                             "num_local_experts": 32,
                             "layer_types": ["sliding_attention", "full_attention"] * 12}


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_reader_gives_the_catalog_model(name, capsys):
    """Two transcriptions of one published config.json (the catalog's hand-written entry and
    the reader on the file's fields) agree field by field."""
    read = model_from_hf_config(HF_CONFIGS[name], name)
    assert dataclasses.asdict(read) == dataclasses.asdict(MODELS[name])


# Published totals and active parameters, in billions, and which count each source uses:
# total, active, tolerance (B), whether the active figure counts the embedding table.
PUBLISHED = {
    # Mistral AI, "Mixtral of experts" (Jiang et al. 2024), Sec. 2: 47B total (46.7B in the
    # release notes), 13B active (12.9B): embedding and head counted
    "mixtral-8x7b": (46.7, 12.9, 0.05, True),
    # mistral.ai "Cheaper, Better, Faster, Stronger" (Mixtral 8x22B): 141B total, 39B active
    "mixtral-8x22b": (141.0, 39.0, 0.5, True),
    # Qwen3 technical report (Yang et al. 2025), Table 2 / model cards: 30.5B total, 3.3B
    # activated; 235B total, 22B activated
    "qwen3-30b-a3b": (30.5, 3.3, 0.06, True),
    "qwen3-235b-a22b": (235.0, 22.0, 0.5, True),
    # OpenAI gpt-oss model card (2025), Table 1: 116.83B total, 5.13B active per token and
    # 20.91B / 3.61B; their active figure leaves out the embedding table (the unembedding is
    # counted: 36 x 126.5M + 0.58B = 5.13B)
    "gpt-oss-120b": (116.83, 5.13, 0.01, False),
    "gpt-oss-20b": (20.91, 3.61, 0.01, False),
    # Meta Llama 4 model card: Maverick 17B active, 400B total
    "llama4-maverick": (400.0, 17.0, 1.0, True),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_counts_match_published(name):
    total, active, tol, with_embedding = PUBLISHED[name]
    m = get_model(name)
    assert m.num_params() / 1e9 == pytest.approx(total, abs=tol)
    act = m.active_params() - (0 if with_embedding else m.embedding_params())
    assert act / 1e9 == pytest.approx(active, abs=tol)


def test_deepseek_v3_counts_with_and_without_mtp():
    """DeepSeek-V3 report (Liu et al. 2024), Sec. 4.2 and the repository's README: 671B total
    parameters and 37B activated per token in the main model; the released checkpoint is 685B:
    the main model and a 14B MTP module, which holds its own copies of the embedding and output
    head (shared with the main model in training, so not counted by num_params)."""
    m = get_model("deepseek-v3")
    main = m.num_params() - m.mtp_params()
    assert main / 1e9 == pytest.approx(671.0, abs=0.5)
    assert (m.active_params() - m.mtp_active_params()) / 1e9 == pytest.approx(37.0, abs=0.6)
    copies = m.embedding_params() + m.vocab_size * m.hidden
    assert (m.mtp_params() + copies) / 1e9 == pytest.approx(14.0, abs=0.6)
    assert (m.num_params() + copies) / 1e9 == pytest.approx(685.0, abs=1.0)
    # MLA: 187.1M attention weights a layer; 3 dense, 58 MoE layers
    assert (m.num_moe_layers, m.head_dim, m.q_dim, m.attn_out_dim) == (58, 192, 24576, 16384)


def test_mistral_nemo_head_dim():
    """mistralai/Mistral-Nemo-Base-2407: head_dim 128 at hidden 5120 and 32 heads; Mistral AI
    announces 12B (12.25B in the checkpoint), not the 12.8B of hidden / heads."""
    cfg = {"model_type": "mistral", "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
           "intermediate_size": 14336, "max_position_embeddings": 1024000,
           "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8,
           "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": None,
           "tie_word_embeddings": False, "vocab_size": 131072}
    m = model_from_hf_config(cfg, "nemo")
    assert (m.head_dim, m.q_dim, m.kv_dim) == (128, 4096, 1024)
    assert m.num_params() / 1e9 == pytest.approx(12.25, abs=0.005)
    # a head_dim equal to hidden / heads is stored as "derived", as before
    llama = model_from_hf_config({**cfg, "head_dim": 160}, "x")
    assert llama.head_dim_override == 0 and llama.head_dim == 160


DENSE = {
    # Qwen/Qwen3-8B
    "qwen3-8b": ({"model_type": "qwen3", "attention_bias": False, "head_dim": 128,
                  "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 12288,
                  "max_position_embeddings": 40960, "max_window_layers": 36,
                  "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
                  "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
                  "sliding_window": None, "tie_word_embeddings": False,
                  "use_sliding_window": False, "vocab_size": 151936},
                 8.19),      # Qwen3 report Table 1 / model card: 8.2B
    # google/gemma-2-9b
    "gemma-2-9b": ({"model_type": "gemma2", "attn_logit_softcapping": 50.0,
                    "final_logit_softcapping": 30.0, "head_dim": 256,
                    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 3584,
                    "intermediate_size": 14336, "max_position_embeddings": 8192,
                    "num_attention_heads": 16, "num_hidden_layers": 42,
                    "num_key_value_heads": 8, "query_pre_attn_scalar": 256,
                    "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096,
                    "vocab_size": 256000},
                   9.24),    # Gemma 2 report (2024), Table 2: 8,324M non-embedding + 917,504K
    # microsoft/Phi-3-mini-4k-instruct
    "phi-3-mini": ({"model_type": "phi3", "hidden_act": "silu", "hidden_size": 3072,
                    "intermediate_size": 8192, "max_position_embeddings": 4096,
                    "num_attention_heads": 32, "num_hidden_layers": 32,
                    "num_key_value_heads": 32, "original_max_position_embeddings": 4096,
                    "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000.0,
                    "sliding_window": 2047, "tie_word_embeddings": False,
                    "vocab_size": 32064},
                   3.82),    # Phi-3 report (Abdin et al. 2024): 3.8B
}


@pytest.mark.parametrize("name", sorted(DENSE))
def test_dense_readers(name):
    cfg, billions = DENSE[name]
    m = model_from_hf_config(cfg, name)
    assert m.num_params() / 1e9 == pytest.approx(billions, abs=0.02)


def test_sliding_window_patterns():
    gemma2 = model_from_hf_config(DENSE["gemma-2-9b"][0], "g")
    # Gemma2DecoderLayer: is_sliding = not bool(layer_idx % 2)
    assert [gemma2.sliding_layer(i) for i in range(4)] == [True, False, True, False]
    assert gemma2.sliding_window == 4096 and gemma2.num_sliding_layers == 21
    gemma3 = model_from_hf_config({**DENSE["gemma-2-9b"][0], "model_type": "gemma3_text",
                                   "sliding_window": 1024, "sliding_window_pattern": 6}, "g3")
    assert [i for i in range(12) if not gemma3.sliding_layer(i)] == [5, 11]
    phi = model_from_hf_config(DENSE["phi-3-mini"][0], "p")
    assert phi.num_sliding_layers == 32 and phi.sliding_window == 2047
    oss = get_model("gpt-oss-120b")
    assert oss.num_sliding_layers == 18 and not oss.sliding_layer(1)
    # explicit layer_types in a pattern with no period: warned and priced as full attention
    odd = {**HF_CONFIGS["gpt-oss-20b"],
           "layer_types": ["full_attention"] + ["sliding_attention"] * 23}
    assert model_from_hf_config(odd, "odd").sliding_window == 0


def test_unmodelled_fields_warn_one_line_each(capsys):
    model_from_hf_config(HF_CONFIGS["gpt-oss-120b"], "oss")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "quantization_config" in err[0] and err[0].startswith("warning:")
    model_from_hf_config(HF_CONFIGS["llama4-maverick"], "mav")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and any("attention_chunk_size" in e for e in err)
    assert any("vision" in e for e in err)
    model_from_hf_config(HF_CONFIGS["qwen3-30b-a3b"], "q")       # nothing unmodelled
    assert capsys.readouterr().err == ""
    model_from_hf_config({**HF_CONFIGS["qwen3-30b-a3b"], "mlp_only_layers": [3, 7]}, "q")
    assert "mlp_only_layers" in capsys.readouterr().err
    model_from_hf_config({**DENSE["phi-3-mini"][0], "partial_rotary_factor": 0.5}, "p")
    assert "partial_rotary_factor" in capsys.readouterr().err
    model_from_hf_config({**DENSE["phi-3-mini"][0],
                          "rope_scaling": {"rope_type": "mystery", "factor": 2}}, "p")
    assert "rope_scaling" in capsys.readouterr().err


def test_rope_scaling_extends_the_context():
    cfg = {**HF_CONFIGS["qwen3-30b-a3b"], "rope_scaling": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}
    assert model_from_hf_config(cfg, "q").max_seq_len == 131072     # Qwen3 model card, YaRN
    assert model_from_hf_config(HF_CONFIGS["qwen3-30b-a3b"], "q").max_seq_len == 40960


def test_names_and_directories(tmp_path):
    d = tmp_path / "Mixtral-8x7B-v0.1"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(HF_CONFIGS["mixtral-8x7b"]))
    assert get_model(str(d)).name == "Mixtral-8x7B-v0.1"             # the directory
    assert get_model(str(d / "config.json")).name == "Mixtral-8x7B-v0.1"
    (d / "config.json").write_text(json.dumps({**HF_CONFIGS["mixtral-8x7b"],
                                               "_name_or_path": "mistralai/Mixtral-8x7B"}))
    assert get_model(str(d)).name == "Mixtral-8x7B"                  # the config's own name
    with pytest.raises(BadInput, match="no config.json"):
        get_model(str(tmp_path))


def test_old_plans_read_without_the_new_fields():
    d = MODELS["llama3-8b"].to_dict()
    for f in ("head_dim_override", "kv_lora_rank", "sliding_window", "mtp_layers",
              "expert_bias", "attention_sinks", "full_attention_interval"):
        d.pop(f)
    assert Model.from_dict(d) == MODELS["llama3-8b"]


@pytest.mark.parametrize("bad, match", [
    (dict(kv_lora_rank=512), "qk_rope_head_dim"),
    (dict(qk_rope_head_dim=64), "kv_lora_rank"),
    (dict(full_attention_interval=2), "sliding_window"),
    (dict(expert_bias=True), "num_experts"),
])
def test_inconsistent_fields_refused(bad, match):
    with pytest.raises(BadInput, match=match):
        MODELS["llama3-8b"].scaled(**bad)


# ---- the attention shape in the cost model -------------------------------------------------
from planner.cost.compute import attention_flops, attention_width  # noqa: E402
from planner.cost.stage import model_flops_per_step  # noqa: E402


def _pairs(s: int, w: int) -> int:
    """Brute force: (query, key) pairs a causal mask with a window of w keys allows."""
    return sum(min(t + 1, w or s) for t in range(s))


@pytest.mark.parametrize("s", [512, 4096])
def test_sliding_window_attention_flops_count_the_pairs(s):
    oss = get_model("gpt-oss-20b")
    full = oss.scaled(sliding_window=0, full_attention_interval=0)
    per_pair = 2 * 2 * oss.num_heads * oss.head_dim      # QK^T and PV, 2 FLOPs a MAC
    brute = (oss.num_sliding_layers * _pairs(s, 128)
             + (oss.num_layers - oss.num_sliding_layers) * _pairs(s, 0)) / oss.num_layers
    assert attention_flops(oss, 1, s) == pytest.approx(per_pair * brute, rel=1.0 / s)
    assert attention_flops(full, 1, s) == pytest.approx(per_pair * _pairs(s, 0), rel=1.0 / s)


def test_attention_width_follows_the_heads():
    """The FLOPs of QK^T and PV follow the heads' widths, not hidden: Qwen3-30B-A3B's
    queries are 32 x 128 = 4096 wide at hidden 2048; DeepSeek-V3 scores 192-wide heads and
    sums 128-wide values (128 heads)."""
    assert attention_width(get_model("qwen3-30b-a3b")) == 4096
    assert attention_width(get_model("deepseek-v3")) == 128 * (192 + 128) / 2
    assert attention_width(get_model("llama3-8b")) == 4096
    # Megatron's formula for a dense GPT, unchanged: 72*B*s*l*h^2*(1 + s/(6h) + V/(12hl))
    g = get_model("gpt3-175b")
    B, s, l, h, V = 8, 2048, g.num_layers, g.hidden, g.vocab_size
    assert model_flops_per_step(g, s, B) == pytest.approx(
        72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * h * l)), rel=1e-3)


def test_plan_models_lists_total_and_active(capsys):
    from planner.cli import main
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("deepseek-v3 "))
    assert "671.03B" in row and "37.55B" in row and "1 MTP" in row and "256 top-8" in row
    assert main(["--model", "mixtral-8x7b", "--cluster", "h100x64"]) == 0
    out = capsys.readouterr().out
    assert "ep=" in out and "EP dispatch+combine" in out


from hypothesis import given, settings, strategies as st  # noqa: E402

from planner.cost.compute import mean_attended_keys  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(s=st.integers(1, 300), w=st.integers(0, 400), k=st.integers(0, 4),
       layers=st.integers(1, 12))
def test_mean_attended_keys_brute_force(s, w, k, layers):
    """Against counting the allowed (query, key) pairs layer by layer. The formula is the
    continuous s^2/2 count of the causal triangle (as the full-attention formula has always
    been), so it differs from the integer count by half a key a query."""
    m = MODELS["llama3-8b"].scaled(num_layers=layers, sliding_window=w,
                                   full_attention_interval=k if w else 0)
    pairs = sum(sum(min(t + 1, w) if m.sliding_layer(i) else t + 1 for t in range(s))
                for i in range(layers)) / layers
    assert mean_attended_keys(m, s) * s == pytest.approx(pairs, abs=s / 2 + 1e-9)
    noncausal = sum(min(w, s) if m.sliding_layer(i) else s for i in range(layers)) / layers
    assert mean_attended_keys(m, s, causal=False) == pytest.approx(noncausal)


def test_attention_features_name_what_an_engine_must_carry():
    assert MODELS["llama3-70b"].attention_features() == []
    oss = " ".join(MODELS["gpt-oss-120b"].attention_features())
    assert "head_dim 64" in oss and "128 tokens on 18 of 36" in oss and "sinks" in oss
    ds = " ".join(MODELS["deepseek-v3"].attention_features())
    assert "latent" in ds and "multi-token" in ds


def test_yarn_attention_factor_read_as_transformers_computes_it():
    """YaRN's attention factor (Peng et al. 2023, Sec. 3.4: 0.1 ln s + 1; transformers
    _compute_yarn_parameters): gpt-oss's factor-32 YaRN gives 1.3466; DeepSeek's equal mscale
    and mscale_all_dim cancel to 1; an explicit attention_factor is taken as given; any other
    RoPE has none."""
    oss = model_from_hf_config(HF_CONFIGS["gpt-oss-120b"], "oss")
    assert oss.rope_attention_factor == pytest.approx(1 + 0.1 * math.log(32))
    assert MODELS["gpt-oss-120b"].rope_attention_factor == pytest.approx(1.3465736)
    ds = {**HF_CONFIGS["qwen3-30b-a3b"], "rope_scaling": {
        "rope_type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096}}
    assert model_from_hf_config(ds, "d").rope_attention_factor == 1.0
    given = {**HF_CONFIGS["qwen3-30b-a3b"], "rope_scaling": {
        "rope_type": "yarn", "factor": 4.0, "attention_factor": 1.25,
        "original_max_position_embeddings": 32768}}
    assert model_from_hf_config(given, "g").rope_attention_factor == 1.25
    assert model_from_hf_config(HF_CONFIGS["qwen3-30b-a3b"], "q").rope_attention_factor == 1.0


def test_megatron_runs_a_scaled_rope_unfused():
    """Megatron-Core's fused RoPE takes no attention factor (rope_utils.py: "mscale ... is not
    supported by TE's fused RoPE. Using unfused implementation."): gpt-oss's RoPE moves 24
    bytes per rotated element there, the fused 4 with a factor of 1; an engine whose RoPE
    folds the factor into its precomputed cos / sin (torchtitan) is unaffected."""
    from planner.cost.compute import elementwise_bytes, rope_width
    from planner.engines import get_engine
    oss = MODELS["gpt-oss-120b"]
    plain = dataclasses.replace(oss, rope_attention_factor=1.0)
    tokens, tp = 4096, 1
    meg = get_engine("megatron").elementwise_kernels
    extra = elementwise_bytes(oss, tokens, tp, False, 1.0, meg) - elementwise_bytes(
        plain, tokens, tp, False, 1.0, meg)
    assert extra == pytest.approx((24 - 4) * tokens * rope_width(oss, tp))
    tt = get_engine("torchtitan").elementwise_kernels
    assert elementwise_bytes(oss, tokens, tp, False, 1.0, tt) == elementwise_bytes(
        plain, tokens, tp, False, 1.0, tt)


def test_gpt_oss_clamp_read_and_priced_where_megatron_runs_it_apart():
    """gpt-oss's experts clamp their gated activation at swiglu_limit (7.0, both published
    configs); Megatron-Core clamps outside its fused GEGLU (fused_bias_geglu.py: two clamps and
    a cat, 16 more bytes per element of the MLP width), an engine with no such figure prices
    the gated activation as before."""
    from planner.cost.compute import activation_bytes_per_element, FUSED_KERNELS
    from planner.engines import get_engine
    oss = model_from_hf_config(HF_CONFIGS["gpt-oss-120b"], "oss")
    assert oss.activation_clamp == 7.0 and MODELS["gpt-oss-120b"].activation_clamp == 7.0
    assert model_from_hf_config({**HF_CONFIGS["gpt-oss-120b"], "swiglu_limit": 5.0},
                                "o").activation_clamp == 5.0
    meg = get_engine("megatron").elementwise_kernels
    plain = dataclasses.replace(oss, activation_clamp=0.0)
    assert (activation_bytes_per_element(oss, meg)
            == activation_bytes_per_element(plain, meg) + 16)
    assert (activation_bytes_per_element(oss, FUSED_KERNELS)
            == activation_bytes_per_element(plain, FUSED_KERNELS))
