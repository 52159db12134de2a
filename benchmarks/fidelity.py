"""Prediction vs published training runs.

For each run in benchmarks/data/published_runs.json: fix what was published (tp, pp, dp,
recompute, micro-batch, ...), let the planner choose the rest, and compare the predicted step
time with the published one. The ZeRO stage is chosen among those the run's engine offered
(`zero_stages` in the data: Megatron-LM had no ZeRO in 2021-22, Megatron-Core r0.8 has ZeRO-1 as
its distributed optimizer). The GPU constants are the catalog's (planner.catalog.gpus): one set
per GPU type, nothing fitted per run.

    python -m benchmarks.fidelity [--out benchmarks/results]

Writes fidelity_<date>.csv, fidelity_<date>.md and fidelity_<date>.png under --out.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

from benchmarks._common import RESULTS, describe, machine, markdown_table, out_path, today
from planner.catalog import get_cluster
from planner.errors import BadInput
from planner.search import Fixed, search
from planner.specs import model_from_hf_config

DATA = Path(__file__).parent / "data" / "published_runs.json"
# What the test (tests/test_fidelity.py) holds the table to.
MEDIAN_TARGET_PCT = 10.0
MAX_TARGET_PCT = 25.0

COLUMNS = ["run", "gpu", "gpus", "published_config", "planner_chose", "published_s",
           "predicted_s", "error_pct", "any_zero_error_pct", "published_tflops",
           "predicted_tflops", "peak_gib", "capacity_gib", "fits"]
HEADERS = ["run", "GPU", "GPUs", "published config", "planner chose (unpublished knobs)",
           "published s", "predicted s", "error %", "error % if any ZeRO stage",
           "published TFLOP/s/GPU",
           "predicted TFLOP/s/GPU", "peak GiB", "capacity GiB", "fits"]


def load_runs(path=DATA) -> list:
    return json.loads(Path(path).read_text())["runs"]


def fixed_of(run) -> Fixed:
    f = run["fixed"]
    return Fixed(tp=f.get("tp"), pp=f.get("pp"), dp=f.get("dp"), recompute=f.get("recompute"),
                 sp=f.get("sequence_parallel"), mbs=f.get("micro_batch"), vpp=f.get("vpp"),
                 schedule=("interleaved" if f.get("vpp", 1) > 1 else None),
                 flash=run.get("attention", "flash") == "flash")


def _published_config(run) -> str:
    f = run["fixed"]
    names = [("tp", "tp"), ("pp", "pp"), ("dp", "dp"), ("sequence_parallel", "sp"),
             ("micro_batch", "mbs"), ("vpp", "vpp"), ("recompute", "rec")]
    parts = []
    for key, short in names:
        if key in f:
            v = f[key]
            parts.append(short if v is True else f"no-{short}" if v is False else f"{short}{v}"
                         if short != "rec" else f"rec={v}")
    parts.append(f"gbs{f['global_batch']} s{f['seq_len']}")
    parts.append(run.get("attention", "flash"))
    return " ".join(parts)


def _best_over_zero_stages(model, cluster, run, zero_stages):
    """The planner's best over the ZeRO stages the run's engine offered; (Result, fits)."""
    f = run["fixed"]
    best, closest = None, None
    for z in zero_stages:
        fixed = dataclasses.replace(fixed_of(run), zero=z)
        try:
            rep = search(model, cluster, fixed, f["seq_len"], f["global_batch"], top=1)
        except BadInput:          # e.g. ZeRO-1 with dp = 1: no such configuration
            continue
        if rep.best is not None:
            if best is None or rep.best.estimate.step_time_s < best.estimate.step_time_s:
                best = rep.best
        elif rep.closest is not None and (closest is None or max(
                rep.closest.estimate.overflow_gib()) < max(closest.estimate.overflow_gib())):
            closest = rep.closest
    return (best, True) if best is not None else (closest, False)


def predict(run, any_zero: bool = False) -> dict:
    """The planner's prediction for one published run (runs the search, top=1).

    The unpublished knobs are the planner's choice, the ZeRO stage among those the run's engine
    offered (`zero_stages` in the data; any stage with any_zero=True).
    """
    model = model_from_hf_config(run["model"], run["model"].get("_name", run["id"]))
    cluster = get_cluster(run["cluster"])
    zero_stages = [None] if any_zero else run.get("zero_stages", [None])
    best, fits = _best_over_zero_stages(model, cluster, run, zero_stages)
    c, e = best.candidate, best.estimate
    pub_tflops = run.get("published", {}).get("tflops_per_gpu")
    return {
        "run": run["id"], "gpu": cluster.gpu.name, "gpus": cluster.num_gpus,
        "published_config": _published_config(run),
        "planner_chose": describe(c, best.layers, best.recompute),
        "published_s": run["step_time_s"], "predicted_s": e.step_time_s,
        "error_pct": (e.step_time_s / run["step_time_s"] - 1) * 100,
        "published_tflops": pub_tflops, "predicted_tflops": e.tflops_per_gpu,
        "fits": fits, "peak_gib": e.peak_memory_gib,
        "capacity_gib": e.capacity_gib,
        # for tests: the chosen candidate must honour every published knob
        "candidate": c, "layers": list(best.layers), "recompute": list(best.recompute),
    }


def table(runs=None) -> list:
    return [predict(r) for r in (runs if runs is not None else load_runs())]


def summary(rows) -> dict:
    """median/max |error| overall and per GPU type, and whether every run fits."""
    def stats(rs):
        a = [abs(r["error_pct"]) for r in rs]
        return {"runs": len(a), "median_abs_pct": statistics.median(a), "max_abs_pct": max(a),
                "mean_signed_pct": statistics.fmean(r["error_pct"] for r in rs)}
    out = {"all": stats(rows)}
    for g in sorted({r["gpu"] for r in rows}):
        out[g] = stats([r for r in rows if r["gpu"] == g])
    out["all_fit"] = all(r["fits"] for r in rows)
    return out


def to_markdown(rows, summ, seconds: float) -> str:
    lines = [f"# Fidelity vs published runs ({today()})", "",
             "Predicted step time with the published configuration fixed and the unpublished "
             "knobs chosen by the planner; one set of catalog GPU constants per GPU type "
             "(`planner/catalog/gpus.py`), nothing fitted per run. "
             f"Generated by `python -m benchmarks.fidelity` in {seconds:.1f} s ({machine()}).",
             "", "| scope | runs | median abs error % | max abs error % | mean signed error % |",
             "|:---|---:|---:|---:|---:|"]
    for k, v in summ.items():
        if k == "all_fit":
            continue
        lines.append(f"| {k} | {v['runs']} | {v['median_abs_pct']:.1f} | {v['max_abs_pct']:.1f} "
                     f"| {v['mean_signed_pct']:+.1f} |")
    lines += ["", f"Targets: median <= {MEDIAN_TARGET_PCT:.0f}%, every run within "
              f"{MAX_TARGET_PCT:.0f}%, every published configuration predicted to fit: "
              f"all fit = {'yes' if summ['all_fit'] else 'NO'}.", ""]
    lines.append(markdown_table(rows, COLUMNS, headers=HEADERS))
    return "\n".join(lines)


def write_csv(rows, path) -> None:
    import csv
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()
                        if k in COLUMNS})


def plot(rows, path) -> None:
    """Predicted vs published (log-log, ±10%/±25% bands) and the signed error of every run."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 6.5), gridspec_kw={"width_ratios": [1, 0.8]})
    pub = [r["published_s"] for r in rows]
    pred = [r["predicted_s"] for r in rows]
    lim = [min(pub + pred) * 0.7, max(pub + pred) * 1.4]
    ax.fill_between(lim, [x * 0.75 for x in lim], [x * 1.25 for x in lim], color="0.9",
                    label="±25%")
    ax.fill_between(lim, [x * 0.9 for x in lim], [x * 1.1 for x in lim], color="0.8",
                    label="±10%")
    ax.plot(lim, lim, "k--", lw=1, label="exact")
    colors = {}
    for gpu, marker in (("a100", "o"), ("h100", "s"), ("h200", "^"), ("b200", "D")):
        sel = [r for r in rows if r["gpu"] == gpu]
        if sel:
            pts = ax.scatter([r["published_s"] for r in sel], [r["predicted_s"] for r in sel],
                             marker=marker, label=gpu.upper(), zorder=3)
            colors[gpu] = pts.get_facecolor()[0]
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lim)
    ax.set_ylim(lim)
    ax.set_xlabel("published step time (s)")
    ax.set_ylabel("predicted step time (s)")
    s = summary(rows)["all"]
    ax.set_title(f"Predicted vs published step time ({len(rows)} runs, {today()})\n"
                 f"median |error| {s['median_abs_pct']:.1f}%, max {s['max_abs_pct']:.1f}%",
                 fontsize=10)
    ax.legend(loc="upper left")
    y = list(range(len(rows)))[::-1]
    bx.barh(y, [r["error_pct"] for r in rows], color=[colors.get(r["gpu"], "C0") for r in rows])
    bx.set_yticks(y)
    bx.set_yticklabels([r["run"] for r in rows], fontsize=7)
    for x in (-25, -10, 10, 25):
        bx.axvline(x, color="0.6" if abs(x) == 25 else "0.8", lw=1, ls="--")
    bx.axvline(0, color="k", lw=0.8)
    bx.set_xlim(-30, 30)
    bx.set_xlabel("error % (predicted / published - 1)")
    bx.set_title("Signed error per run", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(RESULTS), help="directory for the CSV, markdown, PNG")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--no-sensitivity", action="store_true",
                    help="skip the second prediction with every ZeRO stage allowed")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    runs = load_runs()
    rows = table(runs)
    seconds = time.perf_counter() - t0
    if not a.no_sensitivity:
        for run, row in zip(runs, rows):
            row["any_zero_error_pct"] = predict(run, any_zero=True)["error_pct"]
    summ = summary(rows)
    md = to_markdown(rows, summ, seconds)
    print(md)
    csv_path, md_path = out_path(a.out, "fidelity", "csv"), out_path(a.out, "fidelity", "md")
    write_csv(rows, csv_path)
    md_path.write_text(md)
    written = [csv_path, md_path]
    if not a.no_plot:
        png = out_path(a.out, "fidelity", "png")
        plot(rows, png)
        written.append(png)
    print("wrote " + ", ".join(str(p) for p in written))
    ok = (summ["all"]["median_abs_pct"] <= MEDIAN_TARGET_PCT
          and summ["all"]["max_abs_pct"] <= MAX_TARGET_PCT and summ["all_fit"])
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
