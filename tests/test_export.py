"""Exports are exact: parse what each engine would read and check every knob against the plan.

The Megatron parser below mirrors the types and choices of megatron/training/arguments.py for
the flags the exporter may emit (an unknown flag fails the parse); the layer-placement and
recompute helpers re-implement Megatron-core's, DeepSpeed's and torchtitan's own rules
independently of the exporter. Plans come from the search for each engine (what a user gets
from `plan --export E`) and from hand-built plans covering the corners the searches miss; plans
an engine cannot run as priced are refused in one line.
"""
from __future__ import annotations

import argparse
import dataclasses
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

ENGINES = ("megatron", "deepspeed", "torchtitan")
SETUPS = (("llama70b", "h100x32"), ("llama405b", "h100x1024"), ("llama8b", "h100x16"),
          ("llama70b", "a100x64"))
# words a note would use to say the engine runs something other than the plan
INEXACT = re.compile(r"nearest|cannot|instead", re.I)

# ---------------------------------------------------------------------------------------------
# plans


def mkplan(model="llama70b", cluster="h100x32", *, tp=8, pp=4, dp=1, zero=0, sp=True,
           schedule="1f1b", vpp=1, recompute="none", layers=None, rec=None, seq=4096, mbs=1,
           nmb=16, rank_order=("pp", "dp", "tp"), engine="megatron", validate=True,
           precision="bf16", recipe=None, cp=1, cp_comm="p2p"):
    m = model if isinstance(model, Model) else get_model(model)
    c = get_cluster(cluster)
    plan = Plan(model=m, cluster=c,
                parallelism=Parallelism(tp=tp, pp=pp, dp=dp, zero_stage=zero,
                                        sequence_parallel=sp, schedule=schedule, vpp=vpp,
                                        recompute=recompute, rank_order=tuple(rank_order),
                                        cp=cp, cp_comm_type=cp_comm),
                batch=Batch(seq_len=seq, global_batch_size=mbs * nmb * dp,
                            micro_batch_size=mbs, num_microbatches=nmb),
                stages=make_stages(m.num_layers, pp, vpp, layers_per_rank=layers,
                                   recompute_per_rank=rec),
                engine=engine, precision=precision, recipe=recipe)
    if validate:
        plan.validate()
    return plan


# Llama 3.1 8B: Llama 3 8B's shape with 131072 positions (HF meta-llama/Llama-3.1-8B config.json)
LLAMA31_8B = dataclasses.replace(get_model("llama8b"), name="llama3.1-8b", max_seq_len=131072)

TINY = Model("tiny-gpt", num_layers=6, hidden=64, ffn_hidden=256, num_heads=4, num_kv_heads=4,
             vocab_size=1000, max_seq_len=128, gated_mlp=False, activation="gelu",
             norm="layernorm", position="learned", tied_embeddings=True, attn_bias=True,
             linear_bias=True, dropout=0.1)

# Hand-built plans each engine runs exactly, covering corners the searches below do not reach.
MEGATRON_PLANS = {
    # Llama-style, uniform pipeline, full recompute of every layer.
    "uniform-full": mkplan(recompute="full", rec=[20, 20, 20, 20]),
    # First/last stages lighter, interior equal: first/last-stage flags.
    "uneven-first-last": mkplan(layers=[19, 21, 21, 19]),
    "uneven-first-only": mkplan(layers=[17, 21, 21, 21], recompute="full", rec=[3, 3, 3, 3]),
    "uneven-last-only": mkplan(layers=[21, 21, 21, 17], recompute="selective",
                               rec=[21, 21, 21, 17]),
    # Irregular stages: layout string; block recompute of min(4, layers) in every stage.
    "uneven-layout": mkplan(layers=[18, 22, 20, 20], recompute="full", rec=[4, 4, 4, 4]),
    # a stage shorter than the per-chunk recompute count recomputes all its layers
    "layout-short-stage": mkplan(layers=[2, 26, 26, 26], recompute="full", rec=[2, 5, 5, 5]),
    # Interleaved, uneven (layout), 2 layers recomputed in every chunk.
    "interleaved-uneven": mkplan(schedule="interleaved", vpp=2, recompute="full",
                                 layers=[19, 21, 21, 19], rec=[4, 4, 4, 4], seq=8192, nmb=32),
    "interleaved-uniform": mkplan(schedule="interleaved", vpp=2, zero=0),
    "interleaved-first-last": mkplan(schedule="interleaved", vpp=2, layers=[18, 22, 22, 18],
                                     recompute="full", rec=[2, 2, 2, 2]),
    # Data parallel and every ZeRO stage Megatron has, pp = 1 and pp > 1.
    "zero0-dp": mkplan("llama8b", "h100x16", tp=2, pp=1, dp=8, zero=0, recompute="selective",
                       rec=[32], nmb=4),
    "zero1-dp": mkplan("llama8b", "h100x16", tp=2, pp=2, dp=4, zero=1, nmb=8),
    "zero1-dp-interleaved": mkplan("llama70b", "h100x64", tp=4, pp=4, dp=4, zero=1,
                                   schedule="interleaved", vpp=5, nmb=8),
    "zero2-pp1": mkplan("llama8b", "h100x16", tp=4, pp=1, dp=4, zero=2, recompute="selective",
                        rec=[32], nmb=2),
    "zero3-pp1": mkplan("llama8b", "h100x8", tp=1, pp=1, dp=8, zero=3, sp=False,
                        recompute="full", rec=[12], mbs=2, nmb=4),
    # GPT-style: learned positions, LayerNorm, GELU, biases, tied embeddings.
    "gpt3-1f1b": mkplan("gpt3", "h100x128", tp=8, pp=8, dp=2, zero=1, recompute="full",
                        rec=[12] * 8, seq=2048, nmb=16),
    "gpt3-interleaved": mkplan("gpt3", "h100x64", tp=8, pp=8, dp=1, zero=0,
                               schedule="interleaved", vpp=3, recompute="selective",
                               rec=[12] * 8, seq=2048, nmb=16),
    # Other rank order, no sequence parallel, no recompute.
    "rank-order-dp-pp-tp": mkplan(layers=[20, 20, 20, 20], sp=False, dp=1, zero=0,
                                  rank_order=("dp", "pp", "tp")),
    # fp32 CPU cluster, tiny GPT, ZeRO-0 with pp.
    "cpu-tiny": mkplan(TINY, "cpux4", tp=1, pp=2, dp=2, zero=0, sp=False, seq=128, mbs=2,
                       nmb=2),
    # recompute picked but applied to no layer
    "recompute-on-nothing": mkplan(recompute="full", rec=[0, 0, 0, 0], zero=0),
    # low precision (Transformer Engine recipes)
    "fp8-tensorwise": mkplan("llama70b", "h100x64", tp=4, pp=8, dp=2, zero=1,
                             schedule="interleaved", vpp=5, seq=8192, nmb=64,
                             precision="fp8", recipe="tensorwise"),
    "fp8-delayed-fsdp": mkplan("llama8b", "h100x8", tp=1, pp=1, dp=8, zero=3, sp=False,
                               nmb=16, seq=8192, precision="fp8", recipe="delayed"),
    "mxfp8-b200": mkplan("llama8b", "b200x8", tp=1, pp=1, dp=8, zero=0, sp=False, mbs=2,
                         nmb=8, seq=8192, precision="mxfp8", recipe="mxfp8"),
    # ZeRO-3 in MXFP8: FP8 primary weights (--fp8-param-gather), MXFP8's own in Megatron-FSDP
    "mxfp8-fsdp-b200": mkplan("llama8b", "b200x8", tp=2, pp=1, dp=4, zero=3, mbs=2, nmb=8,
                              seq=8192, precision="mxfp8", recipe="mxfp8"),
    "nvfp4-gb200": mkplan("llama70b", "gb200x72", tp=4, pp=2, dp=9, zero=1, mbs=1, nmb=8,
                          seq=8192, precision="nvfp4", recipe="nvfp4"),
}

