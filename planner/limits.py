"""Bounds on the work the planner does for a number a user typed.

No loop here or in the callers should be proportional to such a number: the GPU count, the
sweep's points and the integers of the command line are capped, and the divisors of a count are
found in O(sqrt n). The caps are far above any machine built so far (the largest training
clusters announced in 2025 hold a few 10^5 GPUs) and low enough that every answer stays quick.
"""
from __future__ import annotations

import math

# GPUs in one cluster: 2^20 (about a million). `plan --cluster h100x1048576` answers in seconds;
# a larger count is refused in one line instead of planned.
MAX_GPUS = 2 ** 20
# Points of one `plan sweep` (clusters x sequence lengths x global batches): each is a search.
MAX_SWEEP_POINTS = 256
# Any integer on the command line (--seq-len, --global-batch, --micro-batch, --nnodes, ...):
# far beyond a sensible value, well inside float range so the cost model never overflows.
MAX_INT_ARG = 2 ** 40
# A sequence length, a global batch (sequences) and a micro-batch in a file.
MAX_SEQ_LEN = 2 ** 27
MAX_BATCH = 2 ** 40
# Model shape limits (the largest published dense models are far inside them: Llama 3 405B has
# 126 layers, GPT-3 96; 1024 still admits the 1000-layer DeepNet). The layer count bounds the
# pipeline degrees searched: at 2^20 GPUs a 1024-layer model takes ~35 s to plan, a 4096-layer
# one minutes, so the cap stays here until the search bounds its own cost.
MAX_LAYERS = 1024
MAX_HIDDEN = 2 ** 20
MAX_HEADS = 2 ** 16
MAX_EXPERTS = 2 ** 12      # routed experts per layer (DeepSeek-V3 256, Kimi K2 384)
MAX_VOCAB = 2 ** 26


def divisors(n: int) -> list:
    """The divisors of n (>= 1) in increasing order, in O(sqrt n) steps."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"divisors of a positive integer only, got {n!r}")
    small, large = [], []
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
    return small + large[::-1]
