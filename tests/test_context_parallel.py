"""Context parallelism: rank layout, zigzag balance, the K/V exchanges, sharding over dp x cp,
validity, search and the engines that run it. Each property is checked against something
computed independently here (a brute-force count, a simulated ring, the NCCL formula, the
rank grid Megatron builds)."""
import dataclasses
import time

import numpy as np
import pytest

from planner import rules as V
from planner.catalog import get_cluster, get_model
from planner.cost import comm
from planner.cost.context import cp_exchange
from planner.cost.memory import ADAM_K
from planner.cost.stage import Candidate, stage_coefficients
from planner.engines import get_engine
from planner.cost.facts import facts_for
from planner.errors import BadInput
from planner.plan import Plan
from planner.search import Fixed, search, to_plan
from planner.specs import Cluster
from runtime.train import Refused, preflight

# Llama 3.1 8B: Llama 3 8B's shape with 131072 positions (HF meta-llama/Llama-3.1-8B config)
LLAMA31_8B = dataclasses.replace(get_model("llama8b"), name="llama3.1-8b", max_seq_len=131072)


# ---- rank layout --------------------------------------------------------------------------

def megatron_groups(tp, cp, dp, pp, dim):
    """Rank groups of one dimension in Megatron-Core's order tp-cp-ep-dp-pp (tp fastest):
    the ranks that differ only in that coordinate."""
    grid = np.arange(tp * cp * dp * pp).reshape(pp, dp, cp, tp)   # outermost first
    axis = {"pp": 0, "dp": 1, "cp": 2, "tp": 3}[dim]
    moved = np.moveaxis(grid, axis, -1)
    return moved.reshape(-1, moved.shape[-1])


@pytest.mark.parametrize("tp,cp,dp,pp", [(2, 4, 2, 2), (4, 2, 4, 1), (8, 2, 2, 2), (1, 8, 2, 1),
                                         (2, 2, 8, 1)])
