"""Expert parallelism: the routed experts of each MoE layer split over `ep` ranks and, under
tensor parallelism, each expert's FFN split over the `tp` ranks (etp = tp).

Megatron's MoE parallel folding with etp = tp: the `ep` ranks are carved out of the `dp`
ranks (dp rank d = edp * ep + ep rank, ep innermost as in Megatron's expert grid), so the expert
mesh has the dims of the plan's mesh with `dp` unflattened into (`edp`, `ep`); the expert
tensor-parallel group is the plan's `tp` group (etp innermost, as Megatron lays it out). An ep
rank holds experts [r * E/ep, (r+1) * E/ep) of every MoE layer, as DTensors on the (`ep`, `tp`)
sub-mesh: `Shard(0)` over `ep` and, over `tp`, the FFN dim (w1/w3 [E, h, f] `Shard(2)`, w2
[E, f, h] `Shard(1)`, w1/w3 biases [E, f] `Shard(1)`, the w2 bias [E, h] `Replicate`, added by
tp rank 0 only and its gradient summed over tp), so initialisation, checkpoints and the gradient
norm see the whole stacked tensors.

The flow planner.cost.moe prices (Megatron's MoEAlltoAllTokenDispatcher): under tp, sequence
parallelism is required (planner.rules), so a rank enters the MoE layer with its b*s/tp
tokens; it routes them itself (the router weight is replicated over tp, its gradient a
Partial sum reduced by `runtime.tensor_parallel.AlignGradPlacements`, as the norms'); the shared
expert is a dense FFN split over tp like the dense MLP (all-gather in, reduce-scatter out).

Dispatch and combine (`distribute_module` input/output functions around `GroupedExperts`, as
torchtitan's ExpertParallel does): the per-expert token counts are exchanged with one
all_to_all_single over the ep group (ranks with the same tp coordinate), the token rows
(already sorted by expert) go to the ranks holding their experts with all_to_all_single with
variable splits; with tp > 1 the received rows (and their counts) are all-gathered over the tp
group, regrouped by local expert, each rank computes its f/tp slice of every local expert on
all of them, and the partial outputs are reduce-scattered back over tp (each rank its own rows)
before the reverse all-to-all. Every token collective is the differentiable functional
all-to-all (`torch.distributed._functional_collectives.all_to_all_single_autograd`: the
backward is the reverse all-to-all); the variable all-gather and reduce-scatter over tp are
all-to-alls with splits too (all-gather: this rank's rows sent to every tp rank; reduce-scatter:
chunk t to rank t, the tp received copies summed), so autograd is exact with uneven counts.
gloo implements all_to_all_single with variable splits on CPU (torch 2.13), so the CPU runtime
uses the same dispatcher as NCCL.

Gradients: a dense parameter's gradient is averaged over dp as before; an expert's gradient on
an ep rank already sums the contributions of the tokens of every rank of its ep group (and,
through the tp all-gather, of every tp rank's tokens), so it is summed over the
expert-data-parallel group (`edp` = dp / ep ranks holding the same expert shards) only and
divided by dp (`expert_grad_divisor`): ZeRO 0/1 all-reduce it over `edp`, FSDP2 (ZeRO 2/3)
shards and reduce-scatters it over `edp` (dividing by edp) and `ExpertGradScale` multiplies by
edp / dp after the step's last backward (FSDP's own `set_gradient_divide_factor` needs
ReduceOp.PREMUL_SUM, which gloo lacks).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from runtime.tensor_parallel import SumGradOverGroup

EXPERTS = ".feed_forward.experts."


def is_expert_param(name: str) -> bool:
    """A routed expert's stacked weight (split over ep ranks), by parameter name."""
    return EXPERTS in "." + name


def expert_grad_divisor(plan) -> int:
    """What an expert gradient summed over the edp group is divided by: the dp ranks whose
    mean loss the step minimises."""
    return plan.parallelism.dp


def build_expert_mesh(plan, device_type: str):
    """The plan's mesh with `dp` unflattened into (`edp`, `ep`); None without expert
    parallelism (ep = 1 and tp = 1). Same rank at every coordinate as
    `runtime.parallelize.build_mesh`."""
    p = plan.parallelism
    if p.ep == 1 and p.tp == 1:
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


# how each stacked expert parameter is split over tp (etp = tp): the FFN dim
TP_PLACEMENT = {"w1": 2, "w3": 2, "w2": 1, "w1_bias": 1, "w3_bias": 1, "w2_bias": None}


def expert_placements(mesh, name: str) -> list:
    """Placements of expert parameter `name` on the experts' mesh (`ep`, or `ep` and `tp` in
    the expert mesh's order): Shard(0) over ep, the FFN dim over tp."""
    from torch.distributed.tensor import Replicate, Shard
    dim = TP_PLACEMENT[name]
    return [Shard(0) if d == "ep" else Replicate() if dim is None else Shard(dim)
            for d in mesh.mesh_dim_names]


