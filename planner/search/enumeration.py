"""The search's outer choices: the candidates (tp, cp and its K/V exchange, pp, dp, ZeRO,
sequence parallel, micro-batch, schedule and virtual stages, recompute, ep and etp) that the
fixed choices, the engine and planner.rules allow, less the CP exchanges another
dominates."""
from __future__ import annotations

from dataclasses import dataclass, fields

from planner import rules as V
from planner.limits import divisors
from planner.cost.moe import layer_kinds
from planner.cost.facts import facts_for
from planner.cost.context import cp_exchange
from planner.cost.recompute import DEFAULT_MODULES, cheap_modules
from planner.cost.schedule import schedule_problem
from planner.cost.offload import host_use
from planner.cost.stage import Candidate
from planner.engines import get_engine
from planner.engines.spec import Engine
from planner.specs import Cluster, Model
from planner.vocab import MULTI_CHUNK_SCHEDULES, V_SCHEDULES, ZERO_BUBBLE_SCHEDULES


# The searched space (search choices, not cost-model figures): micro-batches beyond 16 and
# more than 4 virtual stages per rank rarely pay off and multiply the candidates.
MICRO_BATCHES = (1, 2, 4, 8, 16)
SEARCHED_VPP = (2, 3, 4)
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
    # the model and loss under torch.compile (planner.engines.spec with_compile), where the
    # engine has the option; the user's choice, never searched
    compile: bool = False
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
    # allows (planner.rules.ep_comm_overlap_blockers); False: priced and exported without
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
    # offload (planner.cost.offload): where the optimizer states and the parameters live
    # ("none", "cpu", "nvme"); None: "none", or searched among the engine's where
    # `offload_searched` (the search's second pass, when nothing fits without)
    offload_optimizer: str | None = None
    offload_params: str | None = None
    offload_searched: bool = False
    # hybrid sharding: ZeRO over groups of dp_shard data-parallel ranks, replicated across
    # (planner.cost.dataparallel); None: searched (the dp ranks of one node, where the engine
    # shards inside groups), 0: never
    dp_shard: int | None = None
    # ZeRO++ (DeepSpeed ZeRO-3); None: searched where the engine has it, False: never
    zeropp: bool | None = None


def searched_recompute(engine: Engine, f: Fixed, model: Model, cluster: Cluster | None = None,
                       pp: int = 1) -> list:
    """(granularity, selective modules) pairs to try at pipeline size `pp`. A count-based
    granularity (any number of a rank's layers, 0 included) covers "none"; an every-layer-or-
    none one needs "none" beside it. Selective recompute of the attention core only saves
    memory when attention scores are materialised (no flash); where the engine recomputes
    modules (Megatron), the output-discarding ones that apply to the model are tried too
    (planner.cost.recompute). Activation offload only where the engine runs it at `pp` on
    `cluster` (planner.rules.activation_offload_problem)."""
    def offload_ok():
        return cluster is not None and not V.activation_offload_problem(engine, cluster, pp)

    if f.recompute:
        if f.recompute == "offload" and not offload_ok():
            return []
        return [(f.recompute, f.recompute_modules or DEFAULT_MODULES)]
    modes = [g for g in engine.recompute_modes if not (g == "selective" and f.flash)
             and (g != "offload" or offload_ok())]
    if all(engine.all_layers_recomputed(g) for g in modes if g != "offload"):
        # (an offload of no layer is ranked as the plan without recompute: planner.search)
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


# enumerate_candidates' memo: a mixed search enumerates its slowest-GPU cluster for itself and
# again for that cluster alone (planner.search.groups); a few entries, each a list of frozen
# candidates handed out as a copy
_ENUMERATED: dict = {}
_ENUMERATED_KEPT = 8


def enumerate_candidates(model: Model, cluster: Cluster, f: Fixed, seq_len: int, gbs: int,
                         engine: Engine | None = None) -> list:
    engine = get_engine(engine)
    key = (model, cluster, repr(f), seq_len, gbs, engine)
    got = _ENUMERATED.get(key)
    if got is None:
        if len(_ENUMERATED) >= _ENUMERATED_KEPT:
            _ENUMERATED.pop(next(iter(_ENUMERATED)))
        got = _ENUMERATED[key] = _enumerate(model, cluster, f, seq_len, gbs, engine)
    return list(got)


