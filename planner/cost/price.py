"""One price per plan: the estimate, time breakdown, memory per stage and per-rank timing of a
candidate placed on the pipeline ranks, or of a saved plan.

`price` is the one entry point: the search's "ideal" of a rejected layout, explain, the plot,
`plan show` and the benchmarks all call it (the search's own placements go through
planner.cost.stage.evaluate, which it wraps). It prices, never searches: a plan is priced as
it is laid out, from the stage coefficients of planner.cost.stage.
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.cost.moe import moe_counts, plan_dispatcher
from planner.cost.groups import mixed_coefficients
from planner.cost.stage import Candidate, Estimate, evaluate, stage_coefficients
from planner.engines import plan_engine
from planner.specs import MixedCluster


@dataclass
class RankTime:
    """One pipeline rank, one micro-batch through all its chunks: forward, backward (with
    recompute) and total seconds, and the once-per-step tail (exposed gradient reduction,
    parameter gather, optimizer)."""
    rank: int
    layers: int
    recompute: int
    fwd: float
    bwd: float
    total: float
    tail: float


@dataclass
class Price:
    """What a placement costs: `estimate` (step, breakdown, memory per stage, planner.cost.stage
    Estimate) and the stage coefficients it was priced with."""
    model: object         # planner.specs.Model
    candidate: Candidate
    layers: list          # decoder layers per pipeline rank
    recompute: list       # recomputed layers per pipeline rank
    coeffs: list          # planner.cost.stage.StageCoeffs, one per pipeline rank
    estimate: Estimate

    def rank_times(self) -> list:
        """[RankTime] per pipeline rank. Forward: the non-backward part of the compute and TP
        comm, half the p2p, the first ZeRO exposure; backward: the rest (its compute, TP comm
        and all recompute). A model with dense and MoE layers adds each MoE layer's share, as
        planner.cost.stage.evaluate prices it."""
        out, c = [], self.candidate
        pp = len(self.layers)
        if self.coeffs[0].moe is not None:
            qs, rqs = moe_counts(self.model, pp, c.vpp, self.layers, self.recompute)
        else:
            qs, rqs = [0] * pp, [0] * pp
        for k, n, r, q, rq in zip(self.coeffs, self.layers, self.recompute, qs, rqs):
            total = k.time(n, r, q, rq)
            fwd_zero = k.exposures()[0]
            dc, dh = k._moe_deltas("zero")[0]
            fwd = ((k.compute_fixed - k.bwd_fixed) + k.pp_fixed / 2
                   + n * (k.t_layer - k.bwd_layer) + k.exposed_comm(*fwd_zero, n, q, dc, dh))
            if k.moe is not None:
                fwd += q * (k.moe.t_layer - k.moe.bwd_layer)
            fwd = min(max(fwd, 0.0), total)
            out.append(RankTime(rank=k.rank, layers=n, recompute=r, fwd=fwd, bwd=total - fwd,
                                total=total, tail=k.tail(n, q)))
        return out


def coefficients_of(model, cluster, c: Candidate, engine=None) -> list:
    """Stage coefficients of every pipeline rank: on a mixed cluster each rank on its group's
    GPU (planner.cost.groups), else planner.cost.stage.stage_coefficients."""
    if isinstance(cluster, MixedCluster):
        return mixed_coefficients(model, cluster, c, engine)
    return stage_coefficients(model, cluster, c, engine)


def price(model, cluster, c: Candidate, layers: list, recompute: list, engine=None,
          margin_gib: float | None = None, coeffs: list | None = None) -> Price:
    """The price of candidate `c` with `layers` and `recompute` layers per pipeline rank
    (coefficients built unless given)."""
    coeffs = coeffs or coefficients_of(model, cluster, c, engine)
    est = evaluate(model, cluster, c, list(layers), list(recompute), coeffs, engine, margin_gib)
    return Price(model=model, candidate=c, layers=list(layers), recompute=list(recompute),
                 coeffs=coeffs,
                 estimate=est)


def candidate_of(plan) -> Candidate:
    """The search candidate a saved plan (planner.plan.Plan) is priced as."""
    p, b = plan.parallelism, plan.batch
    return Candidate(tp=p.tp, pp=p.pp, dp=p.dp, zero=p.zero_stage, sp=p.sequence_parallel,
                     mbs=b.micro_batch_size, seq_len=b.seq_len, global_batch=b.global_batch_size,
                     schedule=p.schedule, vpp=p.vpp, recompute=p.recompute,
                     recompute_modules=p.recompute_modules,
                     flash=plan.attention == "flash", precision=plan.precision,
                     recipe=plan.recipe, ep=p.ep, etp=p.etp, cp=p.cp, cp_comm=p.cp_comm_type,
                     tp_comm_overlap=p.tp_comm_overlap, moe_dispatcher=plan_dispatcher(plan),
                     ep_comm_overlap=p.ep_comm_overlap,
                     moe_capacity_factor=p.moe_capacity_factor,
                     moe_imbalance=p.moe_imbalance, offload_optimizer=p.offload_optimizer,
                     offload_params=p.offload_params, dp_shard=p.dp_shard, zeropp=p.zeropp)


def price_plan(plan, margin_gib: float | None = None) -> Price:
    """The price of a saved plan as laid out (its layers and recompute per pipeline rank), for
    its engine; `margin_gib` defaults to the one its estimate records."""
    c = candidate_of(plan)
    rec = [sum(s.recompute_layers for s in plan.stages_of_rank(r)) for r in range(c.pp)]
    if margin_gib is None:   # a mixed plan's ranks each with their own GPU's margin
        margin_gib = (plan.estimate.get("stage_margin_gib")
                      or plan.estimate.get("memory_margin_gib"))
    return price(plan.model, plan.cluster, c, plan.layer_counts(), rec,
                 engine=plan_engine(plan), margin_gib=margin_gib)
