"""Build mbridge_moe_recipes.json (beside this file): the MoE / recompute knobs
each held-out Megatron-Bridge MoE benchmark row's recipe ran, read from the Megatron-Bridge mirror at
the revision (and workload preset) that mbridge_moe_graphs.json resolved for the row.

Every line number is looked up here, in the mirror (git show REV:PATH), by a pattern; a pattern that
does not match exactly once (in its window) stops the build. Rerun: python mbridge_moe_recipes.py
(the Megatron-Bridge and Megatron-LM mirrors at the paths below; mbridge_moe.py reads its output)
"""
import json
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mbridge_presets import resolve  # noqa: E402

BR = ["git", "--git-dir=/work/.mirror/NVIDIA-NeMo+Megatron-Bridge/repo"]
ML = ["git", "--git-dir=/work/.mirror/NVIDIA+Megatron-LM/repo"]
MAIN = Path(__file__).resolve().parents[1]
OUT = MAIN / "heldout_build" / "mbridge_moe_recipes.json"

HELD = json.loads((MAIN / "published_runs_heldout.json").read_text())["runs"]
ROWS = [r for r in HELD if "moe" in r.get("needs", []) and r["id"].startswith("mbridge-")]
GRAPHS = json.loads((MAIN / "heldout_build" / "mbridge_moe_graphs.json").read_text())["rows"]

# Megatron-Core submodule commit (3rdparty/Megatron-LM) of each Bridge revision read
MCORE = {"a28844195": "core_v0.14.0", "7e442b6a0": "core_v0.14.0", "4a82e1651": "0d8e0714c", "v0.2.0": "0d8e0714c",
         "52a31ded1": "0d8e0714c", "v0.3.0": "b0cc2706d", "v0.3.1": "55ac70825", "904597bd3": "55ac70825",
         "v0.4.0": "d7288711b", "v0.4.2": "2edffadb5", "v0.5.0": "d0b3b7754", "c14643cdb": "d0b3b7754",
         "v0.5.1": "458c8d0ec", "v0.6.0": "cd4afffa6", "3a9559f01": "cd4afffa6", "fbb7570cf": "2a75ac12c",
         "79308d0d9": "14346b65a"}


@lru_cache(None)
def show(rev, path, repo="br"):
    return subprocess.run((BR if repo == "br" else ML) + ["show", f"{rev}:{path}"], capture_output=True,
                          text=True, check=True).stdout.splitlines()


def ln(rev, path, pattern, after=None, before=None, nth=None, repo="br"):
    """1-based line of the one line matching regex `pattern` (optionally after the first line matching
    `after`, and before the next line matching `before`)."""
    lines = show(rev, path, repo)
    start = 0
    if after is not None:
        hits = [i for i, s in enumerate(lines) if re.search(after, s)]
        if len(hits) != 1:
            raise SystemExit(f"after-pattern {after!r} matches {len(hits)}x in {path}@{rev}")
        start = hits[0] + 1
    end = len(lines)
    if before is None and after is not None and after.startswith("^def "):
        before = r"^def "  # stay inside the function
    if before is not None:
        nxt = [i for i in range(start, len(lines)) if re.search(before, lines[i])]
        if nxt:
            end = nxt[0]
    hits = [i for i in range(start, end) if re.search(pattern, lines[i])]
    if nth is not None:
        return hits[nth] + 1
    if len(hits) != 1:
        raise SystemExit(f"pattern {pattern!r} matches {len(hits)}x in {path}@{rev} [{start}:{end}]")
    return hits[0] + 1


def C(rev, path, pattern, what, **kw):
    return f"{path}@{rev}:{ln(rev, path, pattern, **kw)} {what}"


def CR(rev, path, pattern, pattern2, what, **kw):
    a, b = ln(rev, path, pattern, **kw), ln(rev, path, pattern2, **kw)
    return f"{path}@{rev}:{a}-{b} {what}"


def short(rev):
    return rev


# ---------------------------------------------------------------------------------------------- common
def mcore_defaults(rev):
    c = MCORE[rev]
    tc = "megatron/core/transformer/transformer_config.py"
    a = ln(c, tc, r"^    recompute_granularity:", repo="ml")
    b = ln(c, tc, r'self\.recompute_modules = \["core_attn"\]', repo="ml")
    return (f"Megatron-LM {tc}@{c}:{a} recompute_granularity default None; :{b} recompute_modules None -> "
            f"['core_attn'] (only when left None, used only with granularity 'selective')")


def comm_default(rev):
    p = "src/megatron/bridge/training/comm_overlap.py"
    return C(rev, p, r"comm_overlap_cfg\.overlap_moe_expert_parallel_comm = False",
             "overlap_moe_expert_parallel_comm defaults to False unless the user CommOverlapConfig sets True")


def flex_helper(rev, backend):
    p = "src/megatron/bridge/training/flex_dispatcher_backend.py"
    chk = C(rev, p, rf'(el)?if moe_flex_dispatcher_backend == "{backend}"', f"apply_flex_dispatcher_backend: {backend} "
            "branch (GPU check: " + ("major in [8,9,10], i.e. GB200/GB300/B300 pass" if backend == "hybridep" and rev not in ("v0.2.0", "4a82e1651") else
                                   "device name in ['NVIDIA GB200','NVIDIA GB300'] only" if backend == "hybridep" else
                                   "Ampere/Hopper or B200/B300 name") + ")")
    st = C(rev, p, r'model_config\.moe_token_dispatcher_type = "flex"', "-> moe_token_dispatcher_type='flex', "
           "moe_shared_expert_overlap=False")
    return f"{chk}; {st}"


DS_LIB = {"v0.3.0": "src/megatron/bridge/recipes/deepseek/deepseek_v3.py"}


def ds_layout_map(rev, key):
    """citation of the DeepSeek-V3 library layout_map entry (pp, vp) and the MTP setting."""
    p = ("src/megatron/bridge/recipes/deepseek/h100/deepseek_v3.py" if rev in ("v0.6.0", "79308d0d9")
         else "src/megatron/bridge/recipes/deepseek/deepseek_v3.py")
    k = re.escape(f"({key[0]}, {key[1]}):")
    if rev in ("a28844195", "v0.2.0", "4a82e1651"):
        return C(rev, p, k, f"layout_map{key}", after=r"(layout_map|map_pp_vp_to_layout) = \{")
    return C(rev, p, k, f"layout_map{key}", after=r"def set_deepseek_v3_pipeline_model_parallel_layout")


def ds_mtp(rev):
    if rev in ("v0.6.0", "79308d0d9"):
        return C(rev, "src/megatron/bridge/recipes/deepseek/h100/deepseek_v3.py", r"cfg\.model\.mtp_num_layers = 1",
                 "mtp_num_layers=1 (last stage 'mL')", after=r"^def deepseek_v3_pretrain_1024gpu_h100_bf16_config",
                 before=r"^def ")
    if rev == "v0.3.0":
        return C(rev, "src/megatron/bridge/recipes/deepseek/deepseek_v3.py", r"mtp_num_layers: Optional\[int\] = 1",
                 "mtp_num_layers=1 (last stage 'mL')", after=r"^def _deepseek_v3_common")
    return C(rev, "src/megatron/bridge/recipes/deepseek/deepseek_v3.py", r"cfg\.model\.mtp_num_layers = 1",
             "mtp_num_layers=1 (last stage 'mL')", after=r"^def deepseek_v3_pretrain_config\(", before=r"^def ")


LAYOUT_STR = {(4, 4): "Et*4|(t*4|)*14tmL", (16, 1): "Et*4|(t*4|)*14tmL", (8, 1): "Et*8|(t*8|)*6t*5mL"}


def blank():
    return {"recompute": None, "recompute_modules": None, "recompute_num_layers": None, "recompute_method": None,
            "moe_dispatcher": None, "flex_backend": None, "ep_comm_overlap": None, "cpu_offloading_num_layers": None,
            "pipeline_layout": None, "capacity_factor": None}


def preset_cite(rev, path, out, field, what=None):
    val, src, where = out[field]
    return f"{src} {field}={val!r}" + (f" ({where})" if where != "WorkloadBaseConfig default" else " (WorkloadBaseConfig default)") \
        + (f" {what}" if what else "")


