"""Prediction vs published training runs.

For each run in benchmarks/data/published_runs.json: fix what was published (tp, pp, dp,
recompute, micro-batch, ...), let the planner choose the rest, and compare the predicted step
time with the published one.

    python -m benchmarks.fidelity [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import pandas as pd

from planner.catalog import get_cluster
from planner.search import Fixed, search
from planner.specs import model_from_hf_config

DATA = Path(__file__).parent / "data" / "published_runs.json"


def load_runs(path=DATA) -> list:
    return json.loads(Path(path).read_text())["runs"]


def fixed_of(run) -> Fixed:
    f = run["fixed"]
    return Fixed(tp=f.get("tp"), pp=f.get("pp"), dp=f.get("dp"), recompute=f.get("recompute"),
                 sp=f.get("sequence_parallel"), mbs=f.get("micro_batch"), vpp=f.get("vpp"),
                 schedule=("interleaved" if f.get("vpp", 1) > 1 else None),
                 flash=run.get("attention", "flash") == "flash")


def predict(run) -> dict:
    model = model_from_hf_config(run["model"], run["model"].get("_name", run["id"]))
    cluster = get_cluster(run["cluster"])
    f = run["fixed"]
    rep = search(model, cluster, fixed_of(run), f["seq_len"], f["global_batch"], top=1)
    best = rep.best or rep.closest
    c, e = best.candidate, best.estimate
    return {
        "run": run["id"], "gpus": cluster.num_gpus,
        "config": (f"tp{c.tp} pp{c.pp} dp{c.dp} z{c.zero} {'sp ' if c.sp else ''}"
                   f"mbs{c.mbs} v{c.vpp} {c.recompute}{sum(best.recompute)}"),
        "published_s": run["step_time_s"], "predicted_s": e.step_time_s,
        "error_pct": (e.step_time_s / run["step_time_s"] - 1) * 100,
        "fits": rep.best is not None, "peak_gib": e.peak_memory_gib,
    }


def table(runs=None) -> pd.DataFrame:
    return pd.DataFrame([predict(r) for r in (runs or load_runs())])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    a = ap.parse_args(argv)
    df = table()
    pd.set_option("display.width", 160)
    print(df.to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    abs_err = df["error_pct"].abs()
    print(f"\nmedian |error| {abs_err.median():.1f}%   max |error| {abs_err.max():.1f}%   "
          f"all fit: {bool(df['fits'].all())}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "fidelity.csv", index=False)
    (out / "fidelity.md").write_text(
        f"# Fidelity vs published runs ({datetime.date.today()})\n\n"
        + df.to_markdown(index=False, floatfmt=".2f") if _has_tabulate() else df.to_string(index=False))
    _plot(df, out / "fidelity.png")
    return df


def _has_tabulate():
    try:
        import tabulate  # noqa: F401
        return True
    except ImportError:
        return False


def _plot(df, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 6))
    ax.scatter(df["published_s"], df["predicted_s"])
    lim = [min(df["published_s"].min(), df["predicted_s"].min()) * 0.8,
           max(df["published_s"].max(), df["predicted_s"].max()) * 1.25]
    ax.plot(lim, lim, "k--", lw=1, label="exact")
    ax.fill_between(lim, [x * 0.75 for x in lim], [x * 1.25 for x in lim], alpha=0.1, label="±25%")
    ax.set_xscale("log"); ax.set_yscale("log")
    ax.set_xlim(lim); ax.set_ylim(lim)
    ax.set_xlabel("published step time (s)"); ax.set_ylabel("predicted step time (s)")
    for _, r in df.iterrows():
        ax.annotate(r["run"], (r["published_s"], r["predicted_s"]), fontsize=6)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
