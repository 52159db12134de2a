"""Activation offload (recompute "offload": Megatron-Core's --cpu-offloading-num-layers,
Transformer Engine's CPU offload; planner.cost.offload): the offloaded layers' activations
leave the GPU, the copies are priced on Transformer Engine's schedule, Megatron's own rules
are kept (pp 1, no recompute, never every layer), and the export says exactly what was priced."""
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli_helpers import one_line, run
from planner.catalog import get_cluster, get_model
from planner.cost.offload import activation_offload_stall
from planner.cost.stage import stage_coefficients
from planner.export.megatron import megatron_args
from planner.rules import plan_problems, runner_problems
from planner.search import Fixed, search, to_plan
from tests.test_export import megatron_parser, megatron_tokens

# meta-llama/Meta-Llama-3-8B config.json
LLAMA3_8B = dict(hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336, layers=32)


def test_the_stall_follows_transformer_engines_schedule_worked_by_hand():
    """cpu_offload.py DefaultOffloadSynchronizer, 4 layers, the first 3 offloaded (K = 1 kept):
    forward 1 s, backward 2 s, each copy 3 s. Forward: layer 0 ends at 1; copy 0 runs 1-4 and
    layer 1 (K + 0) waits for it: 4-5; copy 1 runs 5-8, layer 2 waits: 8-9; copy 2 9-12,
    layer 3 waits: 12-13, 9 s over the 4 of compute. Backward: layer 3 0-2 (kept); the reload
    of layer 2 starts before layer 2's backward (K - 1 + 2 = 2): 2-5, layer 2 5-7; layer 1's
    7-10, layer 1 10-12; layer 0's 12-15, layer 0 15-17: 9 s over the 8. 18 s in all."""
    assert activation_offload_stall([1.0] * 4, [2.0] * 4, [3.0] * 4, 3) == pytest.approx(18.0)
    # one layer offloaded, three kept: its copy (2.5 s) has layers 1-2's forward (2 s) before
    # layer 3 must wait for it, and its reload starts at layer 2's backward (K - 1 + 0 = 2),
    # with layers 2-1 (2 s) to hide it: 0.5 s each way
    assert activation_offload_stall([1.0] * 4, [1.0] * 4, [2.5] * 4, 1) == pytest.approx(1.0)


def test_offloading_every_layer_of_a_rank_is_refused_in_one_line():
    """Megatron-Core offloads fewer layers than a rank builds (planner.rules
    OFFLOAD_KEPT_LAYERS); the stall of a placement that offloads them all says so, where it
    raised a KeyError from inside its schedule."""
    for n in (1, 4):
        with pytest.raises(ValueError, match=f"{n} of a rank's {n} layers offloaded"):
            activation_offload_stall([1.0] * n, [2.0] * n, [3.0] * n, n)
    assert activation_offload_stall([1.0] * 4, [2.0] * 4, [3.0] * 4, 0) == pytest.approx(0.0)


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 12).flatmap(lambda n: st.tuples(
    st.lists(st.floats(0.01, 5), min_size=n, max_size=n),
    st.lists(st.floats(0.01, 5), min_size=n, max_size=n),
    st.lists(st.floats(0.0, 5), min_size=n, max_size=n),
    st.integers(0, n - 1))))
def test_the_stall_is_within_what_the_copies_could_take(case):
    """Never negative; never more than every copy run back to back, each way; none when the
    copies are free; and longer copies never shorten it."""
    fwd, bwd, copy, offloaded = case
    stall = activation_offload_stall(fwd, bwd, copy, offloaded)
    assert -1e-9 <= stall <= 2 * sum(copy[:offloaded]) + 1e-9
    assert activation_offload_stall(fwd, bwd, [0.0] * len(copy), offloaded) == pytest.approx(0.0)
    slower = [2 * x for x in copy]
    assert activation_offload_stall(fwd, bwd, slower, offloaded) >= stall - 1e-9


def _offload_plan(cluster="h100x8", **fixed):
    model = get_model("llama3-8b")
    f = Fixed(tp=1, pp=1, cp=1, mbs=1, zero=1, recompute="offload", **fixed)
    rep = search(model, get_cluster(cluster), f, seq_len=8192, global_batch=64, top=1)
    return model, rep


def test_offloaded_layers_keep_no_activations_on_the_gpu():
    """Each offloaded layer frees what a Llama 3 8B layer saves (Korthikanti et al. 2022's
    tensors with flash attention, bf16, tp 1, per token: both norms' inputs and the QKV and MLP
    inputs 4 x 2h, Q, K, V and the attention output 2 (q + 2 kv + q), the SwiGLU's gate, up and
    output 3 x 2f, the attention's fp32 log-sum-exp 4 per head), one layer's worth more held
    as working memory at most for the copy in flight."""
    model, rep = _offload_plan()
    d = LLAMA3_8B
    q, kv = d["heads"] * d["head_dim"], d["kv_heads"] * d["head_dim"]
    per_token = 4 * 2 * d["hidden"] + 2 * (2 * q + 2 * kv) + 3 * 2 * d["ffn"] + 4 * d["heads"]
    per_layer = 8192 * per_token
    c = rep.best.candidate
    k = stage_coefficients(model, get_cluster("h100x8"), c)[0]
    none = stage_coefficients(model, get_cluster("h100x8"),
                              dataclasses.replace(c, recompute="none"))[0]
    n, r = d["layers"], rep.best.recompute[0]
    assert 0 < r < n
    assert k.memory(n, 0)["activations"] - k.memory(n, r)["activations"] == pytest.approx(
        r * per_layer)
    freed = none.memory(n, 0)["total"] - k.memory(n, r)["total"]
    assert (r - 1) * per_layer - 1 <= freed <= r * per_layer + 1


