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
import dataclasses
import heapq
import itertools
import math
import operator
import time
from dataclasses import dataclass, field

from planner.cost.moe import candidate_dispatcher, layer_kinds
from planner.cost.offload import host_use
from planner.cost.recompute import DEFAULT_MODULES
from planner.cost.stage import (Candidate, capacity_bytes, memory_budget, overflow,
                                stage_coefficients)
from planner.cost.price import price   # the one price of a placement
from planner import rules as V
from planner.engines import engine_for, get_engine
from planner.engines.spec import Engine
from planner.errors import BadInput
from planner.plan import Batch, Parallelism, Plan, make_stages
from planner.vocab import V_SCHEDULES
from planner.precision import default_recipe
from planner.rules_fixed import check_fixed   # the rules layer's, for the fixed CLI values
from planner.specs import Cluster, Model
# the rooms of the search, and what other modules import from planner.search
from planner.search.bounds import (Rules, SharedCoefficients,  # noqa: F401
                                   bottleneck, bottleneck_split,
                                   lower_bound, lower_coeffs, max_layers, placement_bound,
                                   quick_lower_bound,
                                   rules_for, states_per_gpu_bound, without_buffers_bound)
from planner.search.enumeration import (MICRO_BATCHES, SEARCHED_VPP, Fixed,  # noqa: F401
                                      enumerate_candidates, expert_layouts, searched_cp,
                                      searched_recompute, without_tp_overlap)
from planner.search.placement import (SOLVER_SECONDS, TIME_UNITS, Result,  # noqa: F401
                                      _hull_cuts, chunk_recompute, heuristic,
                                      heuristic_placement, solve_candidate, solve_cpsat)


# Default tokens per step: Llama 3 pre-training started at 4M tokens per batch
# (Dubey et al. 2024, Sec. 3.4.1).
DEFAULT_TOKENS_PER_STEP = 4 * 2 ** 20
DEFAULT_MAX_SEQ_LEN = 8192         # Llama 3's pre-training context
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
    # a bound below the ideal step of the rejected candidates whose bound the search took (the
    # rejected layouts' order): quick_lower_bound where it built their coefficients, else
    # SharedCoefficients.quick_bound
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


class TopTimes:
    """Step times kept sorted, one per key when keyed (a key's least: a candidate's plan only
    improves, and a candidate and its twin without the TP overlap are one key, ranked at the
    faster of the two): `threshold` is the top-th least, inf until there are that many."""

    def __init__(self, top: int):
        self.top, self._times, self._of = max(top, 1), [], {}

    def add(self, t: float, key=None) -> None:
        if key is not None:
            old = self._of.get(key)
            if old is not None:
                if old <= t:
                    return
                del self._times[bisect.bisect_left(self._times, old)]
            self._of[key] = t
        bisect.insort(self._times, t)

    def threshold(self) -> float:
        return self._times[self.top - 1] if len(self._times) >= self.top else math.inf


def fastest_per_key(items, top: int) -> list:
    """The `top` fastest results of (key, result) pairs, one per key, at its fastest: a
    candidate and its twin without the TP overlap are one key (the overlap is a knob the
    search chooses per candidate), as are a candidate's heuristic and exact placements."""
    fastest = {}
    for k, r in items:
        if k not in fastest or r.estimate.step_time_s < fastest[k].estimate.step_time_s:
            fastest[k] = r
    return sorted(fastest.values(), key=lambda r: r.estimate.step_time_s)[:max(top, 1)]


# a candidate's family (search's memory_test): its fields but the micro-batch, by name (the
# enumeration sets a candidate's fields in its own order: enumeration._candidate)
FAMILY_OF = operator.itemgetter(*(f.name for f in dataclasses.fields(Candidate)
                                  if f.name != "mbs"))


