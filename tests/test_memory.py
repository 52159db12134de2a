"""The memory formulas reproduce the papers' figures."""
import pytest

from planner.cost.memory import activation_bytes, model_state_bytes
from planner.specs import Model

GB = 1e9


@pytest.mark.parametrize("zero, expected_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_figure(zero, expected_gb):
    # Rajbhandari et al. 2020, Fig. 1: 7.5B parameters, Nd = 64, K = 12
    total = sum(model_state_bytes(7.5e9, 64, zero)) / GB
    assert total == pytest.approx(expected_gb, abs=0.05)


def _gpt(h=12288, a=96, layers=96, dropout=0.1):
    return Model("gpt", num_layers=layers, hidden=h, ffn_hidden=4 * h, num_heads=a,
                 num_kv_heads=a, vocab_size=51200, max_seq_len=2048, gated_mlp=False,
                 activation="gelu", norm="layernorm", position="learned",
                 attn_bias=True, linear_bias=True, dropout=dropout)


# Korthikanti et al. 2022, Table 2 (bytes per layer)
PAPER = {
    ("none", False): lambda s, b, h, a, t: s * b * h * (10 + 24 / t + 5 * a * s / (h * t)),
    ("none", True): lambda s, b, h, a, t: s * b * h * (34 / t + 5 * a * s / (h * t)),
    ("selective", False): lambda s, b, h, a, t: s * b * h * (10 + 24 / t),
    ("selective", True): lambda s, b, h, a, t: s * b * h * 34 / t,
}


@pytest.mark.parametrize("t", [1, 2, 4, 8])
@pytest.mark.parametrize("mode, sp", list(PAPER))
@pytest.mark.parametrize("b", [1, 4])
def test_activation_formula_matches_paper(t, mode, sp, b):
    m = _gpt()
    s = 2048
    got = activation_bytes(m, b, s, t, sp, mode, flash=False)
    want = PAPER[(mode, sp)](s, b, m.hidden, m.num_heads, t)
    assert got == pytest.approx(want, rel=1e-12)


def test_no_parallelism_is_34_plus_5as_over_h():
    m = _gpt(h=4096, a=32)
    s, b = 2048, 1
    want = s * b * m.hidden * (34 + 5 * m.num_heads * s / m.hidden)
    assert activation_bytes(m, b, s, 1, False, "none", flash=False) == pytest.approx(want)


def test_full_recompute_keeps_layer_input():
    m = _gpt()
    assert activation_bytes(m, 2, 2048, 8, False, "full") == 2 * 2048 * 2 * m.hidden
    assert activation_bytes(m, 2, 2048, 8, True, "full") == 2 * 2048 * 2 * m.hidden / 8


def test_korthikanti_175b_selective_saving():
    # Sec. 5: for GPT-3 175B, selective recompute cuts activation memory by about 70%
    m = _gpt()
    full = activation_bytes(m, 1, 2048, 8, True, "none", flash=False)
    sel = activation_bytes(m, 1, 2048, 8, True, "selective", flash=False)
    assert 0.6 < 1 - sel / full < 0.8


def test_gqa_and_swiglu_store_what_they_compute():
    base = Model("l", num_layers=1, hidden=4096, ffn_hidden=14336, num_heads=32, num_kv_heads=32,
                 vocab_size=1000, max_seq_len=4096)
    gqa = base.scaled(num_kv_heads=8)
    # fewer K/V heads store less; a gated MLP stores three f-wide tensors, a plain one two
    assert activation_bytes(gqa, 1, 4096, 1, False, "none") < activation_bytes(base, 1, 4096, 1, False, "none")
    plain = base.scaled(gated_mlp=False)
    diff = activation_bytes(base, 1, 4096, 1, False, "none") - activation_bytes(plain, 1, 4096, 1, False, "none")
    assert diff == pytest.approx(2 * 4096 * base.ffn_hidden)


# Attention whose heads are not hidden / num_heads wide, and multi-head latent attention:
# what our runtime's layer saves for backward, measured, against the runtime engine's facts on
# a CPU. Before the heads' widths were counted, the explicit head_dim layer measured 1.09x and
# the MLA one 1.8x of the prediction (Q, K, V and the output were counted hidden wide, the
# latents not at all, and the softmax CPU SDPA keeps for MLA's narrower values not either).
_TINY = Model("tiny", num_layers=1, hidden=64, ffn_hidden=96, num_heads=4, num_kv_heads=2,
              vocab_size=128, max_seq_len=256)
_MLA = dict(kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=12, v_head_dim=10)


@pytest.mark.parametrize("spec", [
    _TINY.scaled(name="head-dim", head_dim_override=24),               # q_dim 96, hidden 64
    _TINY.scaled(name="mla-q-lora", q_lora_rank=24, **_MLA),
    _TINY.scaled(name="mla", **_MLA),
], ids=lambda m: m.name)
def test_runtime_layer_saves_what_the_formula_counts_for_its_heads(spec):
    torch = pytest.importorskip("torch")
    from planner.catalog import get_gpu
    from planner.engines import get_engine
    from planner.cost.facts import facts_for
    from runtime.model import DecoderLayer
    b, s = 2, 128
    layer = DecoderLayer(spec)
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    x = torch.randn(b, s, spec.hidden, requires_grad=True)
    kept = {}

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in params:
            kept[key] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    facts = facts_for(get_engine("runtime"), get_gpu("cpu"))       # fp32 on CPUs
    planned = facts.activation_bytes(spec, b, s, 1, False, "none", True)
    assert sum(kept.values()) == pytest.approx(planned, rel=0.02)
    # on a GPU the fused kernel keeps no softmax for MLA either
    gpu = facts_for(get_engine("runtime"), get_gpu("h100"))
    assert gpu.fused_attention(spec, True)
    assert facts.fused_attention(spec, True) == (not spec.is_mla)


def test_fsdp2_without_gradient_sync_accumulates_unsharded_fp32_gradients():
    """The torchtitan engine fact pp_keeps_unsharded_grads, on the installed torch: the
    pipeline stage turns FSDP2's gradient sync and resharding off for every backward, and
    FSDP2 then keeps each parameter's unsharded gradient in an fp32 accumulator (bf16
    compute, fp32 reduce, torchtitan's mixed precision) with nothing reduced into the sharded
    gradient yet."""
    torch = pytest.importorskip("torch")
    import inspect

    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.pipelining import stage
    src = inspect.getsource(stage._PipelineStageBase.backward_maybe_with_nosync)
    assert "set_requires_gradient_sync(False)" in src and "set_reshard_after_backward(False)" in src
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 64))
        fully_shard(net, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                        reduce_dtype=torch.float32))
        net.set_requires_gradient_sync(False)
        net.set_reshard_after_backward(False)
        for _ in range(2):                       # two micro-batches
            net(torch.randn(4, 64)).float().sum().backward()
        params = net._get_fsdp_state()._fsdp_param_group.fsdp_params
        acc = [fp.unsharded_accumulated_grad for fp in params]
        assert all(a is not None and a.dtype == torch.float32 for a in acc)
        assert sum(a.numel() for a in acc) == sum(p.numel() for p in net.parameters())
        assert all(p.grad is None for p in net.parameters())
    finally:
        dist.destroy_process_group()


