"""MLPerf Training v4.0 / v4.1 GPT-3 175B (NVIDIA NeMo implementation; NVIDIA and Oracle submissions): step time from the result logs'
block_start / block_stop timestamps (each block = a fixed count of training samples, eval excluded)."""
import subprocess, json, statistics
MIRROR = "/work/.mirror/mlcommons+training_results_v{}/repo"
# (version, submitter, system, implementation dir, config file, yaml with the model defaults or None, hardware, gpu)
SUBS = [
    ("4.0", "NVIDIA", "eos_n64_ngc24.04_nemo", "NVIDIA/benchmarks/gpt3/implementations/nemo", "config_DGXH100_64x8x128x4x8_mbs2.sh", "conf/custom.yaml", "H100-SXM5-80GB (NVIDIA Eos, DGX H100)", "h100"),
    ("4.0", "NVIDIA", "eos-dfw_n1344_ngc24.04_nemo", "NVIDIA/benchmarks/gpt3/implementations/nemo", "config_DGXH100_1344x8x6x4x6_mbs1_cg.sh", "conf/custom.yaml", "H100-SXM5-80GB (NVIDIA Eos, DGX H100)", "h100"),
    ("4.0", "NVIDIA", "eos-dfw_n1452_ngc24.04_nemo", "NVIDIA/benchmarks/gpt3/implementations/nemo", "config_DGXH100_1452x8x6x4x6_mbs1_cg.sh", "conf/custom.yaml", "H100-SXM5-80GB (NVIDIA Eos, DGX H100)", "h100"),
    ("4.1", "NVIDIA", "eos_n32_ngc24.09_nemo", "NVIDIA/benchmarks/gpt3/implementations/eos_n32_ngc24.09_nemo", "config_DGXH100_32x8x256x4x8_mbs2.sh", "conf/custom.yaml", "H100-SXM5-80GB (NVIDIA Eos, DGX H100)", "h100"),
    ("4.1", "NVIDIA", "eos_n64_ngc24.09_nemo", "NVIDIA/benchmarks/gpt3/implementations/eos_n64_ngc24.09_nemo", "config_DGXH100_64x8x128x4x8_mbs2.sh", "conf/custom.yaml", "H100-SXM5-80GB (NVIDIA Eos, DGX H100)", "h100"),
    # v4.1's eos-dfw_n1452_ngc24.04_nemo: its blocks time the same as v4.0's (the same runs): left out
    ("4.1", "NVIDIA", "b200_n8_preview_nemo", "NVIDIA/benchmarks/gpt3/implementations/b200_n8_preview_nemo", "config_DGXB200_8x8x1024x4x8_mbs2_cg.sh", "conf/custom.yaml", "B200 (DGX B200, preview)", "b200"),
    ("4.1", "Oracle", "1536xBM.GPU.H100.8", "Oracle/benchmarks/gpt3/DGXH100_128x8x64x4x8_mbs2", "config_DGXH100_192x8x64x4x8_mbs2.sh", None, "H100 80GB HBM3 (OCI BM.GPU.H100.8)", "h100"),
    ("4.1", "Oracle", "3072xBM.GPU.H100.8", "Oracle/benchmarks/gpt3/DGXH100_128x8x64x4x8_mbs2", "config_DGXH100_384x8x32x4x8_mbs2.sh", None, "H100 80GB HBM3 (OCI BM.GPU.H100.8)", "h100"),
]
REPO = COMMIT = None

def show(p):
    return subprocess.check_output(["git", "-C", REPO, "show", f"{COMMIT}:{p}"], text=True)

def yaml_default(text, key):
    import re
    m = re.search(rf"^\s+{key}: \$\{{oc.decode:\$\{{oc.env:[A-Z_]+,([^}}]+)\}}\}}", text, re.M)
    return m.group(1) if m else None

def cfg_value(text, key):
    import re
    m = re.search(rf'^export {key}=(\S+)', text, re.M)
    if not m:
        return None
    v = m.group(1).strip('"')
    d = re.fullmatch(r"\$\{[A-Z_]+:=([^}]+)\}", v)
    return d.group(1) if d else v