def apply_ep(part: nn.Module, expert_mesh) -> None:
    """Split every MoE layer's routed experts over the expert mesh's `ep` dim (and each expert
    over `tp` when tp > 1) and route tokens to them."""
    from torch.distributed.tensor import distribute_module, distribute_tensor
    tp = expert_mesh["tp"].size()
    mesh = expert_mesh[tuple(d for d in expert_mesh.mesh_dim_names
                             if d == "ep" or (d == "tp" and tp > 1))]

    def partition(name, module, mesh):
        for n, p in list(module.named_parameters(recurse=False)):
            module.register_parameter(n, nn.Parameter(
                distribute_tensor(p, mesh, expert_placements(mesh, n))))

    for moe in moe_modules(part):
        distribute_module(moe.experts, mesh, partition, input_fn=_dispatch,
                          output_fn=_combine)
        if tp > 1 and moe.experts.w2_bias is not None:
            # the partial outputs are summed over tp: tp rank 0 adds the bias, every rank
            # sums its gradient over tp (rank 0's holds all of it)
            group, keep = mesh.get_group("tp"), float(mesh.get_local_rank("tp") == 0)
            moe.experts.w2_bias_share = (
                lambda b, group=group, keep=keep: SumGradOverGroup.apply(b, group) * keep)


def _groups(mesh):
    """(ep group, ep, tp group, tp, tp rank) of the experts' mesh; tp 1 without a tp dim."""
    names = mesh.mesh_dim_names
    ep_group, ep = mesh.get_group("ep"), mesh.size(names.index("ep"))
    if "tp" not in names:
        return ep_group, ep, None, 1, 0
    return (ep_group, ep, mesh.get_group("tp"), mesh.size(names.index("tp")),
            mesh.get_local_rank("tp"))


def _dispatch(module, inputs, mesh):
    """(rows sorted by global expert, counts per global expert) -> (rows this rank's expert
    shards compute, sorted by local expert; counts per local expert). Remembers the splits for
    `_combine`."""
    x, counts = inputs
    ep_group, ep, tp_group, tp, tp_rank = _groups(mesh)
    local = len(counts) // ep
    send = torch.tensor(counts, dtype=torch.int64, device=x.device)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=ep_group)   # recv[s, e]: rows from rank s for my e
    in_splits = [sum(counts[r * local:(r + 1) * local]) for r in range(ep)]
    out_splits = recv.view(ep, local).sum(dim=1).tolist()
    rows = _all_to_all(x, out_splits, in_splits, ep_group)
    if tp > 1:     # every tp rank's received rows: grid[t, s, e] rows of tp rank t's
        grid = [torch.empty_like(recv) for _ in range(tp)]
        dist.all_gather(grid, recv, group=tp_group)
        grid = torch.stack(grid).view(tp, ep, local).cpu()
        tp_sizes = grid.sum(dim=(1, 2)).tolist()
        rows = _all_gather_rows(rows, tp_sizes, tp_group)
    else:
        grid, tp_sizes = recv.view(1, ep, local).cpu(), None
    # rows are grouped by (tp rank, source ep rank, expert): regroup by expert first
    perm = _regroup(grid).to(x.device)
    module._ep_splits = (in_splits, out_splits, perm, tp_sizes, tp_rank, tp_group)
    return rows[perm], grid.sum(dim=(0, 1)).tolist()


def _regroup(grid):
    """The row order that takes rows laid out in blocks of grid[t, s, e] rows (t, then s, then
    e) to blocks ordered by e, then t, then s."""
    flat = grid.flatten()
    starts = (torch.cumsum(flat, 0) - flat).view(grid.shape)
    lengths = grid.permute(2, 0, 1).flatten()
    first = starts.permute(2, 0, 1).flatten()
    offset = torch.cumsum(lengths, 0) - lengths        # where each block lands
    n = int(lengths.sum())
    return (torch.repeat_interleave(first - offset, lengths, output_size=n)
            + torch.arange(n))


def _combine(module, out, mesh):
    """The experts' output rows (partial sums over the tp ranks' FFN slices when tp > 1) back
    to the ranks (and the order) they came from."""
    in_splits, out_splits, perm, tp_sizes, tp_rank, tp_group = module._ep_splits
    back = out[torch.argsort(perm)]
    if tp_sizes is not None:
        back = _reduce_scatter_rows(back, tp_sizes, tp_rank, tp_group)
    return _all_to_all(back, in_splits, out_splits, mesh.get_group("ep"))


def _all_to_all(x, output_splits: list, input_splits: list, group):
    from torch.distributed._functional_collectives import all_to_all_single_autograd
    return all_to_all_single_autograd(x.contiguous(), output_splits, input_splits, group)


def _all_gather_rows(x, sizes: list, group):
    """Variable all-gather of rows over `group` (`sizes[t]` rows on rank t), differentiable:
    an all-to-all sending this rank's rows to every rank (its backward returns each rank's
    gradient of them, which the repeat sums: a reduce-scatter)."""
    n = len(sizes)
    return _all_to_all(x.repeat(n, 1), sizes, [x.shape[0]] * n, group)


def _reduce_scatter_rows(x, sizes: list, rank: int, group):
    """Variable reduce-scatter of rows over `group`: rank t gets the sum over ranks of their
    chunk t (`sizes[t]` rows), differentiable (the backward gathers the gradient back)."""
    n, mine = len(sizes), sizes[rank]
    return _all_to_all(x, [mine] * n, sizes, group).view(n, mine, x.shape[-1]).sum(dim=0)


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
