"""One GPU, at most 8 minutes: profile it, plan a ~1B-parameter Llama with the profile at two
micro-batch sizes, run each plan with our runtime, and write measured step time and peak memory
beside the plan's prediction (issue #10, item 5).

    python -m benchmarks.gpu_check [--out DIR]          # repo root, one CUDA GPU, torch 2.13
    python -m benchmarks.gpu_check --cpu-dry-run        # the same path on CPU, tiny model

World 1 (NCCL on the GPU, gloo on CPU), bf16 autocast (the runtime on CUDA), tp = pp = dp = 1.
Writes, under --out (default: $OUT when set, else outside the checkout): `gpu_check.md`,
`gpu_check.json`, the profile `profile.json` and each run's metrics and log; on a GPU it also
copies the table and profile into benchmarks/results/gpu_check_<date>.{md,json} and
benchmarks/profiles/<gpu>x1-gpu-check.json when that tree is writable. Every stage has a time
limit; a stage that fails or runs out of time is recorded in the table and the rest goes on.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks._common import SCRATCH, run_cli

ROOT = Path(__file__).resolve().parent.parent

# ~0.98B parameters, Llama-shaped (TinyLlama-1.1B's widths with 18 layers): 18 x 47.2M block +
# 2 x 65.5M embedding/head
MODEL_1B = {"_name": "llama-1b-check", "model_type": "llama", "num_hidden_layers": 18,
            "hidden_size": 2048, "intermediate_size": 5632, "num_attention_heads": 16,
            "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 2048,
            "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "tie_word_embeddings": False}
# time limits per stage: 180 + 2 x (45 + 100) = 470 s at most, within the 8 minutes
GPU_SETTINGS = {"seq_len": 2048, "global_batch": 8, "micro_batches": (1, 4), "steps": 6,
                "profile_s": 180, "plan_s": 45, "run_s": 100}
CPU_SETTINGS = {"seq_len": 64, "global_batch": 4, "micro_batches": (1, 2), "steps": 3,
                "profile_s": 300, "plan_s": 120, "run_s": 120}


def sh(cmd: list, log: Path, timeout: float) -> tuple:
    """(exit status, seconds); 124 when it ran out of time. Output goes to `log`."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    t0 = time.time()
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env,
                                timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    return rc, time.time() - t0


def tail(log: Path, n: int = 8) -> str:
    try:
        return " / ".join(log.read_text(errors="replace").strip().splitlines()[-n:])
    except OSError:
        return ""


