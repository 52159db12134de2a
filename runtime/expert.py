"""Expert parallelism: the routed experts of each MoE layer split over `ep` ranks.

Megatron's MoE parallel folding with tp = etp = 1: the `ep` ranks are carved out of the `dp`
ranks (dp rank d = edp * ep + ep rank, ep innermost as in Megatron's expert grid), so the expert
mesh has the dims of the plan's mesh with `dp` unflattened into (`edp`, `ep`). Every dp rank
keeps its own tokens; an ep rank holds experts [r * E/ep, (r+1) * E/ep) of every MoE layer, as
DTensors `Shard(0)` over the `ep` dim (so initialisation, checkpoints and the gradient norm see
the whole stacked tensor).

Dispatch and combine (`distribute_module` input/output functions around `GroupedExperts`, as
torchtitan's ExpertParallel does): the per-expert token counts are exchanged with one
all_to_all_single, the token rows (already sorted by expert) go to the ranks holding their
experts with all_to_all_single with variable splits, are regrouped by local expert, run, and
go back the same way. The token all-to-alls are the differentiable functional collectives
(`torch.distributed._functional_collectives.all_to_all_single_autograd`: the backward is the
reverse all-to-all), so autograd is exact. gloo implements all_to_all_single with variable
splits on CPU (torch 2.13), so the CPU runtime uses the same all-to-all dispatcher as NCCL.

Gradients: a dense parameter's gradient is averaged over dp as before; an expert's gradient on
an ep rank already sums the contributions of the tokens of every rank of its ep group, so it is
summed over the expert-data-parallel group (`edp` = dp / ep ranks holding the same experts)
only and divided by dp (`expert_grad_divisor`): ZeRO 0/1 all-reduce it over `edp`, FSDP2
(ZeRO 2/3) shards and reduce-scatters it over `edp` (dividing by edp) and `ExpertGradScale`
multiplies by edp / dp after the step's last backward (FSDP's own
`set_gradient_divide_factor` needs ReduceOp.PREMUL_SUM, which gloo lacks).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

EXPERTS = ".feed_forward.experts."


def runtime_problems(plan) -> list:
    """What this runtime cannot lay out of an MoE plan that planner.validity accepts (one line
    each; `runtime.parallelize.check_layout` refuses with the first)."""
    p, m = plan.parallelism, plan.model
    out = []
    if not m.is_moe:
        return out
    if p.tp > 1:
        out.append(f"MoE model {m.name} with tp {p.tp}: the runtime does not tensor-split MoE "
                   f"layers yet (tp 1 only; ep is carved out of dp)")
    if p.etp > 1:
        out.append(f"expert tensor parallelism (etp {p.etp}) is not supported by the runtime yet")
    return out


def is_expert_param(name: str) -> bool:
    """A routed expert's stacked weight (split over ep ranks), by parameter name."""
    return EXPERTS in "." + name


def expert_grad_divisor(plan) -> int:
    """What an expert gradient summed over the edp group is divided by: the dp ranks whose
    mean loss the step minimises."""
    return plan.parallelism.dp


def build_expert_mesh(plan, device_type: str):
    """The plan's mesh with `dp` unflattened into (`edp`, `ep`); None without expert
    parallelism. Same rank at every coordinate as `runtime.parallelize.build_mesh`."""
    p = plan.parallelism
    if p.ep == 1:
        return None
    names, sizes = [], []
    for d in p.rank_order:
        if d == "dp":
            names += ["edp", "ep"]
            sizes += [p.dp // p.ep, p.ep]
        else:
            names.append(d)
            sizes.append(getattr(p, d))
    return init_device_mesh(device_type, tuple(sizes), mesh_dim_names=tuple(names))


def moe_modules(part: nn.Module) -> list:
    from runtime.model import MoEFeedForward
    return [m for m in part.modules() if isinstance(m, MoEFeedForward)]


def apply_ep(part: nn.Module, ep_mesh) -> None:
    """Split every MoE layer's routed experts over `ep_mesh` (1-D) and route tokens to them."""
    from torch.distributed.tensor import Shard, distribute_module, distribute_tensor

    def partition(name, module, mesh):
        for n, p in list(module.named_parameters(recurse=False)):
            module.register_parameter(n, nn.Parameter(distribute_tensor(p, mesh, [Shard(0)])))

    for moe in moe_modules(part):
        distribute_module(moe.experts, ep_mesh, partition, input_fn=_dispatch,
                          output_fn=_combine)


def _dispatch(module, inputs, mesh):
    """(rows sorted by global expert, counts per global expert) -> (rows received, sorted by
    local expert; counts per local expert). Remembers the splits for `_combine`."""
    x, counts = inputs
    ep = mesh.size()
    group = mesh.get_group()
    local = len(counts) // ep
    send = torch.tensor(counts, dtype=torch.int64, device=x.device)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)    # recv[s, e]: rows from rank s for my e
    recv = recv.view(ep, local).cpu()
    in_splits = [sum(counts[r * local:(r + 1) * local]) for r in range(ep)]
    out_splits = recv.sum(dim=1).tolist()
    rows = _all_to_all(x, out_splits, in_splits, group)
    # received rows are grouped by source rank, then expert: regroup by expert, then source
    starts = (torch.cumsum(recv.flatten(), 0) - recv.flatten()).view(ep, local)
    perm = torch.cat([torch.arange(int(starts[s, e]), int(starts[s, e] + recv[s, e]))
                      for e in range(local) for s in range(ep)]).to(x.device)
    module._ep_splits = (in_splits, out_splits, perm)
    return rows[perm], recv.sum(dim=0).tolist()


def _combine(module, out, mesh):
    """The experts' output rows back to the ranks (and the order) they came from."""
    in_splits, out_splits, perm = module._ep_splits
    back = out[torch.argsort(perm)]
    return _all_to_all(back, in_splits, out_splits, mesh.get_group())


def _all_to_all(x, output_splits: list, input_splits: list, group):
    from torch.distributed._functional_collectives import all_to_all_single_autograd
    return all_to_all_single_autograd(x.contiguous(), output_splits, input_splits, group)


class ExpertGradScale:
    """FSDP2 averages the expert gradients over edp ranks; the step's loss is the mean over
    dp: multiply the (sharded, accumulated) expert gradients by edp / dp = 1 / ep."""

    def __init__(self, params: list, plan):
        self.params = params
        self.factor = 1.0 / plan.parallelism.ep

    @torch.no_grad()
    def __call__(self):
        for p in self.params:
            if p.grad is not None:
                g = p.grad
                (g.to_local() if hasattr(g, "to_local") else g).mul_(self.factor)
