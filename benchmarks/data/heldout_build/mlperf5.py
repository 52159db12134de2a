"""MLPerf Training v5.0 Llama 3.1 405B pretraining (NVIDIA NeMo; NVIDIA and IBM+CoreWeave+NVIDIA submissions):
step time = the median of the logged per-step train_step_time over every result log of a submission."""
import subprocess, json, statistics, re
REPO = "/work/.mirror/mlcommons+training_results_v5.0/repo"
COMMIT = subprocess.check_output(["git", "-C", REPO, "rev-parse", "HEAD"], text=True).strip()
EXISTING = json.load(open(__import__("pathlib").Path(__file__).resolve().parents[1] / "published_runs_2.json"))["runs"]
L405 = dict(next(r["model"] for r in EXISTING if r["engine"] == "megatron" and r["model"].get("_name") == "Llama 3.1 405B"))

def show(p):
    return subprocess.check_output(["git", "-C", REPO, "show", f"{COMMIT}:{p}"], text=True)

def ls(p):
    return subprocess.check_output(["git", "-C", REPO, "ls-tree", "--name-only", COMMIT, p + "/"], text=True).split()

def cfg_value(text, key):
    m = re.search(rf'^export {key}=(\S+)', text, re.M)
    if not m:
        return None
    v = m.group(1).strip('"')
    d = re.fullmatch(r"\$\{[A-Z_]+:=([^}]+)\}", v)
    return d.group(1) if d else v

def yaml_default(text, key):
    m = re.search(rf"^\s+{key}: \$\{{oc.decode:\$\{{oc.env:([A-Z_]+),([^}}]+)\}}\}}", text, re.M)
    return (m.group(1), m.group(2)) if m else None

