"""llm-foundry A100 80GB / 40GB tables -> rows."""
import subprocess, re
REPO = "/work/.mirror/mosaicml+llm-foundry/repo"
COMMIT = subprocess.check_output(["git", "-C", REPO, "rev-parse", "HEAD"], text=True).strip()
PATH = "scripts/train/benchmarking/README.md"
TEXT = subprocess.check_output(["git", "-C", REPO, "show", f"{COMMIT}:{PATH}"], text=True)
URL = f"https://github.com/mosaicml/llm-foundry/blob/{COMMIT}/{PATH}"
# model configs: scripts/train/yamls/pretrain/mpt-<size>.yaml (d_model, n_heads, n_layers,
# expansion_ratio 4, vocab 50368), read at COMMIT
SIZES = {}
for size in ["125m", "350m", "760m", "1b", "3b", "7b", "13b", "30b", "70b"]:
    y = subprocess.check_output(["git", "-C", REPO, "show", f"{COMMIT}:scripts/train/yamls/pretrain/mpt-{size}.yaml"], text=True)
    m = y[re.search(r"^model:", y, re.M).end():].split("\n# Tokenizer")[0]
    g = lambda k: int(re.search(rf"\n\s+{k}: (\d+)", m).group(1))
    SIZES[size] = dict(d_model=g("d_model"), n_heads=g("n_heads"), n_layers=g("n_layers"),
                       expansion_ratio=g("expansion_ratio"), vocab_size=g("vocab_size"))
SECTIONS = {
    "## A100 80GB with 1600 Gbps node-node interconnect (RoCE)": ("a100", "a10080gb", 80),
    "## A100 40GB with 1600 Gbps node-node interconnect (RoCE)": ("a100-40g", "a10040gb", 40),
}

def rows():
    out = []
    lines = TEXT.splitlines()
    for head, (gpu, tag, mem) in SECTIONS.items():
        i = lines.index(head)
        hdr = None
        for ln in lines[i + 1:]:
            if ln.startswith("## "):
                break
            if not ln.strip().startswith("|"):
                continue
            cells = [c.strip() for c in ln.strip().strip("|").split("|")]
            if cells[0] == "Model":
                hdr = cells
                continue
            if cells[0] == "---":
                continue
            pub = dict(zip(hdr, cells))
            size = pub["Model"]
            cfg = SIZES[size]
            seq = int(pub["SeqLen (T)"]); n = int(pub["# GPUs"])
            mbs = int(pub["MicroBatchSize"]); ga = int(pub["GradAccum"]); gbs = int(pub["GlobalBatchSize"])
            gbs_t = int(pub["GlobalBatchSize (T)"]); tps = int(pub["Throughput (T/s)"])
            assert gbs * seq == gbs_t, (size, seq, n)
            ac = pub["Activation Checkpointing"] == "True"
            shard = pub["Sharding Strategy"]
            zero = {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2}[shard]
            prec = pub["Precision"]
            assert prec in ("amp_bf16", "bf16"), prec
            uncertain = []
            notes = ["Activation CPUOffload False", "Throughput (S/s) column is printed rounded to an integer"]
            if mbs * ga * n != gbs:
                notes.append(f"MicroBatchSize x GradAccum x GPUs = {mbs*ga*n} != GlobalBatchSize {gbs}: "
                             "the README says its microbatching engine accumulates microbatches that need not divide the global batch")
                uncertain.append("micro-batch count per step: printed GradAccum and GlobalBatchSize disagree with MicroBatchSize x GPUs")
            if prec == "bf16":
                uncertain.append("Precision printed 'bf16', not 'amp_bf16': whether Composer held the weights in bf16 (pure "
                                 "bf16) or ran AMP with FSDP PURE mixed precision is not printed; precision bf16 recorded")
            if pub["MP Mode"] == "PURE":
                notes.append("MP Mode PURE: Composer FSDP mixed_precision PURE (parameters, gradient reduction and buffers in the "
                             "run's precision, bf16), against DEFAULT (amp: reduction in fp32) elsewhere")
            out.append({
                "id": f"llmfoundry-{tag}-{size}-seq{seq}-{n}gpu-{'ac' if ac else 'noac'}-{prec}-{shard.lower()}-gbs{gbs}",
                "source": f"mosaicml/llm-foundry {PATH} {head}",
                "url": URL,
                "repo": "mosaicml/llm-foundry", "path": PATH, "commit": COMMIT,
                "quote": ln.strip(),
                "quote_context": head + "; header: | " + " | ".join(hdr) + " |",
                "engine": "fsdp",
                "hardware": f"A100 {mem}GB SXM (MosaicML platform), 1600 Gbps node-node interconnect (RoCE)",
                "model": {
                    "model_type": "gpt2", "_name": f"MPT-{size} (llm-foundry)",
                    "n_layer": cfg["n_layers"], "n_embd": cfg["d_model"], "n_head": cfg["n_heads"],
                    "n_inner": cfg["expansion_ratio"] * cfg["d_model"], "vocab_size": cfg["vocab_size"],
                    "n_positions": seq, "activation_function": "gelu",
                    "resid_pdrop": 0.0, "attn_pdrop": 0.0, "embd_pdrop": 0.0},
                "model_source": f"mosaicml/llm-foundry scripts/train/yamls/pretrain/mpt-{size}.yaml at {COMMIT} "
                                f"(d_model {cfg['d_model']}, n_heads {cfg['n_heads']}, n_layers {cfg['n_layers']}, "
                                f"expansion_ratio {cfg['expansion_ratio']}, vocab_size {cfg['vocab_size']}); max_seq_len set to "
                                "the row's SeqLen by submit_benchmarks.py; written as a gpt2 config as published_runs_2.json's MPT rows are",
                "cluster": f"{gpu}x{n}",
                "gpus_per_node": 8,
                "fixed": {"tp": 1, "pp": 1, "dp": n, "micro_batch": mbs, "global_batch": gbs,
                          "seq_len": seq, "zero": zero, "recompute": "full" if ac else "none"},
                "precision": "bf16",
                "step_time_s": round(gbs_t / tps, 4),
                "published": pub,
                "derivation": "step_time = GlobalBatchSize(T) / Throughput(T/s)  (both printed; equals GBS*seq/(T/s/GPU * GPUs))",
                "needs": [],
                "uncertain": uncertain + ["interconnect: 1600 Gbps per node RoCE as the heading prints; the catalog cluster's inter-node figure may differ",
                                          "gpus_per_node 8 not printed (MosaicML A100 nodes are 8-GPU)"],
                "notes": "; ".join(notes) + ". Sharding Strategy FULL_SHARD = ZeRO-3, SHARD_GRAD_OP = ZeRO-2 (PyTorch FSDP); "
                         "Activation Checkpointing True = every block checkpointed (full).",
            })
    return out

if __name__ == "__main__":
    import json, collections
    r = rows()
    print(len(r), collections.Counter(x["source"] for x in r))
    print(len(set(x["id"] for x in r)))
