"""Helpers shared by the benchmark scripts: result paths, markdown tables, plan descriptions."""
from __future__ import annotations

import datetime
import math
import os
import platform
import sys
from pathlib import Path

from planner.errors import BadInput
from planner.explain import recompute_label

# The committed tables (`--out benchmarks/results` regenerates them); a run without --out
# writes to SCRATCH, outside the checkout, so that running a benchmark never edits it.
RESULTS = Path(__file__).parent / "results"
SCRATCH = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "planner-benchmarks"
OUT_HELP = (f"directory for the tables (default {SCRATCH}, outside the checkout; "
            f"--out benchmarks/results writes the committed ones)")


def today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).date().isoformat()


def out_path(out_dir, stem: str, ext: str, date: str | None = None) -> Path:
    """<out_dir>/<stem>_<date>.<ext> (out_dir made if missing)."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{stem}_{date or today()}.{ext}"


def planner_version() -> str:
    """The commit the planner was run at, and whether planner/ had uncommitted changes."""
    import subprocess
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "planner"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "planner version unknown"
    return f"planner at {head}" + (" with uncommitted changes in planner/" if dirty else "")


def machine() -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{platform.python_implementation()} {platform.python_version()}, "
            f"{os.cpu_count()} CPUs, load average {load:.1f} at start; {planner_version()}")


def _cell(v, floatfmt: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return format(v, floatfmt)
    return str(v).replace("|", "\\|")


def markdown_table(rows: list, columns: list, floatfmt: str = ".2f", headers=None) -> str:
    """A GitHub markdown table of `rows` (dicts), numbers right-aligned."""
    headers = headers or columns
    numeric = [all(isinstance(r.get(c), (int, float)) and not isinstance(r.get(c), bool)
                   for r in rows if r.get(c) is not None) for c in columns]
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---:" if n else ":---" for n in numeric) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(_cell(r.get(c), floatfmt) for c in columns) + " |")
    return "\n".join(lines) + "\n"


def describe(c, layers=None, recompute=None) -> str:
    """Short text for a Candidate (+ its placement): tp8 pp4 dp32 z1 sp mbs1 vpp3 rec12/96."""
    s = f"tp{c.tp} pp{c.pp} dp{c.dp} z{c.zero}"
    if getattr(c, "ep", 1) > 1 or getattr(c, "etp", 1) > 1:
        s += f" ep{c.ep} etp{c.etp}"
    if getattr(c, "cp", 1) > 1:
        s += f" cp{c.cp}({c.cp_comm})"
    if c.sp:
        s += " sp"
    s += f" mbs{c.mbs}"
    if c.pp > 1:
        s += f" {c.schedule}" + (f"(v{c.vpp})" if c.vpp > 1 else "")
    if recompute is not None:
        total = sum(layers) if layers is not None else None
        r = sum(recompute)
        if r:
            label = recompute_label(c.recompute, c.recompute_modules)
            s += f" {label}-rec {r}" + (f"/{total}" if total else "")
    if not c.flash:
        s += " eager-attn"
    return s


def fit_report_cli(argv, doc: str, stem: str, fit_and_report, out_default=SCRATCH) -> int:
    """The command line of a catalog figure's fit script (benchmarks.attention_fit, gemm_fit):
    `--out DIR` (default `out_default`); `fit_and_report(started)` fits, prints its figures and
    returns the report's markdown, written to DIR/<stem>_<date>.md."""
    import argparse
    import time
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--out", default=str(out_default), help=OUT_HELP)
    args = ap.parse_args(argv)
    text = fit_and_report(time.perf_counter())
    path = out_path(args.out, stem, "md")
    path.write_text(text)
    print(f"wrote {path}")
    return 0


def run_cli(main, prog: str) -> int:
    """A benchmark script's exit status: bad input (a model, a profile, a data file) said in one
    line on stderr with exit 2, as `plan` says it, never a traceback."""
    try:
        return main()
    except BadInput as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