# ------------------------------------------------------------------------------------------ 25.09 (YAML)
def era_2509(r, g):
    rid = r["id"]
    rev = "a28844195"
    rs = "scripts/performance/run_script.py"
    hp = "scripts/performance/utils/helpers.py"
    d = blank()
    src = []
    notes = []
    conf = "high"
    src.append(C(rev, rs, r"apply_perf_matrix_overrides\(yaml_overrides_omega", "perf_matrix applied after the YAML ConfigContainer merge (:%s)" % ln(rev, rs, r"apply_overrides\(recipe, final_overrides_as_dict")))
    src.append(CR(rev, hp, r"^def set_recompute_overrides", r"recipe\.model\.cpu_offloading_num_layers = cpu_offloading_num_layers",
                  "set_recompute_overrides: only perf_matrix recompute_num_layers / cpu_offloading_num_layers (none in these presets)"))
    d["capacity_factor"] = {"moe_expert_capacity_factor": 1.0, "moe_pad_expert_input_to_capacity": True}
    tdrop = C(rev, "src/megatron/bridge/training/utils/moe_token_drop.py", r"moe_expert_capacity_factor: float = 1\.0",
              "apply_moe_token_drop defaults capacity 1.0") + "; " + C(rev, "src/megatron/bridge/training/utils/moe_token_drop.py",
              r"moe_pad_expert_input_to_capacity: bool = True", "pad=True") + "; " + C(rev, "src/megatron/bridge/training/utils/moe_token_drop.py",
              r'assert model_provider\.moe_token_dispatcher_type in \(', "asserts the alltoall dispatcher")
    d["moe_dispatcher"] = "alltoall"
    d["ep_comm_overlap"] = False
    if "deepseekv3" in rid:
        yml = "scripts/performance/configs/deepseek/deepseek_v3_llm_pretrain.yaml"
        d["recompute"] = "selective"
        d["recompute_modules"] = ["mla_up_proj"]
        d["pipeline_layout"] = LAYOUT_STR[(4, 4)]
        src += [C(rev, yml, r'recompute_granularity: "selective"', "recompute_granularity selective (ConfigContainer.model)"),
                C(rev, rs, r'use_tokendrop = bool\(args\.gpu\.lower\(\) in \["b200", "gb200"\]\)', "GB200 defaults to token drop")
                + "; " + C(rev, rs, r"enable_deepep = False", "token drop disables DeepEP"),
                C(rev, rs, r'recipe\.model\.recompute_modules = \["mla_up_proj"\]', "GB200 + token drop: recompute_modules=['mla_up_proj']",
                  after=r'if args\.gpu\.lower\(\) == "gb200":'),
                C(rev, rs, r"recipe\.comm_overlap\.overlap_moe_expert_parallel_comm = False", "non-H100: EP overlap off")
                + "; " + C(rev, rs, r"recipe\.model\.moe_shared_expert_overlap = True", "shared-expert overlap on instead"),
                C(rev, rs, r'pp_vp_map = \{', "GB200 pp4/vp4 passed to the recipe") + "; " + C(rev, rs, r"layout = \"Et\|\(tt\|\)\*30mL\" if", "layout None off H100"),
                ds_layout_map(rev, (4, 4)) + " = [[E,t*4],[t*4]x14,[t,mtp,loss]] ('Et*4|(t*4|)*14tmL')",
                C(rev, "src/megatron/bridge/recipes/deepseek/deepseek_v3.py", r"mtp_num_layers: Optional\[int\] = 1,", "mtp 1", after=r"^def pretrain_config\("),
                C(rev, "src/megatron/bridge/models/deepseek/deepseek_provider.py", r'moe_token_dispatcher_type: str = "alltoall"', "DeepSeekV3Provider dispatcher"),
                C(rev, rs, r"recipe\.model = apply_moe_token_drop\(recipe\.model\)", "token drop", nth=0),
                tdrop]
        y0, y1 = ln(rev, yml, r"^  gb200:"), ln(rev, yml, r"^      fp8_mx:", after=r"^  gb200:")
        z0, z1 = ln("7e442b6a0", yml, r"^  gb200:"), ln("7e442b6a0", yml, r"^      fp8_mx:", after=r"^  gb200:")
        notes.append(f"preset perf_matrix.gb200.num_gpus_256 ({yml}@a28844195:{y0}-{y1}, same values @7e442b6a0:{z0}-{z1}): "
                     "tp1 pp4 vp4 ep64 mbs1 gbs2048 = the row")
        pm = True
    else:
        big = "qwen3235b" in rid
        yml = "scripts/performance/configs/qwen3/qwen3_%s_llm_pretrain.yaml" % ("235b_a22b" if big else "30b_a3b")
        lib = "src/megatron/bridge/recipes/qwen/qwen3_%s.py" % ("235b_a22b" if big else "30b_a3b")
        d["recompute"] = "none"
        src += [CR(rev, yml, r"recompute_granularity: null", r"recompute_num_layers: null",
                   "recompute_granularity/method/num_layers null (merged over the recipe by apply_overrides)")]
        if not big:
            src.append(CR(rev, lib, r'model_cfg\.recompute_granularity = "full"', r"model_cfg\.recompute_num_layers = 1",
                          "the library recipe's full/uniform/1 recompute, which the YAML nulls undo"))
            src.append(C(rev, rs, r"recipe\.model = apply_moe_token_drop\(recipe\.model\)", "token drop (always for Qwen3-30B-A3B)",
                         after=r'args\.model_size == "30b_a3b"', before=r"elif args\.model_name"))
        else:
            src.append(C(rev, lib, r"account_for_embedding_in_pipeline_split=True", "account_for_embedding/loss_in_pipeline_split=True (inert at PP1)"))
            src.append(CR("7e442b6a0", "src/megatron/bridge/recipes/qwen/qwen3_moe.py", r'"account_for_embedding_in_pipeline_split": True', r'"account_for_loss_in_pipeline_split": True',
                          "same flags in main's qwen3_235b_a22b_pretrain_config"))
            src.append(C(rev, rs, r"recipe\.model = apply_moe_token_drop\(recipe\.model\)", "token drop (always for Qwen3-235B-A22B)",
                         after=r'args\.model_size == "235b_a22b"', before=r"else:"))
            notes.append("the recipe's account_for_embedding/loss_in_pipeline_split=True have no effect at PP 1")
        src.append(C(rev, "src/megatron/bridge/models/qwen/qwen_provider.py", r'moe_token_dispatcher_type: str = "alltoall"',
                     "Qwen3MoEModelProvider dispatcher alltoall"))
        src.append(comm_default(rev) + " (CommOverlapConfig(tp_comm_overlap=True) leaves overlap_moe_expert_parallel_comm None: run_script.py)")
        src.append(tdrop)
        pm = True
        y0, y1 = ln(rev, yml, r"^  gb200:"), ln(rev, yml, r"^      fp8_mx:", after=r"^  gb200:", before=r"^  [a-z0-9]+:$")
        if big:
            z0, z1 = ln("7e442b6a0", yml, r"^  gb200:"), ln("7e442b6a0", yml, r"^      fp8_mx:", after=r"^  gb200:", before=r"^  [a-z0-9]+:$")
            ztp = ln("7e442b6a0", yml, r"^        tp: 2", after=r"^  gb200:", before=r"^  b200:")
            atp = ln(rev, yml, r"^        tp: 1", after=r"^  gb200:", before=r"^  b200:")
            ztd = ln("7e442b6a0", rs, r"recipe\.model = apply_moe_token_drop\(recipe\.model\)", after=r'args\.model_size == "235b_a22b"', before=r"else:")
            notes.append(f"the row's tp2/pp1/ep64/mbs1/gbs1024 is perf_matrix.gb200.num_gpus_64 at main@7e442b6a0 "
                         f"({yml}@7e442b6a0:{z0}-{z1}, tp 2 at :{ztp}) and v0.1.0rc3; a28844195 itself has tp1/pp8/ep8 "
                         f"(@a28844195:{atp}-). The MoE knobs read here are the same at both: the YAML recompute nulls, "
                         f"run_script.py apply_moe_token_drop (@7e442b6a0:{ztd}), the alltoall provider default, no EP overlap")
        else:
            notes.append(f"preset perf_matrix.gb200.num_gpus_8 ({yml}@a28844195:{y0}-{y1}, same values @7e442b6a0): tp1 pp1 ep8 mbs4 gbs512 = the row")
    src.append(C(rev, hp, r"recipe\.model\.recompute_granularity = \"full\"", "full recompute only when a perf_matrix recompute_num_layers is given (none here)"))
    src.append(mcore_defaults(rev))
    notes.append("25.09 ran Bridge 0.1.0rc3 (YAML perf matrix); read at r0.1.0@a28844195 (cherry-pick of the 25.09 perf scripts); "
                 "capacity factor 1.0 with padding = token-drop run (the table's tokendrop rows)")
    return d, src, notes, conf, pm


