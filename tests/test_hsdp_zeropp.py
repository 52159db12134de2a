"""Hybrid sharding (--dp-shard) and ZeRO++ (planner.cost.dataparallel): priced against the
collectives' own formulas, searched, exported in each engine's words, refused in one line
where the engine has none."""
import json
from dataclasses import replace

import pytest

from cli_helpers import one_line, run
from planner.catalog import get_cluster, get_model
from planner.cost import comm
from planner.cost.price import candidate_of, price
from planner.cost.stage import stage_coefficients
from planner.engines import get_engine
from planner.export.deepspeed import deepspeed_config
from planner.export.megatron import megatron_args
from planner.export.torchtitan import torchtitan_toml
from planner.search import Fixed, search, to_plan

ROOT_SLOW = "examples/a100x64-100gbps.json"     # 64 A100, one 100 Gb/s NIC per node
L13 = get_model("llama2-13b")


def _plan(model, cluster, engine, **fixed):
    rep = search(model, cluster, Fixed(**fixed), engine=engine)
    return to_plan(model, cluster, rep.best, rep)


# ---- hybrid sharding ------------------------------------------------------------------------

def test_dp_shard_8_on_64_gpus_exports_torchtitan_8x8():
    c = get_cluster("h100x64")
    plan = _plan(get_model("llama3-8b"), c, "torchtitan", dp_shard=8, tp=1)
    assert plan.parallelism.dp == 64 and plan.parallelism.dp_shard == 8
    cfg = torchtitan_toml(plan)
    assert "data_parallel_shard_degree = 8" in cfg
    assert "data_parallel_replicate_degree = 8" in cfg


def test_hsdp_states_over_the_shard_group_and_its_collectives():
    """ZeRO-3 over 8 of 64 ranks holds 8x the states of ZeRO-3 over 64, and its gradient
    collective is a reduce-scatter over the node's 8 ranks plus the 1/8 shard's all-reduce
    over the 8 replicas across nodes (the formulas of planner.cost.comm)."""
    c, eng = get_cluster("h100x64"), get_engine("torchtitan")
    m = get_model("llama3-8b")
    plan = _plan(m, c, "torchtitan", dp_shard=8, tp=1, zero=3)
    hsdp = candidate_of(plan)
    full = replace(hsdp, dp_shard=0)
    kh = stage_coefficients(m, c, hsdp, eng)[0]
    kf = stage_coefficients(m, c, full, eng)[0]
    assert kh.mem_layer["optimizer"] == pytest.approx(8 * kf.mem_layer["optimizer"])
    g = eng.grad_bytes * m.layer_params()
    w = 2 * m.layer_params()
    node = comm.group_link(c, 8, 1)
    across = comm.group_link(c, 8, 8)
    assert not across.intra and node.intra
    want = (comm.all_gather(w, 8, node) + comm.reduce_scatter(g, 8, node)
            + comm.all_reduce(g / 8, 8, across))
    assert kh.zb_layer == pytest.approx(want)


def test_hsdp_exports_megatron_and_deepspeed():
    c = get_cluster("h100x64")
    m = get_model("llama3-8b")
    meg = _plan(m, c, "megatron", dp_shard=4, tp=2, zero=1, cp=1)
    assert "--num-distributed-optimizer-instances 8" in megatron_args(meg)
    ds = _plan(m, c, "deepspeed", dp_shard=8, tp=1, zero=3)
    assert json.loads(deepspeed_config(ds))["zero_optimization"]["mics_shard_size"] == 8


@pytest.mark.parametrize("args,needle", [
    (("--dp-shard", "3", "--dp", "64", "--engine", "torchtitan"), "does not divide"),
    (("--dp-shard", "3", "--engine", "torchtitan"), "--dp-shard 3"),
    (("--dp-shard", "8", "--engine", "fsdp"), "is not planned for fsdp"),
    (("--dp-shard", "8", "--engine", "megatron", "--zero", "3"), "ZeRO 1 only"),
    (("--zeropp", "--engine", "megatron"), "megatron has no ZeRO++"),
    (("--zeropp", "--engine", "deepspeed", "--zero", "2"), "ZeRO-3 only"),
])
def test_bad_hsdp_and_zeropp_are_one_line_exit_2(capsys, args, needle):
    code, _, err = run(capsys, "--model", "llama3-8b", "--cluster", "h100x64", *args,
                       limit_s=60)
    one_line(code, err, needle=needle)


# ---- ZeRO++ -----------------------------------------------------------------------------------

