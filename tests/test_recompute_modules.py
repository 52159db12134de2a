"""Megatron's selective recompute modules (--recompute-modules): what each frees of a layer's
saved activations, against the tensors Megatron-Core's modules save (counted by hand from the
models' configs), and the modules carried through plan, export and CLI exactly."""
import dataclasses
import json

import pytest

from planner.catalog import get_cluster, get_model
from planner.cost.stage import Candidate, stage_coefficients
from planner.errors import BadInput
from planner.export import export
from planner.plan import Plan
from planner.engines import get_engine
from planner.search import Fixed, search, searched_recompute, to_plan
from tests.cli_helpers import one_line, run
from tests.test_export import megatron_tokens
from tests.test_moe_export import moe_parser

B, S = 1, 4096      # one 4096-token sequence per micro-batch; tp 1, pp 1: one micro-batch in
BF16, FP32 = 2, 4   # flight, so a layer's mem_rec is what recomputing frees of that layer


def coeffs(model, modules, ep=8, dp=8):
    c = Candidate(tp=1, pp=1, dp=dp, zero=1, sp=False, mbs=B, seq_len=S, global_batch=8 * dp,
                  ep=ep, recompute="selective", recompute_modules=modules)
    return stage_coefficients(model, get_cluster("h100x64"), c, "megatron")[0]


def freed(model, modules, **kw):
    """(dense layer, MoE layer) bytes freed per layer; one value where every layer is alike."""
    k = coeffs(model, modules, **kw)
    return (k.mem_rec, k.mem_rec + k.moe.mem_rec) if k.moe is not None else k.mem_rec


def test_mla_up_proj_frees_every_heads_q_k_v():
    """DeepSeek-V3: 128 heads, q and k 128 + 64 wide per head, v 128: the up projections'
    outputs (and RoPE's) that feed the attention core, in dense and MoE layers alike."""
    m = get_model("deepseek-v3")
    qkv = B * S * 128 * (192 + 192 + 128) * BF16
    assert freed(m, ("mla_up_proj",)) == pytest.approx((qkv, qkv))
    # flash attention: the checkpoint keeps q, k, v and the out-proj keeps the output, so
    # only the kernel's own fp32 log-sum-exp (one per head and token) is given back
    lse = B * S * 128 * FP32
    assert freed(m, ("core_attn",)) == pytest.approx((lse, lse))


def test_mlp_frees_a_dense_layers_fc1_input_and_intermediates_only():
    """DeepSeek-V3's 3 dense layers: FC1's input (7168) and gate, up and activation outputs
    (3 x 18432); "mlp" is not the MoE layer's module, which frees nothing by it."""
    m = get_model("deepseek-v3")
    dense, moe = freed(m, ("mlp",))
    assert dense == pytest.approx(B * S * (7168 + 3 * 18432) * BF16)
    assert moe == 0.0


def test_moe_side_modules_of_qwen3_30b():
    """Qwen3-30B-A3B (h 2048, 128 experts of f 768, top-8), ep 8, balanced routing: each GPU's
    experts compute the b*s*8 token copies of its own tokens.
    - moe_act: the experts' activation output, one f-wide tensor per copy;
    - layernorm: the pre-MLP norm's output (the router's and dispatcher's input); the norms of
      GQA attention are fused into Transformer Engine's linears, so nothing else;
    - moe: everything the MoE layer saves: the permuted inputs (h per copy), the FC1 outputs
      and activation output (3f per copy), the router's fp32 scores (128 per token); the
      routing probabilities are applied inside the activation, so no expert outputs."""
    m = get_model("qwen3-30b-a3b")
    copies = B * S * 8
    assert freed(m, ("moe_act",)) == pytest.approx(copies * 768 * BF16)
    assert freed(m, ("layernorm",)) == pytest.approx(B * S * 2048 * BF16)
    assert freed(m, ("moe",)) == pytest.approx(
        copies * 2048 * BF16 + copies * 3 * 768 * BF16 + B * S * 128 * FP32)


def test_what_each_module_runs_again():
    """moe re-runs the dispatch and combine (EP all-to-alls), the output-discarding modules do
    not; re-running the whole MoE layer costs more than its activation alone, and no module
    is free."""
    m = get_model("qwen3-30b-a3b")
    act, moe, norm = (coeffs(m, (x,)) for x in ("moe_act", "moe", "layernorm"))
    assert act.ep_rec == norm.ep_rec == 0.0 < moe.ep_rec == pytest.approx(moe.ep_layer / 2)
    assert 0.0 < norm.compute_rec and 0.0 < act.compute_rec < moe.compute_rec
    assert moe.compute_rec < coeffs(m, ("moe", "moe_act")).compute_rec + 1e-12


def test_layernorm_on_a_dense_gqa_model_is_a_no_op():
    """Llama's two norms are fused into the QKV and FC1 linears under Transformer Engine:
    Megatron's "layernorm" module finds no norm of its own to recompute."""
    m = get_model("llama8b")
    k = coeffs(m, ("layernorm",), ep=1)
    assert k.mem_rec == 0.0 and k.compute_rec == 0.0


def test_search_tries_the_output_discarding_modules_that_apply():
    """Beside full recompute (and none), Megatron's search tries selective recompute of the
    output-discarding modules that change something for the model; none for a dense GQA
    model, whose norms are fused; other engines recompute no modules."""
    meg = get_engine("megatron")
    assert ("selective", ("moe_act", "layernorm", "mla_up_proj")) in searched_recompute(
        meg, Fixed(), get_model("deepseek-v3"))
    assert ("selective", ("moe_act", "layernorm")) in searched_recompute(
        meg, Fixed(), get_model("qwen3-30b-a3b"))
    assert all(g != "selective" for g, _ in searched_recompute(meg, Fixed(),
                                                               get_model("llama8b")))
    assert all(g != "selective" for g, _ in searched_recompute(
        get_engine("torchtitan"), Fixed(), get_model("deepseek-v3")))


