"""Human-readable reports of a plan: the choice, per-stage memory, time breakdown, alternatives.

`render` prints a plan (rich tables, plain text); `alternatives` words why the runners-up of a
search lost, from what the search reported (planner.search.SearchReport): slower (and by which
part of the step), out of memory (its rejected layouts: on which stage, by how much, how fast
if it fit), or not divisible (a degree the model or the batch cannot be split by). Nothing
here searches or places layers: a saved plan's times and memory are its price
(planner.cost.price); `no_configuration_message` words planner.suggest's NoConfiguration.
"""
from __future__ import annotations

import dataclasses
import io

from rich.console import Console
from rich.table import Table

from planner import rules as V
from planner.limits import divisors
from planner.cost.price import price_plan
from planner.cost.stage import MEMORY_CATEGORIES
from planner.errors import BadInput
from planner.power import limited_name
from planner.engines import get_engine
from planner.plan import Plan
from planner.precision import fp8_primary_weights

PARTS = {"compute": "compute", "tp_comm": "TP comm", "cp_comm": "exposed CP comm",
         "pp_comm": "PP comm",
         "dp_comm_exposed": "exposed DP comm", "bubble": "bubble", "optimizer": "optimizer",
         "ep_comm": "EP dispatch+combine", "offload": "exposed offload copies",
         "activation_offload": "exposed activation offload copies"}
NOT_DIVISIBLE_SHOWN = 3


def _fmt_tflops(x: float) -> str:
    return f"{x:.0f}" if x >= 10 else f"{x:.3g}"   # CPU runs are far below 1 TFLOP/s


