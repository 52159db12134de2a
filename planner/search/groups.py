"""The search over a mixed cluster (planner.specs.MixedCluster, issue 24).

A plan over GPU groups is one pipeline whose stages sit on groups, a stage never spanning two;
data parallelism replicates the whole pipeline (each replica spans the groups, a stage's
replicas in its group) and tensor parallelism is the same in every group, so each group g
holds pp_g = N_g / (tp x cp x dp) pipeline ranks and the groups' order along the pipeline is
searched (every permutation: 2 for 2 groups). The outer choices are the homogeneous search's
(planner.search.enumeration over the cluster's GPU count, its hosts the smallest group's),
less what a pipeline over groups does not run yet: virtual stages (interleaved and V
schedules place a rank's chunks around the whole pipeline) and expert parallelism. Layers per
rank are placed by the same CP-SAT model over counts (planner.search.placement.solve_cpsat),
each rank with its own GPU's coefficients (planner.cost.groups) and memory capacity; the
first placement tried gives each rank layers in proportion to its speed.

Beside the mixed plans the search prices the best plan on each group alone and "all as the
slowest" (the cluster's GPU count of the slowest group's GPU, hosts alike): a mixed plan is
chosen only when it beats every single group, and the report says what it bought.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import time
from dataclasses import dataclass, field

from planner.cost.groups import mixed_coefficients
from planner.cost.stage import Candidate, capacity_bytes, rank_budgets, stage_coefficients
from planner.engines import ENGINES, engine_for
from planner import rules as V
from planner.errors import BadInput
from planner.power import limit_suffix, limited_name
from planner.rules_fixed import check_fixed
from planner.search import default_global_batch, default_seq_len, fastest_per_key, search
from planner.search.bounds import (SharedCoefficients, lower_bound, max_layers, rules_for,
                                    without_buffers_bound)
from planner.search.enumeration import Fixed, enumerate_candidates, without_tp_overlap
from planner.search.placement import Result, heuristic, solve_cpsat
from planner.specs import Cluster, MixedCluster, Model

# the knobs a user may fix that shape the layout (named in the line when none is a pipeline)
_SHAPE_KNOBS = {"tp": "--tp", "pp": "--pp", "dp": "--dp", "cp": "--cp", "zero": "--zero",
                "mbs": "--micro-batch"}

# schedules a pipeline over groups runs (one chunk per rank: see the module docstring)
MIXED_SCHEDULES = ("1f1b", "gpipe")


@dataclass
class MixedResult(Result):
    """A placed candidate on a mixed cluster: `cluster` carries the pipeline's groups."""
    cluster: MixedCluster | None = None


@dataclass
class Alone:
    """The best plan on one group alone, or on the cluster's GPU count of its slowest GPU
    (`name` "all as <gpu>"): its cluster and step (None: nothing fits there)."""
    name: str
    cluster: Cluster
    step_time_s: float | None
    result: object = None       # planner.search.placement.Result
    report: object = None       # its planner.search.SearchReport


@dataclass
class MixedReport:
    best: Result | None          # MixedResult, or a single group's Result when mixing loses
    ranked: list
    candidates: int
    pruned_memory: int
    pruned_bound: int
    solved: int
    seconds: float
    seq_len: int
    global_batch: int
    engine: object
    margin_gib: float | None
    mixed_best: MixedResult | None = None    # the best mixed plan (whether chosen or not)
    alone: list = field(default_factory=list)   # [Alone] per group
    slowest: Alone | None = None
    chosen: str = "mixed"        # "mixed" or the group name whose plan is chosen
    closest: Result | None = None
    gap: float = 0.0
    solver_limit_hit: int = 0

    def mixing_record(self) -> dict:
        """What the plan's `search.mixing` records (planner.explain renders it)."""
        return {"chosen": self.chosen,
                "mixed_step_time_s": (self.mixed_best.estimate.step_time_s
                                      if self.mixed_best else None),
                "mixed_candidates": self.candidates,   # 0: no layout is a pipeline over them
                "single_group": {a.name: a.step_time_s for a in self.alone},
                "all_as_slowest": {"cluster": self.slowest.cluster.name,
                                   "step_time_s": self.slowest.step_time_s}
                if self.slowest else None}


