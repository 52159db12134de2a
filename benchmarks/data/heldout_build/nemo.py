"""NVIDIA/NeMo docs/source/performance/performance_summary.md (NeMo 24.07, DGX-H100, FP8)."""
import re, subprocess, json
REPO = "/work/.mirror/NVIDIA+NeMo/repo"
COMMIT = "8e3d65dcfe3504689bfc5b6e67d502780aacad41"   # "24.07 perf numbers (#10253)", the file's last version
PATH = "docs/source/performance/performance_summary.md"
TEXT = subprocess.check_output(["git", "-C", REPO, "show", f"{COMMIT}:{PATH}"], text=True)
URL = f"https://github.com/NVIDIA/NeMo/blob/{COMMIT}/{PATH}"
LREPO = "/work/.mirror/NVIDIA+NeMo-Framework-Launcher/repo"
LCOMMIT = "24c3d6bb9ed2e1ca542622815066da622bf34019"   # launcher main on 2024-09-06, the day before the table's commit
LCFG = {"GPT3-5B": "gpt3/5b", "GPT3-20B": "gpt3/20b", "GPT3-175B": "gpt3/175b", "LLAMA2-7B": "llama/llama2_7b",
        "LLAMA2-13B": "llama/llama2_13b", "LLAMA2-70B": "llama/llama2_70b", "Nemotron-8B": "nemotron/nemotron_8b",
        "Nemotron-22B": "nemotron/nemotron_22b", "Nemotron-340B": "nemotron/nemotron_340b",
        "LLAMA3-8B": "llama/llama3_8b", "LLAMA3-70B": "llama/llama3_70b"}
EXISTING = json.load(open(__import__("pathlib").Path(__file__).resolve().parents[1] / "published_runs_2.json"))["runs"]
L3 = {r["model"]["_name"]: r["model"] for r in EXISTING if r["engine"] == "megatron" and r["model"].get("_name", "").startswith("Llama 3.1")}

LHEAD = subprocess.check_output(["git", "-C", LREPO, "rev-parse", "HEAD"], text=True).strip()

def launcher(name, commit=LCOMMIT):
    import re
    y = subprocess.check_output(["git", "-C", LREPO, "show", f"{commit}:launcher_scripts/conf/training/{LCFG[name]}.yaml"], text=True)
    def g(k):
        m = re.search(rf"^\s+{k}: *([^#\n]*)", y, re.M)
        return m.group(1).strip() if m else None
    return g

# The H100 FP8 example launch of each model at LCOMMIT (examples/training/<dir>/h100/*_fp8*.sh): the
# overrides they add to the training config (e.g. +training.model.optim.grad_sync_dtype=bf16).
EXAMPLE = {"GPT3-5B": "gpt/h100/5b_fp8_8node.sh", "GPT3-20B": "gpt/h100/20b_fp8_8node.sh",
           "GPT3-175B": "gpt/h100/175b_fp8_16node.sh", "LLAMA2-7B": "llama/h100/llama2_7b_fp8.sh",
           "LLAMA2-13B": "llama/h100/llama2_13b_fp8.sh", "LLAMA2-70B": "llama/h100/llama2_70b_fp8.sh",
           "Nemotron-8B": "nemotron/h100/nemotron_8b_fp8.sh", "Nemotron-22B": "nemotron/h100/nemotron_22b_fp8.sh",
           "LLAMA3-8B": "llama/h100/llama3_8b_fp8.sh", "LLAMA3-70B": "llama/h100/llama3_70b_fp8.sh"}

def example_override(name, key):
    """The value the model's H100 FP8 example script sets for training.model.<key>, else None."""
    if name not in EXAMPLE:
        return None
    sh = subprocess.check_output(["git", "-C", LREPO, "show", f"{LCOMMIT}:examples/training/{EXAMPLE[name]}"], text=True)
    m = re.search(rf"\+?training\.model\.{re.escape(key)}=(\S+)", sh)
    return m.group(1) if m else None

# Apex DistributedFusedAdam's state per parameter as NeMo 1.x builds it (NVIDIA/NeMo
# nemo/collections/nlp/models/language_modeling/megatron_base_model.py setup_optimization @a7fbf6babe,
# 2024-07): optimizer dtype optim.dtype (default fp32); bf16 model (megatron_amp_O2) with fp32 state:
# store_params False, store_param_remainders True (Adam's m and v in fp32, 4 + 4 B, and the 16 low
# bits of the fp32 master, 2 B); state dtype equal to the model's (bf16): store_params False (m and v
# in bf16, 2 + 2 B, no master: the bf16 parameters are stepped in place).
DFA_STATE_BYTES = {"fp32": 10.0, "bf16": 4.0}

