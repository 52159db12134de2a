"""The optimizer side of a step: AdamW over a part's parameters (DTensors and plain tensors in
separate groups) and this rank's share of the global gradient norm."""
from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import _StridedShard

ADAMW = dict(betas=(0.9, 0.95), eps=1e-8, foreach=True)


def adamw(params: list, lr: float, weight_decay: float):
    """AdamW over `params`, or None without any (an empty pipeline stage, a ZeRO 1 rank owning
    none of a part's parameters)."""
    # foreach kernels cannot mix DTensors and plain tensors: one group of each kind
    groups = [g for g in ([q for q in params if isinstance(q, DTensor)],
                          [q for q in params if not isinstance(q, DTensor)]) if g]
    if not groups:
        return None
    return torch.optim.AdamW([{"params": g} for g in groups], lr=lr, weight_decay=weight_decay,
                             **ADAMW)


@torch.no_grad()
def grad_norm_sq_local(params: list, copies: int) -> torch.Tensor:
    """This rank's share of the global squared gradient norm (fp64 scalar on the CPU): each
    local gradient's sum of squares, divided by how many ranks hold the very same shard (the
    `copies` = tp*dp ranks of a pipeline rank, over the DTensor's sharded mesh dims)."""
    terms = []
    for p in params:
        if p.grad is None:
            continue
        g = p.grad
        distinct = 1
        if isinstance(g, DTensor):
            for i, pl in enumerate(g.placements):
                if pl.is_shard() or isinstance(pl, _StridedShard):
                    distinct *= g.device_mesh.size(i)
            g = g.to_local()
        terms.append(g.double().pow(2).sum() * (distinct / copies))
    if not terms:
        return torch.zeros((), dtype=torch.float64)
    return torch.stack(terms).sum().cpu()
