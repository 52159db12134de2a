"""Megatron-Bridge performance summaries (performance-summary.md, 26.08, and
performance-summary-archive.md, 25.09-26.06.01): the mixture-of-experts rows of the catalog's MoE
models (DeepSeek-V3, GPT-OSS-120B, Qwen3-30B-A3B, Qwen3-235B-A22B) that published_runs_moe.json
does not hold: every GB200, GB300 and B300 row (its B200 and H100 rows are all there).

Read as published_runs_moe.json reads the same tables (precision, the 25.09 parentheses, token
drop, MTP), and, as that file's rows carry them, with the token dispatcher, EP overlap, recompute
(and its modules) and pipeline layout each row's recipe ran, read from its release's presets and
recipes into mbridge_moe_recipes.json (cited per row; `recipe_fields`, the row's
`recipe_source`). Not for the one row whose printed layout is no preset of its release
(confidence "low" there), and not the MoE knobs of the recipes below: the MXFP8 rows of
26.06-26.08 on GB200 / GB300 (and Qwen3-30B on B300) ran full-iteration CUDA graphs with static
MoE shapes, which change what runs (no host stall: `fixed.cuda_graph`, `cuda_graph_source`:
FULL_ITERATION). The same configs ran the EP overlap and no recompute (DeepSeek-V3 on GB200:
mla_up_proj) beside a paged stash of the routed experts' activations and CuTeDSL's fused grouped
MLP, which the planner does not model; priced with the overlap and without recompute the
Qwen3-30B rows come out 15-23% fast (and needed 243 GiB of 183 while the planner held two
micro-batches under the overlap), so those rows' dispatcher, overlap and recompute stay the
planner's (the EP overlap priced off); their layouts are read. With the overlap on (recompute
the planner's), the 26.06-26.08 GB300 DeepSeek-V3 and Qwen3-235B rows went from +16..+19% to
-4..+2%, and the GB200 ones from -7..-2% to -24..-14% (before the MoE layer's GPU work and
Blackwell's attention were priced as measured). A printed layout Megatron-Core refuses is not
what ran and is left out (`LEFT_OUT`: one, the 25.09 GB200 DeepSeek-V3 MXFP8 variant, PP 8 with
EP 64 on 256 GPUs). NVFP4 rows are not read (as the dense builder); models the catalog lacks
(Kimi-K2, Nemotron 3, DeepSeek-V4) neither.

Every row of both MoE files also records the CUDA graphs its release's recipe ran
(mbridge_moe_graphs.json, read per release; `graph_fields`): per-layer graphs as
`fixed.cuda_graph` / `cuda_graph_scope` / `cuda_graph_source`, recorded and not priced (a host
share for them, fitted, was no better out of sample: docs/benchmarks.md).

`python mbridge_moe.py` replaces this module's rows in published_runs_heldout.json in place, and
the per-layer graph fields of published_runs_moe.json's rows (the
other builders need mirrors a machine may not have); build.py adds them on a full rebuild."""
import json
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mbridge import read_fsdp, split_paren  # noqa: E402

REPO = "/work/.mirror/NVIDIA-NeMo+Megatron-Bridge/repo"
COMMIT = subprocess.check_output(["git", "-C", REPO, "rev-parse", "HEAD"], text=True).strip()
PATHS = ("docs/performance-summary.md", "docs/performance-summary-archive.md")
DATA = Path(__file__).resolve().parents[1]
MOE_FILE = json.loads((DATA / "published_runs_moe.json").read_text())["runs"]

SYSTEMS = {"DGX-GB200": ("gb200", "GB200 (DGX-GB200 NVL72)", 4),
           "DGX-GB300": ("gb300", "GB300 (DGX-GB300 NVL72)", 4),
           "DGX-B300": ("b300", "B300 (DGX-B300)", 8),
           "DGX-B200": ("b200", "B200 (DGX-B200)", 8),
           "DGX-H100": ("h100", "H100 SXM 80GB (DGX-H100)", 8)}
