"""Training data keyed by the global sample index, so every layout sees the same global batch.

Sample `i` is `seq_len + 1` token ids (inputs are the first `seq_len`, targets the last
`seq_len`). Step `s` (0-based) uses global samples `[s*G, (s+1)*G)` with `G` the global batch
size; data-parallel rank `d` takes the contiguous block `[d*G/dp, (d+1)*G/dp)` of them, which the
pipeline (or the gradient-accumulation loop) cuts into `num_microbatches` micro-batches in order.
The data position of a checkpoint is therefore just its step.

Sources:

* `synthetic`: each sample is an arithmetic progression modulo the vocabulary (random start and
  stride from a generator seeded by (seed, sample index)) with 10% of the positions replaced by
  random tokens - learnable in-context, so the loss goes down, and cheap.
* a file of token ids: `.npy` (a 1-D array of any integer dtype, memory-mapped), `.i32`/`.int32`
  (raw little-endian int32) or anything else (raw little-endian uint16, the nanoGPT `.bin`
  convention). Sample `i` is the window starting at token `(i mod n) * seq_len`, where
  `n = (num_tokens - 1) // seq_len`, so the file wraps around.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch


class DataError(ValueError):
    pass


def _sample_seed(seed: int, index: int) -> int:
    h = hashlib.sha256(f"data:{seed}:{index}".encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


class SyntheticTokens:
    def __init__(self, vocab_size: int, seq_len: int, seed: int):
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed

    def sample(self, index: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(_sample_seed(self.seed, index))
        v, n = self.vocab_size, self.seq_len + 1
        start = int(torch.randint(0, v, (1,), generator=g))
        stride = int(torch.randint(1, max(2, min(v, 8)), (1,), generator=g))
        toks = (start + stride * torch.arange(n)) % v
        noise = torch.rand(n, generator=g) < 0.1
        toks = torch.where(noise, torch.randint(0, v, (n,), generator=g), toks)
        return toks.long()


class FileTokens:
    def __init__(self, path: str, vocab_size: int, seq_len: int):
        p = Path(path)
        if not p.is_file():
            raise DataError(f"data file {path}: no such file")
        try:
            if p.suffix == ".npy":
                arr = np.load(p, mmap_mode="r")
            elif p.suffix in (".i32", ".int32"):
                arr = np.memmap(p, dtype="<i4", mode="r")
            else:
                arr = np.memmap(p, dtype="<u2", mode="r")
        except (ValueError, OSError) as e:
            raise DataError(f"data file {path}: cannot read ({e})") from None
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise DataError(f"data file {path}: expected a 1-D array of integer token ids, "
                            f"got {arr.dtype} with shape {arr.shape}")
        self.tokens, self.seq_len = arr, seq_len
        self.num_samples = (len(arr) - 1) // seq_len
        if self.num_samples < 1:
            raise DataError(f"data file {path}: {len(arr)} tokens, need at least {seq_len + 1}")
        hi = int(arr.max()) if len(arr) < 50_000_000 else int(arr[:50_000_000].max())
        if hi >= vocab_size or int(arr.min()) < 0:
            raise DataError(f"data file {path}: token id {hi} outside the model's vocabulary "
                            f"of {vocab_size}")

    def sample(self, index: int) -> torch.Tensor:
        start = (index % self.num_samples) * self.seq_len
        return torch.from_numpy(np.asarray(self.tokens[start:start + self.seq_len + 1],
                                           dtype=np.int64))


def make_source(data: str, vocab_size: int, seq_len: int, seed: int):
    if data == "synthetic":
        return SyntheticTokens(vocab_size, seq_len, seed)
    return FileTokens(data, vocab_size, seq_len)


def local_batch(source, step: int, global_batch: int, dp: int, dp_rank: int):
    """Inputs and targets [G/dp, seq_len] of data-parallel rank `dp_rank` at 0-based `step`."""
    per = global_batch // dp
    first = step * global_batch + dp_rank * per
    samples = torch.stack([source.sample(first + j) for j in range(per)])
    return samples[:, :-1].contiguous(), samples[:, 1:].contiguous()
