"""Megatron-Bridge model verification cards (examples/model_verification_cards/<model>/card.yaml
at Megatron-Bridge 067f987): the measured pre-training performance of a pinned recipe at a
pinned Bridge commit, the configurations the performance-summary tables do not hold.

Of the four catalog MoE models' cards (Qwen3-30B-A3B, Qwen3-235B-A22B, GPT-OSS-120B,
DeepSeek-V3), the `pretrain_performance` and `pretrain_weak_scaling` items number 14. Nine
re-measure a configuration a summary table already holds (the same model, system, GPUs,
precision, TP / PP / EP, micro- and global batch), within 0.1-4% of the table's time: left out.
The other five are read here:
- Qwen3-30B-A3B on 16 H100, BF16 (pretrain_performance.H100);
- Qwen3-30B-A3B's GB300 weak scaling at 32, 128 and 256 GPUs (the 8-GPU point is the 26.08
  table's row);
- DeepSeek-V3 on 1024 H100, BF16 (pretrain_performance.H100): its pipeline layout
  'Et|(tt|)*30mL' fixed as decoder layers per pipeline rank (stage_layers, as
  published_runs_moe.json's 25.09 H100 row of the same layout), its precision-aware optimizer's
  bf16 moments as 8 bytes of state per parameter (optimizer_state_bytes).

Each row fixes what the recipe at the card's commit sets (RECIPES, each fact cited
file:line@commit), as published_runs_moe.json's rows do: layout, batch, precision, the
dispatcher and EP overlap; the CUDA graphs as the other MoE rows carry them (full-iteration
priced, per-layer recorded). The step time is the card's last_10_steps_step_time_ms_avg (the
mean of steps 41-50); its tokens/s/GPU is GBS x seq / (step time x GPUs), not another
measurement.

`python mbridge_cards.py` replaces this module's rows in published_runs_heldout.json in place;
build.py adds them on a full rebuild."""
import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mbridge_moe import DATA, HF_CONFIG, REPO  # noqa: E402

COMMIT = "067f987df03b8355b03192d88d70f1709fedf51a"
FAMILY = "Megatron-Bridge verification cards"

Q30_H100 = "3a9559f01283190bf16a7a592c1e2c35d908c496"
Q30_GB300_WS = "fbb7570cf7eec94fd2e6064454d84f7fad07fbfa"
H100_RECIPE = f"src/megatron/bridge/recipes/qwen/h100/qwen3_moe.py@{Q30_H100}"
GB300_RECIPE = (f"src/megatron/bridge/perf_recipes/qwen/gb300/qwen3_moe.py and "
                f"perf_recipes/qwen/common.py @{Q30_GB300_WS}")

DS_H100 = "79308d0d99fb8c09b3f1a22baa68a4ffa4f4ce1e"
DS_RECIPE = (f"src/megatron/bridge/perf_recipes/deepseek/h100/deepseek_v3.py, "
             f"recipes/deepseek/h100/deepseek_v3.py @{DS_H100} (the card's "
             "verification_environment.bridge_commit; the item names none)")

