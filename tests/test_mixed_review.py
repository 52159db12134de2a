"""Review of mixed clusters (issue 24): what a pipeline over GPU groups must refuse or get
right beyond tests/test_mixed.py. Each test was written failing against 5fa8409."""
import json

import pytest

from planner.catalog import get_cluster, get_model
from planner.cli import main
from planner.search.groups import search_mixed
from tests.cli_helpers import refused


@pytest.mark.parametrize("groups,needle", [
    # a PyTorch build is CUDA or ROCm (torch.version.cuda / torch.version.hip), its "nccl"
    # backend NCCL or RCCL: MI300X and H100 ranks cannot join one job
    ([{"gpu": "mi300x", "num_gpus": 8}, {"gpu": "h100", "num_gpus": 8}], "ROCm"),
    # CPU ranks cannot join a GPU job's NCCL groups (ProcessGroupNCCL takes CUDA tensors)
    ([{"gpu": "cpu", "num_gpus": 8}, {"gpu": "h100", "num_gpus": 8}], "CPU"),
])
def test_groups_of_different_platforms_are_refused_in_one_line(capsys, tmp_path, groups,
                                                                 needle):
    """Measured at 5fa8409: 16 MI300X + 16 H100 planned llama70b as one Megatron pipeline
    (tp 4 cp 2 pp 4, 55.40 s), which no single PyTorch build can launch."""
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"groups": groups}))
    err = refused(capsys, "--model", "llama8b", "--cluster", str(path))
    assert needle in err and "one job" in err


def test_a_plan_file_mixing_platforms_is_refused(tmp_path, capsys):
    """The same rule holds a loaded plan (Plan.validate), not only the search."""
    from planner.search import to_plan
    model = get_model("llama8b")
    r = search_mixed(model, get_cluster("examples/mixed.json"))
    plan = to_plan(model, r.mixed_best.cluster, r.mixed_best, r)
    d = plan.to_dict()
    h100 = next(g for g in d["cluster"]["groups"] if g["gpu"] == "h100")
    del h100["gpu_spec"]
    h100["gpu"], h100["gpu_memory_gib"] = "mi300x", 191.7
    (tmp_path / "p.json").write_text(json.dumps(d))
    err = refused(capsys, "show", str(tmp_path / "p.json"))
    assert "ROCm" in err


def test_the_slowest_gpu_is_the_slower_one_when_peaks_tie(tmp_path):
    """H200 and H100 share the bf16 peak (989 TFLOP/s) but the H200 has 4.8 TB/s of HBM to
    the H100's 3.35 and 141 GB to its 80: "all as the slowest" is all H100, whichever group
    the file names first (5fa8409 said 'all as the slowest (h200x32)')."""
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"groups": [{"gpu": "h200", "num_gpus": 16},
                                           {"gpu": "h100", "num_gpus": 16}]}))
    mixed = get_cluster(str(path))
    assert mixed.gpu.name == "h100"
    from planner.search.groups import slowest_cluster
    assert slowest_cluster(mixed).gpu.name == "h100"


UNEVEN_HOSTS = {"name": "uneven-hosts", "groups": [
    {"name": "fast", "gpu": {"base": "cpu", "peak_tflops": 0.15}, "num_gpus": 2,
     "gpus_per_node": 2},
    {"name": "slow", "gpu": "cpu", "num_gpus": 1, "gpus_per_node": 1}]}


def _uneven_hosts_plan(tmp_path):
    from planner.search import Fixed, to_plan
    (tmp_path / "c.json").write_text(json.dumps(UNEVEN_HOSTS))
    model = get_model("examples/tiny-llama.json")
    r = search_mixed(model, get_cluster(str(tmp_path / "c.json")),
                     Fixed(tp=1, dp=1, recompute="none"), seq_len=64, global_batch=16,
                     engine="runtime")
    best = r.mixed_best
    assert best.candidate.pp == 3
    plan = to_plan(model, best.cluster, best, r, engine="runtime")
    plan.save(tmp_path / "p.json")
    return plan


