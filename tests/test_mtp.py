"""Multi-token prediction modules are priced on the last pipeline rank, as Megatron-Core builds
them there (megatron/core/transformer/multi_token_prediction.py): per module one more layer of
the last layer's kind, eh_proj (2h -> h, column-parallel), three norms, the embedding copy the
MTP stage keeps (GPTModel: `if self.pre_process or self.mtp_process`), the output head and
its head once more (the projection's input and the loss's saved logits). Expected figures come from the Model's own parameter counts and
Megatron's bytes per parameter (bf16 weight 2, fp32 gradient 4, Adam + master 12 sharded by
the distributed optimizer), not from the cost code."""
import dataclasses

import pytest

from planner.catalog import get_cluster, get_model
from planner.cost import comm
from planner.cost.compute import GEMM_BWD_FACTOR, attention_width, gemm_time, mean_attended_keys
from planner.cost.schedule import in_flight
from planner.cost.stage import (MTP_SAVED_HIDDENS, Candidate, evaluate, model_flops_per_step,
                                stage_coefficients)
from planner.engines import get_engine
from planner.cost.facts import facts_for

BF16, GRAD, ADAM = 2, 4, 12      # Megatron: bf16 weights, fp32 main grads, fp32 master + m + v
STATE_FIELDS = ("params", "grads", "optimizer")


def coeffs_pair(model, cluster, c, mtp=1):
    with_mtp = dataclasses.replace(model, mtp_layers=mtp)
    without = dataclasses.replace(model, mtp_layers=0)
    return (stage_coefficients(with_mtp, cluster, c, "megatron"),
            stage_coefficients(without, cluster, c, "megatron"), with_mtp)


def state_delta(k1, k0):
    return {f: k1.mem_fixed[f] - k0.mem_fixed[f] for f in STATE_FIELDS}


DENSE_C = Candidate(tp=2, pp=4, dp=2, zero=1, sp=True, mbs=1, seq_len=4096, global_batch=64)


@pytest.mark.parametrize("mtp", [1, 2])
def test_dense_last_rank_gains_exactly_the_mtp_modules(mtp):
    cl = get_cluster("h100x16")
    c = DENSE_C
    k1s, k0s, m = coeffs_pair(get_model("llama3-8b"), cl, c, mtp)
    # every other rank is untouched
    assert k1s[:-1] == k0s[:-1]
    k1, k0 = k1s[-1], k0s[-1]
    t, dp, h = c.tp, c.dp_cp, m.hidden
    # per GPU: matmul weights split by tp, norms replicated (2 in the layer, 3 in the module),
    # and the untied word embedding the MTP stage holds beside the head under pp > 1
    norms = mtp * 5 * m.norm_params()
    per_gpu = (m.mtp_params() - norms) / t + norms + m.vocab_size * h / t
    d = state_delta(k1, k0)
    assert d["params"] == pytest.approx(BF16 * per_gpu, rel=1e-12)
    assert d["grads"] == pytest.approx(GRAD * per_gpu, rel=1e-12)
    assert d["optimizer"] == pytest.approx(ADAM * per_gpu / dp, rel=1e-12)
    # activations: one layer's saved activations per micro-batch in flight (the rank's own
    # per-layer figure), the module's saved hidden states, and one more head (the last rank's
    # fixed activations without MTP are exactly its head's under 1F1B: the final norm's input,
    # which the module's saved hidden states count as its final layernorm's, the output
    # projection's sequence-parallel input and the loss's saved logits)
    tokens = c.mbs * c.seq_len
    saved = MTP_SAVED_HIDDENS * BF16 * tokens * h / t
    infl = in_flight("1f1b", c.pp, c.pp - 1, c.m, c.vpp)
    act = k1.mem_fixed["activations"] - k0.mem_fixed["activations"]
    logits = k0.mem_fixed["activations"] - BF16 * tokens * h / t
    assert act == pytest.approx(mtp * (k0.mem_layer["activations"] + saved * infl + logits),
                                rel=1e-12)
    # time: the layer's forward + backward with its TP communication, the head (the last
    # rank's fixed compute without MTP), the embedding (rank 0's), and eh_proj with its
    # gathers of the 2h input and the h output
    facts = facts_for(get_engine("megatron"), cl.gpu)
    eh = gemm_time(facts.gpu, tokens, h / t, 2 * h) * (1 + GEMM_BWD_FACTOR)
    link = comm.group_link(cl, t, 1)
    hidden_bytes = facts.comm_elem_bytes * tokens * h
    eh += 2 * (comm.all_gather(hidden_bytes, t, link) + comm.all_gather(2 * hidden_bytes, t, link))
    emb = k0s[0].compute_fixed
    assert k1.compute_fixed - k0.compute_fixed == pytest.approx(
        mtp * (k0.t_layer + k0.compute_fixed + emb + eh), rel=1e-9)
    assert (k1.fwd_fixed + k1.bwd_fixed) == pytest.approx(k1.compute_fixed, rel=1e-9)