# ------------------------------------------------------------------------------------------ 25.11 (v0.2.0)
def era_2511(r, g):
    rid = r["id"]
    f = r["fixed"]
    rev = "v0.2.0" if g["revision"].startswith("v0.2.0") else "4a82e1651"
    hp = "scripts/performance/utils/helpers.py"
    d = blank()
    src, notes = [], []
    conf = "high"
    pm = True
    rec_helper = CR(rev, hp, r"^def set_recompute_overrides", r"recipe\.model\.recompute_modules = recompute_modules",
                    "set_recompute_overrides (v0.2.0 era) sets recompute_modules only, the granularity is the recipe's")
    a2a = C(rev, hp, r"if settings\.moe_a2a_overlap:", "EP overlap only when the preset's moe_a2a_overlap is True")
    if "deepseekv3" in rid:
        fam = "scripts/performance/configs/deepseek/workload_base_configs.py"
        perf = "scripts/performance/configs/deepseek/deepseek_llm_pretrain.py"
        gpu = "gb300" if "gb300" in rid else "gb200"
        base = "DEEPSEEK_V3_%s_BASE_CONFIG" % gpu.upper()
        d["recompute"] = "selective"
        src.append(C(rev, perf, r'cfg\.model\.recompute_granularity = "selective"', "set_deepseek_v3_common_configs: selective"))
        src.append(rec_helper)
        if rev == "4a82e1651":
            if gpu == "gb300":
                mods = ["mlp", "moe_act"]
                src.append(C(rev, fam, r'recompute_modules=\["mlp", "moe_act"\]', f"{base}: recompute_modules (6b296ac10)"))
                src.append(C(rev, fam, r"pipeline_model_parallel_size=2,", f"{base}: pp2", after=r"^DEEPSEEK_V3_GB300_BASE_CONFIG = ", before=r"^\)"))
                d["pipeline_layout"] = "Et*3|(t*4|)*14ttL"
                src.append(C(rev, perf, r'layout="Et\*3\|\(t\*4\|\)\*14ttL"', "layout passed to the recipe (no MTP)", after=r"^def deepseek_v3_gb300_config", before=r"^def "))
                src.append(C(rev, perf, r"mtp_num_layers=None", "MTP off ('w/o MTP')", after=r"^def deepseek_v3_gb300_config", before=r"^def "))
                conf = "medium"
                va = ln("0d8e0714c", "megatron/core/transformer/transformer_config.py", r"assert self\.virtual_pipeline_model_parallel_size == detected_vpp_size", repo="ml")
                notes.append("DEEPSEEK_V3_GB300_BASE_CONFIG@4a82e1651 matches the printed pp2/vp4/ep32/gbs4096, but its layout "
                             f"'Et*3|(t*4|)*14ttL' has 16 stages, i.e. VP 8 on PP 2, which Megatron-Core (megatron/core/transformer/transformer_config.py@0d8e0714c:{va}, "
                             "the asserted VP-vs-layout check) rejects with the preset's VP 4: the run must have used VP 8 or another "
                             "layout, so the printed VP (and with it the layout) is uncertain; the recompute modules also changed on "
                             "this branch within a day ([] d19cb73c8, ['mlp'] 5df97522b, ['mlp','moe_act'] 6b296ac10..4a82e1651)")
            else:
                mods = ["mla_up_proj"]
                src.append(C(rev, fam, r'recompute_modules=\["mla_up_proj"\]', f"{base}: recompute_modules", after=r"^DEEPSEEK_V3_GB200_BASE_CONFIG = ", before=r"^\)"))
                d["pipeline_layout"] = "Et*3|(t*4|)*14ttL"
                src.append(C(rev, perf, r'layout="Et\*3\|\(t\*4\|\)\*14ttL"', "layout passed to the recipe (no MTP; 16 stages = PP4 x VP4)", after=r"^def deepseek_v3_gb200_config", before=r"^def "))
                src.append(C(rev, perf, r"mtp_num_layers=None", "MTP off ('w/o MTP')", after=r"^def deepseek_v3_gb200_config", before=r"^def "))
        else:  # v0.2.0 GB200 FP8-MX: printed layout is in no preset
            mods = ["mla_up_proj"]
            src.append(C(rev, fam, r'recompute_modules=\["mla_up_proj"\]', f"{base}: recompute_modules", after=r"^DEEPSEEK_V3_GB200_BASE_CONFIG = ", before=r"^\)"))
            conf = "medium"
            pm = False
            lm0 = ln(rev, "src/megatron/bridge/recipes/deepseek/deepseek_v3.py", r"layout_map = \{")
            lm1 = ln(rev, "src/megatron/bridge/recipes/deepseek/deepseek_v3.py", r"model_cfg\.pipeline_model_parallel_layout = layout_map\[")
            notes.append("printed pp8/vp4/ep32/gbs4096 is in no committed preset (graphs file: searched all refs); "
                         "DEEPSEEK_V3_GB200_FP8_MX_BASE_CONFIG@v0.2.0 is pp4/vp4/ep64/gbs2048 (same at gaod/r0.2.0_test@4a82e1651 but gbs4096). "
                         "The MoE knobs (selective ['mla_up_proj'], HybridEP, no EP overlap) are the same in both; the pipeline "
                         f"layout is not determinable: v0.2.0's layout_map has no (8, 4) entry (src/megatron/bridge/recipes/deepseek/deepseek_v3.py@v0.2.0:{lm0}-{lm1}) and "
                         "4a82e1651's 'Et*3|(t*4|)*14ttL' gives VP 2 on PP 8")
        d["recompute_modules"] = mods
        d["moe_dispatcher"] = "flex"
        d["flex_backend"] = "hybridep"
        d["ep_comm_overlap"] = False
        out, chain = resolve(rev, fam, base)
        src.append(preset_cite(rev, fam, out, "moe_flex_dispatcher_backend"))
        src.append(preset_cite(rev, fam, out, "moe_a2a_overlap"))
        src.append(C(rev, perf, r"moe_flex_dispatcher_backend=base_cfg\.moe_flex_dispatcher_backend", "passed to the recipe",
                     after=rf"^def deepseek_v3_{gpu}_config", before=r"^def "))
        src.append(C(rev, "src/megatron/bridge/recipes/deepseek/deepseek_v3.py", r"apply_flex_dispatcher_backend\(model_cfg, moe_flex_dispatcher_backend\)",
                     "library recipe applies it", after=r"^def _deepseek_v3_common"))
        src.append(flex_helper(rev, "hybridep"))
        src.append(a2a)
        src.append(comm_default(rev))
    elif "gptoss" in rid:
        fam = "scripts/performance/configs/gpt_oss/workload_base_configs.py"
        perf = "scripts/performance/configs/gpt_oss/gpt_oss_llm_pretrain.py"
        lib = "src/megatron/bridge/recipes/gpt_oss/gpt_oss.py"
        gpu = "gb300" if "gb300" in rid else "gb200"
        base = "GPT_OSS_120B_%s_BF16_BASE_CONFIG" % gpu.upper()
        out, chain = resolve(rev, fam, base)
        d["recompute"] = "none"
        d["ep_comm_overlap"] = False
        src.append(rec_helper)
        src.append(C(rev, "src/megatron/bridge/models/gpt_oss/gpt_oss_provider.py", r'moe_token_dispatcher_type: str = "alltoall"', "GPTOSSProvider dispatcher"))
        src.append(C(rev, perf, r"moe_flex_dispatcher_backend=base_cfg\.moe_flex_dispatcher_backend", "preset backend passed to the recipe",
                     after=rf"^def gpt_oss_120b_{gpu}_config", before=r"^def "))
        src.append(C(rev, lib, r"apply_flex_dispatcher_backend\(model_cfg, moe_flex_dispatcher_backend\)", "library applies it (1bad40c8f)"))
        if gpu == "gb300":
            d["moe_dispatcher"] = "alltoall"
            src.append(preset_cite(rev, fam, out, "moe_flex_dispatcher_backend", "-> apply_flex_dispatcher_backend(None) skips ('Not a valid flex dispatcher backend')"))
            src.append(preset_cite(rev, fam, out, "recompute_modules"))
        else:
            d["moe_dispatcher"] = "flex"
            d["flex_backend"] = "hybridep"
            src.append(preset_cite(rev, fam, out, "moe_flex_dispatcher_backend"))
            src.append(flex_helper(rev, "hybridep"))
            src.append(preset_cite(rev, fam, out, "recompute_modules", "set by set_recompute_overrides but inert"))
            conf = "medium"
            h0 = ln(rev, hp, r"^def set_recompute_overrides")
            h1 = ln(rev, hp, r"recipe\.model\.recompute_modules = recompute_modules")
            notes.append("the preset sets recompute_modules=['layernorm','moe_act'] but at this revision set_recompute_overrides "
                         f"({hp}@{rev}:{h0}-{h1}, same on the v0.2.0 tag) does not set recompute_granularity and neither the "
                         "GPT-OSS recipe (recipes/gpt_oss/gpt_oss.py@4a82e1651) nor the perf recipe does, so Megatron-Core's "
                         "granularity stays None and nothing is recomputed (v0.3.0 later made recompute_modules imply 'selective')")
        src.append(a2a + " (preset: %r)" % out["moe_a2a_overlap"][0])
        src.append(comm_default(rev))
    else:  # Qwen3
        fam = "scripts/performance/configs/qwen3/workload_base_configs.py"
        perf = "scripts/performance/configs/qwen3/qwen3_llm_pretrain.py"
        lib = "src/megatron/bridge/recipes/qwen/qwen3_moe.py"
        big = "qwen3235b" in rid
        gpu = "gb300" if "gb300" in rid else "gb200"
        prec = "BF16" if r["precision"] == "bf16" else "FP8_MX"
        base = "QWEN3_%s_%s_%s_BASE_CONFIG" % ("235B_A22B" if big else "30B_A3B", gpu.upper(), prec)
        out, chain = resolve(rev, fam, base)
        d["recompute"] = "none"
        d["moe_dispatcher"] = "flex"
        d["flex_backend"] = "hybridep"
        d["ep_comm_overlap"] = False
        src.append(CR(rev, perf, r"cfg\.model\.recompute_granularity = None", r"cfg\.model\.recompute_num_layers = None",
                      "set_qwen3_common_configs: no recompute", after=r"^def set_qwen3_common_configs"))
        if not big:
            src.append(C(rev, lib, r'"enable_recompute": True', "library 30B full recompute, undone by the above"))
        src.append(preset_cite(rev, fam, out, "recompute_modules"))
        src.append(preset_cite(rev, fam, out, "moe_flex_dispatcher_backend"))
        src.append(C(rev, perf, r"moe_flex_dispatcher_backend=base_cfg\.moe_flex_dispatcher_backend", "passed to the recipe",
                     after=rf"^def qwen3_{'235b_a22b' if big else '30b_a3b'}_{gpu}_config", before=r"^def "))
        src.append(C(rev, lib, r"apply_flex_dispatcher_backend\(model_cfg, moe_flex_dispatcher_backend\)", "library applies it", nth=0))
        src.append(flex_helper(rev, "hybridep"))
        src.append(preset_cite(rev, fam, out, "moe_a2a_overlap"))
        src.append(a2a)
        src.append(comm_default(rev))
        if big:
            d["pipeline_layout"] = "account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True"
            src.append(CR(rev, lib, r'"account_for_embedding_in_pipeline_split": True', r'"account_for_loss_in_pipeline_split": True',
                          "Qwen3-235B library recipe: embedding/loss counted as pipeline layers (no explicit layout)"))
        ps = dict(tp=out["tensor_model_parallel_size"][0], pp=out["pipeline_model_parallel_size"][0],
                  vp=out["virtual_pipeline_model_parallel_size"][0], ep=out["expert_model_parallel_size"][0],
                  mbs=out["micro_batch_size"][0], gbs=out["global_batch_size"][0], n=out["num_gpus"][0])
        rowp = dict(tp=f["tp"], pp=f["pp"], vp=(f.get("vpp") if f.get("vpp", 1) != 1 else None), ep=f["ep"],
                    mbs=f["micro_batch"], gbs=f["global_batch"], n=int(r["cluster"].split("x")[1]))
        mism = {k: (rowp[k], ps[k]) for k in ps if ps[k] != rowp[k]}
        if mism:
            pm = False
            conf = "medium"
            extra = ""
            if big and gpu == "gb300":
                o2, _ = resolve("52a31ded1", "scripts/performance/configs/qwen/qwen3_workload_base_configs.py", "QWEN3_235B_A22B_PRETRAIN_CONFIG_GB300_BF16_V2")
                extra = ("; the printed layout is exactly main@52a31ded1 QWEN3_235B_A22B_PRETRAIN_CONFIG_GB300_BF16_V2 "
                         f"(tp1 pp4 vp12 ep16 mbs2 gbs8192 on 256), whose knobs agree: {preset_cite('52a31ded1', 'scripts/performance/configs/qwen/qwen3_workload_base_configs.py', o2, 'moe_flex_dispatcher_backend')}, "
                         f"no recompute_modules / moe_a2a_overlap, "
                         + C("52a31ded1", "scripts/performance/configs/qwen/qwen3_llm_pretrain.py", r"cfg\.model\.recompute_granularity = None",
                             "no recompute", after=r"^def set_qwen3_common_configs"))
                conf = "high"
            notes.append(f"preset {base}@{rev} differs from the printed layout on {sorted(mism)} (row, preset) {mism}; the MoE "
                         f"knobs come from the preset/recipe family, not from the layout{extra}")
    if "deepseekv3" in rid or "gptoss" in rid:
        ps_out, _ = resolve(rev, fam, base)
        ps = dict(tp=ps_out["tensor_model_parallel_size"][0], pp=ps_out["pipeline_model_parallel_size"][0],
                  vp=ps_out["virtual_pipeline_model_parallel_size"][0], ep=ps_out["expert_model_parallel_size"][0],
                  mbs=ps_out["micro_batch_size"][0], gbs=ps_out["global_batch_size"][0], n=ps_out["num_gpus"][0])
        rowp = dict(tp=f["tp"], pp=f["pp"], vp=(f.get("vpp") if f.get("vpp", 1) != 1 else None), ep=f["ep"],
                    mbs=f["micro_batch"], gbs=f["global_batch"], n=int(r["cluster"].split("x")[1]))
        mism = {k: (rowp[k], ps[k]) for k in ps if ps[k] != rowp[k]}
        if mism:
            pm = False
            if not any("printed pp8/vp4" in n for n in notes):
                notes.append(f"preset {base}@{rev} differs from the printed layout on {mism} (row, preset)")
        if "gptoss" in rid:
            notes.append("seq_len 8192 from set_gpt_oss_common_configs@4a82e1651 (6b296ac10)")
    src.append(mcore_defaults(rev))
    notes.insert(0, f"25.11 (Bridge 0.2.0); preset {g['preset']} read at {rev}")
    return d, src, notes, conf, pm