def _enumerate(model: Model, cluster: Cluster, f: Fixed, seq_len: int, gbs: int,
               engine: Engine) -> list:
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
    n = cluster.num_gpus
    out = []
    if not engine.pipelines:
        pps = [1]
    else:
        pps = [f.pp] if f.pp else [p for p in divisors(n // (tp * cp)) if V.pp_ok(model, p)]
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
                if sch in V_SCHEDULES:   # exactly 2 chunks per rank (torch's V schedules)
                    scheds += [(sch, 2)] if f.vpp in (None, 2) and V.pp_ok(model, pp, 2) else []
                elif sch in MULTI_CHUNK_SCHEDULES:
                    vpps = [f.vpp] if f.vpp and f.vpp > 1 else list(SEARCHED_VPP)
                    scheds += [(sch, v) for v in vpps if V.pp_ok(model, pp, v, engine)
                               and (f.stage_layers is None or not V.split_blockers(
                                   model.num_layers, pp, v, f.stage_layers, engine))]
                elif f.vpp in (None, 1):
                    scheds.append((sch, 1))
        recs = searched_recompute(engine, f, model, cluster, pp)
        experts = expert_layouts(model, f, engine, tp, dp, cp)
        dispatcher_fixed = (f.moe_dispatcher or "") if model.is_moe else ""
        capacity = f.moe_capacity_factor if model.is_moe else None
        imbalance = f.moe_imbalance if model.is_moe else 1.0
        if model.is_moe:
            if tp > 1 and engine.moe_tp_needs_sp:   # planner.rules's rule, engine data
                sps = [x for x in sps if x]
            if layer_kinds(model) and pp > 1 and not f.vpp:
                # dense and MoE layers mixed: interleaving only where asked for (--vpp; then
                # placed exactly). Searched, its chunk-level placements multiply the exact
                # solves (deepseek-v3 on h100x256: 105 s instead of 19 s, no faster plan found)
                scheds = [(sch, v) for sch, v in scheds if v == 1]
            if layer_kinds(model) and pp > 1:   # kinds are placed on the looped layout only
                scheds = [(sch, v) for sch, v in scheds if sch not in V_SCHEDULES]
        overlaps = {}   # (ep, schedule) -> _recompute_and_ep_overlap of this pp
        for mbs in mbss:
            if per_dp % mbs:
                continue
            m = per_dp // mbs
            for sch, v in scheds:
                if sch == "interleaved" and not V.interleaved_ok(m, pp):
                    continue
                if sch in ZERO_BUBBLE_SCHEDULES and schedule_problem(sch, pp, m, v):
                    continue
                for zero in zeros:
                    if zero and dp * cp == 1:
                        continue
                    if sch in ZERO_BUBBLE_SCHEDULES and zero not in (
                            engine.zero_bubble_zero_stages or (zero,)):
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
                                                     and engine.tp_comm_overlap
                                                     and V.tp_comm_overlap_fits(
                                                         engine, cluster, tp,
                                                         cluster.num_gpus)),
                                    moe_dispatcher=dispatcher_fixed, ep_comm_overlap=overlap,
                                    moe_capacity_factor=capacity,
                                    moe_imbalance=imbalance,
                                    offload_optimizer="none", offload_params="none",
                                    dp_shard=0, zeropp=False)))
    out = _with_zeropp(f, engine, _with_hsdp(model, cluster, f, engine, out))
    return _with_offloads(model, cluster, f, engine, out)


def _with_zeropp(f: Fixed, engine: Engine, candidates: list) -> list:
    """The candidates with ZeRO++: fixed (--zeropp), on every ZeRO-3 candidate (the others
    dropped); searched, a twin of each ZeRO-3 candidate with data parallelism and without
    hybrid sharding, where the engine has it (planner.rules.zeropp_problem)."""
    if f.zeropp is False or (f.zeropp is None and not engine.zeropp):
        return candidates
    out = []
    for c in candidates:
        ok = c.dp * c.cp > 1 and not V.zeropp_problem(engine, c.zero, c.dp_shard)
        if f.zeropp is None:
            out.append(c)
        if ok:
            out.append(_candidate({**c.__dict__, "zeropp": True}))
    return out


def _with_hsdp(model: Model, cluster: Cluster, f: Fixed, engine: Engine,
               candidates: list) -> list:
    """The candidates with hybrid sharding: a fixed --dp-shard on every candidate it applies
    to (planner.rules.hsdp_problem), the others dropped; searched, each candidate whose ZeRO
    stage the engine shards in groups gets a twin sharded over the data-parallel ranks of one
    node (gpus_per_node / tp: the shard group's collectives on NVLink, only the replicas'
    all-reduce across nodes), where that is neither 1 nor all of dp."""
    if f.dp_shard == 0 or (f.dp_shard is None and not engine.hsdp_zero_stages):
        return candidates
    out = []
    for c in candidates:
        if f.dp_shard is not None:
            shard = 0 if f.dp_shard == c.dp * c.cp else f.dp_shard
            if not V.hsdp_problem(engine, shard, c.dp, c.cp, c.zero, model):
                out.append(_candidate({**c.__dict__, "dp_shard": shard}))
            continue
        out.append(c)
        shard = cluster.gpus_per_node // c.tp
        if (c.cp == 1 and 1 < shard < c.dp and c.tp * shard == cluster.gpus_per_node
                and not V.hsdp_problem(engine, shard, c.dp, c.cp, c.zero, model)):
            out.append(_candidate({**c.__dict__, "dp_shard": shard}))
    return out