def test_a_plan_with_modules_carries_them_to_its_json_and_export():
    """DeepSeek-V3 on 256 H100s with two modules fixed: every layer recomputes them, and the
    plan JSON and the Megatron export say so."""
    m, cl = get_model("deepseek-v3"), get_cluster("h100x256")
    f = Fixed(recompute="selective", recompute_modules=("mla_up_proj", "moe_act"), tp=2, pp=16,
              ep=16, cp=4, mbs=1)
    rep = search(m, cl, f, 8192, 512, engine="megatron", top=1)
    plan = to_plan(m, cl, rep.best, rep, "megatron")
    back = Plan.from_dict(json.loads(plan.to_json()))
    assert back.parallelism.recompute_modules == ("mla_up_proj", "moe_act")
    assert all(s.recompute_layers == s.num_layers for s in back.stages)
    args, _ = moe_parser().parse_known_args(megatron_tokens(export(back, "megatron")))
    assert args.recompute_granularity == "selective"
    assert args.recompute_modules == ["mla_up_proj", "moe_act"]


def test_engines_without_modules_refuse_them():
    m, cl = get_model("qwen3-30b-a3b"), get_cluster("h100x16")
    with pytest.raises(BadInput, match="does not recompute moe_act"):
        search(m, cl, Fixed(recompute="selective", recompute_modules=("moe_act",)), 4096, 64,
               engine="runtime")
    with pytest.raises(BadInput, match="needs --recompute selective"):
        search(m, cl, Fixed(recompute="full", recompute_modules=("moe_act",)), 4096, 64,
               engine="megatron")


def test_cli_recompute_modules_one_line_errors(capsys):
    code, _, err = run(capsys, "--model", "qwen3-30b-a3b", "--cluster", "h100x16",
                       "--recompute-modules", "moe_act,attention")
    one_line(code, err, needle="--recompute-modules takes distinct names")
    code, _, err = run(capsys, "--model", "qwen3-30b-a3b", "--cluster", "h100x16",
                       "--engine", "runtime", "--recompute-modules", "moe_act")
    one_line(code, err, needle="does not recompute moe_act")


def test_a_plan_with_modules_it_cannot_recompute_is_invalid():
    m, cl = get_model("qwen3-30b-a3b"), get_cluster("h100x16")
    rep = search(m, cl, Fixed(recompute="selective", recompute_modules=("moe_act",), tp=1,
                              pp=1, ep=16), 4096, 1024, engine="megatron", top=1)
    d = to_plan(m, cl, rep.best, rep, "megatron").to_dict()
    d["parallelism"]["recompute"] = "full"
    with pytest.raises(BadInput, match="need recompute selective"):
        Plan.from_dict(d)
    d["parallelism"]["recompute"] = "selective"
    d["parallelism"]["recompute_modules"] = ["moe_act", "moe_act"]
    with pytest.raises(BadInput, match="distinct names"):
        Plan.from_dict(d)


def test_the_searchs_shared_figures_tell_modules_apart():
    """The search's per-layout figures (what a recomputed layer frees) are cached per
    recompute: two module sets of one layout are two entries, not one."""
    from planner.search import SharedCoefficients
    m = get_model("qwen3-30b-a3b")
    shared = SharedCoefficients(m, get_cluster("h100x16"), get_engine("megatron"))
    c = Candidate(tp=1, pp=1, dp=16, zero=1, sp=False, mbs=1, seq_len=S, global_batch=64, ep=8,
                  recompute="selective", recompute_modules=("moe_act",))
    act = shared._layer_figures(c)["saves"]
    moe = shared._layer_figures(dataclasses.replace(c, recompute_modules=("moe",)))["saves"]
    # as the plan needs them: activations churn, so with the allocator's reserve
    # (planner.cost.stage MemoryBudget)
    reserve = 1 + get_engine("megatron").allocator_reserve
    assert act == pytest.approx(B * S * 8 * 768 * BF16 * reserve) and moe > 2 * act


def test_nothing_fits_with_modules_fixed_still_suggests_another_layout(capsys):
    """The tips search the layout again with the recompute modules set free too (they once
    kept the modules beside a searched granularity, which the search refuses, and so every
    tip but more GPUs was silently lost)."""
    code, _, err = run(capsys, "--model", "qwen3-30b-a3b", "--cluster", "h100x8",
                       "--recompute-modules", "moe_act", "--tp", "1", "--pp", "1",
                       "--ep", "1", "--zero", "1")
    one_line(code, err, expect=3, needle="would fit: another layout")


def test_the_ep_overlap_is_not_offered_with_the_moe_module():
    """Megatron asserts "moe" not in recompute_modules under --overlap-moe-expert-parallel-comm
    (the MoE recompute re-runs the dispatch): the search leaves the overlap off there, and a
    plan with both is invalid."""
    m, cl = get_model("qwen3-30b-a3b"), get_cluster("h100x16")
    f = Fixed(recompute="selective", tp=1, pp=1, ep=16, mbs=1)
    for mods, overlap in ((("moe",), False), (("moe_act",), True)):
        rep = search(m, cl, dataclasses.replace(f, recompute_modules=mods), 4096, 1024,
                     engine="megatron", top=1)
        assert rep.best.candidate.ep_comm_overlap is overlap
    d = to_plan(m, cl, rep.best, rep, "megatron").to_dict()
    d["parallelism"]["recompute_modules"] = ["moe"]
    with pytest.raises(BadInput, match="moe recompute module"):
        Plan.from_dict(d)
