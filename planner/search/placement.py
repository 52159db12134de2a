"""Placement of one candidate's layers over its pipeline ranks: the heuristic (even split,
least recompute that fits) and the exact CP-SAT model over counts (solve_cpsat: each rank's
layers n_s and recomputed layers r_s, as integers)."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from ortools.sat.python import cp_model

from planner.cost.moe import layer_kinds, moe_counts
from planner.cost.stage import Candidate, capacity_bytes, stage_coefficients
from planner.cost.price import price
from planner import rules as V
from planner.engines import get_engine
from planner.layout import split_count, splits
from planner.plan import make_stages
from planner.vocab import ZERO_BUBBLE_SCHEDULES
from planner.search.bounds import (Rules, _min_recompute, _min_recompute_kinds, _recompute_bounds,
                                   lower_coeffs, max_layers, per_rank, rules_for)

# CP-SAT works in integers: times are counted in units of (a step estimate) / TIME_UNITS, fine
# enough that rounding moves a step by ~1e-6, coarse enough to keep the solver fast.
TIME_UNITS = 1e8
# A solve's budget, per candidate, in CP-SAT's deterministic time (its count of work done,
# about a second of one core a unit: deepseek-v3/h100x256's longest solve measured 1.38 units
# in 1.39 s CPU), so that an answer never depends on how loaded the machine is: with a wall
# clock limit a time-limited solve stopped wherever the load left it, and its FEASIBLE result
# (the next solves' cutoff) with it. A FEASIBLE answer past it reports its gap.
SOLVER_SECONDS = 2.0
# the wall clock only as a safety net, far past what SOLVER_SECONDS of work takes
SOLVER_WALL_SECONDS = 30.0
# A candidate with at most this many splits of its layers is placed by pricing every one (each
# with the least recompute that fits: exact, as the brute force of tests/test_search.py), not
# by CP-SAT: exact and bounded (128 splits at ~0.1-0.4 ms each, measured 2026-12-03: 13-51 ms,
# against ~10 ms for a CP-SAT solve that goes well), where CP-SAT's presolved model of a
# 6-layer MoE model over 2 ranks (the first layer dense, tp 2, full recompute under Megatron)
# stalled: 0.07 deterministic units in 7-30 s of CPU, stopped FEASIBLE at [3, 3] (0.1689 s)
# against the optimum [4, 2] (0.1617 s) that pricing the 5 splits finds at once.
MAX_PRICED_SPLITS = 128


@dataclass
class Result:
    """One solved candidate."""
    candidate: Candidate
    layers: list
    recompute: list
    estimate: object
    status: str = "HEURISTIC"
    gap: float = 0.0
    bound_s: float | None = None   # no placement of this candidate beats this step time


def chunk_recompute(per_chunk: int, layers: int, v: int) -> int:
    """Layers of a rank recomputed when each of its v chunks recomputes its first `per_chunk`
    (Megatron's --recompute-num-layers): a chunk shorter than that recomputes all it has."""
    return min(v * per_chunk, layers)


def heuristic(model, cluster, c, coeffs, cap, rules: Rules, split=None, engine=None,
              margin_gib=None) -> Result:
    """The engine's default split (planner.rules.default_split: DeepSpeed's partition, else
    the even split), or `split`, or the user's, with the least recompute that fits (`cap`:
    bounds.per_rank); may not fit."""
    split, rec = heuristic_placement(model, c, coeffs, cap, rules, split, engine)
    est = price(model, cluster, c, split, rec, engine, margin_gib, coeffs).estimate
    return Result(c, split, rec, est)


def heuristic_placement(model, c, coeffs, cap, rules: Rules, split=None, engine=None) -> tuple:
    """heuristic's (layers, recomputed layers) per rank, unpriced: what it places depends on
    memory alone."""
    if split is None:
        split = (list(rules.fixed_split) if rules.fixed_split
                 else V.default_split(get_engine(engine), model.num_layers, c.pp, c.vpp))
    rec = []
    P = layer_kinds(model) if coeffs[0].moe is not None else None
    for i, (k, n, cap) in enumerate(zip(coeffs, split, per_rank(cap, len(coeffs)))):
        if P is None:
            r = _min_recompute(k, n, cap, c, rules)
        elif c.vpp == 1:   # one stage: layers [start, start + n), its first r recomputed
            start = sum(split[:i])
            def counts(r, start=start, n=n):
                return P[start + n] - P[start], P[start + r] - P[start]
            r = _min_recompute_kinds(k, n, cap, c, rules, counts)
        else:   # its MoE layers, as its chunks lie over the model
            def counts(r, i=i):
                q, rq = moe_counts(model, c.pp, c.vpp, split, [r if j == i else 0
                                                               for j in range(c.pp)])
                return q[i], rq[i]
            r = _min_recompute_kinds(k, n, cap, c, rules, counts)
        rec.append(r if r is not None else (rules.most_recomputed(n) if c.recompute != "none"
                                             else 0))
    return split, engine_recompute(rec, split, c, rules)


def engine_recompute(rec: list, split: list, c, rules: Rules) -> list:
    """Recomputed layers per rank as the engine counts them: where it recomputes one count in
    every model chunk (Rules.per_chunk: Megatron's --recompute-num-layers), the most any rank
    needs, in every chunk."""
    if rules.per_chunk and not rules.all_layers_recomputed and any(rec):
        per_chunk = max(math.ceil(r / c.vpp) for r in rec)
        return [chunk_recompute(per_chunk, n, c.vpp) for n in split]
    return list(rec)


@functools.lru_cache(maxsize=32)
def _hull_cuts(P: tuple) -> tuple:
    """Lines (a, b) with a*x + b <= P[x] at every integer x (the lower convex hull's edges) and
    lines with P[x] <= a*x + b (the upper concave hull's), as integer (num, den, off) triples:
    den*y >= num*x + off, and den*y <= num*x + off."""
    pts = list(enumerate(P))

    def hull(points, sign):
        out = []
        for pt in points:
            while len(out) >= 2:
                (x1, y1), (x2, y2) = out[-2], out[-1]
                cross = (x2 - x1) * (pt[1] - y1) - (y2 - y1) * (pt[0] - x1)
                if sign * cross <= 0:
                    out.pop()
                else:
                    break
            out.append(pt)
        return [((y2 - y1), (x2 - x1), (x2 - x1) * y1 - (y2 - y1) * x1)
                for (x1, y1), (x2, y2) in zip(out, out[1:])]
    return hull(pts, 1), hull(pts, -1)


def _element_with_hull(mdl, index, P: list, target) -> None:
    """target == P[index], with the hull of P's points as linear cuts (the element constraint
    alone gives CP-SAT's relaxation nothing to bound the stage sums with)."""
    mdl.AddElement(index, P, target)
    lower, upper = _hull_cuts(P if isinstance(P, tuple) else tuple(P))
    for num, den, off in lower:
        mdl.Add(den * target >= num * index + off)
    for num, den, off in upper:
        mdl.Add(den * target <= num * index + off)


def _even_parts(mdl, x, v: int, ub: int, name: str) -> list:
    """planner.plan.even_split(x, v) of an integer variable as v CP-SAT expressions: the base
    share, and one more for the last x mod v parts."""
    if v == 1:
        return [x]
    base = mdl.NewIntVar(0, ub // v, f"{name}_base")
    extra = mdl.NewIntVar(0, v - 1, f"{name}_extra")
    mdl.Add(x == v * base + extra)
    parts = [base]
    for ch in range(1, v):
        larger = mdl.NewBoolVar(f"{name}_larger{ch}")    # part ch is among the last `extra`
        mdl.Add(extra >= v - ch).OnlyEnforceIf(larger)
        mdl.Add(extra < v - ch).OnlyEnforceIf(larger.Not())
        parts.append(base + larger)
    return parts


def price_every_split(model, cluster, c, coeffs, cap, rules: Rules, most, engine=None,
                      margin_gib=None) -> Result | None:
    """The fastest placement over every split (each rank at most `most` layers: what its
    memory can hold, planner.search.bounds.max_layers), each rank recomputing the least that
    fits (the heuristic's choice for a given split: a rank's time only grows with its
    recomputed layers, and nothing else depends on them). The first of equal times in the
    splits' lexicographic order; None when none fits."""
    best = None
    least = rules.least_layers(len(coeffs), c.vpp, coeffs[0].moe is not None)
    for split in splits(model.num_layers, least, most):
        res = heuristic(model, cluster, c, coeffs, cap, rules, split=split, engine=engine,
                        margin_gib=margin_gib)
        if res.estimate.fits and (best is None
                                  or res.estimate.step_time_s < best.estimate.step_time_s):
            best = res
    if best is not None:
        best.status = "OPTIMAL"
    return best


def solve_cpsat(model, cluster, c, coeffs, cap, rules: Rules, hint=None, step_guess=1.0,
                engine=None, margin_gib=None, cutoff_s=None):
    """Exact layer and recompute counts per rank. Returns (Result | None, status, gap).

    `cutoff_s`: only placements with a step time at most this are wanted (the search's K-th
    best so far); INFEASIBLE then means none beats it, which CP-SAT proves faster."""
    v, m, L = c.vpp, c.m, model.num_layers
    lo, hi = _recompute_bounds(c, rules)
    mdl = cp_model.CpModel()
    unit = TIME_UNITS / step_guess
    ns = lambda x: int(round(x * unit))   # noqa: E731
    r_vars, T, tails = [], [], []
    # dense and MoE layers mixed: rank i holds n_i layers in v chunks and recomputes r_i of
    # them; its MoE counts q_i (and recomputed ones) follow from where its chunks lie
    P = layer_kinds(model) if coeffs[0].moe is not None else None
    Q = P[-1] if P is not None else 0
    # tight variable bounds keep the objective far from int64 overflow
    t_ub = 2 * max(ns(k.time(L, L, q, rq)) for k in coeffs
                   for q, rq in ((0, 0), (Q, 0), (Q, Q))) + 1
    tail_ub = 2 * max(ns(k.tail(L, q) + k.grad_fixed + L * k.grad_layer
                         + k.gather_fixed + L * k.gather_layer
                         + (q * max(0.0, k.moe.grad_layer + k.moe.gather_layer)
                            if k.moe else 0.0))
                      for k in coeffs for q in (0, Q)) + 1

    def exposure(c_layer, c_fixed, h_layer, h_fixed, a, n, ub, name, q=None, dc=0.0, dh=0.0):
        """Var >= the collective's exposed time, as in StageCoeffs.exposed_comm:
        max(c_layer, comm - hidden) + a * comm, with comm and hidden linear in n (and in the
        MoE layers q, each adding dc and dh)."""
        e = mdl.NewIntVar(0, ub, name)
        if q is None:
            mdl.Add(e >= ns(c_layer + a * c_fixed) + ns(a * c_layer) * n)
            mdl.Add(e >= ns((1 + a) * c_fixed - h_fixed) + ns((1 + a) * c_layer - h_layer) * n)
            return e
        mdl.Add(e >= ns(min(c_layer, c_layer + dc) + a * c_fixed) + ns(a * c_layer) * n
                + ns(a * dc) * q)
        mdl.Add(e >= ns((1 + a) * c_fixed - h_fixed) + ns((1 + a) * c_layer - h_layer) * n
                + ns((1 + a) * dc - dh) * q)
        return e

    p = len(coeffs)
    lows = rules.least_layers(len(coeffs), v, coeffs[0].moe is not None)
    n_vars = [mdl.NewIntVar(lo, L, f"n{i}") for i, lo in enumerate(lows)]
    stage_ends = q_vars = sizes = None
    if P is not None:
        # rank i's layers are split over its v chunks as planner.plan.make_stages splits them
        # (even_split); virtual stage j = chunk * p + rank holds layers [B_j, B_j+1) in model
        # order, and its MoE layers are differences of the prefix counts P at those boundaries
        # (element constraints), exact for contiguous stages
        sizes = [_even_parts(mdl, x, v, L, f"s{i}") for i, x in enumerate(n_vars)]
        stage_ends, at = [mdl.NewConstant(0)], [mdl.NewConstant(0)]
        for j in range(p * v):   # every virtual stage holds at least one layer
            b = (mdl.NewConstant(L) if j == p * v - 1
                 else mdl.NewIntVar(j + 1, L - (p * v - j - 1), f"B{j + 1}"))
            mdl.Add(b == stage_ends[-1] + sizes[j % p][j // p])
            pb = mdl.NewIntVar(0, Q, f"P{j + 1}")
            _element_with_hull(mdl, b, P, pb)
            stage_ends.append(b)
            at.append(pb)
        q_vars = [mdl.NewIntVar(0, Q, f"q{i}") for i in range(p)]
        for i, qv in enumerate(q_vars):
            mdl.Add(qv == sum(at[ch * p + i + 1] - at[ch * p + i] for ch in range(v)))

    per_chunk = None
    if rules.per_chunk and lo == 0 and hi == 1:
        per_chunk = mdl.NewIntVar(0, -(-L // v), "per_chunk")   # one count for every model chunk
    for i, k in enumerate(coeffs):
        n = n_vars[i]
        r = mdl.NewIntVar(0, L, f"r{i}")
        if lo == hi == 1:
            mdl.Add(r == n)
        elif hi == 0:
            mdl.Add(r == 0)
        elif per_chunk is not None:
            vr = mdl.NewIntVar(0, v * -(-L // v), f"vr{i}")
            mdl.Add(vr == v * per_chunk)
            mdl.AddMinEquality(r, [vr, n])             # chunk_recompute
        else:
            mdl.Add(r <= n - rules.kept_layers)
        mem_expr = (int(math.ceil(k.needed_fixed())) + int(math.ceil(k.needed_layer())) * n
                    - int(k.needed_rec) * r)
        t_expr = ns(k.t_fixed) + ns(k.t_layer) * n + ns(k.t_rec) * r
        tail_expr = ns(k.opt_fixed) + ns(k.opt_layer) * n
        q = dz = dt = None
        if P is not None:   # this rank's MoE layers q and recomputed MoE layers rq
            q, d = q_vars[i], k.moe
            if hi == 0:
                rq = 0
            elif lo == hi == 1:
                rq = q
            else:   # each chunk recomputes its first min(its share of r, its size) layers
                rq = mdl.NewIntVar(0, Q, f"rq{i}")
                terms = []
                # Megatron's one count R per chunk: make_stages' even split of min(v R, n) gives
                # chunk c min(R, its size) (sizes differ by at most one), so R stands for the
                # share; otherwise the rank's r is split evenly
                shares = ([per_chunk] * v if per_chunk is not None and v > 1
                          else _even_parts(mdl, r, v, L, f"rc{i}"))
                for ch, share in enumerate(shares):
                    j = ch * p + i
                    rc = share       # one chunk: r <= n
                    if v > 1:
                        rc = mdl.NewIntVar(0, L, f"rc{i}_{ch}")
                        size = mdl.NewIntVar(0, L, f"sz{i}_{ch}")
                        mdl.Add(size == sizes[i][ch])
                        part = mdl.NewIntVar(0, L, f"rp{i}_{ch}")
                        mdl.Add(part == share)
                        mdl.AddMinEquality(rc, [part, size])
                    idx = mdl.NewIntVar(0, L, f"rs{i}_{ch}")
                    mdl.Add(idx == stage_ends[j] + rc)
                    pr = mdl.NewIntVar(0, Q, f"pr{i}_{ch}")
                    _element_with_hull(mdl, idx, P, pr)
                    terms.append(pr - at[j])
                mdl.Add(rq == sum(terms))
            mem_expr = (mem_expr + int(math.ceil(d.needed_layer())) * q
                        - int(d.needed_rec) * rq)
            t_expr = t_expr + ns(d.t_layer) * q + ns(d.t_rec) * rq
            tail_expr = tail_expr + ns(d.opt_layer) * q
            dz = [(e[0], e[2]) for e in d.exposures()]
            dt = [(e[0], e[2]) for e in d.tail_exposures()]
        # memory (bytes); `cap` per rank where the ranks' GPUs differ (planner.search.groups)
        mdl.Add(mem_expr <= int(cap[i] if isinstance(cap, (list, tuple)) else cap))
        # per micro-batch time, with the ZeRO-2/3 collectives' exposure
        for j, (cl, cf, hl, hf) in enumerate(k.exposures()):
            dc, dh = dz[j] if dz else (0.0, 0.0)
            if cl > 0 or cf > 0 or dc > 0:
                t_expr = t_expr + exposure(cl, cf, hl, hf, k.exposure_slowdowns()[j], n, t_ub,
                                           f"e{i}_{j}", q, dc, dh)
        t = mdl.NewIntVar(0, t_ub, f"T{i}")
        mdl.Add(t == t_expr)
        # step tail: gradient reduction, parameter gather, optimizer
        for j, (cl, cf, hl, hf) in enumerate(k.tail_exposures()):
            dc, dh = dt[j] if dt else (0.0, 0.0)
            if cl > 0 or cf > 0 or dc > 0:
                tail_expr = tail_expr + exposure(cl, cf, hl, hf, k.overlap_slowdown, n, tail_ub,
                                                 f"x{i}_{j}", q, dc, dh)
        tl = mdl.NewIntVar(0, tail_ub, f"tail{i}")
        mdl.Add(tl == tail_expr)
        r_vars.append(r); T.append(t); tails.append(tl)   # noqa: E702
    mdl.Add(sum(n_vars) == L)
    tmax = mdl.NewIntVar(0, t_ub, "Tmax")
    mdl.AddMaxEquality(tmax, T)
    tailmax = mdl.NewIntVar(0, tail_ub, "tailmax")
    mdl.AddMaxEquality(tailmax, tails)
    def objective_of(var):
        """objective x v:  m*v*Tmax + sum(T) - Tmax + v*tailmax, over var(x) for x"""
        if c.schedule in ZERO_BUBBLE_SCHEDULES:   # no bubble term: at most its simulated step
            return m * v * var(tmax) + v * var(tailmax)
        return (m * v - 1) * var(tmax) + sum(var(t) for t in T) + v * var(tailmax)
    objective = objective_of(lambda x: x)
    mdl.Minimize(objective)
    if hint is not None:
        for var, val in zip(n_vars, hint.layers):
            mdl.AddHint(var, val)
        for var, val in zip(r_vars, hint.recompute):
            mdl.AddHint(var, val)
        if per_chunk is not None:
            mdl.AddHint(per_chunk, max(-(-r // v) for r in hint.recompute))
        if stage_ends is not None:
            for b, st in zip(stage_ends[1:], make_stages(L, p, v, hint.layers, hint.recompute)):
                mdl.AddHint(b, st.layers[1])
    # the same model, hint included, before any cutoff: where the placement an optimal solve
    # returns is taken from (below)
    level = mdl.clone()
    if cutoff_s is not None and math.isfinite(cutoff_s):
        mdl.Add(objective <= v * ns(cutoff_s * (1 + 1e-6)) + v * (m + len(coeffs) + 1))

    def solver():
        s = cp_model.CpSolver()
        s.parameters.num_workers = 1
        s.parameters.max_deterministic_time = SOLVER_SECONDS
        s.parameters.max_time_in_seconds = SOLVER_WALL_SECONDS
        # The model is tiny (2 variables per rank); CP-SAT's presolve can stall for seconds
        # on its wide integer coefficients while the search itself needs milliseconds.
        s.parameters.cp_model_presolve = P is not None   # element constraints need it
        if P is not None and v > 1:   # the hull cuts into the LP relaxation: chunk proofs
            s.parameters.linearization_level = 2
        return s

    sol = solver()
    st = sol.Solve(mdl)
    status = sol.StatusName(st)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, status, None
    obj, bound = sol.ObjectiveValue(), sol.BestObjectiveBound()
    gap = (obj - bound) / obj if obj > 0 else 0.0
    if st == cp_model.OPTIMAL:
        # Equal-time placements abound (a layer moved between two ranks that are not the
        # bottleneck changes no term), and which of them the solve returns depends on the
        # cutoff, i.e. on the candidates solved before. The placement kept is the first
        # solution of the model without cutoff, from the same hint, constrained to the optimal
        # objective: a function of the candidate and its optimum alone, so the search's order
        # and cutoffs cannot change it.
        idx = lambda x: level.get_int_var_from_proto_index(x.index)   # noqa: E731
        level.clear_objective()
        level.add(objective_of(idx) <= int(round(obj)))
        again = solver()
        if again.Solve(level) in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            sol, n_vars, r_vars = again, [idx(x) for x in n_vars], [idx(x) for x in r_vars]
    layers = [sol.Value(x) for x in n_vars]
    rec = [sol.Value(x) for x in r_vars]
    est = price(model, cluster, c, layers, rec, engine, margin_gib, coeffs).estimate
    # the objective is v x the step in units; rounding moves it by < one unit per term
    bound_s = max(0.0, (bound - v * (m + len(coeffs) + 1)) / (v * unit))
    return (Result(c, layers, rec, est, status=status, gap=gap, bound_s=bound_s), status,
            gap)


def solve_candidate(model, cluster, c, rules: Rules | None = None, coeffs=None, heur=None,
                    engine=None, margin_gib=None, cutoff_s=None, low=None):
    """Best layer placement for one candidate: (Result, fits). With `cutoff_s`, a candidate
    that cannot beat it comes back as its heuristic placement."""
    engine = get_engine(engine)
    rules = rules or rules_for(engine, c)
    coeffs = coeffs or stage_coefficients(model, cluster, c, engine)
    cap = capacity_bytes(cluster, engine, margin_gib)
    heur = heur or heuristic(model, cluster, c, coeffs, cap, rules, engine=engine,
                             margin_gib=margin_gib)
    if c.pp == 1 or rules.equal_split or rules.fixed_split:
        return heur, heur.estimate.fits
    caps = max_layers(low or [lower_coeffs(k) for k in coeffs], cap, c.vpp, rules, c)
    if (sum(min(x, model.num_layers) for x in caps) < model.num_layers
            or rules.short_of_layers(caps, c.vpp)):
        return heur, False
    least = rules.least_layers(len(coeffs), c.vpp, coeffs[0].moe is not None)
    if split_count(model.num_layers, least) <= MAX_PRICED_SPLITS:
        best = price_every_split(model, cluster, c, coeffs, cap, rules, caps, engine, margin_gib)
        if best is None or (heur.estimate.fits
                            and heur.estimate.step_time_s < best.estimate.step_time_s):
            # the engine's own split may lie outside the placed ones (an MoE model's empty
            # end chunks): kept where it is the better plan, the best of every split priced
            heur.status = "OPTIMAL" if heur.estimate.fits else "INFEASIBLE"
            return heur, heur.estimate.fits
        return best, True
    res, status, gap = solve_cpsat(model, cluster, c, coeffs, cap, rules,
                                   hint=heur if heur.estimate.fits else None,
                                   step_guess=heur.estimate.step_time_s, engine=engine,
                                   margin_gib=margin_gib, cutoff_s=cutoff_s)
    if res is None:   # the solver found nothing in time: the even split may still fit
        heur.status = status   # UNKNOWN: stopped at the limit; INFEASIBLE: none beats cutoff
        return heur, heur.estimate.fits
    if heur.estimate.fits and heur.estimate.step_time_s < res.estimate.step_time_s:
        heur.status, heur.gap = res.status, res.gap   # rounding ties: keep the better one
        return heur, True
    return res, res.estimate.fits