# the table's model name (less a variant in parentheses) -> (catalog model, id key)
MODELS = {"DeepSeekV3": ("deepseek-v3", "deepseekv3"), "GPT OSS 120B": ("gpt-oss-120b", "gptoss120b"),
          "Qwen3_30B_a3B": ("qwen3-30b-a3b", "qwen330ba3b"),
          "Qwen3_235B_a22B": ("qwen3-235b-a22b", "qwen3235ba22b")}
PREC = {"FP8": ("fp8", "tensorwise"), "FP8-CS": ("fp8", "tensorwise"), "MXFP8": ("mxfp8", "mxfp8"),
        "FP8-MX": ("mxfp8", "mxfp8"), "BF16": ("bf16", None)}
# the HF config each catalog model is built from, as published_runs_moe.json's rows carry it
HF_CONFIG = {}
for _r in MOE_FILE:
    HF_CONFIG.setdefault(_r["catalog_model"], _r["model"])
# the CUDA-graph setting each row's recipe ran, read from its release's recipes (the file's
# `about`): per-layer graphs (transformer_engine, local) go into the rows (graph_fields)
GRAPHS = json.loads((Path(__file__).resolve().parent / "mbridge_moe_graphs.json").read_text())["rows"]
# the MoE and recompute knobs each held-out row's recipe ran, read from the same release's presets
# and recipes (the file's `about`: dispatcher, EP overlap, recompute and its modules, pipeline
# layout, each cited): fixed by `recipe_fields`
RECIPES = json.loads((Path(__file__).resolve().parent / "mbridge_moe_recipes.json").read_text())["rows"]
MTP_SOURCE = next(r["mtp_source"] for r in MOE_FILE if r.get("mtp_source"))
CAPACITY_SOURCE = next(r["moe_capacity_source"] for r in MOE_FILE if r.get("moe_capacity_source"))


def config_key(release, gpu, catalog, precision, n, f):
    """What makes a row the same published row in another file: its table, system, model,
    precision and printed layout."""
    return (release, gpu, catalog, precision, n, f["global_batch"], f["tp"], f["pp"], f["ep"],
            f.get("micro_batch"))


LEFT_OUT = []     # (table row, variant, why): printed layouts Megatron-Core refuses
EXISTING = {config_key(r["id"].split("-")[1], r["cluster"].rsplit("x", 1)[0], r["catalog_model"],
                       r["precision"], int(r["cluster"].rsplit("x", 1)[1]), r["fixed"])
            for r in MOE_FILE}


# The MXFP8 recipes that replay the whole iteration as one CUDA graph with static MoE shapes
# (cuda_graph_impl="full_iteration", HybridEP with moe_expert_rank_capacity_factor): switched on
# on Megatron-Bridge main 2026-06-06..10 (8af195c0a, afb5dd47c, 5f98743d5, 55443cbfb) and picked
# into the 26.06 release branch r0.5.0 on 2026-06-10, before its performance summary (c14643cdb,
# 2026-06-16); the flat recipes of r0.6.0 and 067f987 keep them. Read from those configs at
# c14643cdb (scripts/performance/configs/*/..._workload_base_configs.py), with the MoE knobs the
# same configs set, cited and not fixed (the module docstring): the flex dispatcher
# (moe_flex_dispatcher_backend="hybridep"), the EP overlap (moe_a2a_overlap=True) and the
# recompute modules (none but DeepSeek-V3 on GB200's mla_up_proj).
R050 = "r0.5.0 @c14643cdb scripts/performance/configs/"
QWEN_CG = ("bac3ffebf (2026-06-10, #4249 'Enable Qwen3 GB200/GB300/GB300 MXFP8 CuTeDSL Fusion and "
           "Full-Iter CUDA Graphs for 26.06'; on main 55443cbfb)")
