"""Issue 12 item 3, hardware: the Blackwell (Ultra), NVL72 and MI300X catalog GPUs, the NVLink
domain as distinct from the host, and the clusters the issue's "done" line names."""
from __future__ import annotations

import inspect
import json
import math
import re

import pytest

from planner.catalog import SYSTEMS, get_cluster, get_gpu, get_model, gpus
from planner.catalog.gpus import GPUS
from planner.cost import comm
from planner.engines import get_engine
from planner.errors import BadInput
from planner.plan import Plan
from planner.search import Fixed, enumerate_candidates
from planner.specs import Cluster
from planner.suggest import _more_gpus
from tests.cli_helpers import one_line, write
from tests.cli_helpers import run as _run


def run(capsys, *args):
    return _run(capsys, *args, limit_s=60.0)

NEW = ("b300", "gb200", "gb300", "mi300x", "h200")
DONE_CLUSTERS = ("gb200x72", "gb300x144", "b300x16", "mi300x16", "h200x32")


# ---- the catalog's figures -------------------------------------------------------------------

@pytest.mark.parametrize("name", [g for g in GPUS if g != "cpu"])
def test_every_gpu_figure_is_positive_and_sane(name):
    g = get_gpu(name)
    for f in ("peak_tflops", "memory_gib", "hbm_gbps", "nvlink_busbw_gbps", "nvlink_p2p_gbps",
              "internode_gbps_per_gpu"):
        assert getattr(g, f) > 0, f
    assert 30 < g.memory_gib < 300 and 300 < g.peak_tflops < 5000 and 1000 < g.hbm_gbps < 10000
    assert 0.3 <= g.gemm_efficiency <= 0.85 and 0.2 <= g.attn_efficiency <= g.gemm_efficiency
    assert 0 < g.nvlink_latency_us <= g.internode_latency_us < 100
    # the scale-up fabric is faster than one NIC, and a NIC no faster than its line rate
    # (at most 800 Gb/s = 100 GB/s per GPU in today's systems)
    assert g.nvlink_busbw_gbps > g.internode_gbps_per_gpu <= 100


def test_memory_is_what_the_driver_reports_below_the_hbm_fitted():
    # raw HBM in GiB (stacks x stack size) bounds what the driver exposes, within 7%
    raw = {"h100": 80, "h200": 144, "b200": 192, "gb200": 192, "b300": 288, "gb300": 288,
           "mi300x": 192, "a100": 80}
    for name, gib in raw.items():
        assert 0.93 * gib <= get_gpu(name).memory_gib <= gib, name


def test_datasheet_orderings():
    g = {n: get_gpu(n) for n in GPUS}
    peak = {n: x.peak_tflops for n, x in g.items()}
    # bf16 dense: Blackwell Ultra keeps Blackwell's (HGX B300 = HGX B200), the 1200 W NVL72
    # parts are higher, MI300X is above H100, H200 is an H100 in compute
    assert peak["gb300"] == peak["gb200"] > peak["b300"] == peak["b200"] > peak["mi300x"]
    assert peak["mi300x"] > peak["h200"] == peak["h100"] > peak["a100"]
    mem = {n: x.memory_gib for n, x in g.items()}
    assert mem["gb300"] > mem["b300"] > mem["mi300x"] > mem["gb200"] > mem["b200"]
    assert mem["b200"] > mem["h200"] > mem["h100"]
    hbm = {n: x.hbm_gbps for n, x in g.items()}
    assert hbm["b300"] == hbm["gb300"] == hbm["gb200"] == hbm["b200"] > hbm["mi300x"]
    assert hbm["mi300x"] > hbm["h200"] > hbm["h100"] > hbm["a100"]
    # NVLink5 doubles NVLink4; Blackwell Ultra NICs (ConnectX-8) double ConnectX-7
    assert g["b300"].nvlink_busbw_gbps >= 2 * g["h100"].nvlink_busbw_gbps
    assert g["b300"].internode_gbps_per_gpu == g["gb300"].internode_gbps_per_gpu \
        == 2 * g["gb200"].internode_gbps_per_gpu
    # xGMI: one 64 GB/s link between two MI300X, all seven in a collective
    assert g["mi300x"].nvlink_p2p_gbps < 64 < g["mi300x"].nvlink_busbw_gbps <= 7 * 64