def test_the_host_link_sets_what_the_copies_cost():
    """On Grace's NVLink-C2C (225 GB/s a GPU) the copies hide behind the compute; on a host link
    a hundred times slower they do not, and the plan says how long the compute waits."""
    fast = _offload_plan("gb200x8")[1].best.estimate
    assert fast.time_breakdown_s["activation_offload"] == pytest.approx(0.0, abs=1e-9)
    slow_gpu = dataclasses.replace(get_cluster("h100x8").gpu, host_link_gbps=0.64)
    slow = dataclasses.replace(get_cluster("h100x8"), gpu=slow_gpu)
    model = get_model("llama3-8b")
    f = Fixed(tp=1, pp=1, cp=1, mbs=1, zero=1, recompute="offload")
    est = search(model, slow, f, seq_len=8192, global_batch=64, top=1).best.estimate
    assert est.time_breakdown_s["activation_offload"] > 1.0


def test_megatron_offloads_only_without_pipelining(capsys):
    """megatron/core/transformer/transformer_config.py: "Currently there is no support for
    Pipeline parallelism with CPU offloading"."""
    code, _, err = run(capsys, "--model", "llama3-8b", "--cluster", "h100x8", "--pp", 2,
                       "--recompute", "offload")
    one_line(code, err, needle="without pipeline parallelism")
    code, _, err = run(capsys, "--model", "llama3-8b", "--cluster", "h100x8", "--engine",
                       "torchtitan", "--recompute", "offload")
    one_line(code, err, needle="no offload recompute")


def test_a_plan_offloading_every_layer_is_refused():
    """transformer_config.py: "CPU offloading can be done only for layers less than"
    num_layers (Transformer Engine keeps the last layer's activations: cpu_offload.py)."""
    model, rep = _offload_plan()
    plan = to_plan(model, get_cluster("h100x8"), rep.best, rep)
    assert not plan_problems(plan, runner="megatron")
    stage = dataclasses.replace(plan.stages[0], recompute_layers=plan.stages[0].num_layers)
    bad = dataclasses.replace(plan, stages=[stage])
    problems = plan_problems(bad, runner="megatron")
    assert problems and "fewer layers than a rank holds" in problems[0]
    cited = [x for x in runner_problems(bad, "megatron") if x.rule == "offload_activations_kept"]
    assert cited and "transformer_config.py" in cited[0].source


def test_the_export_offloads_exactly_the_priced_layers():
    """Megatron's own parser reads --cpu-offloading-num-layers N, N the plan's count, with no
    recompute flag beside it (tests/test_export.py's parser of arguments.py's flags)."""
    model, rep = _offload_plan()
    plan = to_plan(model, get_cluster("h100x8"), rep.best, rep)
    a = megatron_parser().parse_args(megatron_tokens(megatron_args(plan)))
    assert a.cpu_offloading_num_layers == plan.stages[0].recompute_layers > 0
    assert a.recompute_granularity is None and a.pipeline_model_parallel_size == 1


def test_no_offload_beside_the_ep_overlap():
    """Megatron's EP overlap runs the layers through its own schedule plan
    (fine_grained_callables.py), outside TransformerBlock's offload context: an MoE plan
    offloads activations only without the overlap."""
    model = get_model("mixtral-8x7b")
    rep = search(model, get_cluster("h100x64"), Fixed(pp=1, recompute="offload"),
                 seq_len=4096, global_batch=256, top=5)
    assert rep.ranked and all(not r.candidate.ep_comm_overlap for r in rep.ranked)
    # a plan asking for both is refused, citing why as the planner's own rule (Megatron would
    # run it, without offloading)
    plan = to_plan(model, get_cluster("h100x64"), rep.best, rep)
    both = dataclasses.replace(plan, parallelism=dataclasses.replace(plan.parallelism,
                                                                     ep_comm_overlap=True))
    from planner.rules import rule_problems
    problems = [x for x in rule_problems(both) if x.rule == "ep_overlap_offload"]
    assert problems and "the planner's rule, not Megatron's" in problems[0].source
    assert not [x for x in rule_problems(plan) if x.rule == "ep_overlap_offload"]


def test_an_offload_of_no_layer_is_ranked_as_the_plan_without_recompute():
    """Found by review: with room for a Llama 3 8B layer's activations but not for Megatron's
    full-recompute bookkeeping (the loss's peak beside a layer's working set, counted apart
    under recompute), the offload candidate's best placement offloads nothing; that plan is
    the one without recompute, and the search must return it (priced as "none": no copy in
    flight, no offload flag), not a plan recomputing a layer. The brute force: the candidate
    priced without recompute fits and nothing is faster."""
    from planner.cost.price import price
    from tests.test_moe_planner import cluster_with_memory
    model, cluster = get_model("llama3-8b"), cluster_with_memory(100.8, n=8)
    rep = search(model, cluster, Fixed(tp=1, pp=1, mbs=1, zero=1), seq_len=8192,
                 global_batch=64, top=2, margin_gib=0.0)
    plain = dataclasses.replace(rep.best.candidate, recompute="none")
    est = price(model, cluster, plain, [32], [0], margin_gib=0.0).estimate
    full = price(model, cluster, dataclasses.replace(plain, recompute="full"), [32], [0],
                 margin_gib=0.0).estimate
    assert est.fits and not full.fits
    assert rep.best.candidate.recompute == "none" and rep.best.recompute == [0]
    assert rep.best.estimate.step_time_s == pytest.approx(est.step_time_s)