def slowest_cluster(mixed: MixedCluster) -> Cluster:
    """Every GPU as the slowest group's: the cluster's GPU count on that GPU, hosts of the
    smallest group's size."""
    gpn = mixed.gpus_per_node
    n = mixed.num_gpus
    gpu = mixed.gpu
    return Cluster(name=f"{gpu.name}x{n}{limit_suffix(gpu.name, gpu.power_limit_w)}", gpu=gpu,
                   num_gpus=n, gpus_per_node=gpn)


def _unsupported(model: Model, mixed: MixedCluster, f: Fixed, engine) -> str | None:
    why = V.mixed_platform_problem(mixed)
    if why:
        return why
    if not engine.pipelines:
        return (f"{engine.name} has no pipeline parallelism, and a mixed cluster is planned as "
                f"one pipeline over its groups (data parallelism across groups, every GPU at "
                f"the slowest's pace, is not planned yet); plan it with an engine that "
                f"pipelines ({', '.join(n for n, e in ENGINES.items() if e.pipelines)}) or on "
                f"one group")
    if model.is_moe:
        return ("a mixed cluster plans dense models only so far (expert parallelism over "
                "groups is not searched); plan an MoE model on one group")
    if f.stage_layers is not None:
        return "--stage-layers on a mixed cluster: the layers per group's ranks are searched"
    if f.vpp not in (None, 1) or (f.schedule is not None and f.schedule not in MIXED_SCHEDULES):
        return (f"a pipeline over GPU groups runs one chunk per rank "
                f"({' or '.join(MIXED_SCHEDULES)}); --vpp and --schedule "
                f"{f.schedule or 'interleaved'} are not searched on a mixed cluster")
    return None