DSV3_CG = "7a8bd64b2 (2026-06-10, #4187 'GB300/GB200 MXFP8 full-iter CG recipes (#3983 + #4226) into r0.5.0')"
GPTOSS_CG = "0d3b6dd43 (2026-06-10, #4241 'full-iter CG for GPT-OSS 120B (4173)' into r0.5.0)"
# (system, model) -> (commit, config, recompute modules: None none, else selective with them)
FULL_ITERATION = {
    ("gb200", "qwen3-30b-a3b"): (QWEN_CG, "qwen/QWEN3_30B_A3B_PRETRAIN_CONFIG_GB200_FP8_MX_V1", None),
    ("gb300", "qwen3-30b-a3b"): (QWEN_CG, "qwen/QWEN3_30B_A3B_PRETRAIN_CONFIG_GB300_FP8_MX_V1", None),
    ("b300", "qwen3-30b-a3b"): (QWEN_CG, "qwen/QWEN3_30B_A3B_PRETRAIN_CONFIG_B300_FP8_MX_V1", None),
    ("gb200", "qwen3-235b-a22b"): (QWEN_CG, "qwen/QWEN3_235B_A22B_PRETRAIN_CONFIG_GB200_FP8_MX_V2", None),
    ("gb300", "qwen3-235b-a22b"): (QWEN_CG, "qwen/QWEN3_235B_A22B_PRETRAIN_CONFIG_GB300_FP8_MX_V2", None),
    ("gb300", "deepseek-v3"): (DSV3_CG, "deepseek/DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_FP8_MX_V2", None),
    ("gb200", "deepseek-v3"): (DSV3_CG, "deepseek/DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_FP8_MX_V2",
                               ["mla_up_proj"]),
    ("gb200", "gpt-oss-120b"): (GPTOSS_CG, "gpt_oss/GPT_OSS_120B_PRETRAIN_CONFIG_GB200_FP8_MX_V2", None),
    ("gb300", "gpt-oss-120b"): (GPTOSS_CG, "gpt_oss/GPT_OSS_120B_PRETRAIN_CONFIG_GB300_FP8_MX_V2", None),
}
GRAPHED_RELEASES = ("26.06", "26.06.01", "26.08")


def footnotes(text: str) -> dict:
    """{name: text} of a markdown file's footnote definitions ("[^name]: text")."""
    out = {}
    for ln in text.splitlines():
        m = re.match(r"\[\^([^\]]+)\]:\s*(.+)", ln)
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def source_caveat(line: str, notes: dict) -> str | None:
    """What the table's own footnotes say of a row (a "[^name]" in one of its cells): the
    26.06.01 GPT-OSS-120B rows, "Performance regression ... is a known issue" (cudnn-frontend
    issue 256: a grouped-GEMM dGLU kernel of cudnn-frontend 1.24, 10x slower than 1.23's on
    GB200-class GPUs, the MoE layer's backward). Recorded with the row, not priced: the row
    stays scored as published."""
    names = re.findall(r"\[\^([^\]]+)\]", line)
    said = [f"[^{n}]: {notes[n]}" for n in names if n in notes]
    return "; ".join(said) or None


def _tables():
    """(path, release, sub-heading, header, cells, line, footnotes) of every pre-training table
    row."""
    for path in PATHS:
        text = subprocess.check_output(["git", "-C", REPO, "show", f"{COMMIT}:{path}"], text=True)
        notes = footnotes(text)
        rel = section = sub = hdr = None
        for ln in text.splitlines():
            if ln.startswith("## ") and "NeMo Container" in ln:
                rel = ln[3:].split()[0]
                continue
            if ln.startswith("### "):
                section = ln[4:].strip()
                continue
            if ln.startswith("#### "):
                sub, hdr = ln[5:].strip(), None
                continue
            if section != "Pre-Training Performance" or not ln.startswith("|"):
                continue
            cells = [c.strip() for c in ln.strip().strip("|").split("|")]
            if cells[0] in ("System", "Model"):
                hdr = cells
                continue
            if set(cells[0]) <= set("-") or hdr is None:
                continue
            yield path, rel, sub, hdr, cells, ln.strip(), notes