def _closest(model, cluster, engine, margin_gib, shared: SharedCoefficients, infeasible: list,
             closest):
    """The candidate that misses by the least when nothing fits: `closest` (the best of the
    solved candidates) or the first of `infeasible` whose heuristic placement overflows least,
    as if every one were priced in turn. A placement's overflow is its memory's alone
    (planner.cost.stage.overflow): only the candidate returned is priced. Those whose model
    states alone overflow more than the least found so far cannot be it: visited in that
    bound's order, they are left unmeasured; so are those of a family (FAMILY_OF) with a
    smaller micro-batch among them, which overflows no more."""
    if not infeasible:
        return closest
    # a candidate rejected unpriced (the states screens, a family's smaller micro-batch) has
    # its twin without the TP overlap rejected with it (the screens hold the same for both:
    # SharedCoefficients.working_floor), but the twin misses by its buffers less
    infeasible = infeasible + [(t, None, rules) for t, rules in
                               ((without_tp_overlap(engine, c), rules)
                                for c, coeffs, rules in infeasible if coeffs is None)
                               if t is not None]
    budget = memory_budget(cluster, engine, margin_gib)
    cap = capacity_bytes(cluster, engine, margin_gib)
    over = lambda r: max(r.estimate.overflow_gib())   # noqa: E731
    bounds = [shared.states_overflow_gib(c, budget) for c, _, _ in infeasible]
    least = over(closest) if closest is not None else math.inf
    measured = {}
    # a candidate needs no less memory than its family's smaller micro-batch on every
    # placement (the rule memory_test prunes a family by): only a family's smallest is priced
    family = [FAMILY_OF(c.__dict__) for c, _, _ in infeasible]
    smallest = {}
    for (c, _, _), fam in zip(infeasible, family):
        smallest[fam] = min(c.mbs, smallest.get(fam, c.mbs))
    beyond = lambda b: b > least + 1e-6 * max(1.0, abs(least))   # noqa: E731
    for i in sorted(range(len(infeasible)), key=lambda i: bounds[i]):
        if beyond(bounds[i]):
            break
        c, coeffs, rules = infeasible[i]
        if c.mbs > smallest[family[i]]:
            continue
        # its heuristic placement's overflow, unpriced: only the one returned is priced,
        # below (a zero-bubble schedule of thousands of micro-batches takes seconds to
        # simulate)
        coeffs = coeffs or shared.coefficients(c)
        layers, rec = heuristic_placement(model, c, coeffs, cap, rules, engine=engine)
        over_i = max(overflow(model, cluster, c, layers, rec, coeffs, engine, margin_gib)[0])
        measured[i] = (over_i, c, coeffs, layers, rec)
        least = min(least, over_i)
    if closest is not None and over(closest) <= least:
        return closest
    _, c, coeffs, layers, rec = next(measured[i] for i in sorted(measured)
                                     if measured[i][0] == least)
    return Result(c, layers, rec, price(model, cluster, c, layers, rec, engine, margin_gib,
                                        coeffs).estimate)