DEEPSPEED_PLANS = {
    "pp4-zero1-full": mkplan("llama70b", "h100x64", tp=4, pp=4, dp=4, zero=1, recompute="full",
                             rec=[20] * 4, nmb=8, engine="deepspeed"),
    "pp4-zero0-selective": mkplan(tp=8, pp=4, dp=1, zero=0, recompute="selective",
                                  rec=[20] * 4, engine="deepspeed"),
    "pp2-zero0-dp-nosp": mkplan("llama8b", "h100x16", tp=2, pp=2, dp=4, zero=0, sp=False,
                                nmb=8, engine="deepspeed"),
    "pp1-zero2-selective": mkplan("llama8b", "h100x16", tp=4, pp=1, dp=4, zero=2,
                                  recompute="selective", rec=[32], nmb=2, engine="deepspeed"),
    "pp1-zero3-full": mkplan("llama8b", "h100x8", tp=1, pp=1, dp=8, zero=3, sp=False,
                             recompute="full", rec=[32], mbs=2, nmb=4, engine="deepspeed"),
    "cpu-tiny": mkplan(TINY, "cpux4", tp=1, pp=2, dp=2, zero=0, sp=False, seq=128, mbs=2,
                       nmb=2, engine="deepspeed"),
}

TORCHTITAN_PLANS = {
    "interleaved-uneven-full": mkplan(schedule="interleaved", vpp=2, zero=0, recompute="full",
                                      layers=[19, 21, 21, 19], rec=[19, 21, 21, 19], nmb=32,
                                      engine="torchtitan"),
    "gpipe-zero3": mkplan("llama70b", "h100x64", tp=4, pp=4, dp=4, zero=3, schedule="gpipe",
                          layers=[18, 22, 22, 18], nmb=8, engine="torchtitan"),
    "1f1b-zero2-op": mkplan("llama70b", "h100x64", tp=4, pp=4, dp=4, zero=2, recompute="op",
                            rec=[20] * 4, nmb=8, engine="torchtitan"),
    "ddp-1d": mkplan("llama8b", "h100x8", tp=1, pp=1, dp=8, zero=0, sp=False, mbs=2, nmb=4,
                     engine="torchtitan"),
    "fsdp-zero3-tp": mkplan("llama8b", "h100x16", tp=2, pp=1, dp=8, zero=3, recompute="full",
                            rec=[32], nmb=4, engine="torchtitan"),
    "cpu-tiny": mkplan(TINY, "cpux4", tp=1, pp=2, dp=2, zero=2, sp=False, seq=128, mbs=2,
                       nmb=2, engine="torchtitan"),
    "fp8-tensorwise-fsdp": mkplan("llama8b", "h100x8", tp=1, pp=1, dp=8, zero=3, sp=False,
                                  mbs=2, nmb=1, seq=8192, engine="torchtitan",
                                  precision="fp8", recipe="tensorwise"),
    "fp8-tensorwise-ddp": mkplan("llama8b", "h100x8", tp=1, pp=1, dp=8, zero=0, sp=False,
                                 mbs=1, nmb=2, seq=8192, engine="torchtitan",
                                 precision="fp8", recipe="tensorwise"),
    "fp8-rowwise-tp": mkplan("llama70b", "h100x64", tp=8, pp=1, dp=8, zero=3, recompute="full",
                             rec=[80], mbs=2, nmb=1, seq=8192, engine="torchtitan",
                             precision="fp8", recipe="rowwise"),
    "mxfp8-b200": mkplan("llama8b", "b200x8", tp=1, pp=1, dp=8, zero=3, sp=False, mbs=2,
                         nmb=1, seq=8192, engine="torchtitan", precision="mxfp8",
                         recipe="mxfp8"),
    # context parallel: FSDP over dp x cp, the two rotate methods
    "cp8-fsdp1-allgather": mkplan(LLAMA31_8B, "h100x8", tp=1, pp=1, dp=1, zero=3, sp=False,
                                  recompute="full", rec=[32], nmb=1, seq=131072,
                                  engine="torchtitan", cp=8, cp_comm="all_gather"),
    "cp2-tp8-pp8-alltoall": mkplan("llama70b", "h100x512", tp=8, pp=8, dp=4, zero=2,
                                   recompute="full", rec=[10] * 8, nmb=8, seq=8192,
                                   engine="torchtitan", cp=2, cp_comm="p2p"),
}
for _kind in ("p2p", "all_gather", "a2a"):
    # tp 4 leaves 2 KV heads per rank: Ulysses (a2a) splits them over cp 2
    MEGATRON_PLANS[f"cp2-{_kind}"] = mkplan("llama70b", "h100x64", tp=4, pp=4, dp=2, zero=1,
                                            seq=8192, nmb=8, cp=2, cp_comm=_kind)
MEGATRON_PLANS["cp4-tp-pp-dp-mapping"] = mkplan(
    "llama70b", "h100x64", tp=4, pp=2, dp=2, zero=1, seq=8192, nmb=4, cp=4,
    rank_order=("dp", "pp", "cp", "tp"))

HAND_PLANS = {"megatron": MEGATRON_PLANS, "deepspeed": DEEPSPEED_PLANS,
              "torchtitan": TORCHTITAN_PLANS}
HAND_IDS = [(e, k) for e in ENGINES for k in sorted(HAND_PLANS[e])]