def rows():
    out = []
    for path, rel, sub, hdr, cells, line, notes in _tables():
        pub = dict(zip(hdr, cells))
        system = pub.get("System") or sub.split("System: ")[1]
        name = pub.get("Model") or sub.split("Model: ")[1]
        base, variant = split_paren(name)
        if system not in SYSTEMS or base not in MODELS:
            continue
        variant = (variant or "").lower()
        catalog, key = MODELS[base]
        variants = [("value outside parentheses", 0)]
        if "(" in pub["Tokens / sec / GPU"]:     # another run (a parenthesised TFLOP alone: not)
            variants.append(("value inside parentheses", 1))
        for vname, vi in variants:
            val = {k: (split_paren(v)[vi] if split_paren(v)[vi] is not None else split_paren(v)[0])
                   for k, v in pub.items() if k != "Model"}
            corrections, uncertain, extra = [], [], {}
            if "Precision" in pub:
                ptxt = val["Precision"]
            else:
                ptxt = "FP8-CS" if vi == 0 else "FP8-MX"
                corrections.append(
                    "the 25.09 table prints no precision column; read as published_runs_moe.json reads "
                    "the 25.09 rows: the value outside the parentheses is FP8 current scaling, the one "
                    "inside MXFP8 (the table's note: 'the numbers in parentheses indicate the use of "
                    "different quantization granularities: In case of GB200 and B200 systems, 32x32')")
            if ptxt not in PREC:
                continue       # NVFP4: not evaluated here, as the dense builder
            prec, recipe = PREC[ptxt]
            if ptxt == "FP8":
                corrections.append(
                    "'FP8' read as FP8 current scaling (tensorwise), as published_runs_moe.json reads "
                    "the 26.x H100 rows")
            gpu, hw, gpn = SYSTEMS[system]
            n, gbs, mbs = int(val["#-GPUs"]), int(val["GBS"]), int(val["MBS"])
            seq, tp, pp, cp = (int(val["Sequence Length"]), int(val["TP"]), int(val["PP"]),
                               int(val["CP"]))
            vp = None if val["VP"] == "n/a" else int(val["VP"])
            ep = int(val["EP"])
            fsdp = int(val["FSDP"]) if "FSDP" in val else None
            dp = n // (tp * pp * cp)
            assert dp * tp * pp * cp == n, line
            tps = float(val["Tokens / sec / GPU"])
            fixed = {"tp": tp, "pp": pp, "dp": dp, "ep": ep}
            if cp > 1:
                fixed["cp"] = cp
            if pp > 1:      # VP n/a: plain 1F1B, as published_runs_moe.json reads it
                fixed["vpp"] = vp or 1
            # the 25.x tables' GA column is GBS / (MBS x #GPUs), not a check on the layout
            # (published_runs_moe.json's rows fix the printed MBS likewise)
            fixed.update({"micro_batch": mbs, "global_batch": gbs, "seq_len": seq})
            uncertain += [
                "the token dispatcher, recompute (and its modules), pipeline layout, sequence "
                "parallelism and the overlaps are not printed: the dispatcher, EP overlap, "
                "recompute and layout read from the release's recipe where `recipe_source` says "
                "so (recipe_fields), as published_runs_moe.json's rows fix them; otherwise the "
                "planner's, the EP overlap priced off",
                f"the NVLink domain of a {n}-GPU {system} job is not printed"]
            if tp > 1:
                uncertain.append("the TP communication overlap is not printed: priced off")
            if n % (ep * pp):
                # not what ran: Megatron-Core refuses the layout (megatron/core/parallel_state.py,
                # initialize_model_parallel: world_size % expert_tensor_model_pipeline_parallel_size;
                # the 25.09 GB200 DeepSeek-V3 MXFP8 variant, PP 8 with EP 64 on 256 GPUs)
                LEFT_OUT.append((line, vname, f"EP {ep} x PP {pp} does not divide the {n} GPUs"))
                continue
            if fsdp is None:
                extra["zero_stages"] = [0, 1]
                uncertain.append("this table prints no FSDP column: read as DDP with the distributed "
                                 "optimizer, as the releases that print it show for these models")
            else:
                read_fsdp(fsdp, fixed, extra)
            if variant == "tokendrop":
                fixed["moe_capacity_factor"] = 1.0
                fixed["moe_dispatcher"] = "alltoall"
                extra["moe_capacity_source"] = CAPACITY_SOURCE
            if prec == "mxfp8" and rel in GRAPHED_RELEASES and (gpu, catalog) in FULL_ITERATION:
                commit, config, modules = FULL_ITERATION[(gpu, catalog)]
                fixed["cuda_graph"] = "full_iteration"
                extra["cuda_graph_source"] = (
                    f"NVIDIA-NeMo/Megatron-Bridge {commit}: {R050}{config} sets "
                    "cuda_graph_impl='full_iteration', with which that model's *_llm_pretrain.py "
                    "set_full_iter_cg_configs sets moe_expert_rank_capacity_factor=1.5 and "
                    "moe_paged_stash (static shapes: no device-to-host sync of the token counts); the "
                    "same config sets moe_flex_dispatcher_backend='hybridep', moe_a2a_overlap=True, "
                    "CuTeDSL's fused grouped MLP and "
                    + (f"recompute_modules={modules}" if modules else "no recompute")
                    + ": with the paged stash and the fused MLP, which the planner does not model, "
                    "those stay the planner's choice (EP overlap off), see the module docstring")
                uncertain.append("the release's recipe ran the EP overlap and "
                                 + (f"recompute of {modules}" if modules else "no recompute")
                                 + " with memory savers the planner does not model: not fixed")
            model_overrides = {}
            if catalog == "deepseek-v3":
                if variant == "w/o mtp":
                    model_overrides["mtp_layers"] = 0
                    extra["mtp_source"] = "the table names the row 'DeepSeekV3 (w/o MTP)'"
                else:
                    model_overrides["mtp_layers"] = 1
                    extra["mtp_source"] = MTP_SOURCE
                    if variant != "w/ mtp":
                        uncertain.append("MTP read from the DeepSeek-V3 recipe as published_runs_moe.json "
                                         "reads it; this row's system recipe was not checked")
            tag = ptxt.lower().replace("-", "")
            vtag = variant.replace("w/o mtp", "womtp").replace("w/ mtp", "wmtp")
            vptxt = "none" if vp is None else str(vp)
            rid = (f"mbridge-{rel}-{gpu}-{key}{vtag}-{tag}-{n}gpu-tp{tp}pp{pp}cp{cp}ep{ep}vp{vptxt}"
                   f"-gbs{gbs}" + ("-alt" if vi else ""))
            if config_key(rel, gpu, catalog, prec, n, fixed) in EXISTING:
                continue
            graph_fields(rid, fixed, extra)
            recipe_fields(rid, catalog, fixed, extra)
            caveat = source_caveat(line, notes)
            if caveat:
                extra["source_caveat"] = caveat
            pub_rec = dict(pub)
            pub_rec["_variant"] = vname
            url = f"https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/{COMMIT}/{path}"
            row = {
                "id": rid,
                "source": f"NVIDIA-NeMo/Megatron-Bridge {path} {rel} / Pre-Training Performance / {sub}"
                          + (f" / System: {system}" if sub.startswith("Model:") else ""),
                "url": url, "repo": "NVIDIA-NeMo/Megatron-Bridge", "path": path, "commit": COMMIT,
                "quote": line,
                "quote_context": f"## {rel} NeMo Container / ### Pre-Training Performance / #### {sub}; "
                                 "header: | " + " | ".join(hdr) + " |",
                "engine": "megatron", "hardware": hw,
                "model": HF_CONFIG[catalog], "catalog_model": catalog,
                "model_source": f"the planner catalog model {catalog} (planner/catalog/models.py), as "
                                "published_runs_moe.json's rows of the same model",
                "cluster": f"{gpu}x{n}", "gpus_per_node": gpn,
                "fixed": fixed, "precision": prec, "step_time_s": round(gbs * seq / (tps * n), 4),
                "published": pub_rec,
                "derivation": f"step_time = GBS * seq_len / (Tokens_per_sec_per_GPU * #GPUs) = {gbs} * "
                              f"{seq} / ({val['Tokens / sec / GPU']} * {n})",
                "needs": ["moe"] + ([prec] if prec != "bf16" else []),
                "uncertain": uncertain,
                "notes": "MoE benchmarks: tokens force-balanced across experts and dropless (the tables' "
                         "note) unless the table marks the row tokendrop. " + (
                             "Token drop: capacity factor 1 with every expert padded to it and the "
                             "alltoall dispatcher, as Megatron-Bridge's apply_moe_token_drop sets."
                             if variant == "tokendrop" else ""),
                **extra,
            }
            row.update({k: v for k, v in (("model_overrides", model_overrides), ("recipe", recipe),
                                          ("corrections", corrections)) if v})
            out.append(row)
    return out


