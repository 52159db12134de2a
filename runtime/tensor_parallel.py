"""Tensor parallelism (Megatron's, on DTensor): the TP/SP plan of each part and the gradient
fix-ups it needs after backward.

`apply_tp` lays a part out with `parallelize_module`: column-parallel q/k/v and MLP-in,
row-parallel out projections, vocabulary-parallel embedding and output, and with sequence
parallel the norms and residuals split over the sequence. Afterwards, every step:
`AlignGradPlacements` makes each DTensor gradient carry its parameter's placements (norm
weights' Partial sums reduced, the embedding's Replicate gradient sliced) and
`TpReplicatedGradSync` sums the gradients of the key/value projections every tp rank holds
whole. `SumGradOverGroup` (Megatron's `f`) is shared with `runtime.expert`.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from runtime.buckets import all_reduce_in_buckets, local


def apply_tp(part: nn.Module, tp_mesh, sequence_parallel: bool, spec) -> list:
    """Megatron-style TP (column-parallel q/k/v and MLP-in, row-parallel out projections,
    vocabulary-parallel embedding and output) plus sequence parallel for norms and residuals.

    With fewer key/value heads than tp ranks (tp % num_kv_heads == 0), `wk`/`wv` stay whole on
    every rank and each rank keeps the one kv head its query heads use; their gradients then
    need a sum over the tp group: returns those parameters' names (`TpReplicatedGradSync`).

    An MoE layer (sequence parallel required: `runtime.expert.runtime_problems`) takes its
    sequence shard as a local tensor: the router, replicated over tp, routes this rank's
    tokens (`SequenceParallel` over the token dim, so its gradient is a Partial sum, as a
    norm's); the shared expert is split like the dense MLP (all-gather in, reduce-scatter
    out); the routed experts are `runtime.expert.apply_ep`'s."""
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel,
                                                   parallelize_module)
    seq = Shard(1) if sequence_parallel else Replicate()
    top = {}
    if part.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
        if part.pos_embeddings is not None:
            top["pos_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if part.norm is not None and sequence_parallel:
        top["norm"] = SequenceParallel()
    if part.output is not None:
        # logits stay split over the vocabulary: `runtime.pipeline.loss_fn` is vocab-parallel
        top["output"] = ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1),
                                        use_local_output=False)
    tied = (part.output is not None and part.tok_embeddings is not None
            and part.output.weight is part.tok_embeddings.weight)
    if top:
        parallelize_module(part, tp_mesh, top)
    if tied:   # both are Shard(0) over the vocabulary: share the DTensor parameter again
        part.output.weight = part.tok_embeddings.weight

    tp = tp_mesh.size()
    shard_kv = spec.num_kv_heads % tp == 0
    replicated = []
    for li, layer in part.layers.items():
        # an MoE layer (runtime.model.MoEFeedForward); sequence parallel, as the preflight
        # (runtime.expert.runtime_problems) requires
        moe = hasattr(layer.feed_forward, "router")
        # the dense FFN: the MLP, or an MoE layer's shared expert
        ffn_name = "feed_forward.shared_expert" if moe else "feed_forward"
        ffn = layer.feed_forward.shared_expert if moe else layer.feed_forward
        lp = {
            "attention.wq": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=seq),
        }
        if ffn is not None:
            lp[f"{ffn_name}.w1"] = ColwiseParallel()
            lp[f"{ffn_name}.w2"] = RowwiseParallel(output_layouts=seq)
            if ffn.w3 is not None:
                lp[f"{ffn_name}.w3"] = ColwiseParallel()
        if shard_kv:
            lp["attention.wk"] = ColwiseParallel()
            lp["attention.wv"] = ColwiseParallel()
        else:
            kv_head = tp_mesh.get_local_rank() // (tp // spec.num_kv_heads)
            lo, hi = kv_head * spec.head_dim, (kv_head + 1) * spec.head_dim
            group = tp_mesh.get_group()
            for w in ("wk", "wv"):
                lin = getattr(layer.attention, w)
                # input: identity forward, all-reduce backward (each rank's gradient covers only
                # its own query heads); output: this rank's kv head
                lin.register_forward_pre_hook(
                    lambda mod, args, group=group: (SumGradOverGroup.apply(args[0], group),))
                lin.register_forward_hook(lambda mod, args, out, lo=lo, hi=hi: out[..., lo:hi])
                replicated += [f"layers.{li}.attention.{w}.{n}" for n, _ in lin.named_parameters()]
        if sequence_parallel:
            lp.update({
                "attention_norm": SequenceParallel(),
                "ffn_norm": SequenceParallel(),
                "attention": PrepareModuleInput(input_layouts=(Shard(1),),
                                                desired_input_layouts=(Replicate(),),
                                                use_local_output=True),
            })
            if ffn is not None:    # the dense FFN reads the whole sequence: all-gathered
                lp[ffn_name] = PrepareModuleInput(input_layouts=(Shard(1),),
                                                  desired_input_layouts=(Replicate(),))
        if moe:   # this rank's tokens, as a local tensor, routed by the replicated router
            lp["feed_forward"] = PrepareModuleInput(input_layouts=(Shard(1),),
                                                    desired_input_layouts=(Shard(1),),
                                                    use_local_output=True)
            lp["feed_forward.router"] = SequenceParallel(sequence_dim=0, use_local_output=True)
        parallelize_module(layer, tp_mesh, lp)
        sinks = getattr(layer.attention, "sinks", None)
        if sinks is not None:   # attention sinks: one logit per query head, split with the heads
            layer.attention.sinks = nn.Parameter(distribute_tensor(sinks, tp_mesh, [Shard(0)]))
    return replicated