def rows():
    global REPO, COMMIT
    out = []
    for ver, submitter, sysname, IMPL, cfgname, yamlname, hw, gpu in SUBS:
        REPO = MIRROR.format(ver)
        COMMIT = subprocess.check_output(["git", "-C", REPO, "rev-parse", "HEAD"], text=True).strip()
        cfg = show(f"{IMPL}/{cfgname}")
        nodes = int(cfg_value(cfg, "DGXNNODES"))
        common = show(f"{IMPL}/config_common.sh")
        assert cfg_value(common, "USE_DIST_OPTIMIZER") == "True"
        fp8cfg = show(f"{IMPL}/config_fp8.sh")
        assert cfg_value(fp8cfg, "FP8") == "True" and cfg_value(fp8cfg, "FP8_AMAX_HISTORY") == "1024"
        for t in (cfg, common, fp8cfg):
            assert cfg_value(t, "ACT_CKPT_GRANULARITY") is None and cfg_value(t, "SEQ_PARALLEL") is None
        if yamlname:
            y = show(f"{IMPL}/{yamlname}")
            ckpt = yaml_default(y, "activations_checkpoint_granularity")
            sp = yaml_default(y, "sequence_parallel")
            assert ckpt == "null" and sp == "True", (sysname, ckpt, sp)
            assert "hidden_dropout: 0.0" in y and "num_layers: ${oc.decode:${oc.env:NUM_LAYERS,96}}" in y
        vp_default = None
        tp = int(cfg_value(cfg, "TENSOR_MODEL_PARALLEL")); pp = int(cfg_value(cfg, "PIPELINE_MODEL_PARALLEL"))
        vp = int(cfg_value(cfg, "INTERLEAVED_PIPELINE")); mbs = int(cfg_value(cfg, "MICRO_BATCH_SIZE"))
        assert cfg_value(cfg, "TP_COMM_OVERLAP") == "True"
        n = nodes * 8
        results = sorted(p for p in subprocess.check_output(["git", "-C", REPO, "ls-tree", "--name-only", COMMIT,
                         f"{submitter}/results/{sysname}/gpt3/"], text=True).split() if "result_" in p)
        per_step, blocks = [], []
        gbs = ga = seq = None
        for res in results:
            lines = [l for l in show(res).splitlines() if ":::MLLOG {" in l]
            ev = [(l, json.loads(l[l.index(":::MLLOG {") + len(":::MLLOG "):])) for l in lines]
            for l, e in ev:
                if e["key"] == "global_batch_size": gbs, gbs_line = e["value"], l
                if e["key"] == "gradient_accumulation_steps": ga, ga_line = e["value"], l
                if e["key"] == "max_sequence_length": seq, seq_line = e["value"], l
            start = None
            for l, e in ev:
                if e["key"] == "block_start":
                    start = (l, e)
                elif e["key"] == "block_stop" and start:
                    cnt = e["metadata"]["epoch_count"]
                    steps = cnt / (gbs * seq)
                    assert steps == int(steps), (res, cnt)
                    dt = (e["time_ms"] - start[1]["time_ms"]) / 1000
                    blocks.append((dt / steps, res, start[0], l, int(steps), cnt, start[1]["time_ms"], e["time_ms"]))
                    start = None
        dp = n // (tp * pp)
        assert dp * tp * pp == n and gbs == dp * mbs * ga, (sysname, gbs, dp, mbs, ga, tp, pp)
        med = statistics.median(b[0] for b in blocks)
        # the block whose per-step time is the median (odd count) or nearest to it
        b = min(blocks, key=lambda x: abs(x[0] - med))
        out.append({
            "id": f"mlperf-v{ver}-{submitter.lower()}-{sysname.lower()}-gpt3-175b-fp8-{n}gpu-tp{tp}pp{pp}vp{vp}-mbs{mbs}-gbs{gbs}",
            "source": f"mlcommons/training_results_v{ver} {submitter}/results/{sysname}/gpt3 (MLPerf Training v{ver} closed, GPT-3 175B)",
            "url": f"https://github.com/mlcommons/training_results_v{ver}/tree/{COMMIT}/{submitter}/results/{sysname}/gpt3",
            "repo": f"mlcommons/training_results_v{ver}", "path": f"{submitter}/results/{sysname}/gpt3/", "commit": COMMIT,
            "quote": "\n".join([gbs_line, ga_line, seq_line, b[2], b[3]]),
            "quote_context": f"{b[1]}: the run's batch lines and its median block (of {len(blocks)} blocks over {len(results)} runs); "
                             f"layout from {IMPL}/{cfgname}: TENSOR_MODEL_PARALLEL {tp}, PIPELINE_MODEL_PARALLEL {pp}, "
                             f"INTERLEAVED_PIPELINE {vp}, MICRO_BATCH_SIZE {mbs}, TP_COMM_OVERLAP=True, config_fp8.sh (FP8 hybrid, "
                             "amax history 1024, max), config_common.sh USE_DIST_OPTIMIZER=True, FP8_PARAMS=True",
            "engine": "megatron", "hardware": hw,
            "model": {"model_type": "gpt2", "_name": "GPT-3 175B (MLPerf)", "n_layer": 96, "n_embd": 12288, "n_head": 96,
                      "n_inner": 49152, "vocab_size": 50257, "n_positions": 2048, "activation_function": "gelu",
                      "resid_pdrop": 0.0, "attn_pdrop": 0.0, "embd_pdrop": 0.0},
            "model_source": f"{IMPL}/{yamlname or '(no yaml in this directory: the NVIDIA implementation it reuses)'} (num_layers 96, hidden_size 12288, ffn 4 x hidden, "
                            "num_attention_heads 96, encoder_seq_length 2048, hidden_dropout 0.0, attention_dropout 0.0); "
                            "vocabulary: the c4_en_301_5Mexp2_spm sentencepiece model, 50257 as the MLPerf PaxML reference's "
                            "PassThroughVocabulary(size=50257) for it (not printed in this submission)",
            "cluster": f"{gpu}x{n}", "gpus_per_node": 8,
            "fixed": dict({"tp": tp, "pp": pp, "dp": dp, "vpp": vp, "micro_batch": mbs, "global_batch": gbs, "seq_len": seq,
                      "zero": 1}, **({"recompute": "none", "sequence_parallel": True} if yamlname else {}), tp_comm_overlap=True),
            "precision": "fp8", "recipe": "delayed",
            "step_time_s": round(med, 4),
            "published": {"global_batch_size": str(gbs), "gradient_accumulation_steps": str(ga),
                          "max_sequence_length": str(seq), "epoch_count": str(b[5]),
                          "block_start time_ms": str(b[6]), "block_stop time_ms": str(b[7])},
            "derivation": f"per block: (block_stop.time_ms - block_start.time_ms) / 1000 / (epoch_count / (global_batch_size * "
                          f"max_sequence_length)) = ({b[7]} - {b[6]}) / 1000 / ({b[5]} / ({gbs} * {seq})) = {b[0]:.4f} s; "
                          f"step_time = the median over the {len(blocks)} blocks of the {len(results)} result logs = {med:.4f} s",
            "block_step_times_s": [round(x[0], 4) for x in blocks],
            "needs": ["fp8"],
            "block_spread": f"{min(x[0] for x in blocks):.4f}-{max(x[0] for x in blocks):.4f} s per step over the blocks",
            **({"spread_note": "the blocks' step times spread by more than 5% (min to max): the median is taken"}
               if max(x[0] for x in blocks) > 1.05 * min(x[0] for x in blocks) else {}),
            "uncertain": [
                "a block's interval may hold per-block work besides training steps (the log's eval_start/eval_stop fall outside it); "
                "the median over blocks is taken",
                "vocabulary 50257: not printed by the submission (see model_source)",
                ("recompute: ACT_CKPT_GRANULARITY unset in the config files read (the yaml's default null = none); sequence_parallel: "
                 "SEQ_PARALLEL default True" if yamlname else
                 "recompute and sequence parallelism: this submission's directory has no model yaml; left to the planner"),
                "the run's MINIBS came from the environment (the logged global batch differs from the config's default MINIBS); the layout "
                "(tp/pp/vp/mbs) is the config file's and agrees with the logged gradient_accumulation_steps",
                "ZeRO-1: USE_DIST_OPTIMIZER=True (NeMo distributed fused Adam shards the optimizer states over DP); FP8_PARAMS=True keeps "
                "FP8 weight copies (not priced separately)",
            ],
            "notes": "MLPerf GPT-3 175B resumes from a checkpoint (init_checkpoint_step in the log); NeMo 24.04 / Megatron-Core, "
                     "TP communication overlap with userbuffers, CUDA graphs on the 1344/1452-node configs (LAYER_CUDA_GRAPH=1).",
        })
    return out

def family(r):
    return f"MLPerf Training GPT-3 {r['cluster'].rsplit('x', 1)[0].upper()}"

if __name__ == "__main__":
    for r in rows(): print(r["id"], r["step_time_s"], r["fixed"], r["block_step_times_s"][:6])
