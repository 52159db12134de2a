"""Attention beyond Llama's in the runtime: what planner.specs.Model counts is what is built.

Each feature (an explicit head_dim, sliding windows, attention sinks, multi-head latent
attention, expert and router biases): the built modules hold exactly the spec's parameter
counts, and their forward equals a reference written here from the Hugging Face formulas
(per-query loops over the keys, RoPE as a complex rotation), in float64 (the runtime's RoPE
and RMSNorm run in fp32, so agreement is to fp32 rounding). The sliding-window
mask is checked against transformers' rule by brute force; plans the runtime cannot lay out
are refused in one line by `runtime.parallelize.check_layout`; and one tp2 run (explicit
head_dim + sliding windows + sinks, sequence parallel) trains exactly like one process (marked
slow: ~45 s of process starts; the rest takes ~6 s).
"""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from planner.catalog import get_gpu  # noqa: E402
from planner.plan import Batch, Parallelism, Plan, make_stages  # noqa: E402
from planner.specs import Cluster, Model  # noqa: E402
from runtime.model import (AttentionCore, DecoderLayer, MoEFeedForward, Transformer,  # noqa: E402
                           UnsupportedModel, attention_mask)
from runtime.parallelize import LayoutError, check_layout, materialize_and_init  # noqa: E402
from tests.runtime_runs import launch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

BASE = Model("tiny", num_layers=4, hidden=64, ffn_hidden=96, num_heads=4, num_kv_heads=2,
             vocab_size=128, max_seq_len=32)
MLA = dict(kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=12, v_head_dim=10)
FEATURES = {
    "head_dim": BASE.scaled(name="hd", head_dim_override=24),          # q_dim 96 != hidden 64
    "head_dim_bias": BASE.scaled(name="hdb", head_dim_override=8, attn_bias=True,
                                 linear_bias=True),
    "sliding": BASE.scaled(name="swa", sliding_window=5, full_attention_interval=2),
    "sinks": BASE.scaled(name="sinks", attention_sinks=True),
    "gpt_oss_like": BASE.scaled(name="oss", head_dim_override=20, sliding_window=4,
                                full_attention_interval=2, attention_sinks=True,
                                attn_bias=True, linear_bias=True),
    "mla_q_lora": BASE.scaled(name="mla", q_lora_rank=24, **MLA),
    "mla_bias": BASE.scaled(name="mlab", attn_bias=True, linear_bias=True, **MLA),
    "moe_bias": BASE.scaled(name="moeb", num_experts=4, experts_per_token=2, moe_ffn_hidden=32,
                            expert_bias=True),
}


def built(spec, seed=0):
    t = Transformer(spec)
    materialize_and_init(t, spec, seed, "cpu")
    with torch.no_grad():   # biases and sinks are zero / small at init: make them count here
        for name, p in t.named_parameters():
            if name.endswith("bias") or name.endswith("sinks"):
                p.normal_(0.0, 0.5 if name.endswith("sinks") else 0.05)
    return t.double()


def assert_close(got, want):
    """The runtime computes RoPE and RMSNorm in fp32 (whatever the input dtype), the reference
    in fp64: agreement to fp32 rounding, relative to the output's scale."""
    err = (got - want).abs().max().item()
    assert err <= 1e-5 * want.abs().max().item(), err


def numel(module):
    return sum(p.numel() for p in module.parameters())


# ---- parameter counts --------------------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(FEATURES))
def test_parameter_counts_equal_the_spec(kind):
    spec = FEATURES[kind]
    t = Transformer(spec)
    assert numel(t) == spec.num_params()
    for i, layer in t.layers.items():
        i = int(i)
        assert numel(layer) == (spec.moe_layer_params() if spec.moe_layer(i)
                                else spec.layer_params())
        attn = (spec.attn_matmul_params() + spec.attn_bias_params() + spec.attn_extra_params()
                + (spec.hidden if spec.linear_bias else 0))
        assert numel(layer.attention) == attn
        if spec.moe_layer(i):
            ff = layer.feed_forward
            assert numel(ff.experts) == spec.num_experts * spec.expert_params()
            assert numel(ff.router) == spec.router_params()