def graph_fields(rid: str, fixed: dict, extra: dict) -> None:
    """The per-layer CUDA graphs the row's recipe captured (`GRAPHS`): fixed.cuda_graph (the
    implementation), fixed.cuda_graph_scope (Megatron's --cuda-graph-scope; "full" the whole
    layer) and cuda_graph_source. Rows that ran none, or the full iteration (FULL_ITERATION),
    are left as they are."""
    g = GRAPHS[rid]
    if g["cuda_graph_impl"] not in ("transformer_engine", "local"):
        return
    fixed["cuda_graph"] = g["cuda_graph_impl"]
    fixed["cuda_graph_scope"] = list(g["cuda_graph_scope"])
    extra["cuda_graph_source"] = (f"NVIDIA-NeMo/Megatron-Bridge {g['revision']}, preset "
                                  f"{g['preset']}: {g['source']}")


def layout_layers(layout: str, pp: int, vp: int) -> list | None:
    """Decoder layers per pipeline rank of a Megatron-Core pipeline layout string: stages split
    by "|", "(...)*n" and "x*n" unrolled (megatron/core/transformer/
    pipeline_parallel_layer_layout.py parse_str_to_list), the i-th stage on rank i % pp
    (virtual stage i // pp; its __init__); "t" a decoder layer ("E", "m", "L" the embedding,
    an MTP layer, the loss). None unless there are pp x vp stages (Megatron-Core takes the
    virtual stages from the layout and refuses another --virtual-pipeline size)."""
    text = layout.replace(",", "")
    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    text = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    stages = text.split("|")
    if len(stages) != pp * vp:
        return None
    out = [0] * pp
    for i, stage in enumerate(stages):
        out[i % pp] += stage.count("t")
    return out


