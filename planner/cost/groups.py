"""A pipeline over GPU groups of different kinds (planner.specs.MixedCluster, issue 24).

Every pipeline rank sits in one group (a stage never spans two), so each rank is priced by
planner.cost.stage.stage_coefficients on its own group's Cluster: that GPU's speed and memory,
its NVLink for tensor parallelism, its hosts and NICs for the data-parallel gradient
reduction (a stage's data-parallel replicas are its group's: with pp outermost in the rank
order, pipeline rank s holds ranks [s*tp*cp*dp, (s+1)*tp*cp*dp), all in the group the
pipeline puts it in) and for the point-to-point to a neighbour in the same group. What crosses
groups is the pipeline's point-to-point at a group boundary: priced over the inter-group link
(MixedCluster.inter_gbps, the slower side's NIC unless the file says otherwise). The step is
then planner.cost.stage.evaluate's (the slowest stage sets the pipeline's pace, the longest
tail ends it), memory per rank against its own GPU (planner.cost.stage.rank_budgets).
"""
from __future__ import annotations

import dataclasses

from planner.cost import comm
from planner.cost.facts import facts_for
from planner.cost.stage import Candidate, stage_coefficients
from planner.engines import get_engine
from planner.specs import MixedCluster


def inter_group_link(mixed: MixedCluster) -> comm.Link:
    """The network between groups, per GPU: one NIC's bandwidth each way (rail-optimised: each
    of a stage's tp ranks sends its 1/tp share over its own NIC), its latency per hop."""
    bw = mixed.inter_gbps
    return comm.Link(bw, bw, mixed.inter_latency_us * 1e-6, intra=False)


def boundary_ranks(pipeline: tuple) -> set:
    """Pipeline ranks with a neighbour in another group."""
    return {r for r in range(len(pipeline))
            for o in (r - 1, r + 1) if 0 <= o < len(pipeline) and pipeline[o] != pipeline[r]}


def mixed_coefficients(model, mixed: MixedCluster, c: Candidate, engine=None) -> list:
    """StageCoeffs of every pipeline rank of `c` on `mixed.pipeline`'s groups (see the module
    docstring). A rank at a group boundary sends its activations forward and their gradients
    back (2 x vpp point-to-points per micro-batch, as stage_coefficients prices pp_fixed) over
    the inter-group link, the slower one."""
    engine = get_engine(engine)
    pipeline = mixed.pipeline
    if len(pipeline) != c.pp:
        raise ValueError(f"pipeline of {len(pipeline)} ranks for pp {c.pp}")
    out = [None] * c.pp
    for g in sorted(set(pipeline)):
        ranks = [r for r in range(c.pp) if pipeline[r] == g]
        for k in stage_coefficients(model, mixed.groups[g], c, engine, ranks=ranks):
            out[k.rank] = k
    edge = boundary_ranks(pipeline)
    if edge:
        link = inter_group_link(mixed)
        for r in edge:
            gpu = mixed.groups[pipeline[r]].gpu
            act = (facts_for(engine, gpu).comm_elem_bytes * c.mbs * (c.seq_len // c.cp)
                   * model.hidden)
            out[r] = dataclasses.replace(out[r], pp_fixed=2 * c.vpp * comm.p2p(act / c.tp, link))
    return out