def test_hf_shapes_of_an_explicit_head_dim():
    """transformers LlamaAttention: q_proj hidden -> heads*head_dim, o_proj back to hidden."""
    a = Transformer(FEATURES["head_dim"]).layers["0"].attention
    assert tuple(a.wq.weight.shape) == (4 * 24, 64)
    assert tuple(a.wk.weight.shape) == (2 * 24, 64)
    assert tuple(a.wo.weight.shape) == (64, 4 * 24)


# ---- references (float64, per query, from the HF formulas) -------------------------------

def rope_ref(x, theta):
    """x [s, heads, d]: pairs (m, m + d/2) rotated by position * theta^(-2m/d), written as a
    complex multiplication (transformers rotate_half convention)."""
    s, _, d = x.shape
    m = torch.arange(d // 2, dtype=torch.float64)
    ang = torch.arange(s, dtype=torch.float64)[:, None] * theta ** (-2.0 * m / d)   # [s, d/2]
    z = torch.complex(x[..., : d // 2], x[..., d // 2:]) * torch.polar(
        torch.ones_like(ang), ang)[:, None, :]
    return torch.cat([z.real, z.imag], dim=-1)


def attend_ref(q, k, v, window, sinks, scale):
    """q [s, hq, d], k [s, hkv, d], v [s, hkv, dv]: query i of head h sees keys j <= i with
    i - j < window (window 0: all), logits scaled, the head's sink logit joins the softmax
    (gpt-oss eager_attention_forward) and reads no value."""
    s, hq, _ = q.shape
    group = hq // k.shape[1]
    out = torch.zeros(s, hq, v.shape[-1], dtype=torch.float64)
    for h in range(hq):
        g = h // group
        for i in range(s):
            keys = [j for j in range(s) if j <= i and (not window or i - j < window)]
            logits = k[keys, g] @ q[i, h] * scale
            if sinks is not None:
                logits = torch.cat([logits, sinks[h:h + 1]])
            p = torch.softmax(logits, dim=0)[:len(keys)]
            out[i, h] = p @ v[keys, g]
    return out


def lin(layer, x):
    return x @ layer.weight.T + (layer.bias if layer.bias is not None else 0)


def rms(norm, x):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + norm.eps) * norm.weight


def attention_ref(a, spec, x, layer):
    n, nkv, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    s = x.shape[0]
    q = rope_ref(lin(a.wq, x).view(s, n, d), spec.rope_theta)
    k = rope_ref(lin(a.wk, x).view(s, nkv, d), spec.rope_theta)
    v = lin(a.wv, x).view(s, nkv, d)
    window = spec.sliding_window if spec.sliding_layer(layer) else 0
    o = attend_ref(q, k, v, window, a.sinks, 1 / math.sqrt(d))
    return lin(a.wo, o.reshape(s, n * d))


def mla_ref(a, spec, x):
    """DeepseekV3Attention.forward (transformers modeling_deepseek_v3.py), one sequence."""
    s, n = x.shape[0], spec.num_heads
    nope, rope, vd = spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.v_head_dim
    q = (lin(a.wq_b, rms(a.q_a_norm, lin(a.wq_a, x))) if spec.q_lora_rank
         else lin(a.wq, x)).view(s, n, nope + rope)
    q_pass, q_rot = q[..., :nope], q[..., nope:]
    ckv = lin(a.wkv_a, x)
    k_pass, k_rot = ckv[:, :spec.kv_lora_rank], ckv[:, spec.kv_lora_rank:]
    kv = lin(a.wkv_b, rms(a.kv_a_norm, k_pass)).view(s, n, nope + vd)
    k_nope, v = kv[..., :nope], kv[..., nope:]
    q_rot = rope_ref(q_rot, spec.rope_theta)
    k_rot = rope_ref(k_rot.view(s, 1, rope), spec.rope_theta).expand(s, n, rope)
    qs = torch.cat([q_pass, q_rot], -1)
    ks = torch.cat([k_nope, k_rot], -1)
    o = attend_ref(qs, ks, v, 0, None, (nope + rope) ** -0.5)
    return lin(a.wo, o.reshape(s, n * vd))


# ---- forward against the references ------------------------------------------------------

@pytest.mark.parametrize("kind", ["head_dim", "head_dim_bias", "sliding", "sinks",
                                  "gpt_oss_like"])
@torch.no_grad()
def test_attention_forward_matches_reference(kind):
    spec = FEATURES[kind]
    t = built(spec, seed=1)
    x = torch.randn(2, 9, spec.hidden, dtype=torch.float64, generator=torch.Generator()
                    .manual_seed(3))
    for i in (0, 1):       # with full_attention_interval 2: layer 0 sliding, layer 1 full
        a = t.layers[str(i)].attention
        assert a.core.window == (spec.sliding_window if spec.sliding_layer(i) else 0)
        got = a(x)
        for b in range(2):
            want = attention_ref(a, spec, x[b], i)
            assert_close(got[b], want)


def test_sink_gradient_matches_reference():
    spec = FEATURES["gpt_oss_like"]
    a = built(spec, seed=2).layers["0"].attention
    x = torch.randn(1, 7, spec.hidden, dtype=torch.float64)
    a(x).square().sum().backward()
    got = a.sinks.grad.clone()
    a.sinks.grad = None
    attention_ref(a, spec, x[0], 0).square().sum().backward()
    assert_close(got, a.sinks.grad)
    assert got.abs().min() > 0


@pytest.mark.parametrize("kind", ["mla_q_lora", "mla_bias"])
@torch.no_grad()
def test_mla_forward_matches_reference(kind):
    spec = FEATURES[kind]
    a = built(spec, seed=4).layers["0"].attention
    x = torch.randn(2, 8, spec.hidden, dtype=torch.float64)
    got = a(x)
    for b in range(2):
        assert_close(got[b], mla_ref(a, spec, x[b]))


def test_sliding_mask_is_transformers_rule_by_brute_force():
    """transformers masking_utils.py: sliding_window_overlay `kv_idx > q_idx - sliding_window`
    and causal_mask_function `kv_idx <= q_idx`."""
    for s in range(1, 13):
        for w in range(0, 15):
            m = attention_mask(s, w, "cpu")
            for q in range(s):
                for kv in range(s):
                    want = kv <= q and (w == 0 or kv > q - w)
                    assert bool(m[q, kv]) == want, (s, w, q, kv)
            if w:   # a query sees min(w, q + 1) keys, itself included
                assert m.sum(1).tolist() == [min(w, q + 1) for q in range(s)]


def test_window_at_least_the_sequence_is_full_causal():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=g, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(AttentionCore(6)(q, k, v), AttentionCore(0)(q, k, v))
    assert not torch.allclose(AttentionCore(5)(q, k, v), AttentionCore(0)(q, k, v))


# ---- expert and router biases ------------------------------------------------------------

@torch.no_grad()
def test_moe_biases_match_a_per_token_reference():
    spec = FEATURES["moe_bias"]
    ff = built(spec, seed=5).layers["0"].feed_forward
    assert isinstance(ff, MoEFeedForward) and ff.router.bias is not None
    x = torch.randn(1, 6, spec.hidden, dtype=torch.float64)
    got = ff(x)[0]
    ex = ff.experts
    for t in range(6):
        xt = x[0, t]
        p = torch.softmax(xt @ ff.router.weight.T + ff.router.bias, 0)
        top = sorted(range(spec.num_experts), key=lambda e: -p[e].item())[:2]
        want = 0
        for e in top:
            h = torch.nn.functional.silu(xt @ ex.w1[e] + ex.w1_bias[e]) * (xt @ ex.w3[e]
                                                                          + ex.w3_bias[e])
            want = want + p[e] / (p[top[0]] + p[top[1]]) * (h @ ex.w2[e] + ex.w2_bias[e])
        assert_close(got[t], want)      # the router's softmax runs in fp32


# ---- refusals ----------------------------------------------------------------------------

def plan_of(model, tp=1, path=None, **par):
    plan = Plan(model=model, cluster=Cluster("cpux8", get_gpu("cpu"), 8, 8),
                parallelism=Parallelism(tp=tp, pp=1, dp=1, **par),
                batch=Batch(seq_len=16, global_batch_size=2, micro_batch_size=1,
                            num_microbatches=2),
                stages=make_stages(model.num_layers, 1, 1), engine="runtime")
    plan.validate()
    if path is not None:
        plan.save(path)
    return plan


def test_mla_with_tp_is_refused_in_one_line():
    check_layout(plan_of(FEATURES["mla_q_lora"]))           # tp 1 runs
    with pytest.raises(LayoutError) as e:
        check_layout(plan_of(FEATURES["mla_q_lora"], tp=2))
    assert "multi-head latent attention with tp 2" in str(e.value)
    assert "\n" not in str(e.value)


def test_tp_of_explicit_head_dim_windows_and_sinks_is_accepted():
    check_layout(plan_of(FEATURES["gpt_oss_like"], tp=2, sequence_parallel=True))


def test_mtp_is_refused_in_one_line():
    spec = BASE.scaled(name="mtp", mtp_layers=1)
    with pytest.raises(LayoutError) as e:
        check_layout(plan_of(spec))
    assert "multi-token prediction" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(UnsupportedModel):
        Transformer(spec)
    DecoderLayer(spec)          # a lone layer (what the profiler times) is still built


# ---- tp2 trains like one process ---------------------------------------------------------

def _launch(nproc, plan, metrics):
    r = launch(nproc, "--plan", plan, "--steps", 3, "--metrics", metrics, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads(x) for x in Path(metrics).read_text().splitlines()
            if '"step"' in x]


@pytest.mark.slow
def test_tp2_explicit_head_dim_windows_sinks_match_one_process(tmp_path):
    """Sinks split over tp with the heads; windows on layers 0 and 2 (interval 2), head_dim 20
    (q_dim 80 != hidden 64), sequence parallel: the same losses and gradient norms."""
    spec = FEATURES["gpt_oss_like"]
    plan_of(spec, path=tmp_path / "one.json")
    one = _launch(1, tmp_path / "one.json", tmp_path / "one.jsonl")
    plan_of(spec, tp=2, sequence_parallel=True, path=tmp_path / "tp2.json")
    two = _launch(2, tmp_path / "tp2.json", tmp_path / "tp2.jsonl")
    assert len(one) == len(two) == 3
    assert len({round(r["loss"], 6) for r in one}) == 3
    for a, b in zip(two, one):
        for key in ("loss", "grad_norm"):
            assert abs(a[key] - b[key]) <= 1e-4 * abs(b[key]), (key, a, b)


# ---- the profiler's scaled-down models keep the attention shape consistent ---------------

@pytest.mark.parametrize("name", ["gpt-oss-20b", "deepseek-v3", "qwen3-30b-a3b"])
def test_profiler_scaled_spec_shrinks_explicit_head_widths_with_hidden(name):
    from planner.catalog import get_model
    from profiler.compute import scaled_spec, shard_layer
    spec = get_model(name)
    small, _, note = scaled_spec(spec, torch.device("cpu"), 4096, 2)
    k = spec.hidden // small.hidden
    assert note and k > 1 and small.num_heads == spec.num_heads
    assert small.is_mla == spec.is_mla
    # the widths relative to hidden are the model's (up to rounding to even rope halves)
    assert abs(small.q_dim * k - spec.q_dim) <= 2 * k * spec.num_heads
    assert abs(small.attn_out_dim * k - spec.attn_out_dim) <= 2 * k * spec.num_heads
    assert small.q_dim < spec.q_dim
    with torch.no_grad():
        layer = shard_layer(small, 1, torch.device("cpu"))
        assert numel(layer) == small.layer_params()     # a dense layer of the small model
        layer(torch.randn(1, 8, small.hidden))
        tp2 = shard_layer(small, 2, torch.device("cpu"))   # a tp rank's local shapes
        tp2(torch.randn(1, 8, small.hidden))
        assert tp2.attention.wo.in_features * 2 == small.attn_out_dim
        if not small.is_mla:
            assert tp2.attention.wq.out_features * 2 == small.q_dim


def test_cli_refuses_mtp_in_one_line_exit_2(tmp_path):
    plan_of(BASE.scaled(name="mtp", mtp_layers=1), path=tmp_path / "p.json")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "runtime", "--plan", str(tmp_path / "p.json"),
                        "--steps", "1"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "multi-token prediction (1 mtp_layers)" in lines[0], r.stderr
    assert r.stdout == ""
