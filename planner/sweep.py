"""`plan sweep`: the best plan at each point of a grid of clusters, sequence lengths and
global batches.

    plan sweep --model llama70b --clusters h100x32,h100x64,h100x128 [--seq-lens 4096,8192]
               [--global-batches 256,512] [--csv FILE] [--plot FILE.png] [--json]

One row per point: the chosen configuration, step time, tokens/s, MFU, peak memory (needed,
as `plan` shows it, and allocated) and whether it fits. A point where nothing fits (or whose inputs cannot be split, e.g. a global batch the
GPUs cannot divide) is a row saying so, not an error. Exit 0 when some point fits, 3 when none
does, 2 for bad input (an unknown model or cluster, a malformed list, an unwritable file).

pandas is imported here only (and matplotlib only for --plot).
"""
from __future__ import annotations

import itertools
import sys
from pathlib import Path

from planner.limits import MAX_INT_ARG, MAX_SWEEP_POINTS
from planner.catalog import get_cluster, get_model
from planner.engines import DEFAULT_ENGINE, ENGINES, get_engine
from planner.rules import compile_problem
from planner.errors import BadInput, PlannerError
from planner.explain import describe_candidate, describe_result, no_configuration_message
from planner.vocab import OFFLOAD_DEVICES
from planner.search import Fixed, default_global_batch, default_seq_len, search
from planner.search.groups import search_mixed
from planner.specs import MixedCluster
from planner.suggest import diagnose_no_configuration

COLUMNS = ["model", "cluster", "gpus", "seq_len", "global_batch", "fits", "config", "tp", "pp",
           "dp", "zero", "sp", "micro_batch", "num_microbatches", "schedule", "vpp",
           "recompute_layers", "step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu",
           "peak_needed_gib", "peak_allocated_gib", "capacity_gib", "note"]


def _list(kind, conv):
    def parse(s):
        items = [x.strip() for x in s.split(",") if x.strip()]
        if not items:
            raise ValueError(f"{kind}: empty list")
        return [conv(x) for x in items]
    return parse


def _pos_int(name):
    def conv(x):
        t = x.strip()
        body = t[1:] if t[:1] in ("+", "-") else t
        if not (body.isascii() and body.isdigit()):
            raise BadInput(f"{name}: {x[:40]!r} is not an integer")
        if len(body.lstrip("0")) > 15:          # no int() of a 5000-digit number
            raise BadInput(f"{name}: {body[:20]}... is too large (at most {MAX_INT_ARG})")
        v = int(t)
        if v <= 0:
            raise BadInput(f"{name}: {v} must be positive")
        if v > MAX_INT_ARG:
            raise BadInput(f"{name}: {v} is too large (at most {MAX_INT_ARG})")
        return v
    return conv


def sweep_parser(parser_class):
    p = parser_class(prog="plan sweep",
                     description="Best plan per cluster size, sequence length and global batch.")
    p.add_argument("--model", required=True, help="catalog name or config.json")
    p.add_argument("--clusters", "--cluster", dest="clusters", required=True,
                   help="comma-separated clusters, e.g. h100x8,h100x16,h100x32")
    p.add_argument("--seq-lens", "--seq-len", dest="seq_lens",
                   help="comma-separated sequence lengths (default: the model's, at most 8192)")
    p.add_argument("--global-batches", "--global-batch", dest="global_batches",
                   help="comma-separated global batches in sequences (default: 4M tokens)")
    p.add_argument("--zero", type=int, choices=(0, 1, 2, 3), help="fix the ZeRO stage")
    p.add_argument("--recompute", choices=("none", "selective", "full"),
                   help="fix the recompute granularity")
    p.add_argument("--offload-optimizer", choices=OFFLOAD_DEVICES,
                   help="the optimizer states on the GPUs (none), in host memory (cpu) or on "
                        "NVMe (default: as plan: searched where nothing fits without)")
    p.add_argument("--engine", choices=tuple(ENGINES), default=DEFAULT_ENGINE,
                   help=f"the training stack, as for plan (default: {DEFAULT_ENGINE})")
    p.add_argument("--compile", action="store_true",
                   help="torchtitan under torch.compile, as for plan")
    p.add_argument("--csv", help="write the table as CSV to this file ('-' for stdout)")
    p.add_argument("--plot", help="write throughput and MFU per point (PNG)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON records")
    return p