def test_zeropp_chosen_on_a_slow_network_and_exported(capsys):
    """llama2-13b, ZeRO-3, 2048-token sequences, 128 a batch on 64 A100 with one 100 Gb/s NIC
    per node: the exposed gathers dominate without ZeRO++ (issue 23: 6.3 of 8.4 s); with it,
    the quantized and in-node collectives win."""
    c = get_cluster(ROOT_SLOW)
    assert c.gpu.internode_gbps_per_gpu * 8 == pytest.approx(100 / 8)   # 100 Gb/s a node
    without = search(L13, c, Fixed(zero=3, zeropp=False), 2048, 128, engine="deepspeed")
    est = without.best.estimate
    assert est.time_breakdown_s["dp_comm_exposed"] > 0.5 * est.step_time_s
    rep = search(L13, c, Fixed(zero=3), 2048, 128, engine="deepspeed")
    plan = to_plan(L13, c, rep.best, rep)
    assert plan.parallelism.zeropp
    assert plan.estimate["step_time_s"] < 0.5 * est.step_time_s
    z = json.loads(deepspeed_config(plan))["zero_optimization"]
    assert z["zero_quantized_weights"] and z["zero_quantized_gradients"]
    assert z["zero_hpz_partition_size"] == 8 // plan.parallelism.tp


def test_zeropp_bytes_are_half_and_a_quarter():
    """qwZ gathers int8 (half of bf16's bytes), hpZ gathers the backward inside the node, qgZ
    reduces int4 (an eighth of the fp32 gradient bytes DeepSpeed reduces, a quarter of fp16's),
    and hpZ's secondary partition costs bf16 weights / 8 of the node's ranks."""
    c, eng = get_cluster(ROOT_SLOW), get_engine("deepspeed")
    base = candidate_of(_plan(L13, c, "deepspeed", zero=3, zeropp=True, tp=1))
    off = replace(base, zeropp=False)
    kq, k0 = (stage_coefficients(L13, c, x, eng)[0] for x in (base, off))
    P, dp = L13.layer_params(), base.dp
    link = comm.group_link(c, dp, 1)
    assert kq.zf_layer == pytest.approx(comm.all_gather(1.0 * P, dp, link))
    assert k0.zf_layer == pytest.approx(comm.all_gather(2.0 * P, dp, link))
    node = comm.group_link(c, 8, 1)
    assert kq.zb_layer == pytest.approx(comm.all_gather(2.0 * P, 8, node)
                                        + comm.reduce_scatter(0.5 * P, dp, link))
    assert kq.mem_layer["params"] - k0.mem_layer["params"] == pytest.approx(2.0 * P / 8)
    assert kq.compute_layer > k0.compute_layer       # the (de)quantization kernels


def test_zeropp_not_chosen_inside_one_node():
    """On one NVLink node the quantization kernels cost more than the bytes they save: the
    best plan keeps ZeRO-3 plain, and the same layout with ZeRO++ is slower."""
    c = get_cluster("a100x8")
    rep = search(L13, c, Fixed(zero=3), 2048, 128, engine="deepspeed")
    best = rep.best
    assert not best.candidate.zeropp
    twin = price(L13, c, replace(best.candidate, zeropp=True), best.layers, best.recompute,
                 engine="deepspeed")
    assert twin.estimate.step_time_s > best.estimate.step_time_s


def test_zeropp_kernels_move_the_bytes_of_their_element_sizes():
    """qwZ's kernels read and write bf16 and int8 (2 + 1 bytes per shard element, 1 + 2 per
    gathered one); qgZ's read and write the gradient and int4: 4 + 0.5 twice in fp32, 2 + 0.5
    twice in bf16 (a hand count of each kernel's reads and writes)."""
    from planner.cost.dataparallel import QGZ_BYTES, QWZ_BYTES, ZeroPP
    params, shard, hbm = 1e9, 8, 1000.0
    fp32 = ZeroPP(8, None, QWZ_BYTES / 2.0, QGZ_BYTES / 4.0)
    bf16 = ZeroPP(8, None, QWZ_BYTES / 2.0, QGZ_BYTES / 2.0)
    fwd, bwd = fp32.kernel_times(params, shard, hbm)
    assert fwd == pytest.approx(3.0 * params * (1 + 1 / 8) / 1e12)
    assert bwd == pytest.approx(9.0 * params / 1e12)
    assert bf16.kernel_times(params, shard, hbm)[1] == pytest.approx(5.0 * params / 1e12)
