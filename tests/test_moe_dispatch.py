"""The MoE token dispatchers and the EP all-to-all overlap: DeepEP's node-deduplicated
dispatch against a brute-force count, the overlap's bounds, Megatron's own checks of the
overlap, and the plan / CLI carrying what was priced."""
import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.catalog import get_cluster
from planner.cost import comm
from planner.cost.moe import (flex_all_to_all, overlapped_ep_comm, remote_domains_per_token,
                              tokens_in)
from planner.errors import BadInput
from planner.plan import Plan
from planner.search import Fixed, search, to_plan
from planner.specs import Model
from tests.cli_helpers import one_line, run
from tests.test_moe_planner import tiny_moe


def brute_remote_domains(E: int, k: int, d: int) -> float:
    """Average over every k-subset of E experts (domain of expert e: e // (E/d)) of the domains
    other than domain 0 (the token's own) that it touches."""
    per = E // d
    total = count = 0
    for experts in itertools.combinations(range(E), k):
        total += len({e // per for e in experts} - {0})
        count += 1
    return total / count


@pytest.mark.parametrize("E,k,d", [(8, 2, 2), (12, 3, 4), (16, 4, 4), (16, 8, 8), (12, 1, 3),
                                   (16, 16, 4)])
def test_remote_domains_match_the_brute_force_count(E, k, d):
    assert remote_domains_per_token(E, k, d) == pytest.approx(brute_remote_domains(E, k, d))


def mixtral_like(experts=64, k=8):
    return Model("moe", num_layers=4, hidden=4096, ffn_hidden=14336, num_heads=32,
                 num_kv_heads=8, vocab_size=32000, max_seq_len=4096, num_experts=experts,
                 experts_per_token=k, moe_ffn_hidden=2048)


@settings(max_examples=30, deadline=None)
@given(ep=st.sampled_from([16, 32, 64]), k=st.integers(1, 8))
def test_flex_across_nodes_never_sends_more_than_nccl(ep, k):
    """Across nodes DeepEP sends a token once per other node holding its experts: never more
    bytes over the NICs than NCCL's k copies; with k = 1 there is nothing to deduplicate."""
    m, cl = mixtral_like(k=k), get_cluster("h100x64")
    T = tokens_in(1, 4096, 1)
    nccl = comm.all_to_all(2 * T * k * m.hidden, ep, cl)
    flex = flex_all_to_all(m, cl, T, ep, 1, 1.0)
    assert flex <= nccl * (1 + 1e-9)
    if k == 1:
        assert flex == pytest.approx(nccl, rel=1e-6)
    if k >= 2:    # two of a token's experts can share a node: strictly fewer bytes
        assert flex < nccl


@settings(max_examples=50, deadline=None)
@given(comm_s=st.floats(0, 1), fwd=st.floats(0, 1), bwd=st.floats(0, 2),
       slow=st.floats(0, 0.5))
def test_overlap_exposes_at_most_the_serial_comm_and_at_least_its_slowdown(comm_s, fwd, bwd, slow):
    out = overlapped_ep_comm(comm_s, fwd, bwd, slow)
    assert out <= 2 * comm_s + 1e-12                  # overlap only hides time
    assert out >= 2 * slow * min(comm_s, fwd, bwd) - 1e-12
    if fwd >= comm_s and bwd >= comm_s:               # fully covered: only the slowdown
        assert out == pytest.approx(2 * slow * comm_s)
    if fwd == bwd == 0:                               # nothing to hide behind
        assert out == pytest.approx(2 * comm_s)


@pytest.fixture(scope="module")
def overlap_pair():
    """The same small MoE problem searched with and without the EP overlap."""
    m, cl = tiny_moe(layers=8, first_dense=0, experts=8), get_cluster("h100x16")
    with_ = search(m, cl, Fixed(pp=1), seq_len=4096, global_batch=64, engine="megatron")
    without = search(m, cl, Fixed(pp=1, ep_comm_overlap=False), seq_len=4096,
                     global_batch=64, engine="megatron")
    return m, cl, with_, without


def test_the_overlap_never_makes_the_best_plan_slower(overlap_pair):
    m, cl, with_, without = overlap_pair
    assert with_.best.estimate.step_time_s <= without.best.estimate.step_time_s * (1 + 1e-9)
    assert not without.best.candidate.ep_comm_overlap


def test_the_plan_records_and_round_trips_what_it_priced(overlap_pair):
    m, cl, with_, _ = overlap_pair
    plan = to_plan(m, cl, with_.best, with_)
    p = plan.parallelism
    assert p.moe_dispatcher in ("alltoall", "allgather", "flex")
    back = Plan.from_dict(json.loads(plan.to_json()))
    assert (back.parallelism.moe_dispatcher, back.parallelism.ep_comm_overlap) == (
        p.moe_dispatcher, p.ep_comm_overlap)


def plan_dict(fixed: Fixed) -> dict:
    m, cl = tiny_moe(layers=8, first_dense=0, experts=8), get_cluster("h100x16")
    rep = search(m, cl, fixed, seq_len=4096, global_batch=64, engine="megatron")
    return to_plan(m, cl, rep.best, rep).to_dict()


INTERLEAVED = Fixed(pp=2, vpp=2, ep=2)


@pytest.mark.parametrize("fixed,changes,why", [
    (INTERLEAVED, dict(recompute="full"), "full recompute"),
    (Fixed(pp=2, schedule="1f1b", ep=2), {}, "interleaved"),
    (INTERLEAVED, dict(moe_dispatcher="allgather"), "alltoall or flex"),
    (Fixed(pp=2, vpp=2, ep=1), {}, "ep > 1"),
])
def test_megatrons_checks_of_the_overlap_refuse_a_plan(fixed, changes, why):
    """Megatron-Core's asserts (transformer_config.py) as plan validation: a plan claiming
    the overlap where Megatron would refuse it is refused."""
    d = plan_dict(fixed)
    d["parallelism"].update(ep_comm_overlap=True, **changes)
    if changes.get("recompute") == "full":
        d["stages"][0]["recompute_layers"] = 1
    with pytest.raises(BadInput, match=why):
        Plan.from_dict(d)


def test_a_fixed_dispatcher_is_priced_and_exported(capsys):
    code, out, err = run(capsys, "--model", "mixtral-8x7b", "--cluster", "h100x16",
                         "--moe-dispatcher", "allgather", "--pp", "2", "--export", "megatron",
                         limit_s=60)
    assert code == 0, err
    assert "--moe-token-dispatcher-type allgather" in out
    assert "--overlap-moe-expert-parallel-comm" not in out


def test_an_engine_without_the_dispatcher_refuses_in_one_line(capsys):
    code, out, err = run(capsys, "--model", "mixtral-8x7b", "--cluster", "h100x16",
                         "--engine", "torchtitan", "--moe-dispatcher", "flex")
    one_line(code, err, needle="no flex token dispatcher")


def test_capacity_factor_sets_each_experts_tokens():
    """GShard / Switch (Sec. 2.2): each expert computes capacity_factor x its balanced share of
    the T*k token copies, padded or cut to it, whatever the routing's imbalance."""
    from planner.cost.moe import moe_layer
    m, cl = mixtral_like(), get_cluster("h100x64")
    gpu = cl.gpu
    T = tokens_in(1, 4096, 1)
    share = T * m.experts_per_token * 8 / m.num_experts          # ep 8, etp 1
    for cf in (0.5, 1.0, 1.25, 2.0):
        ml = moe_layer(m, cl, gpu, 1, 4096, 1, 8, 1, ("alltoall",), imbalance=1.7,
                       capacity_factor=cf)
        assert ml.tokens_per_expert == pytest.approx(cf * share)
    assert moe_layer(m, cl, gpu, 1, 4096, 1, 8, 1, ("alltoall",),
                     imbalance=1.7).tokens_per_expert == pytest.approx(1.7 * share)


def test_drop_and_pad_removes_exactly_the_host_stall():
    """With every expert padded to capacity the dispatcher knows the token counts on the host
    (megatron/core/transformer/moe/token_dispatcher.py skips the device-to-host copy): at
    capacity factor 1 on balanced routing the work is the same and only the engine's
    dropless stall goes, once per layer forward: the sync, and of the host's per-expert
    issuing what the layer's forward work on the GPU (the padded layer's forward) does not
    cover: all of it for a short sequence over many local experts, none for one local expert
    under a long sequence."""
    import dataclasses
    from planner.cost.stage import Candidate, stage_coefficients
    from planner.engines import get_engine
    cl, eng = get_cluster("h100x8"), get_engine("megatron")
    sync, per_expert = eng.moe_layer_overhead_s, eng.moe_expert_overhead_s
    assert sync > 0 and per_expert > 0
    seen = set()
    for experts, ep, seq in ((64, 1, 256), (64, 8, 256), (8, 8, 4096), (8, 2, 1024)):
        m = tiny_moe(layers=4, first_dense=0, experts=experts)
        c = Candidate(tp=1, pp=1, dp=8, zero=1, sp=False, mbs=1, seq_len=seq,
                      global_batch=64, ep=ep, moe_dispatcher="alltoall")
        dropless = stage_coefficients(m, cl, c, engine=eng)[0]
        padded = stage_coefficients(m, cl, dataclasses.replace(c, moe_capacity_factor=1.0),
                                    engine=eng)[0]
        stall = dropless.compute_layer - padded.compute_layer
        issue = per_expert * (experts // ep)
        # the sync always; of the issue time at most all, and at least what one layer's
        # forward on the GPU (the padded layer's, the same work) cannot cover
        assert sync * (1 - 1e-9) <= stall <= (sync + issue) * (1 + 1e-9)
        assert stall >= sync + issue - padded.fwd_layer - 1e-12
        assert dropless.ep_layer == pytest.approx(padded.ep_layer)
        seen.add("exposed" if stall > sync + issue / 2 else
                 "hidden" if stall == pytest.approx(sync) else "partly")
    # a short sequence over 64 local experts leaves most of the issue time exposed; one local
    # expert under a 4096-token layer hides it all
    assert {"exposed", "hidden"} <= seen


def test_token_dropping_is_exported_as_megatron_reads_it(capsys):
    from tests.test_export import megatron_tokens
    from tests.test_moe_export import moe_parser
    code, out, err = run(capsys, "--model", "mixtral-8x7b", "--cluster", "h100x16", "--pp", "2",
                         "--moe-capacity-factor", "1.25", "--export", "megatron", limit_s=60)
    assert code == 0, err
    ap = moe_parser()
    ap.add_argument("--moe-expert-capacity-factor", type=float, default=None)
    ap.add_argument("--moe-pad-expert-input-to-capacity", action="store_true")
    a = ap.parse_args(megatron_tokens(out))
    assert a.moe_expert_capacity_factor == 1.25 and a.moe_pad_expert_input_to_capacity
    assert a.moe_token_dispatcher_type == "alltoall"


@pytest.mark.parametrize("args,needle", [
    (["--model", "mixtral-8x7b", "--moe-capacity-factor", "0"], "must be positive"),
    (["--model", "mixtral-8x7b", "--moe-capacity-factor", "nan"], "must be positive"),
    (["--model", "llama8b", "--moe-capacity-factor", "1"], "has no experts"),
    (["--model", "mixtral-8x7b", "--moe-capacity-factor", "1", "--engine", "torchtitan"],
     "dropless only"),
    (["--model", "mixtral-8x7b", "--moe-capacity-factor", "1", "--moe-dispatcher", "flex"],
     "alltoall dispatcher only"),
])
def test_bad_token_dropping_is_refused_in_one_line(capsys, args, needle):
    code, out, err = run(capsys, *args, "--cluster", "h100x16")
    one_line(code, err, needle=needle)


def test_engines_without_token_dropping_or_the_overlap_refuse_such_plans():
    """A plan priced with what an engine does not run is refused for it, in one line each."""
    import dataclasses
    from planner.engines import get_engine
    from planner.engines.runnable import problems
    d = plan_dict(INTERLEAVED)
    d["parallelism"].update(moe_capacity_factor=1.0, ep_comm_overlap=True,
                            moe_dispatcher="alltoall")
    plan = Plan.from_dict(d)
    assert problems(plan, get_engine("megatron")) == []
    for name in ("torchtitan", "runtime"):
        got = " | ".join(problems(dataclasses.replace(plan, engine=name), get_engine(name)))
        assert "dropless only" in got and "does not overlap the EP all-to-alls" in got, got


def test_routing_imbalance_costs_the_busiest_rank_time_and_memory(capsys):
    """The busiest expert rank at F x its balanced share: its expert GEMMs, its all-to-all
    share and its saved expert activations grow; the plan records the assumption; a factor
    below 1 is refused."""
    m, cl = tiny_moe(layers=8, first_dense=0, experts=8), get_cluster("h100x16")
    f = dict(pp=1, ep=8, mbs=1, zero=1, recompute="full")
    base = search(m, cl, Fixed(**f), seq_len=4096, global_batch=64, engine="megatron").best
    hot = search(m, cl, Fixed(**f, moe_imbalance=1.5), seq_len=4096, global_batch=64,
                 engine="megatron").best
    assert hot.estimate.step_time_s > base.estimate.step_time_s
    b, h = base.estimate.time_breakdown_s, hot.estimate.time_breakdown_s
    assert h["ep_comm"] > b["ep_comm"] and h["compute"] > b["compute"]
    # the hot rank's expert activations (here the recomputed layer's working set) grow too
    assert hot.estimate.stage_memory_gib[0]["total"] > base.estimate.stage_memory_gib[0]["total"]
    assert to_plan(m, cl, hot).parallelism.moe_imbalance == 1.5
    code, out, err = run(capsys, "--model", "mixtral-8x7b", "--cluster", "h100x16",
                         "--moe-imbalance", "0.5")
    one_line(code, err, needle="at least 1")


@pytest.mark.parametrize("m,pp,vpp,expect", [
    (8, 1, 1, 1 / 8),              # the first forward and the last backward alone
    (128, 8, 4, 39 / 512),         # warm-up 2*7 + 3*8 + 1 virtual micro-batches of 128*4
    (4, 8, 2, 1.0),                # more warm-up than passes: nothing paired
])
def test_unpaired_passes_follow_megatrons_warm_up(m, pp, vpp, expect):
    from planner.cost.moe import unpaired_pass_share
    assert unpaired_pass_share(m, pp, vpp) == pytest.approx(expect)


def test_the_overlap_prices_its_micro_batches_in_memory():
    """The overlap holds the activations the schedule holds without it, with and without
    pipelining."""
    import dataclasses
    from planner.cost.stage import Candidate, stage_coefficients
    from planner.engines import get_engine
    m, cl, eng = tiny_moe(layers=4, first_dense=0, experts=8), get_cluster("h100x8"), \
        get_engine("megatron")
    c = Candidate(tp=1, pp=1, dp=8, zero=1, sp=False, mbs=1, seq_len=4096, global_batch=64,
                  ep=8, moe_dispatcher="alltoall")
    plain = stage_coefficients(m, cl, c, engine=eng)[0].memory(4, 0)
    over = stage_coefficients(m, cl, dataclasses.replace(c, ep_comm_overlap=True),
                              engine=eng)[0].memory(4, 0)
    assert over["activations"] == pytest.approx(plain["activations"])
    c2 = Candidate(tp=1, pp=2, dp=4, zero=1, sp=False, mbs=1, seq_len=4096, global_batch=64,
                   ep=4, moe_dispatcher="alltoall", schedule="interleaved", vpp=2)
    plain2 = stage_coefficients(m, cl, c2, engine=eng)[0].memory(1, 0)
    over2 = stage_coefficients(m, cl, dataclasses.replace(c2, ep_comm_overlap=True),
                               engine=eng)[0].memory(1, 0)
    assert over2["activations"] == pytest.approx(plain2["activations"])


def test_flex_needs_more_than_one_expert_rank(capsys):
    code, out, err = run(capsys, "--model", "mixtral-8x7b", "--cluster", "h100x16",
                         "--moe-dispatcher", "flex", "--ep", "1")
    one_line(code, err, needle="ep x etp > 1")
    d = plan_dict(Fixed(pp=2, vpp=2, ep=1))
    d["parallelism"].update(moe_dispatcher="flex")
    with pytest.raises(BadInput, match="ep x etp > 1"):
        Plan.from_dict(d)


def test_tips_keep_the_users_routing_assumptions():
    """A 'would fit' tip searches the layout again but keeps what the user assumed."""
    from planner.suggest import _layout_free
    f = Fixed(tp=2, pp=4, ep=8, moe_imbalance=1.5, moe_capacity_factor=1.25,
              moe_dispatcher="alltoall", ep_comm_overlap=False, tp_comm_overlap=False)
    g = _layout_free(f)
    assert (g.tp, g.pp, g.ep) == (None, None, None)
    assert (g.moe_imbalance, g.moe_capacity_factor, g.moe_dispatcher, g.ep_comm_overlap,
            g.tp_comm_overlap) == (1.5, 1.25, "alltoall", False, False)


def test_the_overlap_takes_at_most_one_mtp_layer():
    # transformer_config.py: "MTP layernum only supports 1 when enabling
    # overlap_moe_expert_parallel_comm"
    from planner import rules as V
    assert V.ep_comm_overlap_blockers(2, 1, "1f1b", "none", "alltoall", mtp_layers=1) == []
    assert "MTP" in " ".join(V.ep_comm_overlap_blockers(2, 1, "1f1b", "none", "alltoall",
                                                        mtp_layers=2))


@pytest.mark.parametrize("E,k,ep", [(8, 2, 4), (16, 4, 8), (16, 8, 4), (12, 3, 2)])
def test_flex_inside_a_domain_sends_a_token_once_per_gpu(E, k, ep):
    """DeepEP / HybridEP send a token once to each GPU holding one of its experts (Megatron-Core
    fused_a2a.py, get_dispatch_layout's is_token_in_rank): inside one NVLink domain the bytes
    a GPU sends are the brute-force count of those GPUs, not NCCL's k copies."""
    m, cl = mixtral_like(experts=E, k=k), get_cluster("h100x8")
    T = tokens_in(1, 4096, 1)
    gpu = cl.gpu
    # the GPUs other than its own that a token's experts lie on: the brute-force count over
    # groups, here the ep ranks
    sent = 2 * T * m.hidden * brute_remote_domains(E, k, ep)
    expected = sent / (gpu.nvlink_p2p_gbps * 1e9) + gpu.nvlink_latency_us * 1e-6
    assert flex_all_to_all(m, cl, T, ep, 1, 1.0) == pytest.approx(expected, rel=1e-9)
    # and fewer than the all-to-all's copies wherever two experts can share a GPU
    nccl = comm.all_to_all(2 * T * k * m.hidden, ep, cl)
    assert flex_all_to_all(m, cl, T, ep, 1, 1.0) < nccl
