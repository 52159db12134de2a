"""Pictures of a plan: the pipeline schedule as a timeline and the memory of each stage.

matplotlib is imported here only, when a picture is asked for (it costs ~0.3 s to import and
`plan` must start fast). No pyplot: a bare Figure with the Agg canvas, so no display and no
global state.

The timeline is simulated from the plan's per-rank forward and backward times (its price,
planner.cost.price): each rank runs its operations in its schedule's order (GPipe:
all forwards, then all backwards; 1F1B: p - rank - 1 warm-up forwards, then one forward one
backward; interleaved: Megatron-LM's order over chunks; the zero-bubble ones: torch's own
action order, F, B (input gradient) and W (weight gradient) blocks, as planner.cost.schedule
prices it), an operation starting when its rank is free and its input is ready (the previous
virtual stage's forward, the next one's backward).
Gaps are the pipeline bubble. For many micro-batches only the first MAX_DRAWN (at least 2p)
are drawn: the picture is the same pipeline with fewer micro-batches, whose steady state
repeats.
"""
from __future__ import annotations

import math
from pathlib import Path

from planner.cost.price import price_plan
from planner.cost.schedule import forward_and_wgrad, in_flight, rank_orders
from planner.cost.schedule import simulate as simulate_actions
from planner.vocab import ZERO_BUBBLE_SCHEDULES
from planner.errors import BadInput
from planner.cost.stage import MEMORY_CATEGORIES
from planner.explain import needed_gib, summary_line
from planner.plan import Plan

MAX_DRAWN = 16
FORMATS = (".png", ".svg", ".pdf")
MEMORY_COLORS = {"params": "#4c72b0", "grads": "#55a868", "optimizer": "#c44e52",
                 "activations": "#dd8452", "other": "#8c8c8c"}
FWD_COLORS = ("#4c72b0", "#8fb0e0", "#2a4d80", "#a9c4ec")
BWD_COLORS = ("#dd8452", "#f0b58b", "#a65a2a", "#f5cfae")
WGRAD_COLORS = ("#55a868", "#9bd1a8", "#2f6b3d", "#c3e6cb")


# ---- the schedule ------------------------------------------------------------------------

