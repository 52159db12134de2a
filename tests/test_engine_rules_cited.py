"""No rule stricter than the engine (issue 22, item 1).

Each mended rule is tested with the published configuration it used to refuse, against what
the engine itself does (its source, reproduced here from the cited file, or its published
layout); and every refusal the rules layer can emit carries the engine source that refuses it.
"""
import ast
import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli_helpers import one_line, run, write
from planner import rules as V
from planner.catalog import get_cluster, get_model
from planner.engines import ENGINES, get_engine
from planner.engines.deepspeed import partition_balanced, partition_uniform, transformer_counts
from planner.export import export
from planner.plan import Batch, Parallelism, Plan, make_stages
from planner.precision import low_precision_peak
from planner.rules_fixed import fixed_problems
from planner.search import Fixed

ROOT = Path(__file__).resolve().parents[1]

# Narayanan et al. 2021 (SC21), Figure 15, as Megatron-LM publishes the run:
# examples/academic_paper_scripts/sc21/run_figure_15.sh ("Tensor-parallel size options = [2,
# 4, 8, 16, 32]", DP=64/TP, NLS=32, HS=3840, NAH=32, MBS=1, GBS 32/128/512, checkpointed
# activations) with CONFIG.sh's GPT-2 BPE vocabulary (--vocab-file, 50257 tokens) and
# --seq-length 2048, on 8 DGX A100 nodes.
SC21_FIG15 = {"model_type": "gpt2", "n_layer": 32, "n_embd": 3840, "n_head": 32,
              "n_inner": 15360, "vocab_size": 50257, "n_positions": 2048,
              "activation_function": "gelu"}
SC21_FIG15_ARGS = ("--cluster", "a100x64", "--tp", 4, "--pp", 1, "--dp", 16,
                   "--micro-batch", 1, "--global-batch", 32, "--seq-len", 2048,
                   "--recompute", "full")


def _gpt(tmp_path, vocab=50257, name="sc21-fig15.json"):
    return write(tmp_path, name, dict(SC21_FIG15, vocab_size=vocab))


def _plan_json(capsys, tmp_path, model, *args, limit_s=60):
    out = tmp_path / "p.json"
    code, _, err = run(capsys, "--model", model, *args, "--out", out, limit_s=limit_s)
    assert code == 0, err
    return json.loads(out.read_text())


# ---- vocabulary ----------------------------------------------------------------------------

def test_megatron_pads_the_vocabulary_as_its_tokenizer_builder_does():
    """megatron/core/tokenizers/utils/build_tokenizer.py vocab_size_with_padding: ceil to a
    multiple of make_vocab_size_divisible_by (128) x tp. Independent figures: Megatron-LM's
    own log for GPT-2 ("padded vocab (size: 50257) with 47 dummy tokens (new size: 50304)") and
    BLOOM's published vocab_size 250880 for its 250680-token tokenizer at tp 4."""
    megatron = get_engine("megatron")
    assert megatron.built_vocab(50257, 1) == 50304
    assert megatron.built_vocab(50257, 4) == 99 * 512 == 50688
    assert megatron.built_vocab(250680, 4) == 250880
    assert get_engine("deepspeed").built_vocab(250680, 4) == 250880   # Megatron-DeepSpeed