# (card model, item path, system, GPUs per node, catalog model, precision, recipe facts,
# facts' source[, row fields])
RECIPES = [
    ("qwen3-30b-a3b", ("pretrain_performance", "H100"), "h100", 8, "qwen3-30b-a3b", "bf16",
     {"tp": 1, "pp": 1, "ep": 16, "micro_batch": 1, "global_batch": 1024, "seq_len": 4096,
      "zero": 1, "recompute": "none", "moe_dispatcher": "flex", "ep_comm_overlap": True,
      "cuda_graph": "transformer_engine", "cuda_graph_scope": ["moe_router", "moe_preprocess"],
      "grad_reduce_in_fp32": False},
     f"{H100_RECIPE}: tp 1 (:169), ep 16 (:173), gbs 1024 / mbs 1 (:177-178), no recompute "
     "(:163, over the 8-GPU base's full), moe_flex_dispatcher_backend='hybridep' with "
     "moe_token_dispatcher_type='flex' (:205-206), cuda_graph_impl='transformer_engine' with "
     "scope [moe_router, moe_preprocess] (:213-214), comm_overlap "
     "overlap_moe_expert_parallel_comm (perf_recipes/qwen/h100/qwen3_moe.py:41); "
     "grad_reduce_in_fp32 False (perf_recipes/_common.py:67,112); the distributed optimizer "
     "(ZeRO-1); force load balancing"),
] + [
    ("qwen3-30b-a3b", ("pretrain_weak_scaling", "GB300", n), "gb300", 4, "qwen3-30b-a3b", "mxfp8",
     {"tp": 1, "pp": 1, "ep": 8, "micro_batch": 8, "global_batch": 64 * n, "seq_len": 4096,
      "zero": 1, "cuda_graph": "full_iteration"},
     f"{GB300_RECIPE}: qwen3_30b_a3b_pretrain_8gpu_gb300_fp8mx_config, TP1 / PP1 / EP8 / MBS 8 "
     "as the card's expected result prints them, the global batch from the command line "
     "(--global_batch_size), cuda_graph_impl='full_iteration' with "
     "moe_expert_rank_capacity_factor=1.5 and moe_paged_stash (static shapes: no "
     "device-to-host sync of the token counts), HybridEP and the EP overlap, which, as for the "
     "26.06-26.08 table rows of this recipe, stay the planner's choice (EP overlap priced off: "
     "mbridge_moe.py's docstring); the distributed optimizer (ZeRO-1)")
    for n in (32, 128, 256)
] + [
    ("deepseek-v3", ("pretrain_performance", "H100"), "h100", 8, "deepseek-v3", "bf16",
     {"tp": 2, "pp": 8, "vpp": 4, "ep": 64, "sequence_parallel": True, "micro_batch": 1,
      "global_batch": 16384,
      "seq_len": 4096, "zero": 1, "stage_layers": [7, 8, 8, 8, 8, 8, 8, 6],
      "recompute": "selective", "recompute_modules": ["mla_up_proj", "mlp"],
      "moe_dispatcher": "flex", "ep_comm_overlap": False, "tp_comm_overlap": False,
      "grad_reduce_in_fp32": False, "optimizer_state_bytes": 8.0},
     f"{DS_RECIPE}: tp 2, pp 8, vp 4, ep 64, sequence parallel (perf_recipes :34-39), gbs 16384 "
     "/ mbs 1 (:40-41), pipeline layout 'Et|(tt|)*30mL' (:48): per virtual stage [1, 2 x 30, "
     "0 + MTP + loss] decoder layers, per pipeline rank of 4 virtual stages [7, 8, 8, 8, 8, 8, "
     "8, 6]; selective recompute of mla_up_proj and mlp (:43, perf_recipes/deepseek/common.py:"
     "35); moe_token_dispatcher_type 'flex' with HybridEP (recipes :159-160), the EP overlap "
     "off (recipes :230, the perf recipe does not set it), no TP overlap (:228), no CUDA "
     "graphs (:179); the distributed optimizer (:245), precision-aware with fp32 main params "
     "and bf16 moments (:221-224: 4 + 2 + 2 bytes per parameter); grad_reduce_in_fp32 False "
     "(perf_recipes/_common.py:74,122); mtp_num_layers 1 (recipes :137); overlap_grad_reduce "
     "False (perf_recipes :45-46: the gradients' reduction not overlapped, which the planner "
     "prices overlapped: not fixed)",
     {"model_overrides": {"mtp_layers": 1},
      "mtp_source": f"recipes/deepseek/h100/deepseek_v3.py:137@{DS_H100} mtp_num_layers=1",
      "optimizer_source": f"recipes/deepseek/h100/deepseek_v3.py:221-224@{DS_H100}: "
                          "use_precision_aware_optimizer with main_params fp32, exp_avg and "
                          "exp_avg_sq bf16"}),
]
# What a row's own run reported of its memory beyond the card: (item path) -> fields
MEASURED = {
    ("qwen3-30b-a3b", "pretrain_performance", "H100"): {
        "measured_allocated_gib": 62.166,
        "memory_source": "NVIDIA-NeMo/Megatron-Bridge pull request 5123 (perf(recipe): tune Qwen3 "
                         "BF16 HybridEP on H100, 2026-07-27), the run of recipe commit 3a9559f01 "
                         "on nvcr.io/nvidia/nemo:26.08.rc2 with Megatron-Core cd4afffa6: 'Peak "
                         "allocated memory: 62.166 GiB/GPU' (the card: 'peak allocated memory "
                         "remains below 65 GiB/GPU'); allocated, not reserved: not scored by the "
                         "reserved-memory verdict, held by tests/test_ep_overlap_memory.py"},
}


def card(model: str) -> tuple:
    """(parsed card, its text lines) at COMMIT."""
    text = subprocess.check_output(
        ["git", "-C", REPO, "show", f"{COMMIT}:examples/model_verification_cards/{model}/card.yaml"],
        text=True)
    return yaml.safe_load(text), text.splitlines()


def _item(doc: dict, path: tuple):
    """The card item and, for a weak-scaling point, the point at that GPU count."""
    kind, gpu = path[0], path[1]
    item = doc["items"][kind][gpu]
    if kind == "pretrain_weak_scaling":
        point = next(p for p in item["points"] if p["num_gpus"] == path[2])
        return item, point
    return item, item