def test_every_catalog_gpu_is_cited():
    """Each entry of planner/catalog/gpus.py has a comment above it naming its sources."""
    src = inspect.getsource(gpus).splitlines()
    for name in GPUS:
        i = next(k for k, line in enumerate(src) if line.strip().startswith(f'"{name}": Gpu('))
        above = []
        while src[i - 1].strip().startswith("#"):
            i -= 1
            above.append(src[i])
        assert above, name
    text = "\n".join(src)
    for source in ("HGX B300", "GB200 NVL72", "GB300 NVL72", "MI300X datasheet",
                   "H200 datasheet", "xGMI"):
        assert source in text, source


# ---- clusters: hosts and NVLink domains --------------------------------------------------------

@pytest.mark.parametrize("name, layout", [
    ("gb200x72", (4, 72)), ("gb200x144", (4, 72)), ("gb300x144", (4, 72)),
    ("gb200x16", (4, 16)), ("gb200x4", (4, 4)), ("gb200x2", (2, 2)),
    ("b300x16", (8, 8)), ("mi300x16", (8, 8)), ("h200x32", (8, 8)), ("h100x4", (4, 4)),
])
def test_catalog_cluster_layout(name, layout):
    c = get_cluster(name)
    assert (c.gpus_per_node, c.nvlink_domain) == layout
    assert get_engine("megatron").tp_domain(c) == c.nvlink_domain   # TP over the NVLink domain
    assert c.num_nodes == c.num_gpus // c.gpus_per_node


def test_mi300x_cluster_names_the_mi300x():
    assert get_cluster("mi300x16").gpu.name == get_cluster("mi300xx16").gpu.name == "mi300x"


# issue 22: any whole number of 4-GPU trays plans (gb200x100: five racks of 20); only counts
# that are not whole trays are refused
@pytest.mark.parametrize("name", ["gb200x102", "gb200x6", "gb300x74"])
def test_gb_clusters_are_whole_racks_or_trays(capsys, name):
    code, _, err = run(capsys, "--model", "llama8b", "--cluster", name)
    one_line(code, err, needle="NVL72 racks")


def test_nvlink_domain_defaults_to_the_host():
    c = Cluster("c", get_gpu("h100"), 16, 8)
    assert c.nvlink_domain == 8
    assert Cluster("c", get_gpu("h100"), 12, 8).nvlink_domain == 8   # as before: no new rule


# ---- which link a group uses ---------------------------------------------------------------