PLAN_CMD = [sys.executable, "-c", "import sys; from planner.cli import main; "
            "sys.exit(main(sys.argv[1:]))"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or str(SCRATCH / "gpu_check"),
                    help="directory for the table, profile, metrics and logs (default $OUT, else "
                         f"{SCRATCH / 'gpu_check'}, outside the checkout)")
    ap.add_argument("--cpu-dry-run", action="store_true",
                    help="run the same path on CPU with examples/tiny-llama.json")
    a = ap.parse_args(argv)
    import torch
    on_gpu = torch.cuda.is_available() and not a.cpu_dry_run
    if not on_gpu and not a.cpu_dry_run:
        print("gpu_check: no CUDA GPU here (use --cpu-dry-run to try the path on CPU)",
              file=sys.stderr)
        return 2
    cfg = GPU_SETTINGS if on_gpu else CPU_SETTINGS
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    if on_gpu:
        model_path = out / "llama-1b-check.json"
        model_path.write_text(json.dumps(MODEL_1B, indent=1))
        name = torch.cuda.get_device_name(0)
        from planner.profile import catalog_gpu_name
        gpu = catalog_gpu_name(name, "cuda") or "h100"
        hw = f"{name} (catalog {gpu}), torch {torch.__version__}, CUDA {torch.version.cuda}"
    else:
        model_path = ROOT / "examples/tiny-llama.json"
        gpu = "cpu"
        hw = f"CPU dry run, torch {torch.__version__}"
    cluster = f"{gpu}x1"
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"gpu_check: {hw}; model {model_path.name}; cluster {cluster}", flush=True)

    # 1. profile (world 1; --quick keeps it within its limit)
    prof = out / "profile.json"
    rc, prof_s = sh([sys.executable, "-m", "profiler", "--model", str(model_path),
                     "--seq-len", str(cfg["seq_len"]), "--quick", "--out", str(prof)],
                    out / "profile.log", cfg["profile_s"])
    profiled = rc == 0 and prof.exists()
    print(f"[1/3] profile: exit {rc} in {prof_s:.0f} s", flush=True)
    if not profiled:
        print("      " + tail(out / "profile.log"), flush=True)

    rows = []
    for mbs in cfg["micro_batches"]:
        row = {"micro_batch": mbs, "global_batch": cfg["global_batch"],
               "seq_len": cfg["seq_len"], "profiled": profiled}
        rows.append(row)
        # 2. plan (with the profile when there is one; catalog figures otherwise)
        plan_path = out / f"plan-mbs{mbs}.json"
        cmd = PLAN_CMD + ["--model", str(model_path), "--cluster", cluster,
                          "--engine", "runtime", "--seq-len", str(cfg["seq_len"]),
                          "--global-batch", str(cfg["global_batch"]), "--tp", "1", "--pp", "1",
                          "--micro-batch", str(mbs), "--out", str(plan_path)]
        if profiled:
            cmd += ["--profile", str(prof)]
        rc, _ = sh(cmd, out / f"plan-mbs{mbs}.log", cfg["plan_s"])
        if rc != 0 or not plan_path.exists():
            row["error"] = f"plan exit {rc}: {tail(out / f'plan-mbs{mbs}.log', 3)}"
            print(f"[2/3] mbs {mbs}: {row['error']}", flush=True)
            continue
        plan = json.loads(plan_path.read_text())
        est = plan.get("estimate") or {}
        row.update(predicted_step_s=est.get("step_time_s"),
                   predicted_peak_gib=est.get("peak_memory_gib"),
                   predicted_reserved_gib=est.get("peak_reserved_gib"),
                   predicted_stage_gib=[s.get("memory_gib") for s in plan.get("stages", [])])
        print(f"[2/3] mbs {mbs}: predicted {row['predicted_step_s']:.3f} s, "
              f"{row['predicted_peak_gib']:.1f} GiB", flush=True)
        # 3. run
        metrics = out / f"metrics-mbs{mbs}.jsonl"
        rc, run_s = sh([sys.executable, "-m", "runtime", "--plan", str(plan_path),
                        "--steps", str(cfg["steps"]), "--metrics", str(metrics)],
                       out / f"run-mbs{mbs}.log", cfg["run_s"])
        steps = []
        if metrics.exists():
            steps = [json.loads(x) for x in metrics.read_text().splitlines()]
            steps = [s for s in steps if "step" in s]
        row["run_exit"], row["run_s"] = rc, run_s
        if rc != 0 or not steps:
            row["error"] = f"runtime exit {rc}: {tail(out / f'run-mbs{mbs}.log', 4)}"
            print(f"[3/3] mbs {mbs}: {row['error']}", flush=True)
        if steps:
            steady = [s["step_time_s"] for s in steps[1:]] or [steps[0]["step_time_s"]]
            row.update(measured_step_s=statistics.median(steady), measured_steps=len(steps),
                       measured_peak_gib=max(s["peak_memory_gib"] for s in steps),
                       measured_memory_gib=steps[0].get("measured_memory_gib"),
                       loss=[s["loss"] for s in steps])
            print(f"[3/3] mbs {mbs}: measured {row['measured_step_s']:.3f} s, peak "
                  f"{row['measured_peak_gib']:.2f} GiB", flush=True)

    text = report(rows, hw, date, model_path, cluster, cfg, time.time() - t_start)
    print(text)
    (out / "gpu_check.md").write_text(text)
    (out / "gpu_check.json").write_text(json.dumps(
        {"date": date, "hardware": hw, "cluster": cluster, "model": str(model_path.name),
         "settings": {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()},
         "rows": rows}, indent=1) + "\n")
    if on_gpu:     # keep a dated copy in the tree (the device's $OUT is what comes back)
        stamp = date[:10]
        try:
            res = ROOT / "benchmarks/results"
            shutil.copy(out / "gpu_check.md", res / f"gpu_check_{stamp}.md")
            shutil.copy(out / "gpu_check.json", res / f"gpu_check_{stamp}.json")
            if profiled:
                shutil.copy(prof, ROOT / f"benchmarks/profiles/{gpu}x1-gpu-check.json")
        except OSError as e:
            print(f"gpu_check: results stay in {out} ({e})", file=sys.stderr)
    return 0 if all("error" not in r for r in rows) else 1


def _f(x, fmt):
    return format(x, fmt) if isinstance(x, (int, float)) else "-"


def _err(meas, pred):
    if isinstance(meas, (int, float)) and isinstance(pred, (int, float)) and pred:
        return f"{(meas / pred - 1) * 100:+.1f}%"
    return "-"


def report(rows, hw, date, model_path, cluster, cfg, seconds) -> str:
    lines = [
        "# GPU check: profile -> plan -> run on one GPU",
        "",
        f"Date: {date}. Hardware: {hw}. Model `{model_path.name}`, cluster `{cluster}`, "
        f"engine `runtime`, seq_len {cfg['seq_len']}, global batch {cfg['global_batch']}, "
        f"tp = pp = dp = 1, {cfg['steps']} steps per run (median of steps 2..). "
        f"{seconds:.0f} s in all.",
        "",
        "Peak: predicted = the plan's peak allocated (reserved in brackets); measured = "
        "`torch.cuda.max_memory_allocated` (on CPU, the process's max RSS).",
        "",
        "| micro-batch | profiled | predicted step | measured step | error | predicted peak | "
        "measured peak | error | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['micro_batch']} | {'yes' if r['profiled'] else 'no (catalog)'} | "
            f"{_f(r.get('predicted_step_s'), '.3f')} s | {_f(r.get('measured_step_s'), '.3f')} s"
            f" | {_err(r.get('measured_step_s'), r.get('predicted_step_s'))} | "
            f"{_f(r.get('predicted_peak_gib'), '.2f')} ({_f(r.get('predicted_reserved_gib'), '.2f')})"
            f" GiB | {_f(r.get('measured_peak_gib'), '.2f')} GiB | "
            f"{_err(r.get('measured_peak_gib'), r.get('predicted_peak_gib'))} | "
            f"{r.get('error', '')} |")
    lines += ["", "Measured memory by category on the first step (GiB, `measured_memory_gib`) "
              "beside the plan's:", ""]
    for r in rows:
        mm, st = r.get("measured_memory_gib"), r.get("predicted_stage_gib")
        if not mm or not st:
            continue
        m, p = mm[0], st[0] or {}
        lines.append(f"- micro-batch {r['micro_batch']}: " + ", ".join(
            f"{k} {_f(p.get(k), '.3f')} / {_f(m.get(k), '.3f')}"
            for k in ("params", "grads", "optimizer", "activations")))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(run_cli(main, "gpu_check"))