@pytest.fixture(scope="module")
def searched():
    """The search's best plan for (engine, model, cluster), each searched once per module."""
    from planner.search import search, to_plan
    cache = {}

    def get(engine, model, cluster):
        key = (engine, model, cluster)
        if key not in cache:
            m, c = get_model(model), get_cluster(cluster)
            report = search(m, c, engine=engine)
            assert report.best is not None, key
            cache[key] = to_plan(m, c, report.best, report)
        return cache[key]
    return get


SEARCH_IDS = [(e, m, c) for e in ENGINES for m, c in SETUPS]


def expected_counts(plan):
    return [s.num_layers for s in plan.stages]


def expected_recompute(plan):
    """Layers recomputed per virtual stage, as planned."""
    if plan.parallelism.recompute == "none":
        return [0] * len(plan.stages)
    return [s.recompute_layers for s in plan.stages]


def check_export(plan, engine):
    text = export(plan, engine)
    {"megatron": check_megatron, "deepspeed": check_deepspeed,
     "torchtitan": check_torchtitan}[engine](plan, text)
    return text


@pytest.mark.parametrize("engine,model,cluster", SEARCH_IDS,
                         ids=["-".join(x) for x in SEARCH_IDS])
def test_searched_plan_exports_exactly(searched, engine, model, cluster):
    plan = searched(engine, model, cluster)
    assert plan.engine == engine
    check_export(plan, engine)


@pytest.mark.parametrize("engine,name", HAND_IDS, ids=["-".join(x) for x in HAND_IDS])
def test_hand_plan_exports_exactly(engine, name):
    check_export(HAND_PLANS[engine][name], engine)


# ---------------------------------------------------------------------------------------------
# dispatch


def test_exporters_registered():
    assert set(EXPORTERS) == {"megatron", "deepspeed", "torchtitan"}
    for fmt, fn in EXPORTERS.items():
        p = next(iter(HAND_PLANS[fmt].values()))
        assert export(p, fmt) == fn(p)
    p = MEGATRON_PLANS["uniform-full"]
    assert export(p, "Megatron") == EXPORTERS["megatron"](p)


def test_unknown_format_is_one_clear_line():
    with pytest.raises(BadInput) as e:
        export(MEGATRON_PLANS["uniform-full"], "nemo")
    msg = str(e.value)
    assert "\n" not in msg and "'nemo'" in msg
    for fmt in EXPORTERS:
        assert fmt in msg


def test_invalid_plan_is_refused():
    for fmt in EXPORTERS:
        p = mkplan(engine=fmt, zero=0)
        p.batch = Batch(seq_len=4096, global_batch_size=17, micro_batch_size=1,
                        num_microbatches=16)
        with pytest.raises(BadInput):
            export(p, fmt)