def _mbridge_70b_fp8_row():
    from benchmarks import fidelity
    return next(r for r in fidelity.load_runs()
                if r["id"] == "mbridge-26.04-h100-llama370b-fp8-64gpu-tp4pp8cp1epnonevp5-gbs256")


def _rank0_states(run, stage_layers=None):
    """(params, grads) GiB of pipeline rank 0 and the decoder layers per rank for `run` as the
    fidelity table prices it (on `stage_layers` where given)."""
    import dataclasses
    from benchmarks import fidelity
    from planner.search import search
    f = fidelity.fixed_of(run)
    if stage_layers is not None:
        f = dataclasses.replace(f, stage_layers=tuple(stage_layers))
    rep = search(fidelity.model_of(run), fidelity.cluster_of(run), f,
                 run["fixed"]["seq_len"], run["fixed"]["global_batch"], top=1,
                 engine=fidelity.engine_of(run), margin_gib=0.0, rejected=False)
    best = rep.best or rep.closest
    m = best.estimate.stage_memory_gib[0]
    return m["params"], m["grads"], list(best.layers)


def test_fp8_primary_weights_and_bf16_gradients_count_what_they_remove():
    """Megatron-Bridge's FP8 recipes keep FP8 primary weights and bf16 gradient buffers
    (benchmarks.fidelity fp8_primary_weights, bf16_gradients): against the same row priced with
    bf16 weights beside their FP8 copies and fp32 gradients, rank 0 holds 2 B less per linear
    parameter of its layers and 2 B less gradient per parameter, counted from the model's
    shapes here (Llama 3 70B at tp 4: the layers the plan puts on rank 0)."""
    from benchmarks import fidelity
    from planner.catalog import get_model
    run = _mbridge_70b_fp8_row()
    assert fidelity.fp8_primary_weights(run) and fidelity.bf16_gradients(run)
    plain = {**run, "id": "plain-" + run["id"],
             "fixed": {**run["fixed"], "fp8_param_gather": False, "grad_reduce_in_fp32": True}}
    p_fp8, g_bf16, split = _rank0_states(run)
    p_plain, g_fp32, split_plain = _rank0_states(plain, stage_layers=split)   # same placement
    assert split == split_plain
    layers = split[0]
    m = get_model("llama3-70b")
    h, f = m.hidden, m.ffn_hidden
    kv = m.num_kv_heads * m.head_dim
    linear = layers * (h * (h + 2 * kv) + h * h + 3 * h * f) / 4          # per tp rank
    assert p_plain - p_fp8 == pytest.approx(2 * linear / 2 ** 30, rel=1e-3)
    assert g_fp32 == pytest.approx(2 * g_bf16, rel=1e-6)


