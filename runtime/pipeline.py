"""Pipeline stages from the plan's layer ranges, run with `torch.distributed.pipelining`.

Virtual stage `i` of `plan.stages` runs on pipeline rank `i % pp` (chunk `i // pp`), or under the
V-shaped zbv / dualpipev on rank `i` for i < pp and `2 pp - 1 - i` after (the plan's pp_rank,
torch's "v" stage-to-rank mapping). Each stage's
module is a copy of the whole (meta) model with the other layers deleted, so parameter names
stay the fully-qualified names of the whole model (checkpoints reshard across plans).

Tied embeddings with pp > 1: the last stage keeps its own `output.weight`, initialised like
`tok_embeddings.weight`; `TiedGradSync` sums the two gradients over the (first, last) pipeline
ranks so both copies take the same optimizer steps (Megatron's scheme); under a V schedule both
copies are on pipeline rank 0 and are summed there. Checkpoints store the tied weight once,
under `tok_embeddings.weight`.

Schedules (planner.vocab): gpipe, 1f1b, interleaved, and the zero-bubble ones as torch's
classes: interleaved-zb = ScheduleInterleavedZeroBubble, zbv = ScheduleZBVZeroBubble,
dualpipev = ScheduleDualPipeV (torch/distributed/pipelining/schedules.py), which split each
backward into its input-gradient and weight-gradient parts (stage_backward_input /
stage_backward_weight).
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor


def split_model(whole: nn.Module, plan, pp_rank: int) -> list:
    """The (stage, module) pairs this pipeline rank runs, in chunk order."""
    last = len(plan.stages) - 1
    out = []
    for st in plan.stages_of_rank(pp_rank):
        if len(plan.stages) == 1:
            out.append((st, whole))
            continue
        part = copy.deepcopy(whole)
        keep = {str(i) for i in range(*st.layers)}
        for k in list(part.layers.keys()):
            if k not in keep:
                del part.layers[k]
        if st.index != 0:
            part.tok_embeddings = None
            part.pos_embeddings = None
            part.emb_dropout = None
        if st.index != last:
            part.norm = None
            part.output = None
        out.append((st, part))
    return out


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Mean cross entropy of logits split over the vocabulary (Megatron's
    vocab_parallel_cross_entropy): max, sum of exponentials and the target's logit are
    all-reduced over the tensor-parallel group; the full logits never exist on one rank."""

    @staticmethod
    def forward(ctx, logits, targets, group, vocab_start):
        # logits [N, V/tp] fp32 (this rank's vocabulary slice), targets [N] global ids
        n, v_local = logits.shape
        m = logits.max(dim=-1).values
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        shifted = logits - m.unsqueeze(1)
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        local = targets - vocab_start
        mine = (local >= 0) & (local < v_local)
        idx = local.clamp(0, v_local - 1)
        target_logit = shifted.gather(1, idx.unsqueeze(1)).squeeze(1) * mine
        both = torch.stack([sum_exp, target_logit])
        dist.all_reduce(both, group=group)
        sum_exp, target_logit = both[0], both[1]
        exp.div_(sum_exp.unsqueeze(1))                 # softmax slice, kept for backward
        ctx.save_for_backward(exp, idx, mine)
        return (sum_exp.log() - target_logit).mean()

    @staticmethod
    def backward(ctx, grad):
        softmax, idx, mine = ctx.saved_tensors
        g = softmax.clone()
        rows = torch.arange(g.shape[0], device=g.device)
        g[rows, idx] -= mine.to(g.dtype)
        g.mul_(grad / g.shape[0])
        return g, None, None, None


def loss_fn(logits, targets):
    """Mean token loss of one micro-batch (the schedule divides gradients by their number).

    `logits` is a plain tensor, or under tensor parallelism a DTensor split over the
    vocabulary (Shard(-1) on the tp mesh): then the loss is computed vocabulary-parallel and
    every tp rank gets the same value."""
    if isinstance(logits, DTensor):
        pl = logits.placements
        if len(pl) == 1 and pl[0].is_shard() and pl[0].dim in (-1, logits.ndim - 1):
            local = logits.to_local().float()
            mesh = logits.device_mesh
            v = logits.shape[-1]
            tp = mesh.size()
            if v % tp == 0 and local.shape[-1] == v // tp:
                start = mesh.get_local_rank() * (v // tp)
                return _VocabParallelCrossEntropy.apply(
                    local.flatten(0, 1), targets.flatten(0, 1), mesh.get_group(), start)
        logits = logits.full_tensor()
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(0, 1))


