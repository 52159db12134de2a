"""BigScience BLOOM-176B training (Megatron-DeepSpeed), bigscience-workshop/bigscience
train/tr11-176B-ml/README.md: the logged iteration at the end of the first epoch."""
import subprocess
REPO = "/work/.mirror/bigscience-workshop+bigscience/repo"
COMMIT = subprocess.check_output(["git", "-C", REPO, "rev-parse", "HEAD"], text=True).strip()
PATH = "train/tr11-176B-ml/README.md"
SLURM = "train/tr11-176B-ml/tr11-176B-ml.slurm"
TEXT = subprocess.check_output(["git", "-C", REPO, "show", f"{COMMIT}:{PATH}"], text=True)
URL = f"https://github.com/bigscience-workshop/bigscience/blob/{COMMIT}/{PATH}"

def rows():
    lines = TEXT.splitlines()
    i = next(k for k, l in enumerate(lines) if l.startswith("[default7]: iteration   85376/"))
    quote = "\n".join(lines[i:i + 3])
    assert "104.70" in quote and "global batch size: 2048" in quote and "TFLOPs: 149.77" in quote
    for needle in ("TP=4", "PP=12", "DP=8", "MBS=2", "GPUs = 384 (48 nodes of 8)", "NHIDDEN=14336", "NLAYERS=70",
                   "NHEADS=112", "SEQ_LEN=2048", "pp rank 0:  [embed | 5 transformer blocks]",
                   "pp rank 1:  [6 transformer blocks]", "pp rank 10: [6 transformer blocks]",
                   "pp rank 11: [5 transformer blocks | embed]"):
        assert needle in TEXT, needle
    slurm = subprocess.check_output(["git", "-C", REPO, "show", f"{COMMIT}:{SLURM}"], text=True)
    for needle in ("--checkpoint-activations", "--pad-vocab-size-to 250880", "ZERO_STAGE=0 # important: bf16 must use z0! it implements its own zero stage 1 equivalent",
                   "--position-embedding-type alibi", "--bf16", "MICRO_BATCH_SIZE=2", "GLOBAL_BATCH_SIZE=2048"):
        assert needle in slurm, needle
    return [{
        "id": "bloom-176b-tr11-a100x384-tp4pp12dp8-mbs2-gbs2048-iter85376",
        "source": f"bigscience-workshop/bigscience {PATH} ### Important checkpoints (BLOOM-176B, end of the first epoch)",
        "url": URL, "repo": "bigscience-workshop/bigscience", "path": PATH, "commit": COMMIT,
        "quote": quote,
        "quote_context": "README ## Model Setup: '### Replica setup  GPUs = 384 (48 nodes of 8)  TP=4 PP=12 DP=8 MBS=2'; "
                         "'--pp-partition-method 'type:transformer|embedding'' with 'pp rank 0: [embed | 5 transformer blocks] "
                         "pp rank 1: [6 transformer blocks] ... pp rank 10: [6 transformer blocks] pp rank 11: [5 transformer blocks | embed]'; "
                         "hardware: '416 A100 80GB GPUs (52 nodes) - using 384 gpus (48 nodes)', '8 GPUs per node Using NVLink 4 inter-gpu connects, 4 OmniPath links'",
        "engine": "deepspeed", "hardware": "A100 80GB SXM (Jean Zay), 8 per node, 4 Omni-Path links per node",
        "model": {"model_type": "bloom", "_name": "BLOOM-176B", "n_layer": 70, "hidden_size": 14336, "n_head": 112,
                  "vocab_size": 250880, "seq_length": 2048},
        "model_source": f"the README's Architecture block (NHIDDEN=14336, NLAYERS=70, NHEADS=112), SEQ_LEN=2048, and {SLURM} "
                        "(--pad-vocab-size-to 250880, --position-embedding-type alibi, --embed-layernorm, tied embeddings as "
                        "the README's 'tied embedding layers' says); = HF bigscience/bloom config.json",
        "cluster": "a100x384", "gpus_per_node": 8,
        "fixed": {"tp": 4, "pp": 12, "dp": 8, "micro_batch": 2, "global_batch": 2048, "seq_len": 2048,
                  "zero": 1, "recompute": "full", "stage_layers": [5, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 5]},
        "layout_source": "README: --pp-partition-method 'type:transformer|embedding' puts the (tied) embedding on pp ranks 0 and 11 "
                         "with 5 transformer blocks each and 6 on ranks 1-10",
        "precision": "bf16",
        "step_time_s": 104.70,
        "published": {"elapsed time per iteration (s)": "104.70", "global batch size": "2048",
                      "samples per second": "19.561", "TFLOPs": "149.77"},
        "derivation": "step_time = the logged 'elapsed time per iteration (s)' (= global batch 2048 / 19.561 samples per second)",
        "needs": [],
        "uncertain": [
            "ZeRO: the DeepSpeed config sets stage 0, and the slurm script's comment says bf16 'implements its own zero stage 1 "
            "equivalent' (DeepSpeed's BF16_Optimizer shards the optimizer states over DP): recorded as ZeRO-1",
            "the one logged iteration of the first epoch's end, not an average; TFLOPs 149.77 is the README's 'hardware TFLOPs' (recompute counted)",
            "the slurm script at HEAD is the training's final one; the run's settings at iteration 85376 are assumed to be these "
            "(the README: switched to MBS=2 at around GBS=784; the logged global batch size is 2048)",
            "inter-node network Omni-Path (4 links per node): the catalog a100 cluster's inter-node bandwidth may differ",
            "sequence parallelism: not in Megatron-DeepSpeed of 2022 (none)",
        ],
        "notes": "Megatron-DeepSpeed (bigscience fork) with DeepSpeed pipeline engine, PyTorch 1.11, CUDA 11.5. "
                 "--checkpoint-activations + --deepspeed-activation-checkpointing = full recompute.",
    }]

def family(r):
    return "BLOOM-176B (Megatron-DeepSpeed) A100"

if __name__ == "__main__":
    print(rows()[0]["quote"])
