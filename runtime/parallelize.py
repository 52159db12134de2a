"""Parallelism applied from outside the model: device mesh, TP/SP, activation checkpointing,
ZeRO (DDP-style all-reduce, sharded optimizer state, FSDP2) and deterministic initialisation.

Order per pipeline part (torchtitan's): tensor parallel -> activation checkpointing -> FSDP ->
materialise (`to_empty`) -> initialise every full tensor from (seed, name) and keep this rank's
shard of it.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import _StridedShard

from runtime.model import canonical_name, init_full_tensor


class LayoutError(ValueError):
    """The plan asks for something this runtime cannot lay out (refused before training)."""


def check_layout(plan) -> None:
    """Refuse a plan this runtime cannot lay out: the rules of planner.validity, which the
    search and Plan.validate share (so a plan the search emits is never refused here)."""
    from planner.validity import plan_problems
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


# ---- tensor / sequence parallel -------------------------------------------------------------

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
                    lambda mod, args, group=group: (_SumGradOverGroup.apply(args[0], group),))
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


class _SumGradOverGroup(torch.autograd.Function):
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
            for run in _buckets(grads):
                flat = torch._utils._flatten_dense_tensors(run)
                dist.all_reduce(flat, group=mesh.get_group(dim))
                for g, f in zip(run, torch._utils._unflatten_dense_tensors(flat, run)):
                    g.copy_(f)
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
        grads = [_local(p.grad) for p in self.params if p.grad is not None]
        for run in _buckets(grads):
            flat = torch._utils._flatten_dense_tensors(run)
            dist.all_reduce(flat, group=self.group)
            for g, f in zip(run, torch._utils._unflatten_dense_tensors(flat, run)):
                g.copy_(f)


# ---- activation checkpointing ---------------------------------------------------------------

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


# ---- FSDP2 (ZeRO 2/3) -----------------------------------------------------------------------

def apply_fsdp(part: nn.Module, dp_mesh, zero_stage: int, on_gpu: bool,
               edp_mesh=None) -> None:
    """`edp_mesh`: with expert parallelism, the routed experts (split over ep) are sharded and
    their gradients reduce-scattered over the expert-data-parallel ranks only (FSDP divides
    them by edp; `runtime.expert.ExpertGradScale` makes that dp)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    reshard = zero_stage == 3
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if on_gpu else MixedPrecisionPolicy())
    if edp_mesh is not None:
        from runtime.expert import moe_modules
        for moe in moe_modules(part):
            fully_shard(moe.experts, mesh=edp_mesh, reshard_after_forward=reshard, mp_policy=mp)
    for name, layer in part.layers.items():
        fully_shard(layer, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp)
    # the root group holds embeddings, final norm and output (together, so tying keeps working)
    fully_shard(part, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp)


# ---- initialisation -------------------------------------------------------------------------

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


# ---- global gradient norm -------------------------------------------------------------------

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


# ---- data parallel without FSDP (ZeRO 0 and 1) ----------------------------------------------

def _local(t):
    return t.to_local() if isinstance(t, DTensor) else t


BUCKET_BYTES = 64 * 2**20


def _buckets(tensors: list, cap: int = BUCKET_BYTES):
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


FIRST_BUCKET_BYTES = 1 * 2**20     # DDP's first bucket (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES)
IN_FLIGHT = 2                      # buckets being all-reduced at once


