"""Transformer Engine's per-tensor FP8 keeps no transposes on Blackwell (planner.precision
on_gpu): its FP8 GEMMs take every operand layout there, so TE's quantizers make the FP8 data
alone (transformer_engine/pytorch/csrc/quantizer.cpp: with_transpose = columnwise_usage &&
!is_non_tn_fp8_gemm_supported), where Hopper's TN-only GEMMs need the transpose too."""
import dataclasses

import pytest

from benchmarks import fidelity
from planner.catalog.gpus import get_gpu
from planner.engines import get_engine
from planner.precision import low_precision

MEGATRON = get_engine("megatron")


@pytest.mark.parametrize("gpu", ["b200", "b300", "gb200", "gb300"])
def test_blackwell_drops_the_transpose_byte(gpu):
    for recipe, cast in (("tensorwise", 6.0), ("delayed", 4.0)):
        hopper = low_precision(MEGATRON, get_gpu("h100"), "fp8", recipe).recipe
        blackwell = low_precision(MEGATRON, get_gpu(gpu), "fp8", recipe).recipe
        assert (hopper.cast_in_bytes, hopper.cast_grad_bytes, hopper.weight_copy_bytes) == (
            cast, cast, 2.0)
        # one byte less written by each cast, one FP8 copy of the weight, not two
        assert (blackwell.cast_in_bytes, blackwell.cast_grad_bytes,
                blackwell.weight_copy_bytes) == (cast - 1, cast - 1, 1.0)
    # MXFP8 keeps its row- and column-wise copies (blocks along different axes)
    mx = low_precision(MEGATRON, get_gpu(gpu), "mxfp8", "mxfp8").recipe
    assert mx.weight_copy_bytes == pytest.approx(2 * (1 + 1 / 32))


def test_fp8_primary_weights_on_blackwell_are_one_byte():
    """With FP8 primary weights (Megatron --fp8-param-gather) the FP8 weight replaces the bf16
    one: on Hopper its data and transpose (2 B, as much as the bf16 weight), on Blackwell its
    data alone, a byte less than bf16."""
    fp8_params = dataclasses.replace(MEGATRON, lowp_library="te_fp8_params")
    assert low_precision(fp8_params, get_gpu("h100"), "fp8", "tensorwise").recipe \
        .weight_copy_bytes == 0.0
    assert low_precision(fp8_params, get_gpu("gb200"), "fp8", "tensorwise").recipe \
        .weight_copy_bytes == -1.0


def test_the_gb200_405b_fp8_runs_fit_as_they_ran():
    """Megatron-Bridge's Llama 3.1 405B FP8 runs on 256 GB200 (tp 4, pp 16 x vp 4, FP8 primary
    weights, the recipe's even layout, no recompute) ran: priced with TE's FP8 weights and
    casts as Blackwell keeps them they fit with no margin (with the transposes counted they
    needed 183.8 GiB of 183.0; without them 5.4 GiB was left, 3.3 GiB since TE's TP-overlap
    userbuffers, 2.1 GiB, are counted)."""
    runs = [r for r in fidelity.load_runs(fidelity.DATA_HELDOUT)
            if "-gb200-llama31405b-fp8-256gpu-tp4pp16cp1epnonevp4-" in r["id"]]
    assert len(runs) == 5
    for r in runs:
        p = fidelity.predict(r, margin_gib=0.0)
        assert p["fits"] and p["layers"] == r["fixed"]["stage_layers"], r["id"]


MIXTRAL_8X7B = dict(hidden=4096, ffn=14336, heads=32, kv_heads=8, head_dim=128, experts=8,
                    layers=32)   # mistralai/Mixtral-8x7B-v0.1 config.json


@pytest.mark.parametrize("gpu,library,copy_bytes", [
    ("h100", "te", 2.0),              # the FP8 weight and its transpose beside the bf16 one
    ("gb200", "te", 1.0),             # no transpose on Blackwell
    ("gb200", "te_fp8_params", -1.0)])  # FP8 primary weights: one byte in place of bf16's two