def optim_config(name, commit=LCOMMIT):
    """The scalar keys of the launcher config's model.optim block."""
    y = subprocess.check_output(["git", "-C", LREPO, "show", f"{commit}:launcher_scripts/conf/training/{LCFG[name]}.yaml"], text=True)
    block = re.search(r"^  optim:\n((?:    .*\n|\s*\n)+)", y, re.M).group(1)
    return {k: v.strip() for k, v in re.findall(r"^    (\w+): *([^#\n]+)", block, re.M)}

def gpt(name, layers, hidden, heads):
    return {"model_type": "gpt2", "_name": f"NeMo {name}", "n_layer": layers, "n_embd": hidden, "n_head": heads,
            "n_inner": 4 * hidden, "vocab_size": 50257, "n_positions": 2048, "activation_function": "gelu",
            "resid_pdrop": 0.1, "attn_pdrop": 0.1, "embd_pdrop": 0.1}

def llama2(name, layers, hidden, ffn, heads, kv):
    return {"model_type": "llama", "_name": name, "num_hidden_layers": layers, "hidden_size": hidden,
            "num_attention_heads": heads, "num_key_value_heads": kv, "intermediate_size": ffn, "vocab_size": 32000,
            "hidden_act": "silu", "max_position_embeddings": 4096, "tie_word_embeddings": False}

def nemotron(name, layers, hidden, ffn, heads, kv):
    return {"model_type": "nemotron", "_name": name, "num_hidden_layers": layers, "hidden_size": hidden,
            "intermediate_size": ffn, "num_attention_heads": heads, "num_key_value_heads": kv, "vocab_size": 256000,
            "hidden_act": "relu2", "max_position_embeddings": 4096, "partial_rotary_factor": 0.5,
            "tie_word_embeddings": False}

MODELS = {
    "GPT3-5B": (gpt("GPT3-5B", 24, 4096, 32), "NeMo-Framework-Launcher conf/training/gpt3/5b.yaml (num_layers 24, hidden_size 4096, num_attention_heads 32, ffn 4 x hidden, hidden/attention dropout 0.1, GPT2BPETokenizer: GPT-2 BPE vocabulary of 50257, padded by Megatron to a multiple of 128 x tp)"),
    "GPT3-20B": (gpt("GPT3-20B", 44, 6144, 48), "NeMo-Framework-Launcher conf/training/gpt3/20b.yaml (num_layers 44, hidden_size 6144, num_attention_heads 48, ffn 4 x hidden, dropout 0.1, GPT2BPETokenizer 50257)"),
    "GPT3-175B": (gpt("GPT3-175B", 96, 12288, 96), "NeMo-Framework-Launcher conf/training/gpt3/175b.yaml (num_layers 96, hidden_size 12288, num_attention_heads 96, ffn 4 x hidden, dropout 0.1, GPT2BPETokenizer 50257)"),
    "LLAMA2-7B": (llama2("Llama 2 7B", 32, 4096, 11008, 32, 32), "HF meta-llama/Llama-2-7b-hf config.json, as planner/catalog/models.py llama2-7b; launcher llama2_7b.yaml agrees (32 layers, 4096, ffn 11008, 32 heads)"),
    "LLAMA2-13B": (llama2("Llama 2 13B", 40, 5120, 13824, 40, 40), "HF meta-llama/Llama-2-13b-hf config.json, as planner/catalog/models.py llama2-13b; launcher llama2_13b.yaml agrees"),
    "LLAMA2-70B": (llama2("Llama 2 70B", 80, 8192, 28672, 64, 8), "HF meta-llama/Llama-2-70b-hf config.json, as planner/catalog/models.py llama2-70b; launcher llama2_70b.yaml agrees (num_query_groups 8)"),
    "Nemotron-8B": (nemotron("Nemotron-3 8B", 32, 4096, 16384, 32, 32), "NeMo nemo/collections/llm/gpt/model/nemotron.py Nemotron3Config8B (32 layers, hidden 4096, ffn 16384, 32 heads, num_query_groups None = MHA, squared ReLU, rotary_percent 0.5, no bias, untied) = launcher nemotron_8b.yaml; vocabulary 256000: the launcher's nemotron 256k sentencepiece tokenizer, transformers NemotronConfig's default vocab_size"),
    "Nemotron-22B": (nemotron("Nemotron-4 22B", 40, 6144, 24576, 48, 48), "NeMo nemotron.py Nemotron4Config22B (40 layers, hidden 6144, ffn 24576, 48 heads, num_query_groups None = MHA) = launcher nemotron_22b.yaml; vocabulary 256000 as for Nemotron-8B"),
    "Nemotron-340B": (nemotron("Nemotron-4 340B", 96, 18432, 73728, 96, 8), "NeMo nemotron.py Nemotron4Config340B (96 layers, hidden 18432, ffn 73728, 96 heads, 8 query groups) = launcher nemotron_340b.yaml; vocabulary 256000 (launcher tokenizer nemotron_2_256k.model; transformers NemotronConfig default)"),
    "LLAMA3-8B": (L3["Llama 3.1 8B"], "HF meta-llama/Meta-Llama-3-8B config.json (the values published_runs_2.json's rows carry); launcher llama3_8b.yaml agrees"),
    "LLAMA3-70B": (L3["Llama 3.1 70B"], "HF meta-llama/Meta-Llama-3-70B config.json (the values published_runs_2.json's rows carry); launcher llama3_70b.yaml agrees"),
}

