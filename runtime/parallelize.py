"""`parallelize()`: one pipeline part laid out as the plan asks, in torchtitan's order (its
parallelize_llama): tensor parallel -> expert parallel -> activation checkpointing -> FSDP;
then `materialize_and_init` allocates the part (`to_empty`) and initialises every full tensor
from (seed, name), keeping this rank's shard of it.

One room per parallelism:

    runtime/tensor_parallel.py        TP + sequence parallel (DTensor plans) and their gradient
                                      fix-ups
    runtime/expert.py                 expert parallelism (the experts over ep, each over tp)
    runtime/activation_checkpoint.py  recompute of each stage's first layers
    runtime/data_parallel.py          ZeRO 2/3 (FSDP2 `fully_shard`), ZeRO 0/1 (bucketed dp
                                      all-reduce overlapping the backward, ZeRO 1 ownership)
    runtime/pipeline.py               stages and schedules
    runtime/optimizer.py              AdamW, the global gradient norm

ZeRO 0/1 touch no module: their gradient all-reduce and ZeRO 1's parameter broadcast work on
the parameters, so `runtime.train.Trainer` builds them with the optimizers.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, distribute_tensor

from runtime.activation_checkpoint import apply_ac
from runtime.data_parallel import apply_fsdp
from runtime.expert import apply_ep, build_expert_mesh
from runtime.model import canonical_name, init_full_tensor
from runtime.tensor_parallel import apply_tp


class LayoutError(ValueError):
    """The plan asks for something this runtime cannot lay out (refused before training)."""


def check_layout(plan) -> None:
    """Refuse a plan this runtime cannot lay out: the rules of planner.rules, which the
    search and Plan.validate share (so a plan the search emits is never refused here)."""
    from planner.rules import plan_problems
    # runner "runtime": the engine it was priced for, then this runtime's limits as the
    # runtime engine spec states them (planner.engines.runtime), then every plan rule
    problems = plan_problems(plan, runner="runtime")
    if problems:
        raise LayoutError(problems[0])


def build_mesh(plan, device_type: str):
    p = plan.parallelism
    order = tuple(p.rank_order)
    sizes = tuple(getattr(p, d) for d in order)
    return init_device_mesh(device_type, sizes, mesh_dim_names=order)


@dataclass
class Meshes:
    """The plan's device mesh (`rank_order`), its tp / dp / pp sub-meshes, and with expert
    parallelism (ep > 1 or tp > 1) the expert mesh (`dp` unflattened into `edp`, `ep`) and its
    `edp` sub-mesh (None otherwise)."""
    world: object
    tp: object
    dp: object
    pp: object
    expert: object = None
    edp: object = None
    # what FSDP (ZeRO 2/3) shards over: `dp`, or under hybrid sharding (the plan's dp_shard)
    # the 2-D (dp_replicate, dp_shard) mesh of the same ranks
    fsdp: object = None


def build_meshes(plan, device_type: str) -> Meshes:
    world = build_mesh(plan, device_type)
    expert = build_expert_mesh(plan, device_type)
    hsdp = build_hsdp_mesh(plan, device_type)
    return Meshes(world, world["tp"], world["dp"], world["pp"], expert,
                  expert["edp"] if expert is not None else None,
                  hsdp["dp_replicate", "dp_shard"] if hsdp is not None else world["dp"])


def build_hsdp_mesh(plan, device_type: str):
    """The plan's mesh with `dp` unflattened into (`dp_replicate`, `dp_shard`), the shard
    groups consecutive dp ranks (planner.cost.dataparallel prices them so); None without
    hybrid sharding. Same rank at every coordinate as `build_mesh`: FSDP2's fully_shard over
    its 2-D sub-mesh is HSDP (torch/distributed/fsdp/_fully_shard/_fully_shard.py: a 2-D mesh
    replicates over its first dimension and shards over the second)."""
    p = plan.parallelism
    if not p.dp_shard or p.dp_shard == p.dp:
        return None
    names, sizes = [], []
    for d in p.rank_order:
        if d == "dp":
            names += ["dp_replicate", "dp_shard"]
            sizes += [p.dp // p.dp_shard, p.dp_shard]
        else:
            names.append(d)
            sizes.append(getattr(p, d))
    return init_device_mesh(device_type, tuple(sizes), mesh_dim_names=tuple(names))


@dataclass
class PartLayout:
    """What `parallelize` leaves for the training step: the parameters of the part every tp rank
    holds whole (`TpReplicatedGradSync`: by name, since FSDP and `to_empty` replace the
    parameter objects) and the layer indices it checkpoints."""
    tp_replicated: list
    recomputed: list


def parallelize(part: nn.Module, stage, plan, meshes: Meshes, on_gpu: bool) -> PartLayout:
    """Lay out one pipeline part (a `runtime.model.Transformer` on the meta device) in
    torchtitan's order: TP -> EP -> activation checkpointing -> FSDP (ZeRO 2/3)."""
    p = plan.parallelism
    tp_replicated = []
    if p.tp > 1:
        tp_replicated = apply_tp(part, meshes.tp, p.sequence_parallel, plan.model)
    if meshes.expert is not None:
        apply_ep(part, meshes.expert)
    recomputed = apply_ac(part, stage, p.recompute)
    if p.zero_stage >= 2:
        apply_fsdp(part, meshes.fsdp, p.zero_stage, on_gpu, meshes.edp)
    return PartLayout(tp_replicated, recomputed)


@torch.no_grad()
def materialize_and_init(part: nn.Module, spec, seed: int, device) -> None:
    part.to_empty(device=device)
    if (spec.tied_embeddings and part.tok_embeddings is not None and part.output is not None
            and not hasattr(part, "unshard")):   # to_empty unties shared parameters (FSDP
        part.output.weight = part.tok_embeddings.weight   # keeps its own shared-param record)
    for name, p in part.named_parameters():
        full = init_full_tensor(canonical_name(name, spec), tuple(p.shape), spec, seed,
                                device=device)
        if isinstance(p, DTensor):
            local = distribute_tensor(full, p.device_mesh, p.placements,
                                      src_data_rank=None).to_local()
            p.to_local().copy_(local.to(device))
        else:
            p.copy_(full.to(device))
