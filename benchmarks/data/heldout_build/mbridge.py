"""Megatron-Bridge performance-summary-archive.md: dense Llama rows on GB200 / GB300 / B300
(systems none of the data files holds)."""
import subprocess, re, json
REPO = "/work/.mirror/NVIDIA-NeMo+Megatron-Bridge/repo"
COMMIT = subprocess.check_output(["git", "-C", REPO, "rev-parse", "HEAD"], text=True).strip()
PATH = "docs/performance-summary-archive.md"
TEXT = subprocess.check_output(["git", "-C", REPO, "show", f"{COMMIT}:{PATH}"], text=True)
URL = f"https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/{COMMIT}/{PATH}"
EXISTING = json.load(open(__import__("pathlib").Path(__file__).resolve().parents[1] / "published_runs_2.json"))["runs"]
MODELS = {}
for r in EXISTING:
    if r["id"].startswith("mbridge-"):
        MODELS.setdefault(r["published"].get("Model") or
                          ("LLAMA3_70B" if "llama370b" in r["id"] else "LLAMA3.1_405B" if "405b" in r["id"] else "LLAMA3_8B"),
                          r["model"])
SYSTEMS = {"DGX-GB200": ("gb200", "GB200 (DGX-GB200 NVL72)", 4), "DGX-GB300": ("gb300", "GB300 (DGX-GB300 NVL72)", 4),
           "DGX-B300": ("b300", "B300 (DGX-B300)", 8)}
PREC = {"FP8": ("fp8", "tensorwise"), "FP8-CS": ("fp8", "tensorwise"), "MXFP8": ("mxfp8", "mxfp8"),
        "FP8-MX": ("mxfp8", "mxfp8"), "BF16": ("bf16", None)}
MODEL_KEY = {"LLAMA3_8B": "llama38b", "LLAMA3_70B": "llama370b", "LLAMA3.1_405B": "llama31405b"}
HF = {"LLAMA3_8B": "meta-llama/Meta-Llama-3-8B config.json", "LLAMA3_70B": "meta-llama/Meta-Llama-3-70B config.json",
      "LLAMA3.1_405B": "meta-llama/Llama-3.1-405B config.json"}

# Megatron-Bridge's activation CPU offloading in the releases' performance recipes
# (WorkloadBaseConfig cpu_offloading_num_layers: the saved activations of that many layers moved
# to host memory in forward and back in backward; priced as the planner's recompute "offload",
# which places its own count, the recipe's in `recompute_source`), set in the Llama
# presets of scripts/performance/configs/llama/llama3{,1}_workload_base_configs.py. Read at
# every tag from v0.3.0 (2026-02-26, the 26.02 release) to v0.5.1 (2026-07-20, after 26.06):
# each preset's value is the same at all of them, so the rows of 26.02-26.06 are given it
# whichever tag their release pinned; the 25.09 / 25.11 recipes lived elsewhere (EARLY below).
# The preset: V1 for the 64-GPU GBS 128 (70B) and 128-GPU GBS 64 (405B) rows, V2 for GBS 256 /
# 1536 (the files' own "V2 (... GBS=256)" headings).
OFFLOAD_TAGS = ("v0.3.0", "v0.3.1", "v0.4.0", "v0.4.1", "v0.4.2", "v0.5.0", "v0.5.1")
OFFLOAD_RELEASES = ("26.02", "26.02.01", "26.04", "26.04.01", "26.06")
PRESET_MODEL = {"LLAMA3_70B": ("llama3", "LLAMA3_70B", {128: "V1", 256: "V2"}),
                "LLAMA3.1_405B": ("llama31", "LLAMA31_405B", {64: "V1", 1536: "V2"})}
PRESET_PREC = {"fp8": "FP8_CS", "mxfp8": "FP8_MX", "bf16": "BF16"}


