"""Closing the loop on this CPU machine: profile, plan with the profile, run, compare.

    python -m benchmarks.closed_loop [--steps 8] [--model FILE] [--out DIR]

1. `torchrun --standalone --nproc-per-node 2 -m profiler` (gloo) on a small Llama-shaped model;
2. plan for `cpux2` with that profile: the best plan and the best plan of each other layout
   family (tp=2, pp=2, dp=2 ...), as `plan --profile` would rank them;
3. run each with the runtime (`torchrun ... -m runtime --plan P --steps N --metrics M`);
4. print predicted vs measured step time (median of the steps after the first), the catalog-only
   prediction beside it, whether the predicted ranking held, and predicted vs measured memory
   per rank (params, grads, optimizer, activations, peak); write closed_loop.{md,json} and the
   measured profile under --out (default outside the checkout; `--out benchmarks/results`
   writes the committed tables, the committed profile stays benchmarks/profiles/).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._common import OUT_HELP, SCRATCH, run_cli
from planner.catalog import get_cluster, get_model
from planner.cost.price import candidate_of, price
from planner.profile import apply_profile, load_profile
from planner.search import Fixed, search, to_plan

ROOT = Path(__file__).resolve().parent.parent

# A Llama-shaped model small enough for two CPU processes: GQA (8 heads, 4 KV heads),
# SwiGLU, RMSNorm, RoPE; tp=2 divides heads, KV heads, FFN and vocabulary.
SMALL = {"name": "tiny-llama", "num_layers": 4, "hidden": 256, "ffn_hidden": 704,
         "num_heads": 8, "num_kv_heads": 4, "vocab_size": 4096, "max_seq_len": 512}
SEQ_LEN = 256
GLOBAL_BATCH = 8
FAMILIES = ({"tp": 2}, {"pp": 2}, {"dp": 2, "zero": 0}, {"dp": 2, "zero": 1},
            {"dp": 2, "zero": 0, "recompute": "full"})


def torchrun(args, log_path: Path, timeout: int) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", "2"] + args
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    with open(log_path, "w") as f:
        r = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                           env=env)
    if r.returncode != 0:
        tail = log_path.read_text().splitlines()[-15:]
        raise SystemExit(f"closed_loop: {' '.join(args[:2])} failed (exit {r.returncode}):\n"
                         + "\n".join(tail))


def describe(plan) -> str:
    p, b = plan.parallelism, plan.batch
    s = f"tp{p.tp} pp{p.pp} dp{p.dp}"
    if p.dp > 1:
        s += f" zero{p.zero_stage}"
    if p.sequence_parallel:
        s += " sp"
    if p.pp > 1:
        s += f" {p.schedule}" + (f" v{p.vpp}" if p.vpp > 1 else "")
    s += f" mbs{b.micro_batch_size}x{b.num_microbatches}"
    if p.recompute != "none":
        s += f" rec-{p.recompute}"
    return s


def choose_plans(model, cluster, seq, gbs, n_alt: int, engine):
    """The best plan, then the best of each other family, in predicted order."""
    best = search(model, cluster, Fixed(), seq, gbs, top=5, engine=engine, rejected=False)
    plans = [to_plan(model, cluster, best.best, best)]
    seen = {describe(plans[0])}
    for fam in FAMILIES:
        f = Fixed(**fam)
        try:
            rep = search(model, cluster, f, seq, gbs, top=1, engine=engine, rejected=False)
        except Exception:     # noqa: BLE001 - a family that cannot be laid out is skipped
            continue
        if rep.best is None:
            continue
        pl = to_plan(model, cluster, rep.best, rep)
        if describe(pl) not in seen:
            seen.add(describe(pl))
            plans.append(pl)
    # alternatives: other layouts (tp, pp, dp) first, each family's best, then the rest
    def shape(p):
        return (p.parallelism.tp, p.parallelism.pp, p.parallelism.dp)
    first, rest = plans[0], sorted(plans[1:], key=lambda p: p.estimate["step_time_s"])
    picked, shapes = [], {shape(first)}
    for p in rest:
        if shape(p) not in shapes:
            picked.append(p)
            shapes.add(shape(p))
    picked += [p for p in rest if p not in picked]
    return [first] + sorted(picked[:n_alt], key=lambda p: p.estimate["step_time_s"])


def wait_quiet(limit_s: float, threshold: float) -> float:
    """Wait (up to limit_s) until the 1-minute load average drops below threshold: this
    machine is shared, and other jobs on its 2 cores skew every timing. Returns the load."""
    t0 = time.time()
    while os.getloadavg()[0] >= threshold and time.time() - t0 < limit_s:
        time.sleep(5)
    return os.getloadavg()[0]


MEMORY_KEYS = ("params", "grads", "optimizer", "activations")


def measured_step(metrics: Path) -> dict:
    steps, memory = [], None
    for line in metrics.read_text().splitlines():
        d = json.loads(line)
        if "step" in d:
            steps.append(d["step_time_s"])
            memory = memory or d.get("measured_memory_gib")
    steady = steps[1:] if len(steps) > 1 else steps
    return {"median": statistics.median(steady), "mean": statistics.fmean(steady),
            "min": min(steady), "max": max(steady), "steps": len(steps), "all": steady,
            "memory": memory}


def memory_rows(predicted: list, measured: list) -> list:
    """Per global rank: the plan's memory of its pipeline rank beside the first step's
    measured memory (runtime/memory.py), GiB."""
    out = []
    for rank, m in enumerate(measured or []):
        pr = predicted[m["pp_rank"]]
        row = {"rank": rank, "pp_rank": m["pp_rank"]}
        for k in MEMORY_KEYS:
            row[k] = (pr[k], m[k])
        # the plan's total (other included) vs the process's peak: on CPU the max RSS, which
        # includes the libraries (~0.4 GiB of torch), on GPUs max_memory_allocated
        row["peak"] = (pr["total"], m["peak"])
        out.append(row)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--alternatives", type=int, default=3)
    ap.add_argument("--model", help="model config (default: a 4-layer Llama-shaped model)")
    ap.add_argument("--profile", help="use this profile instead of measuring one")
    ap.add_argument("--quick-profile", action="store_true")
    ap.add_argument("--statistic", choices=("min", "median"), default="min",
                    help="statistic the plans are made with (profiler --statistic) and compared "
                         "on: min on this shared machine, where other jobs only add time")
    ap.add_argument("--rounds", type=int, default=2,
                    help="run every plan this many times, interleaved (median of the rounds)")
    ap.add_argument("--wait-quiet", type=float, default=120.0,
                    help="seconds to wait for a quiet machine before each run")
    ap.add_argument("--quiet-load", type=float, default=1.5)
    ap.add_argument("--out", default=str(SCRATCH), help=OUT_HELP)
    a = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="closed_loop_"))
    if a.model:
        model_path = a.model
    else:
        model_path = str(work / "tiny-llama.json")
        Path(model_path).write_text(json.dumps(SMALL))
    model = get_model(model_path)
    load0 = os.getloadavg()[0]
    t0 = time.time()

    # 1. profile
    if a.profile:
        prof_path = Path(a.profile)
    else:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        prof_path = Path(a.out) / f"cpux2-{model.name}.json"
        print(f"[1/3] profiling {model.name} on 2 gloo processes -> {prof_path}", flush=True)
        torchrun(["-m", "profiler", "--model", model_path, "--seq-len", str(SEQ_LEN),
                  "--statistic", a.statistic, "--out", str(prof_path)]
                 + (["--quick"] if a.quick_profile else []),
                 work / "profile.log", 900)
    profile = load_profile(prof_path)

    # 2. plan
    catalog = get_cluster("cpux2")
    cluster, engine, notes = apply_profile(profile, catalog, model, a.statistic)
    other = "median" if a.statistic == "min" else "min"
    cluster_other, engine_other, _ = apply_profile(profile, catalog, model, other)
    plans = choose_plans(model, cluster, SEQ_LEN, GLOBAL_BATCH, a.alternatives, engine)
    print(f"[2/3] planned {len(plans)} layouts with the profile ({len(notes)} measured figures)",
          flush=True)

    # 3. run (interleaved rounds: contention from other jobs hits every plan alike)
    runs = {i: [] for i in range(len(plans))}
    loads = []
    paths = []
    for i, plan in enumerate(plans):
        path = work / f"plan{i}.json"
        plan.search["profile"] = str(prof_path)
        plan.save(path)
        paths.append(path)
    for rnd in range(a.rounds):
        for i, plan in enumerate(plans):
            loads.append(wait_quiet(a.wait_quiet, a.quiet_load))
            metrics = work / f"metrics{i}_{rnd}.jsonl"
            print(f"[3/3] round {rnd + 1}: running {describe(plan)} for {a.steps} steps "
                  f"(load {loads[-1]:.1f})", flush=True)
            torchrun(["-m", "runtime", "--plan", str(paths[i]), "--steps", str(a.steps),
                      "--metrics", str(metrics)], work / f"run{i}_{rnd}.log", 1800)
            runs[i].append(measured_step(metrics))
            print(f"      predicted {plan.estimate['step_time_s']:.3f} s  measured "
                  f"{runs[i][-1][a.statistic]:.3f} s ({a.statistic} step)", flush=True)
    rows = []
    for i, plan in enumerate(plans):
        steps = [x for m in runs[i] for x in m["all"]]
        pick = min if a.statistic == "min" else statistics.median
        pick_other = statistics.median if a.statistic == "min" else min
        measured, measured_other = pick(steps), pick_other(steps)
        c = candidate_of(plan)
        layers = [sum(s.num_layers for s in plan.stages_of_rank(r)) for r in range(c.pp)]
        rec = [sum(s.recompute_layers for s in plan.stages_of_rank(r)) for r in range(c.pp)]
        cat_est = price(model, catalog, c, layers, rec, engine="runtime").estimate
        cat = cat_est.step_time_s
        est = price(model, cluster, c, layers, rec, engine=engine).estimate
        pred_other = price(model, cluster_other, c, layers, rec,
                           engine=engine_other).estimate.step_time_s
        pred = plan.estimate["step_time_s"]
        rows.append({"plan": describe(plan), "predicted": pred, "catalog": cat,
                     "measured": measured, "spread": (min(steps), max(steps)),
                     "error": measured / pred - 1, "catalog_error": measured / cat - 1,
                     "predicted_other": pred_other, "measured_other": measured_other,
                     "error_other": measured_other / pred_other - 1,
                     "breakdown": plan.estimate.get("time_breakdown_s", {}),
                     "memory": memory_rows(est.stage_memory_gib, runs[i][0]["memory"]),
                     "catalog_memory": memory_rows(cat_est.stage_memory_gib,
                                                   runs[i][0]["memory"])})

    pred_best = min(range(len(rows)), key=lambda i: rows[i]["predicted"])
    meas_best = min(range(len(rows)), key=lambda i: rows[i]["measured"])
    pred_order = sorted(range(len(rows)), key=lambda i: rows[i]["predicted"])
    meas_order = sorted(range(len(rows)), key=lambda i: rows[i]["measured"])
    within = sum(abs(r["error"]) <= 0.25 for r in rows)
    text = report(rows, profile, notes, pred_best, meas_best, pred_order, meas_order, within,
                  load0, loads, time.time() - t0, a.steps, a.rounds, prof_path, a.statistic,
                  other)
    print(text)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "closed_loop.md").write_text(text)
    (out / "closed_loop.json").write_text(json.dumps(
        {"rows": rows, "runs": {str(i): r for i, r in runs.items()}, "notes": notes,
         "statistic": a.statistic, "profile": str(prof_path)}, indent=1) + "\n")
    print(f"written to {out / 'closed_loop.md'}")
    return 0


def report(rows, profile, notes, pred_best, meas_best, pred_order, meas_order, within, load0,
           loads, seconds, steps, rounds, prof_path, stat, other) -> str:
    hw, sw = profile.hardware, profile.data["software"]
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    held = pred_best == meas_best
    lines = [
        "# Closed loop: profile -> plan -> run (CPU, 2 gloo processes)",
        "",
        f"Date: {date}. Machine: {hw['device_name']}, {hw['world_size']} processes "
        f"(torch {sw['torch']}, {sw['backend']}). The machine is shared: 1-minute load average "
        f"{load0:.1f} at start, {min(loads):.1f}-{max(loads):.1f} when the runs started "
        f"({seconds:.0f} s in all).",
        "",
        f"Model: `{json.dumps(SMALL)}`, seq_len {SEQ_LEN}, global batch {GLOBAL_BATCH}. "
        f"Profile: `benchmarks/profiles/{prof_path.name}` (created "
        f"{profile.data['created_utc']}, {profile.data['settings'].get('seconds')} s).",
        "",
        f"Plans are made with the profile's **{stat}** timings and compared with the **{stat}** "
        f"step time of {rounds} interleaved runs x steps 2..{steps} of `python -m runtime` "
        f"(the first step builds the schedule). With other jobs on the 2 cores only ever adding "
        f"time, the {stat} is the reproducible figure; the {other}-vs-{other} comparison of "
        f"the same runs is given too.",
        "",
        f"| # | plan | predicted | measured ({stat} step) | error | catalog-only prediction | "
        f"catalog error | predicted ({other}) | measured ({other}) | error ({other}) | "
        f"all steps |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(rows):
        tag = " (planner's best)" if i == 0 else ""
        lines.append(
            f"| {i} | {r['plan']}{tag} | {r['predicted']:.3f} s | {r['measured']:.3f} s | "
            f"{r['error'] * 100:+.1f}% | {r['catalog']:.3f} s | {r['catalog_error'] * 100:+.1f}% | "
            f"{r['predicted_other']:.3f} s | {r['measured_other']:.3f} s | "
            f"{r['error_other'] * 100:+.1f}% | {r['spread'][0]:.3f}-{r['spread'][1]:.3f} s |")
    lines += [
        "",
        f"**Within 25% of the prediction: {within} of {len(rows)}. Predicted best = measured "
        f"best: {'yes' if held else 'NO'}** (predicted order {', '.join(map(str, pred_order))}; "
        f"measured order {', '.join(map(str, meas_order))}).",
        "",
        "Measured figures the planner used (`plan --profile`):",
        "",
    ] + [f"- {n}" for n in notes] + [
        "",
        "Predicted breakdown (seconds per step):",
        "",
        "| # | " + " | ".join(rows[0]["breakdown"]) + " |",
        "|---|" + "---|" * len(rows[0]["breakdown"]),
    ] + [f"| {i} | " + " | ".join(f"{v:.3f}" for v in r["breakdown"].values()) + " |"
         for i, r in enumerate(rows)] + [""] + memory_table(rows) + ["", GAPS]
    return "\n".join(lines) + "\n"


def memory_table(rows) -> list:
    mib = 2 ** 10
    lines = [
        "Memory per rank, predicted (with the profile; catalog-only in brackets) / measured on "
        "the first step, MiB (`measured_memory_gib`: parameter, gradient and optimizer-state "
        "bytes of the tensors, the peak of saved activations through saved-tensor hooks). "
        "`peak`: the plan's total (other included) / the process's max RSS, which on CPU "
        "includes torch itself. Under ZeRO 3 the measured params include what FSDP2 holds "
        "gathered while computing (the root group and the layer in use), which the plan counts "
        "under `other`.",
        "",
        "| # | rank | pp rank | " + " | ".join(MEMORY_KEYS) + " | act. measured/predicted | "
        "peak |",
        "|---|---|---|" + "---|" * (len(MEMORY_KEYS) + 2),
    ]
    for i, r in enumerate(rows):
        for m, c in zip(r["memory"], r["catalog_memory"]):
            cells = [f"{m[k][0] * mib:.2f} [{c[k][0] * mib:.2f}] / {m[k][1] * mib:.2f}"
                     for k in MEMORY_KEYS]
            pa, ma = m["activations"]
            ratio = f"{ma / pa:.2f}" if pa else "-"
            lines.append(f"| {i} | {m['rank']} | {m['pp_rank']} | " + " | ".join(cells)
                         + f" | {ratio} | {m['peak'][0] * mib:.1f} / {m['peak'][1] * mib:.0f} |")
    return lines


GAPS = """## What the prediction does not capture (CPU runtime)