def search(model: Model, cluster: Cluster, fixed: Fixed | None = None, seq_len: int | None = None,
           global_batch: int | None = None, top: int = 5, progress=None,
           engine: Engine | str | None = None, margin_gib: float | None = None,
           rejected: bool = True, find_closest: bool = True) -> SearchReport:
    """Best plans for `model` on `cluster` under the fixed choices, for `engine`.
    `rejected=False`: the report's rejected list need only hold the candidates the search
    itself found out of memory (not every one planner.explain could show).
    `find_closest=False`: where nothing fits, the candidate that misses by the least is not
    sought beyond those the search priced (a caller asking only whether anything fits)."""
    t0 = time.perf_counter()
    f = fixed or Fixed()
    engine = engine_for(engine, f.compile)
    seq_len = seq_len or default_seq_len(model)
    gbs = global_batch or default_global_batch(seq_len, cluster.num_gpus)
    check_fixed(model, cluster, f, seq_len, gbs, engine)
    cands = enumerate_candidates(model, cluster, f, seq_len, gbs, engine)
    if not cands:
        raise BadInput(offload_overflow(model, cluster, f, seq_len, gbs, engine)
                       or _why_no_candidates(model, cluster, f, gbs, engine))
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
    rules_memo = {}

    def rules_of(c) -> Rules:
        """rules_for(engine, c, f), which depends on c only through its recompute, pp > 1 and
        the ranks' fewest layers (rules.rank_min_layers: pp and vpp)."""
        key = (c.recompute, c.pp, c.vpp)
        got = rules_memo.get(key)
        if got is None:
            got = rules_memo[key] = rules_for(engine, c, f)
        return got

    shared = SharedCoefficients(model, cluster, engine)
    # Model states first: a candidate whose weights, gradients and optimizer states alone
    # overflow every placement cannot fit (activations and buffers only add); its coefficients
    # are never built. The rest are visited in the order of a bound below lower_bound
    # (SharedCoefficients.quick_bound, from figures its variants share), drawn lazily: in the
    # order of time_floor (the layers' compute alone, no figures built), then of time_bound
    # (below quick_bound, from figures shared by every recompute choice), so that a candidate
    # whose time_floor is past where the visit stops has no figures of its layer shape
    # built, and one whose time_bound is, none of its own. The order they come in is
    # quick_bound's, as if every one had been computed (live_in_order).
    states_out = []   # (enumeration index, infeasible entry) of the states screens' rejects
    pending = []      # (time_floor, index, candidate), in that order
    for idx, c in enumerate(cands):
        if not shared.states_alone_can_fit(c, cap):
            states_out.append((idx, (c, None, rules_of(c))))
            continue
        pending.append((shared.time_floor(c), idx, c))
    pending.sort(key=lambda x: (x[0], x[1]))
    pruned_mem += len(states_out)
    bounded = []      # heap of (time_bound, index, candidate) of the pending ones not drawn
    live_heap, drawn = [], 0

    def draw(upto: float) -> None:
        """Screen and bound the pending candidates whose time_bound is at most `upto` (every
        one whose time_floor, below it, is at most `upto` has it computed)."""
        nonlocal drawn, pruned_mem
        while drawn < len(pending) and pending[drawn][0] <= upto:
            _, idx, c = pending[drawn]
            drawn += 1
            heapq.heappush(bounded, (shared.time_bound(c), idx, c))
        while bounded and bounded[0][0] <= upto:
            _, idx, c = heapq.heappop(bounded)
            if not shared.states_can_fit(c, cap):
                pruned_mem += 1
                states_out.append((idx, (c, None, rules_of(c))))
                continue
            heapq.heappush(live_heap, (shared.quick_bound(c, rules_of(c), cap),
                                       idx, c))

    def live_in_order():
        """(quick_bound, index, candidate) of the candidates that pass the states screens,
        in (quick_bound, index) order: the heap's least is next once every pending candidate
        whose time_bound (<= its quick_bound) could come before it is drawn."""
        while True:
            if live_heap:
                draw(live_heap[0][0])
            elif drawn < len(pending) or bounded:
                draw(min(pending[drawn][0] if drawn < len(pending) else math.inf,
                         bounded[0][0] if bounded else math.inf))
                continue
            else:
                return
            yield heapq.heappop(live_heap)

    # Memory grows with the micro-batch at everything else equal (activations, logits and
    # working buffers are linear in it; micro-batches in flight x its size, min(b*(p - rank),
    # sequences per dp rank) under 1F1B and likewise interleaved, constant under GPipe; the
    # model states do not depend on it), so once a micro-batch size cannot fit, no larger one
    # of the same family can: those are pruned unpriced. The family is every other knob: an
    # offload, the TP overlap's buffers, ZeRO++ or HSDP change the memory at the same size.
    # A family's smallest enumerated micro-batch is tested first (its coefficients kept for
    # its own turn), so that a family that fits at none is found with one build, whatever
    # order the bounds visit its sizes in.
    too_big = {}

    def family_of(c) -> tuple:
        return FAMILY_OF(c.__dict__)

    smallest = {}
    for c in cands:
        fam = family_of(c)
        smallest[fam] = min(c.mbs, smallest.get(fam, c.mbs))
    built = {}   # the coefficients of a smallest micro-batch built ahead of its turn

    def overflows(c, coeffs, rules) -> bool:
        caps = max_layers(coeffs, cap, c.vpp, rules, c, lower=True)
        return sum(min(x, L) for x in caps) < L or rules.short_of_layers(caps, c.vpp)

    def memory_test(c, rules):
        """The coefficients of c, or None when c cannot fit (recorded)."""
        nonlocal pruned_mem
        family = family_of(c)
        least = smallest.get(family, c.mbs)
        if c.mbs > least and family not in too_big:
            first = dataclasses.replace(c, mbs=least)
            if first not in built:
                built[first] = shared.coefficients(first)
                if overflows(first, built[first], rules_of(first)):
                    too_big[family] = least
        if too_big.get(family, math.inf) < c.mbs:
            pruned_mem += 1
            infeasible.append((c, None, rules))
            if rejected:   # what rejected_layouts orders by; unused otherwise
                rejected_bounds[c] = shared.quick_bound(c)
            return None
        coeffs = built.pop(c, None) or shared.coefficients(c)
        if overflows(c, coeffs, rules):
            pruned_mem += 1
            infeasible.append((c, coeffs, rules))
            rejected_bounds[c] = quick_lower_bound(coeffs, c, L, Q)
            too_big[family] = min(c.mbs, too_big.get(family, math.inf))
            return None
        return coeffs

    def plain(res):
        # an activation offload of no layer is the plan without recompute: priced and ranked
        # as that ("none": no layer's copy in flight, no offload flag exported), unless asked for
        if (res is None or f.recompute == "offload" or res.candidate.recompute != "offload"
                or any(res.recompute)):
            return res
        c = dataclasses.replace(res.candidate, recompute="none")
        est = price(model, cluster, c, res.layers, res.recompute, engine, margin_gib).estimate
        return dataclasses.replace(res, candidate=c, estimate=est)

    # Heuristic placements in bound order: once a candidate's bound exceeds the K-th best
    # heuristic so far, so does every later one's full bound, so the loop below would prune
    # them all: they are not priced at all.
    best_heur = TopTimes(top)
    # the candidate whose twin without the TP overlap each queued twin is: a candidate and its
    # twin are ranked as one, at the faster of their plans (the overlap is a knob the search
    # chooses per candidate; its slower setting is no alternative worth a place)
    twin_of = {}
    pair = lambda c: twin_of.get(c, c)   # noqa: E731
    unpriced, beyond_bound, stopped = [], 0, None
    extra = itertools.count(len(cands))   # heap indices of the candidates added below

    def try_without_overlap(c, bound: float, for_memory: bool = True) -> None:
        """Queue c without the TP overlap (enumeration without_tp_overlap) at c's `bound`:
        for memory where c has no plan that fits, or one that recomputes or offloads layers,
        or its bound without the buffers (bounds without_buffers_bound) is below its known
        plan (the buffers forced a slower split) or, where c's own lower bound (which holds
        the recompute and the split c's buffers need) is beyond the threshold, within it;
        or where the overlap makes a pass slower (`for_memory` False). c's bound holds for
        the twin (planner.search.bounds takes the faster of the two), and is the least in the
        heap now (what is drawn later bounds above it), so the twin is visited next but for
        candidates of the same bound; its model states are c's less its buffers (the states
        screens passed), its own bound is taken there (lower_bound), its figures built only
        then."""
        t = without_tp_overlap(engine, c, for_memory)
        if t is not None:
            twin_of[t] = c
            heapq.heappush(live_heap, (bound, next(extra), t))

    tightened = set()   # the candidates whose heap bound holds their exposure floor
    for item in live_in_order():
        lb0, idx, c = item
        if lb0 > best_heur.threshold() * (1 + 1e-9):
            stopped = item   # the rest: screened where the rejected layouts need them (below)
            break
        rules = rules_of(c)
        if c not in tightened:
            # its bound with the ZeRO collectives and host copies that stick out at least
            # (SharedCoefficients.exposure_floor, a build of its own): taken only for the
            # candidates that reach the top, and where it is higher, c goes back in its place
            tightened.add(c)
            tight = shared.quick_bound(c, rules, cap, exposed=True)
            if tight > lb0 * (1 + 1e-9):
                heapq.heappush(live_heap, (tight, idx, c))
                continue
        coeffs = memory_test(c, rules)
        if coeffs is None:
            try_without_overlap(c, lb0)
            continue
        slower = any(k.tp_overlap_slower for k in coeffs)
        if slower:
            try_without_overlap(c, lb0, for_memory=False)
        low = [lower_coeffs(k) for k in coeffs] if coeffs[0].moe is not None else coeffs
        # the bottleneck of the bound, and of the split priced beside the heuristic's below
        got = (bottleneck(coeffs, c, L, cap, rules, Q=Q, low=low, model=model)
               if coeffs[0].moe is not None else bottleneck(coeffs, c, L, cap, rules))
        lb = lower_bound(coeffs, c, L, cap, rules, got=got)
        if lb > best_heur.threshold() * (1 + 1e-9):
            # the loop below stops before it (its threshold is at most this one), and its
            # heuristic plan, no faster than lb, cannot be among the best: not priced. Its
            # bound holds the recompute its own memory needs, the overlap's buffers among it,
            # so not its twin's: the twin is tried on its own bound (lb0 holds for it)
            beyond_bound += 1
            if not slower and without_buffers_bound(coeffs, c, L, cap, rules, lb, Q, model) <= (
                    best_heur.threshold() * (1 + 1e-9)):
                try_without_overlap(c, lb0)
            continue
        heur = heuristic(model, cluster, c, coeffs, cap, rules, engine=engine,
                         margin_gib=margin_gib)
        # c's best known plan: the heuristic's, and where the layers are placed, the split
        # at the bottleneck of lower_bound priced as well (a real plan of c, often nearer its
        # optimum than the even split)
        known = heur if heur.estimate.fits else None
        if c.pp > 1 and not (rules.equal_split or rules.fixed_split):
            split = bottleneck_split(coeffs, c, L, cap, rules, Q=Q, got=got)
            if split is not None and split != heur.layers:
                alt = heuristic(model, cluster, c, coeffs, cap, rules, split=split,
                                engine=engine, margin_gib=margin_gib)
                if alt.estimate.fits and (known is None or alt.estimate.step_time_s
                                          < known.estimate.step_time_s):
                    known = alt
        known = plain(known)
        if known is not None:
            best_heur.add(known.estimate.step_time_s, key=pair(c))
        # the twin's times are c's or more: only its memory, freed of the buffers, can bring
        # it under c's known plan (fewer layers recomputed, or a faster split)
        if not slower and (known is None or any(known.recompute) or without_buffers_bound(
                coeffs, c, L, cap, rules, lb, Q, model) < known.estimate.step_time_s * (
                    1 - 1e-9)):
            try_without_overlap(c, lb0)
        scored.append((lb, c, coeffs, heur, rules, low, known))
    # the states screens' rejects first, in enumeration order, then those of memory_test
    # (their bounds, what rejected_layouts orders by, taken where it needs them: bound_of)
    screened_out = len(states_out)
    infeasible[:0] = [entry for _, entry in sorted(states_out, key=lambda x: x[0])]
    # Candidates in lower-bound order. Heuristic and bottleneck-split placements are real
    # plans, so the K-th best of them is a threshold a candidate's bound must beat to be worth
    # an exact solve (the placement a solve returns does not depend on that cutoff:
    # planner.search.placement.solve_cpsat).
    scored.sort(key=lambda x: x[0])
    # best known plan per candidate: the better of its heuristic and bottleneck-split plans
    plans = {x[1]: x[6] for x in scored if x[6] is not None}
    best_plans = TopTimes(top)
    for c, r in plans.items():
        best_plans.add(r.estimate.step_time_s, pair(c))
    solved, pruned_bound, pruned_placement = 0, 0, 0
    # a bound past the threshold, or no placement that fits (inf)
    beyond = lambda b, t: math.isinf(b) or b > t * (1 + 1e-9)   # noqa: E731
    # least step time a candidate not solved to optimality might still reach (the whole
    # search's gap), and how many solves stopped at the time limit
    open_bound, limit_hit = math.inf, 0
    for i, (lb, c, coeffs, heur, rules, low, known) in enumerate(scored):
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
        elif Q is not None and c.vpp == 1 and beyond(
                placement_bound(coeffs, c, cap, rules, P_kinds), threshold):
            # every placement of the exact model overflows or is slower than the K-th best
            # plan: what the solve below would prove (INFEASIBLE), its heuristic plan kept
            res, fits = heur, heur.estimate.fits
            res.status = "INFEASIBLE"
            pruned_placement += 1
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
        if not fits:
            consider_closest(res)
        if known is not None and (not fits or known.estimate.step_time_s
                                  < res.estimate.step_time_s):
            # the solve found nothing better than c's plan so far (INFEASIBLE: nothing beats
            # the cutoff; UNKNOWN or FEASIBLE: stopped at the limit): that plan is kept
            if known is not heur:
                gap = (res.gap if res.bound_s is None else max(
                    0.0, 1 - res.bound_s / known.estimate.step_time_s))
                known = dataclasses.replace(known, status=res.status, gap=gap,
                                            bound_s=res.bound_s)
            res, fits = known, True
        if fits:
            res = plain(res)
            plans[c] = res
            best_plans.add(res.estimate.step_time_s, pair(c))
    ranked = fastest_per_key(((pair(c), r) for c, r in plans.items()), top)
    if not ranked and _offload_may_help(model, f, engine):
        # nothing fits on the GPUs alone: search again with the engine's offloads
        # (planner.cost.offload), where the states that do not fit may go
        return search(model, cluster, dataclasses.replace(f, offload_searched=True), seq_len,
                      gbs, top, progress, engine, margin_gib, rejected, find_closest)
    if not ranked and find_closest:   # nothing fits: find the candidate that misses by the least
        closest = _closest(model, cluster, engine, margin_gib, shared, infeasible, closest)
    unscreened = screens_out = 0   # of the rest where the visit stopped (below)

    def bound_of(c) -> float:
        """A rejected candidate's bound (quick_bound where the search took none)."""
        got = rejected_bounds.get(c)
        if got is None:
            got = rejected_bounds[c] = shared.quick_bound(c)
        return got

    floors = {}

    def floor_of(c) -> float:
        """At most bound_of(c), and cheaper where the bound is not known yet."""
        got = rejected_bounds.get(c)
        if got is None:
            got = floors.get(c)
            if got is None:
                got = floors[c] = shared.time_floor(c)
        return got

    before = pruned_mem
    ideals = {}   # candidate -> its ideal price (_ideal_price), shared with rejected_layouts
    if rejected and ranked and stopped is not None:
        # The rejected candidates planner.explain can show (rejected_layouts): the layouts
        # (tp, cp, pp, dp) of the least ideal steps (an even split's price, at least a
        # candidate's bound) among the candidates that cannot fit, below the best plan's, and
        # every candidate of those layouts that cannot fit (their least overflow). Taken as
        # rejected_layouts takes them, in bound order until a bound passes its cut (the plan's
        # step, or the shown-th least layout ideal so far): the unpriced candidates enter at
        # their quick bound, re-enter when drawn at the bound with their exposure floor (below
        # any placement's step, fitting or not: every_placement_bound; a reject's ideal is
        # one) and are memory-tested when drawn again, so that only those whose bound is
        # within the cut are tested (a reject re-enters at its own bound). Then
        # the candidates of the layouts found are screened and memory-tested, the rest pruned
        # by bound unscreened. tests/test_cli_explain.py checks the layouts shown against every
        # candidate memory-tested.
        base = ranked[0].estimate.step_time_s
        draw(base)
        unpriced = sorted([stopped] + list(live_heap), key=lambda x: x[1])
        found = LayoutIdeals(model, cluster, engine, margin_gib, f, base, ideals)
        order = itertools.count()
        REJECTED, UNTESTED, TIGHT = 0, 1, 2   # a queued candidate's state
        queue = [(bound_of(c), next(order), c, REJECTED) for c, _, _ in infeasible
                 if floor_of(c) <= base]
        queue += [(b, next(order), c, UNTESTED) for b, c in
                  ((shared.quick_bound(c), c) for _, _, c in unpriced) if b < base]
        heapq.heapify(queue)
        tested = set()
        while queue and queue[0][0] <= found.cut():
            key, _, c, state = heapq.heappop(queue)
            if state == REJECTED:
                found.take(c, rules_of(c))
            elif state == UNTESTED:   # its bound with the exposure floor first, then its turn
                tight = shared.every_placement_bound(c)
                heapq.heappush(queue, (max(key, tight), next(order), c, TIGHT))
            else:
                tested.add(c)
                if memory_test(c, rules_of(c)) is None and floor_of(c) <= base:
                    heapq.heappush(queue, (bound_of(c), next(order), c, REJECTED))
        shown = found.layouts()
        rest = pending[drawn:] + bounded
        del pending[drawn:], bounded[:]
        for item in rest:
            _, idx, c = item
            if layout_of(c) not in shown:
                unscreened += 1
            elif shared.states_can_fit(c, cap):
                unpriced.append(item)
            else:
                pruned_mem += 1
                screens_out += 1
                states_out.append((idx, (c, None, rules_of(c))))
        infeasible[:screened_out] = [entry for _, entry in
                                     sorted(states_out, key=lambda x: x[0])]
        unpriced.sort(key=lambda x: x[1])
        for _, _, c in unpriced:
            if c not in tested and layout_of(c) in shown:
                memory_test(c, rules_of(c))
    # the rest: beyond the bound (the unpriced ones the memory tests above did not reject)
    pruned_bound += (len(unpriced) - (pruned_mem - before - screens_out) + unscreened
                     + beyond_bound + pruned_placement)
    out_of_memory = [(c, "out of memory on every placement of its layers")
                     for c, _, _ in infeasible]
    gap = 0.0
    if ranked:
        best_s = ranked[0].estimate.step_time_s
        gap = max(0.0, (best_s - min(best_s, open_bound)) / best_s)
    shown_rejected = (rejected_layouts(model, cluster, engine, margin_gib, f, out_of_memory,
                                       bound_of, floor_of, ranked[0].estimate.step_time_s,
                                       ideals=ideals)
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
    (`needed_gib` of `capacity_gib`), `recomputes_all` when that rank recomputes all its
    layers."""
    candidate: Candidate
    ideal_step_s: float
    overflow_gib: float
    rank: int
    needed_gib: float
    capacity_gib: float
    recomputes_all: bool


def _ideal_price(model, cluster, c, rules: Rules, engine, margin_gib):
    """The candidate's price on the engine's default split (planner.rules.default_split, as
    the heuristic places it) with no more recompute than fixed: its speed if memory allowed."""
    split = V.default_split(get_engine(engine), model.num_layers, c.pp, c.vpp)
    rec0 = list(split) if rules.all_layers_recomputed else [0] * c.pp
    return price(model, cluster, c, split, rec0, engine, margin_gib)


def _overflow(model, cluster, c, coeffs, rules: Rules, engine, margin_gib) -> tuple:
    """(GiB over, rank, needed GiB, capacity GiB, recomputes all) of a candidate that fits
    on no placement: the worst rank of the heuristic placement (even split, the least
    recompute that could help)."""
    layers, rec = heuristic_placement(model, c, coeffs,
                                      capacity_bytes(cluster, engine, margin_gib), rules,
                                      engine=engine)
    over, mems, caps = overflow(model, cluster, c, layers, rec, coeffs, engine, margin_gib)
    k = max(range(len(over)), key=lambda i: over[i])
    return (over[k], k, mems[k]["needed"], min(caps),
            bool(rec[k] == layers[k] and layers[k] and c.recompute != "none"))


def layout_of(c: Candidate) -> tuple:
    """The layout a rejected candidate is shown under: (tp, cp, pp, dp)."""
    return c.tp, c.cp, c.pp, c.dp


class LayoutIdeals:
    """The rejected candidates' ideal steps (_ideal_price) taken in bound order, as
    rejected_layouts takes them: per layout its variants priced so far and their least, and
    the cut past which a bound (at most the ideal) can neither enter nor reorder the `shown`
    layouts: the plan's step `base`, or the shown-th least layout so far. `ideals`: the
    prices by candidate, kept across instances (each priced once)."""

    def __init__(self, model, cluster, engine, margin_gib, f: Fixed, base: float,
                 ideals: dict, shown: int = REJECTED_LAYOUTS_SHOWN):
        self.model, self.cluster, self.engine = model, cluster, get_engine(engine)
        self.margin_gib, self.f, self.base, self.shown = margin_gib, f, base, shown
        self.ideals = ideals
        self.groups = {}   # layout -> [(ideal step, candidate, coefficients, rules)]
        self.mins = {}     # layout -> least ideal step

    def cut(self) -> float:
        least = sorted(self.mins.values())
        return min(self.base, least[self.shown - 1] if len(least) >= self.shown else math.inf)

    def ideal(self, c: Candidate, rules: Rules):
        """c's ideal price (_ideal_price), taken once."""
        got = self.ideals.get(c)
        if got is None:
            got = self.ideals[c] = _ideal_price(self.model, self.cluster, c, rules,
                                                self.engine, self.margin_gib)
        return got

    def take(self, c: Candidate, rules: Rules) -> None:
        ideal = self.ideal(c, rules)
        step = ideal.estimate.step_time_s
        self.groups.setdefault(layout_of(c), []).append((step, c, ideal.coeffs, rules))
        self.mins[layout_of(c)] = min(self.mins.get(layout_of(c), math.inf), step)

    def layouts(self) -> set:
        """The layouts shown: those of the `shown` least ideals below `base`, and any that
        ties the last of them (whichever the order of their taking puts first)."""
        below = sorted(x for x in self.mins.values() if x < self.base)
        if not below:
            return set()
        last = below[min(self.shown, len(below)) - 1]
        return {k for k, x in self.mins.items() if x <= last}


def rejected_layouts(model, cluster, engine, margin_gib, f: Fixed, rejected: list,
                     bound_of, floor_of, base: float,
                     shown: int = REJECTED_LAYOUTS_SHOWN, ideals: dict | None = None) -> list:
    """[RejectedLayout] of the `shown` layouts among the `rejected` (Candidate, reason) whose
    ideal beats the plan's step `base`, fastest ideal first.

    Ideals (a placement's step time) are at least a candidate's bound (`bound_of`: the
    search's quick bound), and that at least its floor (`floor_of`, cheaper). In bound order,
    once a bound exceeds the plan's step and the shown-th smallest layout minimum so far, no
    later candidate can enter or reorder the layouts shown: those are left unpriced, and a
    candidate whose floor is past the plan's step has its bound taken only where its layout is
    shown. `ideals`: the prices already taken, by candidate (LayoutIdeals)."""
    engine = get_engine(engine)
    # (bound, place in `rejected`): the order the layouts' variants are taken in
    near, far = [], []
    for pos, (c, _) in enumerate(rejected):
        if floor_of(c) <= base:
            near.append((bound_of(c), pos, c))
        else:
            far.append((pos, c))
    near.sort(key=lambda x: x[:2])
    found = LayoutIdeals(model, cluster, engine, margin_gib, f, base,
                         {} if ideals is None else ideals, shown)
    groups = found.groups   # one row per layout: its variants (ZeRO, micro-batch, ...) alike
    rest = []     # past the cut, in bound order
    for i, (lb, pos, c) in enumerate(near):
        if lb > found.cut():
            rest = near[i:]
            break
        found.take(c, rules_for(engine, c, f))
    # a floor past the plan's step is a bound past every cut: after all of `near` taken
    rest = sorted(rest + [(bound_of(c), pos, c) for pos, c in far if layout_of(c) in groups],
                  key=lambda x: x[:2])
    for _, _, c in rest:
        if layout_of(c) in groups:   # the shown layouts' other variants, unpriced
            groups[layout_of(c)].append((math.inf, c, None, rules_for(engine, c, f)))
    ordered = sorted(groups.values(), key=lambda g: min(x[0] for x in g))
    out = []
    for group in [g for g in ordered if min(x[0] for x in g) < base][:shown]:
        rows = [(_overflow(model, cluster, c, coeffs or stage_coefficients(model, cluster, c,
                                                                           engine),
                           rules, engine, margin_gib), step, c)
                for step, c, coeffs, rules in group]
        (over, k, needed, capacity, recomputes_all), step, c = min(rows, key=lambda x: x[0][0])
        if not math.isfinite(step):   # a variant the quick bound skipped: price it now
            step = found.ideal(c, rules_for(engine, c, f)).estimate.step_time_s
        out.append(RejectedLayout(candidate=c, ideal_step_s=step, overflow_gib=over, rank=k,
                                  needed_gib=needed, capacity_gib=capacity,
                                  recomputes_all=recomputes_all))
    return out


def _offload_may_help(model, f, engine) -> bool:
    """The search may look again with offload: not fixed, not looked at yet, an engine that
    offloads and a model it is priced for (enumeration.searched_offloads)."""
    return (f.offload_optimizer is None and f.offload_params is None
            and not f.offload_searched and bool(engine.offload_optimizer_devices)
            and not model.is_moe)


def offload_overflow(model, cluster, f, seq_len, gbs, engine) -> str | None:
    """Where the fixed offload is what leaves no candidate: the host memory (or NVMe) the
    least-hungry layout would need, one line (planner.rules.offload_capacity_problem)."""
    if f.offload_optimizer is None and f.offload_params is None:
        return None
    free = dataclasses.replace(f, offload_optimizer=None, offload_params=None)
    plain = enumerate_candidates(model, cluster, free, seq_len, gbs, engine)
    opt, par = f.offload_optimizer or "none", f.offload_params or "none"
    uses = [host_use(model, cluster, dataclasses.replace(c, offload_optimizer=opt,
                                                         offload_params=par), engine)
            for c in plain
            if not V.offload_problem(engine, cluster, opt, par, c.zero, model, c.dp * c.cp)]
    if not uses:
        return None
    least = min(uses, key=lambda h: (h.host_gib / max(h.host_capacity_gib, 1e-9),
                                     h.nvme_tib / max(h.nvme_capacity_tib, 1e-9)))
    knobs = " ".join(f"--offload-{k} {v}" for k, v in (("optimizer", opt), ("params", par))
                     if v != "none")
    problem = V.offload_capacity_problem(least, knobs)
    return problem.line if problem else None


def _why_no_candidates(model, cluster, f, gbs, engine) -> str:
    return (f"no configuration of {cluster.num_gpus} GPUs that {engine.name} can run matches "
            f"the fixed choices and global batch {gbs} (tp must divide the heads, pp the "
            f"layers, dp*micro-batch the global batch)")


# ---- results to plans -------------------------------------------------------

def to_plan(model: Model, cluster: Cluster, r: Result, report: SearchReport | None = None,
            engine: Engine | str | None = None) -> Plan:
    c = r.candidate
    engine = get_engine(engine if engine is not None else report.engine if report else None)
    if c.recompute != "none" and not any(r.recompute):
        # no layer recomputed: the run is the recompute-free one, and the plan says so
        # (recompute "none"); priced as that run (planner.cost.stage: the last stage's loss
        # peak and a layer's working set apart), so the saved plan re-prices as it was emitted
        c = dataclasses.replace(c, recompute="none", recompute_modules=DEFAULT_MODULES)
        again = price(model, cluster, c, r.layers, r.recompute, engine,
                      report.margin_gib if report is not None else None)
        r = dataclasses.replace(r, candidate=c, estimate=again.estimate)
    par = Parallelism(tp=c.tp, pp=c.pp, dp=c.dp, cp=c.cp, cp_comm_type=c.cp_comm,
                      ep=c.ep, etp=c.etp, zero_stage=c.zero, sequence_parallel=c.sp,
                      tp_comm_overlap=c.tp_comm_overlap,
                      moe_dispatcher=(candidate_dispatcher(model, cluster, c, engine)
                                      if model.is_moe else ""),
                      ep_comm_overlap=c.ep_comm_overlap,
                      moe_capacity_factor=c.moe_capacity_factor,
                      moe_imbalance=c.moe_imbalance,
                      offload_optimizer=c.offload_optimizer, offload_params=c.offload_params,
                      dp_shard=c.dp_shard, zeropp=c.zeropp,
                      vpp=c.vpp, schedule=c.schedule if c.pp > 1 else "1f1b",
                      recompute=c.recompute,   # "none" where no layer recomputes (above)
                      recompute_modules=(c.recompute_modules if c.recompute == "selective"
                                         else DEFAULT_MODULES))
    batch = Batch(seq_len=c.seq_len, global_batch_size=c.global_batch, micro_batch_size=c.mbs,
                  num_microbatches=c.m)
    stages = make_stages(model.num_layers, c.pp, c.vpp, r.layers, r.recompute,
                         v_shape=c.schedule in V_SCHEDULES and c.pp > 1)
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
                recipe=c.recipe or default_recipe(engine, c.precision), compile=engine.compiled)

