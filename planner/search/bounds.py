"""Bounds of the search: what the engine lets a placement do (Rules), the most layers a rank
can hold, the fewest it must recompute, lower bounds on a candidate's step time (from its stage
coefficients, or cheaper ones from figures its variants share, SharedCoefficients) and the
model-state screens that reject a candidate before its coefficients are built."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from planner import rules as V
from planner.cost.memory import GIB, model_state_bytes
from planner.cost.offload import gpu_state_bytes
from planner.cost.moe import expert_dp, layer_kinds, moe_counts, replace_coeffs
from planner.cost.compute import BF16
from planner.cost.facts import facts_for
from planner.cost.schedule import in_flight
from planner.cost.stage import (Candidate, exposed_comm_array, time_floor_figures,
                                stage_coefficients)
from planner.engines.spec import BALANCED_SPLIT, PER_CHUNK, Engine
from planner.precision import TE_FP8_TRANSPOSE_BYTES, low_precision
from planner.specs import Cluster, Model
from planner.vocab import V_SCHEDULES, ZERO_BUBBLE_SCHEDULES
from planner.search.enumeration import Fixed, without_tp_overlap

def _one_rank(c: Candidate, **changes) -> Candidate:
    """c laid out on one pipeline rank (pp 1, 1F1B) with `changes`: dataclasses.replace of
    the frozen Candidate (no __post_init__) without its cost. Without ZeRO (zero=0), the
    layer's figures every ZeRO choice shares (_layer_figures); with its ZeRO and data
    parallelism kept and no recompute (recompute="none"), what a layer's ZeRO collectives and
    host copies, and the passes they hide behind, are on every pipeline rank of c
    (exposure_floor)."""
    out = object.__new__(Candidate)
    out.__dict__.update(c.__dict__, pp=1, vpp=1, schedule="1f1b", **changes)
    return out


def _exposure_key(c: Candidate) -> tuple:
    """What exposure_floor depends on: the layer's shape, and the data-parallel layout, ZeRO
    stage, offloads and precision its collectives and copies move."""
    return (_shape_key(c), c.dp, c.zero, c.dp_shard, c.zeropp, c.offload_optimizer,
            c.offload_params, c.precision, c.recipe)


def _shape_key(c: Candidate) -> tuple:
    """What a layer's figures depend on beside its recompute choice: every field that changes
    them (the MoE dispatch, overlap, capacity and imbalance included, and the micro-batches
    under the EP overlap, whose first forward and last backward run unpaired: planner.cost.moe
    unpaired_pass_share); pp, the schedule and ZeRO are the class's own (laid out at pp 1)."""
    return (c.mbs, c.tp, c.sp, c.cp, c.cp_comm, c.ep, c.etp, c.tp_comm_overlap,
            c.ep_comm_overlap, c.moe_dispatcher, c.moe_capacity_factor, c.moe_imbalance,
            c.m if c.ep_comm_overlap else 0)


# lower_coeffs: the per-layer fields an MoE layer's delta may lower (a time), or must raise
# (a pass beside which a collective hides, what recomputing frees)
_LOWER_FIELDS = ("compute_layer", "compute_rec", "tp_layer", "tp_rec", "ep_layer", "ep_rec",
                 "zf_layer", "zb_layer", "grad_layer", "gather_layer", "opt_layer")
_HIGHER_FIELDS = ("fwd_layer", "bwd_layer", "mem_rec")


def lower_coeffs(k):
    """Stage coefficients no layer of either kind is below (per-layer time and memory the
    smaller kind's, hiding compute and recompute savings the larger's): bounds and memory
    pruning computed on them are sound for any placement of dense and MoE layers."""
    if k.moe is None:
        return k
    d = k.moe
    kd, dd = k.__dict__, d.__dict__
    lo = {f: min(kd[f], kd[f] + dd[f]) for f in _LOWER_FIELDS}
    hi = {f: max(kd[f], kd[f] + dd[f]) for f in _HIGHER_FIELDS}
    mem = {key: min(val, val + d.mem_layer.get(key, 0.0)) for key, val in k.mem_layer.items()}
    return replace_coeffs(k, moe=None, mem_layer=mem, **lo, **hi)


def zero_bubble_floor(m: int, slowest: float, total: float, wgrad_total: float) -> float:
    """A zero-bubble schedule's simulated pipeline at least (planner.cost.schedule
    zero_bubble_time), from `slowest`, at most its slowest rank's time per micro-batch,
    `total`, at most the ranks' times summed, and `wgrad_total`, at least their weight
    gradients summed: the busiest rank's m micro-batches, and the dependency chain of any one
    micro-batch (planner.cost.schedule _run_order), its forward through every stage then its
    input gradient back (stage 0 running its whole backward in W), which holds every rank's
    forward and input-gradient seconds, its time less its weight gradients. The second is
    what a pipeline of few micro-batches pays (m = 1: every stage one after the other), which
    m x the slowest rank leaves out."""
    return max(m * slowest, total - wgrad_total)


# ---- per-candidate pieces ---------------------------------------------------

@dataclass(frozen=True)
class Rules:
    """What the engine lets one candidate's placement do: recompute every layer or none
    (`all_layers_recomputed`), one recompute count for every model chunk (`per_chunk`), the
    same number of layers on every pipeline rank (`equal_split`), the layers per rank given by
    the user (`fixed_split`: only the recompute is placed)."""
    all_layers_recomputed: bool = False
    per_chunk: bool = False
    equal_split: bool = False
    fixed_split: tuple | None = None
    # the fewest layers each rank may hold (planner.rules.rank_min_layers); None: vpp each
    min_layers: tuple | None = None
    # the fewest of a rank's layers it may not recompute (offload: planner.rules
    # OFFLOAD_KEPT_LAYERS)
    kept_layers: int = 0

    def most_recomputed(self, n: int) -> int:
        """The most of a rank's n layers it may recompute (or offload)."""
        return max(0, n - self.kept_layers)

    def least_layers(self, p: int, vpp: int, kinds: bool = False) -> list:
        """The fewest layers each of p ranks holds in a placement: `min_layers`, but one a
        model chunk for a model of dense and MoE layers (`kinds`: its placement model gives
        every chunk a layer)."""
        return list(self.min_layers) if self.min_layers and not kinds else [vpp] * p

    def short_of_layers(self, caps, vpp: int) -> bool:
        """Some rank can hold fewer layers than it must."""
        return any(x < lo for x, lo in zip(caps, self.least_layers(len(caps), vpp)))


def rules_for(engine: Engine, c: Candidate, f: Fixed | None = None) -> Rules:
    # a fixed recompute granularity recomputes every layer (a published "full"); a fixed
    # offload is the granularity, its count placed like any (Megatron's own knob)
    recompute_fixed = f is not None and f.recompute not in (None, "none", "offload")
    return Rules(all_layers_recomputed=(recompute_fixed
                                        or engine.all_layers_recomputed(c.recompute)),
                 per_chunk=engine.recompute_count(c.recompute) == PER_CHUNK,
                 equal_split=engine.stage_layers == BALANCED_SPLIT,
                 fixed_split=f.stage_layers if f is not None and c.pp > 1 else None,
                 min_layers=tuple(V.rank_min_layers(engine, c.pp, c.vpp)),
                 kept_layers=V.OFFLOAD_KEPT_LAYERS if c.recompute == "offload" else 0)