def test_gpt2_vocabulary_at_tp4_plans_under_megatron_priced_padded(tmp_path, capsys):
    """SC21 Figure 15 at tp 4: refused before ("--tp 4 does not divide the model's vocabulary
    (50257)"); Megatron pads it to 50688, and the plan is priced as the model with 50688
    rows (a model given 50688 tokens, which needs no padding, prices the same)."""
    plan = _plan_json(capsys, tmp_path, _gpt(tmp_path), *SC21_FIG15_ARGS)
    assert plan["parallelism"]["tp"] == 4
    padded = _plan_json(capsys, tmp_path, _gpt(tmp_path, 50688, "padded.json"), *SC21_FIG15_ARGS)
    assert plan["estimate"]["step_time_s"] == pytest.approx(padded["estimate"]["step_time_s"],
                                                            rel=1e-9)
    assert [s["memory_gib"] for s in plan["stages"]] == [s["memory_gib"]
                                                          for s in padded["stages"]]
    # and the rows count: a smaller vocabulary (64 x 512) holds less
    smaller = _plan_json(capsys, tmp_path, _gpt(tmp_path, 32768, "small.json"), *SC21_FIG15_ARGS)
    assert smaller["stages"][0]["memory_gib"]["params"] < plan["stages"][0]["memory_gib"]["params"]
    # the export says what was priced
    code, out, err = run(capsys, "--model", _gpt(tmp_path), *SC21_FIG15_ARGS, "--export",
                         "megatron", limit_s=60)
    assert code == 0, err
    assert "50688 rows, as priced" in out


def test_torchtitan_shards_the_vocabulary_unevenly(tmp_path, capsys):
    """torchtitan's tok_embeddings / output TP (RowwiseParallel / ColwiseParallel, DTensor):
    MaskPartial masks each rank's own shard range (torch/distributed/tensor/placement_types.py,
    Shard.local_shard_size_and_offset), so tp need not divide the vocabulary; each rank holds
    at most ceil(50257 / 4) = 12565 rows, priced as 4 x 12565 = 50260."""
    args = ("--engine", "torchtitan", "--cluster", "a100x64", "--tp", 4, "--pp", 1,
            "--global-batch", 32, "--seq-len", 2048, "--recompute", "full")
    plan = _plan_json(capsys, tmp_path, _gpt(tmp_path), *args)
    even = _plan_json(capsys, tmp_path, _gpt(tmp_path, 50260, "even.json"), *args)
    assert plan["parallelism"]["tp"] == 4
    assert plan["estimate"]["step_time_s"] == pytest.approx(even["estimate"]["step_time_s"],
                                                            rel=1e-9)


def test_runtime_keeps_its_vocabulary_rule_and_cites_it(tmp_path, capsys):
    """Our runtime's loss falls back to the full logits where tp does not divide the vocabulary
    (runtime/pipeline.py loss_fn: `v % tp == 0` or full_tensor()), which the plan's
    vocabulary-parallel loss does not count: the rule stays, with that source."""
    code, _, err = run(capsys, "--model", _gpt(tmp_path), "--engine", "runtime",
                       *SC21_FIG15_ARGS)
    one_line(code, err, 2, "--tp 4 does not divide the model's vocabulary (50257)")
    model = get_model(_gpt(tmp_path))
    problems = list(fixed_problems(model, get_cluster("a100x64"), Fixed(tp=4), 2048, 32,
                                   "runtime"))
    assert problems[0].rule == "tp_splits_model"
    assert "runtime/pipeline.py loss_fn" in problems[0].source


# ---- pipeline partitions -------------------------------------------------------------------

def _cost(bounds, weights):
    sums = [sum(weights[a:b]) for a, b in zip(bounds, bounds[1:])]
    return max(sums) - min(sums)


