"""Collectives over many small tensors at once: consecutive same-dtype runs of at most
`BUCKET_BYTES` are flattened into one buffer, reduced or broadcast, and copied back (the
tensor-parallel gradient sums, ZeRO 0/1's all-reduce and ZeRO 1's parameter broadcast)."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

BUCKET_BYTES = 64 * 2**20


def local(t):
    """This rank's tensor of a DTensor, or the tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t


def bucket_runs(tensors: list, cap: int = BUCKET_BYTES):
    """Consecutive runs of same-dtype tensors of at most `cap` bytes (one tensor if larger)."""
    run, size = [], 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if run and (size + nbytes > cap or t.dtype != run[0].dtype):
            yield run
            run, size = [], 0
        run.append(t)
        size += nbytes
    if run:
        yield run


def copy_back(run: list, flat: torch.Tensor) -> None:
    """Write a flat buffer back into the tensors it was flattened from."""
    for t, f in zip(run, torch._utils._unflatten_dense_tensors(flat, run)):
        t.copy_(f)


@torch.no_grad()
def all_reduce_in_buckets(tensors: list, group) -> None:
    """Sum every tensor over `group`, in place, one flat all-reduce per bucket."""
    for run in bucket_runs(tensors):
        flat = torch._utils._flatten_dense_tensors(run)
        dist.all_reduce(flat, group=group)
        copy_back(run, flat)


@torch.no_grad()
def broadcast_in_buckets(tensors: list, src: int, group) -> None:
    """Global rank `src`'s values of the tensors to every rank of `group`, in place."""
    for run in bucket_runs(tensors):
        flat = torch._utils._flatten_dense_tensors(run)
        dist.broadcast(flat, src=src, group=group)
        copy_back(run, flat)
