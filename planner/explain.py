"""Human-readable reports of a plan: the choice, per-stage memory, time breakdown, alternatives."""
from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from planner.plan import Plan


def _fmt_time(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def summary_line(plan: Plan) -> str:
    p, b = plan.parallelism, plan.batch
    parts = [f"tp={p.tp}", f"pp={p.pp}", f"dp={p.dp}", f"zero={p.zero_stage}"]
    if p.tp > 1:
        parts.append("sp" if p.sequence_parallel else "no-sp")
    if p.pp > 1:
        parts.append(p.schedule + (f"(vpp={p.vpp})" if p.vpp > 1 else ""))
    parts.append(f"mbs={b.micro_batch_size}x{b.num_microbatches}")
    rec = sum(s.recompute_layers for s in plan.stages)
    parts.append(f"recompute={p.recompute}" + (f"({rec}/{plan.model.num_layers} layers)"
                                               if p.recompute != "none" else ""))
    return " ".join(parts)


def describe_candidate(c) -> str:
    """One line for a search candidate (planner.cost.Candidate)."""
    s = f"tp={c.tp} pp={c.pp} dp={c.dp} zero={c.zero}"
    if c.tp > 1:
        s += " sp" if c.sp else " no-sp"
    if c.pp > 1:
        s += f" {c.schedule}" + (f"(vpp={c.vpp})" if c.vpp > 1 else "")
    return s + f" mbs={c.mbs}x{c.m} recompute={c.recompute}"


def render(plan: Plan, alternatives: list | None = None, width: int = 110) -> str:
    """The full report. `alternatives`: [(description, step_time_s or None, why_lost)]."""
    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=False, color_system=None)
    e, m, c = plan.estimate, plan.model, plan.cluster
    fits = e.get("fits", False)
    con.print(f"Plan for {m.name} ({m.num_params() / 1e9:.1f}B params, {m.num_layers} layers) "
              f"on {c.name} ({c.num_gpus} x {c.gpu.name}, {c.gpus_per_node} per node)")
    con.print(f"  {summary_line(plan)}")
    con.print(f"  seq_len={plan.batch.seq_len} global_batch={plan.batch.global_batch_size} "
              f"sequences")
    con.print(f"  step {_fmt_time(e['step_time_s'])}   {e['tokens_per_s']:,.0f} tokens/s   "
              f"{e['tflops_per_gpu']:.0f} TFLOP/s per GPU   MFU {e['mfu'] * 100:.1f}%   "
              f"peak memory {e['peak_memory_gib']:.1f} / {e.get('capacity_gib', c.gpu.memory_gib):.1f} GiB"
              + ("" if fits else "   DOES NOT FIT"))
    s = plan.search
    if s:
        bits = [f"solver {s.get('solver_status', '?')}"]
        if "gap" in s:
            bits.append(f"gap {s['gap'] * 100:.2f}%")
        if "candidates" in s:
            bits.append(f"{s['candidates']} candidates, {s.get('solved', 0)} solved exactly, "
                        f"{s.get('pruned_memory', 0)} out of memory, "
                        f"{s.get('pruned_bound', 0)} pruned by bound")
        if "seconds" in s:
            bits.append(f"{s['seconds']:.2f} s")
        if s.get("profile"):
            bits.append(f"profile {s['profile']}")
        con.print("  search: " + ", ".join(bits))

    t = Table(title="Stages (memory per GPU, GiB)", title_justify="left")
    for col in ("stage", "rank", "layers", "recompute", "params", "grads", "optimizer",
                "activations", "other", "total"):
        t.add_column(col, justify="right")
    cap = e.get("capacity_gib", c.gpu.memory_gib)
    for st in plan.stages:
        mem = st.memory_gib
        total = mem.get("total", 0.0)
        t.add_row(str(st.index), str(st.pp_rank), f"{st.layers[0]}-{st.layers[1] - 1} ({st.num_layers})",
                  str(st.recompute_layers),
                  *(f"{mem.get(k, 0.0):.1f}" for k in ("params", "grads", "optimizer",
                                                      "activations", "other")),
                  f"{total:.1f}" + (" !" if total > cap else ""))
    con.print(t)

    bd = e.get("time_breakdown_s", {})
    if bd:
        tb = Table(title="Step time breakdown", title_justify="left")
        tb.add_column("part")
        tb.add_column("seconds", justify="right")
        tb.add_column("share", justify="right")
        total = sum(bd.values()) or 1.0
        for k, v in bd.items():
            tb.add_row(k, f"{v:.3f}", f"{v / total * 100:.1f}%")
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