def _pipelines(mixed: MixedCluster, c: Candidate) -> list:
    """Every order of the groups along the pipeline, each group holding N_g / (tp cp dp) ranks;
    [] when a group's GPUs are not whole pipeline ranks of c."""
    per_rank = c.tp * c.cp * c.dp
    counts = []
    for g in mixed.groups:
        if g.num_gpus % per_rank:
            return []
        counts.append(g.num_gpus // per_rank)
    return [tuple(g for g in order for _ in range(counts[g]))
            for order in itertools.permutations(range(len(mixed.groups)))]


class ShapeBound:
    """A step no placement of a candidate beats, before its coefficients exist: its layers and
    its embedding and head (their compute_fixed at pp 1, what the ranks hold between them)
    each at the least of the groups' times (planner.cost.stage.stage_coefficients on each
    group's cluster, once per layer shape), spread evenly over the pp ranks, the sends (>= 0)
    left out; as the pipeline's step is (m - 1) x its slowest rank + the sum of its ranks
    (planner.cost.schedule.pipeline_time), at least m x the mean + (p - 1) x the mean."""

    def __init__(self, model, mixed: MixedCluster, engine):
        self.model, self.mixed, self.engine = model, mixed, engine
        self._shape = {}

    def __call__(self, c: Candidate) -> float:
        key = (c.mbs, c.tp, c.sp, c.cp, c.cp_comm, c.tp_comm_overlap, c.seq_len, c.flash,
               c.precision, c.recipe)
        got = self._shape.get(key)
        if got is None:
            one = dataclasses.replace(c, pp=1, vpp=1, schedule="1f1b", zero=0,
                                      recompute="none", dp=1)
            ks = [stage_coefficients(self.model, g, one, self.engine)[0]
                  for g in self.mixed.groups]
            if any(k.tp_overlap_slower for k in ks):
                # and without the overlap, which search_mixed then tries too
                # (enumeration without_tp_overlap): the bound holds for both
                plain = without_tp_overlap(self.engine, one, for_memory=False)
                ks += [stage_coefficients(self.model, g, plain, self.engine)[0]
                       for g in self.mixed.groups]
            got = self._shape[key] = (min(k.compute_fixed for k in ks),
                                      min(k.t_layer for k in ks))
        fixed, layer = got
        mean = (fixed + self.model.num_layers * layer) / c.pp
        return c.m * mean + (c.pp - 1) * mean


def _speed_split(coeffs, L: int, caps: list) -> list | None:
    """Layers per rank in proportion to its speed (1 / per-layer time), at least one each, at
    most what its memory holds; None when the caps do not hold L."""
    p = len(coeffs)
    caps = [min(x, L) for x in caps]
    if sum(caps) < L or min(caps) < 1:
        return None
    w = [1.0 / k.t_layer for k in coeffs]
    share = [max(1.0, L * x / sum(w)) for x in w]
    n = [min(caps[i], max(1, int(share[i]))) for i in range(p)]
    while sum(n) < L:   # to the rank that finishes its next layer soonest
        i = min((i for i in range(p) if n[i] < caps[i]),
                key=lambda i: coeffs[i].t_fixed + (n[i] + 1) * coeffs[i].t_layer)
        n[i] += 1
    while sum(n) > L:
        i = max((i for i in range(p) if n[i] > 1),
                key=lambda i: coeffs[i].t_fixed + n[i] * coeffs[i].t_layer)
        n[i] -= 1
    return n


def _alone(model, cluster: Cluster, name: str, f: Fixed, seq_len, gbs, engine,
           margin_gib) -> Alone:
    try:
        rep = search(model, cluster, f, seq_len, gbs, top=1, engine=engine,
                     margin_gib=margin_gib, rejected=False)
    except BadInput:
        return Alone(name, cluster, None)
    return Alone(name, cluster, rep.best.estimate.step_time_s if rep.best else None,
                 rep.best, rep)


def search_mixed(model: Model, mixed: MixedCluster, fixed: Fixed | None = None,
                 seq_len: int | None = None, global_batch: int | None = None, top: int = 5,
                 engine=None, margin_gib: float | None = None) -> MixedReport:
    """The best plans for `model` over the groups of `mixed` (see the module docstring)."""
    t0 = time.perf_counter()
    f = fixed or Fixed()
    engine = engine_for(engine, f.compile)
    why = _unsupported(model, mixed, f, engine)
    if why:
        raise BadInput(why)
    seq_len = seq_len or default_seq_len(model)
    gbs = global_batch or default_global_batch(seq_len, mixed.num_gpus)
    whole = slowest_cluster(mixed)   # the outer choices of the cluster's GPU count
    check_fixed(model, whole, f, seq_len, gbs, engine)
    cands = [c for c in enumerate_candidates(model, whole, f, seq_len, gbs, engine)
             if c.vpp == 1 and c.schedule in MIXED_SCHEDULES and c.ep == 1]
    L = model.num_layers
    # Candidates in the order of a bound computed from one pipeline-free build per layer shape
    # and group (ShapeBound), never from their own coefficients; a candidate whose model states
    # fit no placement even at the largest group's capacity (SharedCoefficients' screen, as
    # the homogeneous search screens) is never priced.
    bound = ShapeBound(model, mixed, engine)
    shared = [SharedCoefficients(model, g, engine) for g in mixed.groups]
    big_cap = max(capacity_bytes(g, engine, margin_gib) for g in mixed.groups)
    pending = sorted(((bound(c), i, c) for i, c in enumerate(cands)),
                     key=lambda x: (x[0], x[1]))
    plans, closest, scored = [], None, []
    twin_of = {}   # a queued twin without the TP overlap: its candidate
    pruned_mem = pruned_bound = solved = limit_hit = 0
    open_bound = math.inf   # least step a candidate not solved to optimality might reach
    best_heur = math.inf

    def consider(res):
        nonlocal closest, best_heur
        if res.estimate.fits:
            plans.append(res)
            best_heur = min(best_heur, res.estimate.step_time_s)
        elif closest is None or max(res.estimate.overflow_gib()) < max(
                closest.estimate.overflow_gib()):
            closest = res

    orders_of = {c: _pipelines(mixed, c) for c in cands}
    n_cands = sum(len(x) for x in orders_of.values())

    def visit(idx, c, orders):
        """Price c's heuristic plan on each pipeline order; c without the TP overlap where
        it is wanted (enumeration without_tp_overlap), else None: where the overlap makes a
        pass slower, or costs memory and on some order no plan fits, or one fits only
        recomputing or offloading layers, or its bound without the buffers (bounds
        without_buffers_bound) is below the plan it has (the buffers forced a slower split)
        or, where c's own lower bound, which holds the recompute and split its buffers
        need, is beyond the best plan, not (the twin's own bound decides there)."""
        nonlocal pruned_mem, pruned_bound
        rules = rules_for(engine, c, f)
        for_memory, slower = False, False
        for pipeline in orders:
            cl = mixed.with_pipeline(pipeline)
            coeffs = mixed_coefficients(model, cl, c, engine)
            slower = slower or any(k.tp_overlap_slower for k in coeffs)
            caps_bytes = [b.usable_bytes for b in rank_budgets(cl, engine, margin_gib,
                                                                     c.pp)]
            caps = max_layers(coeffs, caps_bytes, c.vpp, rules, c)
            # an engine that places no layers (rules.equal_split) gets its own split
            split = (V.default_split(engine, L, c.pp) if rules.equal_split
                     else _speed_split(coeffs, L, caps))
            if split is None or sum(min(x, L) for x in caps) < L:
                pruned_mem += 1
                for_memory = True
                continue
            lb = lower_bound(coeffs, c, L, caps_bytes, rules)
            if lb > best_heur * (1 + 1e-9):
                pruned_bound += 1
                # the twin's times are c's: only its memory can bring it under the best plan
                for_memory = for_memory or without_buffers_bound(
                    coeffs, c, L, caps_bytes, rules, lb) <= best_heur * (1 + 1e-9)
                continue
            h = heuristic(model, cl, c, coeffs, caps_bytes, rules, split=split, engine=engine,
                          margin_gib=margin_gib)
            res = MixedResult(c, h.layers, h.recompute, h.estimate, cluster=cl)
            consider(res)
            # the twin's times are c's or more: only its memory, freed of the buffers, can
            # bring it under this plan (fewer layers recomputed, or a faster split)
            for_memory = for_memory or not res.estimate.fits or any(h.recompute) or (
                without_buffers_bound(coeffs, c, L, caps_bytes, rules, lb)
                < res.estimate.step_time_s * (1 - 1e-9))
            scored.append((lb, idx, res, coeffs, caps_bytes, rules))
        if slower:
            return without_tp_overlap(engine, c, for_memory=False)
        return without_tp_overlap(engine, c) if for_memory else None

    for j, (tb, idx, c) in enumerate(pending):
        if tb > best_heur * (1 + 1e-9):
            pruned_bound += sum(len(orders_of[x]) for _, _, x in pending[j:])
            break
        orders = orders_of[c]
        if not orders:
            continue
        if not any(sh.states_alone_can_fit(c, big_cap) for sh in shared) or not any(
                sh.states_can_fit(c, big_cap) for sh in shared):
            pruned_mem += len(orders)
            continue
        t = visit(idx, c, orders)
        if t is not None:
            twin_of[t] = c
            n_cands += len(orders)
            visit(idx, t, orders)
    # exact placements, best bound first, while a bound can beat the best plan
    scored.sort(key=lambda x: (x[0], x[1]))
    for i, (lb, _, heur, coeffs, caps_bytes, rules) in enumerate(scored):
        best = min((r.estimate.step_time_s for r in plans), default=math.inf)
        if lb > best * (1 + 1e-9):
            pruned_bound += len(scored) - i
            break
        c, cl = heur.candidate, heur.cluster
        if rules.equal_split or c.pp == 1 or (
                heur.estimate.fits and heur.estimate.step_time_s <= lb * (1 + 1e-9)):
            heur.status = "OPTIMAL"
            continue
        exact, status, gap = solve_cpsat(
            model, cl, c, coeffs, caps_bytes, rules, hint=heur if heur.estimate.fits else None,
            step_guess=heur.estimate.step_time_s, engine=engine, margin_gib=margin_gib,
            cutoff_s=best)
        solved += 1
        if status in ("FEASIBLE", "UNKNOWN"):   # stopped at the solver's time limit
            limit_hit += 1
            open_bound = min(open_bound, max(lb, (exact.bound_s or 0.0) if exact else lb))
        # INFEASIBLE under the cutoff: no placement of c beats the best plan, which proves a
        # heuristic placement that is that plan optimal (to CP-SAT's rounding)
        proven = (status == "INFEASIBLE" and heur.estimate.fits
                  and heur.estimate.step_time_s <= best * (1 + 1e-9))
        heur.status = "OPTIMAL" if proven else status
        if exact is not None and exact.estimate.fits and (
                not heur.estimate.fits
                or exact.estimate.step_time_s < heur.estimate.step_time_s):
            consider(MixedResult(c, exact.layers, exact.recompute, exact.estimate,
                                 status=status, gap=gap, cluster=cl))
    # one place per candidate and pipeline order
    ranked = fastest_per_key((((twin_of.get(r.candidate, r.candidate), r.cluster.pipeline), r)
                              for r in plans), top)
    mixed_best = ranked[0] if ranked else None
    gap = 0.0   # the whole search's, as planner.search reports it
    if mixed_best is not None:
        best_s = mixed_best.estimate.step_time_s
        gap = max(0.0, (best_s - min(best_s, open_bound)) / best_s)
    # what mixing buys: each group alone, and every GPU as the slowest
    alone = [_alone(model, g, g.name, f, seq_len, gbs, engine, margin_gib)
             for g in mixed.groups]
    slow = _alone(model, whole, f"all as {limited_name(mixed.gpu)}", f, seq_len, gbs, engine,
                  margin_gib)
    best, chosen = mixed_best, "mixed"
    fastest_alone = min((a for a in alone if a.step_time_s is not None),
                        key=lambda a: a.step_time_s, default=None)
    if n_cands == 0 and fastest_alone is None:
        # not one candidate lays pipeline ranks on every group: what is not planned, not memory
        given = [f"{flag} {getattr(f, k)}" for k, flag in _SHAPE_KNOBS.items()
                 if getattr(f, k) is not None]
        raise BadInput(
            f"no layout {engine.name} runs" + (f" with {' '.join(given)}" if given else "")
            + f" is a pipeline over the groups ({', '.join(g.name for g in mixed.groups)}: "
            f"pp of at least {len(mixed.groups)}, each group's GPUs whole pipeline ranks of "
            f"tp x cp x dp), and no group alone fits; data parallelism across groups is not "
            f"planned yet: plan one group, or let the search choose those knobs")
    if fastest_alone is not None and (mixed_best is None or fastest_alone.step_time_s
                                      <= mixed_best.estimate.step_time_s):
        best, chosen = fastest_alone.result, fastest_alone.name
    return MixedReport(best=best, ranked=ranked, candidates=n_cands, pruned_memory=pruned_mem,
                       pruned_bound=pruned_bound, solved=solved,
                       seconds=time.perf_counter() - t0, seq_len=seq_len, global_batch=gbs,
                       engine=engine, margin_gib=margin_gib, mixed_best=mixed_best,
                       alone=alone, slowest=slow, chosen=chosen, closest=closest,
                       solver_limit_hit=limit_hit, gap=gap)

