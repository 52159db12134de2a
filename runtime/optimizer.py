"""The optimizer side of a step: AdamW over a part's parameters (DTensors and plain tensors in
separate groups), its learning-rate schedule (linear warm-up, then cosine or linear decay to a
minimum: `lr_factor`, one `LambdaLR` per optimizer as torchtitan's LRSchedulersContainer), this
rank's share of the global gradient norm, and clipping by that norm.

Clipping as torchtitan's `clip_grad_norm_` (torchtitan/distributed/utils.py, commit b5bcd76):
torch's `get_total_norm` over the DTensor gradients reduces each over its own mesh
(DP/FSDP/TP), and the pipeline stages' squared norms are then summed over `pp_mesh` because
each stage holds other parameters; torchtitan adds a separate path for expert parameters,
whose DTensors live on another mesh (`_clip_grad_norm_with_ep`). Here one all-reduce over the
whole world does all of it at once: every rank adds its local shards' squared sums, each
divided by the number of ranks that hold that very shard (`grad_norm_sq_local`), so the sum
over the world counts every element of every stage once, experts included. The gradients are
then scaled by torch's own `clip_grads_with_norm_` (max_norm / (norm + 1e-6), at most 1), the
function torchtitan calls after its reduction."""
from __future__ import annotations

import math

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


def lr_factor(step0: int, steps: int, warmup: int, decay: str, min_ratio: float) -> float:
    """The learning rate of 0-based step `step0` over the peak: linear warm-up over `warmup`
    steps ((step0 + 1) / warmup), then from 1 down to `min_ratio` at the run's end ("cosine":
    min + (1 - min) * (1 + cos(pi * progress)) / 2, "linear": min + (1 - min) * (1 - progress);
    "constant" stays at 1), as torchtitan's linear_warmup_stable_decay without a stable phase:
    its one virtual stable step after the warm-up keeps the last step above the minimum
    (progress = (step0 - warmup) / (steps - warmup), 0 at the first step after the warm-up).
    A step beyond the schedule's `steps` stays at the minimum."""
    if step0 < warmup:
        return (step0 + 1) / warmup
    if decay == "constant" or step0 <= warmup:
        return 1.0
    progress = min(1.0, (step0 - warmup) / (steps - warmup))
    if decay == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    elif decay == "linear":
        shape = 1.0 - progress
    else:
        raise ValueError(f"unknown lr decay {decay!r}")
    return min_ratio + (1.0 - min_ratio) * shape


def schedulers(optims: list, run):
    """One LambdaLR per optimizer (None for a missing optimizer), all on `run`'s schedule
    (planner.plan.RunOptions); each sets its optimizer's rate for step 0 when built."""
    from torch.optim.lr_scheduler import LambdaLR

    return [LambdaLR(o, lambda step0: run_factor(run, step0)) if o is not None else None
            for o in optims]


def run_factor(run, step0: int) -> float:
    """`lr_factor` of 0-based step `step0` on the schedule of `run` (RunOptions)."""
    return lr_factor(step0, run.schedule_steps, run.warmup, run.lr_decay, run.min_lr_ratio)


def set_schedule_step(scheds: list, step0: int) -> None:
    """Put every scheduler (and its optimizer's rate) at 0-based step `step0`, as torchtitan's
    LRSchedulersContainer.load_state_dict restores `last_epoch` and recomputes the rate from
    each optimizer's base rate (so this run's peak rate applies on a resume)."""
    for s in scheds:
        if s is None:
            continue
        s.last_epoch = step0
        s._step_count = step0 + 1
        lrs = [base * s.lr_lambdas[i](step0) for i, base in enumerate(s.base_lrs)]
        for g, lr in zip(s.optimizer.param_groups, lrs):
            g["lr"] = lr
        s._last_lr = lrs


@torch.no_grad()
def clip_grads(params: list, max_norm: float, total_norm: float) -> None:
    """Scale the gradients of `params` by torch's `clip_grads_with_norm_` for the global norm
    `total_norm` (already reduced over every rank), one call per kind of gradient: plain
    tensors, and DTensors of each device mesh (its foreach kernels mix neither: FSDP's norm
    weights live on the dp mesh, the tp-split matrices on (dp, tp), the experts on theirs)."""
    norm = torch.tensor(total_norm, dtype=torch.float64)
    groups = {}
    for p in params:
        if p.grad is not None:
            mesh = p.grad.device_mesh if isinstance(p.grad, DTensor) else None
            groups.setdefault(mesh, []).append(p)
    for group in groups.values():
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, norm, foreach=None)