def _recompute_bounds(c: Candidate, rules: Rules):
    """(lo, hi) fraction of a rank's layers that may be recomputed."""
    if c.recompute == "none":
        return 0, 0
    return (1, 1) if rules.all_layers_recomputed else (0, 1)


def per_rank(cap, p: int) -> list:
    """The bytes each of p pipeline ranks may allocate: `cap` for all (a number), or one each
    (a sequence: a mixed cluster's ranks, planner.cost.stage.rank_budgets)."""
    return [float(x) for x in cap] if isinstance(cap, (list, tuple, np.ndarray)) else [cap] * p


def max_layers(coeffs, cap, v: int, rules: Rules, c: Candidate,
               lower: bool = False) -> list:
    """Most layers each rank can hold, recomputing all it may (`cap`: per_rank). `lower`: of
    the coefficients' lower_coeffs (the same figures, without building them)."""
    lo, hi = _recompute_bounds(c, rules)
    out = []
    for k, cap in zip(coeffs, per_rank(cap, len(coeffs))):
        if lower and k.moe is not None:   # lower_coeffs' mem_layer and mem_rec
            d = k.moe
            per = (k.needed({key: min(val, val + d.mem_layer.get(key, 0.0))
                             for key, val in k.mem_layer.items()})
                   - hi * max(k.needed_rec, k.needed_rec + d.needed_rec))
        else:
            per = k.needed_layer() - hi * k.needed_rec
        room = cap - k.needed_fixed()
        if room < 0:
            out.append(0)
        elif per <= 0:
            out.append(10 ** 9)
        else:
            out.append(int(room // per))
    return out


def _stacked(values) -> np.ndarray:
    """One figure per pipeline rank, as a column (ranks along the first axis)."""
    return np.asarray(values, dtype=float)[:, None]


def _least_recompute(mem0, save, n, cap: float, c: Candidate, rules: Rules):
    """Least recomputed layers (inf: none fits) of ranks whose memory with no recompute is
    mem0 (ranks x layer counts [x MoE counts]), each recomputed layer saving `save` (per rank,
    broadcast as mem0)."""
    if c.recompute == "none":
        return np.where(mem0 <= cap, 0.0, np.inf)
    if rules.all_layers_recomputed:
        return np.where(mem0 - n * save <= cap, n, np.inf)
    pos = save > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.maximum(0.0, np.ceil((mem0 - cap) / np.where(pos, save, 1.0)))
    return np.where(pos, np.where(r <= n - rules.kept_layers, r, np.inf),
                    np.where(mem0 <= cap, 0.0, np.inf))


def _with_exposures(t, coeffs, n):
    """t (ranks x layer counts) plus each rank's ZeRO-2/3 exposure with n layers
    (planner.cost.stage.exposed_comm_array, StageCoeffs.exposed_comm over arrays)."""
    for j in range(len(coeffs[0].exposures())):
        e = [k.exposures()[j] for k in coeffs]
        if any(x[0] > 0 or x[1] > 0 for x in e):
            slow = _stacked([k.exposure_slowdowns()[j] for k in coeffs])
            cl, cf, hl, hf = (_stacked(col) for col in zip(*e))
            t = t + exposed_comm_array(cl, cf, hl, hf, slow, n)
    return t


def _rank_min_times(coeffs, L: int, v: int, cap, c: Candidate, rules: Rules):
    """Least per-micro-batch time of each rank holding n = v, v+1, ... layers (inf if n cannot
    fit, or is fewer than the rank may hold: rules.min_layers, from v on at most one fewer):
    (n, ranks x n times). `cap`: per_rank."""
    n = np.arange(v, L + 1, dtype=float)
    if rules.min_layers and min(rules.min_layers) < v:   # from the fewest any rank may hold
        n = np.arange(min(rules.min_layers), L + 1, dtype=float)
    mem0 = (_stacked([k.needed_fixed() for k in coeffs])
            + n * _stacked([k.needed_layer() for k in coeffs]))
    r = _least_recompute(mem0, _stacked([k.needed_rec for k in coeffs]), n,
                         _stacked(per_rank(cap, len(coeffs))), c, rules)
    with np.errstate(invalid="ignore"):
        t = (_stacked([k.t_fixed for k in coeffs]) + n * _stacked([k.t_layer for k in coeffs])
             + np.where(np.isfinite(r), r * _stacked([k.t_rec for k in coeffs]), np.inf))
    if n[0] < v:
        t = np.where(n < _stacked(rules.min_layers), np.inf, t)
    return n, _with_exposures(t, coeffs, n)


@functools.lru_cache(maxsize=4096)
def _kinds_window(P: tuple, i: int, p: int) -> tuple:
    """(least, most) MoE layers pipeline rank i of p (one chunk each, contiguous stages in
    model order, at least one layer each) can hold with n = 1..L layers: its first layer is at
    least i and its stage ends by L - (p - 1 - i), so it is a window [b, b + n) with
    i <= b <= L - (p - 1 - i) - n, holding P[b + n] - P[b] MoE layers. No window: (L+1, -1)."""
    L = len(P) - 1
    A = np.asarray(P, dtype=float)
    lo, hi = np.full(L, L + 1.0), np.full(L, -1.0)
    for n in range(1, L + 1):
        b_hi = L - (p - 1 - i) - n
        if b_hi >= i:
            q = A[i + n:b_hi + n + 1] - A[i:b_hi + 1]
            lo[n - 1], hi[n - 1] = q.min(), q.max()
    return lo, hi


@functools.lru_cache(maxsize=256)
def _kinds_windows(P: tuple, p: int) -> tuple:
    """_kinds_window of every rank, stacked: (least, most), ranks x n x 1."""
    wins = [_kinds_window(P, i, p) for i in range(p)]
    return (np.stack([w[0] for w in wins])[:, :, None], np.stack([w[1] for w in wins])[:, :, None])


def _rank_min_times_kinds(coeffs, low, L: int, Q: int, v: int, cap, c: Candidate,
                          rules: Rules, windows=None):
    """_rank_min_times of the ranks of a model with L layers, Q of them MoE: a rank holding n
    layers holds q of them MoE for some max(0, n - (L - Q)) <= q <= min(n, Q); the least time
    over those q, with the least recompute its memory needs (each recomputed layer saving at
    most the larger kind's activations) and the ZeRO exposure of lower_coeffs: a lower bound.
    `windows`: the (least, most) MoE layers each rank can hold with n = v..L layers where it
    holds one contiguous stage (_kinds_windows), else any count in the range above."""
    n = np.arange(v, L + 1, dtype=float)[:, None]
    if L - Q <= Q:   # over the rank's dense layers (fewer choices), else its MoE layers
        q = n - np.arange(0, L - Q + 1, dtype=float)[None, :]
    else:
        q = np.arange(0, Q + 1, dtype=float)[None, :] + 0 * n
    if windows is None:
        ok = (q >= np.maximum(0, n - (L - Q))) & (q <= np.minimum(n, Q))
    else:
        q_lo, q_hi = windows
        ok = (q >= q_lo) & (q <= q_hi)

    def col(values):   # one figure per rank, ranks along the first of three axes
        return np.asarray(values, dtype=float)[:, None, None]

    mem0 = (col([k.needed_fixed() for k in coeffs]) + n * col([k.needed_layer()
                                                                for k in coeffs])
            + q * col([k.moe.needed_layer() for k in coeffs]))
    save = col([max(k.needed_rec, k.needed_rec + k.moe.needed_rec) for k in coeffs])
    r = np.where(ok, _least_recompute(mem0, save, n, col(per_rank(cap, len(coeffs))), c, rules),
                 np.inf)
    with np.errstate(invalid="ignore"):
        t = (col([k.t_fixed for k in coeffs]) + n * col([k.t_layer for k in coeffs])
             + q * col([k.moe.t_layer for k in coeffs])
             + np.where(np.isfinite(r), r * col([lk.t_rec for lk in low]), np.inf))
    t = t.min(axis=2)
    n = n[:, 0]
    return n, _with_exposures(t, low, n)


def bottleneck(coeffs, c: Candidate, L: int, cap, rules: Rules, Q=None, low=None,
               model=None):
    """lower_bound's bottleneck (`cap`: per_rank): (T*, each rank's least time from n = v,
    v+1, ... layers on (ranks x n), the kinds' total time and memory, the coefficients the rest
    is bounded on), or None when no placement fits. lower_bound and bottleneck_split take it
    as `got`, so a caller that wants both computes it once."""
    v = c.vpp
    if Q is not None:   # dense and MoE layers (coeffs with `moe`): kinds counted
        low = low or [lower_coeffs(k) for k in coeffs]
        P = layer_kinds(model) if model is not None else None
        wins = (_kinds_windows(tuple(P), c.pp)
                if P is not None and v == 1 and c.pp == len(coeffs) else None)
        n_all, t_all = _rank_min_times_kinds(coeffs, low, L, Q, v, cap, c, rules, wins)
        kinds_total = (sum(k.t_fixed for k in coeffs) + (L - Q) * min(k.t_layer for k in coeffs)
                       + Q * min(k.t_layer + k.moe.t_layer for k in coeffs))
        # every layer is held once: L - Q dense and Q MoE layers' memory pooled over ranks
        kinds_memory = ((L - Q) * min(k.needed_layer() for k in coeffs)
                        + Q * min(k.needed_layer() + k.moe.needed_layer() for k in coeffs))
        coeffs = low
    else:
        n_all, t_all = _rank_min_times(coeffs, L, v, cap, c, rules)
        kinds_total = kinds_memory = 0.0
    first = int(n_all[0]) if n_all.ndim == 1 else v   # the fewest layers a rank may hold
    values = np.unique(t_all[np.isfinite(t_all)])
    if values.size == 0:
        return None
    # the most layers rank i can hold within time x is the last n whose least time from n on
    # is at most x (times past it only exceed x): v - 1 + the count of those (0 if none)
    suffix = np.minimum.accumulate(t_all[:, ::-1], axis=1)[:, ::-1]

    def layers_within(x) -> int:
        k = (suffix <= x).sum(axis=1)
        return int(np.where(k > 0, first - 1 + k, 0).sum())

    lo, hi = 0, values.size - 1
    if layers_within(values[hi]) < L:
        return None
    while lo < hi:   # least value at which the ranks' layer capacities reach L
        mid = (lo + hi) // 2
        if layers_within(values[mid]) >= L:
            hi = mid
        else:
            lo = mid + 1
    return float(values[lo]), suffix, kinds_total, kinds_memory, coeffs


def bottleneck_split(coeffs, c: Candidate, L: int, cap, rules: Rules, Q=None, low=None,
                     model=None, got=False) -> list | None:
    """Layers per pipeline rank (each at least its fewest) that lower_bound's bottleneck T*
    lets each hold, the largest trimmed first until they sum to L: a placement to price beside the
    even split (None when no placement fits). `got`: `bottleneck`'s answer where computed."""
    if got is False:
        got = bottleneck(coeffs, c, L, cap, rules, Q, low, model)
    if got is None:
        return None
    t_star, suffix, *_ = got
    first = L + 1 - suffix.shape[1]   # suffix's columns: a rank holding first, first + 1, ...
    k = (suffix <= t_star).sum(axis=1)
    split = [int(x) for x in np.where(k > 0, first - 1 + k, 0)]
    least = rules.least_layers(len(split), c.vpp, Q is not None)
    if any(n < lo for n, lo in zip(split, least)):
        return None
    while sum(split) > L:   # the largest of the ranks above their fewest gives one up
        i = max((j for j in range(len(split)) if split[j] > least[j]), key=lambda j: split[j])
        split[i] -= 1
    return split


def lower_bound(coeffs, c: Candidate, L: int, cap, rules: Rules, Q=None,
                low=None, model=None, got=False) -> float:
    """A step time no placement of this candidate can beat (`cap`: per_rank, so a mixed
    cluster's ranks each have their own).

    The slowest stage is at least the bottleneck time T*: the least T at which the ranks can
    hold all L layers with every rank's time (with the least recompute its memory needs) at most
    T. The sum of stage times is at least the perfectly balanced total with that recompute
    pooled over ranks. The tail is the smallest any rank can have while some rank holds at
    least L/p layers. (Engine rules only restrict placements further: still a bound.)
    `got`: `bottleneck`'s answer where computed.
    """
    p, m, v = c.pp, c.m, c.vpp
    # a rank's weight gradients per layer, at most (its MoE layers' counted as a dense one's,
    # as planner.cost.schedule forward_and_wgrad counts them)
    w_max = max(k.wgrad_layer for k in coeffs)
    if got is False:
        got = bottleneck(coeffs, c, L, cap, rules, Q, low, model)
    if got is None:
        return math.inf
    t_bottle, _, kinds_total, kinds_memory, coeffs = got
    if c.recompute == "none":
        need = 0
    elif rules.all_layers_recomputed:
        need = L
    else:   # pooled memory over ranks sets the least total recompute
        excess = (sum(k.needed_fixed() for k in coeffs)
                  + max(kinds_memory, L * min(k.needed_layer() for k in coeffs))
                  - sum(per_rank(cap, p)))
        mr = max(k.needed_rec for k in coeffs)
        need = min(L, max(0, math.ceil(excess / mr))) if mr > 0 and excess > 0 else 0
    total = (max(kinds_total, sum(k.t_fixed for k in coeffs) + L * min(k.t_layer for k in coeffs))
             + need * min(k.t_rec for k in coeffs))
    t_star = max(t_bottle, total / p)
    total = max(total, t_star)
    n = math.ceil(L / p)
    tail = min(k.tail_lower(n) for k in coeffs)
    if c.schedule in ZERO_BUBBLE_SCHEDULES:   # its simulated bubble: zero_bubble_floor
        return zero_bubble_floor(m, t_star, total, L * w_max) + tail
    return m * t_star + (total - t_star) / v + tail


def without_buffers_bound(coeffs, c: Candidate, L: int, cap, rules: Rules, own: float,
                          Q=None, model=None) -> float:
    """A step no placement of c without its TP overlap beats, where the overlap is not slower
    (StageCoeffs.tp_overlap_slower), from c's own coefficients (lower_bound): the twin's times
    are c's or more (the overlap only hides), its memory c's less the overlap's userbuffers
    (StageCoeffs.userbuffer_bytes). `own`: c's lower bound, which holds for the twin where c
    holds no buffers, or where c fits (`own` finite) with no choice the buffers' memory could
    sway: one split (pp 1, or the engine's own) and a recompute that does not depend on
    memory (none, or every layer). Elsewhere the buffers can decide which splits fit (the
    bound is inf where none does) or how many layers recompute, so a twin freed of them is
    bounded on its own memory."""
    if not any(k.userbuffer_bytes for k in coeffs) or (
            math.isfinite(own) and (c.pp == 1 or rules.equal_split or rules.fixed_split)
            and (c.recompute == "none" or rules.all_layers_recomputed)):
        return own
    freed = [replace_coeffs(k, mem_fixed={**k.mem_fixed,
                                          "other": k.mem_fixed["other"] - k.userbuffer_bytes})
             for k in coeffs]
    if freed[0].moe is not None:
        return lower_bound(freed, c, L, cap, rules, Q=Q,
                           low=[lower_coeffs(k) for k in freed], model=model)
    return lower_bound(freed, c, L, cap, rules)


def quick_lower_bound(coeffs, c: Candidate, L: int, Q=None) -> float:
    """A cheaper bound below `lower_bound`: the stages' times sum to at least
    total = sum of fixed times + L x the least per-layer time (no recompute, no exposure); with
    dense and MoE layers (full coefficients with `moe`, Q of the L layers MoE) each kind's
    layers at least that kind's least per-layer time, as `lower_bound`'s kinds total. The
    slowest stage is at least total/p, so the step is at least
    m * total/p + (p - 1)/v * total/p (pipeline_time with every stage at the mean); under a
    zero-bubble schedule zero_bubble_floor of them."""
    p, m, v = c.pp, c.m, c.vpp
    total = sum(k.t_fixed for k in coeffs)
    if Q is not None and coeffs[0].moe is not None:
        total += ((L - Q) * min(k.t_layer for k in coeffs)
                  + Q * min(k.t_layer + k.moe.t_layer for k in coeffs))
    else:
        total += L * min(k.t_layer for k in coeffs)
    mean = total / p
    if c.schedule in ZERO_BUBBLE_SCHEDULES:   # its simulated bubble: zero_bubble_floor
        return zero_bubble_floor(m, mean, total, L * max(k.wgrad_layer for k in coeffs))
    return m * mean + (p - 1) * mean / v


def _min_recompute(k, n: int, cap: float, c: Candidate, rules: Rules):
    """Fewest recomputed layers that make rank k fit with n layers, or None."""
    if c.recompute == "none":
        return 0 if k.memory(n, 0)["needed"] <= cap else None
    if rules.all_layers_recomputed:
        return n if k.memory(n, n)["needed"] <= cap else None
    over = k.memory(n, 0)["needed"] - cap
    if over <= 0:
        return 0
    if k.needed_rec <= 0:
        return None
    r = math.ceil(over / k.needed_rec)
    return r if r <= rules.most_recomputed(n) else None


def _min_recompute_kinds(k, n: int, cap: float, c: Candidate, rules: Rules, counts):
    """_min_recompute for a rank of n layers of a model of dense and MoE layers, where
    counts(r) is (its MoE layers, its recomputed MoE layers) when it recomputes r of its layers
    (planner.cost.moe.moe_counts: where its chunks lie and which of their layers recompute)."""
    def fits(r):
        q, rq = counts(r)
        return k.memory(n, r, q, rq)["needed"] <= cap

    if c.recompute == "none" or rules.all_layers_recomputed:
        r = 0 if c.recompute == "none" else n
        return r if fits(r) else None
    most = rules.most_recomputed(n)
    if not fits(most):
        return None
    lo, hi = 0, most     # memory does not grow with r: the least r that fits, by bisection
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo



class SharedCoefficients:
    """Stage coefficients of a search's candidates, and two bounds computed without them.

    - `states`: a lower bound on the model states (weights, gradients, optimizer) each pipeline
      rank holds, from the parameter counts (planner.specs) and model_state_bytes
      (planner.cost.memory, with the engine's bytes per parameter as planner.cost.stage
      passes them) under the candidate's tp, cp, dp, ZeRO, ep and etp, leaving out
      parameters that only add (norms, biases, position embeddings, MTP projections, low
      precision weight copies): per rank its embedding / head / MTP share, one dense layer,
      one MoE layer (model_state_bytes is linear in the parameters);
    - `quick_bound`: below quick_lower_bound, from the coefficients of one candidate per
      (micro-batch, tp, sp, cp, exchange, ep, etp, TP overlap) laid out with pp = 1: a layer's
      time does not depend on the pipeline, data-parallel, ZeRO or recompute choices, and the
      embedding, head and MTP times one rank holds at pp = 1 are what the stages hold between
      them (the pipeline sends, >= 0, left out).
    tests/test_search_speed_bounds.py checks both against each candidate's own coefficients."""

    def __init__(self, model: Model, cluster: Cluster, engine: Engine):
        self.model, self.cluster, self.engine = model, cluster, engine
        self._times = {}       # class key -> (fixed, per layer, per MoE layer added) seconds
        self._states = {}      # layout -> [(fixed, per layer, per MoE layer)] bytes per rank
        self.kinds = layer_kinds(model)   # prefix counts of MoE layers, None: all alike
        L = model.num_layers
        self._counts = ((L - self.kinds[-1], self.kinds[-1]) if self.kinds is not None
                        else (0, L) if model.is_moe else (L, 0))
        self._in_flight, self._pooled, self._shape_times, self._floors = {}, {}, {}, {}
        self._exposures = {}      # _exposure_key -> exposure_floor
        self._states_alone = {}   # (layout, vpp, cap, V) -> states_alone_can_fit
        # bytes per parameter as planner.cost.stage passes them to model_state_bytes
        facts = facts_for(engine, cluster.gpu)
        self._state_bytes = dict(
            grad_bytes=engine.grad_bytes, weight_bytes=engine.weight_bytes,
            optimizer_bytes=engine.optimizer_bytes, compute_copy_bytes=facts.compute_copy_bytes,
            autocast_copy_bytes=engine.autocast_copy_bytes * (facts.compute_elem_bytes == BF16))

    def coefficients(self, c: Candidate, ranks=None) -> list:
        return stage_coefficients(self.model, self.cluster, c, self.engine, ranks=ranks)

    def _layer_figures(self, c: Candidate) -> dict:
        """Figures of one candidate per class laid out with pp = 1 (one rank, one micro-batch
        in flight): fixed and per-layer times, per-layer recompute time, activations and what
        recomputing a layer frees; per kind (dense, MoE added) where the kinds mix."""
        key = (_shape_key(c), c.recompute, c.recompute_modules)
        got = self._times.get(key)
        if got is None:
            one = _one_rank(c, zero=0)
            k = stage_coefficients(self.model, self.cluster, one, self.engine)[0]
            d = k.moe
            # per micro-batch: the pp = 1 rank holds in_flight of them, which the callers
            # multiply in again
            per = 1.0 / in_flight("1f1b", 1, 0, one.m, 1)
            # as the plan needs them (StageCoeffs.needed: activations churn)
            per *= 1.0 + k.churn_reserve
            act = k.mem_layer.get("activations", 0.0) * per
            act_moe = act + d.mem_layer.get("activations", 0.0) * per if d else act
            mem_rec = k.mem_rec * per
            rec_moe = mem_rec + d.mem_rec * per if d else mem_rec
            # activations a layer keeps whether it is recomputed or not
            kept = (act, act_moe) if c.recompute == "none" else (
                min(act, act - mem_rec), min(act_moe, act_moe - rec_moe))
            got = dict(
                fixed=k.compute_fixed, layer=k.t_layer, moe=d.t_layer if d else 0.0,
                # a layer's weight gradients (a zero-bubble schedule's chain leaves them out)
                wgrad=k.wgrad_layer,
                rec=min(k.t_rec, k.t_rec + d.t_rec) if d else k.t_rec,
                act=min(act, act_moe), saves=max(mem_rec, rec_moe),
                kept_dense=kept[0], kept_moe=kept[1],
                # what the one rank needs of its fixed activations and working memory (the
                # head's, the loss's, a layer's working set), as StageCoeffs.needed, but the
                # gradient buckets, which a candidate of this shape sharding over no other
                # rank does not hold, and the TP overlap's userbuffers, which its twin without
                # the overlap does not (the screens that take this floor reject the twin with it)
                fixed_churn=k.needed({
                    "activations": k.mem_fixed.get("activations", 0.0),
                    "other": k.mem_fixed.get("other", 0.0) - k.userbuffer_bytes
                    - k.bucket_bytes}))
            if k.tp_overlap_slower:
                # the searches try c without the overlap too (enumeration without_tp_overlap):
                # its times, at the same activations, where they are less, so that c's
                # bounds hold for it as well
                plain = self._layer_figures(without_tp_overlap(self.engine, c, False))
                got.update({x: min(got[x], plain[x]) for x in ("fixed", "layer", "moe", "rec")})
                got["wgrad"] = max(got["wgrad"], plain["wgrad"])
            self._times[key] = got
        return got

    def time_bound(self, c: Candidate) -> float:
        """Below quick_bound(c, rules, cap): quick_bound(c) without the recompute term, from
        the times of c's layer shape, which every recompute choice shares (the forward,
        backward and communication of a layer and of the embedding, head and MTP modules:
        planner.cost.stage; tests/test_search_speed_bounds.py checks they agree), built once
        per shape. A hair below, so that last-bit differences between two choices' builds
        cannot lift it above."""
        key = _shape_key(c)
        fig = self._shape_times.get(key)
        if fig is None:
            fig = self._shape_times[key] = self._layer_figures(c)
        return self._pipelined(c, fig["fixed"], fig["layer"], fig["moe"],
                               wgrad=fig["wgrad"]) * (1 - 1e-9)

    def time_floor(self, c: Candidate) -> float:
        """Below time_bound(c), without building any stage coefficients: its pipeline of the
        layers' times at their least (planner.cost.stage time_floor_figures: the compute with
        the TP and CP communication, the dropless host stall and the EP overlap's dispatch at
        their least; the embedding's, head's and MTP modules' compute), so that the search
        builds the figures of the layer shapes it draws only (planner.search).
        tests/test_search_speed_bounds.py checks it."""
        key = _shape_key(c)
        got = self._floors.get(key)
        if got is None:
            got = self._floors[key] = time_floor_figures(self.model, self.cluster, c,
                                                         self.engine)
        fixed, dense, moe = got
        if self.kinds is None and self.model.is_moe:   # every layer MoE: its layer is one
            dense, moe = dense + moe, 0.0
        # where it is time_bound's own figures (no stall, EP overlap or MTP module beyond
        # them), summed in another order: a margin over last-bit differences
        return self._pipelined(c, fixed, dense, moe) * (1 - 1e-6)

    def _pipelined(self, c: Candidate, fixed: float, layer: float, moe: float,
                   recompute: float = 0.0, wgrad: float = math.inf,
                   exposed: float = 0.0) -> float:
        """The step of c's m micro-batches over its pp ranks with `fixed` + L x `layer` (+ the
        MoE layers x `moe` where the kinds mix, + `recompute`) evenly split
        (quick_lower_bound's form; `wgrad`: a layer's weight gradients at most, which a
        zero-bubble schedule's chain leaves out, zero_bubble_floor; inf: no chain).
        `exposed`: what the ranks' exposures (exposure_floor) add to their times at least,
        in every stage's time (planner.cost.schedule.pipeline_time takes the ranks' times
        with them), but a zero-bubble schedule's input-gradient chain, which the floor takes
        without them."""
        L, p = self.model.num_layers, c.pp
        total = (fixed + L * layer + (self.kinds[-1] * moe if self.kinds is not None else 0.0)
                 + recompute)
        mean = (total + exposed) / p
        if c.schedule in ZERO_BUBBLE_SCHEDULES:   # its simulated bubble: zero_bubble_floor
            return zero_bubble_floor(c.m, mean, total, L * wgrad)
        return c.m * mean + (p - 1) * mean / c.vpp

    def in_flight(self, c: Candidate) -> list:
        """Micro-batches in flight per pipeline rank, as planner.cost.stage counts them."""
        key = (c.schedule, c.pp, c.m, c.vpp)
        got = self._in_flight.get(key)
        if got is None:
            sched = self.engine.effective_schedule(c.schedule, c.pp, c.m)
            got = self._in_flight[key] = [in_flight(sched, c.pp, i, c.m, c.vpp)
                                          for i in range(c.pp)]
        return got

    def quick_bound(self, c: Candidate, rules: Rules | None = None, cap: float | None = None,
                    exposed: bool = False) -> float:
        """A lower bound on quick_lower_bound(coefficients of c, c, L, Q); with `rules` and
        `cap`, on lower_bound(...) instead: the stages' times also hold the least recompute
        the pooled memory of the ranks needs (lower_bound's `need`), with the activations of a
        rank's layer those of one micro-batch x the micro-batches it holds in flight (as
        planner.cost.stage prices them) and the model states of `states`. `exposed`: every
        stage's time also holds the exposure_floor, which makes it a bound on the step of
        every placement that fits, no longer below lower_bound (whose pipeline fill leaves
        the exposures out)."""
        fig = self._layer_figures(c)
        L, p = self.model.num_layers, c.pp
        need = 0
        if rules is not None and c.recompute != "none":
            if rules.all_layers_recomputed:
                need = L
            else:
                infl = self.in_flight(c)
                excess = ((self.pooled_states(c) + L * fig["act"] * min(infl)) * (1 - 1e-9)
                          - p * cap)
                saves = fig["saves"] * max(infl) * (1 + 1e-9)
                need = (min(L, max(0, math.ceil(excess / saves)))
                        if saves > 0 and excess > 0 else 0)
        return self._pipelined(c, fig["fixed"], fig["layer"], fig["moe"],
                               need * fig["rec"] if need else 0.0, wgrad=fig["wgrad"],
                               exposed=self.exposure_floor(c) if exposed else 0.0)

    def every_placement_bound(self, c: Candidate) -> float:
        """Below the step of every placement of c, whether it fits or not (an out-of-memory
        candidate's ideal: planner.search rejected_layouts): quick_bound(c) with the
        exposure_floor, without the recompute that fitting would need."""
        fig = self._layer_figures(c)
        return self._pipelined(c, fig["fixed"], fig["layer"], fig["moe"], wgrad=fig["wgrad"],
                               exposed=self.exposure_floor(c))

    def exposure_floor(self, c: Candidate) -> float:
        """Seconds that one micro-batch's ZeRO collectives and offload copies stick out of the
        passes they run beside (StageCoeffs.exposures, priced per rank by
        StageCoeffs.zero_exposed), summed over c's pipeline ranks, at least, on any placement
        of its layers: each rank's is at least its smallest layer bucket and at least its
        collective less its pass, plus the compute the collective slows, so the ranks' sum is
        at least max(pp x the smallest bucket, C - H) + slowdown x C, where C and H, the
        collective and the pass of every layer held once and the embedding's and head's, are
        those of c laid out on one rank with its ZeRO kept (_one_rank: per layer the
        same on every rank; the fixed parts' collectives no less when split over two ranks).
        With the TP overlap, the least of c's and its twin's without it, which the search
        queues at c's bound (enumeration.without_tp_overlap: longer passes hide more). 0
        under Megatron's EP overlap, whose passes depend on the pipeline
        (planner.cost.moe unpaired_pass_share)."""
        if c.ep_comm_overlap or (c.zero < 2 and c.offload_optimizer == "none"
                                 and c.offload_params == "none"):
            return 0.0
        key = _exposure_key(c)
        got = self._exposures.get(key)
        if got is None:
            got = self._exposure_of(_one_rank(c, recompute="none"), c.pp)
            if c.tp_comm_overlap:
                twin = without_tp_overlap(self.engine, c, False)
                if twin is not None:
                    got = min(got, self._exposure_of(_one_rank(twin, recompute="none"),
                                                      c.pp))
            self._exposures[key] = got
        return got

    def _exposure_of(self, one: Candidate, p: int) -> float:
        """exposure_floor of a candidate laid out on one rank (`one`) over `p` ranks."""
        k = stage_coefficients(self.model, self.cluster, one, self.engine)[0]
        D, Q = self._counts if k.moe is not None else (self.model.num_layers, 0)
        d_exp = k.moe.exposures() if k.moe is not None else None
        out = 0.0
        for j, (c_layer, c_fixed, h_layer, h_fixed) in enumerate(k.exposures()):
            dc, dh = (d_exp[j][0], d_exp[j][2]) if d_exp is not None else (0.0, 0.0)
            comm = c_fixed + D * c_layer + Q * (c_layer + dc)
            if comm <= 0:
                continue
            hide = h_fixed + D * h_layer + Q * (h_layer + dh)
            bucket = min(c_layer, c_layer + dc) if Q else c_layer
            out += max(p * bucket, comm - hide) + k.exposure_slowdowns()[j] * comm
        return out * (1 - 1e-9)

    def _copy_floor(self, c: Candidate) -> float:
        """Bytes per linear parameter a low-precision recipe's weight copies take off a
        layer's states (planner.cost.stage: negative where the FP8 primary weight is smaller
        than the bf16 one, planner.precision on_gpu), else 0: what keeps `states` a lower bound."""
        lp = low_precision(self.engine, self.cluster.gpu, c.precision, c.recipe, c.zero,
                           c.offload_optimizer)
        return min(0.0, lp.recipe.weight_copy_bytes) if lp is not None else 0.0

    def states(self, c: Candidate) -> list:
        """Per pipeline rank: (model states of its fixed parts, of one dense layer, of one MoE
        layer), bytes, each at most what planner.cost.stage charges."""
        v_shape = c.schedule in V_SCHEDULES and c.pp > 1   # the head on rank 0
        layout = (c.tp, c.cp, c.pp, c.dp, c.zero, c.ep, c.etp, v_shape, c.offload_optimizer,
                  c.offload_params, c.dp_shard, c.precision, c.recipe)
        out = self._states.get(layout)
        if out is not None:
            return out
        m, t, p = self.model, c.tp, c.pp
        # what stays on the GPU of them under an offload, as planner.cost.stage charges it
        kw = gpu_state_bytes(self.engine, self._state_bytes, c)
        dpc = c.shard       # the ZeRO shard group (dp x cp but under HSDP)

        def held(params, dp=dpc):
            return sum(model_state_bytes(params, dp, c.zero, **kw))

        linear = m.attn_matmul_params_on_rank(t) + m.mlp_matmul_params() / t
        dense = held(linear)
        moe = dense
        if m.is_moe:
            edp = expert_dp(t, c.dp, c.ep, c.etp, c.cp)
            moe = (held(m.attn_matmul_params_on_rank(t) + m.router_params()
                        + m.shared_expert_params() / t)
                   + held((m.num_experts // c.ep) * m.expert_params() / c.etp, edp))
        emb = held(m.vocab_size * m.hidden / t)
        head = held(m.vocab_size * m.hidden / t) if (not m.tied_embeddings or p > 1) else 0.0
        # the weight copies of a layer's linears where they are below 0
        floor, z3 = self._copy_floor(c), c.zero >= 3
        dense += floor * linear / (dpc if z3 else 1)
        if m.is_moe:
            moe += floor * ((m.attn_matmul_params_on_rank(t) + m.shared_expert_params() / t)
                            / (dpc if z3 else 1)
                            + (m.num_experts // c.ep) * (3 if m.gated_mlp else 2) * m.hidden
                            * m.moe_ffn_hidden / c.etp / (edp if z3 else 1))
        else:
            moe = dense
        mtp = m.mtp_layers * (moe if m.moe_layer(m.num_layers - 1) else dense)
        last = 0 if v_shape else p - 1
        out = [((emb if i == 0 else 0.0) + (head + mtp if i == last else 0.0), dense, moe)
               for i in range(p)]
        self._states[layout] = out
        return out

    def _kind_counts(self) -> tuple:
        """(dense layers, MoE layers) of the model."""
        return self._counts

    def pooled_states(self, c: Candidate) -> float:
        """The model states of all ranks together: every layer held once."""
        layout = (c.tp, c.cp, c.pp, c.dp, c.zero, c.ep, c.etp, c.offload_optimizer,
                  c.offload_params, c.dp_shard, c.precision, c.recipe)
        got = self._pooled.get(layout)
        if got is None:
            got = self._pooled[layout] = self._pooled_of(self.states(c))
        return got

    def _pooled_of(self, states: list) -> float:
        D, Q = self._kind_counts()
        _, dense, moe = states[0]
        return sum(fixed for fixed, _, _ in states) + D * dense + Q * moe

    def _most_layers(self, room: float, dense: float, moe: float) -> int:
        """Most layers whose states fit in `room`, the lighter kind first (as many of it as
        the model has), or -1 when not even the fixed parts fit."""
        if room < 0:
            return -1
        L = self.model.num_layers
        D, Q = self._counts
        (a, na), b = ((dense, D), moe) if dense <= moe else ((moe, Q), dense)
        first = na if a <= 0 else min(na, int(room // a))
        if first < na:
            return first
        return min(L, na + (L if b <= 0 else int((room - na * a) // b)))

    def working_floor(self, c: Candidate, figures: bool = False) -> float:
        """Bytes every rank needs beyond its model states and kept activations, whatever its
        layers, as StageCoeffs.needed takes them (churned, with the allocator's reserve):
        - under ZeRO-3 over more than one rank, one layer's gradients unsharded in the
          gradient dtype, which planner.cost.stage holds in "other" at the peak
          (planner.cost.dataparallel zero3_layer_bytes, of the layer's parameters, at least
          its linears');
        - with `figures` and one pipeline rank, its fixed activations and working memory as
          the candidate laid out without ZeRO holds them (_layer_figures fixed_churn: ZeRO
          only adds to them, its gathered weights and gradients)."""
        floor = 0.0
        if c.zero >= 3 and c.shard > 1:
            m, t = self.model, c.tp
            linear = m.attn_matmul_params_on_rank(t) + m.mlp_matmul_params() / t
            floor += self.engine.grad_bytes * linear * (1.0 + self.engine.allocator_reserve)
        if figures and c.pp == 1:
            floor += self._layer_figures(c)["fixed_churn"]
        return floor

    def states_alone_can_fit(self, c: Candidate, cap: float) -> bool:
        """states_can_fit's screen of the model states alone (no activations kept): False
        only where states_can_fit is False; needs no layer figures."""
        key = (c.tp, c.cp, c.pp, c.dp, c.zero, c.ep, c.etp, c.vpp, cap,   # states' layout
               c.schedule in V_SCHEDULES and c.pp > 1,                   # (head on rank 0)
               c.offload_optimizer, c.offload_params, c.dp_shard, c.precision, c.recipe)
        got = self._states_alone.get(key)
        if got is None:
            got = self._states_alone[key] = self._states_fit(
                self.states(c), cap * (1 + 1e-9) - self.working_floor(c), c.vpp)
        return got

    def states_can_fit(self, c: Candidate, cap: float) -> bool:
        """False when the model states and the activations every layer keeps however much is
        recomputed overflow `cap` on some rank under every placement (each rank at least one
        layer per chunk, the L layers held once), which makes every placement overflow in the
        full memory model: the rest (working buffers, logits) only adds. A rank holding n
        layers holds at least those of the n lightest the model has, and all ranks together
        those of every layer. (A hair of slack keeps float rounding on the safe side.)"""
        room, L = cap * (1 + 1e-9) - self.working_floor(c, figures=True), self.model.num_layers
        states = self.states(c)
        # the model states alone first (the kept activations, >= 0, only add): a candidate
        # failing here needs no figure of its own
        if not self._states_fit(states, room, c.vpp):
            return False
        fig = self._layer_figures(c)
        kd, km = fig["kept_dense"] * (1 - 1e-9), fig["kept_moe"] * (1 - 1e-9)
        infl = self.in_flight(c)
        D, Q = self._kind_counts()
        if self.pooled_states(c) + (D * kd + Q * km) * min(infl) > room * len(states):
            return False
        total = 0
        for (fixed, dense, moe), fl, lo in zip(states, infl,
                                               V.rank_min_layers(self.engine, c.pp, c.vpp)):
            n = self._most_layers(room - fixed, dense + kd * fl, moe + km * fl)
            if n < lo:
                return False
            total += n
        return total >= L

    def _states_fit(self, states: list, room: float, v: int) -> bool:
        """states_can_fit with no activations kept: the model states alone."""
        if self._pooled_of(states) > room * len(states):
            return False
        total = 0
        for (fixed, dense, moe), lo in zip(states,
                                           V.rank_min_layers(self.engine, len(states), v)):
            n = self._most_layers(room - fixed, dense, moe)
            if n < lo:
                return False
            total += n
        return total >= self.model.num_layers

    def states_overflow_gib(self, c: Candidate, budget) -> float:
        """A lower bound on max(overflow_gib()) of c's heuristic placement (the even split):
        the most bytes the model states alone need on any rank (StageCoeffs.needed: as
        allocated), less the capacity."""
        model = self.model
        split = V.default_split(self.engine, model.num_layers, c.pp, c.vpp)
        if self.kinds is not None:
            qs, _ = moe_counts(model, c.pp, c.vpp, split, [0] * c.pp)
        else:
            qs = split if model.is_moe else [0] * c.pp
        worst = max(fixed + (n - q) * dense + q * moe
                    for (fixed, dense, moe), n, q in zip(self.states(c), split, qs))
        return worst / GIB - budget.usable_gib


def states_per_gpu_bound(model: Model, engine: Engine, num_gpus: int,
                         offload: bool = False) -> float:
    """Bytes of model states that the busiest GPU of any candidate on `num_gpus` GPUs holds at
    least: every parameter's weight, gradient and optimizer state is held at least once over
    the cluster (ZeRO-3 shards each over dp x cp, the experts over expert-dp, which folding
    makes exact: planner.rules.ep_blockers; lower stages keep more), counting the
    parameters SharedCoefficients.states counts. Above the capacity, nothing fits."""
    m = model
    D, Q = ((m.num_layers - m.num_moe_layers, m.num_moe_layers) if m.is_moe
            else (m.num_layers, 0))
    dense = m.attn_matmul_params() + m.mlp_matmul_params()
    moe = (m.attn_matmul_params() + m.router_params() + m.shared_expert_params()
           + m.num_experts * m.expert_params()) if m.is_moe else dense
    params = (D * dense + Q * moe + m.vocab_size * m.hidden
              + (0 if m.tied_embeddings else m.vocab_size * m.hidden)
              + m.mtp_layers * (moe if m.moe_layer(m.num_layers - 1) else dense))
    # FP8 primary weights may be a byte under bf16 (planner.precision on_gpu: Blackwell)
    weight = engine.weight_bytes - (TE_FP8_TRANSPOSE_BYTES
                                    if engine.lowp_library == "te_fp8_params"
                                    or engine.zero3_fp8_primary_weights else 0.0)
    per = weight + engine.grad_bytes + engine.optimizer_bytes
    if offload and not m.is_moe:
        # what the engine's offloads may leave on the GPUs (planner.cost.offload
        # gpu_state_bytes): no optimizer states, no gradients where they live on the host, no
        # parameters where it offloads them
        per = ((0.0 if engine.offload_param_devices else weight)
               + (0.0 if engine.offload_grads_each_microbatch else engine.grad_bytes)
               + (0.0 if engine.offload_optimizer_devices else engine.optimizer_bytes))
    return params * per / num_gpus




# ---- the exact bound of a one-chunk placement of dense and MoE layers ---------------------

@functools.lru_cache(maxsize=32)
def _stage_windows(P: tuple) -> tuple:
    """Every stage a pipeline rank can hold with one chunk (contiguous layers [a, a + n) in
    model order, n >= 1) and every count r <= n of them recomputed (the stage's first r,
    planner.layout.make_stages), for a model whose MoE layers have prefix counts P: arrays
    over those (a, n, r) in (a, n, r) order of a, n, r, q (MoE layers held) and rq (MoE
    layers recomputed); the first index of each (a, n) and its a and b = a + n."""
    L = len(P) - 1
    Pa = np.asarray(P, dtype=np.int64)
    a_w, n_w = zip(*[(a, n) for a in range(L) for n in range(1, L - a + 1)])
    a_w, n_w = np.asarray(a_w), np.asarray(n_w)
    sizes = n_w + 1
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    a = np.repeat(a_w, sizes)
    n = np.repeat(n_w, sizes)
    r = np.arange(sizes.sum()) - np.repeat(starts, sizes)
    q = Pa[a + n] - Pa[a]
    rq = Pa[a + r] - Pa[a]
    f = lambda x: x.astype(float)   # noqa: E731
    return f(a), f(n), f(r), f(q), f(rq), starts, a_w, a_w + n_w, n_w


def _chain(values: np.ndarray, combine) -> np.ndarray:
    """Over every chain of p stages [B_i, B_i+1) with 0 = B_0 < ... < B_p = L: the least of
    combine(...) of stage i's value values[..., i, B_i, B_i+1] (inf: not allowed), folded
    rank by rank (np.maximum: the slowest stage; np.add: the sum)."""
    *lead, p, n1, _ = values.shape
    best = np.full((*lead, n1), np.inf)
    best[..., 0] = 0.0
    for i in range(p):
        best = combine(best[..., :, None], values[..., i, :, :]).min(axis=-2)
    return best[..., -1]


def placement_bound(coeffs, c: Candidate, cap: float, rules: Rules, P: list) -> float:
    """A step time no placement of this candidate can beat, in the exact CP-SAT model of
    planner.search.placement (its objective m*max T + sum T - max T + max tail at one chunk
    per rank), for a model of dense and MoE layers (prefix counts P) laid out with one chunk
    per pipeline rank: every stage a rank can hold ([a, a + n), its first r recomputed, q and
    rq of those MoE: the exact StageCoeffs.time, memory and tail of each) is priced at its
    fastest recompute count that fits (any the engine allows: below Megatron's one count for
    every chunk), stages that overflow `cap` at every count are left out, and the slowest
    stage, the stages' sum and the slowest tail are each minimised over every chain of stages
    covering the layers (shortest paths). Each minimum is at most its part of any placement's
    objective: a lower bound, and inf when no placement fits. Where lower_bound counts a
    rank's MoE layers from the windows each rank alone could take, this places the dense
    layers once. (Float slack keeps rounding on the safe side.)"""
    Pt = tuple(P)
    L = len(Pt) - 1
    a, n, r, q, rq, starts, a_w, b_w, n_w = _stage_windows(Pt)
    lo, hi = _recompute_bounds(c, rules)
    p = len(coeffs)
    moe = [k.moe for k in coeffs]

    def col(values):   # one figure per rank, ranks along the first axis
        return np.asarray(values, dtype=float)[:, None]

    def square(x):   # ... x (a, n) -> ... x (a, b) matrices, inf where no stage
        out = np.full((*x.shape[:-1], L + 1, L + 1), np.inf)
        out[..., a_w, b_w] = x
        return out

    # each stage (a, n) with nothing recomputed, then what each recomputed layer changes
    nw, qw = n[starts], q[starts]
    mem0 = (col([k.needed_fixed() for k in coeffs]) + nw * col([k.needed_layer()
                                                                 for k in coeffs])
            + qw * col([d.needed_layer() for d in moe]))
    rec, moe_rec = col([k.needed_rec for k in coeffs]), col([d.needed_rec for d in moe])
    room = cap * (1 + 1e-9)
    if (rec >= 0).all() and (rec + moe_rec >= 0).all():
        # every recomputed layer, dense or MoE, frees bytes: a stage fits on some allowed
        # count where it fits at the most it may recompute
        fits_any = mem0 - hi * (nw * rec + qw * moe_rec) <= room      # ranks x (a, n)
    else:
        fits_any = None
    if fits_any is not None:
        reach = np.zeros(L + 1, bool)   # the layer boundaries chains of fitting stages reach
        reach[0] = True
        for i in range(p):
            nxt = np.zeros(L + 1, bool)
            nxt[b_w[fits_any[i] & reach[a_w]]] = True
            reach = nxt
        if not reach[L]:
            return math.inf
    t0 = (col([k.t_fixed for k in coeffs]) + nw * col([k.t_layer for k in coeffs])
          + qw * col([d.t_layer for d in moe]))
    tl = (col([k.opt_fixed for k in coeffs]) + nw * col([k.opt_layer for k in coeffs])
          + qw * col([d.opt_layer for d in moe]))
    for j in range(2):   # the ZeRO-2/3 collectives' exposure, and the tail's
        t0 = t0 + np.stack([exposed_comm_array(*k.exposures()[j], k.overlap_slowdown, nw,
                                               qw, d.exposures()[j][0], d.exposures()[j][2])
                            for k, d in zip(coeffs, moe)])
        tl = tl + np.stack([exposed_comm_array(*k.tail_exposures()[j], k.overlap_slowdown, nw,
                                               qw, d.tail_exposures()[j][0],
                                               d.tail_exposures()[j][2])
                            for k, d in zip(coeffs, moe)])
    t_rec, moe_t_rec = col([k.t_rec for k in coeffs]), col([d.t_rec for d in moe])
    if fits_any is not None and (t_rec >= 0).all() and (t_rec + moe_t_rec >= 0).all():
        # each recomputed layer adds time and frees bytes: a stage's fastest count that fits
        # is its least, found by bisection
        Pa = np.asarray(Pt, dtype=float)
        first = Pa[a_w]
        least = np.broadcast_to(n_w if lo == 1 else 0 * n_w, fits_any.shape)
        if lo == 0 and hi == 1:
            low, high = np.zeros(fits_any.shape, int), np.broadcast_to(n_w, fits_any.shape)
            while (low < high).any():
                mid = (low + high) // 2
                fit = (mem0 - (mid * rec + (Pa[a_w + mid] - first) * moe_rec) <= room) | (
                    low == high)
                low, high = np.where(fit, low, mid + 1), np.where(fit, mid, high)
            least = low
        stage_t = np.where(fits_any, t0 + least * t_rec + (Pa[a_w + least] - first) * moe_t_rec,
                           np.inf)
    else:   # every allowed count of every stage
        allowed = (r == n) if lo == 1 else (r == 0) if hi == 0 else np.ones(r.shape, bool)
        group = np.repeat(np.arange(len(starts)), n_w + 1)   # the stage of each (a, n, r)
        ok = allowed & (mem0[:, group] - r * rec - rq * moe_rec <= room)   # ranks x (a, n, r)
        if fits_any is None:
            fits_any = np.logical_or.reduceat(ok, starts, axis=1)
        times = np.where(ok, t0[:, group] + r * t_rec + rq * moe_t_rec, np.inf)
        stage_t = np.minimum.reduceat(times, starts, axis=1)
    tail = _chain(square(np.where(fits_any, tl, np.inf)), np.maximum)
    m = c.m
    zb = c.schedule in ZERO_BUBBLE_SCHEDULES

    def bound(stages):   # stages: ranks x a x b
        t_max = _chain(stages, np.maximum)
        if zb:   # objective m * max T + max tail
            best = m * t_max
        elif math.isinf(t_max):   # no chain of stages fits
            best = t_max
        else:
            best = (m - 1) * t_max + _chain(stages, np.add)
        out = best + tail
        return float(out * (1 - 1e-9)) if math.isfinite(out) else math.inf

    # each rank its best allowed count (below Megatron's one count for every chunk, which
    # pruned no more on deepseek-v3's solves)
    return bound(square(stage_t))