def test_launch_gives_groups_of_different_host_sizes_their_own_process_counts(tmp_path,
                                                                             capsys):
    """torchrun gives each agent the global ranks after those of the agents before it, by
    each one's own --nproc-per-node (torch/distributed/elastic/agent/server/api.py
    SimpleElasticAgent._assign_worker_ranks: "the global rank ... is computed by cumulative
    sum of the local_world_size for all workers in front of it"), so hosts of 2 and of 1
    GPUs launch one job. 5fa8409 refused it ("torchrun starts the same number of processes
    on every node") and counted nodes by the smallest host (--nnodes 3 for these 2 hosts)."""
    plan = _uneven_hosts_plan(tmp_path)
    assert main(["launch", str(tmp_path / "p.json"), "--nnodes", "2"]) == 0
    out = capsys.readouterr().out
    k = 0
    for name in dict.fromkeys(plan.rank_groups()):
        n = {g["name"]: g["gpus_per_node"] for g in UNEVEN_HOSTS["groups"]}[name]
        assert f"NODE_RANK {k}..{k}: hosts of group {name}, NPROC_PER_NODE {n}" in out, out
        k += 1
    assert '--nproc-per-node "$NPROC_PER_NODE"' in out


@pytest.mark.slow
def test_groups_of_different_host_sizes_train_like_one_process(tmp_path, capsys):
    """The launch above run: two torchrun agents on this host (static rendezvous, node ranks
    and process counts as `plan launch` prints them) train the mixed plan as one process
    does (loss and gradient norm to 1e-4, as tests/test_mixed.py)."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path
    from tests.test_mixed import assert_trains_like_one_process
    pytest.importorskip("torch")
    plan = _uneven_hosts_plan(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    sizes = {g["name"]: g["gpus_per_node"] for g in UNEVEN_HOSTS["groups"]}
    procs = []
    for rank, name in enumerate(dict.fromkeys(plan.rank_groups())):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
               "--nproc-per-node", str(sizes[name]), "--node-rank", str(rank),
               "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", "runtime",
               "--plan", str(tmp_path / "p.json"), "--steps", "2",
               "--metrics", str(tmp_path / "m.jsonl")]
        procs.append(subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    assert_trains_like_one_process(plan.model, tmp_path, tmp_path / "m.jsonl")


@pytest.fixture(scope="module")
def h200_h100_plan(tmp_path_factory):
    """llama70b on 8 H200 + 8 H100 (global batch 128): the H200 rank holds more than an H100
    can."""
    from planner.search import to_plan
    path = tmp_path_factory.mktemp("h200") / "c.json"
    path.write_text(json.dumps({"groups": [{"gpu": "h200", "num_gpus": 8},
                                           {"gpu": "h100", "num_gpus": 8}]}))
    model = get_model("llama70b")
    r = search_mixed(model, get_cluster(str(path)), global_batch=128)
    return to_plan(model, r.mixed_best.cluster, r.mixed_best, r)


def test_the_plot_holds_each_rank_to_its_own_gpu(h200_h100_plan):
    """8 H200 + 8 H100, llama70b: the H200 rank holds 117 GiB of its 134 usable and the plan
    fits; 5fa8409's plot drew one capacity line (the H100's 75.2 GiB) and wrote "OOM" over
    the H200 rank."""
    pytest.importorskip("matplotlib")
    from planner.plot import plan_figure
    plan = h200_h100_plan
    assert plan.estimate["fits"]
    caps = plan.estimate["stage_capacity_gib"]
    # a rank holds more than the least capacity, within its own
    assert any(s.memory_gib["needed"] > min(caps) for s in plan.stages)
    fig = plan_figure(plan)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "OOM" not in texts
    labels = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    assert any("h200" in x for x in labels) and any("h100" in x for x in labels), labels


def test_a_megatron_plan_recomputes_one_count_per_chunk(capsys):
    """Megatron's --recompute-num-layers is one count for every model chunk. 5fa8409's mixed
    search kept its first placement's per-rank counts: llama70b on examples/mixed.json at
    tp 8 pp 2 recomputed [54, 0] of [56, 24] layers, which the Megatron export then refused
    ("megatron recomputes the same number of leading layers in every model chunk")."""
    from planner.rules import runner_problems
    from planner.search import Fixed, to_plan
    model = get_model("llama70b")
    r = search_mixed(model, get_cluster("examples/mixed.json"), Fixed(tp=8, pp=2),
                     global_batch=256)
    for res in r.ranked:
        plan = to_plan(model, res.cluster, res, r)
        assert runner_problems(plan, "megatron") == [], (res.layers, res.recompute)
    assert main(["--model", "llama70b", "--cluster", "examples/mixed.json", "--global-batch",
                 "256", "--tp", "8", "--pp", "2", "--export", "megatron"]) == 0


def test_knobs_no_pipeline_over_the_groups_can_take_are_one_line_exit_2(capsys):
    """Megatron runs ZeRO-3 (torch FSDP2) without pipelines (zero_stages_with_pp 0, 1), and a
    mixed cluster is planned as one pipeline over its groups: no candidate can be laid out.
    5fa8409 said 'nothing fits' (exit 3), which reads as memory; it is what the mixed search
    does not plan (exit 2), and the line says why."""
    argv = ["--model", "llama70b", "--cluster", "examples/mixed.json", "--global-batch", "256",
            "--zero", "3"]
    err = refused(capsys, *argv, "--offload-optimizer", "none")
    assert "pipeline" in err and "--zero 3" in err
    # with the optimizer in host memory the H100 group alone runs ZeRO-3: planned on it, and
    # the line says the groups' pipeline was not possible, not that it did not fit
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "no pipeline over the groups can take the fixed knobs; planned on h100 alone" in out


def test_the_runtime_preflight_takes_each_groups_host_size():
    """16 H100 (8 a host) + 16 A100 (4 a host): `plan launch` starts 8 processes on an H100
    host. 5fa8409's pre-flight (planner.rules.launch_problems) held every host to the
    smallest group's 4 ("plan's cluster has 4 GPUs per node, launched 8 processes per
    node"), so the H100 hosts' runtimes refused the plan they were launched for."""
    from planner.rules import launch_problems
    from planner.search import to_plan
    model = get_model("llama8b")
    cl = get_cluster("examples/mixed.json")
    import dataclasses
    cl = dataclasses.replace(cl, groups=(cl.groups[0], dataclasses.replace(
        cl.groups[1], gpus_per_node=4, nvlink_domain=4)))
    r = search_mixed(model, cl, engine="runtime")
    plan = to_plan(model, r.mixed_best.cluster, r.mixed_best, r, engine="runtime")
    world = plan.parallelism.world_size
    assert launch_problems(plan, world, 8, on_gpu=True, visible_gpus=8) == []
    assert launch_problems(plan, world, 4, on_gpu=True, visible_gpus=4) == []
    assert launch_problems(plan, world, 16, on_gpu=True, visible_gpus=16) != []


