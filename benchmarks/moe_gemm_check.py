"""The routed experts' GEMMs of the published MoE rows, timed on this GPU against the planner's
price (issue 22: what the MoE rows' miss is made of, on the GPU the session is lent).

    python -m benchmarks.moe_gemm_check [--out DIR]     # one CUDA GPU (H100 / H200), torch 2.13
    python -m benchmarks.moe_gemm_check --cpu-dry-run   # the same path on CPU, shapes / 64

For every layout of a Megatron MoE row (benchmarks/data published_runs_moe.json and the held-out
file: model, tp, ep, etp, micro-batch, sequence), the forward of one MoE layer's routed experts
as planner.cost.moe.moe_layer prices it (`experts_fwd`, bf16, balanced routing): per local
expert one (tokens x hidden) @ (hidden x gated ffn) and one (tokens x ffn) @ (ffn x hidden),
tokens = T k ep etp / E. Measured two ways, in bf16 with CUDA events (median of the repeats):
a loop of one GEMM per expert (Transformer Engine's GroupedLinear issues one cuBLAS GEMM per
expert) and torch._grouped_mm where torch has it (one CUTLASS grouped GEMM). Nothing here is
fitted; the table says how far the GEMM model (tensor-core peak x efficiency x shape roll-off,
planner.cost.compute.gemm_time) is from this GPU at the experts' shapes, the piece of the MoE
rows' time a static model can be checked on without Megatron or Transformer Engine.
Writes moe_gemm_check.md / .json under --out (default: $OUT when set, else outside the
checkout).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from benchmarks._common import SCRATCH, markdown_table, run_cli, today

ROOT = Path(__file__).resolve().parent.parent
DATA = [ROOT / "benchmarks/data/published_runs_moe.json",
        ROOT / "benchmarks/data/published_runs_heldout.json"]
REPEATS = 20             # timed repeats per shape (profiler.timing.time_fn: the median)
WARMUP = 3
CPU_SCALE = 64           # --cpu-dry-run: every width and token count divided by this


def layouts() -> list:
    """Distinct (model, tp, ep, etp, mbs, seq) of the Megatron MoE rows, with their row ids."""
    from benchmarks import fidelity as F
    seen: dict = {}
    for path in DATA:
        for run in F.load_runs(path):
            if not F._is_moe(run) or run.get("engine", "megatron") != "megatron":
                continue
            f = run["fixed"]
            key = (run.get("catalog_model") or run["model"].get("_name"), f.get("tp", 1),
                   f.get("ep", 1), f.get("etp", 1) or 1, f["micro_batch"], f["seq_len"],
                   f.get("cp", 1) or 1)
            seen.setdefault(key, (run, []))[1].append(run["id"])
    return [(key, run, ids) for key, (run, ids) in seen.items()]


def shapes_and_price(run, key, gpu) -> dict:
    """The layer's expert GEMM shapes and the planner's price of them on `gpu` (catalog)."""
    from benchmarks import fidelity as F
    from planner.cost.facts import engine_gpu
    from planner.cost.moe import moe_layer
    from planner.engines import get_engine
    _, tp, ep, etp, mbs, seq, cp = key
    model = F.model_of(run)
    engine = get_engine("megatron")
    ml = moe_layer(model, F.cluster_of(run), engine_gpu(engine, gpu), mbs, seq // cp, tp, ep,
                   etp)
    gated = 2 if model.gated_mlp else 1
    return {"local_experts": model.num_experts // ep, "tokens": ml.tokens_per_expert,
            "hidden": model.hidden, "ffn": model.moe_ffn_hidden // etp, "gated": gated,
            "predicted_s": ml.experts_fwd}


def measure(sh: dict, device: str, dtype, repeats: int) -> dict:
    """Seconds of the experts' forward GEMMs: a loop of one GEMM per expert, and one grouped
    GEMM (torch._grouped_mm) where torch offers it on this device."""
    import torch
    E, M, H, Fh = sh["local_experts"], max(1, round(sh["tokens"])), sh["hidden"], sh["ffn"]
    up_n = sh["gated"] * Fh
    x = torch.randn(E, M, H, device=device, dtype=dtype)
    w1 = torch.randn(E, H, up_n, device=device, dtype=dtype) / H ** 0.5
    w2 = torch.randn(E, Fh, H, device=device, dtype=dtype) / Fh ** 0.5
    a = torch.randn(E, M, Fh, device=device, dtype=dtype)

    def loop():
        for e in range(E):
            torch.mm(x[e], w1[e])
            torch.mm(a[e], w2[e])

    xs, as_ = x.reshape(E * M, H), a.reshape(E * M, Fh)
    offs = torch.arange(M, E * M + 1, M, device=device, dtype=torch.int32)

    def grouped():
        torch._grouped_mm(xs, w1, offs=offs)
        torch._grouped_mm(as_, w2, offs=offs)

    from profiler.timing import time_fn
    out = {}
    for name, fn in (("loop_s", loop), ("grouped_s", grouped)):
        try:
            out[name] = time_fn(fn, torch.device(device), WARMUP, repeats)["median"]
        # no such kernel in this torch or on this device (or the shape is not aligned for it)
        except (RuntimeError, AttributeError, NotImplementedError, TypeError, ValueError) as e:
            out[name] = None
            out[name.replace("_s", "_why")] = str(e).splitlines()[0][:120]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.moe_gemm_check",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or str(SCRATCH / "moe_gemm_check"))
    ap.add_argument("--cpu-dry-run", action="store_true",
                    help=f"run on CPU in fp32 with every shape divided by {CPU_SCALE}")
    ap.add_argument("--repeats", type=int, default=REPEATS)
    args = ap.parse_args(argv)
    import torch
    from planner.catalog import get_gpu
    if args.cpu_dry_run:
        device, dtype, gpu_name, hw = "cpu", torch.float32, "h100", "CPU dry run (priced as h100)"
    elif not torch.cuda.is_available():
        print("moe_gemm_check: no CUDA GPU here (use --cpu-dry-run to try the path on CPU)",
              file=sys.stderr)
        return 2
    else:
        from planner.profile import catalog_gpu_name
        hw = torch.cuda.get_device_name(0)
        gpu_name = catalog_gpu_name(hw, "cuda")
        if gpu_name is None:
            print(f"moe_gemm_check: {hw} is no GPU of the catalog", file=sys.stderr)
            return 2
        device, dtype = "cuda", torch.bfloat16
    gpu = get_gpu(gpu_name)
    t0 = time.time()
    rows = []
    for key, run, ids in layouts():
        sh = shapes_and_price(run, key, gpu)
        if args.cpu_dry_run:
            sh = {**sh, "tokens": max(1.0, sh["tokens"] / CPU_SCALE),
                  "hidden": max(8, sh["hidden"] // CPU_SCALE),
                  "ffn": max(8, sh["ffn"] // CPU_SCALE)}
        got = measure(sh, device, dtype, args.repeats)
        best = min((v for k, v in got.items() if k.endswith("_s") and v), default=None)
        rows.append({"model": key[0], "tp": key[1], "ep": key[2], "etp": key[3], "mbs": key[4],
                     "seq": key[5], "cp": key[6], **sh, **got,
                     "error_pct": ((sh["predicted_s"] / best - 1) * 100
                                   if best and not args.cpu_dry_run else None),
                     "rows": len(ids), "row_ids": ids})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    head = (f"# MoE expert GEMMs: the planner's price against {hw} ({today()})\n\n"
            f"Generated by `python -m benchmarks.moe_gemm_check"
            f"{' --cpu-dry-run' if args.cpu_dry_run else ''}` in {time.time() - t0:.0f} s, "
            f"torch {torch.__version__}. Forward of one MoE layer's routed experts, bf16, "
            f"balanced routing; error: predicted over the faster of the two measurements.\n\n")
    cols = ["model", "tp", "ep", "mbs", "seq", "local_experts", "tokens", "hidden", "ffn",
            "predicted_s", "loop_s", "grouped_s", "error_pct", "rows"]
    md = head + markdown_table(rows, cols, floatfmt=".4g") + "\n"
    (out / "moe_gemm_check.md").write_text(md)
    (out / "moe_gemm_check.json").write_text(json.dumps(
        {"hardware": hw, "catalog_gpu": gpu_name, "dry_run": args.cpu_dry_run, "rows": rows},
        indent=1))
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main, "python -m benchmarks.moe_gemm_check"))