def accounted_layers(layers: int, pp: int, vp: int) -> list | None:
    """Decoder layers per pipeline rank with account_for_embedding_in_pipeline_split and
    account_for_loss_in_pipeline_split: the layers, the embedding and the loss spread evenly
    over the pp x vp virtual stages, the first and the last virtual stage one layer fewer
    (megatron/core/transformer/transformer_block.py get_num_layers_to_build). None unless they
    divide evenly."""
    if (layers + 2) % (pp * vp):
        return None
    per_rank = (layers + 2) // pp
    out = [per_rank] * pp
    out[0] -= 1
    out[-1] -= 1
    return out


def recipe_fields(rid: str, catalog: str, fixed: dict, extra: dict) -> None:
    """The dispatcher, EP overlap, recompute and pipeline layout the row's recipe ran
    (RECIPES), fixed as published_runs_moe.json's rows fix them (moe_dispatcher, ep_comm_overlap,
    recompute / recompute_modules, stage_layers), cited in `recipe_source`. Not for rows whose
    recipe read is not what ran (confidence "low": the printed layout is no preset of the
    release), nor for the full-iteration rows' MoE knobs (FULL_ITERATION: their overlap and
    recompute came with memory savers the planner does not model); a layout only where its
    stages are pp x vp (a layout Megatron-Core would refuse at the printed VP is not what ran)."""
    g = RECIPES.get(rid)
    if g is None or g["confidence"] == "low":
        return
    said = []
    if fixed.get("cuda_graph") != "full_iteration":
        if g["moe_dispatcher"]:
            fixed["moe_dispatcher"] = g["moe_dispatcher"]
            said.append(f"dispatcher {g['moe_dispatcher']}"
                        + (f" ({g['flex_backend']})" if g["flex_backend"] else ""))
        if g["ep_comm_overlap"] is not None:
            fixed["ep_comm_overlap"] = bool(g["ep_comm_overlap"])
            said.append("EP overlap " + ("on" if g["ep_comm_overlap"] else "off"))
        if g["recompute"] == "selective" and not g["recompute_modules"]:
            # Megatron-Core keeps an explicit empty module list: nothing recomputed
            fixed["recompute"] = "none"
            said.append("selective recompute of no module (none)")
        elif g["recompute"] is not None:
            fixed["recompute"] = g["recompute"]
            if g["recompute"] == "selective":
                fixed["recompute_modules"] = list(g["recompute_modules"])
            said.append(f"recompute {g['recompute']}"
                        + (f" of {g['recompute_modules']}" if g["recompute_modules"] else ""))
    pp, vp = fixed.get("pp", 1), fixed.get("vpp") or 1
    layout = g["pipeline_layout"]
    stage_layers = None
    if pp > 1 and layout and layout.startswith("account_for_embedding"):
        from planner.catalog import get_model
        stage_layers = accounted_layers(get_model(catalog).num_layers, pp, vp)
    elif pp > 1 and layout:
        stage_layers = layout_layers(layout, pp, vp)
    if stage_layers:
        fixed["stage_layers"] = stage_layers
        said.append(f"layout {layout} -> decoder layers per rank {stage_layers}")
    if said:
        extra["recipe_source"] = (f"NVIDIA-NeMo/Megatron-Bridge {g['revision']}, preset "
                                  f"{g['preset']}: {'; '.join(said)}. {g['source']}")


