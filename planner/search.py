"""The search: enumerate outer choices, prune with bounds, place layers with CP-SAT.

Outer choices (tp, pp, dp, ZeRO stage, sequence parallel, micro-batch, schedule/vpp,
recompute granularity) are enumerated; any fixed on the command line is not searched. For each
candidate:

0. before any stage coefficients are built: a screen on the model states (from the parameter
   counts) and the activations a layer keeps however much is recomputed, which only rejects
   candidates that no placement fits (SharedCoefficients), and a cheap bound on the step time
   (from figures shared by the candidates of one layer shape) that orders the rest: they are
   visited best-first, and once that bound exceeds the K-th best heuristic plan the rest are
   never priced;
1. a memory feasibility test that is exact for the count problem: rank s can hold at most
   N_s layers even with every layer recomputed; the candidate is infeasible if sum(N_s) < L;
2. a lower bound on its step time (perfectly balanced stages, no recompute, no exposed tail);
3. candidates are visited in lower-bound order, and solved exactly only while the bound can
   still beat the K-th best plan found so far.

The exact step is a CP-SAT model over counts -- identical layers are interchangeable, so each
pipeline rank s gets an integer n_s (layers held) and r_s (layers recomputed), never a binary per
layer. It minimises  m*max_s T_s + (sum_s T_s - max_s T_s)/v + max_s tail_s  subject to each
rank's memory limit, where T_s, tail_s and memory are the linear coefficients of
planner.cost.stage (the same expressions `evaluate` uses).
"""
from __future__ import annotations

import bisect
import functools
import heapq
import math
import time
from dataclasses import dataclass, field, fields

import numpy as np
from ortools.sat.python import cp_model

from planner import validity as V
from planner.bounds import divisors
from planner.cost.memory import GIB, model_state_bytes
from planner.cost.moe import (candidate_dispatcher, expert_dp, layer_kinds, moe_counts,
                              replace_coeffs)
from planner.cost.compute import BF16
from planner.cost.facts import facts_for
from planner.cost.context import cp_exchange
from planner.cost.recompute import DEFAULT_MODULES, cheap_modules
from planner.cost.schedule import in_flight
from planner.cost.stage import (Candidate, capacity_bytes, exposed_comm_array, memory_budget,
                                stage_coefficients)
# the one price of a placement; candidate_of (a saved plan's candidate) kept importable here
from planner.cost.price import candidate_of, price  # noqa: F401
from planner.engines import get_engine
from planner.engines.spec import EQUAL_SPLIT, PER_CHUNK, Engine
from planner.errors import BadInput
from planner.plan import Batch, Parallelism, Plan, even_split, make_stages
from planner.precision import default_recipe
from planner.rules_fixed import check_fixed   # the rules layer's, for the fixed CLI values
from planner.specs import Cluster, Model

# Default tokens per step: Llama 3 pre-training started at 4M tokens per batch
# (Dubey et al. 2024, Sec. 3.4.1).
DEFAULT_TOKENS_PER_STEP = 4 * 2 ** 20
DEFAULT_MAX_SEQ_LEN = 8192         # Llama 3's pre-training context
# The searched space (search choices, not cost-model figures): micro-batches beyond 16 and
# more than 4 virtual stages per rank rarely pay off and multiply the candidates.
MICRO_BATCHES = (1, 2, 4, 8, 16)
SEARCHED_VPP = (2, 3, 4)
# CP-SAT works in integers: times are counted in units of (a step estimate) / TIME_UNITS, fine
# enough that rounding moves a step by ~1e-6, coarse enough to keep the solver fast.
TIME_UNITS = 1e8
SOLVER_SECONDS = 2.0               # per candidate; a FEASIBLE answer past it reports its gap


@dataclass
class Fixed:
    """Dimensions the user fixed; None = search it."""
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    zero: int | None = None
    mbs: int | None = None
    vpp: int | None = None
    recompute: str | None = None
    # what selective recompute recomputes (planner.cost.recompute.MODULES); None: the
    # attention core, or searched beside it where the engine recomputes modules
    recompute_modules: tuple | None = None
    sp: bool | None = None
    schedule: str | None = None
    flash: bool = True        # software assumption, not searched
    # fixed by the user, never searched (planner.precision): the block linears' precision
    # and the engine's scaling recipe for it (None: the engine's default)
    precision: str = "bf16"
    recipe: str | None = None
    # expert parallelism of an MoE model and its expert tensor parallelism
    ep: int | None = None
    etp: int | None = None
    # context parallelism (None: searched where the engine has it) and its K/V exchange
    # (None: searched among the engine's)
    cp: int | None = None
    cp_comm_type: str | None = None
    # TP collectives overlapped with the GEMMs where the engine offers it (tp > 1 with sp);
    # False: priced and exported without (plan --no-tp-comm-overlap)
    tp_comm_overlap: bool = True
    # MoE: the token dispatcher (None: the cheapest the engine has, planner.cost.moe) and the
    # EP all-to-alls overlapped across micro-batches where the engine offers it and the layout
    # allows (planner.validity.ep_comm_overlap_blockers); False: priced and exported without
    # (plan --no-ep-comm-overlap)
    moe_dispatcher: str | None = None
    ep_comm_overlap: bool = True
    # MoE token dropping: experts padded to this capacity factor (None: dropless); the user's
    # choice, never searched (it changes what the model trains on)
    moe_capacity_factor: float | None = None
    # MoE routing imbalance assumed (>= 1: the busiest expert rank's tokens over its balanced
    # share; 1: balanced, as benchmarks force it), priced in time and memory, never searched
    moe_imbalance: float = 1.0
    # decoder layers per pipeline rank, in rank order (None: placed by the search); each
    # rank's layers are split evenly over its virtual stages (planner.plan.make_stages)
    stage_layers: tuple | None = None


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


@dataclass
class SearchReport:
    best: Result | None
    ranked: list                 # fitting results, best first (top K)
    candidates: int              # outer configurations enumerated
    pruned_memory: int
    pruned_bound: int
    solved: int
    seconds: float
    closest: Result | None = None   # smallest overflow when nothing fits
    rejected: list = field(default_factory=list)   # (Candidate, reason) samples
    seq_len: int = 0
    global_batch: int = 0
    engine: object = None            # the Engine planned for
    margin_gib: float | None = None  # --memory-margin (None: the default)
    # the whole search: (best - least bound of any candidate not solved to optimality) / best,
    # and the candidates whose solve stopped at SOLVER_SECONDS
    gap: float = 0.0
    solver_limit_hit: int = 0
    # quick_lower_bound of rejected candidates whose coefficients the search computed
    rejected_bounds: dict = field(default_factory=dict)
    # the rejected layouts explain shows beside the plan (RejectedLayout, fastest ideal first;
    # filled by search(rejected=True) when a plan fits)
    rejected_layouts: list = field(default_factory=list)


def default_seq_len(model: Model) -> int:
    return min(model.max_seq_len, DEFAULT_MAX_SEQ_LEN)