class GradAllReduce:
    """ZeRO 0/1 gradient averaging over the dp group: bucketed all-reduces of the local grads.

    `chunks` (lists of parameters, one per pipeline chunk of this rank, or the whole model):
    their reduction overlaps the backward, as DDP's: `arm(i)` before chunk i's last
    micro-batch backward; parameters are bucketed in reverse order (the order backward
    produces them; the first bucket small, DDP's 1 MiB, so communication starts early), and
    each bucket's all-reduce is launched (async) as soon as its gradients are accumulated and
    every earlier bucket of the chunk is launched, so all ranks issue them in the same order.
    `__call__` launches what is left (a parameter that got no gradient), waits, and writes the
    averages back. Each bucket is all-reduced as one flat copy, at most IN_FLIGHT at once. Without `chunks` everything is reduced in `__call__`, after backward."""

    def __init__(self, params: list, dp_group, dp: int, chunks: list | None = None,
                 bucket_bytes: int = BUCKET_BYTES, first_bucket_bytes: int = FIRST_BUCKET_BYTES):
        self.params, self.group, self.dp = params, dp_group, dp
        self.chunks = []               # per chunk: list of buckets (lists of parameters)
        self.armed = set()
        self.pending = []              # (async work, flat buffer, bucket)
        self._ready, self._launched = {}, {}
        if dp == 1 or not chunks:
            return
        wanted = {id(q) for q in params}
        for ci, chunk in enumerate(chunks):
            ps = [q for q in reversed(list(chunk)) if id(q) in wanted]
            buckets, run, size = [], [], 0
            for q in ps:
                nbytes = q.numel() * q.element_size()
                cap = first_bucket_bytes if not buckets else bucket_bytes
                if run and (size + nbytes > cap or q.dtype != run[0].dtype):
                    buckets.append(run)
                    run, size = [], 0
                run.append(q)
                size += nbytes
            if run:
                buckets.append(run)
            self.chunks.append(buckets)
            for bi, bucket in enumerate(buckets):
                for q in bucket:
                    q.register_post_accumulate_grad_hook(
                        lambda q, ci=ci, bi=bi: self._grad_ready(ci, bi, q))

    def arm(self, chunk: int) -> None:
        """The next backward of `chunk` is its last of the step: reduce while it runs."""
        if self.chunks:
            self.armed.add(chunk)
            self._ready[chunk] = [set() for _ in self.chunks[chunk]]
            self._launched[chunk] = 0

    def _grad_ready(self, ci, bi, q):
        if ci not in self.armed:
            return
        self._ready[ci][bi].add(id(q))
        buckets = self.chunks[ci]
        while (self._launched[ci] < len(buckets)
               and len(self._ready[ci][self._launched[ci]]) == len(buckets[self._launched[ci]])):
            self._launch(buckets[self._launched[ci]])
            self._launched[ci] += 1

    def flush(self, chunk: int) -> None:
        """Finish `chunk`'s reduction now (its last backward is over): the pipeline schedule
        scales the gradients in place right after (`PipelineStage.scale_grads`), which must
        see the averages."""
        if not self.chunks:
            return
        self._launched.setdefault(chunk, 0)
        for b in self.chunks[chunk][self._launched[chunk]:]:
            self._launch(b)
        self._launched[chunk] = len(self.chunks[chunk])
        while self.pending:
            self._finish(self.pending.pop(0))

    @torch.no_grad()
    def _launch(self, bucket):
        for q in bucket:
            if q.grad is None:
                q.grad = torch.zeros_like(q)
        self._launch_tensors([_local(q.grad) for q in bucket])

    def _launch_tensors(self, run):
        # at most IN_FLIGHT flat buffers exist (2 x 64 MiB, within the plan's DP_BUCKET_BYTES
        # of 160 MB under `other`): the oldest is finished before another is made
        while len(self.pending) >= IN_FLIGHT:
            self._finish(self.pending.pop(0))
        flat = torch._utils._flatten_dense_tensors(run)
        work = dist.all_reduce(flat, group=self.group, async_op=True)
        self.pending.append((work, flat, run))

    def _finish(self, item):
        work, flat, run = item
        work.wait()
        flat.div_(self.dp)
        for g, f in zip(run, torch._utils._unflatten_dense_tensors(flat, run)):
            g.copy_(f)

    @torch.no_grad()
    def __call__(self):
        if self.dp == 1:
            return
        if self.chunks:
            for ci, buckets in enumerate(self.chunks):     # what no hook launched, in order
                for b in buckets[self._launched.get(ci, 0):]:
                    self._launch(b)
        else:
            grads = []
            for p in self.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                grads.append(_local(p.grad))
            for run in _buckets(grads):
                self._launch_tensors(run)
        while self.pending:
            self._finish(self.pending.pop(0))
        self.armed.clear()
        self._ready.clear()
        self._launched.clear()


def zero1_owners(params: list, dp: int) -> list:
    """Owner dp rank of each parameter: greedy by size, largest first (deterministic)."""
    load = [0] * dp
    owner = [0] * len(params)
    for i in sorted(range(len(params)), key=lambda i: (-params[i].numel(), i)):
        r = min(range(dp), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += params[i].numel()
    return owner


class Zero1ParamSync:
    """ZeRO 1: each dp rank steps AdamW on the parameters it owns (so only it holds their
    optimizer state); then every owner broadcasts its updated parameters to the dp group."""

    def __init__(self, params: list, owners: list, dp_group, dp: int):
        self.group, self.dp = dp_group, dp
        self.by_owner = [[p for p, o in zip(params, owners) if o == r] for r in range(dp)]
        self.src = [dist.get_global_rank(dp_group, r) for r in range(dp)]

    @torch.no_grad()
    def __call__(self):
        for r in range(self.dp):
            for run in _buckets([_local(p) for p in self.by_owner[r]]):
                flat = torch._utils._flatten_dense_tensors(run)
                dist.broadcast(flat, src=self.src[r], group=self.group)
                for t, f in zip(run, torch._utils._unflatten_dense_tensors(flat, run)):
                    t.copy_(f)