def sweep(model, clusters, seq_lens=None, global_batches=None, fixed=None, progress=None,
          engine=None):
    """A pandas DataFrame, one row (COLUMNS) per (cluster, seq_len, global_batch) point, each
    the best plan for `engine` (planner.engines; default Megatron)."""
    import pandas as pd

    fixed = fixed or Fixed()
    seq_lens = seq_lens or [None]
    global_batches = global_batches or [None]
    points = list(itertools.product(clusters, seq_lens, global_batches))
    rows = []
    for i, (cluster, s, g) in enumerate(points):
        s_ = s or default_seq_len(model)
        g_ = g or default_global_batch(s_, cluster.num_gpus)
        row = dict.fromkeys(COLUMNS)
        row.update(model=model.name, cluster=cluster.name, gpus=cluster.num_gpus, seq_len=s_,
                   global_batch=g_, fits=False, note="")
        if progress:
            progress(i, len(points), f"{cluster.name} seq {s_} batch {g_}")
        mixed = isinstance(cluster, MixedCluster)
        try:
            if mixed:   # GPU groups of different kinds (planner.search.groups)
                report = search_mixed(model, cluster, fixed, s_, g_, top=1, engine=engine)
            else:
                # no alternatives are shown: the rejected layouts need not be found
                report = search(model, cluster, fixed, s_, g_, top=1, rejected=False,
                                engine=engine)
        except PlannerError as e:       # e.g. a batch these GPUs cannot split
            nc = None if mixed else diagnose_no_configuration(model, cluster, fixed, s_, g_,
                                                              engine)
            row["note"] = no_configuration_message(model, nc) if nc is not None else str(e)
            rows.append(row)
            continue
        r = report.best
        if r is None:
            c = report.closest
            if c is not None:
                over = max(c.estimate.overflow_gib())
                row["note"] = (f"nothing fits; closest {describe_candidate(c.candidate)} "
                               f"over by {over:.1f} GiB")
                row["peak_needed_gib"] = round(c.estimate.peak_needed_gib, 2)
                row["peak_allocated_gib"] = round(c.estimate.peak_memory_gib, 2)
                row["capacity_gib"] = round(c.estimate.capacity_gib, 2)
            else:
                row["note"] = "nothing fits"
            rows.append(row)
            continue
        c, e = r.candidate, r.estimate
        row.update(fits=True, config=describe_result(r, model.num_layers), tp=c.tp, pp=c.pp,
                   dp=c.dp, zero=c.zero, sp=c.sp, micro_batch=c.mbs, num_microbatches=c.m,
                   schedule=c.schedule if c.pp > 1 else "-", vpp=c.vpp,
                   recompute_layers=sum(r.recompute), step_time_s=e.step_time_s,
                   tokens_per_s=e.tokens_per_s,
                   tokens_per_s_per_gpu=e.tokens_per_s / cluster.num_gpus, mfu=e.mfu,
                   peak_needed_gib=round(e.peak_needed_gib, 2),
                   peak_allocated_gib=round(e.peak_memory_gib, 2),
                   capacity_gib=round(e.capacity_gib, 2))
        if mixed and report.chosen != "mixed":
            row["note"] = f"mixing does not pay: {report.chosen} alone"
        rows.append(row)
    if progress:
        progress(len(points), len(points), "done")
    df = pd.DataFrame(rows, columns=COLUMNS)
    # the swept quantities (a default global batch that follows the sequence length is not one)
    df.attrs["axes"] = [name for name, vals in (("cluster", clusters), ("seq_len", seq_lens),
                                                ("global_batch", global_batches))
                        if len(vals) > 1]
    for col in ("tp", "pp", "dp", "zero", "micro_batch", "num_microbatches", "vpp",
                "recompute_layers"):
        df[col] = df[col].astype("Int64")
    return df


def _axes(df) -> list:
    """The swept quantities, as columns to plot against: the GPU count for clusters when it
    tells them apart, else the cluster name."""
    axes = df.attrs.get("axes")
    if axes is None:
        axes = [c for c in ("cluster", "seq_len", "global_batch") if df[c].nunique() > 1]
    by_gpus = df.groupby("cluster")["gpus"].first()
    return [("gpus" if a == "cluster" and by_gpus.is_unique else a) for a in axes]