- **A shared machine.** Other jobs (test suites, benchmarks) run on the same 2 cores; a step's
  time varies 2-4x from one step to the next. The profile keeps every sample and the planner
  can use the median or the min; neither removes contention that lasts longer than a
  measurement, and short profile timings catch quiet moments more easily than 0.5-1 s steps.
- **Runtime work outside the measured pieces:** per-step zero_grad, the gradient-norm pass
  (a `.cpu()` per parameter), the loss all-reduce, data slicing, Python per micro-batch; the
  `torch.distributed.pipelining` schedule's own overhead (modelled only as p2p alpha-beta).
- **Data parallel:** the runtime's ZeRO-0/1 all-reduce overlaps the last micro-batch's backward
  in buckets, as the planner prices it (runtime/parallelize.py GradAllReduce); ZeRO-1 is an all-reduce plus
  broadcasts in the runtime, a reduce-scatter plus all-gather in the planner; ZeRO-2/3 is FSDP2
  (per-layer hooks, gloo collectives) whose hook overhead is not measured.
- **Tensor parallel:** measured, not modelled: the embedding's and the vocabulary-parallel
  loss's collectives (in the embedding and head figures, timed on the runtime's own TP parts)
  and DTensor dispatch (as a factor from timing the runtime's own TP layer against the bare
  shard plus the modelled collectives). The
  planner's comm model has one latency per link class; gloo's all-reduce, all-gather and
  reduce-scatter differ by op (the profile keeps the per-op fits).
"""


if __name__ == "__main__":
    sys.exit(run_cli(main, "closed_loop"))
