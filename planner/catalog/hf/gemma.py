"""Gemma, Gemma 2 and Gemma 3's language model (transformers models/gemma, gemma2, gemma3)."""
from planner import limits as B
from planner import filecheck as S
from planner.catalog.hf.config import NO_WINDOW, HfConfig

MODEL_TYPES = ("gemma", "gemma2", "gemma3_text")


def fields(r: HfConfig) -> dict:
    # modeling_gemma*.py: head_dim 256 (not hidden / heads), GELU-tanh gated MLP
    # (`hidden_activation`), tied embeddings. Gemma 2: layer i slides when i is even
    # (Gemma2DecoderLayer is_sliding = not bool(layer_idx % 2)); Gemma 3: 5 local to 1
    # global (sliding_window_pattern 6, (i + 1) % 6 == 0 global). Their extra
    # post-attention / post-feed-forward RMSNorms (2 x hidden per layer) and Gemma 3's
    # q/k norms (2 x head_dim) are not counted (< 0.01% of the model).
    mt = r.model_type
    every = (2 if mt == "gemma2"
             else r.get("sliding_window_pattern", S.Int(1, B.MAX_LAYERS), 6))
    return dict(r.llama_like(8192, attn_bias=False, act_default="gelu_pytorch_tanh",
                             act_key="hidden_activation" if r.cfg.get("hidden_activation")
                             else "hidden_act", tied=True),
                **(r.windows(all_layers=False, every=every) if mt != "gemma"
                   else NO_WINDOW))