def searched_offloads(model: Model, f: Fixed, engine: Engine) -> list:
    """(optimizer, parameters) offload pairs to try: the fixed ones; else none, and where the
    search looks for offload (`Fixed.offload_searched`) the optimizer to each device the
    engine has, with the parameters beside it (never the parameters alone: the optimizer
    states are the larger). MoE models are not priced with offload (planner.cost.moe prices
    their optimizer on the GPU)."""
    if f.offload_optimizer is not None or f.offload_params is not None:
        return [(f.offload_optimizer or "none", f.offload_params or "none")]
    if not f.offload_searched or model.is_moe:
        return [("none", "none")]
    out = [("none", "none")]
    for opt in engine.offload_optimizer_devices:
        out.append((opt, "none"))
        out += [(opt, par) for par in engine.offload_param_devices
                if not (opt == "cpu" and par == "nvme")]
    return out


def _with_offloads(model: Model, cluster: Cluster, f: Fixed, engine: Engine,
                   candidates: list) -> list:
    """Each candidate with each offload pair it may take (searched_offloads) that the rules
    allow (planner.rules.offload_problem) and the node's host memory and NVMe hold
    (planner.cost.offload.host_use); a pair on NVMe where the same pair on host memory fits is
    left out (host memory is the faster, and the GPU's memory is the same)."""
    pairs = searched_offloads(model, f, engine)
    if pairs == [("none", "none")]:
        return candidates
    searched = f.offload_optimizer is None and f.offload_params is None
    out = []
    for c in candidates:
        for opt, par in pairs:
            if (opt, par) == ("none", "none"):
                out.append(c)
                continue
            k = _candidate({**c.__dict__, "offload_optimizer": opt, "offload_params": par})
            if (V.offload_problem(engine, cluster, opt, par, c.zero, model, c.dp * c.cp)
                    or not host_use(model, cluster, k, engine).fits):
                continue
            faster = _candidate({**k.__dict__,
                                 "offload_optimizer": "cpu" if opt == "nvme" else opt,
                                 "offload_params": "cpu" if par == "nvme" else par})
            if (searched and "nvme" in (opt, par) and not V.offload_problem(
                    engine, cluster, faster.offload_optimizer, faster.offload_params, c.zero)
                    and host_use(model, cluster, faster, engine).fits):
                continue
            out.append(k)
    return out


def without_tp_overlap(engine: Engine, c: Candidate, for_memory: bool = True
                       ) -> Candidate | None:
    """`c` without its TP overlap, else None (c has none). The overlap hides TP collectives
    at the cost of the GEMMs' slowdown beside them and, in Megatron, of its userbuffers
    (planner.cost.memory userbuffer_bytes), so the plan without it can be better two ways,
    and the searches (planner.search search, planner.search.groups search_mixed) try it:
    - for memory (`for_memory`, only where the overlap costs memory: None elsewhere): where
      c's plan does not fit, or fits only recomputing or offloading layers, or c's bound with
      its buffers passes the best plan but not without them (bounds without_buffers_bound);
    - for time: where the overlap makes a pass slower than its plain collectives
      (StageCoeffs.tp_overlap_slower: a tiny GEMM beside a long transfer), on any engine.
    Elsewhere the plan without it is no faster at no less memory: not tried. The searches'
    bounds of c are taken at the faster of the two (planner.search.bounds), so they hold for
    the twin as well."""
    if not c.tp_comm_overlap or (for_memory and not engine.tp_overlap_userbuffers):
        return None
    return _candidate({**c.__dict__, "tp_comm_overlap": False})


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
            ep, pp, sch, rec[0], dispatcher_fixed or "alltoall", mtp_layers, rec[1])
            and not V.ep_overlap_offload_problem(rec[0]))
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
    allows (planner.rules.ep_ok)."""
    if not model.is_moe:
        return [(1, 1)]
    eps = [f.ep] if f.ep else divisors(model.num_experts)
    etps = [f.etp] if f.etp else sorted({1, tp})
    return [(ep, etp) for etp in etps for ep in eps
            if V.ep_ok(model, ep, etp, tp, dp, cp)]