def _deepspeed_partition_balanced(weights, num_parts):
    """deepspeedai/DeepSpeed deepspeed/runtime/utils.py partition_balanced at edaa72212
    (2026-08-22), lines 627-665, as it reads there (numpy arrays; partition_uniform ours)."""
    import numpy as np
    n = len(weights)
    m = num_parts
    if n <= m:
        return partition_uniform(n, m)
    dp_max = np.full((n + 1, m + 1), np.inf)
    dp_min = np.full((n + 1, m + 1), np.inf)
    dp_cost = np.full((n + 1, m + 1), np.inf)
    position = np.zeros((n + 1, m + 1), dtype=int)
    prefix_sum = np.zeros((n + 1))
    prefix_sum[1:] = np.cumsum(weights)
    dp_max[0, 0] = 0
    dp_cost[0, 0] = 0
    for i in range(1, n + 1):
        for j in range(1, min(i, m) + 1):
            for k in range(i):
                max_sum = max(dp_max[k, j - 1], prefix_sum[i] - prefix_sum[k])
                min_sum = min(dp_min[k, j - 1], prefix_sum[i] - prefix_sum[k])
                cost = max_sum - min_sum
                if dp_cost[i, j] >= cost:
                    dp_cost[i, j] = cost
                    dp_max[i, j] = max_sum
                    dp_min[i, j] = min_sum
                    position[i, j] = k
    parts = [n]
    for i in reversed(range(1, m + 1)):
        parts.append(position[parts[-1], i])
    parts.reverse()
    return parts


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=2, max_size=9), st.integers(2, 4))
def test_partition_balanced_is_deepspeeds(weights, parts):
    """Our partition_balanced gives DeepSpeed's own code's boundaries, whatever the weights
    (its tie-breaking included)."""
    assert [int(x) for x in partition_balanced(tuple(weights), parts)] == [
        int(x) for x in _deepspeed_partition_balanced(weights, parts)]


def test_partition_balanced_is_optimal_where_the_planner_uses_it():
    """DeepSpeed's dynamic programme keeps one (max, min) per prefix, so it does not always
    find the least spread (weights 1,5,2,4,4,5,4,5 in 4 parts: spread 4 where 3 exists, as
    its own code gives: a hypothesis run found it). On what the planner partitions
    (transformer_counts: every layer of weight 1, the tied embedding at both ends or not) it
    is the least spread of every contiguous partition (brute force)."""
    w = (1, 5, 2, 4, 4, 5, 4, 5)
    assert _cost(partition_balanced(w, 4), w) == 4
    assert min(_cost((0, *c, 8), w) for c in itertools.combinations(range(1, 8), 3)) == 3
    for n in range(3, 15):
        for parts in range(2, min(n, 7)):
            for w in ((1,) * n, (1,) + (1,) * n + (1,)):
                best = min(_cost((0, *cuts, len(w)), w)
                           for cuts in itertools.combinations(range(1, len(w)), parts - 1))
                bounds = partition_balanced(w, parts)
                assert bounds[0] == 0 and bounds[-1] == len(w) and len(bounds) == parts + 1
                assert _cost(bounds, w) == best, (n, parts, w)


def test_partition_uniform_gives_the_first_stages_the_extra_layer():
    """deepspeed/runtime/utils.py partition_uniform: 70 over 12 is 6 x 10 then 5, 5."""
    b = partition_uniform(70, 12)
    assert [y - x for x, y in zip(b, b[1:])] == [6] * 10 + [5, 5]


def test_bloom_176b_layout_is_deepspeeds():
    """BLOOM-176B (bigscience-workshop/bigscience train/tr11-176B-ml/README.md): 70 layers,
    tp 4, pp 12, dp 8 on 384 A100 80GB, --pp-partition-method 'type:transformer|embedding',
    "pp rank 0: [embed | 5 transformer blocks], pp rank 1..10: [6 transformer blocks], pp rank
    11: [5 transformer blocks | embed]": DeepSpeed's partition gives exactly that."""
    assert transformer_counts(70, 12)["type:transformer|embedding"] == [5] + [6] * 10 + [5]


BLOOM = {"model_type": "bloom", "n_layer": 70, "hidden_size": 14336, "n_head": 112,
         "vocab_size": 250880, "seq_length": 2048}
BLOOM_LAYERS = [5] + [6] * 10 + [5]


def _bloom_plan(tmp_path, layers):
    model = get_model(write(tmp_path, "bloom.json", BLOOM))
    return Plan(model=model, cluster=get_cluster("a100x384"),
                parallelism=Parallelism(tp=4, pp=12, dp=8, zero_stage=1,
                                        sequence_parallel=False, recompute="full"),
                batch=Batch(seq_len=2048, global_batch_size=2048, micro_batch_size=2,
                            num_microbatches=128),
                stages=make_stages(70, 12, 1, layers_per_rank=layers,
                                   recompute_per_rank=layers),
                engine="deepspeed")