def _fmt_time(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def summary_line(plan: Plan) -> str:
    p, b = plan.parallelism, plan.batch
    parts = [f"tp={p.tp}"]
    if p.cp > 1:
        parts.append(f"cp={p.cp}({p.cp_comm_type})")
    parts += [f"pp={p.pp}", f"dp={p.dp}"]
    if plan.model.is_moe:
        parts.append(_experts(plan.model, p.tp, p.dp, p.ep, p.etp))
        if p.moe_dispatcher:
            parts.append(f"dispatch={p.moe_dispatcher}"
                         + ("+ep-comm-overlap" if p.ep_comm_overlap else ""))
    parts.append(f"zero={p.zero_stage}" + (f"(hsdp {p.dp * p.cp // p.dp_shard}x{p.dp_shard})"
                                           if p.dp_shard else ""))
    if p.tp > 1:
        parts.append("sp" if p.sequence_parallel else "no-sp")
        if p.tp_comm_overlap:
            parts.append("tp-comm-overlap")
    if p.pp > 1:
        parts.append(p.schedule + (f"(vpp={p.vpp})" if p.vpp > 1 else ""))
    parts.append(f"mbs={b.micro_batch_size}x{b.num_microbatches}")
    parts += offload_labels(p)
    rec = sum(s.recompute_layers for s in plan.stages)
    parts.append(f"recompute={recompute_label(p.recompute, p.recompute_modules)}"
                 + (f"({rec}/{plan.model.num_layers} layers)" if p.recompute != "none" else ""))
    return " ".join(parts)


def offload_labels(p) -> list:
    """offload-optimizer=cpu / offload-params=nvme of a plan's parallelism or a candidate."""
    return ([f"offload-{k}={getattr(p, 'offload_' + k)}" for k in ("optimizer", "params")
             if getattr(p, "offload_" + k, "none") != "none"]
            + (["zero++"] if getattr(p, "zeropp", False) else []))


def recompute_label(mode: str, modules: tuple) -> str:
    """A recompute granularity, with the modules selective recompute recomputes where they are
    not the default attention core: selective:moe_act,layernorm."""
    from planner.cost.recompute import DEFAULT_MODULES
    if mode == "selective" and tuple(modules) != DEFAULT_MODULES:
        return f"selective:{','.join(modules)}"
    return mode


def _experts(model, tp: int, dp: int, ep: int, etp: int) -> str:
    """ep, etp and the expert data parallelism MoE parallel folding leaves."""
    from planner.cost.moe import expert_dp
    return f"ep={ep} etp={etp} (expert-dp={expert_dp(tp, dp, ep, etp)})"


def describe_candidate(c) -> str:
    """One line for a search candidate (planner.cost.Candidate)."""
    hsdp = f"(hsdp {c.replicas}x{c.shard})" if getattr(c, "dp_shard", 0) else ""
    s = f"tp={c.tp} pp={c.pp} dp={c.dp} zero={c.zero}{hsdp}"
    if c.ep > 1 or c.etp > 1:
        s = f"tp={c.tp} pp={c.pp} dp={c.dp} ep={c.ep} etp={c.etp} zero={c.zero}{hsdp}"
    if c.cp > 1:
        s = s.replace(" pp=", f" cp={c.cp}({c.cp_comm}) pp=", 1)
    if c.tp > 1:
        s += " sp" if c.sp else " no-sp"
    if c.pp > 1:
        s += f" {c.schedule}" + (f"(vpp={c.vpp})" if c.vpp > 1 else "")
    s += f" mbs={c.mbs}x{c.m}"
    s += "".join(" " + x for x in offload_labels(c))
    return s + f" recompute={recompute_label(c.recompute, c.recompute_modules)}"


def describe_result(r, num_layers: int) -> str:
    """One line for a solved candidate (planner.search.Result): as describe_candidate, with the
    recompute that the placement actually uses."""
    s = describe_candidate(r.candidate)
    s = s[:s.rindex(" recompute=")]
    rec = sum(r.recompute)
    c = r.candidate
    return s + (f" recompute={recompute_label(c.recompute, c.recompute_modules)}"
                f"({rec}/{num_layers})" if rec else " recompute=none")


# ---- per-rank timing of a saved plan ------------------------------------------------------

def rank_timing(plan: Plan) -> list:
    """Per pipeline rank, one micro-batch through all its chunks: forward, backward (with
    recompute) and total seconds, plus the once-per-step tail (exposed gradient reduction,
    parameter gather, optimizer), as dicts. The plan's price (planner.cost.price), so it works
    for saved plans too."""
    return [dataclasses.asdict(t) for t in price_plan(plan).rank_times()]


def ensure_estimate(plan: Plan) -> Plan:
    """Fill a plan's estimate and per-stage memory from the cost model when the file lacks
    them (a hand-written plan); a plan that has them is left as saved."""
    if plan.estimate.get("step_time_s") and all(s.memory_gib for s in plan.stages):
        return plan
    try:
        est = price_plan(plan).estimate
    except (ValueError, ZeroDivisionError) as e:
        raise BadInput(f"cannot estimate this plan: {e}") from None
    if not plan.estimate.get("step_time_s"):
        plan.estimate = est.to_dict()
        plan.search = dict(plan.search, estimate="recomputed (the file had none)")
    for s in plan.stages:
        if not s.memory_gib:
            s.memory_gib = {k: round(v, 3) for k, v in est.stage_memory_gib[s.pp_rank].items()}
    return plan


# ---- why the alternatives lost -------------------------------------------------------------

def _slower_because(est, best_est) -> str:
    base = best_est.step_time_s
    pct = (est.step_time_s / base - 1) * 100
    why = f"slower by {pct:.1f}%"
    a, b = est.time_breakdown_s, best_est.time_breakdown_s
    deltas = {k: a.get(k, 0.0) - b.get(k, 0.0) for k in PARTS}
    k = max(deltas, key=deltas.get)
    if deltas[k] > 0 and est.step_time_s > base:
        why += f" (more {PARTS[k]}: +{_fmt_time(deltas[k])})"
    return why


def _rejected_because(r, base) -> str:
    """Why a rejected layout (planner.search.RejectedLayout) lost: the stage that overflows on
    its heuristic placement, and how fast it would be if it fit."""
    c = r.candidate
    where = "" if c.pp == 1 else (f" on stage {r.rank}" if c.vpp == 1
                                  else f" on pipeline rank {r.rank}")
    how = ", recomputing all its layers" if r.recomputes_all else ""
    why = (f"out of memory{where} by {r.overflow_gib:.1f} GiB ({r.needed_gib:.1f} needed of "
           f"{r.capacity_gib:.1f} GiB{how})")
    pct = (r.ideal_step_s / base - 1) * 100
    return why + (f"; would be {-pct:.1f}% faster if it fit" if pct < 0 else
                  f"; {pct:.1f}% slower even if it fit")


def not_divisible(model, cluster, fixed, global_batch: int, engine=None) -> list:
    """[(configuration, reason)] for natural degrees the model or batch cannot be split by
    (the rules of planner.rules; a TP group where the engine lets it live, Engine.tp_fits)."""
    n, eng = cluster.num_gpus, get_engine(engine)
    rows = []
    if fixed is None or fixed.tp is None:
        by_reason = {}
        for tp in (t for t in divisors(n) if 2 <= t and eng.tp_fits(cluster, t)):
            blockers = V.tp_blockers(model, tp, engine=eng)
            if blockers:
                by_reason.setdefault(", ".join(blockers), []).append(tp)
        for reason, tps in by_reason.items():
            rows.append(("tp=" + ",".join(map(str, tps)),
                         f"not divisible: {reason} by tp={'/'.join(map(str, tps))}"))
    if fixed is None or fixed.dp is None:
        bad = sorted(d for d in divisors(n) if not V.batch_ok(global_batch, d))
        if bad:
            shown = ",".join(str(d) for d in bad[:4]) + (",..." if len(bad) > 4 else "")
            rows.append((f"dp={shown}", f"not divisible: global batch {global_batch} by dp "
                         f"(dp = GPUs / (tp*pp))"))
    return rows[:NOT_DIVISIBLE_SHOWN]


_FLAG = {"tp": "--tp", "pp": "--pp", "dp": "--dp", "mbs": "--micro-batch", "vpp": "--vpp",
         "zero": "--zero", "sp": "--sp", "schedule": "--schedule", "recompute": "--recompute"}


def no_configuration_message(model, nc) -> str:
    """Why no configuration matches the fixed choices (planner.suggest.NoConfiguration): the
    choices that, set free, would give some configuration, and the divisibility each one
    breaks."""
    fixed, n, global_batch = nc.fixed, nc.num_gpus, nc.global_batch
    msg = (f"no configuration of {n} GPUs matches the fixed choices with global batch "
           f"{global_batch}")
    reasons = []
    for name in nc.culprits:
        v = getattr(fixed, name)
        if name == "mbs":
            rest = n // ((fixed.tp or 1) * (fixed.pp or 1))      # GPUs left for dp (x free)
            dps = [fixed.dp] if fixed.dp else divisors(rest)
            ok = [d for d in dps if V.batch_ok(global_batch, d)]
            reasons.append(f"--micro-batch {v}: not divisible: the sequences per data-parallel "
                           f"rank ({', '.join(f'{global_batch // d} at dp={d}' for d in ok[:4])}) "
                           f"by {v}")
        elif name in ("schedule", "vpp") and fixed.schedule == "interleaved" or name == "vpp":
            reasons.append(f"{_FLAG[name]} {v}: not divisible: the interleaved schedule needs "
                           f"the micro-batch count divisible by pp and pp*vpp <= "
                           f"{model.num_layers} layers")
        elif name == "zero":
            reasons.append(f"--zero {v}: ZeRO shards over data parallelism, and no "
                           f"configuration here has dp > 1")
        elif name == "dp":
            reasons.append(f"--dp {v}: not divisible: global batch {global_batch} and the "
                           f"other degrees")
        elif name == "dp_shard":
            reasons.append(f"--dp-shard {v}: it divides no data-parallel degree here (dp x cp "
                           f"must be a multiple of it) under a ZeRO stage the engine shards "
                           f"in groups")
        else:
            reasons.append(f"{_FLAG[name]} {v} cannot be combined with the other choices")
    if reasons:
        return msg + "; " + "; ".join(reasons)
    return msg + (" (tp must divide the heads, pp the layers, dp*micro-batch the global batch, "
                  "and the interleaved schedule needs micro-batches divisible by pp)")


def alternatives(model, cluster, report, best, fixed=None) -> list:
    """[(configuration, step seconds or None, why it lost)] for the report's runners-up.

    The fitting runners-up (report.ranked) lost on time: by how much, and the part of the step
    that grew most. The layouts that fit on no placement but would be faster if memory allowed
    (report.rejected_layouts, priced by the search with an even split and no recompute) are
    shown with the stage that overflows and by how much (even split, the least recompute that
    could help). Then degrees that are not divisible.
    """
    out = []
    for r in report.ranked[1:]:
        out.append((describe_result(r, model.num_layers), r.estimate.step_time_s,
                    _slower_because(r.estimate, best.estimate)))
    if best is not None:
        for r in report.rejected_layouts:
            out.append((describe_candidate(r.candidate), None,
                        _rejected_because(r, best.estimate.step_time_s)))
    if report.global_batch:
        for desc, why in not_divisible(model, cluster, fixed, report.global_batch, report.engine):
            out.append((desc, None, why))
    return out


# ---- the report ----------------------------------------------------------------------------

def count_label(n: float) -> str:
    """A parameter count in T, B, M or K as fits: 70.6B, 1.3T, 6.4M."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return f"{n:.0f}"


def custom_gpu_changes(gpu) -> tuple | None:
    """None for a catalog GPU as the catalog has it; else the figures that differ from the
    catalog GPU of its name (a cluster file's "base"), all of them when the name is not in
    the catalog."""
    from planner.catalog.gpus import GPUS
    from planner.power import at_rated_power
    base = GPUS.get(gpu.name)
    if base is None:
        return tuple(f.name for f in dataclasses.fields(gpu) if f.name != "name")
    # a power limit at the part's own rated power leaves it as the catalog has it
    return tuple(f.name for f in dataclasses.fields(gpu)
                 if getattr(gpu, f.name) != getattr(base, f.name)
                 and not (f.name == "power_limit_w"
                          and at_rated_power(gpu.name, gpu.power_limit_w))) or None


def gpu_label(gpu) -> str:
    """The GPU's name, and "custom" with what differs where it is not the catalog's."""
    from planner.catalog.gpus import GPUS
    changed = custom_gpu_changes(gpu)
    if changed is None:
        return gpu.name
    if gpu.name not in GPUS:
        return f"custom GPU {gpu.name!r}"
    if changed == ("power_limit_w",):
        return limited_name(gpu)
    return f"custom GPU (catalog {gpu.name} with {', '.join(changed)} changed)"


def trust_label(engine, gpu, moe: bool = False) -> str:
    """How far to trust the predictions on this GPU: the engine's held-out error on its
    published runs of this GPU generation (MoE models apart: planner.engines.trust.trust_on)
    where they ran on this catalog GPU, else "not validated" (and on which GPUs they are)."""
    from planner.engines.trust import trust_on, validated_gpus, validated_on, validation_of
    if engine.validation is None:
        return "not validated"
    changed = custom_gpu_changes(gpu)
    if changed is None and validated_on(engine.name, gpu.name, moe):
        return trust_on(engine, gpu.name, moe)
    if (changed == ("power_limit_w",) and validated_on(engine.name, gpu.name, moe)
            and validation_of(engine.name, gpu.name, moe, gpu.power_limit_w)):
        # the catalog GPU under a power limit: validated by published runs at that limit only
        return trust_on(engine, gpu.name, moe, gpu.power_limit_w)
    where = "a custom GPU" if changed is not None else gpu.name
    v = validation_of(engine.name, None, moe) or engine.validation
    ran_on = ", ".join(validated_gpus(engine.name, moe))
    return (f"not validated on {where} (its {v.runs} published runs, median +/-"
            f"{v.median_abs_error_pct:.0f}%, ran on {ran_on})")


def precision_label(plan: Plan) -> str:
    """What the block linears run in on the plan's device: the plan's precision (and recipe),
    or fp32 on a CPU, where the runtime runs without autocast (runtime/train.py: bf16 autocast
    on CUDA only) and the catalog's cpu figures are fp32 (planner/catalog/gpus.py)."""
    if plan.cluster.gpu.name == "cpu":
        return "fp32"
    prec = getattr(plan, "precision", "bf16")
    recipe = getattr(plan, "recipe", None)
    p = plan.parallelism
    primary = fp8_primary_weights(get_engine(plan.engine), prec, recipe, p.zero_stage,
                                  p.offload_optimizer)
    return prec + (f" ({recipe}{', FP8 primary weights' if primary else ''})" if recipe else "")


def attention_label(plan: Plan) -> str:
    """The attention kernel priced; on a CPU, SDPA's CPU flash kernel (torch 2.13 selects
    SDPBackend.FLASH_ATTENTION for the runtime's causal and masked calls, fp32)."""
    if plan.cluster.gpu.name == "cpu" and plan.attention == "flash":
        return "flash attention (SDPA's CPU kernel)"
    return f"{plan.attention} attention"


def needed_gib(mem: dict) -> float:
    """A stage's needed GiB (planner.cost.stage MemoryBudget); a plan written before the
    figure existed has its reserved one, which then decided."""
    return mem.get("needed", mem.get("reserved", mem.get("total", 0.0)))


def _peak_memory_text(plan: Plan) -> str:
    """"peak needed X / capacity GiB"; where the ranks' GPUs differ (a mixed cluster), of the
    rank with the least room, named with its group."""
    e, c = plan.estimate, plan.cluster
    caps = e.get("stage_capacity_gib") or []
    groups = plan.rank_groups()
    if caps and groups and len(caps) == len(groups):
        needed = [max((needed_gib(st.memory_gib) for st in plan.stages_of_rank(r)), default=0.0)
                  for r in range(len(caps))]
        r = min(range(len(caps)), key=lambda i: caps[i] - needed[i])
        return (f"least room: {needed[r]:.1f} / {caps[r]:.1f} GiB needed on rank {r} "
                f"({groups[r]})")
    cap = e.get("capacity_gib", c.gpu.memory_gib)
    peak = e.get("peak_needed_gib", e.get("peak_reserved_gib", e["peak_memory_gib"]))
    return f"peak needed {peak:.1f} / {cap:.1f} GiB"


def mixing_lines(mixing: dict, step_s: float | None) -> list:
    """What mixing GPU groups bought (planner.search.groups.MixedReport.mixing_record): the plan
    against the best single group and against every GPU as the slowest."""
    mixed = mixing.get("mixed_step_time_s")
    alone = {k: v for k, v in mixing.get("single_group", {}).items()}
    fits = {k: v for k, v in alone.items() if v is not None}
    out = []
    if mixing.get("chosen", "mixed") != "mixed":
        alone_s = _fmt_time(fits[mixing["chosen"]])
        out.append(f"mixing does not pay: {mixing['chosen']} alone ({alone_s}) beats the best "
                   f"pipeline over the groups ({_fmt_time(mixed)}); planned on it alone"
                   if mixed else
                   f"no pipeline over the groups "
                   f"{'fits' if mixing.get('mixed_candidates', 1) else 'can take the fixed knobs'}"
                   f"; planned on {mixing['chosen']} alone ({alone_s})")
        return out
    best_alone = min(fits.items(), key=lambda kv: kv[1], default=None)
    line = "mixing the groups: "
    if best_alone:
        line += (f"{best_alone[1] / step_s:.2f}x the best single group ({best_alone[0]} alone, "
                 f"{_fmt_time(best_alone[1])})")
    else:
        line += "no group alone fits (" + ", ".join(alone) + ")"
    slow = mixing.get("all_as_slowest")
    if slow:
        line += (f"; {slow['step_time_s'] / step_s:.2f}x all as the slowest ({slow['cluster']}, "
                 f"{_fmt_time(slow['step_time_s'])})" if slow.get("step_time_s")
                 else f"; nothing fits all as the slowest ({slow['cluster']})")
    out.append(line)
    return out


def render(plan: Plan, alternatives: list | None = None, width: int = 120) -> str:
    """The full report. `alternatives`: [(description, step_time_s or None, why_lost)]."""
    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=False, color_system=None)
    e, m, c = plan.estimate, plan.model, plan.cluster
    fits = e.get("fits", False)
    cap = e.get("capacity_gib", c.gpu.memory_gib)
    groups = getattr(c, "groups", None)   # a mixed cluster (planner.specs.MixedCluster)
    where = (" + ".join(f"{g.num_gpus} x {gpu_label(g.gpu)} ({g.name}, {g.gpus_per_node} per "
                        f"node)" for g in groups)
             + f"; {c.inter_gbps:g} GB/s per GPU between groups" if groups
             else f"{c.num_gpus} x {gpu_label(c.gpu)}, {c.gpus_per_node} per node")
    con.print(f"Plan for {m.name} ({count_label(m.num_params())} params, {m.num_layers} "
              f"layers) on {c.name} ({where})")
    engine = get_engine(plan.engine)
    trust = trust_label(engine, c.gpu, plan.model.is_moe)
    if groups:   # no published run over mixed GPUs validates the pipeline over groups
        trust = f"not validated on mixed clusters (on {c.gpu.name} alone: {trust})"
    compiled = ", torch.compile" if plan.compile else ""
    con.print(f"  engine {engine.name} ({engine.title}), {precision_label(plan)}, "
              f"{attention_label(plan)}{compiled}; predictions {trust}")
    con.print(f"  {summary_line(plan)}")
    con.print(f"  seq_len={plan.batch.seq_len} global_batch={plan.batch.global_batch_size} "
              f"sequences")
    if e.get("step_time_s"):
        con.print(f"  step {_fmt_time(e['step_time_s'])}   {e['tokens_per_s']:,.0f} tokens/s   "
                  f"{_fmt_tflops(e['tflops_per_gpu'])} TFLOP/s per GPU   MFU {e['mfu'] * 100:.1f}%   "
                  + _peak_memory_text(plan)
                  + ("" if fits else "   DOES NOT FIT"))
    s = plan.search
    if s:
        bits = []
        if "solver_status" in s:
            bits.append(f"solver {s['solver_status']}")
        if "gap" in s:
            bits.append(f"gap {s['gap'] * 100:.2f}%")
        if "candidates" in s:
            bits.append(f"{s['candidates']} candidates, {s.get('solved', 0)} solved exactly, "
                        f"{s.get('pruned_memory', 0)} out of memory, "
                        f"{s.get('pruned_bound', 0)} pruned by bound")
        if s.get("search_gap") is not None:
            bits.append(f"whole-search gap {s['search_gap'] * 100:.2f}%")
        if s.get("solver_limit_hit"):
            bits.append(f"{s['solver_limit_hit']} stopped at the solver's time limit")
        if "seconds" in s:
            bits.append(f"{s['seconds']:.2f} s")
        if s.get("profile"):
            bits.append(f"profile {s['profile']}")
        if s.get("estimate"):
            bits.append(f"estimate {s['estimate']}")
        if bits:
            con.print("  search: " + ", ".join(bits))
        if s.get("mixing"):   # a mixed cluster (planner.search.groups prices these)
            for line in mixing_lines(s["mixing"], e.get("step_time_s")):
                con.print("  " + line)
        if s.get("precision_choice"):   # --precision auto (planner.precision_choice)
            from planner.precision_choice import choice_lines
            for line in choice_lines(s["precision_choice"]):
                con.print("  " + line)

    try:
        timing = rank_timing(plan)
    except Exception:   # a plan the cost model cannot price (e.g. an unknown GPU): no times
        timing = None
    margin = e.get("memory_margin_gib")
    rank_caps = e.get("stage_capacity_gib") or []
    if rank_caps and groups and c.pipeline:   # per group where the groups' GPUs differ
        usable = ", ".join(dict.fromkeys(
            f"{groups[g].name} {rank_caps[r]:.1f} of {groups[g].gpu.memory_gib:.1f}"
            for r, g in enumerate(c.pipeline)))
        usable = f"usable capacity {usable} GiB"
    else:
        usable = f"usable capacity {cap:.1f} of {c.gpu.memory_gib:.1f} GiB"
    margin_text = ("each GPU's" if rank_caps else f"{margin:.1f}") if margin is not None else ""
    t = Table(title=f"Stages (memory per GPU in GiB; {usable}"
                    + (f" after {engine.context_gib:.1f} context and {margin_text} margin)"
                       if margin is not None else ")"), title_justify="left",
              caption="total: tensors allocated at the peak; needed: with the caching "
                      "allocator's reserve on the activations and buffers, what must fit"
                      + ("\ntime/mb: one micro-batch, forward and backward, through all the layers "
                         "of the stage's pipeline rank" if timing else ""), caption_justify="left")
    names = ([groups[g].name if groups[g].name == groups[g].gpu.name
              else f"{groups[g].name}:{groups[g].gpu.name}" for g in c.pipeline]
             if groups and c.pipeline else [])
    caps = rank_caps
    for col in ("stage", "rank", *(("group",) if names else ()), "layers", "recomp", "params",
                "grads", "optim", "activ", "other", "total", "needed", "free"):
        t.add_column(col, justify="right", no_wrap=True)
    if timing:
        t.add_column("time/mb", justify="right", no_wrap=True)
    for st in plan.stages:
        mem = st.memory_gib
        total = mem.get("total", sum(mem.get(k, 0.0) for k in MEMORY_CATEGORIES))
        needed = needed_gib(mem)
        cap = caps[st.pp_rank] if st.pp_rank < len(caps) else e.get("capacity_gib",
                                                                     c.gpu.memory_gib)
        row = [str(st.index), str(st.pp_rank),
               *((names[st.pp_rank],) if names else ()),
               f"{st.layers[0]}-{st.layers[1] - 1} ({st.num_layers})" if st.num_layers
               else "- (0)",
               str(st.recompute_layers),
               *(f"{mem.get(k, 0.0):.1f}" for k in MEMORY_CATEGORIES),
               f"{total:.1f}", f"{needed:.1f}",
               f"{cap - needed:.1f}" if needed <= cap else f"OOM by {needed - cap:.1f}"]
        if timing:
            row.append(_fmt_time(timing[st.pp_rank]["total"]))
        t.add_row(*row)
    con.print(t)
    if "host_memory_gib_per_node" in e:
        con.print(f"host per node (offload): {e['host_memory_gib_per_node']:,.0f} of "
                  f"{e['host_capacity_gib_per_node']:,.0f} GiB memory, "
                  f"{e['nvme_tib_per_node']:,.1f} of {e['nvme_capacity_tib_per_node']:,.1f} "
                  f"TiB NVMe")

    bd = e.get("time_breakdown_s", {})
    if bd:
        tb = Table(title="Step time breakdown (critical stage)", title_justify="left")
        tb.add_column("part")
        tb.add_column("time", justify="right")
        tb.add_column("share", justify="right")
        total = sum(bd.values()) or 1.0
        for k, v in bd.items():
            tb.add_row(PARTS.get(k, k), _fmt_time(v), f"{v / total * 100:.1f}%")
        tb.add_row("step", _fmt_time(total), "100.0%", end_section=True)
        con.print(tb)

    if alternatives:
        ta = Table(title="Alternatives", title_justify="left")
        ta.add_column("#", justify="right")
        ta.add_column("configuration")
        ta.add_column("step", justify="right")
        ta.add_column("why it lost")
        for i, (desc, step, why) in enumerate(alternatives, 1):
            ta.add_row(str(i), desc, _fmt_time(step) if step else "-", why)
        con.print(ta)
    return buf.getvalue()