def test_moe_layers_keep_the_experts_fp8_weight_copies(gpu, library, copy_bytes):
    """Megatron-Core's TEGroupedLinear caches its experts' FP8 weights across micro-batches as
    TELinear caches a dense layer's (is_first_microbatch; Transformer Engine's grouped_linear.py
    cache_weight), so an FP8 MoE layer holds the copies of its attention's and of its local
    experts' linears. Mixtral 8x7B at tp 2, ep 4, pp 4: each of a middle rank's 8 layers holds
    q, k, v, o over tp and 2 of the 8 experts (w1, w3, w2) whole. Before, the MoE layers priced
    no copy: the FP8 plan's weights were the bf16 plan's."""
    from planner.catalog import get_cluster
    from planner.catalog.models import MODELS
    from planner.search import Fixed, search
    d = MIXTRAL_8X7B
    h = d["hidden"]
    attn = h * (d["heads"] + 2 * d["kv_heads"]) * d["head_dim"] + d["heads"] * d["head_dim"] * h
    experts = 3 * h * d["ffn"]
    tp, ep, pp = 2, 4, 4
    per_layer = attn / tp + d["experts"] // ep * experts
    engine = dataclasses.replace(MEGATRON, lowp_library=library)
    cluster = get_cluster(f"{gpu}x32")
    params = {}
    for precision in ("bf16", "fp8"):
        fixed = Fixed(tp=tp, pp=pp, ep=ep, mbs=1, recompute="full", zero=1,
                      precision=precision, recipe="tensorwise" if precision == "fp8" else None)
        best = search(MODELS["mixtral-8x7b"], cluster, fixed, seq_len=4096, global_batch=64,
                      engine=engine, top=1).best
        assert best.layers[1] == d["layers"] // pp
        params[precision] = best.estimate.stage_memory_gib[1]["params"] * 2 ** 30
    assert params["fp8"] - params["bf16"] == pytest.approx(
        copy_bytes * per_layer * (d["layers"] // pp), rel=1e-9)


def test_fp8_primary_weights_are_gathered_as_their_one_byte_data():
    """Megatron-Core keeps FP8 primary weights in a uint8 param buffer (param_and_grad_buffer.py
    param_dtype) and NeMo's distributed Adam syncs them with param_sync_dtype uint8, so the
    distributed optimizer's parameter all-gather moves a byte per linear weight and two per
    norm weight: for a Llama 3 8B layer (config.json: hidden 4096, 8 of 32 heads for k and v
    of 128, FFN 14336) at ZeRO-1, the all-gather of 218.1M linear bytes + 2 x 8192
    norm bytes (on 8 B200, where MXFP8 runs too). MXFP8 primary weights gather through a bf16
    buffer: 2 B each."""
    from planner.catalog import get_cluster
    from planner.catalog.models import MODELS
    from planner.cost import comm
    from planner.cost.stage import Candidate, stage_coefficients
    h, q, kv, f = 4096, 32 * 128, 8 * 128, 14336
    linear = h * (q + 2 * kv) + q * h + 3 * h * f
    cluster = get_cluster("b200x8")
    link = comm.group_link(cluster, 8, 1)
    engine = dataclasses.replace(MEGATRON, lowp_library="te_fp8_params")
    gathered = {}
    for precision, recipe in (("fp8", "tensorwise"), ("mxfp8", "mxfp8"), ("bf16", None)):
        c = Candidate(tp=1, pp=1, dp=8, zero=1, sp=False, mbs=1, seq_len=8192, global_batch=64,
                      recompute="full", precision=precision, recipe=recipe)
        k = stage_coefficients(MODELS["llama3-8b"], cluster, c, engine)[0]
        gathered[precision] = k.gather_layer
    assert gathered["fp8"] == pytest.approx(comm.all_gather(linear + 2 * 2 * h, 8, link))
    assert gathered["mxfp8"] == pytest.approx(gathered["bf16"])
    assert gathered["bf16"] == pytest.approx(comm.all_gather(2 * (linear + 2 * h), 8, link))


@pytest.mark.parametrize("engine_name,changes,recipe,offload,per_layer_bytes", [
    # bf16 weights: TE's cached FP8 copy of the gathered weight and its transpose (Hopper),
    # whole on every rank
    ("megatron", dict(zero3_fp8_primary_weights=False), "tensorwise", "none", 2.0),
    # ... as a Megatron ZeRO-3 plan with its optimizer on the CPU keeps them in tensorwise
    # FP8, whose primary weights Megatron refuses beside that offload
    ("megatron", {}, "tensorwise", "cpu", 2.0),
    # FP8 primary weights, what Megatron's ZeRO-3 runs (--fp8-param-gather): the sharded
    # weights are the FP8 data alone, Megatron-FSDP dropping each transpose after the forward
    # (1 B less bf16's 2 B, over dp 8)
    ("megatron", {}, "tensorwise", "none", -1.0 / 8),
    ("megatron", {}, "delayed", "cpu", -1.0 / 8),
    # ... with the transpose where the engine keeps it (2 B less bf16's 2 B: nothing)
    ("megatron", dict(zero3_drops_fp8_transposes=False), "tensorwise", "none", 0.0),
    # llm-foundry's FSDP: each layer's forward saves the copy for its backward
    ("fsdp", {}, "delayed", "none", 2.0),
    # ... but a checkpointed forward saves nothing: the copy of the layer being recomputed
    # only, priced as the shard
    ("fsdp", {"recompute": "full"}, "delayed", "none", 2.0 / 8)])
def test_zero3_keeps_the_fp8_copy_of_each_gathered_weight(engine_name, changes, recipe,
                                                          offload, per_layer_bytes):
    """Megatron-Core passes is_first_microbatch to its TE linears, so Transformer Engine caches
    each weight's FP8 copy in the module for the step (module/linear.py: cache_name "weight"
    unless is_first_microbatch is None or the module is under torch's FSDP2). Under
    Megatron-FSDP (ZeRO-3) with bf16 weights that copy is of the gathered weight: every
    layer's is held whole. Llama 3 8B (config.json: hidden 4096, 8 of 32 heads for k and v of
    128, FFN 14336) on 8 H100, tp 1, ZeRO-3: the FP8 plan holds 2 B per linear parameter of
    each of its 32 layers more than the bf16 plan; before, the planner divided them by dp (a
    "fits" for 70B plans that would run out of memory by ~30 GiB a GPU). llm-foundry's TE
    linears (FSDP1, no is_first_microbatch) cache nothing but save the copy for the backward
    (linear.py @v1.9): held whole too until the layer's backward. Megatron's ZeRO-3 plans
    run FP8 primary weights instead (exported as --fp8-param-gather), but where Megatron
    refuses them (optimizer offload outside the delayed recipe)."""
    from planner.catalog import get_cluster
    from planner.catalog.models import MODELS
    from planner.cost.stage import Candidate, stage_coefficients
    h, q, kv, f = 4096, 32 * 128, 8 * 128, 14336
    linear = h * (q + 2 * kv) + q * h + 3 * h * f
    cluster = get_cluster("h100x8")
    changes = dict(changes)
    recompute = changes.pop("recompute", "none")
    engine = dataclasses.replace(get_engine(engine_name), **changes)
    layer = {}
    for precision, rec in (("fp8", recipe), ("bf16", None)):
        c = Candidate(tp=1, pp=1, dp=8, zero=3, sp=False, mbs=1, seq_len=8192, global_batch=64,
                      recompute=recompute, precision=precision, recipe=rec,
                      offload_optimizer=offload)
        layer[precision] = stage_coefficients(MODELS["llama3-8b"], cluster, c, engine)[0] \
            .mem_layer["params"]
    assert layer["fp8"] - layer["bf16"] == pytest.approx(per_layer_bytes * linear, rel=1e-9)