def _old_group_link(cluster, size, stride):
    """comm.group_link before NVLink domains (node = domain)."""
    gpu, g = cluster.gpu, cluster.gpus_per_node
    if size <= 1 or size * stride <= g:
        return comm.Link(gpu.nvlink_busbw_gbps, gpu.nvlink_p2p_gbps, gpu.nvlink_latency_us * 1e-6)
    per_node = max(1, min(size, g // stride)) if stride < g else 1
    return comm.Link(min(gpu.nvlink_busbw_gbps, per_node * gpu.internode_gbps_per_gpu),
                     gpu.internode_gbps_per_gpu, gpu.internode_latency_us * 1e-6)


def test_tp8_on_nvl72_uses_nvlink_across_trays():
    c = get_cluster("gb200x72")
    g = c.gpu
    assert c.gpus_per_node == 4
    link = comm.group_link(c, 8, 1)                    # two trays
    assert (link.busbw_gbps, link.p2p_gbps) == (g.nvlink_busbw_gbps, g.nvlink_p2p_gbps)
    assert comm.group_link(c, 9, 8).busbw_gbps == g.nvlink_busbw_gbps     # dp 9 x tp 8: the rack
    assert comm.group_link(c, 72, 1).busbw_gbps == g.nvlink_busbw_gbps
    # the same group on 4-GPU hosts without the rack's NVLink switches goes over the NICs
    nvl4 = Cluster("nvl4", g, 72, 4, nvlink_domain=4)
    assert comm.group_link(nvl4, 8, 1).p2p_gbps == g.internode_gbps_per_gpu


def test_groups_across_nvl72_racks_use_the_nics():
    c = get_cluster("gb200x144")
    g = c.gpu
    link = comm.group_link(c, 18, 8)                   # dp 18 x tp 8 spans both racks
    assert link.p2p_gbps == g.internode_gbps_per_gpu
    assert link.busbw_gbps == min(g.nvlink_busbw_gbps, 9 * g.internode_gbps_per_gpu)
    # 16-rank blocks straddle 72-GPU racks (ranks 64-79): the slowest group crosses
    assert comm.group_link(c, 16, 1).p2p_gbps == g.internode_gbps_per_gpu
    assert comm.group_link(c, 8, 1).p2p_gbps == g.nvlink_p2p_gbps


def test_dp_across_h100_nodes_uses_the_nic():
    c = get_cluster("h100x16")
    g = c.gpu
    link = comm.group_link(c, 2, 8)                    # tp 8, dp 2: one GPU per node
    assert (link.busbw_gbps, link.p2p_gbps) == (g.internode_gbps_per_gpu,
                                                 g.internode_gbps_per_gpu)
    assert comm.group_link(c, 4, 4).busbw_gbps == 2 * g.internode_gbps_per_gpu
    assert comm.group_link(c, 8, 1).busbw_gbps == g.nvlink_busbw_gbps


def test_eight_gpu_nodes_price_every_power_of_two_group_as_before():
    """Where the node is the domain and groups tile it (the published runs' layouts), the
    domain-aware link is the old one: the fidelity table does not move."""
    for n in (8, 16, 64, 1024):
        c = get_cluster(f"h100x{n}")
        for size in (1, 2, 4, 8, 16, 64):
            for stride in (1, 2, 4, 8, 16):
                if size * stride <= n:
                    new, old = comm.group_link(c, size, stride), _old_group_link(c, size, stride)
                    assert ((new.busbw_gbps, new.p2p_gbps, new.latency_s)
                            == (old.busbw_gbps, old.p2p_gbps, old.latency_s))


def test_a_rings_hops_inside_a_node_are_nvlink_hops():
    """NCCL's cost model (NVIDIA/nccl src/graph/tuning.cc ncclTopoTuneModel): a reduce-scatter
    or all-gather ring over n ranks on N nodes takes n - 1 steps, N - 1 of them across the
    network at its latency and the rest inside a node; an all-reduce tree 2((n/N - 1) hops
    inside a node + log2(N) across). MLPerf GPT-3's data-parallel group at tp 4 on 1344 DGX
    H100 nodes: 448 ranks, two per node, on 224 nodes (it was priced 447 network hops)."""
    c = get_cluster("h100x10752")
    g = c.gpu
    link = comm.group_link(c, 448, 4)
    net, nvl = g.internode_latency_us * 1e-6, g.nvlink_latency_us * 1e-6
    bw = 447 / 448 * 1e9 / (link.busbw_gbps * 1e9)
    assert comm.reduce_scatter(1e9, 448, link) == pytest.approx(bw + 223 * net + 224 * nvl)
    assert comm.all_gather(1e9, 448, link) == pytest.approx(bw + 223 * net + 224 * nvl)
    ar = 2 * 447 / 448 * 1e9 / (link.busbw_gbps * 1e9)
    assert comm.all_reduce(1e9, 448, link) == pytest.approx(ar + 2 * (1 * nvl + 8 * net))
    # one member per node: every hop crosses the network, as before
    one = comm.group_link(c, 64, 8)
    assert comm.reduce_scatter(1e9, 64, one) == pytest.approx(
        63 / 64 * 1e9 / (one.busbw_gbps * 1e9) + 63 * net)
    # inside a node: NVLink hops only
    intra = comm.group_link(c, 8, 1)
    assert comm.reduce_scatter(1e9, 8, intra) == pytest.approx(
        7 / 8 * 1e9 / (intra.busbw_gbps * 1e9) + 7 * nvl)


def test_an_all_reduce_one_rank_past_a_domain_adds_network_hops_only():
    """Across two NVL72 racks an all-reduce's tree keeps the NVLink hops it has inside one
    rack (log2 of its members) and adds the network hops between the racks: 144 ranks at 72 a
    rack cost two network hops more than 72 in one rack (a chain of 71 NVLink hops per rack
    priced it 5x the rack's, more than the old all-network count)."""
    c = get_cluster("gb200x144")
    g = c.gpu
    net, nvl = g.internode_latency_us * 1e-6, g.nvlink_latency_us * 1e-6
    rack = comm.group_link(c, 72, 1)
    both = comm.group_link(c, 144, 1)
    assert rack.intra and not both.intra and both.per_domain == 72
    lat = lambda link, n: comm.all_reduce(1.0, n, link) - 2 * (n - 1) / n / (  # noqa: E731
        link.busbw_gbps * 1e9)
    assert lat(rack, 72) == pytest.approx(2 * 7 * nvl)
    assert lat(both, 144) == pytest.approx(2 * 7 * nvl + 2 * net)


# ---- the clusters the issue names plan ---------------------------------------------------------

@pytest.mark.parametrize("cluster", DONE_CLUSTERS)
def test_done_clusters_plan(capsys, cluster):
    code, out, err = run(capsys, "--model", "llama70b", "--cluster", cluster)
    assert code == 0, err
    assert f"on {cluster}" in out and "tokens/s" in out


def test_nvl72_plan_records_the_domain(capsys, tmp_path):
    out_path = tmp_path / "p.json"
    code, _, err = run(capsys, "--model", "llama70b", "--cluster", "gb200x72",
                       "--out", out_path)
    assert code == 0, err
    d = json.loads(out_path.read_text())
    assert (d["cluster"]["gpus_per_node"], d["cluster"]["nvlink_domain"]) == (4, 72)
    p = Plan.load(str(out_path), whole_cluster=True)
    assert (p.cluster.gpus_per_node, p.cluster.nvlink_domain) == (4, 72)


# ---- cluster files and plans with nvlink_domain ------------------------------------------------

def test_cluster_file_nvlink_domain_round_trips_through_a_plan(capsys, tmp_path):
    cf = write(tmp_path, "rack.json", {"name": "rack", "base": "b200", "num_gpus": 32,
                                       "gpus_per_node": 4, "nvlink_domain": 16})
    c = get_cluster(cf)
    assert (c.gpus_per_node, c.nvlink_domain, c.num_nodes) == (4, 16, 8)
    out_path = tmp_path / "plan.json"
    code, _, err = run(capsys, "--model", "llama8b", "--cluster", cf, "--out", out_path)
    assert code == 0, err
    p = Plan.load(str(out_path), whole_cluster=True)
    assert p.cluster == c and p.cluster.nvlink_domain == 16
    assert Plan.from_dict(json.loads(json.dumps(p.to_dict()))).cluster == c
    code, out, err = run(capsys, "show", out_path)
    assert code == 0, err


def test_old_plans_without_nvlink_domain_load_with_the_host_as_domain(capsys, tmp_path):
    out_path = tmp_path / "plan.json"
    code, _, err = run(capsys, "--model", "llama8b", "--cluster", "h100x16", "--out", out_path)
    assert code == 0, err
    d = json.loads(out_path.read_text())
    del d["cluster"]["nvlink_domain"]
    p = Plan.from_dict(d)
    assert (p.cluster.gpus_per_node, p.cluster.nvlink_domain) == (8, 8)


def test_cluster_file_of_a_gb_gpu_defaults_to_its_rack(tmp_path):
    c = get_cluster(write(tmp_path, "c.json", {"base": "gb300", "num_gpus": 144}))
    assert (c.gpus_per_node, c.nvlink_domain, c.gpu.name) == (4, 72, "gb300")
    c = get_cluster(write(tmp_path, "d.json", {"base": "gb200", "num_gpus": 144,
                                               "nvlink_domain": 36}))
    assert (c.gpus_per_node, c.nvlink_domain) == (4, 36)
    # the workaround before nvlink_domain (a 72-GPU "node") still loads, as one domain
    c = get_cluster(write(tmp_path, "e.json", {"gpu": "gb200", "num_gpus": 144,
                                               "gpus_per_node": 72}))
    assert (c.gpus_per_node, c.nvlink_domain) == (72, 72)


BASE = {"base": "h100", "num_gpus": 16, "gpus_per_node": 4}


@pytest.mark.parametrize("change, needle", [
    ({"nvlink_domain": 6}, "nvlink_domain 6 is not a multiple of gpus_per_node 4"),
    ({"nvlink_domain": 2}, "nvlink_domain 2 is not a multiple of gpus_per_node 4"),
    ({"nvlink_domain": 32}, "nvlink_domain 32 is more than num_gpus 16"),
    ({"nvlink_domain": 0}, "nvlink_domain must be at least 1"),
    ({"nvlink_domain": "8"}, "nvlink_domain must be an integer"),
    ({"nvlink_domain": 8.0}, "nvlink_domain must be an integer"),
    ({"nvlink_domain": True}, "nvlink_domain must be an integer"),
    ({"num_gpus": 24, "nvlink_domain": 16}, "num_gpus 24 is not a multiple of nvlink_domain 16"),
    ({"nvlink_domin": 8}, "did you mean 'nvlink_domain'"),
    ({"base": "gb200", "gpus_per_node": None, "num_gpus": 102}, "NVL72 racks"),
])
def test_bad_nvlink_domain_is_one_line_exit_2(capsys, tmp_path, change, needle):
    doc = {k: v for k, v in {**BASE, **change}.items() if v is not None}
    code, _, err = run(capsys, "--model", "llama8b", "--cluster", write(tmp_path, "c.json", doc))
    one_line(code, err, needle=needle)


@pytest.mark.parametrize("value, needle", [
    (6, "not a multiple of gpus_per_node"), (128, "more than num_gpus"),
    ("72", "must be an integer"), (-1, "at least 1")])
def test_bad_nvlink_domain_in_a_plan_is_one_line_exit_2(capsys, tmp_path, value, needle):
    out_path = tmp_path / "plan.json"
    code, _, err = run(capsys, "--model", "llama70b", "--cluster", "gb200x72", "--out", out_path)
    assert code == 0, err
    d = json.loads(out_path.read_text())
    d["cluster"]["nvlink_domain"] = value
    code, _, err = run(capsys, "show", write(tmp_path, "bad.json", d))
    one_line(code, err, needle=needle)


def test_bad_domain_in_python_is_badinput():
    with pytest.raises(BadInput, match="not a multiple of gpus_per_node"):
        Cluster("c", get_gpu("gb200"), 72, 4, nvlink_domain=70)


# ---- suggestions on bigger clusters keep the system's shape -------------------------------------

def test_more_gpus_keeps_hosts_and_domains():
    c = _more_gpus(get_cluster("gb200x72"), 144)
    assert (c.num_gpus, c.gpus_per_node, c.nvlink_domain) == (144, 4, 72)
    c = _more_gpus(get_cluster("h100x2"), 4)           # more of the same 2-GPU hosts
    assert (c.gpus_per_node, c.nvlink_domain) == (2, 2)
    c = _more_gpus(get_cluster("gb200x8"), 12)         # trays of one rack fill its domain
    assert (c.num_gpus, c.gpus_per_node, c.nvlink_domain) == (12, 4, 12)
    c = _more_gpus(get_cluster("h100x8"), 16)
    assert (c.gpus_per_node, c.nvlink_domain) == (8, 8)


# ---- the search caps tp at the NVLink domain (or the host, where the engine needs it) ---------

def test_tp_may_span_trays_inside_an_nvl72_rack():
    model, cluster = get_model("llama70b"), get_cluster("gb200x72")
    tps = {c.tp for c in enumerate_candidates(model, cluster, Fixed(), 8192, 576)}
    assert 8 in tps and max(tps) <= cluster.nvlink_domain
    # our runtime places TP groups inside a host (4 GPUs on a GB200 tray)
    tps = {c.tp for c in enumerate_candidates(model, cluster, Fixed(), 8192, 576, "runtime")}
    assert max(tps) <= cluster.gpus_per_node


def test_tp_stays_inside_a_host_where_the_host_is_the_domain():
    model, cluster = get_model("llama70b"), get_cluster("h100x64")
    tps = {c.tp for c in enumerate_candidates(model, cluster, Fixed(), 8192, 512)}
    assert max(tps) == 8


def test_systems_table_is_the_nvl72():
    assert SYSTEMS == {"gb200": (4, 72), "gb300": (4, 72)}
    assert not set(SYSTEMS) - set(GPUS)
    assert all(math.gcd(h, r) == h for h, r in SYSTEMS.values())
    assert all(re.fullmatch(r"[a-z0-9]+", n) for n in NEW)