# --------------------------------------------------------------------------- 26.02 .. 26.06.01 (presets)
FAMF = {"deepseek": "scripts/performance/configs/deepseek/deepseek_workload_base_configs.py",
        "gpt_oss": "scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py",
        "qwen": "scripts/performance/configs/qwen/qwen3_workload_base_configs.py"}
PERF = {"deepseek": "scripts/performance/configs/deepseek/deepseek_llm_pretrain.py",
        "gpt_oss": "scripts/performance/configs/gpt_oss/gpt_oss_llm_pretrain.py",
        "qwen": "scripts/performance/configs/qwen/qwen3_llm_pretrain.py"}
OV = "scripts/performance/utils/overrides.py"


def era_presets(r, g):
    rid = r["id"]
    f = r["fixed"]
    rev = g["revision"].split()[0]
    if rev.startswith("r0.3.0@"):
        rev = rev.split("@")[1]
    preset = g["preset"]
    fam = "deepseek" if "DEEPSEEK" in preset else "gpt_oss" if "GPT_OSS" in preset else "qwen"
    gpu = r["cluster"].split("x")[0]
    out, chain = resolve(rev, FAMF[fam], preset)
    d = blank()
    src, notes = [], []
    conf = "high"
    chain_s = " <- ".join(f"{n}@{ln_}" for n, _, ln_ in chain)
    notes.append(f"preset chain {FAMF[fam]}@{rev}: {chain_s}")
    # parallelism
    ps = dict(tp=out["tensor_model_parallel_size"][0], pp=out["pipeline_model_parallel_size"][0],
              vp=out["virtual_pipeline_model_parallel_size"][0], ep=out["expert_model_parallel_size"][0],
              mbs=out["micro_batch_size"][0], gbs=out["global_batch_size"][0], n=out["num_gpus"][0])
    rowp = dict(tp=f["tp"], pp=f["pp"], vp=(f.get("vpp") if f.get("vpp", 1) != 1 else None), ep=f["ep"],
                mbs=f["micro_batch"], gbs=f["global_batch"], n=int(r["cluster"].split("x")[1]))
    if ps["vp"] == 1:
        ps["vp"] = None
    mism = {k: (rowp[k], ps[k]) for k in ps if ps[k] != rowp[k]}
    pm = not mism
    model_fn = {"deepseek": "deepseek_v3", "gpt_oss": "gpt_oss_120b",
                "qwen": "qwen3_235b_a22b" if "235B" in preset else "qwen3_30b_a3b"}[fam]
    fn_re = rf"^def {model_fn}_pretrain_config_{gpu}\("
    perf = PERF[fam]
    v03 = rev in ("v0.3.0",)
    v031 = rev in ("v0.3.1", "904597bd3")
    v04 = rev in ("v0.4.0", "v0.4.2")
    v05 = rev in ("v0.5.0", "v0.5.1", "c14643cdb")
    rec_ov = CR(rev, OV, r"^def _set_recompute_overrides", r'recipe\.model\.recompute_granularity = "selective"',
                "_set_recompute_overrides: preset recompute_modules (not None) -> recompute_modules and granularity 'selective'")
    a2a_ov = C(rev, OV, r"recipe\.comm_overlap\.overlap_moe_expert_parallel_comm = True",
               "_set_moe_a2a_overlap_overrides: moe_a2a_overlap True -> overlap_moe_expert_parallel_comm, delay_wgrad_compute, no shared-expert overlap",
               after=r"^def _set_moe_a2a_overlap_overrides")
    swbc = ln(rev, OV, r"^def set_workload_base_configs")
    # ---------------------------------------------------------------- recompute
    rm = out["recompute_modules"][0]
    if fam == "deepseek":
        d["recompute"] = "selective"
        d["recompute_modules"] = list(rm)
        src.append(C(rev, perf, r'cfg\.model\.recompute_granularity = "selective"', "set_deepseek_v3_common_configs: selective",
                     after=r"^def set_deepseek_v3_common_configs"))
        src.append(preset_cite(rev, FAMF[fam], out, "recompute_modules"))
        src.append(rec_ov)
        if rm == []:
            notes.append("recompute_modules=[] with granularity 'selective': Megatron-Core keeps the empty list "
                         "(it defaults only None to ['core_attn']), so nothing is recomputed in effect")
    elif fam == "qwen":
        if rm is None:
            d["recompute"] = "none"
            src.append(CR(rev, perf, r"cfg\.model\.recompute_granularity = None", r"cfg\.model\.recompute_num_layers = None",
                          "set_qwen3_common_configs: no recompute" + (" (over the 30B library recipe's full/uniform/1)" if "30B" in preset else ""),
                          after=r"^def set_qwen3_common_configs"))
            src.append(preset_cite(rev, FAMF[fam], out, "recompute_modules", "-> _set_recompute_overrides leaves it"))
        else:
            raise SystemExit(rid)
    else:  # gpt_oss
        if rm is None:
            d["recompute"] = "none"
            lib = "src/megatron/bridge/recipes/gpt_oss/gpt_oss.py"
            if v03:
                src.append(C(rev, lib, r"^def _gpt_oss_common", "_gpt_oss_common sets no recompute field (Megatron-Core default None)"))
            else:
                src.append(C(rev, lib, r"cfg\.model\.recompute_granularity = None", "library: no recompute",
                             after=r"^def gpt_oss_120b_pretrain_config", before=r"^def "))
            src.append(preset_cite(rev, FAMF[fam], out, "recompute_modules"))
        else:
            d["recompute"] = "selective"
            d["recompute_modules"] = list(rm)
            src.append(preset_cite(rev, FAMF[fam], out, "recompute_modules"))
            src.append(rec_ov)
            if rm == []:
                notes.append("recompute_modules=[] with granularity 'selective': nothing is recomputed in effect "
                             "(Megatron-Core defaults only None to ['core_attn'])")
    if out["recompute_num_layers"][0] is not None or out["cpu_offloading_num_layers"][0] is not None:
        raise SystemExit(rid)
    src.append(preset_cite(rev, FAMF[fam], out, "recompute_num_layers") + ", " +
               preset_cite(rev, FAMF[fam], out, "cpu_offloading_num_layers") + " (no full recompute, no CPU offloading)")
    # ---------------------------------------------------------------- dispatcher
    be = out["moe_flex_dispatcher_backend"][0]
    if v04 or v05:
        if be is not None:
            d["moe_dispatcher"], d["flex_backend"] = "flex", be
            src.append(preset_cite(rev, FAMF[fam], out, "moe_flex_dispatcher_backend"))
            src.append(C(rev, OV, r"apply_flex_dispatcher_backend\(cfg\.model, settings\.moe_flex_dispatcher_backend\)",
                         "set_workload_base_configs applies the preset backend", after=r"^def set_workload_base_configs"))
            src.append(flex_helper(rev, be))
        else:
            d["moe_dispatcher"] = "alltoall"
            src.append(preset_cite(rev, FAMF[fam], out, "moe_flex_dispatcher_backend"))
            src.append(C(rev, OV, r'cfg\.model\.moe_token_dispatcher_type = "alltoall"',
                         "set_workload_base_configs: no preset backend -> alltoall", after=r"^def set_workload_base_configs"))
        src.append(C(rev, OV, r"if args\.moe_flex_dispatcher_backend is not None:", "set_user_overrides: the CLI default (-1, argument_parser.py) "
                     "reaches apply_flex_dispatcher_backend as an invalid backend and changes nothing", after=r"^def set_user_overrides"))
    elif v031:
        if fam == "deepseek":
            d["moe_dispatcher"], d["flex_backend"] = "flex", "hybridep"
            lib = "src/megatron/bridge/recipes/deepseek/deepseek_v3.py"
            src.append(C(rev, lib, r'cfg\.model\.moe_flex_dispatcher_backend = "hybridep"', "library backend hybridep",
                         after=r"^def deepseek_v3_pretrain_config\(", before=r"^def "))
            src.append(C(rev, lib, r"apply_flex_dispatcher_backend\(cfg\.model, cfg\.model\.moe_flex_dispatcher_backend\)",
                         "applied at the end of the library recipe", after=r"^def deepseek_v3_pretrain_config\(", before=r"^def "))
            src.append(flex_helper(rev, "hybridep"))
            src.append(preset_cite(rev, FAMF[fam], out, "moe_flex_dispatcher_backend", "(perf recipe copies it onto cfg.model: same value)"))
        elif fam == "qwen":
            typ_line = ln(rev, perf, r"cfg\.model\.moe_token_dispatcher_type = ", after=fn_re, before=r"^def ")
            typ = show(rev, perf)[typ_line - 1].split("=")[1].strip().strip('"')
            src.append(f"{perf}@{rev}:{typ_line} {model_fn}_pretrain_config_{gpu} sets moe_token_dispatcher_type='{typ}' "
                       f"(v0.3.x set_workload_base_configs never applies a backend: overrides.py@{rev}:{swbc}-)")
            src.append(preset_cite(rev, FAMF[fam], out, "moe_flex_dispatcher_backend", "copied onto cfg.model.moe_flex_dispatcher_backend"))
            d["moe_dispatcher"] = typ
            d["flex_backend"] = be if typ == "flex" else None
            if typ != "flex":
                notes.append(f"cfg.model.moe_flex_dispatcher_backend={be!r} is inert with the alltoall dispatcher")
        else:
            d["moe_dispatcher"] = "alltoall"
            lib = "src/megatron/bridge/recipes/gpt_oss/gpt_oss.py"
            src.append(C(rev, lib, r'cfg\.model\.moe_token_dispatcher_type = "alltoall"', "library dispatcher alltoall",
                         after=r"^def gpt_oss_120b_pretrain_config", before=r"^def "))
            src.append(preset_cite(rev, FAMF[fam], out, "moe_flex_dispatcher_backend"))
            if be is not None:
                conf = "medium"
                notes.append(f"the preset names moe_flex_dispatcher_backend={be!r} (904597bd3 '#2915') but at this revision nothing "
                             "applies it for GPT-OSS: gpt_oss_llm_pretrain.py@904597bd3 passes no backend, set_workload_base_configs "
                             f"(overrides.py@{rev}:{swbc}-) has no apply_flex_dispatcher_backend call (added in v0.4.0) and the library "
                             "recipe leaves moe_token_dispatcher_type='alltoall' without applying its 'deepep' field; read as alltoall, "
                             "but the B300 26.02.01 number may come from a build that applied HybridEP")
    else:  # v0.3.0
        if fam in ("deepseek", "qwen"):
            lib = {"deepseek": "src/megatron/bridge/recipes/deepseek/deepseek_v3.py", "qwen": "src/megatron/bridge/recipes/qwen/qwen3_moe.py"}[fam]
            src.append(C(rev, perf, r"moe_flex_dispatcher_backend=base_cfg\.moe_flex_dispatcher_backend", "preset backend passed to the library recipe",
                         after=fn_re, before=r"^def "))
            src.append(C(rev, lib, r"apply_flex_dispatcher_backend\(model_cfg, moe_flex_dispatcher_backend\)", "library applies it", nth=0))
            src.append(preset_cite(rev, FAMF[fam], out, "moe_flex_dispatcher_backend"))
            if be is not None:
                d["moe_dispatcher"], d["flex_backend"] = "flex", be
                src.append(flex_helper(rev, be))
            else:
                d["moe_dispatcher"] = "alltoall"
                src.append("None -> apply_flex_dispatcher_backend skips; " + C(rev, "src/megatron/bridge/models/qwen/qwen_provider.py",
                           r'moe_token_dispatcher_type: str = "alltoall"', "Qwen3MoEModelProvider dispatcher alltoall"))
        else:
            d["moe_dispatcher"] = "alltoall"
            src.append(C(rev, "src/megatron/bridge/models/gpt_oss/gpt_oss_provider.py", r'moe_token_dispatcher_type: str = "alltoall"',
                         "GPTOSSProvider dispatcher; gpt_oss_llm_pretrain.py@v0.3.0 and recipes/gpt_oss/gpt_oss.py@v0.3.0 apply no flex backend"))
            src.append(preset_cite(rev, FAMF[fam], out, "moe_flex_dispatcher_backend"))
    # ---------------------------------------------------------------- EP overlap
    ov = bool(out["moe_a2a_overlap"][0])
    d["ep_comm_overlap"] = ov
    src.append(preset_cite(rev, FAMF[fam], out, "moe_a2a_overlap"))
    if ov:
        src.append(a2a_ov)
        if fam == "gpt_oss" and rev in ("v0.4.0", "v0.4.2"):
            src.append(C(rev, perf, r"cfg\.comm_overlap = CommOverlapConfig\(", "GB200 perf recipe creates the CommOverlapConfig before set_workload_base_configs",
                         after=fn_re, before=r"^def "))
        if fam == "qwen" and pm is False:
            pass
    else:
        src.append(comm_default(rev))
    # ---------------------------------------------------------------- layout
    if fam == "deepseek":
        if out["pp_layout"][0]:
            d["pipeline_layout"] = out["pp_layout"][0]
            src.append(preset_cite(rev, FAMF[fam], out, "pp_layout"))
            if v03:
                src.append(C(rev, perf, r"layout=base_cfg\.pp_layout", "passed to the recipe", after=fn_re, before=r"^def "))
            else:
                src.append(C(rev, perf, r"cfg\.model\.pipeline_model_parallel_layout = base_cfg\.pp_layout", "set on the model", after=fn_re, before=r"^def "))
        else:
            key = (ps["pp"], ps["vp"] or 1)
            d["pipeline_layout"] = LAYOUT_STR[key]
            if v03:
                src.append(C(rev, perf, r"layout=(None|base_cfg\.pp_layout)", "no preset layout -> library layout_map", after=fn_re, before=r"^def "))
            else:
                src.append(C(rev, perf, r"set_deepseek_v3_pipeline_model_parallel_layout\(cfg\.model\)", "no preset layout -> library layout_map", after=fn_re, before=r"^def "))
            src.append(ds_layout_map(rev, key) + f" ('{LAYOUT_STR[key]}')")
        src.append(ds_mtp(rev))
    elif fam == "qwen" and "235B" in preset:
        d["pipeline_layout"] = "account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True"
        lib = "src/megatron/bridge/recipes/qwen/qwen3_moe.py"
        if v03:
            src.append(CR(rev, lib, r'"account_for_embedding_in_pipeline_split": True', r'"account_for_loss_in_pipeline_split": True',
                          "Qwen3-235B library recipe (no explicit layout)"))
        else:
            src.append(CR(rev, lib, r"cfg\.model\.account_for_embedding_in_pipeline_split = True", r"cfg\.model\.account_for_loss_in_pipeline_split = True",
                          "Qwen3-235B library recipe (no explicit layout)", after=r"^def qwen3_235b_a22b_pretrain_config", before=r"^def "))
    # ---------------------------------------------------------------- full-iteration CG extras (v0.5.x)
    if v05 and out.get("cuda_graph_impl", (None,))[0] == "full_iteration":
        cfl = ln(rev, perf, r"moe_expert_rank_capacity_factor = 1\.5", after=r"^def set_full_iter_cg_configs", before=r"^def ")
        notes.append(f"full-iteration CUDA graph: {perf}@{rev}:{cfl} set_full_iter_cg_configs sets moe_expert_rank_capacity_factor=1.5 "
                     "with moe_pad_experts_for_cuda_graph_inference and moe_paged_stash (a per-rank static-shape buffer, not "
                     "moe_expert_capacity_factor token dropping: capacity_factor stays null); preset cutedsl_fused_grouped_mlp="
                     f"{out['cutedsl_fused_grouped_mlp'][0]!r} (TE op fuser)")
    if mism:
        conf = "low" if fam == "qwen" else "medium"
        notes.append(f"preset parallelism differs from the row on {sorted(mism)} (row, preset) {mism}")
        if rev == "v0.3.1":
            o3, _ = resolve("v0.3.0", FAMF[fam], preset)
            p3 = dict(tp=o3["tensor_model_parallel_size"][0], pp=o3["pipeline_model_parallel_size"][0],
                      vp=o3["virtual_pipeline_model_parallel_size"][0], ep=o3["expert_model_parallel_size"][0],
                      mbs=o3["micro_batch_size"][0], gbs=o3["global_batch_size"][0], n=o3["num_gpus"][0])
            if p3 == rowp:
                notes.append(f"the printed layout is the 26.02 preset {preset}@v0.3.0 (" + preset_cite("v0.3.0", FAMF[fam], o3, "virtual_pipeline_model_parallel_size")
                             + "), which also sets " + preset_cite("v0.3.0", FAMF[fam], o3, "moe_a2a_overlap")
                             + f" and backend {o3['moe_flex_dispatcher_backend'][0]!r}: if the 26.02.01 run used that preset, the EP overlap was ON "
                             "(alltoall, no recompute either way); the v0.3.1 reading (overlap off) is kept, hence low confidence")
    src.append(mcore_defaults(rev))
    notes.insert(0, f"read at {rev}{' (the graphs file revision)'}; layers: {FAMF[fam]} preset -> "
                 f"{perf} {model_fn}_pretrain_config_{gpu} -> {OV} set_workload_base_configs (:{swbc}) -> library recipe")
    return d, src, notes, conf, pm