def _peak(r) -> str:
    """Peak memory per GPU as `plan` shows it: needed (the tensors with the caching allocator's
    reserve on the churned ones, the figure a fit is judged on), allocated tensors beside it."""
    res, alloc = r["peak_needed_gib"], r["peak_allocated_gib"]
    if res is None or res != res:         # NaN: nothing was priced
        return "-"
    return f"{res:.1f} ({alloc:.1f})"


def render_table(df, width: int | None = None) -> str:
    """The rows as a table `width` columns wide (default $COLUMNS where set, else 160)."""
    import os
    if width is None:
        try:
            width = max(60, int(os.environ["COLUMNS"]))
        except (KeyError, ValueError):
            width = 160
    import io

    from rich.console import Console
    from rich.table import Table

    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=False, color_system=None)
    t = Table(title=f"Sweep: {df['model'].iloc[0]}" if len(df) else "Sweep",
              title_justify="left")
    for col, just in (("cluster", "left"), ("seq", "right"), ("batch", "right"),
                      ("config", "left"), ("step", "right"), ("tokens/s", "right"),
                      ("tok/s/GPU", "right"), ("MFU", "right"),
                      ("GiB needed (allocated)", "right"),
                      ("fits", "left")):
        t.add_column(col, justify=just, no_wrap=col != "config")
    for _, r in df.iterrows():
        if r["fits"]:
            t.add_row(r["cluster"], str(r["seq_len"]), str(r["global_batch"]), r["config"],
                      f"{r['step_time_s']:.2f} s", f"{r['tokens_per_s']:,.0f}",
                      f"{r['tokens_per_s_per_gpu']:,.0f}", f"{r['mfu'] * 100:.1f}%",
                      _peak(r), "yes")
        else:
            t.add_row(r["cluster"], str(r["seq_len"]), str(r["global_batch"]), r["note"],
                      "-", "-", "-", "-",
                      _peak(r), "NO")
    con.print(t)
    return buf.getvalue()


def plot_sweep(df, path) -> str:
    """Throughput (tokens/s) and MFU per point, against the first swept quantity (GPUs, or
    cluster names when GPU counts repeat; sequence length; global batch), one line per value
    of the others."""
    from planner.plot import _save, check_path
    out = check_path(path)
    _save(sweep_figure(df), out)
    return str(out)


def sweep_figure(df):
    """The Figure of plot_sweep: tokens/s above, MFU below, one line per fixed remainder."""
    from matplotlib.figure import Figure

    vary = _axes(df)
    fig = Figure(figsize=(11, 7), layout="constrained")
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    names = {"gpus": "GPUs", "cluster": "cluster", "seq_len": "sequence length",
             "global_batch": "global batch"}
    # x: the first swept quantity (clusters, then sequence length, then batch); one line per
    # combination of the others
    xcol = vary[0] if vary else "cluster"
    others = vary[1:]
    categorical = xcol == "cluster"
    order = list(dict.fromkeys(df[xcol]))             # first-seen order, for categories
    pos = (lambda v: order.index(v)) if categorical else (lambda v: v)
    groups = list(df.groupby(others, sort=True)) if others else [(None, df)]
    for key, g in groups:
        if not categorical:
            g = g.sort_values(xcol)
        label = None
        if others:
            key = key if isinstance(key, tuple) else (key,)
            label = ", ".join(f"{names[o]} {k}" for o, k in zip(others, key))
        x = [pos(v) for v in g[xcol]]
        ok = g["fits"].astype(bool).tolist()
        tps = [v if f else float("nan") for v, f in zip(g["tokens_per_s"], ok)]
        mfu = [v * 100 if f else float("nan") for v, f in zip(g["mfu"], ok)]
        line, = ax1.plot(x, tps, marker="o", label=label)
        ax2.plot(x, mfu, marker="o", color=line.get_color(), label=label)
        for xi, f in zip(x, ok):
            if not f:
                for ax in (ax1, ax2):
                    ax.plot([xi], [0], marker="x", color="#b00020", markersize=9,
                            clip_on=False)
                    ax.annotate("nothing fits", (xi, 0.04), xycoords=("data", "axes fraction"),
                                rotation=90, ha="center", va="bottom", fontsize=8,
                                color="#b00020")
    if categorical:
        ax2.set_xticks(range(len(order)))
        ax2.set_xticklabels(order)
    else:
        xs = sorted(df[xcol].unique())
        if xs[0] > 0 and xs[-1] / xs[0] >= 4:
            ax1.set_xscale("log", base=2)
        ax2.set_xticks(xs)
        ax2.set_xticklabels([str(v) for v in xs])
    fixed_bits = [f"{names[c]} {df[c].iloc[0]}" for c in ("cluster", "seq_len", "global_batch")
                  if c not in vary and not (c == "cluster" and "gpus" in vary)
                  and df[c].nunique() == 1]
    ax2.set_xlabel(names[xcol] + (f" ({', '.join(fixed_bits)})" if fixed_bits else ""))
    if others:
        ax1.legend(fontsize=8)
    ax1.set_ylim(bottom=0)
    ax1.set_ylabel("tokens/s")
    ax1.grid(alpha=0.3)
    ax2.set_ylabel("MFU (%)")
    ax2.set_ylim(0, 100)
    ax2.grid(alpha=0.3)
    ax1.set_title(f"{df['model'].iloc[0]}: best plan per point", loc="left", fontsize=10)
    return fig


