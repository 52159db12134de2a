"""Activation checkpointing: the plan's `recompute` on each stage's first `recompute_layers`
layers (`full`: the whole layer, `selective`: the attention core only), with torch's
`checkpoint_wrapper` (as torchtitan's apply_ac)."""
from __future__ import annotations

from torch import nn


def apply_ac(part: nn.Module, stage, mode: str) -> list:
    """Checkpoint the stage's first `recompute_layers` layers; returns their indices."""
    if mode == "none" or stage.recompute_layers == 0:
        return []
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    idx = list(range(stage.layers[0], stage.layers[0] + stage.recompute_layers))
    for i in idx:
        layer = part.layers[str(i)]
        if mode == "full":
            part.layers[str(i)] = checkpoint_wrapper(layer, preserve_rng_state=True)
        else:   # selective: only the attention core (scores, softmax, weighted sum)
            layer.attention.core = checkpoint_wrapper(layer.attention.core,
                                                      preserve_rng_state=True)
    return idx