def rows():
    out = []
    for submitter in ("NVIDIA", "IBM+CoreWeave+NVIDIA"):
        for impl in ls(f"{submitter}/benchmarks/llama31_405b/implementations"):
            sysname = impl.rsplit("/", 1)[1]
            cfgs = [p for p in ls(impl) if re.search(r"/config_(DGX|GB)[^/]*\.sh$", p)]
            assert len(cfgs) == 1, cfgs
            cfg = show(cfgs[0]); common = show(f"{impl}/config_common.sh")
            y = show(f"{impl}/conf/custom.yaml")
            env = {}
            for t in (common, cfg):      # the system config sources config_common.sh first
                for k in ("TENSOR_MODEL_PARALLEL", "PIPELINE_MODEL_PARALLEL", "INTERLEAVED_PIPELINE", "CONTEXT_PARALLEL",
                          "MICRO_BATCH_SIZE", "DGXNNODES", "DGXNGPU", "TP_COMM_OVERLAP", "USE_DIST_OPTIMIZER", "FP8",
                          "FP8_RECIPE", "FP8_HYBRID", "ACT_CKPT_GRANULARITY", "SEQ_PARALLEL", "ASYM_PP_EMBED", "ASYM_PP_LOSS"):
                    v = cfg_value(t, k)
                    if v is not None:
                        env[k] = v
            assert env.get("FP8") == "True" and env.get("USE_DIST_OPTIMIZER") == "True" and env.get("TP_COMM_OVERLAP") == "True"
            assert "ACT_CKPT_GRANULARITY" not in env and "SEQ_PARALLEL" not in env and "FP8_RECIPE" not in env
            assert yaml_default(y, "activations_checkpoint_granularity") == ("ACT_CKPT_GRANULARITY", "null")
            assert yaml_default(y, "sequence_parallel") == ("SEQ_PARALLEL", "True")
            assert "fp8_recipe: ${oc.decode:${oc.env:FP8_RECIPE,delayed}}" in y
            assert "num_layers: ${oc.decode:${oc.env:OVERWRITTEN_NUM_LAYERS,126}}" in y and "encoder_seq_length: 8192" in y
            gpn = int(env.get("DGXNGPU", 8))
            tp, pp, vp, cp = (int(env[k]) for k in ("TENSOR_MODEL_PARALLEL", "PIPELINE_MODEL_PARALLEL", "INTERLEAVED_PIPELINE", "CONTEXT_PARALLEL"))
            mbs = int(env["MICRO_BATCH_SIZE"]); n = int(env["DGXNNODES"]) * gpn
            gpu = "gb200" if "GB200" in cfgs[0] else "h100"
            results = sorted(p for p in ls(f"{submitter}/results/{sysname}/llama31_405b") if "result_" in p)
            steps = []
            gbs = seq = ga = None
            for res in results:
                for l in show(res).splitlines():
                    if ":::MLLOG {" not in l:
                        continue
                    e = json.loads(l[l.index(":::MLLOG {") + len(":::MLLOG "):])
                    if e["key"] == "global_batch_size": gbs, gbs_line = e["value"], l
                    if e["key"] == "gradient_accumulation_steps": ga, ga_line = e["value"], l
                    if e["key"] == "max_sequence_length": seq, seq_line = e["value"], l
                    if e["key"] == "tracked_stats" and "train_step_time" in e["value"]:
                        steps.append((e["value"]["train_step_time"], res, l))
            dp = n // (tp * pp * cp)
            assert dp * tp * pp * cp == n and gbs == dp * mbs * ga, (sysname, n, gbs, dp, mbs, ga)
            med = statistics.median(s[0] for s in steps)
            near = min(steps, key=lambda s: abs(s[0] - med))
            out.append({
                "id": f"mlperf-v5.0-{submitter.lower().replace('+', '-')}-{sysname.lower()}-llama31-405b-fp8-{n}gpu-tp{tp}pp{pp}cp{cp}vp{vp}-gbs{gbs}",
                "source": f"mlcommons/training_results_v5.0 {submitter}/results/{sysname}/llama31_405b (MLPerf Training v5.0 closed, Llama 3.1 405B)",
                "url": f"https://github.com/mlcommons/training_results_v5.0/tree/{COMMIT}/{submitter}/results/{sysname}/llama31_405b",
                "repo": "mlcommons/training_results_v5.0", "path": f"{submitter}/results/{sysname}/llama31_405b/", "commit": COMMIT,
                "quote": "\n".join([gbs_line, ga_line, seq_line, near[2]]),
                "quote_context": f"{near[1]}: the batch lines and the step whose train_step_time is nearest the median of the "
                                 f"{len(steps)} logged steps over {len(results)} runs; layout from {cfgs[0]}: "
                                 + ", ".join(f"{k} {env[k]}" for k in sorted(env)),
                "engine": "megatron",
                "hardware": ("GB200 NVL72 (4 GPUs per compute tray)" if gpu == "gb200" else "H100-SXM5-80GB (NVIDIA Eos, DGX H100)")
                            + f", {submitter} system {sysname}",
                "model": dict(L405, vocab_size=32000, _name="Llama 3.1 405B (MLPerf, Mixtral 8x22B tokenizer)"),
                "model_source": f"Llama 3.1 405B shapes (the values published_runs_2.json's rows carry; {impl}/conf/custom.yaml "
                                "num_layers 126, encoder_seq_length 8192); vocabulary: the implementation README says 'we replace "
                                "the paper's TikTokenizer with the Mixtral 8x22b tokenizer': 32000, HF mistralai/Mixtral-8x22B-v0.1 "
                                "config.json as planner/catalog/models.py mixtral-8x22b has it",
                "cluster": f"{gpu}x{n}", "gpus_per_node": gpn,
                "fixed": {"tp": tp, "pp": pp, "dp": dp, "cp": cp, "vpp": vp, "micro_batch": mbs, "global_batch": gbs,
                          "seq_len": seq, "zero": 1, "recompute": "none", "sequence_parallel": True, "tp_comm_overlap": True},
                "precision": "fp8", "recipe": "delayed",
                "step_time_s": round(med, 4),
                "published": {"global_batch_size": str(gbs), "gradient_accumulation_steps": str(ga), "max_sequence_length": str(seq),
                              "train_step_time": str(near[0])},
                "derivation": f"step_time = median of the logged tracked_stats train_step_time over {len(steps)} steps of "
                              f"{len(results)} result logs = {med:.4f} s (the quoted step is the one nearest the median)",
                "step_spread": f"{min(s[0] for s in steps):.3f}-{max(s[0] for s in steps):.3f} s",
                "needs": ["cp", "fp8"],
                "uncertain": [
                    "vocabulary 32000: Mixtral-8x22B-v0.1's; the benchmark's tokenizer files include tokenizer.model.v1 (the "
                    "v0.3 tokenizer has 32768)",
                    "ASYM_PP_EMBED / ASYM_PP_LOSS = True: Megatron's account_for_embedding_in_pipeline_split / "
                    "account_for_loss_in_pipeline_split (the embedding and the loss each take a layer's slot in the split): "
                    "the per-stage layer counts are not written here",
                    "recompute none / sequence parallel: the yaml defaults (ACT_CKPT_GRANULARITY null, SEQ_PARALLEL True), "
                    "no config file sets them",
                    "FP8: FP8_RECIPE unset -> the yaml default 'delayed' (FP8_AMAX_HISTORY unset -> 1, most_recent; FP8_HYBRID "
                    "unset -> False, e4m3); FP8 parameters (FP8_PARAMS / FP8_PARAM_GATHER) not priced separately",
                    "ZeRO-1: USE_DIST_OPTIMIZER=True (Megatron distributed optimizer)",
                    "train_step_time includes the first steps' warm-up; the median over all steps is taken",
                ],
                "notes": "MLPerf Llama 3.1 405B pretraining resumes from a checkpoint; NeMo 25.01/25.04 (Megatron-Core). "
                         + ("CUDA graphs (the config file's _cg suffix). " if "_cg" in cfgs[0] else "")
                         + "The logged per-step times spread widely (step_spread: warm-up and evaluation-adjacent steps).",
            })
    return out

def family(r):
    return f"MLPerf Training Llama 3.1 405B {r['cluster'].rsplit('x', 1)[0].upper()}"

if __name__ == "__main__":
    for r in rows(): print(r["id"], r["step_time_s"], r["step_spread"], r["fixed"]["dp"], r["cluster"])