def default_global_batch(seq_len: int, num_gpus: int) -> int:
    """4M tokens, and at least one sequence per 8 GPUs (Llama 3 405B trained with 16M-token
    batches of 8K sequences on 16K GPUs: Dubey et al. 2024, Sec. 3.3.2 and 3.4.1)."""
    tokens = 2 ** round(math.log2(DEFAULT_TOKENS_PER_STEP / seq_len))
    return max(1, tokens, 2 ** math.ceil(math.log2(max(1, num_gpus // 8))))


def searched_recompute(engine: Engine, f: Fixed, model: Model) -> list:
    """(granularity, selective modules) pairs to try. A count-based granularity (any number of
    a rank's layers, 0 included) covers "none"; an every-layer-or-none one needs "none" beside
    it. Selective recompute of the attention core only saves memory when attention scores are
    materialised (no flash); where the engine recomputes modules (Megatron), the
    output-discarding ones that apply to the model are tried too (planner.cost.recompute)."""
    if f.recompute:
        return [(f.recompute, f.recompute_modules or DEFAULT_MODULES)]
    modes = [g for g in engine.recompute_modes if not (g == "selective" and f.flash)]
    if all(engine.all_layers_recomputed(g) for g in modes):
        modes = ["none"] + modes
    out = [(g, DEFAULT_MODULES) for g in modes]
    cheap = tuple(x for x in cheap_modules(model) if x in engine.recompute_modules)
    if cheap and "selective" in engine.recompute_modes:
        out.append(("selective", cheap))
    return out


def searched_cp(model: Model, cluster: Cluster, f: Fixed, seq_len: int, tp: int,
                engine: Engine) -> list:
    """(cp, comm type) pairs to try with tensor parallelism tp: cp over the divisors of the
    GPUs left by tp that split the sequence into 2*cp chunks, each with the engine's K/V
    exchanges that can split the model (a fixed --cp / --cp-comm-type is not searched)."""
    n = cluster.num_gpus
    if f.cp is not None:
        cps = [f.cp]
    elif not engine.cp_comm_types or not f.flash:
        cps = [1]
    else:
        cps = [c for c in divisors(n // tp) if V.cp_ok(seq_len, c)]
    out = []
    for cp in cps:
        if cp == 1:
            out.append((1, f.cp_comm_type or (engine.cp_comm_types or ("p2p",))[0]))
            continue
        kinds = [f.cp_comm_type] if f.cp_comm_type else list(engine.cp_comm_types)
        out += [(cp, k) for k in kinds
                if not V.cp_problems(model, seq_len, tp, cp, k, f.flash)]
    return out


def enumerate_candidates(model: Model, cluster: Cluster, f: Fixed, seq_len: int, gbs: int,
                         engine: Engine | None = None) -> list:
    engine = get_engine(engine)
    n = cluster.num_gpus
    tps = [f.tp] if f.tp else [t for t in divisors(n) if V.tp_allowed(engine, cluster, model, t)]
    out = []
    for tp in tps:
        exchanges = [(cp, k) for cp, k in searched_cp(model, cluster, f, seq_len, tp, engine)
                     if not n % (tp * cp)]
        dominated = _dominated_cp_exchanges(model, cluster, engine, seq_len, f.flash, tp,
                                            exchanges)
        for cp, cp_comm in exchanges:
            out += _candidates_of(model, cluster, f, seq_len, gbs, engine, tp, cp, cp_comm,
                                  dominated)
    return out


def _dominated_cp_exchanges(model, cluster, engine, seq_len: int, flash: bool, tp: int,
                            exchanges: list):
    """A predicate (mbs, cp, sp, exchange) -> the K/V exchange is dominated, for the
    (cp, exchange) pairs searched with tensor parallelism tp: a sibling (the same candidate
    with another exchange) adds no more forward, backward and recompute time and keeps no
    more buffer bytes, one of them strictly less. The exchange enters the cost model only
    through those figures (planner.cost.stage: cp_layer, cp_rec, the compute collectives
    hide behind, monotone in them, and the working memory), so the sibling is at least as
    fast and fits wherever this one fits: a sound pruning, applied before the candidates are
    made. Every exchange of a (tp, cp) gets the same candidates (_candidates_of does not
    depend on it), so the sibling is always a candidate too; the figures depend only on the
    shape (micro-batch, sequence, tp, cp, sp, kernels)."""
    facts = facts_for(engine, cluster.gpu)
    kinds_of, dominated = {}, {}
    for cp, k in exchanges:
        if cp > 1:
            kinds_of.setdefault(cp, set()).add(k)

    def is_dominated(mbs: int, cp: int, sp: bool, cp_comm: str) -> bool:
        if cp == 1:
            return False
        shape = (mbs, cp, sp)
        if shape not in dominated:
            lt = facts.layer_time(model, mbs, seq_len, tp, sp, flash, cp=cp)
            figs = {}
            for k in kinds_of[cp]:
                x = cp_exchange(model, mbs, seq_len, tp, cp, k, cluster, lt.attn_fwd)
                figs[k] = (x.fwd, x.bwd, x.buffer_bytes)
            dominated[shape] = {k for k, a in figs.items()
                                if any(b != a and all(y <= x for x, y in zip(a, b))
                                       for o, b in figs.items() if o != k)}
        return cp_comm in dominated[shape]

    return is_dominated


def _candidates_of(model, cluster, f, seq_len, gbs, engine, tp, cp, cp_comm,
                   dominated=None) -> list:
    """The candidates with tensor parallelism tp and context parallelism cp, but those whose
    exchange is `dominated` (mbs, cp, sp, exchange)."""
    n, L = cluster.num_gpus, model.num_layers
    out = []
    if not engine.pipelines:
        pps = [1]
    else:
        pps = [f.pp] if f.pp else [p for p in divisors(n // (tp * cp)) if V.pp_ok(model, p)]
    if engine.stage_layers == EQUAL_SPLIT:
        pps = [p for p in pps if L % p == 0]
    for pp in pps:
        if n % (tp * cp * pp):
            continue
        dp = n // (tp * cp * pp)
        if f.dp and dp != f.dp:
            continue
        if not V.batch_ok(gbs, dp):
            continue
        per_dp = gbs // dp
        mbss = [f.mbs] if f.mbs else [b for b in MICRO_BATCHES if per_dp % b == 0]
        # ZeRO shards over dp x cp (weights are replicated over cp)
        zeros = [z for z in ([f.zero] if f.zero is not None else [0, 1, 2, 3])
                 if engine.zero_ok(z, tp, pp, dp, cp)]
        sps = ([s for s in ([f.sp] if f.sp is not None else engine.sp_choices)
                if s in engine.sp_choices and (not s or V.sp_ok(tp, seq_len, cp))]
               if tp > 1 else [False])
        if pp == 1:
            scheds = [("1f1b", 1)]
        else:
            scheds = []
            for sch in ([f.schedule] if f.schedule else list(engine.schedules)):
                if sch == "interleaved":
                    vpps = [f.vpp] if f.vpp and f.vpp > 1 else list(SEARCHED_VPP)
                    scheds += [(sch, v) for v in vpps if V.pp_ok(model, pp, v)
                               and (f.stage_layers is None or min(f.stage_layers) >= v)]
                elif f.vpp in (None, 1):
                    scheds.append((sch, 1))
        recs = searched_recompute(engine, f, model)
        experts = expert_layouts(model, f, engine, tp, dp, cp)
        dispatcher_fixed = (f.moe_dispatcher or "") if model.is_moe else ""
        capacity = f.moe_capacity_factor if model.is_moe else None
        imbalance = f.moe_imbalance if model.is_moe else 1.0
        if model.is_moe:
            if tp > 1 and engine.moe_tp_needs_sp:   # planner.validity's rule, engine data
                sps = [x for x in sps if x]
            if layer_kinds(model) and pp > 1 and not f.vpp:
                # dense and MoE layers mixed: interleaving only where asked for (--vpp; then
                # placed exactly). Searched, its chunk-level placements multiply the exact
                # solves (deepseek-v3 on h100x256: 105 s instead of 19 s, no faster plan found)
                scheds = [(sch, v) for sch, v in scheds if v == 1]
        overlaps = {}   # (ep, schedule) -> _recompute_and_ep_overlap of this pp
        for mbs in mbss:
            if per_dp % mbs:
                continue
            m = per_dp // mbs
            for sch, v in scheds:
                if sch == "interleaved" and not V.interleaved_ok(m, pp):
                    continue
                for zero in zeros:
                    if zero and dp * cp == 1:
                        continue
                    for sp in sps:
                        if sp and tp == 1:
                            continue
                        if dominated is not None and dominated(mbs, cp, sp, cp_comm):
                            continue
                        for ep, etp in experts:
                            if not engine.ep_layout_ok(ep, etp, tp, zero, model.is_moe):
                                continue
                            if dispatcher_fixed == "flex" and not V.flex_ok(ep, etp):
                                continue
                            if (ep, sch) not in overlaps:
                                overlaps[(ep, sch)] = _recompute_and_ep_overlap(
                                    recs, f, engine, ep, pp, sch, dispatcher_fixed,
                                    model.mtp_layers)
                            for (rec, mods), overlap in overlaps[(ep, sch)]:
                                out.append(_candidate(dict(
                                    tp=tp, pp=pp, dp=dp, zero=zero, sp=sp, mbs=mbs,
                                    seq_len=seq_len, global_batch=gbs, schedule=sch, vpp=v,
                                    recompute=rec, recompute_modules=mods,
                                    flash=f.flash, precision=f.precision,
                                    recipe=f.recipe, cp=cp, cp_comm=cp_comm, ep=ep, etp=etp,
                                    tp_comm_overlap=(f.tp_comm_overlap and sp
                                                     and engine.tp_comm_overlap),
                                    moe_dispatcher=dispatcher_fixed, ep_comm_overlap=overlap,
                                    moe_capacity_factor=capacity,
                                    moe_imbalance=imbalance)))
    return out


CANDIDATE_FIELDS = frozenset(x.name for x in fields(Candidate))


def _candidate(values: dict) -> Candidate:
    """Candidate(**values) for the enumeration's many, every field given: what the frozen
    dataclass's __init__ does (it only sets the fields; no __post_init__) without its cost."""
    if len(values) != len(CANDIDATE_FIELDS):   # a field added to Candidate: give it here
        raise TypeError(f"Candidate fields {sorted(CANDIDATE_FIELDS - values.keys())} missing")
    out = object.__new__(Candidate)
    out.__dict__.update(values)
    return out


def _recompute_and_ep_overlap(recs, f: Fixed, engine: Engine, ep: int, pp: int, sch: str,
                              dispatcher_fixed: str, mtp_layers: int = 0) -> list:
    """(recompute, ep_comm_overlap) pairs of a layout: each searched recompute, with the EP
    overlap where the engine offers it and the layout allows; Megatron's overlap excludes
    full recompute, so a layout recomputing "full" (any number of layers, 0 included) gets a
    "none" twin with the overlap beside it."""
    def allowed(rec):
        return (f.ep_comm_overlap and engine.ep_comm_overlap and not V.ep_comm_overlap_blockers(
            ep, pp, sch, rec[0], dispatcher_fixed or "alltoall", mtp_layers, rec[1]))
    out = [(rec, allowed(rec)) for rec in recs]
    none = ("none", DEFAULT_MODULES)
    if all(g != "none" for g, _ in recs) and f.recompute is None and allowed(none):
        out.append((none, True))
    return out


def expert_layouts(model: Model, f: Fixed, engine: Engine, tp: int, dp: int,
                   cp: int = 1) -> list:
    """(ep, etp) choices of a (tp, dp) grid: (1, 1) for a dense model; for an MoE model every
    ep dividing the experts and etp in {1, tp} (the experts' tensor parallelism inside the
    attention's NVLink group, where it pays) that the engine runs and MoE parallel folding
    allows (planner.validity.ep_ok)."""
    if not model.is_moe:
        return [(1, 1)]
    eps = [f.ep] if f.ep else divisors(model.num_experts)
    etps = [f.etp] if f.etp else sorted({1, tp})
    return [(ep, etp) for etp in etps for ep in eps
            if V.ep_ok(model, ep, etp, tp, dp, cp)]


def _pipeline_free(c: Candidate) -> Candidate:
    """c laid out on one pipeline rank (pp 1, 1F1B) without ZeRO: dataclasses.replace of
    the frozen Candidate (no __post_init__) without its cost."""
    out = object.__new__(Candidate)
    out.__dict__.update(c.__dict__, pp=1, vpp=1, schedule="1f1b", zero=0)
    return out


def lower_coeffs(k):
    """Stage coefficients no layer of either kind is below (per-layer time and memory the
    smaller kind's, hiding compute and recompute savings the larger's): bounds and memory
    pruning computed on them are sound for any placement of dense and MoE layers."""
    if k.moe is None:
        return k
    d = k.moe
    lo = {f: min(getattr(k, f), getattr(k, f) + getattr(d, f))
          for f in ("compute_layer", "compute_rec", "tp_layer", "tp_rec", "ep_layer", "ep_rec",
                    "zf_layer", "zb_layer", "grad_layer", "gather_layer", "opt_layer")}
    hi = {f: max(getattr(k, f), getattr(k, f) + getattr(d, f))
          for f in ("fwd_layer", "bwd_layer", "mem_rec")}
    mem = {key: min(val, val + d.mem_layer.get(key, 0.0)) for key, val in k.mem_layer.items()}
    return replace_coeffs(k, moe=None, mem_layer=mem, **lo, **hi)


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


def rules_for(engine: Engine, c: Candidate, f: Fixed | None = None) -> Rules:
    recompute_fixed = f is not None and f.recompute not in (None, "none")
    return Rules(all_layers_recomputed=(recompute_fixed
                                        or engine.all_layers_recomputed(c.recompute)),
                 per_chunk=engine.recompute_count(c.recompute) == PER_CHUNK,
                 equal_split=engine.stage_layers == EQUAL_SPLIT,
                 fixed_split=f.stage_layers if f is not None and c.pp > 1 else None)


def _recompute_bounds(c: Candidate, rules: Rules):
    """(lo, hi) fraction of a rank's layers that may be recomputed."""
    if c.recompute == "none":
        return 0, 0
    return (1, 1) if rules.all_layers_recomputed else (0, 1)


def max_layers(coeffs, cap: float, v: int, rules: Rules, c: Candidate,
               lower: bool = False) -> list:
    """Most layers each rank can hold, recomputing all it may. `lower`: of the coefficients'
    lower_coeffs (the same figures, without building them)."""
    lo, hi = _recompute_bounds(c, rules)
    out = []
    for k in coeffs:
        if lower and k.moe is not None:   # lower_coeffs' mem_layer and mem_rec
            d = k.moe
            per = (sum(min(val, val + d.mem_layer.get(key, 0.0))
                       for key, val in k.mem_layer.items())
                   - hi * max(k.mem_rec, k.mem_rec + d.mem_rec))
        else:
            per = k.mem_total_layer() - hi * k.mem_rec
        room = cap - k.mem_total_fixed()
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
    return np.where(pos, np.where(r <= n, r, np.inf), np.where(mem0 <= cap, 0.0, np.inf))


def _with_exposures(t, coeffs, n):
    """t (ranks x layer counts) plus each rank's ZeRO-2/3 exposure with n layers
    (planner.cost.stage.exposed_comm_array, StageCoeffs.exposed_comm over arrays)."""
    slow = _stacked([k.overlap_slowdown for k in coeffs])
    for j in range(2):
        e = [k.exposures()[j] for k in coeffs]
        if any(x[0] > 0 or x[1] > 0 for x in e):
            cl, cf, hl, hf = (_stacked(col) for col in zip(*e))
            t = t + exposed_comm_array(cl, cf, hl, hf, slow, n)
    return t


def _rank_min_times(coeffs, L: int, v: int, cap: float, c: Candidate, rules: Rules):
    """Least per-micro-batch time of each rank holding n = v, v+1, ... layers (inf if n cannot
    fit): (n, ranks x n times)."""
    n = np.arange(v, L + 1, dtype=float)
    mem0 = (_stacked([k.mem_total_fixed() for k in coeffs])
            + n * _stacked([k.mem_total_layer() for k in coeffs]))
    r = _least_recompute(mem0, _stacked([k.mem_rec for k in coeffs]), n, cap, c, rules)
    with np.errstate(invalid="ignore"):
        t = (_stacked([k.t_fixed for k in coeffs]) + n * _stacked([k.t_layer for k in coeffs])
             + np.where(np.isfinite(r), r * _stacked([k.t_rec for k in coeffs]), np.inf))
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


def _rank_min_times_kinds(coeffs, low, L: int, Q: int, v: int, cap: float, c: Candidate,
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

    mem0 = (col([k.mem_total_fixed() for k in coeffs]) + n * col([k.mem_total_layer()
                                                                   for k in coeffs])
            + q * col([sum(k.moe.mem_layer.values()) for k in coeffs]))
    save = col([max(k.mem_rec, k.mem_rec + k.moe.mem_rec) for k in coeffs])
    r = np.where(ok, _least_recompute(mem0, save, n, cap, c, rules), np.inf)
    with np.errstate(invalid="ignore"):
        t = (col([k.t_fixed for k in coeffs]) + n * col([k.t_layer for k in coeffs])
             + q * col([k.moe.t_layer for k in coeffs])
             + np.where(np.isfinite(r), r * col([lk.t_rec for lk in low]), np.inf))
    t = t.min(axis=2)
    n = n[:, 0]
    return n, _with_exposures(t, low, n)


def lower_bound(coeffs, c: Candidate, L: int, cap: float, rules: Rules, Q=None,
                low=None, model=None) -> float:
    """A step time no placement of this candidate can beat.

    The slowest stage is at least the bottleneck time T*: the least T at which the ranks can
    hold all L layers with every rank's time (with the least recompute its memory needs) at most
    T. The sum of stage times is at least the perfectly balanced total with that recompute
    pooled over ranks. The tail is the smallest any rank can have while some rank holds at
    least L/p layers. (Engine rules only restrict placements further: still a bound.)
    """
    p, m, v = c.pp, c.m, c.vpp
    if Q is not None:   # dense and MoE layers (coeffs with `moe`): kinds counted
        low = low or [lower_coeffs(k) for k in coeffs]
        P = layer_kinds(model) if model is not None else None
        wins = (_kinds_windows(tuple(P), p)
                if P is not None and v == 1 and p == len(coeffs) else None)
        n_all, t_all = _rank_min_times_kinds(coeffs, low, L, Q, v, cap, c, rules, wins)
        kinds_total = (sum(k.t_fixed for k in coeffs) + (L - Q) * min(k.t_layer for k in coeffs)
                       + Q * min(k.t_layer + k.moe.t_layer for k in coeffs))
        # every layer is held once: L - Q dense and Q MoE layers' memory pooled over ranks
        kinds_memory = ((L - Q) * min(k.mem_total_layer() for k in coeffs)
                        + Q * min(k.mem_total_layer() + sum(k.moe.mem_layer.values())
                                  for k in coeffs))
        coeffs = low
    else:
        n_all, t_all = _rank_min_times(coeffs, L, v, cap, c, rules)
        kinds_total = kinds_memory = 0.0
    values = np.unique(t_all[np.isfinite(t_all)])
    if values.size == 0:
        return math.inf
    # the most layers rank i can hold within time x is the last n whose least time from n on
    # is at most x (times past it only exceed x): v - 1 + the count of those (0 if none)
    suffix = np.minimum.accumulate(t_all[:, ::-1], axis=1)[:, ::-1]

    def layers_within(x) -> int:
        k = (suffix <= x).sum(axis=1)
        return int(np.where(k > 0, v - 1 + k, 0).sum())

    lo, hi = 0, values.size - 1
    if layers_within(values[hi]) < L:
        return math.inf
    while lo < hi:   # least value at which the ranks' layer capacities reach L
        mid = (lo + hi) // 2
        if layers_within(values[mid]) >= L:
            hi = mid
        else:
            lo = mid + 1
    if c.recompute == "none":
        need = 0
    elif rules.all_layers_recomputed:
        need = L
    else:   # pooled memory over ranks sets the least total recompute
        excess = (sum(k.mem_total_fixed() for k in coeffs)
                  + max(kinds_memory, L * min(k.mem_total_layer() for k in coeffs)) - p * cap)
        mr = max(k.mem_rec for k in coeffs)
        need = min(L, max(0, math.ceil(excess / mr))) if mr > 0 and excess > 0 else 0
    total = (max(kinds_total, sum(k.t_fixed for k in coeffs) + L * min(k.t_layer for k in coeffs))
             + need * min(k.t_rec for k in coeffs))
    t_star = max(float(values[lo]), total / p)
    total = max(total, t_star)
    n = math.ceil(L / p)
    tail = min(k.tail_lower(n) for k in coeffs)
    return m * t_star + (total - t_star) / v + tail


def quick_lower_bound(coeffs, c: Candidate, L: int, Q=None) -> float:
    """A cheaper bound below `lower_bound`: the stages' times sum to at least
    total = sum of fixed times + L x the least per-layer time (no recompute, no exposure); with
    dense and MoE layers (full coefficients with `moe`, Q of the L layers MoE) each kind's
    layers at least that kind's least per-layer time, as `lower_bound`'s kinds total. The
    slowest stage is at least total/p, so the step is at least
    m * total/p + (p - 1)/v * total/p (pipeline_time with every stage at the mean)."""
    p, m, v = c.pp, c.m, c.vpp
    total = sum(k.t_fixed for k in coeffs)
    if Q is not None and coeffs[0].moe is not None:
        total += ((L - Q) * min(k.t_layer for k in coeffs)
                  + Q * min(k.t_layer + k.moe.t_layer for k in coeffs))
    else:
        total += L * min(k.t_layer for k in coeffs)
    mean = total / p
    return m * mean + (p - 1) * mean / v


def _min_recompute(k, n: int, cap: float, c: Candidate, rules: Rules):
    """Fewest recomputed layers that make rank k fit with n layers, or None."""
    if c.recompute == "none":
        return 0 if k.memory(n, 0)["total"] <= cap else None
    if rules.all_layers_recomputed:
        return n if k.memory(n, n)["total"] <= cap else None
    over = k.memory(n, 0)["total"] - cap
    if over <= 0:
        return 0
    if k.mem_rec <= 0:
        return None
    r = math.ceil(over / k.mem_rec)
    return r if r <= n else None


def _min_recompute_kinds(k, n: int, cap: float, c: Candidate, rules: Rules, P: list,
                         start: int):
    """_min_recompute for a rank holding layers [start, start + n) of dense and MoE layers
    (prefix counts P), recomputing its first r."""
    q = P[start + n] - P[start]
    def fits(r):
        return k.memory(n, r, q, P[start + r] - P[start])["total"] <= cap

    if c.recompute == "none" or rules.all_layers_recomputed:
        r = 0 if c.recompute == "none" else n
        return r if fits(r) else None
    if not fits(n):
        return None
    lo, hi = 0, n        # memory does not grow with r: the least r that fits, by bisection
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def chunk_recompute(per_chunk: int, layers: int, v: int) -> int:
    """Layers of a rank recomputed when each of its v chunks recomputes its first `per_chunk`
    (Megatron's --recompute-num-layers): a chunk shorter than that recomputes all it has."""
    return min(v * per_chunk, layers)


def heuristic(model, cluster, c, coeffs, cap, rules: Rules, split=None, engine=None,
              margin_gib=None) -> Result:
    """Even split (or `split`, or the user's) with the least recompute that fits; may not
    fit."""
    if split is None:
        split = (list(rules.fixed_split) if rules.fixed_split
                 else even_split(model.num_layers, c.pp))
    rec = []
    P = layer_kinds(model) if coeffs[0].moe is not None else None
    start = 0
    for k, n in zip(coeffs, split):
        if P is None:
            r = _min_recompute(k, n, cap, c, rules)
        else:
            r = _min_recompute_kinds(k, n, cap, c, rules, P, start)
        rec.append(r if r is not None else (n if c.recompute != "none" else 0))
        start += n
    if rules.per_chunk and not rules.all_layers_recomputed and any(rec):
        per_chunk = max(math.ceil(r / c.vpp) for r in rec)
        rec = [chunk_recompute(per_chunk, n, c.vpp) for n in split]
    est = price(model, cluster, c, split, rec, engine, margin_gib, coeffs).estimate
    return Result(c, split, rec, est)


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
    n_vars = [mdl.NewIntVar(v, L, f"n{i}") for i in range(p)]   # at least one layer per chunk
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
            mdl.Add(r <= n)
        mem_expr = (int(math.ceil(k.mem_total_fixed())) + int(math.ceil(k.mem_total_layer())) * n
                    - int(k.mem_rec) * r)
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
            mem_expr = (mem_expr + int(math.ceil(sum(d.mem_layer.values()))) * q
                        - int(d.mem_rec) * rq)
            t_expr = t_expr + ns(d.t_layer) * q + ns(d.t_rec) * rq
            tail_expr = tail_expr + ns(d.opt_layer) * q
            dz = [(e[0], e[2]) for e in d.exposures()]
            dt = [(e[0], e[2]) for e in d.tail_exposures()]
        # memory (bytes)
        mdl.Add(mem_expr <= int(cap))
        # per micro-batch time, with the ZeRO-2/3 collectives' exposure
        for j, (cl, cf, hl, hf) in enumerate(k.exposures()):
            dc, dh = dz[j] if dz else (0.0, 0.0)
            if cl > 0 or cf > 0 or dc > 0:
                t_expr = t_expr + exposure(cl, cf, hl, hf, k.overlap_slowdown, n, t_ub,
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
    # objective x v:  m*v*Tmax + sum(T) - Tmax + v*tailmax
    objective = (m * v - 1) * tmax + sum(T) + v * tailmax
    mdl.Minimize(objective)
    if cutoff_s is not None and math.isfinite(cutoff_s):
        mdl.Add(objective <= v * ns(cutoff_s * (1 + 1e-6)) + v * (m + len(coeffs) + 1))
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
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = SOLVER_SECONDS
    # The model is tiny (2 variables per rank); CP-SAT's presolve can stall for seconds on its
    # wide integer coefficients while the search itself needs milliseconds.
    solver.parameters.cp_model_presolve = P is not None   # element constraints need it
    if P is not None and v > 1:   # the hull cuts into the LP relaxation: chunk-level proofs
        solver.parameters.linearization_level = 2
    st = solver.Solve(mdl)
    status = solver.StatusName(st)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, status, None
    obj, bound = solver.ObjectiveValue(), solver.BestObjectiveBound()
    gap = (obj - bound) / obj if obj > 0 else 0.0
    layers = [solver.Value(x) for x in n_vars]
    rec = [solver.Value(x) for x in r_vars]
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
    if sum(min(x, model.num_layers) for x in caps) < model.num_layers or min(caps) < c.vpp:
        return heur, False
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


class TopTimes:
    """Step times kept sorted, one per key when keyed (a key's later time replaces its
    earlier one): `threshold` is the top-th least, inf until there are that many."""

    def __init__(self, top: int):
        self.top, self._times, self._of = max(top, 1), [], {}

    def add(self, t: float, key=None) -> None:
        if key is not None:
            old = self._of.get(key)
            if old is not None:
                del self._times[bisect.bisect_left(self._times, old)]
            self._of[key] = t
        bisect.insort(self._times, t)

    def threshold(self) -> float:
        return self._times[self.top - 1] if len(self._times) >= self.top else math.inf


# model-state memory categories of StageCoeffs.mem_fixed / mem_layer and of its memory()
STATE_KEYS = ("params", "grads", "optimizer")


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
        self._in_flight, self._pooled, self._shape_times = {}, {}, {}
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
        # every field that changes a layer's figures (the MoE dispatch, overlap, capacity and
        # imbalance included); pp, the schedule and ZeRO are the class's own (laid out at pp 1)
        key = (c.mbs, c.tp, c.sp, c.cp, c.cp_comm, c.ep, c.etp, c.tp_comm_overlap, c.recompute,
               c.recompute_modules, c.ep_comm_overlap, c.moe_dispatcher, c.moe_capacity_factor,
               c.moe_imbalance)
        got = self._times.get(key)
        if got is None:
            one = _pipeline_free(c)
            k = stage_coefficients(self.model, self.cluster, one, self.engine)[0]
            d = k.moe
            # per micro-batch: the pp = 1 rank holds in_flight of them (two under the EP
            # overlap), which the callers multiply in again
            per = 1.0 / in_flight("1f1b", 1, 0, one.m, 1, one.ep_comm_overlap)
            act = k.mem_layer.get("activations", 0.0) * per
            act_moe = act + d.mem_layer.get("activations", 0.0) * per if d else act
            mem_rec = k.mem_rec * per
            rec_moe = mem_rec + d.mem_rec * per if d else mem_rec
            # activations a layer keeps whether it is recomputed or not
            kept = (act, act_moe) if c.recompute == "none" else (
                min(act, act - mem_rec), min(act_moe, act_moe - rec_moe))
            got = self._times[key] = dict(
                fixed=k.compute_fixed, layer=k.t_layer, moe=d.t_layer if d else 0.0,
                rec=min(k.t_rec, k.t_rec + d.t_rec) if d else k.t_rec,
                act=min(act, act_moe), saves=max(mem_rec, rec_moe),
                kept_dense=kept[0], kept_moe=kept[1])
        return got

    def time_bound(self, c: Candidate) -> float:
        """Below quick_bound(c, rules, cap): quick_bound(c) without the recompute term, from
        the times of c's layer shape, which every recompute choice shares (the forward,
        backward and communication of a layer and of the embedding, head and MTP modules:
        planner.cost.stage; tests/test_search_speed_bounds.py checks they agree), built once
        per shape. A hair below, so that last-bit differences between two choices' builds
        cannot lift it above."""
        key = (c.mbs, c.tp, c.sp, c.cp, c.cp_comm, c.ep, c.etp, c.tp_comm_overlap,
               c.ep_comm_overlap, c.moe_dispatcher, c.moe_capacity_factor, c.moe_imbalance)
        fig = self._shape_times.get(key)
        if fig is None:
            fig = self._shape_times[key] = self._layer_figures(c)
        L, p = self.model.num_layers, c.pp
        total = fig["fixed"] + L * fig["layer"] + (self.kinds[-1] * fig["moe"]
                                                   if self.kinds is not None else 0.0)
        mean = total / p
        return (c.m * mean + (p - 1) * mean / c.vpp) * (1 - 1e-9)

    def in_flight(self, c: Candidate) -> list:
        """Micro-batches in flight per pipeline rank, as planner.cost.stage counts them."""
        key = (c.schedule, c.pp, c.m, c.vpp, c.ep_comm_overlap)
        got = self._in_flight.get(key)
        if got is None:
            sched = self.engine.effective_schedule(c.schedule, c.pp, c.m)
            got = self._in_flight[key] = [in_flight(sched, c.pp, i, c.m, c.vpp,
                                                    c.ep_comm_overlap)
                                          for i in range(c.pp)]
        return got

    def quick_bound(self, c: Candidate, rules: Rules | None = None, cap: float | None = None
                    ) -> float:
        """A lower bound on quick_lower_bound(coefficients of c, c, L, Q); with `rules` and
        `cap`, on lower_bound(...) instead: the stages' times also hold the least recompute
        the pooled memory of the ranks needs (lower_bound's `need`), with the activations of a
        rank's layer those of one micro-batch x the micro-batches it holds in flight (as
        planner.cost.stage prices them) and the model states of `states`."""
        fig = self._layer_figures(c)
        L, p = self.model.num_layers, c.pp
        total = fig["fixed"] + L * fig["layer"] + (self.kinds[-1] * fig["moe"]
                                                   if self.kinds is not None else 0.0)
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
            total += need * fig["rec"]
        mean = total / p
        return c.m * mean + (p - 1) * mean / c.vpp

    def states(self, c: Candidate) -> list:
        """Per pipeline rank: (model states of its fixed parts, of one dense layer, of one MoE
        layer), bytes, each at most what planner.cost.stage charges."""
        layout = (c.tp, c.cp, c.pp, c.dp, c.zero, c.ep, c.etp)
        out = self._states.get(layout)
        if out is not None:
            return out
        m, t, p = self.model, c.tp, c.pp
        kw = self._state_bytes
        dpc = c.dp_cp

        def held(params, dp=dpc):
            return sum(model_state_bytes(params, dp, c.zero, **kw))

        dense = held((m.attn_matmul_params() + m.mlp_matmul_params()) / t)
        moe = dense
        if m.is_moe:
            edp = expert_dp(t, c.dp, c.ep, c.etp, c.cp)
            moe = (held(m.attn_matmul_params() / t + m.router_params()
                        + m.shared_expert_params() / t)
                   + held((m.num_experts // c.ep) * m.expert_params() / c.etp, edp))
        emb = held(m.vocab_size * m.hidden / t)
        head = held(m.vocab_size * m.hidden / t) if (not m.tied_embeddings or p > 1) else 0.0
        mtp = m.mtp_layers * (moe if m.moe_layer(m.num_layers - 1) else dense)
        out = [((emb if i == 0 else 0.0) + (head + mtp if i == p - 1 else 0.0), dense, moe)
               for i in range(p)]
        self._states[layout] = out
        return out

    def _kind_counts(self) -> tuple:
        """(dense layers, MoE layers) of the model."""
        return self._counts

    def pooled_states(self, c: Candidate) -> float:
        """The model states of all ranks together: every layer held once."""
        layout = (c.tp, c.cp, c.pp, c.dp, c.zero, c.ep, c.etp)
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

    def states_alone_can_fit(self, c: Candidate, cap: float) -> bool:
        """states_can_fit's screen of the model states alone (no activations kept): False
        only where states_can_fit is False; needs no layer figures."""
        return self._states_fit(self.states(c), cap * (1 + 1e-9), c.vpp)

    def states_can_fit(self, c: Candidate, cap: float) -> bool:
        """False when the model states and the activations every layer keeps however much is
        recomputed overflow `cap` on some rank under every placement (each rank at least one
        layer per chunk, the L layers held once), which makes every placement overflow in the
        full memory model: the rest (working buffers, logits) only adds. A rank holding n
        layers holds at least those of the n lightest the model has, and all ranks together
        those of every layer. (A hair of slack keeps float rounding on the safe side.)"""
        room, L = cap * (1 + 1e-9), self.model.num_layers
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
        for (fixed, dense, moe), fl in zip(states, infl):
            n = self._most_layers(room - fixed, dense + kd * fl, moe + km * fl)
            if n < c.vpp:
                return False
            total += n
        return total >= L

    def _states_fit(self, states: list, room: float, v: int) -> bool:
        """states_can_fit with no activations kept: the model states alone."""
        if self._pooled_of(states) > room * len(states):
            return False
        total = 0
        for fixed, dense, moe in states:
            n = self._most_layers(room - fixed, dense, moe)
            if n < v:
                return False
            total += n
        return total >= self.model.num_layers

    def states_overflow_gib(self, c: Candidate, budget) -> float:
        """A lower bound on max(overflow_gib()) of c's heuristic placement (the even split):
        the most reserved bytes of the model states alone of any rank, less the capacity."""
        model = self.model
        split = even_split(model.num_layers, c.pp)
        if self.kinds is not None:
            qs, _ = moe_counts(model, c.pp, c.vpp, split, [0] * c.pp)
        else:
            qs = split if model.is_moe else [0] * c.pp
        worst = max(fixed + (n - q) * dense + q * moe
                    for (fixed, dense, moe), n, q in zip(self.states(c), split, qs))
        return budget.reserved(worst / GIB) - budget.usable_gib


def states_per_gpu_bound(model: Model, engine: Engine, num_gpus: int) -> float:
    """Bytes of model states that the busiest GPU of any candidate on `num_gpus` GPUs holds at
    least: every parameter's weight, gradient and optimizer state is held at least once over
    the cluster (ZeRO-3 shards each over dp x cp, the experts over expert-dp, which folding
    makes exact: planner.validity.ep_blockers; lower stages keep more), counting the
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
    return params * (engine.weight_bytes + engine.grad_bytes + engine.optimizer_bytes) / num_gpus


def _closest(model, cluster, engine, margin_gib, shared: SharedCoefficients, infeasible: list,
             closest):
    """The candidate that misses by the least when nothing fits: `closest` (the best of the
    solved candidates) or the first of `infeasible` whose heuristic placement overflows least,
    as if every one were priced in turn. Those whose model states alone overflow more than the
    least found so far cannot be it: visited in that bound's order, they are left unpriced."""
    if not infeasible:
        return closest
    budget = memory_budget(cluster, engine, margin_gib)
    cap = capacity_bytes(cluster, engine, margin_gib)
    over = lambda r: max(r.estimate.overflow_gib())   # noqa: E731
    bounds = [shared.states_overflow_gib(c, budget) for c, _, _ in infeasible]
    least = over(closest) if closest is not None else math.inf
    priced = {}
    for i in sorted(range(len(infeasible)), key=lambda i: bounds[i]):
        if bounds[i] > least + 1e-6 * max(1.0, abs(least)):
            break
        c, coeffs, rules = infeasible[i]
        res = heuristic(model, cluster, c, coeffs or shared.coefficients(c), cap, rules,
                        engine=engine, margin_gib=margin_gib)
        priced[i] = res
        least = min(least, over(res))
    if closest is not None and over(closest) <= least:
        return closest
    return next(priced[i] for i in sorted(priced) if over(priced[i]) == least)


def search(model: Model, cluster: Cluster, fixed: Fixed | None = None, seq_len: int | None = None,
           global_batch: int | None = None, top: int = 5, progress=None,
           engine: Engine | str | None = None, margin_gib: float | None = None,
           rejected: bool = True) -> SearchReport:
    """Best plans for `model` on `cluster` under the fixed choices, for `engine`.
    `rejected=False`: the report's rejected list need only hold the candidates the search
    itself found out of memory (not every one planner.explain could show)."""
    t0 = time.perf_counter()
    engine = get_engine(engine)
    f = fixed or Fixed()
    seq_len = seq_len or default_seq_len(model)
    gbs = global_batch or default_global_batch(seq_len, cluster.num_gpus)
    check_fixed(model, cluster, f, seq_len, gbs, engine)
    cands = enumerate_candidates(model, cluster, f, seq_len, gbs, engine)
    if not cands:
        raise BadInput(_why_no_candidates(model, cluster, f, gbs, engine))
    cap = capacity_bytes(cluster, engine, margin_gib)
    L = model.num_layers
    P_kinds = layer_kinds(model)
    Q = P_kinds[-1] if P_kinds is not None else None
    scored, closest, pruned_mem = [], None, 0

    def consider_closest(res):
        nonlocal closest
        if closest is None or max(res.estimate.overflow_gib()) < max(closest.estimate.overflow_gib()):
            closest = res

    infeasible, rejected_bounds = [], {}
    shared = SharedCoefficients(model, cluster, engine)
    # Model states first: a candidate whose weights, gradients and optimizer states alone
    # overflow every placement cannot fit (activations and buffers only add); its coefficients
    # are never built. The rest are visited in the order of a bound below lower_bound
    # (SharedCoefficients.quick_bound, from figures its variants share): drawn lazily, in
    # the order of time_bound (below quick_bound, from figures shared by every recompute
    # choice), so that a candidate whose time_bound is past where the visit stops has no
    # figures of its own built. The order they come in is quick_bound's, as if every one had
    # been computed (live_in_order).
    states_out = []   # (enumeration index, infeasible entry) of the states screens' rejects
    pending = []
    for idx, c in enumerate(cands):
        if not shared.states_alone_can_fit(c, cap):
            states_out.append((idx, (c, None, rules_for(engine, c, f))))
            continue
        pending.append((shared.time_bound(c), idx, c))
    pending.sort(key=lambda x: (x[0], x[1]))
    pruned_mem += len(states_out)
    live_heap, drawn = [], 0

    def draw(upto: float) -> None:
        """Screen and bound the pending candidates whose time_bound is at most `upto`."""
        nonlocal drawn, pruned_mem
        while drawn < len(pending) and pending[drawn][0] <= upto:
            _, idx, c = pending[drawn]
            drawn += 1
            if not shared.states_can_fit(c, cap):
                pruned_mem += 1
                states_out.append((idx, (c, None, rules_for(engine, c, f))))
                continue
            heapq.heappush(live_heap, (shared.quick_bound(c, rules_for(engine, c, f), cap),
                                       idx, c))

    def live_in_order():
        """(quick_bound, index, candidate) of the candidates that pass the states screens,
        in (quick_bound, index) order: the heap's least is next once every pending candidate
        whose time_bound (<= its quick_bound) could come before it is drawn."""
        while True:
            if live_heap:
                draw(live_heap[0][0])
            elif drawn < len(pending):
                draw(pending[drawn][0])
                continue
            else:
                return
            yield heapq.heappop(live_heap)

    # Memory grows with the micro-batch at everything else equal (activations, logits and
    # working buffers are linear in it; micro-batches in flight x its size, min(b*(p - rank),
    # sequences per dp rank) under 1F1B and likewise interleaved, constant under GPipe; the
    # model states do not depend on it), so once a micro-batch size cannot fit, no larger one
    # of the same family can: those are pruned unpriced.
    too_big = {}

    def memory_test(c, rules):
        """The coefficients of c, or None when c cannot fit (recorded)."""
        nonlocal pruned_mem
        family = (c.tp, c.cp, c.cp_comm, c.pp, c.dp, c.zero, c.sp, c.schedule, c.vpp,
                  c.recompute, c.recompute_modules, c.ep, c.etp)
        if too_big.get(family, math.inf) < c.mbs:
            pruned_mem += 1
            infeasible.append((c, None, rules))
            if rejected:   # what rejected_layouts orders by; unused otherwise
                rejected_bounds[c] = shared.quick_bound(c)
            return None
        coeffs = shared.coefficients(c)
        caps = max_layers(coeffs, cap, c.vpp, rules, c, lower=True)
        if sum(min(x, L) for x in caps) < L or min(caps) < c.vpp:
            pruned_mem += 1
            infeasible.append((c, coeffs, rules))
            rejected_bounds[c] = quick_lower_bound(coeffs, c, L, Q)
            too_big[family] = min(c.mbs, too_big.get(family, math.inf))
            return None
        return coeffs

    # Heuristic placements in bound order: once a candidate's bound exceeds the K-th best
    # heuristic so far, so does every later one's full bound, so the loop below would prune
    # them all: they are not priced at all.
    best_heur = TopTimes(top)
    unpriced, beyond_bound = [], 0
    for item in live_in_order():
        lb0, _, c = item
        if lb0 > best_heur.threshold() * (1 + 1e-9):
            if rejected:   # the rest of the candidates, screened and in order, as below
                draw(math.inf)
                unpriced = [item] + sorted(live_heap, key=lambda x: (x[0], x[1]))
            break
        rules = rules_for(engine, c, f)
        coeffs = memory_test(c, rules)
        if coeffs is None:
            continue
        low = [lower_coeffs(k) for k in coeffs] if coeffs[0].moe is not None else coeffs
        lb = (lower_bound(coeffs, c, L, cap, rules, Q=Q, low=low, model=model) if coeffs[0].moe is not None
              else lower_bound(coeffs, c, L, cap, rules))
        if lb > best_heur.threshold() * (1 + 1e-9):
            # the loop below stops before it (its threshold is at most this one), and its
            # heuristic plan, no faster than lb, cannot be among the best: not priced
            beyond_bound += 1
            continue
        heur = heuristic(model, cluster, c, coeffs, cap, rules, engine=engine,
                         margin_gib=margin_gib)
        if heur.estimate.fits:
            best_heur.add(heur.estimate.step_time_s)
        scored.append((lb, c, coeffs, heur, rules, low))
    # the states screens' rejects first, in enumeration order, then those of memory_test
    infeasible[:0] = [entry for _, entry in sorted(states_out, key=lambda x: x[0])]
    if rejected:   # what rejected_layouts orders by; unused otherwise
        for c, _, _ in infeasible[:len(states_out)]:
            rejected_bounds[c] = shared.quick_bound(c)
    # Candidates in lower-bound order. Heuristic placements are real plans, so the K-th best
    # of them is a threshold a candidate's bound must beat to be worth an exact solve.
    scored.sort(key=lambda x: x[0])
    plans = {c: h for _, c, _, h, _, _ in scored if h.estimate.fits}   # best known plan per candidate
    best_plans = TopTimes(top)
    for c, r in plans.items():
        best_plans.add(r.estimate.step_time_s, c)
    solved, pruned_bound = 0, 0
    # least step time a candidate not solved to optimality might still reach (the whole
    # search's gap), and how many solves stopped at the time limit
    open_bound, limit_hit = math.inf, 0
    for i, (lb, c, coeffs, heur, rules, low) in enumerate(scored):
        # a candidate's plan only improves on its heuristic one, so the K-th best time over
        # the plans so far (heuristic ones included) only falls: kept incrementally
        threshold = best_plans.threshold()
        if lb > threshold * (1 + 1e-9):
            pruned_bound = len(scored) - i
            open_bound = min(open_bound, lb)
            break
        if c.pp == 1 or rules.equal_split or rules.fixed_split or (
                heur.estimate.fits and heur.estimate.step_time_s <= lb * (1 + 1e-9)):
            res, fits = heur, heur.estimate.fits           # no placement choice / proven optimal
            res.status = "OPTIMAL"
        else:
            res, fits = solve_candidate(model, cluster, c, rules, coeffs, heur, engine,
                                        margin_gib, cutoff_s=threshold, low=low)
            solved += 1
            if res.status == "FEASIBLE":
                limit_hit += 1
                open_bound = min(open_bound, max(lb, res.bound_s or 0.0))
            elif res.status == "UNKNOWN":
                limit_hit += 1
                open_bound = min(open_bound, lb)
        if progress:
            progress(i + 1, len(scored))
        if fits:
            plans[c] = res
            best_plans.add(res.estimate.step_time_s, c)
        else:
            consider_closest(res)
    ranked = sorted(plans.values(), key=lambda r: r.estimate.step_time_s)[:max(top, 1)]
    if not ranked:   # nothing fits: find the candidate that misses by the least
        closest = _closest(model, cluster, engine, margin_gib, shared, infeasible, closest)
    before = pruned_mem
    if rejected and ranked and unpriced:
        # The rejected candidates planner.explain can show: of layouts (tp, cp, pp, dp) with a
        # rejected candidate whose bound without recompute (below the even split's step time,
        # the "ideal" it shows) beats the best plan; the unpriced ones get the memory test,
        # those that may found such a layout first, then the rest of those layouts, so the
        # rejected list holds every candidate of them that cannot fit.
        base = ranked[0].estimate.step_time_s
        layout = lambda c: (c.tp, c.cp, c.pp, c.dp)   # noqa: E731
        unpriced = sorted(unpriced, key=lambda x: x[1])
        tested = set()
        for _, _, c in unpriced:
            if shared.quick_bound(c) < base:
                memory_test(c, rules_for(engine, c, f))
                tested.add(c)
        shown = {layout(c) for c, _, _ in infeasible if rejected_bounds[c] < base}
        for _, _, c in unpriced:
            if c not in tested and layout(c) in shown:
                memory_test(c, rules_for(engine, c, f))
    # the rest: beyond the bound
    pruned_bound += len(unpriced) - (pruned_mem - before) + beyond_bound
    out_of_memory = [(c, "out of memory on every placement of its layers")
                     for c, _, _ in infeasible]
    gap = 0.0
    if ranked:
        best_s = ranked[0].estimate.step_time_s
        gap = max(0.0, (best_s - min(best_s, open_bound)) / best_s)
    shown_rejected = (rejected_layouts(model, cluster, engine, margin_gib, f, out_of_memory,
                                       rejected_bounds, ranked[0].estimate.step_time_s)
                      if rejected and ranked else [])
    return SearchReport(best=ranked[0] if ranked else None, ranked=ranked, candidates=len(cands),
                        pruned_memory=pruned_mem, pruned_bound=pruned_bound, solved=solved,
                        seconds=time.perf_counter() - t0, closest=closest, rejected=out_of_memory,
                        seq_len=seq_len, global_batch=gbs, engine=engine,
                        margin_gib=margin_gib, gap=gap, solver_limit_hit=limit_hit,
                        rejected_bounds=rejected_bounds, rejected_layouts=shown_rejected)


# ---- the rejected layouts a report shows ------------------------------------

REJECTED_LAYOUTS_SHOWN = 3


@dataclass
class RejectedLayout:
    """A layout (tp, cp, pp, dp) none of whose candidates fits, that would beat the plan if
    memory allowed: `candidate`, its variant that misses by the least; `ideal_step_s`, its
    step on an even split with no more recompute than fixed (planner.cost.price); and its
    heuristic placement's worst overflow: `overflow_gib` on pipeline rank `rank`
    (`reserved_gib` of `capacity_gib`), `recomputes_all` when that rank recomputes all its
    layers."""
    candidate: Candidate
    ideal_step_s: float
    overflow_gib: float
    rank: int
    reserved_gib: float
    capacity_gib: float
    recomputes_all: bool


def _ideal_price(model, cluster, c, rules: Rules, engine, margin_gib):
    """The candidate's price on an even split (planner.plan.even_split, as the heuristic
    places it) with no more recompute than fixed: its speed if memory allowed."""
    split = even_split(model.num_layers, c.pp)
    rec0 = list(split) if rules.all_layers_recomputed else [0] * c.pp
    return price(model, cluster, c, split, rec0, engine, margin_gib)


def _overflow(model, cluster, c, coeffs, rules: Rules, engine, margin_gib) -> tuple:
    """(GiB over, rank, reserved GiB, capacity GiB, recomputes all) of a candidate that fits
    on no placement: the worst rank of the heuristic placement (even split, the least
    recompute that could help)."""
    h = heuristic(model, cluster, c, coeffs, capacity_bytes(cluster, engine, margin_gib), rules,
                  engine=engine, margin_gib=margin_gib)
    over = h.estimate.overflow_gib()
    k = max(range(len(over)), key=lambda i: over[i])
    return (over[k], k, h.estimate.stage_memory_gib[k]["reserved"], h.estimate.capacity_gib,
            bool(h.recompute[k] == h.layers[k] and h.layers[k] and c.recompute != "none"))


def rejected_layouts(model, cluster, engine, margin_gib, f: Fixed, rejected: list,
                     known_bounds: dict, base: float,
                     shown: int = REJECTED_LAYOUTS_SHOWN) -> list:
    """[RejectedLayout] of the `shown` layouts among the `rejected` (Candidate, reason) whose
    ideal beats the plan's step `base`, fastest ideal first.

    Ideals (a placement's step time) are at least the quick bound, here from pipeline rank
    0's coefficients (every rank's per-layer time is the same, other ranks' fixed times are
    >= 0) unless the search computed it (`known_bounds`). In bound order, once a bound exceeds
    the plan's step and the shown-th smallest layout minimum so far, no later candidate can
    enter or reorder the layouts shown: those are left unpriced."""
    engine = get_engine(engine)
    bounded = []
    for c, _ in rejected:
        lb = known_bounds.get(c)
        if lb is None:
            first = stage_coefficients(model, cluster, c, engine, ranks=[0])
            lb = quick_lower_bound(first, c, model.num_layers)
        bounded.append((lb, c))
    bounded.sort(key=lambda x: x[0])
    layout = lambda c: (c.tp, c.cp, c.pp, c.dp)   # noqa: E731
    groups = {}   # one row per layout: its variants (ZeRO, micro-batch, ...) alike
    mins = {}     # each layout's least ideal so far
    for i, (lb, c) in enumerate(bounded):
        least = sorted(mins.values())
        cut = min(base, least[shown - 1] if len(least) >= shown else math.inf)
        if lb > cut:
            break
        rules = rules_for(engine, c, f)
        ideal = _ideal_price(model, cluster, c, rules, engine, margin_gib)
        groups.setdefault(layout(c), []).append((ideal.estimate.step_time_s, c, ideal.coeffs,
                                                 rules))
        mins[layout(c)] = min(mins.get(layout(c), math.inf), ideal.estimate.step_time_s)
    for lb, c in bounded[i:] if bounded and lb > cut else []:
        if layout(c) in groups:   # the shown layouts' other variants, unpriced
            groups[layout(c)].append((math.inf, c, None, rules_for(engine, c, f)))
    ordered = sorted(groups.values(), key=lambda g: min(x[0] for x in g))
    out = []
    for group in [g for g in ordered if min(x[0] for x in g) < base][:shown]:
        rows = [(_overflow(model, cluster, c, coeffs or stage_coefficients(model, cluster, c,
                                                                           engine),
                           rules, engine, margin_gib), step, c)
                for step, c, coeffs, rules in group]
        (over, k, reserved, capacity, recomputes_all), step, c = min(rows, key=lambda x: x[0][0])
        if not math.isfinite(step):   # a variant the quick bound skipped: price it now
            step = _ideal_price(model, cluster, c, rules_for(engine, c, f), engine,
                                margin_gib).estimate.step_time_s
        out.append(RejectedLayout(candidate=c, ideal_step_s=step, overflow_gib=over, rank=k,
                                  reserved_gib=reserved, capacity_gib=capacity,
                                  recomputes_all=recomputes_all))
    return out


def _why_no_candidates(model, cluster, f, gbs, engine) -> str:
    return (f"no configuration of {cluster.num_gpus} GPUs that {engine.name} can run matches "
            f"the fixed choices and global batch {gbs} (tp must divide the heads, pp the "
            f"layers, dp*micro-batch the global batch)")


# ---- results to plans -------------------------------------------------------

def to_plan(model: Model, cluster: Cluster, r: Result, report: SearchReport | None = None,
            engine: Engine | str | None = None) -> Plan:
    c = r.candidate
    engine = get_engine(engine if engine is not None else report.engine if report else None)
    par = Parallelism(tp=c.tp, pp=c.pp, dp=c.dp, cp=c.cp, cp_comm_type=c.cp_comm,
                      ep=c.ep, etp=c.etp, zero_stage=c.zero, sequence_parallel=c.sp,
                      tp_comm_overlap=c.tp_comm_overlap,
                      moe_dispatcher=(candidate_dispatcher(model, cluster, c, engine)
                                      if model.is_moe else ""),
                      ep_comm_overlap=c.ep_comm_overlap,
                      moe_capacity_factor=c.moe_capacity_factor,
                      moe_imbalance=c.moe_imbalance,
                      vpp=c.vpp, schedule=c.schedule if c.pp > 1 else "1f1b",
                      recompute=c.recompute if any(r.recompute) else "none",
                      recompute_modules=(c.recompute_modules if any(r.recompute)
                                         and c.recompute == "selective" else DEFAULT_MODULES))
    batch = Batch(seq_len=c.seq_len, global_batch_size=c.global_batch, micro_batch_size=c.mbs,
                  num_microbatches=c.m)
    stages = make_stages(model.num_layers, c.pp, c.vpp, r.layers, r.recompute)
    for s in stages:
        s.memory_gib = {k: round(v, 3) for k, v in r.estimate.stage_memory_gib[s.pp_rank].items()}
    est = r.estimate.to_dict()
    search = {"solver_status": r.status, "gap": r.gap}
    if report is not None:
        search.update(candidates=report.candidates, solved=report.solved,
                      pruned_memory=report.pruned_memory, pruned_bound=report.pruned_bound,
                      seconds=round(report.seconds, 3), search_gap=report.gap,
                      solver_limit_hit=report.solver_limit_hit)
    return Plan(model=model, cluster=cluster, parallelism=par, batch=batch, stages=stages,
                estimate=est, search=search, engine=engine.name,
                attention="flash" if c.flash else "eager", precision=c.precision,
                recipe=c.recipe or default_recipe(engine, c.precision))