def _sharded_grad_stage():
    """A `PipelineStage` whose FSDP2 module reduce-scatters every micro-batch's gradients.

    torch's stage turns gradient sync and resharding off for all but the last micro-batch, so
    a ZeRO 2/3 rank would accumulate unsharded gradients (dp times the sharded ones the plan
    counts) and keep unsharded parameters through the step. Here each backward reduce-scatters
    into the sharded gradient (FSDP accumulates it there); parameters are resharded after each
    backward under ZeRO 3 and after the last under ZeRO 2 (whose plan counts them whole). The
    schedule's own final reduce (`perform_reduce_grad`) then finds nothing left to reduce."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining._backward import stage_backward

    class ShardedGradStage(PipelineStage):
        def __init__(self, *a, zero_stage: int, **kw):
            super().__init__(*a, **kw)
            self.zero_stage = zero_stage

        after_backward = None        # called after every micro-batch's backward (memory)
        before_last_backward = None  # called before the step's last one (ZeRO 0/1 overlap)
        before_scale_grads = None    # called before the schedule scales the gradients

        def scale_grads(self, grad_scale_factor):
            if self.before_scale_grads is not None:
                self.before_scale_grads()
            super().scale_grads(grad_scale_factor)

        def backward_maybe_with_nosync(self, backward_type, bwd_kwargs, last_backward=False):
            if last_backward and self.before_last_backward is not None:
                self.before_last_backward()
            if backward_type != "full" or not isinstance(self.submod, FSDPModule):
                out = super().backward_maybe_with_nosync(backward_type, bwd_kwargs,
                                                         last_backward)
            else:
                m = self.submod
                m.set_is_last_backward(True)
                m.set_requires_gradient_sync(True)
                m.set_reshard_after_backward(self.zero_stage >= 3 or last_backward)
                out = stage_backward(bwd_kwargs["stage_output"], bwd_kwargs["output_grads"],
                                     bwd_kwargs["input_values"]), None
            if self.after_backward is not None:
                self.after_backward()
            return out

    return ShardedGradStage


# the zero-bubble schedules as torch's classes (torch.distributed.pipelining.schedules)
ZERO_BUBBLE_CLASSES = {"interleaved-zb": "ScheduleInterleavedZeroBubble",
                       "zbv": "ScheduleZBVZeroBubble", "dualpipev": "ScheduleDualPipeV"}


def build_schedule(plan, stage_parts: list, pp_group, device):
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
    from torch.distributed.pipelining import schedules as torch_schedules
    n = len(plan.stages)
    Stage = _sharded_grad_stage()
    zero = plan.parallelism.zero_stage
    stages = [Stage(part, st.index, n, device, group=pp_group, zero_stage=zero)
              for st, part in stage_parts]
    nmb = plan.batch.num_microbatches
    kind = plan.parallelism.schedule
    if kind in ZERO_BUBBLE_CLASSES:
        cls = getattr(torch_schedules, ZERO_BUBBLE_CLASSES[kind])
        return cls(stages, nmb, loss_fn=loss_fn, scale_grads=True), stages
    if kind == "interleaved" or len(stages) > 1:
        return ScheduleInterleaved1F1B(stages, nmb, loss_fn=loss_fn, scale_grads=True), stages
    # with fewer micro-batches than stages 1F1B has no steady state and is GPipe (torch's
    # Schedule1F1B refuses that case): same order of work, same bubble
    cls = ScheduleGPipe if kind == "gpipe" or nmb < n else Schedule1F1B
    return cls(stages[0], nmb, loss_fn=loss_fn, scale_grads=True), stages


def _ranks_by_pp(mesh) -> torch.Tensor:
    """Global ranks as [pp, rest] (pp coordinate first)."""
    names = list(mesh.mesh_dim_names)
    t = mesh.mesh.permute([names.index("pp")] + [i for i, d in enumerate(names) if d != "pp"])
    return t.reshape(t.shape[0], -1)


class TiedGradSync:
    """Sum the gradients of the embedding (first stage) and its output copy (last stage)."""

    def __init__(self, mesh, params: list):
        self.params = params   # this rank's tied parameters (0, 1 or 2 of them)
        self.group = None
        grid = _ranks_by_pp(mesh)
        me = dist.get_rank()
        for j in range(grid.shape[1]):       # every rank creates every group, in the same order
            ranks = [int(grid[0, j]), int(grid[-1, j])]
            g = dist.new_group(ranks=ranks)
            if me in ranks:
                self.group = g

    @torch.no_grad()
    def __call__(self):
        if len(self.params) == 2:
            # a V schedule: the first and the last stage on this rank, both copies here
            a, b = (p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                    for p in self.params)
            a.add_(b)
            b.copy_(a)
            return
        if self.group is None or not self.params:
            return
        for p in self.params:
            g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            dist.all_reduce(g, group=self.group)