def test_the_runtime_measures_mfu_as_the_plan_predicts_it(llama70b_mixed_plan):
    """The estimate's MFU on a mixed cluster is over the GPUs' summed peaks (mean 650.5
    TFLOP/s for 16 H100 + 16 A100); 5fa8409's runtime divided by the slowest GPU's peak
    (A100, 312) times the world, so a step that ran exactly as predicted reported 2.08x the
    predicted MFU."""
    pytest.importorskip("torch")
    from runtime.train import Speed
    plan = llama70b_mixed_plan
    e = plan.estimate
    _, mfu = Speed(plan, plan.parallelism.world_size).of(e["step_time_s"])
    assert mfu == pytest.approx(e["mfu"], rel=1e-9)


@pytest.fixture(scope="module")
def llama70b_mixed_plan():
    from planner.search import to_plan
    model = get_model("llama70b")
    r = search_mixed(model, get_cluster("examples/mixed.json"), global_batch=256)
    return to_plan(model, r.mixed_best.cluster, r.mixed_best, r)


def test_a_saved_mixed_plan_reprices_as_planned_on_every_rank(h200_h100_plan, tmp_path):
    """8 H200 + 8 H100, llama70b, each GPU's default margin (3% of its memory: 4.21 GiB on the
    H200, 2.39 on the H100). The estimate records one margin, rank 0's; 5fa8409's
    price_plan applied the H200's 4.21 GiB to the H100 rank too, so the saved plan (H100
    rank 74.62 of 75.21 GiB) re-priced as not fitting (capacity 73.39)."""
    from planner.cost.price import price_plan
    from planner.plan import Plan
    plan = h200_h100_plan
    plan.save(tmp_path / "p.json")
    back = Plan.load(tmp_path / "p.json", whole_cluster=True)
    e = price_plan(back).estimate
    assert e.fits
    assert e.stage_capacity_gib == pytest.approx(plan.estimate["stage_capacity_gib"], rel=1e-9)