def test_bloom_176b_layout_is_not_refused_under_deepspeed(tmp_path):
    """70 layers over 12 stages under DeepSpeed was refused ("deepspeed puts the same number of
    layers on every pipeline stage: pp 12 does not divide the model's 70 layers"). Its
    published layout now passes every rule, and the export names the partition method."""
    plan = _bloom_plan(tmp_path, BLOOM_LAYERS)
    plan.validate()
    assert V.runner_problems(plan, get_engine("deepspeed")) == []
    assert list(fixed_problems(plan.model, plan.cluster, Fixed(pp=12, tp=4, dp=8,
                                                               stage_layers=tuple(BLOOM_LAYERS)),
                               2048, 2048, "deepspeed")) == []
    text = export(plan, "deepspeed")
    assert "partition_method='type:transformer|embedding'" in text
    # a split no partition method gives is refused, naming the ones DeepSpeed gives
    bad = _bloom_plan(tmp_path, [4] + [6] * 11)
    [problem] = V.engine_problems(bad, get_engine("deepspeed"))
    assert problem.rule == "partition_stage_layers" and "5,6,6,6" in problem.message
    assert "deepspeed/runtime/pipe/module.py" in problem.source


def test_bloom_176b_plans_end_to_end_under_deepspeed(tmp_path, capsys):
    """The published BLOOM-176B run (see above; MBS 2, GBS 2048, ZeRO-1, activation
    checkpointing) plans and fits."""
    code, out, err = run(capsys, "--model", write(tmp_path, "bloom.json", BLOOM), "--cluster",
                         "a100x384", "--engine", "deepspeed", "--tp", 4, "--pp", 12, "--dp", 8,
                         "--micro-batch", 2, "--global-batch", 2048, "--seq-len", 2048,
                         "--recompute", "full", "--zero", 1, "--stage-layers",
                         ",".join(map(str, BLOOM_LAYERS)), "--json", limit_s=60)
    assert code == 0, err


# ---- NVL72 clusters ------------------------------------------------------------------------

@pytest.mark.parametrize("name, domain", [
    # Megatron-LM MoE recipes (Recipe Overview table): Qwen3-235B-A22B on GB200 / GB300, 128
    # GPUs, MXFP8, TP1 PP1 EP64 (qwen3_235b/gb200/mxfp8_128GPU_TP1PP1EP64_*.yaml) -- two
    # racks of 64
    ("gb200x128", 64), ("gb300x128", 64),
    # DeepSeek-V3 on GB200 / GB300, 256 GPUs, MXFP8, TP1 PP4 EP64 (deepseek_v3/gb200/
    # mxfp8_256GPU_TP1PP4EP64.yaml) -- four racks of 64
    ("gb200x256", 64), ("gb300x256", 64),
    ("gb200x512", 64), ("gb200x144", 72), ("gb200x72", 72),
])
def test_nvl72_cluster_names_for_whole_trays(name, domain):
    """Refused before ("neither whole NVL72 racks nor trays of one rack"): the NVLink domain
    is the GPUs used in each rack."""
    c = get_cluster(name)
    assert (c.gpus_per_node, c.nvlink_domain) == (4, domain)
    assert c.num_gpus % c.nvlink_domain == 0


def test_qwen3_235b_gb200x128_recipe_plans(capsys):
    code, out, err = run(capsys, "--model", "qwen3-235b-a22b", "--cluster", "gb200x128",
                         "--tp", 1, "--pp", 1, "--ep", 64, "--precision", "mxfp8",
                         "--global-batch", 8192, "--seq-len", 4096, "--micro-batch", 1,
                         "--json", limit_s=120)
    assert code == 0, err


def test_a_cluster_json_nvlink_domain_stays_the_override(tmp_path):
    path = write(tmp_path, "c.json", {"base": "gb200", "num_gpus": 128, "gpus_per_node": 4,
                                      "nvlink_domain": 32})
    assert get_cluster(path).nvlink_domain == 32