def schedule_order(schedule: str, p: int, m: int, v: int, rank: int) -> list:
    """Operations of pipeline rank `rank` in execution order: [(kind 'F'|'B', micro-batch,
    chunk)]."""
    if schedule == "gpipe" or p == 1:
        if p == 1:   # one stage: forward and backward of each micro-batch in turn
            return [op for i in range(m) for op in (("F", i, 0), ("B", i, 0))]
        return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]
    if schedule == "1f1b" or v == 1:
        warm = _warmup("1f1b", p, m, 1, rank)
        ops = [("F", i, 0) for i in range(warm)]
        for i in range(m - warm):
            ops += [("F", warm + i, 0), ("B", i, 0)]
        return ops + [("B", i, 0) for i in range(m - warm, m)]
    if schedule != "interleaved":
        raise BadInput(f"cannot draw schedule {schedule!r}")
    # megatron/core/pipeline_parallel/schedules.py, forward_backward_pipelining_with_interleaving
    # (current Megatron-core; releases before 2024 ran every forward first when m == p), with
    # microbatch_group_size_per_vp_stage = p, as planner.cost.schedule.in_flight assumes
    total = m * v
    warm = _warmup("interleaved", p, m, v, rank)

    def which(k, backward):
        chunk = (k % (p * v)) // p
        return (v - 1 - chunk if backward else chunk), (k // (p * v)) * p + k % p

    def op(kind, k):
        chunk, mb = which(k, kind == "B")
        return (kind, mb, chunk)

    ops = [op("F", k) for k in range(warm)]
    for i in range(total - warm):
        ops += [op("F", warm + i), op("B", i)]
    return ops + [op("B", k) for k in range(total - warm, total)]


def _warmup(schedule: str, p: int, m: int, v: int, rank: int) -> int:
    """Warm-up forwards of pipeline rank `rank` (in chunk-micro-batches): the cost model's
    micro-batches in flight at the peak (planner.cost.schedule.in_flight) less the one of the
    steady state. Where every forward is a warm-up one this is one short of all of them: the
    last forward then opens the steady state, which gives the same order of operations."""
    return round(in_flight(schedule, p, rank, m, v) * v) - 1


def simulate(schedule: str, fwd: list, bwd: list, m: int, v: int = 1) -> list:
    """Start and end of every operation: [(rank, kind, micro-batch, chunk, start, end)].

    fwd[r][c] / bwd[r][c]: seconds of chunk c of rank r for one micro-batch."""
    p = len(fwd)
    orders = [schedule_order(schedule, p, m, v, r) for r in range(p)]
    ptr, free, done, out = [0] * p, [0.0] * p, {}, []
    last = p * v - 1
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(p):
            while ptr[r] < len(orders[r]):
                kind, mb, c = orders[r][ptr[r]]
                vs = c * p + r                                  # virtual stage
                if kind == "F":
                    dep = ("F", vs - 1, mb) if vs > 0 else None
                else:
                    dep = ("B", vs + 1, mb) if vs < last else ("F", vs, mb)
                if dep is not None and dep not in done:
                    break
                start = max(free[r], done[dep] if dep else 0.0)
                end = start + (fwd[r][c] if kind == "F" else bwd[r][c])
                done[(kind, vs, mb)] = end
                free[r] = end
                out.append((r, kind, mb, c, start, end))
                ptr[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"schedule {schedule} deadlocked (p={p}, m={m}, v={v})")
    return out


def zero_bubble_ops(plan: Plan, priced, m: int) -> list:
    """The operations of a zero-bubble schedule (interleaved-zb, zbv, dualpipev) as the cost
    model runs them (planner.cost.schedule: torch's own action order, simulated with each
    rank's forward, input-gradient B and weight-gradient W seconds): [(rank, kind, micro-batch,
    chunk, start, end)], kind F, B (input gradient, or a full backward) or W."""
    par = plan.parallelism
    p, v = par.pp, par.vpp
    coeffs, layers = priced.coeffs, priced.layers
    qs = [0] * p
    if coeffs[0].moe is not None:
        from planner.cost.moe import moe_counts
        qs, _ = moe_counts(plan.model, p, v, layers, priced.recompute)
    times = [t.total for t in priced.rank_times()]
    fwd, wgrad = forward_and_wgrad(coeffs, layers, qs)
    durs = [(f / v, max(0.0, t - f - w) / v, w / v) for t, f, w in zip(times, fwd, wgrad)]
    _, per_rank = simulate_actions(par.schedule, rank_orders(par.schedule, p, m, v), durs)
    out = []
    for r, acts in enumerate(per_rank):
        for start, end, (stage, kind, mb) in acts:
            chunk = [st.index for st in plan.stages_of_rank(r)].index(stage)
            out.append((r, "W" if kind == "W" else "F" if kind == "F" else "B", mb, chunk,
                        start, end))
    return out


def drawn_microbatches(schedule: str, p: int, m: int) -> int:
    """How many micro-batches the timeline draws: all up to MAX_DRAWN, else enough for a
    steady state to show (at least 2p), a multiple of p for the interleaved schedule."""
    want = max(MAX_DRAWN, 2 * p)
    if m <= want:
        return m
    if schedule == "interleaved" and p > 1:
        return min(m, p * math.ceil(want / p))
    if schedule in ZERO_BUBBLE_SCHEDULES and p > 1:
        # a count torch's schedule takes (planner.cost.schedule.schedule_problem): a
        # multiple of p (interleaved-zb's rounds), at least 2p (dualpipev)
        return min(m, p * math.ceil(want / p)) if m % p == 0 else m
    return want


def _chunk_times(plan: Plan, timing: list) -> tuple:
    """Per rank, per chunk forward and backward seconds (a rank's time split over its chunks
    by their layer counts)."""
    p, v = plan.parallelism.pp, plan.parallelism.vpp
    fwd, bwd = [], []
    for r in range(p):
        t = timing[r]
        stages = plan.stages_of_rank(r)
        n = sum(s.num_layers for s in stages)
        shares = [s.num_layers / n if n else 1 / v for s in stages]
        fwd.append([t.fwd * f for f in shares])
        bwd.append([t.bwd * f for f in shares])
    return fwd, bwd


def _unit(seconds: float) -> tuple:
    return (1.0, "s") if seconds >= 2 else (1e3, "ms")


# ---- the picture -------------------------------------------------------------------------

def check_path(path) -> Path:
    out = Path(path)
    if out.suffix.lower() not in FORMATS:
        raise BadInput(f"--plot {path}: the picture must be a .png, .svg or .pdf file")
    if out.parent and not out.parent.is_dir():
        raise BadInput(f"--plot {path}: no such directory {str(out.parent)!r}")
    return out


def _save(fig, out: Path) -> None:
    try:
        fig.savefig(out, dpi=110)
    except OSError as e:
        raise BadInput(f"--plot {out}: {e.strerror or e}") from None


# a mixed cluster's groups, one tint each behind their pipeline ranks' rows
GROUP_TINTS = ("#dbe9f6", "#fbe3d3", "#e2f0d9", "#ece2f3")


def plot_plan(plan: Plan, path) -> str:
    """Write the schedule timeline and per-stage memory of `plan` to `path` (.png/.svg/.pdf)."""
    out = check_path(path)
    _save(plan_figure(plan), out)
    return str(out)


def plan_figure(plan: Plan):
    """The matplotlib Figure of plot_plan: axes[0] the timeline (broken_barh collections, one
    rectangle per drawn operation and per rank's step tail), axes[1] the memory bars (a
    container per memory part). `fig.drawn_microbatches`: how many micro-batches are drawn."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    par, b = plan.parallelism, plan.batch
    p, v, m = par.pp, par.vpp, b.num_microbatches
    priced = price_plan(plan)
    timing = priced.rank_times()
    md = drawn_microbatches(par.schedule, p, m)
    if p > 1 and par.schedule in ZERO_BUBBLE_SCHEDULES:
        ops = zero_bubble_ops(plan, priced, md)
    else:
        fwd, bwd = _chunk_times(plan, timing)
        ops = simulate(par.schedule if p > 1 else "1f1b", fwd, bwd, md, v)
    ends = [max(e for rr, *_, e in ops if rr == r) for r in range(p)]
    span = max(ends[r] + timing[r].tail for r in range(p))
    scale, unit = _unit(span)

    rows = min(p, 64)
    fig = Figure(figsize=(13, 3.2 + 0.28 * rows + 3.6), layout="constrained")
    gs = fig.add_gridspec(2, 1, height_ratios=[1.2 + 0.28 * rows, 3.4])
    ax = fig.add_subplot(gs[0])
    ax.set_facecolor("#f1f1f1")   # idle time shows through: the bubble
    label_blocks = md * v <= 32 and p <= 16
    blocks = {}          # one collection per rank, direction and chunk (fast for many ops)
    for r, kind, mb, c, start, end in ops:
        blocks.setdefault((r, kind, c), []).append((start * scale, (end - start) * scale))
        if label_blocks and (end - start) * scale > span * scale / 90:
            ax.text((start + end) / 2 * scale, r, str(mb), ha="center", va="center",
                    fontsize=6.5, color="white")
    for (r, kind, c), spans in blocks.items():
        colors = FWD_COLORS if kind == "F" else WGRAD_COLORS if kind == "W" else BWD_COLORS
        ax.broken_barh(spans, (r - 0.4, 0.8), facecolors=colors[c % 4],
                       edgecolors="white", linewidth=0.4)
    for r in range(p):
        if timing[r].tail > 0:
            ax.broken_barh([(ends[r] * scale, timing[r].tail * scale)], (r - 0.4, 0.8),
                           facecolors="#6b6b6b", edgecolors="white", linewidth=0.4)
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_yticks(range(p) if p <= 32 else range(0, p, max(1, p // 16)))
    ax.set_ylabel("pipeline rank")
    groups = plan.rank_groups()
    if groups:   # a mixed cluster: each rank's band tinted by its group, named on its tick
        names = sorted(set(groups), key=groups.index)
        for r, g in enumerate(groups):
            ax.axhspan(r - 0.5, r + 0.5, color=GROUP_TINTS[names.index(g) % len(GROUP_TINTS)],
                       zorder=0, linewidth=0)
        ax.set_yticklabels([f"{r} {groups[r]}" for r in ax.get_yticks()])
    ax.set_xlim(0, span * scale * 1.01)
    ax.set_xlabel(f"time ({unit})")
    sched = par.schedule if p > 1 else "no pipeline"
    if p > 1 and v > 1:
        sched += f", {v} chunks per rank"
    shown = (f"{m} micro-batches" if md == m else
             f"first {md} of {m} micro-batches drawn (a pipeline of {md}; the steady state "
             f"repeats; the estimated step counts all {m})")
    ax.set_title(f"Pipeline schedule ({sched}): {shown}", fontsize=10, loc="left")
    handles = [Patch(color=FWD_COLORS[0], label="forward"),
               Patch(color=BWD_COLORS[0], label="backward (+ recompute)"),
               Patch(color="#6b6b6b", label="DP grad sync / optimizer"),
               Patch(facecolor="#f1f1f1", edgecolor="#bbbbbb", label="idle (bubble)")]
    if v > 1:
        handles.insert(1, Patch(color=FWD_COLORS[1], label="forward, next chunk"))
    if any(kind == "W" for _, kind, *_ in ops):
        handles[-3] = Patch(color=BWD_COLORS[0], label="B: input-gradient backward (+ recompute)")
        handles.insert(-2, Patch(color=WGRAD_COLORS[0], label="W: weight-gradient backward"))
    ax.legend(handles=handles, loc="upper left", fontsize=7, bbox_to_anchor=(1.0, 1.0))

    # memory per pipeline rank
    ax2 = fig.add_subplot(gs[1])
    mems = []
    for r in range(p):
        st = plan.stages_of_rank(r)
        mems.append(st[0].memory_gib if st else {})
    e = plan.estimate
    cap = e.get("capacity_gib", plan.cluster.gpu.memory_gib)
    # each rank against its own GPU where the ranks' GPUs differ (a mixed cluster)
    rank_caps = e.get("stage_capacity_gib") or []
    bottom = [0.0] * p
    for part in MEMORY_CATEGORIES:
        vals = [mm.get(part, 0.0) for mm in mems]
        ax2.bar(range(p), vals, bottom=bottom, color=MEMORY_COLORS[part], label=part,
                width=0.7)
        bottom = [x + y for x, y in zip(bottom, vals)]
    if len(rank_caps) == p:
        gpus = plan.cluster.rank_gpus(p)
        seen = set()
        for r, (cr, gpu) in enumerate(zip(rank_caps, gpus)):
            first = gpu.name not in seen
            seen.add(gpu.name)
            ax2.hlines(cr, r - 0.45, r + 0.45, color="#b00020", linestyle="--", linewidth=1.2,
                       label=f"usable capacity {gpu.name} {cr:.1f} GiB" if first else None)
            ax2.hlines(gpu.memory_gib, r - 0.45, r + 0.45, color="#444444", linestyle=":",
                       linewidth=1,
                       label=f"GPU memory {gpu.name} {gpu.memory_gib:.0f} GiB" if first else None)
    else:
        rank_caps = [cap] * p
        ax2.axhline(cap, color="#b00020", linestyle="--", linewidth=1.2,
                    label=f"usable capacity {cap:.1f} GiB")
        ax2.axhline(plan.cluster.gpu.memory_gib, color="#444444", linestyle=":", linewidth=1,
                    label=f"GPU memory {plan.cluster.gpu.memory_gib:.0f} GiB")
    for r, tot in enumerate(bottom):
        if needed_gib(mems[r]) > rank_caps[r]:   # what decides the fit
            ax2.text(r, tot, "OOM", ha="center", va="bottom", fontsize=8, color="#b00020")
    pad = max(0.0, (4 - p) / 2)
    ax2.set_xlim(-0.5 - pad, p - 0.5 + pad)
    ax2.set_xticks(range(p) if p <= 32 else range(0, p, max(1, p // 16)))
    if groups:
        ax2.set_xticklabels([f"{r}\n{groups[r]}" for r in ax2.get_xticks()])
    ax2.set_xlabel("pipeline rank (stage)")
    ax2.set_ylabel("GiB per GPU")
    ax2.set_ylim(0, max(max(bottom, default=0),
                        *(g.memory_gib for g in plan.cluster.rank_gpus(p))) * 1.12)
    ax2.set_title("Memory per GPU by stage", fontsize=10, loc="left")
    ax2.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))

    head = f"{plan.model.name} on {plan.cluster.name}: {summary_line(plan)}"
    if e.get("step_time_s"):
        k, u = _unit(e["step_time_s"])
        head += (f"\nestimated step {e['step_time_s'] * k:.1f} {u}, "
                 f"{e.get('tokens_per_s', 0):,.0f} tokens/s, MFU {e.get('mfu', 0) * 100:.1f}%")
    fig.suptitle(head, fontsize=10)
    fig.drawn_microbatches = md
    return fig