# ----------------------------------------------------------------------------------------- 26.08 (v0.6.0)
def era_2608(r, g):
    rid = r["id"]
    rev = "v0.6.0"
    preset = g["preset"]
    gpu = r["cluster"].split("x")[0]
    d = blank()
    src, notes = [], []
    conf = "high"
    pm = True
    ov_flat = C(rev, OV, r"if args\.moe_flex_dispatcher_backend is None:", "set_user_overrides: only an explicit --moe_flex_dispatcher_backend "
                "changes the dispatcher (default -1 keeps the recipe's)", after=r"^def set_user_overrides")
    if "deepseekv3" in rid:
        p = f"src/megatron/bridge/perf_recipes/deepseek/{gpu}/deepseek_v3.py"
        cm = "src/megatron/bridge/perf_recipes/deepseek/common.py"
        fn = rf"^def {preset}\("
        d["recompute"] = "selective"
        src.append(C(rev, cm, r'cfg\.model\.recompute_granularity = "selective"', "_deepseek_v3_common: selective"))
        mline = ln(rev, p, r"cfg\.model\.recompute_modules = ", after=fn, before=r"^def ")
        mods = eval(show(rev, p)[mline - 1].split("=", 1)[1].strip())
        d["recompute_modules"] = mods
        src.append(f"{p}@{rev}:{mline} {preset}: recompute_modules={mods!r}")
        if mods == []:
            notes.append("recompute_modules=[] with granularity 'selective': nothing is recomputed in effect")
        d["moe_dispatcher"], d["flex_backend"], d["ep_comm_overlap"] = "flex", "hybridep", True
        src.append(C(rev, p, r"_enable_deepseek_full_iteration_mxfp8\(cfg", "full-iteration MXFP8 helper", after=fn, before=r"^def "))
        src.append(CR(rev, cm, r'cfg\.model\.moe_flex_dispatcher_backend = "hybridep"', r'cfg\.model\.moe_token_dispatcher_type = "flex"',
                      "HybridEP flex dispatcher", after=r"^def _enable_deepseek_full_iteration_mxfp8", before=r"^def "))
        src.append(C(rev, cm, r"cfg\.comm_overlap\.overlap_moe_expert_parallel_comm = True", "EP overlap (delay_wgrad_compute too)",
                     after=r"^def _enable_deepseek_full_iteration_mxfp8", before=r"^def "))
        lay = ln(rev, p, r"set_deepseek_v3_pipeline_model_parallel_layout\(cfg\.model", after=fn, before=r"^def ")
        txt = show(rev, p)[lay - 1]
        if '"' in txt:
            d["pipeline_layout"] = txt.split('"')[1]
            src.append(f"{p}@{rev}:{lay} explicit layout")
        else:
            d["pipeline_layout"] = LAYOUT_STR[(4, 4)]
            src.append(f"{p}@{rev}:{lay} layout from the library map; " + ds_layout_map(rev, (4, 4)) + f" ('{LAYOUT_STR[(4, 4)]}')")
        src.append(ds_mtp(rev))
        cf = ln(rev, cm, r"cfg\.model\.moe_expert_rank_capacity_factor = 1\.5", after=r"^def _enable_deepseek_full_iteration_mxfp8", before=r"^def ")
    elif "gptoss" in rid:
        p = f"src/megatron/bridge/perf_recipes/gpt_oss/{gpu}/gpt_oss.py"
        cm = "src/megatron/bridge/perf_recipes/gpt_oss/common.py"
        fn = rf"^def {preset}\("
        lib = "src/megatron/bridge/recipes/gpt_oss/h100/gpt_oss.py"
        if gpu == "gb200":
            d["recompute"], d["recompute_modules"] = "selective", []
            g1 = ln(rev, p, r'cfg\.model\.recompute_granularity = "selective"', after=fn, before=r"^def ", nth=-1)
            g2 = ln(rev, p, r"cfg\.model\.recompute_modules = \[\]", after=fn, before=r"^def ")
            g0 = ln(rev, p, r'cfg\.model\.recompute_modules = \["layernorm", "moe_act"\]', after=fn, before=r"^def ")
            src.append(f"{p}@{rev}:{g1}-{g2} after the full-iteration helper: granularity 'selective' with recompute_modules=[] "
                       f"(replacing :{g0} ['layernorm','moe_act'])")
            notes.append("recompute_modules=[] with granularity 'selective': nothing is recomputed in effect")
        else:
            d["recompute"] = "none"
            src.append(C(rev, lib, r"cfg\.model\.recompute_granularity = None", "library (gpt_oss_120b_pretrain_config alias of the "
                         "64gpu_h100_bf16 recipe): no recompute, and the GB300 recipe sets none", after=r"^def gpt_oss_120b_pretrain_64gpu_h100_bf16_config", before=r"^def "))
        src.append(C(rev, p, r"_apply_gpt_oss_120b_full_iter_fp8mx_configs\(cfg\)", "full-iteration MXFP8 helper", after=fn, before=r"^def "))
        d["moe_dispatcher"], d["flex_backend"], d["ep_comm_overlap"] = "flex", "hybridep", True
        src.append(C(rev, cm, r'cfg\.model\.moe_flex_dispatcher_backend = "hybridep"', "HybridEP", after=r"^def _apply_gpt_oss_120b_full_iter_fp8mx_configs", before=r"^def "))
        src.append(C(rev, cm, r'cfg\.model\.moe_token_dispatcher_type = "flex"', "flex dispatcher", after=r"^def _apply_gpt_oss_120b_full_iter_fp8mx_configs", before=r"^def "))
        src.append(C(rev, cm, r"cfg\.comm_overlap\.overlap_moe_expert_parallel_comm = True", "EP overlap", after=r"^def _apply_gpt_oss_120b_full_iter_fp8mx_configs", before=r"^def "))
        cf = ln(rev, cm, r"cfg\.model\.moe_expert_rank_capacity_factor = 1\.5", after=r"^def _apply_gpt_oss_120b_full_iter_fp8mx_configs", before=r"^def ")
    else:
        p = f"src/megatron/bridge/perf_recipes/qwen/{gpu}/qwen3_moe.py"
        cm = "src/megatron/bridge/perf_recipes/qwen/common.py"
        fn = rf"^def {preset}\("
        d["recompute"] = "none"
        src.append(CR(rev, p, r"cfg\.model\.recompute_granularity = None", r"cfg\.model\.recompute_num_layers = None", "no recompute",
                      after=fn, before=r"^def "))
        d["moe_dispatcher"], d["flex_backend"], d["ep_comm_overlap"] = "flex", "hybridep", True
        src.append(CR(rev, p, r'cfg\.model\.moe_flex_dispatcher_backend = "hybridep"', r'cfg\.model\.moe_token_dispatcher_type = "flex"',
                      "HybridEP flex dispatcher", after=fn, before=r"^def "))
        src.append(C(rev, cm, r"overlap_moe_expert_parallel_comm=True", "EP overlap (CommOverlapConfig in _enable_hybridep_full_iteration_mxfp8)"))
        if "235b" in preset:
            d["pipeline_layout"] = "account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True"
            lib = "src/megatron/bridge/recipes/qwen/h100/qwen3_moe.py"
            src.append(CR(rev, lib, r"cfg\.model\.account_for_embedding_in_pipeline_split = True", r"cfg\.model\.account_for_loss_in_pipeline_split = True",
                          "library (qwen3_235b_a22b_pretrain_config alias of the 256gpu_h100_bf16 recipe)",
                          after=r"^def qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config", before=r"^def "))
        cf = ln(rev, cm, r"cfg\.model\.moe_expert_rank_capacity_factor = 1\.5", after=r"^def _enable_hybridep_full_iteration_mxfp8", before=r"^def ")
    notes.append(f"full-iteration CUDA graph: {cm}@{rev}:{cf} moe_expert_rank_capacity_factor=1.5 with padded experts and the paged "
                 "stash (static shapes, not token-drop moe_expert_capacity_factor: capacity_factor stays null)")
    # parallelism check from the recipe text
    fnl = ln(rev, p, fn)
    allv = show(rev, p)
    endl = next((i for i in range(fnl, len(allv)) if allv[i].startswith("def ")), len(allv))
    body = allv[fnl - 1: endl]
    vals = {}
    for k, pat in (("tp", r"tensor_model_parallel_size = (\d+)"), ("pp", r"pipeline_model_parallel_size = (\d+)"),
                   ("vp", r"virtual_pipeline_model_parallel_size = (\w+)"), ("ep", r"expert_model_parallel_size = (\d+)"),
                   ("gbs", r"global_batch_size = (\d+)"), ("mbs", r"micro_batch_size = (\d+)")):
        for s in body:
            m = re.search(pat, s)
            if m:
                vals[k] = None if m.group(1) == "None" else int(m.group(1))
                break
    vals.setdefault("vp", None)
    fx = r["fixed"]
    rowp = dict(tp=fx["tp"], pp=fx["pp"], vp=(fx.get("vpp") if fx.get("vpp", 1) != 1 else None), ep=fx["ep"],
                gbs=fx["global_batch"], mbs=fx["micro_batch"])
    mism = {k: (rowp[k], vals.get(k)) for k in rowp if rowp[k] != vals.get(k)}
    m = re.search(r"_(\d+)gpu_", preset)
    if m and int(m.group(1)) != int(r["cluster"].split("x")[1]):
        mism["n"] = (int(r["cluster"].split("x")[1]), int(m.group(1)))
    if mism:
        pm = False
        notes.append(f"recipe parallelism differs from the row: {mism}")
    src.append(ov_flat)
    src.append(mcore_defaults(rev))
    notes.insert(0, f"26.08 flat performance recipe {p}@{rev} {preset} (run_script.py get_perf_recipe_by_name, then CLI/user overrides that leave these knobs)")
    return d, src, notes, conf, pm