# ---- AMD FP8 ---------------------------------------------------------------------------------

@pytest.mark.parametrize("gpu, fp8", [("mi300x", 2614.9), ("mi325x", 2614.9),
                                      ("mi355x", 5033.2)])
def test_amd_fp8_is_planned_with_datasheet_peaks(capsys, gpu, fp8):
    """Refused before ("precision fp8 needs a GPU with FP8 tensor cores ...; mi300x has none").
    AMD Instinct MI300X / MI325X datasheets: FP8 2614.9 TFLOP/s dense (twice bf16's 1307.4);
    MI355X: 256 CUs x 8192 FP8 FLOPs a clock x 2.4 GHz (AMD, ISSCC 2026; Hot Chips 2025)."""
    g = get_cluster(f"{gpu}x8").gpu
    assert low_precision_peak(g, "fp8") == fp8
    assert fp8 == pytest.approx(2 * g.peak_tflops, rel=1e-3)
    # SemiAnalysis "MI300X vs H100 vs H200 Benchmark Part 1: Training" ran FP8 Llama 3 70B
    # training on 8 x MI300X (torchtitan / Megatron-LM ROCm forks)
    code, out, err = run(capsys, "--model", "llama70b", "--cluster", f"{gpu}x8", "--precision",
                         "fp8", "--json", limit_s=60)
    assert code == 0, err


def test_amd_has_no_nvfp4(capsys):
    code, _, err = run(capsys, "--model", "llama8b", "--cluster", "mi355x8", "--precision",
                       "nvfp4")
    one_line(code, err, 2, "needs a GPU with NVFP4 tensor cores")


# ---- engine-native names ---------------------------------------------------------------------

def test_torchtitan_selective_recompute_is_its_op_policy(tmp_path, capsys):
    """torchtitan benchmarks/llama3_h100_202412_torchtitan.md Table 1: Llama 3.1 8B, 8 H100,
    FSDP, local batch 2, "selective AC" -- refused before ("engine torchtitan has no selective
    recompute (it has: full, op)"). torchtitan's [activation_checkpoint] mode "selective" with
    selective_ac_option "op" is the per-op policy priced as "op"."""
    cluster = write(tmp_path, "h100-96g-x8.json", {"name": "h100-96g-x8", "base": "h100",
                                                    "num_gpus": 8, "gpus_per_node": 8,
                                                    "memory_gib": 94.5})
    args = ("--cluster", cluster, "--engine", "torchtitan", "--tp", 1,
            "--pp", 1, "--dp", 8, "--micro-batch", 2, "--global-batch", 16, "--seq-len", 8192,
            "--zero", 3)
    selective = _plan_json(capsys, tmp_path, "llama3-8b", *args, "--recompute", "selective")
    op = _plan_json(capsys, tmp_path, "llama3-8b", *args, "--recompute", "op")
    assert selective["parallelism"]["recompute"] == "op"
    assert selective["estimate"] == op["estimate"]
    assert get_engine("torchtitan").native_recompute("selective") == "op"
    assert get_engine("megatron").native_recompute("selective") == "selective"


# ---- every refusal cites the engine ----------------------------------------------------------

RULE_FILES = ("planner/rules.py", "planner/rules_fixed.py", "planner/precision.py")


def _rules_emitted():
    """(rule name, file) of every Problem the rules layer builds with a literal rule name."""
    out = set()
    for f in RULE_FILES:
        for node in ast.walk(ast.parse((ROOT / f).read_text())):
            if isinstance(node, ast.Call) and node.args:
                fn = getattr(node.func, "id", getattr(node.func, "attr", None))
                first = node.args[0]
                if fn in ("Problem", "_p", "add") and isinstance(first, ast.Constant) \
                        and isinstance(first.value, str):
                    out.add((first.value, f))
    return sorted(out)


