"""Exports: parse what each engine would read and check every value against the plan.

The Megatron parser below mirrors the types and choices of megatron/training/arguments.py for
the flags the exporter may emit (an unknown flag fails the parse), and the layer-placement
helpers re-implement Megatron-core's and torchtitan's rules independently of the exporter.
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib

import pytest

from planner.catalog import get_cluster, get_model
from planner.errors import BadInput
from planner.export import EXPORTERS, export
from planner.plan import Batch, Parallelism, Plan, make_stages
from planner.specs import Model

# ---------------------------------------------------------------------------------------------
# plans


def mkplan(model="llama70b", cluster="h100x32", *, tp=8, pp=4, dp=1, zero=1, sp=True,
           schedule="1f1b", vpp=1, recompute="none", layers=None, rec=None, seq=4096, mbs=1,
           nmb=16, rank_order=("pp", "dp", "tp")):
    m = model if isinstance(model, Model) else get_model(model)
    c = get_cluster(cluster)
    plan = Plan(model=m, cluster=c,
                parallelism=Parallelism(tp=tp, pp=pp, dp=dp, zero_stage=zero,
                                        sequence_parallel=sp, schedule=schedule, vpp=vpp,
                                        recompute=recompute, rank_order=tuple(rank_order)),
                batch=Batch(seq_len=seq, global_batch_size=mbs * nmb * dp,
                            micro_batch_size=mbs, num_microbatches=nmb),
                stages=make_stages(m.num_layers, pp, vpp, layers_per_rank=layers,
                                   recompute_per_rank=rec))
    plan.validate()
    return plan


TINY = Model("tiny-gpt", num_layers=6, hidden=64, ffn_hidden=256, num_heads=4, num_kv_heads=4,
             vocab_size=1000, max_seq_len=128, gated_mlp=False, activation="gelu",
             norm="layernorm", position="learned", tied_embeddings=True, attn_bias=True,
             linear_bias=True, dropout=0.1)

PLANS = {
    # Llama-style, uniform pipeline, full recompute of every layer.
    "uniform-full": mkplan(recompute="full", rec=[20, 20, 20, 20]),
    # First/last stages lighter, interior equal: first/last-stage flags.
    "uneven-first-last": mkplan(layers=[19, 21, 21, 19]),
    "uneven-first-only": mkplan(layers=[17, 21, 21, 21], recompute="full", rec=[3, 3, 3, 3]),
    "uneven-last-only": mkplan(layers=[21, 21, 21, 17], recompute="selective",
                               rec=[21, 21, 21, 17]),
    # Irregular stages: layout string.
    "uneven-layout": mkplan(layers=[18, 22, 20, 20], recompute="full", rec=[6, 4, 2, 0]),
    # The brief's example: interleaved, uneven, per-stage recompute.
    "interleaved-uneven": mkplan(schedule="interleaved", vpp=2, recompute="full",
                                 layers=[19, 21, 21, 19], rec=[4, 2, 0, 0], seq=8192, nmb=32),
    "interleaved-uniform": mkplan(schedule="interleaved", vpp=2, zero=1),
    "interleaved-first-last": mkplan(schedule="interleaved", vpp=2, layers=[18, 22, 22, 18],
                                     recompute="full", rec=[2, 2, 2, 2]),
    # Data parallel and every ZeRO stage, pp = 1 and pp > 1.
    "zero0-dp": mkplan("llama8b", "h100x16", tp=2, pp=1, dp=8, zero=0, recompute="selective",
                       rec=[32], nmb=4),
    "zero1-dp": mkplan("llama8b", "h100x16", tp=2, pp=2, dp=4, zero=1, nmb=8),
    "zero2-pp1": mkplan("llama8b", "h100x16", tp=4, pp=1, dp=4, zero=2, recompute="selective",
                        rec=[16], nmb=2),
    "zero3-pp1": mkplan("llama8b", "h100x8", tp=1, pp=1, dp=8, zero=3, sp=False,
                        recompute="full", rec=[32], mbs=2, nmb=4),
    "zero3-pp2": mkplan("llama70b", "h100x64", tp=8, pp=2, dp=4, zero=3, layers=[39, 41],
                        nmb=8),
    "zero2-pp4": mkplan("llama70b", "h100x64", tp=4, pp=4, dp=4, zero=2, recompute="full",
                        rec=[10, 6, 2, 0], nmb=8),
    # GPT-style: learned positions, LayerNorm, GELU, biases, tied embeddings; GPipe.
    "gpt3-gpipe": mkplan("gpt3", "h100x128", tp=8, pp=8, dp=2, zero=1, schedule="gpipe",
                         recompute="full", rec=[12] * 8, seq=2048, nmb=16),
    "gpt3-interleaved": mkplan("gpt3", "h100x64", tp=8, pp=8, dp=1, zero=0,
                               schedule="interleaved", vpp=3, recompute="selective",
                               rec=[6] * 8, seq=2048, nmb=16),
    # Other rank order, no sequence parallel, no recompute.
    "rank-order-dp-pp-tp": mkplan(layers=[20, 20, 20, 20], sp=False, dp=1,
                                  rank_order=("dp", "pp", "tp")),
    # fp32 CPU cluster, tiny GPT, ZeRO-0 with pp.
    "cpu-tiny": mkplan(TINY, "cpux4", tp=1, pp=2, dp=2, zero=0, sp=False, seq=128, mbs=2,
                       nmb=2),
    # recompute picked but applied to no layer
    "recompute-on-nothing": mkplan(recompute="full", rec=[0, 0, 0, 0]),
    # interleaved schedule named, but one chunk per rank
    "interleaved-vpp1": mkplan(schedule="interleaved", vpp=1, layers=[19, 21, 21, 19]),
    # interleaving on a single pipeline rank
    "interleaved-pp1": mkplan("llama8b", "h100x8", tp=8, pp=1, dp=1, schedule="interleaved",
                              vpp=2, nmb=4),
}


@pytest.fixture(params=sorted(PLANS), ids=sorted(PLANS))
def plan(request):
    return PLANS[request.param]


def expected_counts(plan):
    return [s.num_layers for s in plan.stages]


# ---------------------------------------------------------------------------------------------
# dispatch


def test_exporters_registered():
    assert set(EXPORTERS) == {"megatron", "deepspeed", "torchtitan"}
    p = PLANS["uniform-full"]
    for fmt, fn in EXPORTERS.items():
        assert export(p, fmt) == fn(p)
    assert export(p, "Megatron") == EXPORTERS["megatron"](p)


def test_unknown_format_is_one_clear_line():
    with pytest.raises(BadInput) as e:
        export(PLANS["uniform-full"], "nemo")
    msg = str(e.value)
    assert "\n" not in msg and "'nemo'" in msg
    for fmt in EXPORTERS:
        assert fmt in msg


def test_invalid_plan_is_refused():
    p = mkplan()
    p.batch = Batch(seq_len=4096, global_batch_size=17, micro_batch_size=1, num_microbatches=16)
    for fmt in EXPORTERS:
        with pytest.raises(BadInput):
            export(p, fmt)


def test_exporters_do_not_import_torch():
    code = ("import sys, planner.export, planner.launch; "
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------------
# Megatron-LM


def megatron_parser():
    """Megatron's own types, defaults and choices for the flags the exporter uses."""
    ap = argparse.ArgumentParser(allow_abbrev=False)
    a = ap.add_argument
    a("--tensor-model-parallel-size", type=int, default=1)
    a("--pipeline-model-parallel-size", type=int, default=1)
    a("--sequence-parallel", action="store_true")
    a("--decoder-first-pipeline-num-layers", type=int, default=None)
    a("--decoder-last-pipeline-num-layers", type=int, default=None)
    a("--pipeline-model-parallel-layout", type=str, default=None)
    a("--num-layers-per-virtual-pipeline-stage", type=int, default=None)
    a("--num-virtual-stages-per-pipeline-rank", type=int, default=None)
    a("--use-tp-pp-dp-mapping", action="store_true")
    a("--use-distributed-optimizer", action="store_true")
    a("--use-megatron-fsdp", action="store_true")
    a("--data-parallel-sharding-strategy", type=str, default="no_shard",
      choices=["no_shard", "optim", "optim_grads", "optim_grads_params"])
    a("--ckpt-format", default="torch_dist",
      choices=["torch", "torch_dist", "zarr", "torch_dcp", "fsdp_dtensor"])
    a("--recompute-granularity", type=str, default=None, choices=["full", "selective"])
    a("--recompute-method", type=str, default=None, choices=["uniform", "block"])
    a("--recompute-num-layers", type=int, default=None)
    a("--micro-batch-size", type=int, default=None)
    a("--global-batch-size", type=int, default=None)
    a("--seq-length", type=int, default=None)
    a("--bf16", action="store_true")
    a("--num-layers", type=int, default=None)
    a("--hidden-size", type=int, default=None)
    a("--ffn-hidden-size", type=int, default=None)
    a("--num-attention-heads", type=int, default=None)
    a("--group-query-attention", action="store_true")
    a("--num-query-groups", type=int, default=1)
    a("--max-position-embeddings", type=int, default=None)
    a("--swiglu", action="store_true")
    a("--quick-geglu", action="store_true")
    a("--squared-relu", action="store_true")
    a("--normalization", default="LayerNorm", choices=["LayerNorm", "RMSNorm"])
    a("--norm-epsilon", type=float, default=1e-5)
    a("--position-embedding-type", type=str, default="learned_absolute",
      choices=["learned_absolute", "rope", "mrope", "relative", "none"])
    a("--rotary-base", type=int, default=10000)
    a("--untie-embeddings-and-output-weights", action="store_true")
    a("--disable-bias-linear", action="store_false", dest="add_bias_linear")
    a("--add-qkv-bias", action="store_true", dest="add_qkv_bias")
    a("--attention-dropout", type=float, default=0.1)
    a("--hidden-dropout", type=float, default=0.1)
    return ap