# ----------------------------------------------------------------------------------------------- cards
def era_card(r, g):
    rid = r["id"]
    rev = g["revision"].split()[0][:9]
    d = blank()
    src, notes = [], []
    conf = "high"
    pm = True
    meta = "scripts/training/recipe_metadata.py"
    rr = "scripts/training/recipe_runner.py"
    if "h100-qwen330ba3b" in rid:
        p = "src/megatron/bridge/perf_recipes/qwen/h100/qwen3_moe.py"
        lib = "src/megatron/bridge/recipes/qwen/h100/qwen3_moe.py"
        src.append(C(rev, meta, r'"qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config",', "name in BENCHMARK_RECIPE_PRECEDENCE_COLLISIONS")
                   + "; " + C(rev, rr, r"if resolved_benchmark_recipe_metadata\(recipe_name\) is not None:", "load_recipe picks the perf_recipes (benchmark) definition"))
        src.append(C(rev, p, r"cfg = _qwen3_30b_a3b_default_pretrain_config\(\)", "benchmark recipe wraps the library recipe",
                     after=r"^def qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config", before=r"^def "))
        d["recompute"] = "none"
        src.append(CR(rev, lib, r"cfg\.model\.recompute_granularity = None", r"cfg\.model\.recompute_num_layers = None", "no recompute (over the 8-GPU base's full)",
                      after=r"^def qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config", before=r"^def "))
        d["moe_dispatcher"], d["flex_backend"] = "flex", "hybridep"
        src.append(CR(rev, lib, r'cfg\.model\.moe_flex_dispatcher_backend = "hybridep"', r'cfg\.model\.moe_token_dispatcher_type = "flex"', "HybridEP",
                      after=r"^def qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config", before=r"^def "))
        src.append(C(rev, lib, r"apply_flex_dispatcher_backend\(cfg\.model, cfg\.model\.moe_flex_dispatcher_backend\)", "applied (H100: major 9)",
                     after=r"^def qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config", before=r"^def "))
        d["ep_comm_overlap"] = True
        src.append(C(rev, p, r"cfg\.comm_overlap\.overlap_moe_expert_parallel_comm = True", "EP overlap on (delay_wgrad_compute False)",
                     after=r"^def qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config", before=r"^def "))
        notes.append("the library recipe of the same name sets CommOverlapConfig(tp_comm_overlap=True) (no EP overlap) and the "
                     "attribute model.moe_a2a_overlap=False, but train.sh's load_recipe prefers the perf_recipes definition, "
                     "which turns overlap_moe_expert_parallel_comm on")
    elif "gb300-qwen330ba3b" in rid:
        p = "src/megatron/bridge/perf_recipes/qwen/gb300/qwen3_moe.py"
        cm = "src/megatron/bridge/perf_recipes/qwen/common.py"
        fn = r"^def qwen3_30b_a3b_pretrain_8gpu_gb300_fp8mx_config\("
        d["recompute"] = "none"
        src.append(CR(rev, p, r"cfg\.model\.recompute_granularity = None", r"cfg\.model\.recompute_num_layers = None", "no recompute", after=fn, before=r"^def "))
        d["moe_dispatcher"], d["flex_backend"], d["ep_comm_overlap"] = "flex", "hybridep", True
        src.append(CR(rev, p, r'cfg\.model\.moe_flex_dispatcher_backend = "hybridep"', r'cfg\.model\.moe_token_dispatcher_type = "flex"', "HybridEP", after=fn, before=r"^def "))
        src.append(C(rev, cm, r"overlap_moe_expert_parallel_comm=True", "EP overlap (_enable_hybridep_full_iteration_mxfp8)"))
        cf = ln(rev, cm, r"cfg\.model\.moe_expert_rank_capacity_factor = 1\.5", after=r"^def _enable_hybridep_full_iteration_mxfp8", before=r"^def ")
        notes.append(f"full-iteration CUDA graph: {cm}@{rev}:{cf} moe_expert_rank_capacity_factor=1.5 (static shapes, capacity_factor null)")
        pm = False
        q0 = ln(rev, p, r"cfg\.model\.tensor_model_parallel_size = 1", after=fn)
        q1 = ln(rev, p, r"cfg\.train\.micro_batch_size = 8", after=fn)
        notes.append(f"the recipe is the 8-GPU one (tp1 pp1 ep8 mbs8 gbs512, {p}@{rev}:{q0}-{q1}); "
                     "the weak-scaling card runs it on %s GPUs with --global_batch_size %d (512 per 8 GPUs): tp/pp/ep/mbs match, "
                     "num_gpus and gbs are the card's" % (r["cluster"].split("x")[1], r["fixed"]["global_batch"]))
    else:  # DeepSeek-V3 H100 card
        p = "src/megatron/bridge/perf_recipes/deepseek/h100/deepseek_v3.py"
        cm = "src/megatron/bridge/perf_recipes/deepseek/common.py"
        lib = "src/megatron/bridge/recipes/deepseek/h100/deepseek_v3.py"
        fn = r"^def deepseek_v3_pretrain_1024gpu_h100_bf16_config\("
        src.append(C(rev, meta, r'"deepseek_v3_pretrain_1024gpu_h100_bf16_config",', "name in BENCHMARK_RECIPE_PRECEDENCE_COLLISIONS: load_recipe picks perf_recipes"))
        d["recompute"] = "selective"
        src.append(C(rev, cm, r'cfg\.model\.recompute_granularity = "selective"', "_deepseek_v3_common: selective"))
        d["recompute_modules"] = ["mla_up_proj", "mlp"]
        src.append(C(rev, p, r'cfg\.model\.recompute_modules = \["mla_up_proj", "mlp"\]', "recompute_modules", after=fn, before=r"^def "))
        d["moe_dispatcher"], d["flex_backend"] = "flex", "hybridep"
        src.append(C(rev, lib, r'cfg\.model\.moe_flex_dispatcher_backend = "hybridep"', "library backend", after=fn, before=r"^def "))
        src.append(C(rev, lib, r"apply_flex_dispatcher_backend\(cfg\.model, cfg\.model\.moe_flex_dispatcher_backend\)", "applied (H100: major 9)", after=fn, before=r"^def "))
        d["ep_comm_overlap"] = False
        src.append(C(rev, lib, r"cfg\.comm_overlap\.overlap_moe_expert_parallel_comm = False", "no EP overlap (the perf recipe keeps it)", after=fn, before=r"^def "))
        d["pipeline_layout"] = "Et|(tt|)*30mL"
        src.append(C(rev, p, r'set_deepseek_v3_pipeline_model_parallel_layout\(cfg\.model, "Et\|\(tt\|\)\*30mL"\)', "explicit layout", after=fn, before=r"^def "))
        src.append(ds_mtp(rev))
        notes.append("card quote_context says bridge_commit None; read at the graphs file's 79308d0d9")
    src.append(mcore_defaults(rev))
    notes.insert(0, f"verification card; recipe read at {rev} via scripts/training/train.sh -> run_recipe.py load_recipe")
    return d, src, notes, conf, pm