def test_the_rules_layer_is_scanned():
    rules = {r for r, _ in _rules_emitted()}
    assert {"tp_splits_model", "partition_stage_layers", "zero_under_pp", "cp_split",
            "precision_on_gpu", "engine_recompute"} <= rules


@pytest.mark.parametrize("rule, where", _rules_emitted())
@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_every_refusal_carries_an_engine_source(rule, where, engine):
    """Every rule the rules layer can emit is cited: a rule every engine states alike in the
    shared RULE_SOURCES, a rule of what one engine offers (ENGINE_RULES) by that engine's own
    statement or its options; and it resolves to a non-empty source for every engine."""
    assert rule in V.RULE_SOURCES or rule in V.ENGINE_RULES, (rule, where)
    assert V.RULE_SOURCES.get(rule, "x").strip()
    source = V.rule_source(rule, get_engine(engine))
    assert source.strip(), (rule, where, engine)


@pytest.mark.parametrize("fixed", [
    Fixed(tp=3), Fixed(pp=200), Fixed(tp=8, sp=True), Fixed(zero=2, pp=2),
    Fixed(cp=3), Fixed(recompute="selective", recompute_modules=("moe",)),
    Fixed(schedule="gpipe", pp=2), Fixed(dp=7), Fixed(stage_layers=(1, 2)),
    Fixed(moe_capacity_factor=1.0), Fixed(ep=2), Fixed(precision="nvfp4"),
])
@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_fixed_refusals_carry_a_source(fixed, engine):
    model, cluster = get_model("llama3-8b"), get_cluster("h100x16")
    for problem in fixed_problems(model, cluster, fixed, 4095, 64, engine):
        assert problem.source.strip(), problem


def test_torchtitan_schedule_names_are_accepted(tmp_path, capsys):
    """torchtitan benchmarks/llama3_h100_202412_torchtitan.md Table 5: Llama 3.1 405B on 512
    H100, FSDP 8 x TP 8 x PP 8, pipeline_parallel_schedule "Interleaved1F1B" (2 stages a
    rank), local batch 32 (micro-batch 2), global batch 256, Float8, full AC -- planned under
    torchtitan's own schedule name (refused before: "invalid choice: 'Interleaved1F1B'"), the
    same plan as --schedule interleaved."""
    args = ("--cluster", "h100x512", "--engine", "torchtitan", "--tp", 8, "--pp", 8, "--dp", 8,
            "--vpp", 2, "--micro-batch", 2, "--global-batch", 256, "--seq-len", 8192,
            "--zero", 2, "--recompute", "full", "--precision", "fp8")
    native = _plan_json(capsys, tmp_path, "llama3-405b", *args, "--schedule", "Interleaved1F1B")
    ours = _plan_json(capsys, tmp_path, "llama3-405b", *args, "--schedule", "interleaved")
    assert native["parallelism"]["schedule"] == "interleaved"
    assert native["estimate"] == ours["estimate"]
    code, _, err = run(capsys, "--model", "llama8b", "--cluster", "h100x16", "--pp", 2,
                       "--schedule", "ZBVZeroBubble")
    # torchtitan's zero-bubble name maps to ours (zbv), which Megatron does not run
    one_line(code, err, 2, "engine megatron has no zbv schedule")


# ---- tensor parallelism over nodes -----------------------------------------------------------