def megatron_tokens(text):
    """The argv entries of the MEGATRON_ARGS array, read the way bash reads them."""
    m = re.search(r"^MEGATRON_ARGS=\(\n(.*?)^\)$", text, re.S | re.M)
    assert m, text
    return shlex.split(m.group(1), comments=True)


def expand_layout(layout):
    """Megatron's layout grammar: '|' splits stages, ',' is cosmetic, (..)*n and x*n repeat."""
    s = layout.replace(",", "")
    while True:
        new = re.sub(r"\(([^()]*)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
        if new == s:
            break
        s = new
    s = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    stages = s.split("|")
    for st in stages:
        assert set(st) <= set("EtL"), st
    return stages


def megatron_stage_counts(a, num_layers):
    """Decoder layers per virtual stage (model order) and vpp, as Megatron-core places them."""
    pp = a.pipeline_model_parallel_size
    vp_flags = [a.num_layers_per_virtual_pipeline_stage, a.num_virtual_stages_per_pipeline_rank,
                a.pipeline_model_parallel_layout]
    assert sum(v is not None for v in vp_flags) <= 1    # Megatron's own check
    if a.pipeline_model_parallel_layout is not None:
        assert a.decoder_first_pipeline_num_layers is None
        assert a.decoder_last_pipeline_num_layers is None
        stages = expand_layout(a.pipeline_model_parallel_layout)
        assert len(stages) % pp == 0
        flat = "".join(stages)
        assert flat[0] == "E" and flat[-1] == "L"
        assert flat.count("E") == 1 and flat.count("L") == 1
        assert flat.count("t") == num_layers
        return [st.count("t") for st in stages], len(stages) // pp
    if a.num_layers_per_virtual_pipeline_stage is not None:
        assert a.decoder_first_pipeline_num_layers is None   # Megatron asserts this
        assert num_layers % pp == 0
        vpp = num_layers // pp // a.num_layers_per_virtual_pipeline_stage
    else:
        vpp = a.num_virtual_stages_per_pipeline_rank or 1
    first, last = a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers
    remaining, middle = num_layers, pp
    for n in (first, last):
        if n is not None:
            assert n > 0 and n % vpp == 0
            remaining -= n
            middle -= 1
    assert bool(remaining) == bool(middle)
    if middle:
        assert remaining % middle == 0 and (remaining // middle) % vpp == 0
    per_rank = [remaining // middle if middle else 0] * pp
    if first is not None:
        per_rank[0] = first
    if last is not None:
        per_rank[-1] = last
    return [per_rank[i % pp] // vpp for i in range(pp * vpp)], vpp


def megatron_recomputed(a, counts):
    """Layers Megatron recomputes in each model chunk."""
    if a.recompute_granularity is None:
        return [0] * len(counts)
    if a.recompute_granularity == "selective":
        assert a.recompute_method is None          # Megatron rejects a method with selective
        return list(counts)
    if a.recompute_method == "block":
        return [min(a.recompute_num_layers, n) for n in counts]
    return list(counts)                            # uniform recomputes every layer


def test_megatron(plan, tmp_path):
    text = export(plan, "megatron")
    p, m, b = plan.parallelism, plan.model, plan.batch
    notes = "\n".join(line for line in text.splitlines() if line.startswith("# NOTE"))
    tokens = megatron_tokens(text)

    # bash itself reads the fragment into the same argv
    if shutil.which("bash"):
        f = tmp_path / "megatron_args.sh"
        f.write_text(text)
        out = subprocess.run(["bash", "-c", 'set -eu; source "$1"; printf "%s\\0" '
                              '"${MEGATRON_ARGS[@]}"', "_", str(f)],
                             check=True, capture_output=True, text=True).stdout
        assert out.split("\0")[:-1] == tokens

    a = megatron_parser().parse_args(tokens)
    assert a.tensor_model_parallel_size == p.tp
    assert a.pipeline_model_parallel_size == p.pp
    assert a.sequence_parallel == (p.sequence_parallel and p.tp > 1)
    assert a.micro_batch_size == b.micro_batch_size
    assert a.global_batch_size == b.global_batch_size
    assert a.global_batch_size % (a.micro_batch_size * p.dp) == 0
    assert a.global_batch_size // (a.micro_batch_size * p.dp) == b.num_microbatches
    assert a.seq_length == b.seq_len
    assert a.bf16 == (plan.cluster.gpu.name != "cpu")
    assert a.use_tp_pp_dp_mapping == (tuple(p.rank_order) == ("dp", "pp", "tp"))
    assert ("CUDA_DEVICE_MAX_CONNECTIONS=1" in text) == (p.tp > 1 and not a.use_megatron_fsdp)

    # model
    assert (a.num_layers, a.hidden_size, a.ffn_hidden_size, a.num_attention_heads) == \
        (m.num_layers, m.hidden, m.ffn_hidden, m.num_heads)
    assert a.group_query_attention == (m.num_kv_heads != m.num_heads)
    assert (a.num_query_groups if a.group_query_attention else m.num_heads) == m.num_kv_heads
    assert a.max_position_embeddings >= max(b.seq_len, m.max_seq_len)
    assert a.swiglu == (m.gated_mlp and m.activation == "silu")
    assert a.normalization == {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}[m.norm]
    assert a.norm_epsilon == m.norm_eps
    assert a.position_embedding_type == {"rope": "rope", "learned": "learned_absolute",
                                         "alibi": "none"}[m.position]
    if m.position == "rope":
        assert a.rotary_base == m.rope_theta
    assert a.untie_embeddings_and_output_weights == (not m.tied_embeddings)
    assert a.add_bias_linear == m.linear_bias
    assert (a.add_qkv_bias or a.add_bias_linear) == m.attn_bias
    assert a.attention_dropout == a.hidden_dropout == m.dropout

    # pipeline placement, exactly as planned
    counts, vpp = megatron_stage_counts(a, m.num_layers)
    if p.pp > 1:
        assert counts == expected_counts(plan)
        assert vpp == p.vpp
    if p.pp > 1 and len(set(plan.layer_counts())) > 1:
        edges_only = len(set(plan.layer_counts()[1:-1])) <= 1
        if edges_only and all(n % p.vpp == 0 for n in plan.layer_counts()):
            assert a.pipeline_model_parallel_layout is None   # the simpler flags suffice
    if p.schedule == "gpipe" and p.pp > 1:
        assert "GPipe" in notes

    # recompute: never less than planned; exactly as planned unless a note says otherwise
    done = megatron_recomputed(a, counts if p.pp > 1 else [m.num_layers])
    planned = [s.recompute_layers if p.recompute != "none" else 0 for s in plan.stages]
    if p.pp == 1:
        planned = [sum(planned)]
    if p.recompute == "selective" and any(planned):
        assert a.recompute_granularity == "selective"
    assert all(d >= r for d, r in zip(done, planned))
    if done != planned:
        assert "recompute" in notes

    # ZeRO
    if p.zero_stage == 0:
        assert not a.use_distributed_optimizer and not a.use_megatron_fsdp
    elif p.zero_stage == 1 or p.pp > 1:
        assert a.use_distributed_optimizer and not a.use_megatron_fsdp
        if p.zero_stage > 1:
            assert f"ZeRO-{p.zero_stage}" in notes
    else:
        assert a.use_megatron_fsdp and a.ckpt_format == "fsdp_dtensor"
        assert a.data_parallel_sharding_strategy == {2: "optim_grads",
                                                     3: "optim_grads_params"}[p.zero_stage]


def test_megatron_example_uses_layout():
    a = megatron_parser().parse_args(megatron_tokens(export(PLANS["interleaved-uneven"],
                                                             "megatron")))
    assert a.pipeline_model_parallel_layout == "Et*9|t*10|t*10|t*9|t*10|t*11|t*11|t*10L"
    assert a.recompute_num_layers == 2 and a.recompute_method == "block"


def test_megatron_first_last_flags():
    a = megatron_parser().parse_args(megatron_tokens(export(PLANS["uneven-first-last"],
                                                             "megatron")))
    assert (a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers) == (19, 19)
    a = megatron_parser().parse_args(megatron_tokens(export(PLANS["uneven-first-only"],
                                                             "megatron")))
    assert (a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers) == (17, None)
    a = megatron_parser().parse_args(megatron_tokens(export(PLANS["interleaved-first-last"],
                                                             "megatron")))
    assert a.num_virtual_stages_per_pipeline_rank == 2
    assert (a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers) == (18, 18)


def test_megatron_gpt_model_flags():
    a = megatron_parser().parse_args(megatron_tokens(export(PLANS["gpt3-gpipe"], "megatron")))
    assert a.position_embedding_type == "learned_absolute" and a.normalization == "LayerNorm"
    assert not a.swiglu and a.add_bias_linear and not a.untie_embeddings_and_output_weights
    assert a.attention_dropout == 0.1


# ---------------------------------------------------------------------------------------------
# DeepSpeed

DS_TOP_KEYS = {"train_batch_size", "train_micro_batch_size_per_gpu",
               "gradient_accumulation_steps", "zero_optimization", "bf16",
               "activation_checkpointing", "pipeline"}
DS_AC_KEYS = {"partition_activations", "cpu_checkpointing", "contiguous_memory_optimization",
              "number_checkpoints", "synchronize_checkpoint_boundary", "profile"}


def test_deepspeed(plan):
    cfg = json.loads(export(plan, "deepspeed"))
    p, b = plan.parallelism, plan.batch
    notes = "\n".join(cfg["_comment"])
    assert {k for k in cfg if not k.startswith("_")} <= DS_TOP_KEYS
    assert set(cfg["activation_checkpointing"]) <= DS_AC_KEYS
    assert cfg["train_micro_batch_size_per_gpu"] == b.micro_batch_size
    assert cfg["gradient_accumulation_steps"] == b.num_microbatches
    assert cfg["train_batch_size"] == b.micro_batch_size * b.num_microbatches * p.dp
    assert cfg["train_batch_size"] == b.global_batch_size
    assert cfg["bf16"] == {"enabled": plan.cluster.gpu.name != "cpu"}

    stage = cfg["zero_optimization"]["stage"]
    if p.pp > 1 and p.zero_stage >= 2:
        assert stage == 1 and f"ZeRO-{p.zero_stage}" in notes
    else:
        assert stage == p.zero_stage

    par = cfg["_parallelism"]
    assert (par["tensor_parallel_size"], par["pipeline_parallel_size"],
            par["data_parallel_size"]) == (p.tp, p.pp, p.dp)
    assert par["planned_layers_per_pipeline_rank"] == plan.layer_counts()
    assert par["planned_layers_per_virtual_stage"] == expected_counts(plan)
    assert f"num_stages={p.pp}" in par["pipeline_module"]

    md = argparse.ArgumentParser(allow_abbrev=False)
    md.add_argument("--deepspeed", action="store_true")
    md.add_argument("--deepspeed_config", type=str)
    md.add_argument("--tensor-model-parallel-size", type=int, default=1)
    md.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    md.add_argument("--no-pipeline-parallel", action="store_true")
    md.add_argument("--sequence-parallel", action="store_true")
    md.add_argument("--zero-stage", type=int, default=1)
    md.add_argument("--micro-batch-size", type=int)
    md.add_argument("--global-batch-size", type=int)
    md.add_argument("--seq-length", type=int)
    md.add_argument("--recompute-granularity", choices=["full", "selective"])
    md.add_argument("--recompute-method", choices=["uniform", "block"])
    md.add_argument("--recompute-num-layers", type=int)
    md.add_argument("--deepspeed-activation-checkpointing", action="store_true")
    md.add_argument("--bf16", action="store_true")
    a = md.parse_args(par["megatron_deepspeed_args"])
    assert a.deepspeed and a.tensor_model_parallel_size == p.tp
    assert a.pipeline_model_parallel_size == p.pp and a.no_pipeline_parallel == (p.pp == 1)
    assert a.zero_stage == stage
    assert (a.micro_batch_size, a.global_batch_size, a.seq_length) == \
        (b.micro_batch_size, b.global_batch_size, b.seq_len)
    assert a.sequence_parallel == (p.sequence_parallel and p.tp > 1)

    active = p.recompute != "none" and any(s.recompute_layers for s in plan.stages)
    interval = cfg.get("pipeline", {}).get("activation_checkpoint_interval", 0)
    if p.pp > 1:
        assert "pipeline" in cfg
        assert interval == (1 if active and p.recompute == "full" else 0)
        assert f"activation_checkpoint_interval={interval}" in par["pipeline_module"]
        if p.vpp > 1:
            assert "interleaved" in notes
        if len(set(plan.layer_counts())) > 1:
            assert "even split" in notes
    else:
        assert "pipeline" not in cfg
    if active:
        assert a.recompute_granularity == p.recompute
        if p.recompute == "full" and any(s.recompute_layers < s.num_layers
                                         for s in plan.stages):
            assert "recompute" in notes
    else:
        assert a.recompute_granularity is None


# ---------------------------------------------------------------------------------------------
# torchtitan

TT_KEYS = {
    "training": {"local_batch_size", "global_batch_size", "seq_len", "mixed_precision_param"},
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree",
                    "fsdp_reshard_after_forward", "tensor_parallel_degree",
                    "enable_async_tensor_parallel", "pipeline_parallel_degree",
                    "pipeline_parallel_schedule", "pipeline_parallel_microbatch_size",
                    "module_fqns_per_model_part", "context_parallel_degree"},
    "activation_checkpoint": {"mode", "selective_ac_option"},
}


def titan_stage_counts(parts, num_layers):
    """Decoder layers per model part; checks embedding/head placement and contiguity."""
    seen = []
    for i, names in enumerate(parts):
        assert ("tok_embeddings" in names) == (i == 0)
        assert ("norm" in names and "output" in names) == (i == len(parts) - 1)
        seen += [int(n.split(".")[1]) for n in names if n.startswith("layers.")]
    assert seen == list(range(num_layers))
    return [sum(n.startswith("layers.") for n in names) for names in parts]


def titan_recomputed(ac, plan):
    """Layers recomputed per virtual stage under torchtitan's AC rules (layer SAC counts layers
    with one process-wide counter over the model parts a rank builds, in order)."""
    counts = expected_counts(plan)
    mode = ac["mode"]
    if mode == "none":
        return [0] * len(counts)
    if mode == "full" or ac.get("selective_ac_option") == "op":
        return list(counts)
    freq = int(ac["selective_ac_option"])
    pp = plan.parallelism.pp
    done = [0] * len(counts)
    for rank in range(pp):
        counter = 0
        for i in range(rank, len(counts), pp):
            for _ in range(counts[i]):
                counter += 1
                done[i] += counter % freq == 0
    return done


def test_torchtitan(plan):
    text = export(plan, "torchtitan")
    cfg = tomllib.loads(text)
    p, b, m = plan.parallelism, plan.batch, plan.model
    notes = "\n".join(line for line in text.splitlines() if line.startswith("# NOTE"))
    assert set(cfg) == set(TT_KEYS)
    for section, keys in TT_KEYS.items():
        assert set(cfg[section]) <= keys, section
    t, par, ac = cfg["training"], cfg["parallelism"], cfg["activation_checkpoint"]

    assert t["seq_len"] == b.seq_len
    assert t["global_batch_size"] == b.global_batch_size
    assert t["mixed_precision_param"] == ("float32" if plan.cluster.gpu.name == "cpu"
                                          else "bfloat16")
    dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
    assert dp == p.dp
    assert par["tensor_parallel_degree"] == p.tp and par["pipeline_parallel_degree"] == p.pp
    assert par["context_parallel_degree"] == 1
    assert dp * p.tp * p.pp == p.world_size
    if p.pp > 1:
        # the pipeline takes the whole local batch in microbatches of the planned size
        mb = par["pipeline_parallel_microbatch_size"]
        assert mb == b.micro_batch_size
        assert t["local_batch_size"] % mb == 0 and t["local_batch_size"] // mb == b.num_microbatches
        assert t["global_batch_size"] == t["local_batch_size"] * dp
        schedule = "1f1b" if p.schedule == "interleaved" and p.vpp == 1 else p.schedule
        assert par["pipeline_parallel_schedule"] == {"1f1b": "1F1B", "gpipe": "GPipe",
                                                     "interleaved": "Interleaved1F1B"}[schedule]
        counts = titan_stage_counts(par["module_fqns_per_model_part"], m.num_layers)
        assert counts == expected_counts(plan)
        assert len(counts) == p.pp * p.vpp
    else:
        # gradient accumulation: global / (local x dp) steps of the micro batch
        assert t["local_batch_size"] == b.micro_batch_size
        assert t["global_batch_size"] // (t["local_batch_size"] * dp) == b.num_microbatches
        assert "module_fqns_per_model_part" not in par

    if p.zero_stage == 0:
        assert par["data_parallel_shard_degree"] == 1
    elif p.dp > 1:
        assert par["data_parallel_shard_degree"] == p.dp
        assert par["fsdp_reshard_after_forward"] == ("always" if p.zero_stage == 3 else "never")
    if p.tp > 1 and not p.sequence_parallel:
        assert "sequence" in notes

    done = titan_recomputed(ac, plan)
    planned = [s.recompute_layers if p.recompute != "none" else 0 for s in plan.stages]
    assert all(d >= r for d, r in zip(done, planned)), (done, planned)
    if any(planned):
        assert ac["mode"] != "none"
    else:
        assert ac["mode"] == "none"
    if done != planned:
        assert "recompute" in notes


def test_torchtitan_partial_recompute_picks_every_nth_layer():
    ac = tomllib.loads(export(PLANS["zero2-pp4"], "torchtitan"))["activation_checkpoint"]
    # stages of 20 layers recompute [10, 6, 2, 0]: the largest share is 1/2
    assert ac == {"mode": "selective", "selective_ac_option": "2"}
    ac = tomllib.loads(export(PLANS["uniform-full"], "torchtitan"))["activation_checkpoint"]
    assert ac == {"mode": "full"}
