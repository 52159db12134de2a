"""Plan quality: the planner's best plan against the published one and two common recipes.

Every plan is scored by the same cost model (planner.cost). For each workload (model, cluster,
sequence length, global batch, attention kernels):

- planner: `search` with nothing fixed;
- published: the published configuration, unpublished knobs chosen by the planner, ZeRO among
  the stages the engine offered, the engine as the row ran it (benchmarks.fidelity engine_of:
  torch.compile, gradient dtype, ...) -- published runs only, every plan of the row priced on
  that engine;
- FSDP: ZeRO-3 data parallel, tp=1, pp=1, dp=N, the fewest recomputed layers that fit, the
  fastest micro-batch;
- Megatron: TP = GPUs per node with sequence parallel, the smallest PP that fits, 1F1B, full
  recompute of every layer, the distributed optimizer (ZeRO-1), the fastest micro-batch.

Each loser gets its reason: slower by x% (and the part of the step that grew most), out of
memory on stage k by y GiB, or not divisible.

    python -m benchmarks.plan_quality [--out DIR] [--only-published|--only-catalog] [--limit N]
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import time

from benchmarks._common import (OUT_HELP, SCRATCH, describe, machine, markdown_table, out_path,
                                run_cli, today)
from benchmarks.fidelity import (FIDELITY_MARGIN_GIB, _best_over_zero_stages, cluster_of,
                                 engine_of, fixed_of, load_runs, model_of)
from planner.catalog import get_cluster, get_model
from planner.errors import BadInput
from planner.limits import divisors
from planner.search import Fixed, default_global_batch, default_seq_len, search
from planner.catalog.hf import model_from_hf_config
from planner.suggest import _layout_free
from planner.engines import get_engine
from planner.rules import tp_ok

# Catalog models on clusters a user would typically give them.
CATALOG = [
    ("llama2-7b", "a100x8"),
    ("llama3-8b", "h100x8"),
    ("llama2-13b", "a100x16"),
    ("llama3-70b", "h100x64"),
    ("llama3-70b", "h100x512"),
    ("gpt3-175b", "a100x1024"),
    ("llama3-405b", "h100x2048"),
    ("llama3-405b", "h100x16384"),
]
TIE_PCT = 0.05
PART_NAMES = {"compute": "compute", "tp_comm": "TP comm", "pp_comm": "PP comm",
              "dp_comm_exposed": "exposed DP comm", "bubble": "bubble", "optimizer": "optimizer"}


class Outcome:
    """A scored configuration: a fitting Result, or why there is none."""

    def __init__(self, result=None, fits=False, why=None):
        self.result, self.fits, self.why = result, fits, why

    @property
    def step(self):
        return self.result.estimate.step_time_s if self.fits else None

    def config(self) -> str:
        r = self.result
        return describe(r.candidate, r.layers, r.recompute) if r is not None else ""


def _oom_reason(result) -> str:
    e = result.estimate
    over = e.overflow_gib()
    k = max(range(len(over)), key=lambda i: over[i])
    return (f"out of memory on stage {k} by {over[k]:.1f} GiB "
            f"({e.stage_memory_gib[k]['total']:.1f} of {e.capacity_gib:.1f} GiB)")


def run_search(model, cluster, fixed, seq, gbs, engine=None, margin_gib=None) -> Outcome:
    try:
        rep = search(model, cluster, fixed, seq, gbs, top=1, rejected=False, engine=engine,
                     margin_gib=margin_gib)
    except BadInput as e:
        return Outcome(why=f"not divisible: {e}")
    if rep.best is not None:
        return Outcome(rep.best, True)
    if rep.closest is not None:
        return Outcome(rep.closest, False, _oom_reason(rep.closest))
    return Outcome(why="no candidate")


def fsdp(model, cluster, seq, gbs, flash, engine=None, base=None, margin_gib=None) -> Outcome:
    n = cluster.num_gpus
    if gbs % n:
        return Outcome(why=f"not divisible: global batch {gbs} over dp={n}")
    f = dataclasses.replace(base or Fixed(flash=flash), tp=1, pp=1, dp=n, zero=3)
    return run_search(model, cluster, f, seq, gbs, engine, margin_gib)


def megatron(model, cluster, seq, gbs, flash, engine=None, base=None,
             margin_gib=None) -> Outcome:
    tp = min(cluster.gpus_per_node, cluster.num_gpus)
    if not tp_ok(model, tp, engine=get_engine("megatron")):   # Megatron pads the vocabulary
        return Outcome(why=f"not divisible: tp={tp} (GPUs per node) does not divide the heads "
                           f"({model.num_heads}/{model.num_kv_heads} KV) or FFN")
    if cluster.num_gpus % tp:
        return Outcome(why=f"not divisible: tp={tp} does not divide {cluster.num_gpus} GPUs")
    last = Outcome(why="no pipeline degree divides the cluster and the batch")
    for pp in divisors(cluster.num_gpus // tp):
        if pp > model.num_layers:
            break
        dp = cluster.num_gpus // (tp * pp)
        if gbs % dp:
            last = Outcome(why=f"not divisible: global batch {gbs} over dp={dp} (pp={pp})")
            continue
        f = dataclasses.replace(base or Fixed(flash=flash), tp=tp, pp=pp,
                                zero=1 if dp > 1 else 0, sp=tp > 1, schedule="1f1b",
                                recompute="full")
        out = run_search(model, cluster, f, seq, gbs, engine, margin_gib)
        if out.fits:
            return out
        if out.result is not None or last.result is None:
            last = out
    if last.result is not None:
        last.why = "every pipeline degree: " + (last.why or "")
    return last


def verdict(o: Outcome, best: Outcome) -> str:
    if not o.fits:
        return o.why or "does not fit"
    d = (o.step / best.step - 1) * 100
    if d <= TIE_PCT:
        return "ties the planner" if d >= -TIE_PCT else f"FASTER than the planner by {-d:.2f}%"
    a, b = o.result.estimate.time_breakdown_s, best.result.estimate.time_breakdown_s
    part = max(a, key=lambda k: a[k] - b.get(k, 0.0))
    return (f"slower by {d:.1f}% ({PART_NAMES.get(part, part)} "
            f"+{a[part] - b.get(part, 0.0):.3g} s)")


def compare(name, model, cluster, seq, gbs, flash, published=None, engine=None, base=None,
            margin_gib=None) -> dict:
    """The planner's best, the published configuration (given) and the two recipes, all priced
    for `engine` (default megatron) under the same assumptions `base` (a Fixed with no layout
    fixed: precision, kernels, overlaps, MoE routing as the run had them) and memory margin,
    as one row."""
    t0 = time.perf_counter()
    base = base or Fixed(flash=flash)
    best = run_search(model, cluster, base, seq, gbs, engine, margin_gib)
    row = {"workload": name, "model": model.name, "cluster": cluster.name,
           "gpus": cluster.num_gpus, "seq_len": seq, "global_batch": gbs,
           "attention": "flash" if flash else "eager",
           "planner_config": best.config() if best.fits else "",
           "planner_s": best.step, "planner_mfu": (best.result.estimate.mfu if best.fits
                                                   else None)}
    outs = {"fsdp": fsdp(model, cluster, seq, gbs, flash, engine, base, margin_gib),
            "megatron": megatron(model, cluster, seq, gbs, flash, engine, base, margin_gib)}
    if published is not None:
        outs = {"published": published, **outs}
    for k, o in outs.items():
        row[f"{k}_config"] = o.config()
        row[f"{k}_s"] = o.step
        row[f"{k}_vs_planner_pct"] = ((o.step / best.step - 1) * 100
                                      if (o.fits and best.fits) else None)
        row[f"{k}_verdict"] = verdict(o, best) if best.fits else (o.why or "")
    if not best.fits:
        row["planner_config"] = "nothing fits: " + (best.why or "")
    row["seconds"] = time.perf_counter() - t0
    return row


def published_rows(limit=None) -> list:
    rows = []
    for run in load_runs()[:limit]:
        model, cluster = model_of(run), cluster_of(run)
        engine = engine_of(run)     # as the row ran: compiled, its gradient dtype, ... (fidelity)
        f = run["fixed"]
        fixed = fixed_of(run)
        res, fits = _best_over_zero_stages(model, cluster, run, run.get("zero_stages", [None]),
                                           engine)
        pub = Outcome(res, fits, None if fits or res is None else _oom_reason(res))
        rows.append(compare(run["id"], model, cluster, f["seq_len"], f["global_batch"],
                            fixed.flash, published=pub, engine=engine,
                            base=_layout_free(fixed), margin_gib=FIDELITY_MARGIN_GIB))
        print(_line(rows[-1]), flush=True)
    return rows


def catalog_rows(limit=None) -> list:
    rows = []
    for m, c in CATALOG[:limit]:
        model, cluster = get_model(m), get_cluster(c)
        seq = default_seq_len(model)
        gbs = default_global_batch(seq, cluster.num_gpus)
        rows.append(compare(f"{m} on {c}", model, cluster, seq, gbs, True))
        print(_line(rows[-1]), flush=True)
    return rows


def _line(r) -> str:
    s = f"{r['workload']:24s} planner {r['planner_s'] or float('nan'):8.3f} s {r['planner_config']}"
    for k in ("published", "fsdp", "megatron"):
        if f"{k}_verdict" in r:
            s += f"\n{'':26s}{k:9s} {r[k + '_verdict']}"
    return s


COLS_PUB = ["workload", "gpus", "planner_config", "planner_s", "published_config",
            "published_s", "published_verdict", "fsdp_s", "fsdp_verdict", "megatron_config",
            "megatron_s", "megatron_verdict"]
HEAD_PUB = ["run", "GPUs", "planner's best", "step s", "published config (rest by planner)",
            "step s", "published vs planner", "FSDP step s", "FSDP vs planner",
            "Megatron recipe", "step s", "Megatron vs planner"]
COLS_CAT = ["workload", "seq_len", "global_batch", "planner_config", "planner_s", "planner_mfu",
            "fsdp_config", "fsdp_s", "fsdp_verdict", "megatron_config", "megatron_s",
            "megatron_verdict"]
HEAD_CAT = ["workload", "seq", "batch", "planner's best", "step s", "MFU", "FSDP config",
            "step s", "FSDP vs planner", "Megatron recipe", "step s", "Megatron vs planner"]
CSV_COLS = ["workload", "model", "cluster", "gpus", "seq_len", "global_batch", "attention",
            "planner_config", "planner_s", "planner_mfu",
            "published_config", "published_s", "published_vs_planner_pct", "published_verdict",
            "fsdp_config", "fsdp_s", "fsdp_vs_planner_pct", "fsdp_verdict",
            "megatron_config", "megatron_s", "megatron_vs_planner_pct", "megatron_verdict",
            "seconds"]


def _tally(rows, key) -> str:
    slower = [r[f"{key}_vs_planner_pct"] for r in rows
              if r.get(f"{key}_vs_planner_pct") is not None]
    nofit = sum(1 for r in rows if r.get(f"{key}_s") is None and f"{key}_verdict" in r)
    beat = sum(1 for x in slower if x < -TIE_PCT)
    if not slower:
        return f"{key}: no fitting plan in {nofit} workloads"
    slower.sort()
    return (f"{key}: fits in {len(slower)} of {len(slower) + nofit} workloads; vs the planner "
            f"median {slower[len(slower) // 2]:+.1f}%, worst {slower[-1]:+.1f}%; "
            f"faster than the planner in {beat}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(SCRATCH), help=OUT_HELP)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--only-published", action="store_true")
    g.add_argument("--only-catalog", action="store_true")
    ap.add_argument("--limit", type=int, metavar="N",
                    help="only the first N workloads of each table (a quick check)")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    pub = [] if a.only_catalog else published_rows(a.limit)
    cat = [] if a.only_published else catalog_rows(a.limit)
    md = [f"# Plan quality ({today()})", "",
          "The planner's best plan against the published configuration and two recipes a user "
          "would otherwise pick, all scored by the same cost model (`planner.cost`). "
          "Baselines: **FSDP** = ZeRO-3 data parallel (tp=1, pp=1, dp=N), fewest recomputed "
          "layers that fit, fastest micro-batch. **Megatron** = tp = GPUs per node with "
          "sequence parallel, the smallest pp that fits, 1F1B, full recompute of every layer, "
          "distributed optimizer (ZeRO-1), fastest micro-batch. A loser's reason names the "
          "part of the step that grew most against the planner's plan.",
          "", f"Generated by `python -m benchmarks.plan_quality` in "
          f"{time.perf_counter() - t0:.0f} s ({machine()}).", ""]
    if pub:
        md += ["## Published runs", "", "Same sequence length, global batch and attention "
               "kernels (eager for the 2021-22 Megatron runs) as published.", ""]
        md += ["- " + _tally(pub, k) for k in ("published", "fsdp", "megatron")] + [""]
        md.append(markdown_table(pub, COLS_PUB, floatfmt=".3g", headers=HEAD_PUB))
    if cat:
        md += ["## Catalog models on typical clusters", "",
               "Default workload: the model's context (at most 8192) and 4M tokens per step "
               "(at least one sequence per 8 GPUs).", ""]
        md += ["- " + _tally(cat, k) for k in ("fsdp", "megatron")] + [""]
        md.append(markdown_table(cat, COLS_CAT, floatfmt=".3g", headers=HEAD_CAT))
    text = "\n".join(md)
    print(text)
    p = out_path(a.out, "plan_quality", "md")
    p.write_text(text)
    pc = out_path(a.out, "plan_quality", "csv")
    with open(pc, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_COLS, extrasaction="ignore")
        w.writeheader()
        for r in pub + cat:
            w.writerow({k: (f"{v:.5g}" if isinstance(v, float) else v) for k, v in r.items()})
    print(f"wrote {p}, {pc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main, "plan_quality"))
