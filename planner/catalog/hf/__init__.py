"""Hugging Face config.json readers, one module per model family, and the dispatcher.

`model_from_hf_config` maps a config onto a planner.specs.Model: the config's `model_type`
(a multimodal wrapper's `text_config`: HF_TEXT_WRAPPERS) picks the family's reader, which
reads its fields as the family's transformers configuration and modeling source do
(planner.catalog.hf.config.HfConfig: typed getters and the blocks families share). A key that
changes the math and is not modelled draws a one-line warning (HF_UNMODELLED, and each
reader's own).
"""
from __future__ import annotations

from planner import filecheck as S
from planner.catalog.hf import (bloom, deepseek, gemma, gpt2, gpt_neox, gpt_oss, llama, llama4,
                                mistral, nemotron, phi3, qwen)
from planner.catalog.hf.config import HfConfig, hf_warn
from planner.errors import BadInput
from planner.specs import Model

# the order the "not supported" message lists them in
HF_MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe",
                  "gemma", "gemma2", "gemma3_text", "phi3", "deepseek_v2", "deepseek_v3",
                  "gpt_oss", "llama4_text", "gpt2", "gpt_neox", "bloom", "nemotron")
FAMILIES = (llama, mistral, qwen, gemma, phi3, deepseek, gpt_oss, llama4, gpt2, gpt_neox, bloom,
            nemotron)
# model_type -> the family's reader: HfConfig -> Model fields
READERS = {t: family.fields for family in FAMILIES for t in family.MODEL_TYPES}
assert sorted(READERS) == sorted(HF_MODEL_TYPES), "a model type without its reader"
# multimodal configs whose language model is their `text_config` (Gemma3Config, Llama4Config)
HF_TEXT_WRAPPERS = {"gemma3": "gemma3_text", "llama4": "llama4_text"}

# Fields that change a model's parameters, FLOPs or function but that the planner does not
# model: present (and not their no-op value) they draw a one-line warning.
HF_UNMODELLED = {
    # Llama 4: RoPE layers attend within chunks of this many tokens (Llama4TextAttention);
    # priced here as full causal attention
    "attention_chunk_size": None,
    # RoPE on part of each head (Phi-3, StableLM, GLM): element-wise only
    "partial_rotary_factor": 1.0,
    # pre-quantised checkpoints (gpt-oss MXFP4 experts, DeepSeek-V3 FP8): planned as bf16
    # training weights
    "quantization_config": None,
}


def model_from_hf_config(cfg: dict, name: str, where: str | None = None) -> Model:
    """Map a Hugging Face config.json onto a Model. Keys the planner does not read are
    ignored (config.json files carry many), but a key that changes the math and is not
    modelled draws a one-line warning (hf_warn); every key it reads is type- and
    range-checked, and null means "not given" (the default)."""
    where = where or f"config {S.show_path(name)}"
    if not isinstance(cfg, dict):
        raise BadInput(f"{where}: not a config (expected a JSON object)")
    mt = cfg.get("model_type")
    if isinstance(mt, str) and mt in HF_TEXT_WRAPPERS:
        text = cfg.get("text_config")
        if not isinstance(text, dict):
            raise BadInput(f"{where}: model_type {mt!r} needs a text_config object")
        hf_warn(where, f"{mt}: only the language model (text_config) is planned, not the "
                       f"vision encoder")
        cfg = {"model_type": HF_TEXT_WRAPPERS[mt], **text}
        mt = cfg["model_type"]
    if mt is None:
        raise BadInput(f"{where}: neither a Hugging Face config.json (no model_type) nor a "
                       f"planner model spec (no num_layers)")
    if not isinstance(mt, str) or mt not in HF_MODEL_TYPES:
        raise BadInput(f"{where}: model_type {S.show(mt)} is not supported "
                       f"(supported: {', '.join(HF_MODEL_TYPES)})")
    for key, noop in HF_UNMODELLED.items():
        if cfg.get(key) is not None and cfg.get(key) != noop:
            shown = "given" if isinstance(cfg[key], (dict, list)) else S.show(cfg[key])
            hf_warn(where, f"{key} ({shown}) changes the math but is not modelled; ignored")
    kw = READERS[mt](HfConfig(cfg, where, mt))
    try:
        return Model(name=name, **kw)
    except BadInput as e:
        raise BadInput(f"{where}: {e}") from None
