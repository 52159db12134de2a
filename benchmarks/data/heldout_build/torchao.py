"""pytorch/ao docs/source/workflows/training.md: torchtitan Llama3-8B e2e training benchmarks
(8x H100 / 8x MI300X / 8x B200, FSDP2, per-op SAC, compile), with peak memory."""
import subprocess, json
REPO = "/work/.mirror/pytorch+ao/repo"
COMMIT = subprocess.check_output(["git", "-C", REPO, "rev-parse", "HEAD"], text=True).strip()
PATH = "docs/source/workflows/training.md"
TEXT = subprocess.check_output(["git", "-C", REPO, "show", f"{COMMIT}:{PATH}"], text=True)
URL = f"https://github.com/pytorch/ao/blob/{COMMIT}/{PATH}"
EXISTING = json.load(open(__import__("pathlib").Path(__file__).resolve().parents[1] / "published_runs_2.json"))["runs"]
L8 = next(r["model"] for r in EXISTING if r["engine"] == "torchtitan" and r["model"]["_name"] == "Llama 3.1 8B")
SECTIONS = {
    "#### NVIDIA H100": ("h100", "H100 (variant not printed)"),
    "#### AMD MI300x": ("mi300x", "AMD MI300X"),
    "### Training e2e benchmarks on NVIDIA B200": ("b200", "B200, power limited (as printed)"),
}
SCALING = {
    "none (bfloat16)": ("bf16", None),
    "tensorwise with float8 all-gather": ("fp8", "tensorwise"),
    "float8 tensorwise (f8 all-gather)": ("fp8", "tensorwise"),
    "rowwise with bfloat16 all-gather": ("fp8", "rowwise"),
    "float8 rowwise": ("fp8", "rowwise"),
    "mxfp8_cublas": ("mxfp8", "mxfp8"),
    "mxfp8_cublas_rceil": ("mxfp8", "mxfp8"),
    # "rowwise_with_gw_hp with bfloat16 all-gather": not a recipe the planner names -> skipped
}