def _preset_fields(tag: str, family: str) -> dict:
    """{preset name: (its base preset, {field: value})} of one workload_base_configs file."""
    text = subprocess.check_output(["git", "-C", REPO, "show",
                                    f"{tag}:scripts/performance/configs/llama/{family}_workload_base_configs.py"],
                                   text=True)
    out = {}
    for m in re.finditer(r"^(\w+) = replace\(\s*(\w+),(.*?)\n\)", text, re.S | re.M):
        out[m.group(1)] = (m.group(2), dict(re.findall(r"(\w+)=([^,\n]+)", m.group(3))))
    for m in re.finditer(r"^(\w+) = (\w+)\s*$", text, re.M):     # an alias: its base's fields
        out.setdefault(m.group(1), (m.group(2), {}))
    return out


def offload_layers(rel: str, gpu: str, model: str, prec: str, gbs: int, n: int = 0):
    """(layers, citation) of the activation offloading the row's recipe ran, else None."""
    if (rel, gpu, model, prec, n) in EARLY:
        return EARLY[(rel, gpu, model, prec, n)].get("offload")
    if rel not in OFFLOAD_RELEASES or model not in PRESET_MODEL:
        return None
    family, prefix, versions = PRESET_MODEL[model]
    if gbs not in versions:
        return None
    name = f"{prefix}_PRETRAIN_CONFIG_{gpu.upper()}_{PRESET_PREC[prec]}_{versions[gbs]}"
    values = {preset_chain(tag, family, name).get("cpu_offloading_num_layers")
              for tag in OFFLOAD_TAGS}
    assert len(values) == 1, (name, values)
    v = values.pop()
    if v in (None, "None"):
        return None
    return int(v), (f"Megatron-Bridge scripts/performance/configs/llama/{family}_workload_base_configs.py "
                    f"{name}: cpu_offloading_num_layers={v} (the same at {OFFLOAD_TAGS[0]}..{OFFLOAD_TAGS[-1]})")


def preset_chain(tag: str, family: str, name: str) -> dict:
    """The fields a preset sets, its base presets' beneath them (a V2 inherits its V1's)."""
    presets, out = _preset_fields(tag, family), {}
    while name in presets:
        base, fields = presets[name]
        out = {**fields, **out}
        name = base
    return out


# The 405B recipe's pipeline split and recompute (Megatron-Bridge src/megatron/bridge/recipes/
# llama/llama3.py llama31_405b_pretrain_config: account_for_embedding_in_pipeline_split and
# account_for_loss_in_pipeline_split True at every tag v0.3.0..v0.5.1, so the embedding and the
# loss each take a layer's place and the 126 layers + 2 split evenly: pp ranks of (128 / pp)
# places, the first and the last holding one layer fewer; no recompute: the Llama 3.1 405B
# presets of the rows' precisions set no recompute_num_layers / recompute_modules, from which
# alone scripts/performance/utils/overrides.py sets a recompute granularity).
LAYOUT_SOURCE = ("Megatron-Bridge src/megatron/bridge/recipes/llama/llama3.py llama31_405b_pretrain_config: "
                 "account_for_embedding_in_pipeline_split = True, account_for_loss_in_pipeline_split = True "
                 "(v0.3.0..v0.5.1): 126 layers + embedding + loss over pp ranks evenly")


def even_split(pp: int) -> list:
    """Decoder layers per pipeline rank of the 405B recipe's split: 126 layers, the embedding and
    the loss each in a layer's place, (126 + 2) / pp places a rank (Megatron-Core
    transformer_block.py get_num_layers_to_build)."""
    per = (126 + 2) // pp
    assert per * pp == 128
    return [per - 1] + [per] * (pp - 2) + [per - 1]