@pytest.mark.parametrize("tp", [16, 32])
def test_sc21_tensor_parallel_over_nodes_plans(tmp_path, capsys, tp):
    """SC21 Figure 15 ran tp 16 and 32 on 8-GPU DGX A100 nodes ("Tensor-parallel size options
    = [2, 4, 8, 16, 32]"): refused before ("--tp 16 would split tensor-parallel groups over
    nodes of 8 GPUs"); Megatron-Core's tp groups span nodes. Its TP communication overlap
    (2021's runs had none) runs inside an NVLink domain only, so the default overlap is
    refused with the fix, and the plan without it is priced over the inter-node links."""
    model = write(tmp_path, "gpt.json", dict(SC21_FIG15, vocab_size=51200))
    args = ("--cluster", "a100x64", "--tp", tp, "--pp", 1, "--global-batch", 32, "--seq-len",
            2048, "--recompute", "full")
    code, _, err = run(capsys, "--model", model, *args, limit_s=60)
    one_line(code, err, 2, "plan with --no-tp-comm-overlap")
    plan = _plan_json(capsys, tmp_path, model, *args, "--no-tp-comm-overlap")
    assert plan["parallelism"]["tp"] == tp and not plan["parallelism"]["tp_comm_overlap"]
    # slower than tp 8 inside the node: the tp collectives cross InfiniBand
    inside = _plan_json(capsys, tmp_path, model, *args[:2], "--tp", 8, *args[4:],
                        "--no-tp-comm-overlap")
    assert plan["estimate"]["step_time_s"] > inside["estimate"]["step_time_s"]


def test_runtime_keeps_tp_inside_a_host(tmp_path, capsys):
    """runtime/train.py check_world: tp divides the processes of a host."""
    model = write(tmp_path, "gpt.json", dict(SC21_FIG15, vocab_size=51200))
    code, _, err = run(capsys, "--model", model, "--engine", "runtime", "--cluster", "a100x64",
                       "--tp", 16, "--no-tp-comm-overlap", limit_s=60)
    one_line(code, err, 2, "tp must divide the GPUs per node")


def test_plan_refusals_carry_a_source(tmp_path):
    """The rules of a whole plan (rule_problems, engine_problems) cite their engine too."""
    import dataclasses
    plan = _bloom_plan(tmp_path, [4] + [6] * 11)
    bad = dataclasses.replace(
        plan, parallelism=dataclasses.replace(plan.parallelism, schedule="gpipe", zero_stage=3,
                                              tp_comm_overlap=False),
        precision="nvfp4")
    problems = V.rule_problems(bad) + V.runner_problems(bad, get_engine("deepspeed")) \
        + V.runner_problems(bad, get_engine("runtime")) + V.runner_problems(bad, get_engine("fsdp"))
    assert len(problems) >= 5
    for problem in problems:
        assert problem.source.strip(), problem


# ---- positions -------------------------------------------------------------------------------

def test_rope_beyond_the_configs_positions_plans(capsys):
    """Megatron-Bridge's llama3_8b_16k recipe (llama3_8b_pretrain_16gpu_h100_bf16_16k: Meta-
    Llama-3-8B, max_position_embeddings 8192, at seq_length 16384, TP 4 PP 2 CP 2 SP on 16
    H100): refused before ("--seq-len 16384 exceeds the model's 8192 rope positions"). RoPE has
    no position table; learned positions still bound the sequence."""
    code, out, err = run(capsys, "--model", "llama3-8b", "--cluster", "h100x16", "--tp", 4,
                         "--pp", 2, "--cp", 2, "--sp", "--seq-len", 16384, "--global-batch", 64,
                         "--json", limit_s=60)
    assert code == 0, err
    code, _, err = run(capsys, "--model", "gpt3", "--cluster", "h100x8", "--seq-len", 4096,
                       "--global-batch", 8)
    one_line(code, err, 2, "exceeds the model's 2048 learned positions")