def rows():
    out = []
    lines = TEXT.splitlines()
    i = lines.index("### Pretraining")
    hdr = None
    for ln in lines[i:]:
        if ln.startswith("### Finetuning"):
            break
        if not ln.startswith("|"):
            continue
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        if cells[0] == "Model":
            hdr = cells; continue
        if set(cells[0]) <= set("-"):
            continue
        pub = dict(zip(hdr, cells))
        name = pub["Model"]
        n = int(pub["#-GPUs"]); gbs = int(pub["GBS"]); mbs = int(pub["MBS"]); seq = int(pub["Sequence Length"])
        tp, pp, cp, vp = (int(pub[k]) for k in ("TP", "PP", "CP", "VP"))
        dp = n // (tp * pp * cp); assert dp * tp * pp * cp == n and gbs % (dp * mbs) == 0
        tps = int(pub["Tokens / sec / GPU"])
        def ival(g, k, default):
            v = g(k)
            return default if v in (None, "null") else int(v)
        match = None
        for c in (LCOMMIT, LHEAD):
            g = launcher(name, c)
            if (ival(g, "tensor_model_parallel_size", 1), ival(g, "pipeline_model_parallel_size", 1),
                    ival(g, "virtual_pipeline_model_parallel_size", 1), ival(g, "context_parallel_size", 1),
                    ival(g, "micro_batch_size", 1)) == (tp, pp, vp, cp, mbs):
                match = (c, g); break
        fixed = {"tp": tp, "pp": pp, "dp": dp}
        if cp > 1:
            fixed["cp"] = cp
        if pp > 1:
            fixed["vpp"] = vp
        fixed.update({"micro_batch": mbs, "global_batch": gbs, "seq_len": seq})
        uncertain = []
        if match:
            c, g = match
            gran = g("activations_checkpoint_granularity")
            sp, ub = g("sequence_parallel"), g("ub_tp_comm_overlap")
            rec = {"null": "none", "selective": "selective", "full": "full"}[gran]
            fixed["recompute"] = rec
            when = "2024-09-06, the day before the table's commit" if c == LCOMMIT else "launcher HEAD, 2025-04, later than the table"
            uncertain += [
                f"recompute '{rec}': not printed; the launcher's {LCFG[name]}.yaml at {c[:10]} ({when}), whose tp/pp/vp/cp/mbs "
                f"equal the row's, sets activations_checkpoint_granularity: {gran}",
                f"sequence parallelism and TP communication overlap not printed (that launcher config: sequence_parallel "
                f"{sp}, ub_tp_comm_overlap {ub}); left to the planner / off"]
            launcher_cfg = f"NVIDIA/NeMo-Framework-Launcher launcher_scripts/conf/training/{LCFG[name]}.yaml at {c}"
        else:
            uncertain += [f"recompute, sequence parallelism and TP communication overlap not printed, and no launcher "
                          f"{LCFG[name]}.yaml (at {LCOMMIT[:10]} or HEAD {LHEAD[:10]}) has the row's tp/pp/vp/cp/mbs: left to the planner"]
            launcher_cfg = None
        uncertain += [
            "FP8 recipe: the launcher's fp8 settings (fp8_hybrid, fp8_amax_history_len 1024, amax_compute_algo max) are "
            "Transformer Engine delayed scaling; the table prints only 'FP8 precision'",
        ]
        # the optimizer: the launcher config's optim (distributed_fused_adam in every config here),
        # its dtypes, and the example script's overrides
        o = optim_config(name)
        assert o["name"] == "distributed_fused_adam", (name, o)
        state_dtype = o.get("dtype", "fp32")
        grad_dtype = example_override(name, "optim.grad_sync_dtype") or o.get("grad_sync_dtype") or state_dtype
        fixed["grad_reduce_in_fp32"] = grad_dtype == "fp32"
        fixed["optimizer_state_bytes"] = DFA_STATE_BYTES[state_dtype]
        where = (f"examples/training/{EXAMPLE[name]} sets +training.model.optim.grad_sync_dtype={grad_dtype}"
                 if example_override(name, "optim.grad_sync_dtype") else
                 f"{LCFG[name]}.yaml optim.grad_sync_dtype: {grad_dtype}" if "grad_sync_dtype" in o else
                 f"neither {LCFG[name]}.yaml nor the FP8 example script sets optim.grad_sync_dtype: Apex's default, the state dtype ({grad_dtype})")
        optimizer_source = (
            f"NVIDIA/NeMo-Framework-Launcher @{LCOMMIT[:10]}: {LCFG[name]}.yaml optim.name distributed_fused_adam "
            f"(Apex DistributedFusedAdam, sharded over data x context parallel: NeMo nemo/core/optim/distributed_adam.py), "
            f"contiguous_grad_buffer (NeMo's default True: a whole gradient buffer in grad_sync_dtype: apex/contrib/optimizers/"
            f"distributed_fused_adam.py _init_grad_buffer), optim.dtype {state_dtype}: {DFA_STATE_BYTES[state_dtype]:g} B of "
            f"state per parameter (NeMo megatron_base_model.py setup_optimization: "
            + ("store_param_remainders, m and v in fp32 + 2 B" if state_dtype == "fp32" else "store_params False, m and v in bf16")
            + f"); gradients in {grad_dtype}: {where}")
        uncertain += ["optimizer: the launcher config's and its FP8 example script's, at the day before the table's "
                      "commit; the table does not print it (`optimizer_source`)"]
        mdl, msrc = MODELS[name]
        out.append({
            "id": f"nemo-24.07-h100-{name.lower().replace('-', '')}-fp8-{n}gpu-tp{tp}pp{pp}cp{cp}vp{vp}-gbs{gbs}",
            "source": f"NVIDIA/NeMo {PATH} (NeMo 24.07, DGX-H100) ### Pretraining",
            "url": URL, "repo": "NVIDIA/NeMo", "path": PATH, "commit": COMMIT,
            "quote": ln.strip(),
            "quote_context": "### Pretraining - The results in the table below show pre-training performance for various tasks at FP8 precision. "
                             "Container: NeMo24.07, System: DGX-H100; header: | " + " | ".join(hdr) + " |",
            "engine": "megatron", "hardware": "H100 SXM 80GB (DGX-H100)",
            "model": mdl, "model_source": msrc,
            "cluster": f"h100x{n}", "gpus_per_node": 8,
            "fixed": fixed, "precision": "fp8", "recipe": "delayed",
            "step_time_s": round(gbs * seq / (tps * n), 4),
            "published": pub,
            "derivation": f"step_time = GBS * seq_len / (Tokens_per_sec_per_GPU * #GPUs) = {gbs} * {seq} / ({tps} * {n})",
            "needs": (["cp"] if cp > 1 else []) + ["fp8"],
            "zero_stages": [1],
            "uncertain": uncertain,
            "optimizer_source": optimizer_source,
            "notes": "NeMo 24.07 (Megatron-Core). The last column (est. days to train) is the source's extrapolation, not a measurement.",
        })
        if launcher_cfg:
            out[-1]["launcher_config"] = launcher_cfg
    return out

def family(r):
    return "NeMo 24.07 H100"

if __name__ == "__main__":
    for r in rows(): print(r["id"], r["step_time_s"], r["fixed"])