# The 25.09 and 25.11 releases' recipes, read where they lived then (25.09: Megatron-Bridge
# 0.1.0rc3, the version its container ships: scripts/performance/configs/*/..._llm_pretrain.yaml
# perf_matrix; 25.11: v0.2.0, scripts/performance/configs/llama3*/workload_base_configs.py), for
# the rows whose printed configuration is that release's preset. The 405B model recipe splits
# with the embedding and the loss counted at both (v0.1.0rc3 src/megatron/bridge/recipes/llama/
# llama31_405b.py model_config defaults; v0.2.0 llama3.py llama31_405b_pretrain_config).
V020_LAYOUT = ("Megatron-Bridge v0.2.0 src/megatron/bridge/recipes/llama/llama3.py "
               "llama31_405b_pretrain_config: account_for_embedding_in_pipeline_split and "
               "account_for_loss_in_pipeline_split True")
EARLY = {
    ("25.09", "gb200", "LLAMA3_70B", "fp8", 64): {"offload": (40, (
        "Megatron-Bridge v0.1.0rc3 scripts/performance/configs/llama3/llama3_70b_llm_pretrain.yaml "
        "perf_matrix.gb200.num_gpus_64.fp8_cs: mbs 2, tp 1, pp 1, use_megatron_fsdp true, "
        "cpu_offloading_num_layers 40"))},
    ("25.09", "gb200", "LLAMA3.1_405B", "fp8", 128): {"offload": (95, (
        "Megatron-Bridge v0.1.0rc3 scripts/performance/configs/llama31/llama31_405b_llm_pretrain.yaml "
        "perf_matrix.gb200.num_gpus_128.fp8_cs: tp 2, pp 1, use_megatron_fsdp true, "
        "cpu_offloading_num_layers 95"))},
    ("25.09", "gb200", "LLAMA3.1_405B", "mxfp8", 128): {"layout": (
        "Megatron-Bridge v0.1.0rc3 src/megatron/bridge/recipes/llama/llama31_405b.py model_config: "
        "account_for_embedding_in_pipeline_split = True, account_for_loss_in_pipeline_split = True"),
        "recompute": ("Megatron-Bridge v0.1.0rc3 scripts/performance/configs/llama31/"
                      "llama31_405b_llm_pretrain.yaml perf_matrix.gb200.num_gpus_128.fp8_mx: tp 4, "
                      "pp 8, cp 2, vp 8 and no recompute key")},
    ("25.11", "gb200", "LLAMA3_70B", "fp8", 64): {"offload": (40, (
        "Megatron-Bridge v0.2.0 scripts/performance/configs/llama3/workload_base_configs.py "
        "LLAMA3_70B_GB200_FP8_CS_BASE_CONFIG: micro_batch_size=2, use_megatron_fsdp=True, "
        "cpu_offloading_num_layers=40 (its global batch 128; the table prints 256)"))},
    ("25.11", "gb300", "LLAMA3_70B", "fp8", 64): {"offload": (20, (
        "Megatron-Bridge v0.2.0 scripts/performance/configs/llama3/workload_base_configs.py "
        "LLAMA3_70B_GB300_FP8_CS_BASE_CONFIG: micro_batch_size=2, use_megatron_fsdp=True, "
        "cpu_offloading_num_layers=20 (its global batch 128; the table prints 256)"))},
    # printed tp 4 pp 16 vp 4 (GB200) and tp 2 pp 8 cp 2 vp 4 (GB300) on 256 GPUs, which no v0.2.0
    # preset is (FP8_CS: tp 2, FSDP, 128 GPUs): the model recipe's split holds, its recompute is
    # not known
    ("25.11", "gb300", "LLAMA3.1_405B", "fp8", 256): {"layout": V020_LAYOUT},
    ("25.11", "gb200", "LLAMA3.1_405B", "fp8", 256): {"layout": V020_LAYOUT},
}