def _metrics_block(lines: list, value: float) -> list:
    """The card's metric lines, as printed, of the item whose step time is `value`: the
    contiguous `key: number` lines around its unique step-time line."""
    want = f"last_10_steps_step_time_ms_avg: {value:.3f}"
    hits = [i for i, ln in enumerate(lines) if ln.strip() == want]
    assert len(hits) == 1, (want, hits)
    indent = len(lines[hits[0]]) - len(lines[hits[0]].lstrip())

    def metric(ln):
        return (len(ln) - len(ln.lstrip()) == indent
                and re.fullmatch(r"[a-z0-9_]+: -?[0-9.]+", ln.strip()) is not None)
    a = b = hits[0]
    while a > 0 and metric(lines[a - 1]):
        a -= 1
    while b + 1 < len(lines) and metric(lines[b + 1]):
        b += 1
    return [ln.strip() for ln in lines[a:b + 1]]


def rows() -> list:
    out = []
    docs = {}
    for model, path, gpu, gpn, catalog, prec, facts, source, *more in RECIPES:
        doc, lines = docs.setdefault(model, card(model))
        item, point = _item(doc, path)
        assert item["status"] == "verified", (model, path)
        m = point["metrics"]
        ms = m["last_10_steps_step_time_ms_avg"]
        block = _metrics_block(lines, ms)
        n = point.get("num_gpus") or int(item["command"].split("--nodes")[1].split()[0]) * int(
            item["command"].split("--gpus-per-node")[1].split()[0])
        gbs, seq = facts["global_batch"], facts["seq_len"]
        fixed = {k: v for k, v in facts.items() if k != "cuda_graph_scope"}
        fixed["dp"] = n // (facts["tp"] * facts["pp"])
        if "cuda_graph_scope" in facts:
            fixed["cuda_graph_scope"] = list(facts["cuda_graph_scope"])
        commit = point.get("bridge_commit") or item.get("bridge_commit")
        vp = facts.get("vpp", "none")
        rid = (f"mbridge-card-{gpu}-{catalog.replace('-', '').replace('.', '')}-{prec}-{n}gpu-"
               f"tp{facts['tp']}pp{facts['pp']}cp1ep{facts['ep']}vp{vp}-gbs{gbs}")
        row = {
            "id": rid,
            "source": f"NVIDIA-NeMo/Megatron-Bridge examples/model_verification_cards/{model}/"
                      f"card.yaml items.{'.'.join(str(p) for p in path[:2])}"
                      + (f" point num_gpus {path[2]}" if len(path) > 2 else ""),
            "url": f"https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/{COMMIT}/examples/"
                   f"model_verification_cards/{model}/card.yaml",
            "repo": "NVIDIA-NeMo/Megatron-Bridge",
            "path": f"examples/model_verification_cards/{model}/card.yaml", "commit": COMMIT,
            "quote": "; ".join(block),
            "quote_context": f"items.{'.'.join(str(p) for p in path[:2])}: bridge_commit {commit}, "
                             f"last_verified {point.get('last_verified') or item.get('last_verified')}"
                             f", command: {' '.join((point.get('command') or item['command']).split())}",
            "engine": "megatron",
            "hardware": {"h100": "H100 SXM 80GB", "gb300": "GB300 (GB300 NVL72)"}[gpu],
            "model": HF_CONFIG[catalog], "catalog_model": catalog,
            "model_source": f"the planner catalog model {catalog} (planner/catalog/models.py), as "
                            "published_runs_moe.json's rows of the same model",
            "cluster": f"{gpu}x{n}", "gpus_per_node": gpn,
            "fixed": fixed, "precision": prec,
            "step_time_s": round(ms / 1000.0, 5),
            "published": dict(ln.split(": ", 1) for ln in block),
            "derivation": "step_time = last_10_steps_step_time_ms_avg / 1000 (the mean of the "
                          "card's steps 41-50)",
            "needs": ["moe"] + ([prec] if prec != "bf16" else []),
            "recipe_source": f"NVIDIA-NeMo/Megatron-Bridge @{commit}: {source}",
            "uncertain": [
                "which Megatron-Core and Transformer Engine builds ran: the card records the "
                "Bridge commit and the base container "
                f"({(doc.get('verification_environment') or {}).get('base_container')}), not "
                "which of the container's or the commit's Megatron-Core",
                "what the recipe sets and the fixed knobs do not hold (RECIPES' source text) is "
                "the planner's"],
            "notes": "MoE benchmark recipe: tokens force-balanced across experts "
                     "(moe_router_force_load_balancing) and dropless.",
        }
        row.update(MEASURED.get((model,) + path[:2], {}))
        if more:
            row.update(more[0])
        if fixed.get("cuda_graph"):
            row["cuda_graph_source"] = row["recipe_source"]
        if prec == "mxfp8":
            row["recipe"] = "mxfp8"
        row["family"] = FAMILY
        out.append(row)
    return out


def family(r) -> str:
    return FAMILY


if __name__ == "__main__":
    out = DATA / "published_runs_heldout.json"
    doc = json.loads(out.read_text())
    mine = rows()
    kept = [r for r in doc["runs"] if r.get("family") != FAMILY]
    doc["runs"] = kept + mine
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(len(mine), "card rows;", len(doc["runs"]), "in all")