def test_exporters_do_not_import_torch():
    code = ("import sys, planner.export, planner.launch; "
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------------
# refusals: what the engine cannot run as priced is refused in one line that names it

REFUSED = {
    "megatron-gpipe": ("megatron", dict(schedule="gpipe"), "gpipe"),
    "megatron-zero2-pp": ("megatron", dict(model="llama70b", cluster="h100x64", tp=4, pp=4,
                                           dp=4, zero=2, nmb=8), "ZeRO-2"),
    "megatron-zero3-pp": ("megatron", dict(model="llama70b", cluster="h100x64", tp=8, pp=2,
                                           dp=4, zero=3, nmb=8), "ZeRO-3"),
    # block recompute is one count per chunk: [6, 4, 2, 0] is not min(R, layers) for any R
    "megatron-per-stage-recompute": ("megatron", dict(layers=[18, 22, 20, 20],
                                                      recompute="full", rec=[6, 4, 2, 0]),
                                     "recompute"),
    # interleaved: each chunk of 10 layers; 2 and 1 recomputed are two different counts
    "megatron-per-chunk-mismatch": ("megatron", dict(schedule="interleaved", vpp=2,
                                                     recompute="full", rec=[4, 2, 4, 4]),
                                    "recompute"),
    "megatron-partial-selective": ("megatron", dict(recompute="selective", rec=[20, 20, 10, 20]),
                                   "recompute"),
    "deepspeed-uneven": ("deepspeed", dict(layers=[19, 21, 21, 19]), "not 19,21,21,19"),
    "deepspeed-vpp": ("deepspeed", dict(schedule="interleaved", vpp=2), "interleaved"),
    "deepspeed-gpipe": ("deepspeed", dict(schedule="gpipe"), "gpipe"),
    "deepspeed-zero2-pp": ("deepspeed", dict(model="llama70b", cluster="h100x64", tp=4, pp=4,
                                             dp=4, zero=2, nmb=8), "ZeRO-2"),
    "deepspeed-partial-recompute": ("deepspeed", dict(recompute="full", rec=[10, 10, 10, 10]),
                                    "recompute"),
    "deepspeed-partial-pp1": ("deepspeed", dict(model="llama8b", cluster="h100x16", tp=2, pp=1,
                                                dp=8, zero=1, recompute="full", rec=[16],
                                                nmb=4), "recompute"),
    "torchtitan-zero1": ("torchtitan", dict(model="llama8b", cluster="h100x16", tp=2, pp=2,
                                            dp=4, zero=1, nmb=8), "ZeRO-1"),
    "torchtitan-zero1-pp1": ("torchtitan", dict(model="llama8b", cluster="h100x8", tp=1, pp=1,
                                                dp=8, zero=1, sp=False, nmb=4), "ZeRO-1"),
    "torchtitan-no-sp": ("torchtitan", dict(sp=False, zero=0), "sequence"),
    "torchtitan-ddp-with-tp": ("torchtitan", dict(model="llama8b", cluster="h100x16", tp=2,
                                                  pp=1, dp=8, zero=0, nmb=4), "ZeRO-0"),
    "torchtitan-partial-recompute": ("torchtitan", dict(zero=0, recompute="full",
                                                        rec=[20, 20, 20, 5]), "recompute"),
    "torchtitan-partial-op": ("torchtitan", dict(zero=0, recompute="op", rec=[10, 10, 10, 10]),
                              "recompute"),
    "torchtitan-selective": ("torchtitan", dict(zero=0, recompute="selective",
                                                rec=[20, 20, 20, 20]), "selective"),
    # precisions the engine does not run
    "deepspeed-fp8": ("deepspeed", dict(tp=8, pp=4, dp=1, zero=0, precision="fp8",
                                        recipe="tensorwise"), "fp8"),
    "torchtitan-nvfp4": ("torchtitan", dict(model="llama8b", cluster="b200x8", tp=1, pp=1,
                                            dp=8, zero=3, sp=False, nmb=1, precision="nvfp4",
                                            recipe="nvfp4"), "nvfp4"),
    "torchtitan-te-recipe": ("torchtitan", dict(zero=0, precision="fp8", recipe="delayed"),
                             "delayed"),
    # context parallelism the engine does not run
    "deepspeed-cp": ("deepspeed", dict(model=LLAMA31_8B, cluster="h100x16", tp=2, pp=1, dp=4,
                                       zero=1, seq=16384, nmb=4, cp=2), "context parallel"),
    "torchtitan-cp-a2a": ("torchtitan", dict(model=LLAMA31_8B, cluster="h100x16", tp=2, pp=1,
                                             dp=4, zero=3, seq=16384, nmb=4, cp=2,
                                             cp_comm="a2a"), "a2a"),
}


def test_vpp_on_pp1_is_refused_by_every_exporter():
    """Model chunks without pipelining are invalid for every engine (planner.rules, through
    Plan.validate): refused in one line naming the chunks."""
    for fmt in EXPORTERS:
        plan = mkplan(model="llama8b", cluster="h100x8", pp=1, schedule="interleaved", vpp=2,
                      zero=0, nmb=4, engine=fmt, validate=False)
        with pytest.raises(BadInput) as e:
            export(plan, fmt)
        msg = str(e.value)
        assert "\n" not in msg and "chunk" in msg and "pp > 1" in msg, msg


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused(case):
    engine, kw, needle = REFUSED[case]
    plan = mkplan(**kw, engine=engine)
    with pytest.raises(BadInput) as e:
        export(plan, engine)
    msg = str(e.value)
    assert "\n" not in msg and engine in msg
    assert needle.lower() in msg.lower(), msg
    # refused for that one reason alone: the rest of the plan is something the engine runs
    from planner.engines import get_engine
    from planner.engines.runnable import problems
    assert len(problems(plan, get_engine(engine))) == 1, msg


CROSS = [(s, t) for s in ENGINES for t in ENGINES if s != t]


@pytest.mark.parametrize("source,target", CROSS, ids=[f"{s}-to-{t}" for s, t in CROSS])
def test_plan_priced_for_another_engine_is_refused(source, target):
    # every engine runs this plan: 1F1B, equal stages, sp, ZeRO-0 on one replica, no recompute
    plan = mkplan(zero=0, engine=source)
    assert export(plan, source)
    with pytest.raises(BadInput) as e:
        export(plan, target)
    msg = str(e.value)
    assert "\n" not in msg and source in msg and f"--engine {target}" in msg


def test_saved_plan_priced_for_megatron_is_refused_by_show_export(tmp_path, capsys):
    from planner.cli import main
    saved = tmp_path / "saved.json"
    assert main(["--model", "llama8b", "--cluster", "h100x16", "--engine", "megatron",
                 "--out", str(saved)]) == 0
    assert json.loads(saved.read_text())["engine"] == "megatron"
    capsys.readouterr()
    assert main(["show", str(saved), "--export", "torchtitan"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert "megatron" in err and "torchtitan" in err
    # the plan's own engine exports it
    assert main(["show", str(saved), "--export", "megatron"]) == 0
    out, err = capsys.readouterr()
    megatron_parser().parse_args(megatron_tokens(out))


def test_cli_export_must_match_engine(capsys):
    from planner.cli import main
    assert main(["--model", "llama8b", "--cluster", "h100x16", "--engine", "megatron",
                 "--export", "torchtitan"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert "megatron" in err and "torchtitan" in err


def test_cli_export_implies_engine(capsys):
    from planner.cli import main
    assert main(["--model", "llama8b", "--cluster", "h100x16", "--export", "torchtitan"]) == 0
    cfg = tomllib.loads(capsys.readouterr().out)
    assert cfg["parallelism"]["data_parallel_shard_degree"] * \
        cfg["parallelism"]["data_parallel_replicate_degree"] * \
        cfg["parallelism"]["tensor_parallel_degree"] * \
        cfg["parallelism"]["pipeline_parallel_degree"] == 16


# ---------------------------------------------------------------------------------------------
# Megatron-LM


def megatron_parser():
    """Megatron's own types, defaults and choices for the flags the exporter uses."""
    ap = argparse.ArgumentParser(allow_abbrev=False)
    a = ap.add_argument
    a("--tensor-model-parallel-size", type=int, default=1)
    a("--pipeline-model-parallel-size", type=int, default=1)
    a("--sequence-parallel", action="store_true")
    a("--tp-comm-overlap", action="store_true")
    a("--context-parallel-size", type=int, default=1)
    a("--cp-comm-type", nargs="+", type=str, default=["p2p"])
    a("--decoder-first-pipeline-num-layers", type=int, default=None)
    a("--decoder-last-pipeline-num-layers", type=int, default=None)
    a("--pipeline-model-parallel-layout", type=str, default=None)
    a("--num-layers-per-virtual-pipeline-stage", type=int, default=None)
    a("--num-virtual-stages-per-pipeline-rank", type=int, default=None)
    a("--use-tp-pp-dp-mapping", action="store_true")
    a("--use-distributed-optimizer", action="store_true")
    # the optimizer's CPU offload (arguments.py _add_training_args / _add_optimizer_args)
    a("--optimizer-cpu-offload", action="store_true")
    a("--optimizer-offload-fraction", type=float, default=1.0)
    a("--use-precision-aware-optimizer", action="store_true")
    a("--overlap-cpu-optimizer-d2h-h2d", action="store_true")
    a("--overlap-grad-reduce", action="store_true")
    a("--overlap-param-gather", action="store_true")
    a("--no-gradient-accumulation-fusion", action="store_false", dest="gradient_accumulation_fusion")
    a("--use-megatron-fsdp", action="store_true")
    a("--data-parallel-sharding-strategy", type=str, default="no_shard",
      choices=["no_shard", "optim", "optim_grads", "optim_grads_params"])
    a("--ckpt-format", default="torch_dist",
      choices=["torch", "torch_dist", "zarr", "torch_dcp", "fsdp_dtensor"])
    a("--recompute-granularity", type=str, default=None, choices=["full", "selective"])
    a("--recompute-method", type=str, default=None, choices=["uniform", "block"])
    a("--recompute-num-layers", type=int, default=None)
    # a TransformerConfig field (megatron/training/arguments.py ArgumentGroupFactory); > 0
    # sets cpu_offloading (arguments.py validate_args)
    a("--cpu-offloading-num-layers", type=int, default=0)
    a("--recompute-modules", nargs="*", type=str, default=None)
    a("--micro-batch-size", type=int, default=None)
    a("--global-batch-size", type=int, default=None)
    a("--seq-length", type=int, default=None)
    a("--bf16", action="store_true")
    # Transformer Engine (megatron/training/arguments.py, _add_transformer_engine_args)
    a("--fp8-format", default=None, choices=["e4m3", "hybrid"], dest="fp8")
    a("--fp8-recipe", default="delayed", choices=["tensorwise", "delayed", "mxfp8", "blockwise"],
      dest="fp8_recipe")
    # megatron/training/arguments.py _add_mixed_precision_args; validate_args: "only
    # supported with distributed optimizer, torch fsdp2, megatron fsdp, or inference mode", and
    # with --optimizer-cpu-offload only under the delayed recipe
    a("--fp8-param-gather", action="store_true")
    # a TransformerConfig field (transformer_config.py), its flag made by ArgumentGroupFactory;
    # validate_args refuses it with the no_shard strategy
    a("--init-model-with-meta-device", action="store_true")
    a("--fp4-format", default=None, choices=["e2m1"], dest="fp4")
    a("--fp4-recipe", default="nvfp4", choices=["nvfp4"], dest="fp4_recipe")
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


def megatron_world(text):
    """The GPU count the fragment says to launch on (torchrun's WORLD_SIZE)."""
    m = re.search(r"^# launch on (\d+) GPUs", text, re.M)
    assert m, text
    return int(m.group(1))


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
    """Layers Megatron recomputes in each model chunk, or whose activations it offloads."""
    if a.cpu_offloading_num_layers > 0:
        # megatron/core/transformer/transformer_config.py: no recompute, no pipelining, fewer
        # layers than the model's; TE's context offloads the first N layers
        assert a.recompute_granularity is None and a.pipeline_model_parallel_size == 1
        assert len(counts) == 1 and a.cpu_offloading_num_layers < counts[0]
        return [a.cpu_offloading_num_layers]
    if a.recompute_granularity is None:
        assert a.recompute_method is None and a.recompute_num_layers is None
        return [0] * len(counts)
    if a.recompute_granularity == "selective":
        assert a.recompute_method is None          # Megatron rejects a method with selective
        return list(counts)
    assert a.recompute_method is not None          # full needs a method
    if a.recompute_method == "block":
        return [min(a.recompute_num_layers, n) for n in counts]
    assert a.recompute_num_layers == 1              # uniform, one layer per checkpoint group
    return list(counts)


def notes_of(text):
    return [line for line in text.splitlines() if line.lstrip("# ").startswith("NOTE")]


def megatron_precision(a):
    """(precision, recipe) Megatron runs the linears in, from its TE flags."""
    if a.fp4 is not None:
        assert a.fp8 is None
        return "nvfp4", a.fp4_recipe
    if a.fp8 is None:
        return "bf16", None
    if a.fp8_recipe == "mxfp8":
        assert a.fp8 == "e4m3"
        return "mxfp8", "mxfp8"
    assert a.fp8 == "hybrid"            # E4M3 forward, E5M2 gradients
    return "fp8", a.fp8_recipe


def check_megatron(plan, text):
    p, m, b = plan.parallelism, plan.model, plan.batch
    assert not [n for n in notes_of(text) if INEXACT.search(n)], notes_of(text)
    tokens = megatron_tokens(text)

    # bash itself reads the fragment into the same argv
    if shutil.which("bash"):
        out = subprocess.run(["bash", "-c", 'set -eu; eval "$1"; printf "%s\\0" '
                              '"${MEGATRON_ARGS[@]}"', "_", text],
                             check=True, capture_output=True, text=True).stdout
        assert out.split("\0")[:-1] == tokens

    a = megatron_parser().parse_args(tokens)
    # degrees: Megatron infers dp from the world size
    assert a.tensor_model_parallel_size == p.tp
    assert a.pipeline_model_parallel_size == p.pp
    world = megatron_world(text)
    # Megatron: data-parallel size = world / (tp x cp x pp) (megatron/core/parallel_state.py)
    cp = a.context_parallel_size
    assert cp == p.cp
    assert world % (p.tp * cp * p.pp) == 0 and world // (p.tp * cp * p.pp) == p.dp
    assert world == p.world_size <= plan.cluster.num_gpus
    # one comm type for every layer (Megatron takes a list, one per layer, or one for all)
    assert a.cp_comm_type == [p.cp_comm_type] or cp == 1
    assert a.sequence_parallel == (p.sequence_parallel and p.tp > 1)
    # TP communication overlap exactly as priced; Megatron asserts it only with sequence
    # parallelism (megatron/training/arguments.py validate_args)
    assert a.tp_comm_overlap == p.tp_comm_overlap
    assert not a.tp_comm_overlap or a.sequence_parallel
    # batch: Megatron derives the micro-batch count from global / (micro x dp)
    assert a.micro_batch_size == b.micro_batch_size
    assert a.global_batch_size == b.global_batch_size
    assert a.global_batch_size % (a.micro_batch_size * p.dp) == 0
    assert a.global_batch_size // (a.micro_batch_size * p.dp) == b.num_microbatches
    assert a.seq_length == b.seq_len
    assert a.bf16 == (plan.cluster.gpu.name != "cpu")
    assert megatron_precision(a) == (plan.precision, plan.recipe)
    assert a.use_tp_pp_dp_mapping == (tuple(p.rank_order) == ("dp", "pp", "cp", "tp"))
    # one hardware queue where Megatron wants it with TP; more where the EP overlap's
    # all-to-all stream must run beside the compute (Megatron-Bridge sets 32 for it)
    assert ("CUDA_DEVICE_MAX_CONNECTIONS=1 " in text) == (
        p.tp > 1 and not a.use_megatron_fsdp and not p.ep_comm_overlap)
    assert ("CUDA_DEVICE_MAX_CONNECTIONS=32 " in text) == p.ep_comm_overlap

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

    # pipeline placement and schedule, exactly as planned: Megatron runs 1F1B, interleaved
    # when a rank holds more than one model chunk; it has no GPipe
    counts, vpp = megatron_stage_counts(a, m.num_layers)
    if p.pp > 1:
        assert counts == expected_counts(plan)
        assert vpp == p.vpp
        assert p.schedule == ("interleaved" if vpp > 1 else "1f1b") or \
            (p.schedule == "interleaved" and p.vpp == 1)
    else:
        assert vpp == 1 and p.vpp == 1
        assert a.pipeline_model_parallel_layout is None
        counts = [m.num_layers]
    if p.pp > 1 and len(set(plan.layer_counts())) > 1:
        edges_only = len(set(plan.layer_counts()[1:-1])) <= 1
        if edges_only and all(n % p.vpp == 0 for n in plan.layer_counts()):
            assert a.pipeline_model_parallel_layout is None   # the simpler flags suffice

    # recompute: every stage recomputes exactly its planned layers
    assert megatron_recomputed(a, counts) == expected_recompute(plan)
    if any(expected_recompute(plan)):
        assert (a.cpu_offloading_num_layers > 0 if p.recompute == "offload"
                else a.recompute_granularity == p.recompute)

    # ZeRO: 1 is the distributed optimizer, 2/3 Megatron-FSDP (no pipelining)
    if p.zero_stage == 0:
        assert not a.use_distributed_optimizer and not a.use_megatron_fsdp
        assert a.data_parallel_sharding_strategy == "no_shard"
    elif p.zero_stage == 1:
        assert a.use_distributed_optimizer and not a.use_megatron_fsdp
        assert a.data_parallel_sharding_strategy == "no_shard"
    else:
        assert p.pp == 1
        assert a.use_megatron_fsdp and a.use_distributed_optimizer
        assert a.ckpt_format == "fsdp_dtensor"
        # materialised sharded, as priced: not each rank's whole tp shard first
        assert a.init_model_with_meta_device
        assert a.data_parallel_sharding_strategy == {2: "optim_grads",
                                                     3: "optim_grads_params"}[p.zero_stage]
    # FP8 primary weights: Megatron's own conditions (arguments.py validate_args), and on
    # every ZeRO-3 FP8 plan, whose TE weight caches the planner prices as FP8 shards
    if a.fp8_param_gather:
        assert a.fp8 is not None and (a.use_distributed_optimizer or a.use_megatron_fsdp)
        assert not a.optimizer_cpu_offload or a.fp8_recipe == "delayed"
    assert a.fp8_param_gather == (p.zero_stage == 3 and plan.precision in ("fp8", "mxfp8")
                                  and (p.offload_optimizer == "none"
                                       or plan.recipe == "delayed"))
    # and `plan` says so where it says what the linears run in
    from planner.explain import precision_label
    assert ("FP8 primary weights" in precision_label(plan)) == a.fp8_param_gather
    # overlaps the megatron engine prices (arguments.py: param gather needs the distributed
    # optimizer and the overlapped grad reduce)
    assert a.overlap_grad_reduce == (p.dp * p.cp > 1)   # gradients reduced over dp x cp
    if a.use_distributed_optimizer:
        assert a.overlap_param_gather, "--overlap-param-gather missing (ZeRO-%d)" % p.zero_stage
    if a.overlap_param_gather:
        assert a.use_distributed_optimizer and a.overlap_grad_reduce


def test_megatron_example_uses_layout():
    a = megatron_parser().parse_args(megatron_tokens(export(MEGATRON_PLANS["interleaved-uneven"],
                                                             "megatron")))
    assert a.pipeline_model_parallel_layout == "Et*9|t*10|t*10|t*9|t*10|t*11|t*11|t*10L"
    assert a.num_virtual_stages_per_pipeline_rank is None
    assert a.recompute_num_layers == 2 and a.recompute_method == "block"


def test_megatron_short_stage_recomputes_all_its_layers():
    a = megatron_parser().parse_args(megatron_tokens(export(MEGATRON_PLANS["layout-short-stage"],
                                                             "megatron")))
    assert a.recompute_num_layers == 5 and a.recompute_method == "block"
    assert a.decoder_first_pipeline_num_layers == 2


def test_megatron_first_last_flags():
    a = megatron_parser().parse_args(megatron_tokens(export(MEGATRON_PLANS["uneven-first-last"],
                                                             "megatron")))
    assert (a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers) == (19, 19)
    a = megatron_parser().parse_args(megatron_tokens(export(MEGATRON_PLANS["uneven-first-only"],
                                                             "megatron")))
    assert (a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers) == (17, None)
    a = megatron_parser().parse_args(megatron_tokens(
        export(MEGATRON_PLANS["interleaved-first-last"], "megatron")))
    assert a.num_virtual_stages_per_pipeline_rank == 2
    assert (a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers) == (18, 18)


def test_megatron_gpt_model_flags():
    a = megatron_parser().parse_args(megatron_tokens(export(MEGATRON_PLANS["gpt3-1f1b"],
                                                             "megatron")))
    assert a.position_embedding_type == "learned_absolute" and a.normalization == "LayerNorm"
    assert not a.swiglu and a.add_bias_linear and not a.untie_embeddings_and_output_weights
    assert a.attention_dropout == 0.1


# ---------------------------------------------------------------------------------------------
# DeepSpeed

DS_TOP_KEYS = {"train_batch_size", "train_micro_batch_size_per_gpu",
               "gradient_accumulation_steps", "zero_optimization", "bf16", "data_types",
               "activation_checkpointing", "pipeline"}
DS_AC_KEYS = {"partition_activations", "cpu_checkpointing", "contiguous_memory_optimization",
              "number_checkpoints", "synchronize_checkpoint_boundary", "profile"}


def deepspeed_md_parser():
    """Megatron-DeepSpeed's flags the exporter hands over (types and choices as there)."""
    md = argparse.ArgumentParser(allow_abbrev=False)
    a = md.add_argument
    a("--deepspeed", action="store_true")
    a("--deepspeed_config", type=str)
    a("--tensor-model-parallel-size", type=int, default=1)
    a("--pipeline-model-parallel-size", type=int, default=1)
    a("--no-pipeline-parallel", action="store_true")
    a("--sequence-parallel", action="store_true")
    a("--zero-stage", type=int, default=1)
    a("--micro-batch-size", type=int)
    a("--global-batch-size", type=int)
    a("--seq-length", type=int)
    a("--recompute-granularity", choices=["full", "selective"])
    a("--recompute-method", choices=["uniform", "block"])
    a("--recompute-num-layers", type=int)
    a("--deepspeed-activation-checkpointing", action="store_true")
    a("--bf16", action="store_true")
    return md


def deepspeed_partition(num_layers, num_stages):
    """Decoder layers per stage of PipelineModule's 'type:transformer'/'uniform' partitioning
    (deepspeed.runtime.utils.partition_uniform)."""
    chunk, residual = divmod(num_layers, num_stages)
    return [chunk + (1 if i < residual else 0) for i in range(num_stages)]


def check_deepspeed(plan, text):
    cfg = json.loads(text)
    p, b, m = plan.parallelism, plan.batch, plan.model
    assert not [n for n in cfg["_comment"] if INEXACT.search(n)], cfg["_comment"]
    assert {k for k in cfg if not k.startswith("_")} <= DS_TOP_KEYS
    assert set(cfg["activation_checkpointing"]) <= DS_AC_KEYS

    # batch: DeepSpeed asserts train_batch = micro x gas x dp, and derives dp from it
    mbs, gas = cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]
    assert mbs == b.micro_batch_size
    assert gas == b.num_microbatches
    assert cfg["train_batch_size"] == b.global_batch_size
    assert cfg["train_batch_size"] % (mbs * gas) == 0
    assert cfg["train_batch_size"] // (mbs * gas) == p.dp
    assert cfg["bf16"] == {"enabled": plan.cluster.gpu.name != "cpu"}

    # ZeRO and the overlaps / fp32 accumulation the deepspeed engine prices
    zo = cfg["zero_optimization"]
    assert zo["stage"] == p.zero_stage
    assert zo["overlap_comm"] is True
    assert cfg["data_types"]["grad_accum_dtype"] == "fp32"
    if p.pp > 1:
        assert zo["stage"] < 2       # the PipelineEngine asserts this

    # degrees: Megatron-DeepSpeed's flags carry tp and pp
    par = cfg["_parallelism"]
    a = deepspeed_md_parser().parse_args(par["megatron_deepspeed_args"])
    assert a.deepspeed and a.deepspeed_config
    assert a.tensor_model_parallel_size == p.tp == par["tensor_parallel_size"]
    assert a.pipeline_model_parallel_size == p.pp == par["pipeline_parallel_size"]
    assert par["data_parallel_size"] == p.dp
    assert a.tensor_model_parallel_size * a.pipeline_model_parallel_size * p.dp == p.world_size
    assert a.no_pipeline_parallel == (p.pp == 1)
    assert a.zero_stage == p.zero_stage
    assert (a.micro_batch_size, a.global_batch_size, a.seq_length) == \
        (b.micro_batch_size, b.global_batch_size, b.seq_len)
    assert a.sequence_parallel == (p.sequence_parallel and p.tp > 1)
    assert a.bf16 == (plan.cluster.gpu.name != "cpu")

    # pipeline: DeepSpeed's own 1F1B TrainSchedule, one chunk per rank, its uniform split
    pm = par["pipeline_module"]
    assert f"num_stages={p.pp}" in pm
    per_rank = deepspeed_partition(m.num_layers, p.pp)
    assert per_rank == plan.layer_counts() == par["planned_layers_per_pipeline_rank"]
    if p.pp > 1:
        assert p.schedule == "1f1b" and p.vpp == 1
        assert "pipeline" in cfg
    else:
        assert "pipeline" not in cfg

    # recompute per rank: interval 1 checkpoints every layer; Megatron-DeepSpeed's uniform
    # method with 1 layer per group, or selective, covers every layer too
    interval = int(re.search(r"activation_checkpoint_interval=(\d+)", pm).group(1))
    if p.pp > 1:
        assert cfg["pipeline"]["activation_checkpoint_interval"] == interval
    if a.recompute_granularity == "full":
        assert a.recompute_method == "uniform" and a.recompute_num_layers == 1
        assert a.deepspeed_activation_checkpointing
        assert interval == 1
    elif a.recompute_granularity == "selective":
        assert a.recompute_method is None and interval == 0
    else:
        assert interval == 0 and a.recompute_method is None
    done = per_rank if (interval == 1 or a.recompute_granularity) else [0] * p.pp
    planned = [sum(r for s, r in zip(plan.stages, expected_recompute(plan)) if s.pp_rank == k)
               for k in range(p.pp)]
    assert done == planned
    if any(planned):
        assert a.recompute_granularity == p.recompute


# ---------------------------------------------------------------------------------------------
# torchtitan

TT_KEYS = {
    "training": {"local_batch_size", "global_batch_size", "seq_len", "mixed_precision_param",
                 "mixed_precision_reduce"},
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree",
                    "fsdp_reshard_after_forward", "tensor_parallel_degree",
                    "enable_async_tensor_parallel", "pipeline_parallel_degree",
                    "pipeline_parallel_schedule", "pipeline_parallel_microbatch_size",
                    "module_fqns_per_model_part", "context_parallel_degree",
                    "context_parallel_rotate_method"},
    "activation_checkpoint": {"mode", "selective_ac_option"},
    # torchtitan/config/job_config.py Compile (9810191bb's parent)
    "compile": {"enable", "components", "backend"},
}
# low precision: [model] converters and the converter's [quantize.linear.*] section, as
# torchtitan's config at its last release that reads TOML has them (torchtitan 9810191bb's
# parent: config/job_config.py Model.converters, Quantize.linear = QuantizedLinear(float8, mx),
# the fields of Float8Linear and MXLinear; the converters' registered names in
# components/quantization/float8.py and mx.py)
TT_PRECISION_KEYS = {"model": {"converters"}, "quantize": {"linear"}}
TT_CONVERTERS = {"quantize.linear.float8": "fp8", "quantize.linear.mx": "mxfp8"}
TT_FLOAT8_LINEAR = {"enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp",
                    "recipe_name", "filter_fqns", "emulate"}
TT_MX_LINEAR = {"mxfp8_dim1_cast_kernel_choice", "recipe_name", "filter_fqns"}
TT_MX_RECIPES = {"mxfp8_cublas": "mxfp8"}     # torchao's recipe name -> the plan's recipe
TT_SCHEDULES = {"1F1B": "1f1b", "GPipe": "gpipe", "Interleaved1F1B": "interleaved"}
TT_SINGLE_STAGE = {"1F1B", "GPipe"}     # one model part per rank


def titan_stage_counts(parts, num_layers):
    """Decoder layers per model part; checks embedding/head placement and contiguity."""
    seen = []
    for i, names in enumerate(parts):
        assert ("tok_embeddings" in names) == (i == 0)
        assert ("norm" in names and "output" in names) == (i == len(parts) - 1)
        seen += [int(n.split(".")[1]) for n in names if n.startswith("layers.")]
    assert seen == list(range(num_layers))
    return [sum(n.startswith("layers.") for n in names) for names in parts]


def titan_recomputed(ac, counts, pp):
    """Layers recomputed per model part under torchtitan's AC rules (layer SAC counts layers
    with one process-wide counter over the model parts a rank builds, in order)."""
    mode = ac["mode"]
    if mode == "none":
        return [0] * len(counts)
    if mode == "full" or ac.get("selective_ac_option") == "op":
        return list(counts)
    freq = int(ac["selective_ac_option"])
    done = [0] * len(counts)
    for rank in range(pp):
        counter = 0
        for i in range(rank, len(counts), pp):
            for _ in range(counts[i]):
                counter += 1
                done[i] += counter % freq == 0
    return done


def titan_precision(cfg, zero):
    """(precision, recipe) of torchtitan's linears from its converters; checks the LM head stays
    bf16 and FP8 all-gather is on exactly where FSDP2 gathers tensorwise weights."""
    conv = cfg.get("model", {}).get("converters", [])
    if not conv:
        assert "quantize" not in cfg
        return "bf16", None
    assert len(conv) == 1 and conv[0] in TT_CONVERTERS, conv
    linear = cfg["quantize"]["linear"]
    assert set(linear) == {conv[0].rsplit(".", 1)[1]}
    if TT_CONVERTERS[conv[0]] == "fp8":
        f8 = linear["float8"]
        assert set(f8) <= TT_FLOAT8_LINEAR
        assert f8["filter_fqns"] == ["output"]
        gather = f8.get("enable_fsdp_float8_all_gather", False)
        assert gather == (f8["recipe_name"] == "tensorwise" and zero >= 2)
        assert f8.get("precompute_float8_dynamic_scale_for_fsdp", False) == gather
        return "fp8", f8["recipe_name"]
    mx = linear["mx"]
    assert set(mx) <= TT_MX_LINEAR and mx["filter_fqns"] == ["output"]
    return "mxfp8", TT_MX_RECIPES[mx["recipe_name"]]


def check_torchtitan(plan, text):
    cfg = tomllib.loads(text)
    p, b, m = plan.parallelism, plan.batch, plan.model
    assert not [n for n in notes_of(text) if INEXACT.search(n)], notes_of(text)
    assert set(TT_KEYS) <= set(cfg) <= set(TT_KEYS) | set(TT_PRECISION_KEYS)
    for section, keys in {**TT_KEYS, **TT_PRECISION_KEYS}.items():
        assert set(cfg.get(section, {})) <= keys, section
    assert titan_precision(cfg, p.zero_stage) == (plan.precision, plan.recipe)
    t, par, ac = cfg["training"], cfg["parallelism"], cfg["activation_checkpoint"]
    # torch.compile as priced: the model and its loss, or nothing
    comp = cfg["compile"]
    assert comp["enable"] is plan.compile
    assert not plan.compile or {"model", "loss"} <= set(comp.get("components", ["model", "loss"]))

    assert t["seq_len"] == b.seq_len
    assert t["global_batch_size"] == b.global_batch_size
    assert t["mixed_precision_param"] == ("float32" if plan.cluster.gpu.name == "cpu"
                                          else "bfloat16")
    assert t.get("mixed_precision_reduce", "float32") == "float32"

    # degrees (torchtitan's ParallelDims: world = replicate x shard x cp x tp x pp)
    rep, shard = par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]
    tp, pp = par["tensor_parallel_degree"], par["pipeline_parallel_degree"]
    assert (tp, pp, rep * shard) == (p.tp, p.pp, p.dp)
    cp = par.get("context_parallel_degree", 1)
    assert cp == p.cp
    if cp > 1:   # torch's rotate methods: allgather gathers K,V; alltoall rotates the ring
        assert {"allgather": "all_gather", "alltoall": "p2p"}[
            par["context_parallel_rotate_method"]] == p.cp_comm_type
    assert rep * shard * cp * tp * pp == p.world_size
    if rep > 1:    # "DDP has not supported > 1D parallelism"
        assert shard == 1 and tp == 1 and pp == 1 and cp == 1

    # ZeRO: DDP (0), FSDP2 resharding never (2, SHARD_GRAD_OP) or always (3); no ZeRO-1
    if shard * cp > 1 and rep == 1:   # FSDP2 shards over dp_shard x cp
        zero = {"never": 2, "always": 3}[par["fsdp_reshard_after_forward"]]
    else:
        zero = 0
        assert "fsdp_reshard_after_forward" not in par or p.dp == 1
    assert zero == p.zero_stage

    # tensor parallel always shards the sequence
    if tp > 1:
        assert p.sequence_parallel
        # async TP as priced, which torchtitan runs only compiled
        assert par.get("enable_async_tensor_parallel", False) is p.tp_comm_overlap
        assert not p.tp_comm_overlap or comp["enable"]

    # pipeline: schedule, model parts in model order on rank i % pp, microbatches
    if pp > 1:
        sched = par["pipeline_parallel_schedule"]
        assert TT_SCHEDULES[sched] == p.schedule or (sched == "1F1B" and p.vpp == 1
                                                     and p.schedule == "interleaved")
        counts = titan_stage_counts(par["module_fqns_per_model_part"], m.num_layers)
        assert counts == expected_counts(plan)
        assert len(counts) % pp == 0 and len(counts) // pp == p.vpp
        if sched in TT_SINGLE_STAGE:
            assert len(counts) == pp
        mb = par["pipeline_parallel_microbatch_size"]
        assert mb == b.micro_batch_size
        assert t["local_batch_size"] % mb == 0
        assert t["local_batch_size"] // mb == b.num_microbatches
        # no gradient accumulation on top of the pipeline's microbatches
        assert t["global_batch_size"] == t["local_batch_size"] * rep * shard
    else:
        assert "module_fqns_per_model_part" not in par
        assert "pipeline_parallel_schedule" not in par
        counts = [m.num_layers]
        # gradient accumulation: global / (local x dp) steps of the micro batch
        assert t["local_batch_size"] == b.micro_batch_size
        assert t["global_batch_size"] % (t["local_batch_size"] * rep * shard) == 0
        assert t["global_batch_size"] // (t["local_batch_size"] * rep * shard) == \
            b.num_microbatches

    # recompute: full / selective-op cover every layer; exactly as planned
    planned = expected_recompute(plan)
    if pp == 1:
        planned = [sum(planned)]
    assert titan_recomputed(ac, counts, pp) == planned
    if any(planned):
        assert {"full": "full", "op": "selective"}[p.recompute] == ac["mode"]
        if ac["mode"] == "selective":
            assert ac["selective_ac_option"] == "op"


def test_tp_comm_overlap_exported_as_priced(capsys):
    """The search overlaps Megatron's TP communication with tp > 1 and sp, and the export says
    so (--tp-comm-overlap); `--no-tp-comm-overlap` prices and exports without it; an engine
    that cannot overlap refuses such a plan in one line."""
    from planner.cli import main
    out = {}
    for extra in ([], ["--no-tp-comm-overlap"]):
        assert main(["--model", "llama8b", "--cluster", "h100x16", "--tp", "2", "--sp",
                     "--export", "megatron", *extra]) == 0
        out[bool(extra)] = capsys.readouterr().out
    assert "--tp-comm-overlap" in out[False] and "--tp-comm-overlap" not in out[True]
    plan = mkplan(tp=8, pp=4, sp=True, engine="deepspeed", validate=False)
    plan = dataclasses.replace(plan, parallelism=dataclasses.replace(plan.parallelism,
                                                                     tp_comm_overlap=True))
    with pytest.raises(BadInput, match="--no-tp-comm-overlap"):
        export(plan, "deepspeed")


def test_the_precisions_exported_with_fp8_format_are_the_fp8_formats():
    """Megatron runs --fp8-format for exactly the precisions the cost model prices as FP8
    elements (planner.precision FP8_FORMATS: the TP overlap's all-gather buffers at a byte an
    element, planner.cost.memory userbuffer_bytes): the two places agree."""
    from planner.export.megatron import PRECISION_FLAGS
    from planner.precision import FP8_FORMATS
    exported = {p for p, flags in PRECISION_FLAGS.items()
                if any(k == "--fp8-format" for k, _ in flags("tensorwise"))}
    assert exported == set(FP8_FORMATS)