def annotate_moe_table() -> list:
    """published_runs_moe.json's rows with their recipes' per-layer CUDA graphs (graph_fields),
    in place of any the file had."""
    for r in MOE_FILE:
        if r["fixed"].get("cuda_graph") != "full_iteration":
            r["fixed"].pop("cuda_graph", None)
            r["fixed"].pop("cuda_graph_scope", None)
            r.pop("cuda_graph_source", None)
        graph_fields(r["id"], r["fixed"], r)
    return MOE_FILE


def family(r) -> str:
    return "Megatron-Bridge MoE " + r["cluster"].rsplit("x", 1)[0].upper()


if __name__ == "__main__":
    out = DATA / "published_runs_heldout.json"
    doc = json.loads(out.read_text())
    mine = rows()
    ids = {r["id"] for r in mine}
    assert len(ids) == len(mine), "duplicate ids"
    for r in mine:
        r["family"] = family(r)
    kept = [r for r in doc["runs"] if not r.get("family", "").startswith("Megatron-Bridge MoE ")]
    doc["runs"] = kept + mine
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(len(mine), "MoE rows;", len(doc["runs"]), "in all")
    table = DATA / "published_runs_moe.json"
    moe_doc = json.loads(table.read_text())
    moe_doc["runs"] = annotate_moe_table()
    table.write_text(json.dumps(moe_doc, indent=1) + "\n")
    print(sum(1 for r in moe_doc["runs"] if r["fixed"].get("cuda_graph")), "of",
          len(moe_doc["runs"]), "MoE-table rows with per-layer CUDA graphs")