def test_mixed_moe_last_rank_gains_one_moe_layer():
    """DeepSeek-V3 (dense first layers, MoE after, one MTP module): the module's layer is an
    MoE layer, its routed experts sharded over expert-dp, the rest over dp x cp."""
    cl = get_cluster("h100x256")
    c = Candidate(tp=2, pp=8, dp=16, zero=1, sp=True, mbs=1, seq_len=4096, global_batch=256,
                  ep=16, etp=1)
    k1s, k0s, m = coeffs_pair(get_model("deepseek-v3"), cl, c)
    assert k1s[:-1] == k0s[:-1]
    t, dp, h = c.tp, c.dp_cp, m.hidden
    edp = t * c.dp // (c.ep * c.etp)
    experts = m.num_experts // c.ep * m.expert_params() / c.etp
    # non-expert: attention and shared expert split by tp; the router, norms and MLA's down
    # projections (q_a, kv_a: duplicated over tp by Megatron-Core's MLASelfAttention) replicated
    replicated = (m.router_params() + 5 * m.norm_params()
                  + h * (m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim))
    nonexpert = (m.mtp_params() - m.num_experts * m.expert_params() - replicated) / t \
        + replicated + m.vocab_size * h / t
    d = state_delta(k1s[-1], k0s[-1])
    # MLA's latent norms (attn_extra_params, 2 x 1536-512 wide) are counted by Model but not in
    # the planner's layer: a few thousand of ~1.5e9 parameters
    assert d["params"] == pytest.approx(BF16 * (nonexpert + experts), rel=1e-5)
    assert d["grads"] == pytest.approx(GRAD * (nonexpert + experts), rel=1e-5)
    assert d["optimizer"] == pytest.approx(ADAM * (nonexpert / dp + experts / edp), rel=1e-5)
    # its time includes the layer's expert dispatch and combine
    k1, k0 = k1s[-1], k0s[-1]
    assert k1.compute_fixed - k0.compute_fixed > k0.t_layer + k0.moe.t_layer


def test_no_mtp_and_pp1():
    cl = get_cluster("h100x16")
    c = dataclasses.replace(DENSE_C, pp=1, dp=8)
    k1s, k0s, m = coeffs_pair(get_model("llama3-8b"), cl, c)
    # one rank holds both ends: no embedding copy, only the module
    t = c.tp
    norms = 5 * m.norm_params()
    per_gpu = (m.mtp_params() - norms) / t + norms
    assert state_delta(k1s[0], k0s[0])["params"] == pytest.approx(BF16 * per_gpu, rel=1e-12)
    # a model without MTP prices exactly as its mtp_layers=0 copy
    base = get_model("llama3-8b")
    assert base.mtp_layers == 0
    assert stage_coefficients(base, cl, DENSE_C, "megatron") == stage_coefficients(
        dataclasses.replace(base, mtp_layers=0), cl, DENSE_C, "megatron")


def test_plan_estimate_grows_on_the_last_stage_only():
    cl = get_cluster("h100x16")
    c = DENSE_C
    m = get_model("llama3-8b")
    layers, rec = [8, 8, 8, 8], [0, 0, 0, 0]
    e0 = evaluate(dataclasses.replace(m, mtp_layers=0), cl, c, layers, rec, engine="megatron")
    e1 = evaluate(dataclasses.replace(m, mtp_layers=1), cl, c, layers, rec, engine="megatron")
    assert e1.stage_memory_gib[:-1] == e0.stage_memory_gib[:-1]
    assert e1.stage_memory_gib[-1]["total"] > e0.stage_memory_gib[-1]["total"]
    assert e1.stage_time_s[:-1] == e0.stage_time_s[:-1]
    assert e1.stage_time_s[-1] > e0.stage_time_s[-1]
    assert e1.step_time_s > e0.step_time_s


@pytest.mark.parametrize("name", ["llama3-8b", "deepseek-v3"])
def test_model_flops_count_mtp_as_megatron_does(name):
    """megatron/training/training.py num_floating_point_operations: an MTP module adds one
    layer of the last layer's kind, 3h + 2h^2 (norms, eh_proj) and one more logit GEMM."""
    m = dataclasses.replace(get_model(name), mtp_layers=1)
    m0 = dataclasses.replace(m, mtp_layers=0)
    s, B = 4096, 32
    last = (m.moe_layer_active_params() - 2 * m.norm_params() - m.attn_extra_params()
            - m.attn_bias_params() if m.moe_layer(m.num_layers - 1)
            else m.attn_matmul_params() + m.mlp_matmul_params())
    per_token = last + 3 * m.hidden + 2 * m.hidden ** 2 + m.vocab_size * m.hidden
    attn = 12.0 * B * s * mean_attended_keys(m, s, causal=False) * attention_width(m)
    delta = model_flops_per_step(m, s, B) - model_flops_per_step(m0, s, B)
    assert delta == pytest.approx(6.0 * per_token * s * B + attn, rel=1e-9)