def build():
    rows = {}
    for r in ROWS:
        g = GRAPHS[r["id"]]
        rid = r["id"]
        if rid.startswith("mbridge-card"):
            d, src, notes, conf, pm = era_card(r, g)
        elif rid.startswith("mbridge-25.09"):
            d, src, notes, conf, pm = era_2509(r, g)
        elif rid.startswith("mbridge-25.11"):
            d, src, notes, conf, pm = era_2511(r, g)
        elif rid.startswith("mbridge-26.08"):
            d, src, notes, conf, pm = era_2608(r, g)
        else:
            d, src, notes, conf, pm = era_presets(r, g)
        row = dict(d)
        row["revision"] = g["revision"]
        row["preset"] = g["preset"]
        row["source"] = "; ".join(src)
        row["parallelism_matches"] = pm
        row["confidence"] = conf
        row["note"] = " | ".join(notes)
        rows[rid] = row
    about = ABOUT
    OUT.write_text(json.dumps({"about": about, "rows": rows}, indent=1) + "\n")
    print(f"wrote {OUT} ({len(rows)} rows)")


ABOUT = (
    "The MoE / recompute knobs each held-out Megatron-Bridge mixture-of-experts benchmark row "
    "(published_runs_heldout.json rows needing 'moe' whose id starts 'mbridge-', incl. the verification-card rows) ran, read "
    "from the NVIDIA-NeMo/Megatron-Bridge mirror at the revision and workload preset mbridge_moe_graphs.json resolved for the "
    "row (its 'revision' / 'preset' fields are copied verbatim). Layers read, last writer wins: 25.09 (r0.1.0@a28844195, "
    "cross-checked at main@7e442b6a0): the model's pretrain_config -> run_script.py per-model code (token drop, recompute "
    "modules, EP overlap) -> the YAML ConfigContainer merge -> helpers.py apply_perf_matrix_overrides; 25.11 (v0.2.0 / "
    "gaod/r0.2.0_test@4a82e1651): the library recipe (flex backend applied inside it) -> configs/<family>/<model>_llm_pretrain.py "
    "set_*_common_configs -> helpers.py set_workload_base_configs (there recompute_modules does NOT set the granularity); "
    "26.02-26.06.01 (v0.3.0, v0.3.1, r0.3.0@904597bd3, v0.4.0, v0.4.2, v0.5.0 (= r0.5.0@c14643cdb for these files), v0.5.1): the "
    "*_workload_base_configs.py preset, resolved through its replace()/alias chain by AST (the chain and the line of each "
    "field are cited; a field left unset is the WorkloadBaseConfig default in scripts/performance/utils/utils.py) -> the "
    "per-GPU perf recipe in configs/<family>/*_llm_pretrain.py -> utils/overrides.py set_workload_base_configs "
    "(_set_recompute_overrides: recompute_modules not None => granularity 'selective'; _set_moe_a2a_overlap_overrides; from "
    "v0.4.0 apply_flex_dispatcher_backend of the preset backend, else the alltoall dispatcher) -> set_user_overrides with the "
    "CLI defaults (which change none of these knobs) -> the library recipe's own values where nothing overrides them; 26.08 "
    "(v0.6.0): the flat src/megatron/bridge/perf_recipes/<family>/<gpu>/*.py function named by 'preset' and its helpers; "
    "cards: scripts/training/train.sh -> recipe_runner.load_recipe (the perf_recipes definition wins a name collision). "
    "Conventions: recompute is Megatron-Core recompute_granularity ('none' = None); recompute_modules only for 'selective' "
    "(an explicit [] is kept by Megatron-Core, which defaults only None to ['core_attn']: selective with [] recomputes "
    "nothing); recompute_num_layers / recompute_method only for 'full' (no row runs full recompute); moe_dispatcher is "
    "moe_token_dispatcher_type as it ends up ('flex' only where apply_flex_dispatcher_backend or the recipe sets it; "
    "apply_flex_dispatcher_backend switches to flex only on GPUs its check admits: v0.2.0-era HybridEP only by device name "
    "GB200/GB300, v0.3.0+ HybridEP on compute capability 8/9/10, i.e. GB200/GB300/B300/H100); flex_backend is null unless "
    "the dispatcher is flex (a leftover moe_flex_dispatcher_backend field with alltoall is inert); ep_comm_overlap is "
    "overlap_moe_expert_parallel_comm (Bridge's moe_a2a_overlap), default False in comm_overlap.py; pipeline_layout is the "
    "pipeline_model_parallel_layout string (DeepSeek-V3 list layouts from layout_map written in the same notation, MTP on "
    "the last stage) or the account_for_embedding/loss flags where the recipe splits by them at PP > 1; capacity_factor is "
    "{moe_expert_capacity_factor, moe_pad_expert_input_to_capacity} for token-drop rows only (the full-iteration-graph "
    "recipes' moe_expert_rank_capacity_factor=1.5 is a static-shape buffer, noted, not a capacity factor). Every line "
    "number was looked up in the mirror by pattern (benchmarks/data/heldout_build/mbridge_moe_recipes.py, with mbridge_presets.py); "
    "parallelism_matches compares the preset's tp/pp/vp/ep/mbs/gbs/num_gpus with the row's printed ones."
)

if __name__ == "__main__":
    build()