class SumGradOverGroup(torch.autograd.Function):
    """Megatron's `f`: identity in forward, all-reduce of the gradient in backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class AlignGradPlacements:
    """Make every DTensor gradient carry its parameter's placements, right after backward.

    Tensor parallelism leaves some gradients laid out unlike their parameters: norm weights
    under sequence parallel get Partial(sum) gradients (reduced here once, bucketed, instead of
    by implicit all-reduces inside every AdamW op), and the vocabulary-parallel embedding gets
    a Replicate gradient for its Shard(0) weight (sliced here, no communication). The
    optimizer, the gradient norm, tied-weight and ZeRO syncs then all see matching shards."""

    def __init__(self, params: list):
        self.params = params
        # a Replicate gradient of a sharded parameter is sliced as soon as it is accumulated,
        # so gradient accumulation keeps only this rank's shard (no communication)
        for p in params:
            if isinstance(p, DTensor) and any(pl.is_shard() for pl in p.placements):
                p.register_post_accumulate_grad_hook(_slice_replicated_grad)

    @torch.no_grad()
    def __call__(self):
        todo = {}
        for p in self.params:
            g = p.grad
            if not isinstance(g, DTensor) or tuple(g.placements) == tuple(p.placements):
                continue
            dims = [i for i, pl in enumerate(g.placements) if pl.is_partial()]
            if (len(dims) == 1 and g.placements[dims[0]].reduce_op == "sum"
                    and all(a == b for i, (a, b) in enumerate(zip(g.placements, p.placements))
                            if i != dims[0]) and p.placements[dims[0]].is_replicate()):
                todo.setdefault(dims[0], []).append(p)
            else:
                p.grad = g.redistribute(g.device_mesh, p.placements)
        for dim, ps in todo.items():
            mesh = ps[0].grad.device_mesh
            grads = [p.grad.to_local() for p in ps]
            all_reduce_in_buckets(grads, mesh.get_group(dim))
            for p, g in zip(ps, grads):
                p.grad = DTensor.from_local(g, p.device_mesh, p.placements, run_check=False,
                                            shape=p.shape, stride=p.stride())


@torch.no_grad()
def _slice_replicated_grad(p):
    g = p.grad
    if (isinstance(g, DTensor) and tuple(g.placements) != tuple(p.placements)
            and all(a == b or a.is_replicate() and b.is_shard()
                    for a, b in zip(g.placements, p.placements))):
        p.grad = g.redistribute(g.device_mesh, p.placements)


class TpReplicatedGradSync:
    """Sum over the tp group the gradients of parameters every tp rank holds whole but uses
    only part of (replicated key/value projections)."""

    def __init__(self, params: list, tp_group):
        self.params, self.group = params, tp_group

    @torch.no_grad()
    def __call__(self):
        all_reduce_in_buckets([local(p.grad) for p in self.params if p.grad is not None],
                              self.group)