def recipe_layout(rel: str, gpu: str, model: str, prec: str, gbs: int, n: int, fixed: dict):
    """(stage_layers, layout source, recompute source or None) of a 405B row with pipelining
    whose release's recipe is read, else None. The recompute ("none") only where the row's
    printed parallelism is its preset's; otherwise left to the planner."""
    if model != "LLAMA3.1_405B" or fixed["pp"] <= 1:
        return None
    if rel in OFFLOAD_RELEASES and gbs in (64, 1536):
        family, prefix, versions = PRESET_MODEL[model]
        name = f"{prefix}_PRETRAIN_CONFIG_{gpu.upper()}_{PRESET_PREC[prec]}_{versions[gbs]}"
        rec = (f"Megatron-Bridge scripts/performance/configs/llama/{family}_workload_base_configs.py {name}: "
               f"no recompute_num_layers / recompute_modules (v0.3.0..v0.5.1); scripts/performance/utils/"
               "overrides.py sets a recompute granularity only from them")
        keys = {"tensor_model_parallel_size": "tp", "pipeline_model_parallel_size": "pp",
                "context_parallel_size": "cp", "virtual_pipeline_model_parallel_size": "vpp"}
        for tag in OFFLOAD_TAGS:
            fields = preset_chain(tag, family, name)
            assert fields, (tag, name)
            if any(k.startswith("recompute") for k in fields):
                rec = None
            if any(k in fields and int(fields[k]) != fixed.get(v, 1) for k, v in keys.items()):
                rec = None      # the printed run is not this preset
        return even_split(fixed["pp"]), LAYOUT_SOURCE, rec
    early = EARLY.get((rel, gpu, model, prec, n), {})
    if "layout" in early:
        return even_split(fixed["pp"]), early["layout"], early.get("recompute")
    return None


def split_paren(v):
    m = re.fullmatch(r"(.+?)\s*\((.+)\)", v.strip())
    return (m.group(1).strip(), m.group(2).strip()) if m else (v.strip(), None)

def read_fsdp(fsdp: int, fixed: dict, extra: dict) -> None:
    """A printed FSDP column: > 0 Megatron FSDP (ZeRO-3), 0 DDP with the distributed optimizer."""
    if fsdp > 0:
        fixed["zero"] = 3
        extra["fsdp_source"] = ("FSDP column > 0: Megatron FSDP with sharding group #GPUs/(TP x PP) (the archive's "
                                "Nomenclature); priced as ZeRO-3 as published_runs_2.json's H100 Llama3 8B FSDP row is")
    else:
        extra["zero_stages"] = [0, 1]