def megatron_layers_to_build(num_layers: int, pp: int, vpp: int) -> list:
    """Decoder layers per (pp rank, model chunk) with --account-for-embedding-in-pipeline-split
    and --account-for-loss-in-pipeline-split, reproduced from Megatron-Core's
    megatron/core/transformer/transformer_block.py get_num_layers_to_build (NVIDIA/Megatron-LM
    @d98e8a64): (num_layers + 2) / pp per rank, / vpp per chunk, one fewer on the first chunk
    of the first rank (the embedding) and the last chunk of the last rank (the loss); the
    asserts are its own."""
    total = num_layers + 2
    assert total % pp == 0
    per_rank = total // pp
    assert per_rank % vpp == 0
    out = []
    for rank in range(pp):
        chunks = [per_rank // vpp] * vpp
        if rank == 0:
            chunks[0] -= 1
        if rank == pp - 1:
            chunks[-1] -= 1
        assert min(chunks) >= 0
        out.append(chunks)
    return out


LLAMA31_405B = {"model_type": "llama", "num_hidden_layers": 126, "hidden_size": 16384,
                "num_attention_heads": 128, "num_key_value_heads": 8,
                "intermediate_size": 53248, "vocab_size": 128256, "hidden_act": "silu",
                "max_position_embeddings": 8192, "tie_word_embeddings": False}


def test_llama31_405b_pp16_vpp8_is_megatrons_embedding_and_loss_split(tmp_path, capsys):
    """Megatron-Bridge's published Llama 3.1 405B MXFP8 run on 256 GB200 (docs/performance-
    summary-archive.md 26.02-26.06: tp 4, pp 16, vp 8, GBS 1536, MBS 1, 8K) puts 126 layers on
    128 virtual stages: its 405B recipes set account_for_embedding_in_pipeline_split and
    account_for_loss_in_pipeline_split (src/megatron/bridge/recipes/llama/h100/llama3.py
    @067f987df0, "Large model specific pipeline split configurations"). It was refused
    ("pp*vpp = 128 exceeds the model's 126 layers"; the fidelity table: "no configuration with
    the published knobs"). Now the rules pass it, the default split is Megatron's per rank,
    the first virtual stage holds only the embedding, and the plan is made end to end."""
    meg = megatron_layers_to_build(126, 16, 8)
    assert V.default_split(get_engine("megatron"), 126, 16, 8) == [sum(c) for c in meg]
    model = get_model(write(tmp_path, "llama405b.json", LLAMA31_405B))
    assert V.pp_ok(model, 16, 8, get_engine("megatron"))
    assert list(fixed_problems(model, get_cluster("gb200x256"),
                               Fixed(tp=4, pp=16, dp=4, vpp=8, schedule="interleaved"),
                               8192, 1536, "megatron")) == []
    # an engine without Megatron's split keeps one layer per chunk
    assert not V.pp_ok(model, 16, 8, get_engine("torchtitan"))
    # only the end chunks may be empty: a middle rank short of its chunks is refused
    assert V.split_blockers(126, 16, 8, [8, 7] + [8] * 13 + [8], get_engine("megatron"))
    code, out, err = run(capsys, "--model", write(tmp_path, "llama405b.json", LLAMA31_405B),
                         "--cluster", "gb200x256", "--tp", 4, "--pp", 16, "--vpp", 8,
                         "--dp", 4, "--micro-batch", 1, "--global-batch", 1536, "--seq-len",
                         8192, "--precision", "mxfp8", "--json", limit_s=120)
    assert code == 0, err
    stages = json.loads(out)["stages"]
    per_rank = [0] * 16
    for s in stages:
        per_rank[s["pp_rank"]] += s["layers"][1] - s["layers"][0]
    assert per_rank[1:-1] == [8] * 14 and sum(per_rank) == 126
    assert stages[0]["layers"][1] == stages[0]["layers"][0]   # the embedding's stage
    # the export's --pipeline-model-parallel-layout: 128 virtual stages, 126 decoder layers,
    # the embedding alone on the first (Megatron's layout parser takes an empty stage)
    code, out, err = run(capsys, "--model", write(tmp_path, "llama405b.json", LLAMA31_405B),
                         "--cluster", "gb200x256", "--tp", 4, "--pp", 16, "--vpp", 8,
                         "--dp", 4, "--micro-batch", 1, "--global-batch", 1536, "--seq-len",
                         8192, "--precision", "mxfp8", "--export", "megatron", limit_s=120)
    assert code == 0, err
    layout = out.split("--pipeline-model-parallel-layout", 1)[1].split("'")[1].split("|")
    assert len(layout) == 128 and layout[0] == "E" and layout[-1] == "tL"
    assert sum(st.count("t") for st in layout) == 126