class _SweepProgress:
    def __init__(self):
        self.bar = None
        if _isatty(sys.stderr):
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
            self.bar = Progress(TextColumn("sweep {task.description}"), BarColumn(),
                                MofNCompleteColumn(), transient=True,
                                console=Console(file=sys.stderr, force_terminal=True))
            self.task = self.bar.add_task("", total=None)
            self.bar.start()

    def __call__(self, i, n, what):
        if self.bar is not None:
            self.bar.update(self.task, completed=i, total=n, description=what)

    def close(self):
        if self.bar is not None:
            self.bar.stop()


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def run_sweep_cli(argv, parser_class) -> int:
    a = sweep_parser(parser_class).parse_args(argv)
    model = get_model(a.model)
    try:
        cluster_names = _list("--clusters", str)(a.clusters)
        seq_lens = _list("--seq-lens", _pos_int("--seq-lens"))(a.seq_lens) if a.seq_lens else None
        batches = (_list("--global-batches", _pos_int("--global-batches"))(a.global_batches)
                   if a.global_batches else None)
    except ValueError as e:
        raise BadInput(str(e)) from None
    points = len(cluster_names) * len(seq_lens or [None]) * len(batches or [None])
    if points > MAX_SWEEP_POINTS:
        raise BadInput(f"the sweep has {len(cluster_names)} cluster(s) x {len(seq_lens or [0])} "
                       f"sequence length(s) x {len(batches or [0])} global batch(es) = {points} "
                       f"points, more than {MAX_SWEEP_POINTS}; sweep fewer at a time")
    clusters = [get_cluster(n) for n in cluster_names]   # unknown names fail before searching
    engine = get_engine(a.engine)
    problem = compile_problem(engine, a.compile)
    if problem:                                           # said once, not on every point
        raise BadInput(problem.line)
    if a.plot:
        from planner.plot import check_path
        check_path(a.plot)                # bad paths fail before the (long) sweep
    if a.csv and a.csv != "-" and not Path(a.csv).parent.is_dir():
        raise BadInput(f"--csv {a.csv}: no such directory {str(Path(a.csv).parent)!r}")
    progress = _SweepProgress()
    try:
        fixed = Fixed(zero=a.zero, recompute=engine.native_recompute(a.recompute),
                      offload_optimizer=a.offload_optimizer, compile=a.compile)
        df = sweep(model, clusters, seq_lens, batches, fixed, progress=progress, engine=engine)
    finally:
        progress.close()
    if a.csv:
        try:
            df.to_csv(sys.stdout if a.csv == "-" else a.csv, index=False)
        except OSError as e:
            raise BadInput(f"--csv {a.csv}: {e.strerror or e}") from None
    if a.plot:
        plot_sweep(df, a.plot)
    if a.json:
        print(df.to_json(orient="records", indent=2))
    elif a.csv != "-":
        print(render_table(df), end="")
        if a.csv:
            print(f"table written to {a.csv}")
        if a.plot:
            print(f"plot written to {a.plot}")
    return 0 if df["fits"].any() else 3