def rows():
    out = []
    rel = section = sub = None
    hdr = None
    for ln in TEXT.splitlines():
        if ln.startswith("## ") and "NeMo Container" in ln:
            rel = ln[3:].split()[0]; continue
        if ln.startswith("### "):
            section = ln[4:].strip(); continue
        if ln.startswith("#### "):
            sub = ln[5:].strip(); hdr = None; continue
        if section != "Pre-Training Performance" or not ln.startswith("|"):
            continue
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        if cells[0] in ("System", "Model"):
            hdr = cells; continue
        if set(cells[0]) <= set("-"):
            continue
        pub = dict(zip(hdr, cells))
        system = pub.get("System") or sub.split("System: ")[1]
        model = pub.get("Model") or sub.split("Model: ")[1]
        if system not in SYSTEMS or model not in MODEL_KEY:
            continue
        variants = [("value outside parentheses", 0)]
        if any("(" in v for v in cells):
            variants.append(("value inside parentheses", 1))
        for vname, vi in variants:
            val = {k: (split_paren(v)[vi] if split_paren(v)[vi] is not None else split_paren(v)[0]) for k, v in pub.items()}
            corrections = []
            if "Precision" in pub:
                ptxt = val["Precision"]
            else:
                # 25.09: no precision column; outside = FP8-CS, inside = MXFP8 (the table's note and
                # the 25.11 table's 'FP8-CS (FP8-MX)' for the same rows), as published_runs_2.json reads it
                ptxt = "FP8-CS" if vi == 0 else "FP8-MX"
                corrections.append("the 25.09 table prints no precision column; read as in published_runs_2.json's 25.09 "
                                   "B200 rows: the value outside the parentheses is FP8 current scaling, the one inside MXFP8 "
                                   "(the table's note: 'the numbers in parentheses indicate the use of different quantization "
                                   "granularities: In case of GB200 and B200 systems, 32x32')")
            if ptxt not in PREC:
                continue       # NVFP4: not evaluated here
            prec, recipe = PREC[ptxt]
            if ptxt == "FP8":
                corrections.append("'FP8' read as FP8 current scaling (tensorwise), as published_runs_2.json reads the 26.x H100 "
                                   "rows: the 25.11 tables print FP8-CS for these models and the Blackwell perf recipes are named *_fp8cs_config")
            gpu, hw, gpn = SYSTEMS[system]
            n = int(val["#-GPUs"]); gbs = int(val["GBS"]); mbs = int(val["MBS"]); seq = int(val["Sequence Length"])
            tp = int(val["TP"]); pp = int(val["PP"]); cp = int(val["CP"])
            vp = None if val["VP"] == "n/a" else int(val["VP"])
            ep = None if val["EP"] == "n/a" else int(val["EP"])
            fsdp = int(val["FSDP"]) if "FSDP" in val else None
            dp = n // (tp * pp * cp)
            assert dp * tp * pp * cp == n
            tps = float(val["Tokens / sec / GPU"])
            fixed = {"tp": tp, "pp": pp, "dp": dp}
            if cp > 1:
                fixed["cp"] = cp
            if vp is not None and (pp > 1):
                fixed["vpp"] = vp
            uncertain = []
            if "GA" in val and mbs * int(val["GA"]) * dp * cp // cp != gbs:
                uncertain.append(f"MBS {mbs} x GA {val['GA']} x DP {dp} != GBS {gbs} as printed for this variant: micro_batch left to the planner")
                fixed.update({"global_batch": gbs, "seq_len": seq})
            else:
                fixed.update({"micro_batch": mbs, "global_batch": gbs, "seq_len": seq})
            uncertain += ["recompute, sequence parallelism, CUDA graphs and communication overlaps are not printed in the table",
                         f"the NVLink domain of a {n}-GPU {system} job is not printed"]
            extra = {}
            if fsdp is None:
                uncertain.append("this table prints no FSDP column: DDP or Megatron FSDP not printed, ZeRO stage left to the planner")
            else:
                read_fsdp(fsdp, fixed, extra)
            if tp > 1:
                fixed["tp_comm_overlap"] = True
                extra["tp_comm_overlap_source"] = (
                    f"Megatron-Bridge src/megatron/bridge/perf_recipes/llama/{gpu}/llama3*.py at {COMMIT[:10]} (a later version "
                    "than the release) sets cfg.comm_overlap.tp_comm_overlap_cfg (userbuffers_*) for the FP8/MXFP8/BF16 tp>1 recipes")
                uncertain.append("tp_comm_overlap read from the recipes at HEAD, not at the release")
            if vp is not None and vp == 1 and pp == 1:
                pass
            tag = ptxt.lower().replace("-", "")
            vptxt = "none" if vp is None else str(vp)
            eptxt = "none" if ep is None else str(ep)
            rid = (f"mbridge-{rel}-{gpu}-{MODEL_KEY[model]}-{tag}-{n}gpu-tp{tp}pp{pp}cp{cp}ep{eptxt}vp{vptxt}-gbs{gbs}"
                   + ("-alt" if vi else ""))
            pub_rec = dict(pub); pub_rec["_variant"] = vname
            row = {
                "id": rid,
                "source": f"NVIDIA-NeMo/Megatron-Bridge {PATH} {rel} / Pre-Training Performance / {sub}"
                          + (f" / System: {system}" if sub.startswith("Model:") else ""),
                "url": URL, "repo": "NVIDIA-NeMo/Megatron-Bridge", "path": PATH, "commit": COMMIT,
                "quote": ln.strip(),
                "quote_context": f"## {rel} NeMo Container / ### Pre-Training Performance / #### {sub}; header: | " + " | ".join(hdr) + " |",
                "engine": "megatron", "hardware": hw,
                "model": MODELS[model],
                "model_source": f"Hugging Face {HF[model]} (the values published_runs_2.json's Megatron-Bridge rows carry)",
                "cluster": f"{gpu}x{n}", "gpus_per_node": gpn,
                "fixed": fixed, "precision": prec, "step_time_s": round(gbs * seq / (tps * n), 4),
                "published": pub_rec,
                "derivation": f"step_time = GBS * seq_len / (Tokens_per_sec_per_GPU * #GPUs) = {gbs} * {seq} / ({val['Tokens / sec / GPU']} * {n})",
                "needs": [p for p in (["cp"] if cp > 1 else []) + ([prec] if prec != "bf16" else [])],
                "uncertain": uncertain,
                "notes": "Megatron-Bridge performance recipes (scripts/performance at the release). "
                         "FSDP = 0: DDP with the distributed optimizer not printed (zero_stages 0 or 1 as published_runs_2.json's rows).",
                **extra,
            }
            if recipe:
                row["recipe"] = recipe
            lay = recipe_layout(rel, gpu, model, prec, gbs, n, fixed)
            if lay:
                fixed["stage_layers"], row["layout_source"] = lay[0], lay[1]
                if lay[2]:
                    fixed["recompute"], row["recompute_source"] = "none", lay[2]
                    row["uncertain"] = [u for u in row["uncertain"] if not u.startswith("recompute,")] + [
                        "sequence parallelism, CUDA graphs and communication overlaps are not printed in the table"]
            off = offload_layers(rel, gpu, model, prec, gbs, n)
            if off:
                # Megatron runs it without recompute (transformer_config.py): the row's
                # recompute is the offload; the count is the planner's to place
                fixed["recompute"] = "offload"
                row["recompute_source"] = (f"activation CPU offloading of {off[0]} layers ({off[1]}), "
                                           "without recompute (Megatron-Core transformer_config.py "
                                           "refuses cpu_offloading with recompute_granularity)")
                row["uncertain"] = [u for u in row["uncertain"] if not u.startswith("recompute,")] + [
                    "sequence parallelism, CUDA graphs and communication overlaps are not printed in the table",
                    f"the planner places its own count of offloaded layers; the recipe's is {off[0]}"]
                row["uncertain"] = list(dict.fromkeys(row["uncertain"]))
            if corrections:
                row["corrections"] = corrections
            out.append(row)
    return out

def update_in_place(path=None):
    """Write every dense Megatron-Bridge row's `unpriced` facts into the held-out file in place
    (build.py rewrites the whole file only where every source's snapshot is at hand)."""
    from pathlib import Path
    path = path or Path(__file__).resolve().parents[1] / "published_runs_heldout.json"
    doc = json.load(open(path))
    new = {r["id"]: r for r in rows()}
    keys = ("unpriced", "layout_source", "recompute_source")
    for r in doc["runs"]:
        if r["id"] in new:
            built = new[r["id"]]
            for k in keys:
                r.pop(k, None)
                if built.get(k):
                    r[k] = built[k]
            r["fixed"], r["uncertain"] = built["fixed"], built["uncertain"]
    json.dump(doc, open(path, "w"), indent=1)
    open(path, "a").write("\n")
    return sum(any(v.get(k) for k in keys) for v in new.values())


if __name__ == "__main__" and "--in-place" in __import__("sys").argv:
    print(update_in_place(), "rows with recipe facts")
elif __name__ == "__main__":
    import collections
    r = rows()
    print(len(r), len(set(x["id"] for x in r)))
    for x in r: print(x["id"], x["step_time_s"], x["fixed"])