def test_group_strides_and_links_follow_megatrons_rank_grid(tp, cp, dp, pp):
    cluster = get_cluster(f"h100x{tp * cp * dp * pp}")      # 8 GPUs per node
    for dim, size, stride in (("cp", cp, tp), ("dp", dp, tp * cp), ("pp", pp, tp * cp * dp)):
        groups = megatron_groups(tp, cp, dp, pp, dim)
        for g in groups:
            assert list(np.diff(g)) == [stride] * (size - 1)
        in_node = all(len({r // 8 for r in g}) == 1 for g in groups)
        assert comm.group_link(cluster, size, stride).intra == (in_node or size == 1), dim
    # the gradient group dp x cp: contiguous cp-then-dp blocks, stride tp
    grid = np.arange(tp * cp * dp * pp).reshape(pp, dp * cp, tp)
    for g in np.moveaxis(grid, 1, -1).reshape(-1, dp * cp):
        assert list(np.diff(g)) == [tp] * (dp * cp - 1)


def test_old_plans_with_three_rank_dims_still_read():
    rep = search(get_model("llama8b"), get_cluster("h100x8"), Fixed(cp=1))
    d = to_plan(get_model("llama8b"), get_cluster("h100x8"), rep.best, rep).to_dict()
    d["parallelism"]["rank_order"] = ["dp", "pp", "tp"]
    del d["parallelism"]["cp_comm_type"]
    p = Plan.from_dict(d).parallelism
    assert p.rank_order == ("dp", "pp", "cp", "tp") and p.cp_comm_type == "p2p"


# ---- compute: zigzag load balance ---------------------------------------------------------

@pytest.mark.parametrize("cp", [2, 4, 8])
def test_zigzag_gives_every_rank_one_cp_th_of_causal_attention(cp):
    """Brute force: split 2*cp*c tokens into 2*cp chunks, rank i holds chunks i and 2cp-1-i;
    count the causal (query, key <= query) pairs of each rank's queries."""
    c = 16
    n = 2 * cp * c
    pairs = []
    for i in range(cp):
        queries = list(range(i * c, (i + 1) * c)) + list(range((2 * cp - 1 - i) * c,
                                                               (2 * cp - i) * c))
        pairs.append(sum(q + 1 for q in queries))
    total = n * (n + 1) // 2
    assert len(set(pairs)) == 1 and pairs[0] * cp == total
    # the cost model: per rank the attention is 1/cp of the whole, the rest that of s/cp tokens
    m, gpu = get_model("llama8b"), get_cluster("h100x8").gpu
    f = facts_for(get_engine("megatron"), gpu)
    s = 8192 * cp
    whole = f.layer_time(m, 1, s, 1, False, True)
    mine = f.layer_time(m, 1, s, 1, False, True, cp=cp)
    assert mine.attn_fwd * cp == pytest.approx(whole.attn_fwd)
    short = f.layer_time(m, 1, s // cp, 1, False, True)
    assert (mine.gemm_fwd, mine.elem_fwd) == pytest.approx((short.gemm_fwd, short.elem_fwd))


# ---- communication ------------------------------------------------------------------------

# the all-to-all formula (nccl-tests) is tested in tests/test_moe_planner.py


def simulated_ring(cp, compute, send):
    """Timeline of ring attention: step i computes while the chunk for step i+1 travels; step
    i+1 starts once both are done. Returns the time beyond the compute alone."""
    t = 0.0
    for step in range(cp):
        t += max(compute, send) if step < cp - 1 else compute
    return t - cp * compute


@pytest.mark.parametrize("seq,cp", [(8192, 2), (32768, 4), (131072, 8), (4096, 8)])
def test_p2p_exposure_matches_a_simulated_ring(seq, cp):
    m = get_model("llama70b")
    cluster = get_cluster("h100x64")
    f = facts_for(get_engine("megatron"), cluster.gpu)
    lt = f.layer_time(m, 1, seq, 2, True, True, cp=cp)
    # the cp group inside NVLink, and (hosts of 2 GPUs) across the network
    for cl in (cluster, Cluster("h100x64-2", cluster.gpu, 64, 2)):
        link = comm.group_link(cl, cp, 2)
        x = cp_exchange(m, 1, seq, 2, cp, "p2p", cl, lt.attn_fwd)
        kv = 2 * 2 * seq / cp * m.kv_dim / 2            # bf16 K and V of this rank's shard
        fwd = simulated_ring(cp, lt.attn_fwd / cp, kv / (link.p2p_gbps * 1e9) + link.latency_s)
        bwd = simulated_ring(cp, 2.5 * lt.attn_fwd / cp,
                             2 * kv / (link.p2p_gbps * 1e9) + link.latency_s)
        assert (x.fwd, x.bwd) == pytest.approx((fwd, bwd))
        if link.intra:   # inside NVLink the all-gather moves as much and hides nothing
            ag = cp_exchange(m, 1, seq, 2, cp, "all_gather", cl, lt.attn_fwd)
            assert ag.fwd >= x.fwd and ag.bwd >= x.bwd


def test_optimizer_is_sharded_over_dp_times_cp():
    """Megatron's distributed optimizer shards over the data-parallel group with cp: the Adam
    state per GPU of dp 2 x cp 4 is that of dp 8, 12 B per parameter / 8."""
    m, cluster = get_model("llama8b"), get_cluster("h100x8")
    base = dict(tp=1, pp=1, zero=1, sp=False, mbs=1, seq_len=8192,
                global_batch=8)
    with_cp = stage_coefficients(m, cluster, Candidate(dp=2, cp=4, **base))[0]
    no_cp = stage_coefficients(m, cluster, Candidate(dp=8, **base))[0]
    layer_params = (m.attn_matmul_params() + m.mlp_matmul_params() + m.bias_params()
                    + 2 * m.norm_params())
    assert with_cp.mem_layer["optimizer"] == pytest.approx(ADAM_K * layer_params / 8)
    assert with_cp.mem_layer["optimizer"] == pytest.approx(no_cp.mem_layer["optimizer"])
    # weights are replicated over cp: the bf16 weights are whole
    assert with_cp.mem_layer["params"] == pytest.approx(2 * layer_params)
    # activations of a cp rank are those of its s/cp tokens
    short = stage_coefficients(m, cluster, Candidate(dp=8, **{**base, "seq_len": 2048}))[0]
    assert with_cp.mem_layer["activations"] == pytest.approx(short.mem_layer["activations"])


# ---- validity -----------------------------------------------------------------------------

def test_validity_rules():
    m = get_model("llama70b")         # 8 KV heads
    assert V.cp_ok(8192, 4) and not V.cp_ok(8192 + 4, 4) and V.cp_ok(5, 1)
    assert V.cp_a2a_ok(m, 4, 2) and not V.cp_a2a_ok(m, 4, 4) and V.cp_a2a_ok(m, 1, 8)
    assert V.cp_problems(m, 8190, 1, 2, "p2p", True)           # 8190 % 4
    assert V.cp_problems(m, 8192, 8, 2, "a2a", True)           # 1 KV head per tp rank
    assert V.cp_problems(m, 8192, 1, 2, "p2p", False)          # eager attention
    assert V.cp_problems(m, 8192, 4, 2, "a2a", True) == []


def test_runtime_refuses_a_cp_plan_in_one_line_before_any_work():
    m, cluster = LLAMA31_8B, get_cluster("h100x16")
    rep = search(m, cluster, Fixed(cp=2, tp=1), seq_len=32768, global_batch=8)
    import dataclasses
    # a cp plan priced as the runtime's would be (the runtime's search never chooses cp)
    plan = dataclasses.replace(to_plan(m, cluster, rep.best, rep), engine="runtime")
    assert plan.parallelism.cp == 2
    with pytest.raises(Refused) as e:
        preflight(plan, 16, 8, on_gpu=True, visible_gpus=8)
    assert "no context parallelism" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("engine", ["runtime", "fsdp", "deepspeed"])
def test_engines_without_cp_never_choose_it_and_refuse_a_fixed_cp(engine):
    m, cluster = LLAMA31_8B, get_cluster("h100x16")
    rep = search(m, cluster, seq_len=32768, global_batch=16, engine=engine)
    assert all(r.candidate.cp == 1 for r in rep.ranked)
    with pytest.raises(BadInput) as e:
        search(m, cluster, Fixed(cp=2), seq_len=32768, global_batch=16, engine=engine)
    assert "context parallelism" in str(e.value)


# ---- search -------------------------------------------------------------------------------

def test_long_context_chooses_cp_and_its_best_exchange():
    """llama 3.1 8B at 128K on 64 H100s: a whole sequence's activations per GPU do not fit
    without cp; the pruned search's best is the best over each exchange fixed in turn."""
    m, cluster = LLAMA31_8B, get_cluster("h100x64")
    kw = dict(seq_len=131072, global_batch=32, top=1)
    best = search(m, cluster, **kw).best
    assert best is not None and best.candidate.cp > 1
    assert V.cp_ok(131072, best.candidate.cp)
    fixed = [search(m, cluster, Fixed(cp_comm_type=k), **kw).best for k in ("p2p", "all_gather")]
    assert best.estimate.step_time_s == pytest.approx(min(r.estimate.step_time_s
                                                          for r in fixed if r))


def test_llama405b_at_128k_on_16k_gpus_chooses_cp_in_seconds():
    t0 = time.process_time()
    rep = search(get_model("llama405b"), get_cluster("h100x16384"), seq_len=131072,
                 global_batch=128)
    assert time.process_time() - t0 < 10
    c = rep.best.candidate
    assert c.cp > 1 and c.tp * c.cp * c.pp * c.dp == 16384 and rep.best.estimate.fits