def test_mla_down_projections_are_whole_on_every_tensor_parallel_rank():
    """Megatron-Core builds MLA's linear_q_down_proj / linear_kv_down_proj as TELinear with
    parallel_mode="duplicated" (multi_latent_attention.py): at tp 8 each rank holds them whole.
    DeepSeek-V3's first (dense) layer by hand from its config.json (hidden 7168, q_lora_rank
    1536, kv_lora_rank 512, rope 64, nope 128, v 128, 128 heads, FFN 18432, RMSNorm): q_a and
    kv_a whole, q_b, kv_b, the output and the MLP over 8, two norms. Before, the down
    projections were divided by tp too (13.2M parameters a layer short)."""
    from planner.catalog import get_cluster, get_model
    from planner.cost.stage import Candidate, stage_coefficients
    from planner.engines import get_engine
    h, heads = 7168, 128
    replicated = h * 1536 + h * (512 + 64)
    sharded = 1536 * heads * (128 + 64) + 512 * heads * (128 + 128) + heads * 128 * h
    mlp = 3 * h * 18432
    want = replicated + (sharded + mlp) / 8 + 2 * h
    engine = get_engine("megatron")
    c = Candidate(tp=8, pp=1, dp=1, zero=0, sp=True, mbs=1, seq_len=4096, global_batch=8,
                  recompute="full", ep=1)
    k = stage_coefficients(get_model("deepseek-v3"), get_cluster("h100x8"), c, engine)[0]
    assert k.mem_layer["params"] == pytest.approx(engine.weight_bytes * want, rel=1e-12)


@pytest.mark.parametrize("precision,recipe,cp,bytes_per_element", [
    ("bf16", None, 1, 12 * 2), ("bf16", None, 2, 12 * 2),
    # FP8: the 8 all-gather overlaps' buffers FP8, the 4 reduce-scatter ones bf16
    ("fp8", "tensorwise", 1, 8 * 1 + 4 * 2)])
def test_tp_overlap_userbuffers_take_twelve_gathered_inputs(precision, recipe, cp,
                                                            bytes_per_element):
    """Megatron's --tp-comm-overlap has Transformer Engine allocate, outside PyTorch's
    allocator, one userbuffer per GEMM of a layer (qkv, proj, fc1, fc2 x fprop, dgrad,
    wgrad) of the gathered input's shape, seq x micro-batch / cp by hidden (megatron/training/
    initialize.py _initialize_tp_communicators; TE module/base.py initialize_ub,
    comm_gemm_overlap.cpp). Llama 3 70B (hidden 8192) at tp 8, 8192 tokens a micro-batch: the
    plan with the overlap holds 12 x 8192 / cp x 8192 buffer elements more than the one
    without, each 2 B in bf16; under FP8 the all-gather ones 1 B. torchtitan's async TP has no
    such buffers here."""
    import dataclasses as dc

    from planner.catalog import get_cluster
    from planner.catalog.models import MODELS
    from planner.cost.stage import Candidate, stage_coefficients
    from planner.engines import get_engine
    cluster = get_cluster("h100x64")
    other = {}
    for engine in ("megatron", "torchtitan"):
        for overlap in (True, False):
            c = Candidate(tp=8, pp=1, dp=8 // cp, zero=1, sp=True, mbs=1, seq_len=8192,
                          global_batch=64, recompute="full", precision=precision, recipe=recipe,
                          cp=cp, tp_comm_overlap=overlap)
            eng = get_engine(engine)
            if engine == "torchtitan":
                eng = dc.replace(eng, tp_comm_overlap=True)
                if precision != "bf16":
                    continue
            k = stage_coefficients(MODELS["llama3-70b"], cluster, c, eng)[0]
            other[engine, overlap] = k.mem_fixed["other"]
    assert other["megatron", True] - other["megatron", False] == pytest.approx(
        8192 / cp * 8192 * bytes_per_element, rel=1e-12)
    if precision == "bf16":
        assert other["torchtitan", True] == other["torchtitan", False]