def rows():
    out = []
    lines = TEXT.splitlines()
    for head, (gpu, hw) in SECTIONS.items():
        i = lines.index(head)
        setup = None
        hdr = None
        for ln in lines[i + 1:]:
            if ln.startswith("#"):
                break
            if ln.startswith("- Single-node") or ln.startswith("- pytorch version"):
                setup = (setup + " " if setup else "") + ln.strip()
                continue
            if not ln.startswith("|"):
                if hdr and ln.strip() == "":
                    pass
                continue
            cells = [c.strip() for c in ln.strip().strip("|").split("|")]
            if cells[0] == "Model":
                hdr = cells; hdr_line = ln.strip(); continue
            if set(cells[0]) <= set("- "):
                continue
            pub = dict(zip(hdr, cells))
            scaling = pub["Scaling"]
            if scaling not in SCALING:
                continue
            prec, recipe = SCALING[scaling]
            tps = float(pub["Median tokens/second"])
            mem = float(pub["Peak Memory (GB)"])
            tag = scaling.split(" (")[0].replace(" ", "-").replace("_", "-")
            uncertain = [
                "tokens/second per GPU: torchtitan logs tps per device (torchtitan components/metrics.py 'tokens per second per device') "
                "and parse_torchtitan_logs.py takes the median over steps 2-100",
                "Peak Memory (GB) is torchtitan's logged 'memory: X GiB' = max_reserved_gib (torch.cuda.max_memory_reserved) of the "
                "logging rank (rank 0), the max over the 100 steps (benchmarks/float8/training/parse_torchtitan_logs.py reads GiB)",
                "global batch = local batch 1 x 8 FSDP ranks (data_parallel_shard_degree -1 in llama3_8b.toml)",
            ]
            if gpu == "h100":
                uncertain.append("H100 variant (SXM 80 GB or Meta's 96 GB HBM2e, power limit) not printed: catalog h100 assumed")
            if gpu == "b200":
                uncertain.append("B200 'power limited' at 750 W (`power_limit_w`): priced at that limit by the Blackwell silicon's datasheet "
                                 "ratings (HGX B100 700 W, HGX B200 1000 W) interpolated (planner.power power_scale), an "
                                 "estimate: no published B200 throughput at 750 W")
                uncertain.append("peak memory: this table prints 33.4-33.9 GB for the configuration whose H100 table prints 47.7-47.8 GB "
                                 "(other pytorch / torchao / torchtitan versions); which memory-saving change explains it is not known")
            if scaling == "mxfp8_cublas_rceil":
                uncertain.append("rceil: MX scale rounding mode (round-up of the shared exponent); the planner prices any mxfp8 alike")
            notes = ("torchtitan llama3_8b.toml via torchao benchmarks/float8/training/llama3.sh (--compile.enable; tensorwise adds "
                     "--float8.enable_fsdp_float8_all_gather --float8.precompute_float8_dynamic_scale_for_fsdp). ")
            row = {
                "id": f"torchao-training-{gpu}-llama3-8b-{tag}-8gpu-bs1-seq8192",
                "source": f"pytorch/ao {PATH} {head.lstrip('# ')}",
                "url": URL, "repo": "pytorch/ao", "path": PATH, "commit": COMMIT,
                "quote": ln.strip(),
                "quote_context": f"{head}: {setup}; header: {hdr_line}",
                "engine": "torchtitan", "hardware": hw,
                "model": L8,
                "model_source": "torchtitan llama3 8B (HF meta-llama/Meta-Llama-3-8B shapes), the values published_runs_2.json's torchtitan rows carry",
                "cluster": f"{gpu}x8", "gpus_per_node": 8,
                "fixed": {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 1, "global_batch": 8, "seq_len": 8192,
                          "zero": 3, "recompute": "selective"},
                "precision": prec,
                "step_time_s": round(8 * 8192 / (tps * 8), 4),
                "published": pub,
                "derivation": f"step_time = local_batch 1 * seq_len 8192 / tokens_per_second_per_GPU = 8192 / {pub['Median tokens/second']}",
                "needs": [] if prec == "bf16" else [prec],
                "memory_gib": mem,
                "memory_kind": "max reserved (torch.cuda.max_memory_reserved) of rank 0, GiB, max over steps",
                "uncertain": uncertain,
                "notes": notes + "FSDP2 = ZeRO-3 (reshard_after_forward); per-op SAC = torchtitan selective AC, op policy.",
            }
            # torchtitan compiles its loss under --training.compile from bbb1b616e (2025-04-02, #1033:
            # torchtitan/components/loss.py build_cross_entropy_loss; before it "TODO: compiling loss function
            # causes CUDA errors, turning off"): the MI300X and B200 tables' torchtitan commits (2c8b5947,
            # 2025-08-08; 6fc499f6, 2025-08-14) have it; the H100 table's "0.0.2" is a torchtitan of
            # 2025-02-21..03-12 (torchao's script then names train_configs/llama3_8b.toml, a path from
            # torchtitan 82afc842e, 2025-02-21; the table's torchao commit 8c81863ba is of 2025-03-12): eager
            row["fixed"]["loss_compiled"] = gpu != "h100"
            # the model compiled too: Inductor's fused element-wise kernels (benchmarks.fidelity
            # engine_of)
            row["compiled"] = True
            row["compile_source"] = (
                "the table's setup line names `torch.compile`: torchao benchmarks/float8/training/"
                "llama3.sh runs torchtitan with --compile.enable")
            row["loss_source"] = (
                "torchtitan bbb1b616e (2025-04-02, #1033) compiles the loss when training.compile is set "
                "(torchtitan/components/loss.py build_cross_entropy_loss); the table's torchtitan "
                + ("is 0.0.2 of 2025-02-21..03-12 (before it: eager loss)" if gpu == "h100" else
                   f"commit {'2c8b5947' if gpu == 'mi300x' else '6fc499f6'} has it, and the run passes "
                   "--training.compile (torchao benchmarks/float8/training/llama3.sh @e4e681be6)"))
            if gpu == "h100":
                # torchtitan before 83e694105 (#1094, 2025-07-28) keeps the embedding, final norm and output in
                # FSDP2's root group (planner.engines.spec fsdp_outer_wrap); the MI300X and B200 tables' commits
                # (2c8b5947, 6fc499f6) have #1094's grouping, the engine's own
                row["fixed"]["fsdp_outer_wrap"] = "root"
                row["wrap_source"] = (
                    "torchtitan's apply_fsdp before 83e694105 (#1094, 2025-07-28) shards the embedding, final norm and "
                    "output in the root fully_shard(model), whose post-backward is the backward's final callback "
                    "(gathered from the backward's start to its end, the output's gradient held to it); the table's "
                    "torchtitan is 0.0.2 of 2025-02-21..03-12")
            if gpu == "b200":
                # cuDNN attention on B200, recomputed by the per-op policy (planner.engines.spec
                # op_recomputes_attention)
                row["fixed"]["op_recomputes_attention"] = True
                row["attention_source"] = (
                    "torchtitan #1196 (2025-05-14) runs SDPA's cuDNN backend first on compute capability 10 (B200: torchtitan/models/attention.py), and its per-op activation-checkpointing save list named only the flash and memory-efficient kernels until b39377f9f (#2095, 2025-12-01, 'to avoid recomputing attention during backward'): the table's torchtitan 6fc499f6 (2025-08-14) recomputed the attention on B200")
                row["power_limit_w"] = 750
                row["power_limit_source"] = (
                    "pytorch/ao d8bb51f63143188272e116c820d5f303c7017781 (#2777, 2025-08-15), the rows' first version in "
                    "torchao/prototype/mx_formats/README.md: 'Single-node training on 8xB200 GPUs limited to 750W'; reworded "
                    "'8x power limited B200 GPUs' in 9e3758d15 (#2778) and moved to this page; NVIDIA's B200 is a 1000 W part "
                    "(HGX B200 datasheet)")
            if recipe:
                row["recipe"] = recipe
            out.append(row)
    return out

def family(r):
    return "torchao/torchtitan " + r["cluster"].rsplit("x", 1)[0].upper()

if __name__ == "__main__":
    for r in rows(): print(r["id"], r["step_time_s"], r["memory_gib"], r["precision"], r.get("recipe"), r["quote_context"][:120])
