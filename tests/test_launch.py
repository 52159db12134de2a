"""Launch commands: parse the torchrun lines and SLURM scripts back and check them."""
from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess

import pytest

from planner.catalog import get_cluster, get_model
from planner.errors import BadInput
from planner.launch import launch_commands
from planner.plan import Batch, Parallelism, Plan, make_stages


def mkplan(cluster="h100x32", tp=8, pp=4, dp=1):
    m = get_model("llama70b")
    plan = Plan(model=m, cluster=get_cluster(cluster),
                parallelism=Parallelism(tp=tp, pp=pp, dp=dp, zero_stage=1,
                                        sequence_parallel=True),
                batch=Batch(seq_len=4096, global_batch_size=16 * dp, micro_batch_size=1,
                            num_microbatches=16),
                stages=make_stages(m.num_layers, pp), engine="runtime")
    plan.validate()
    return plan


def test_plan_priced_for_another_engine_is_not_launched(tmp_path):
    import dataclasses
    plan = dataclasses.replace(mkplan(), engine="megatron")
    with pytest.raises(BadInput, match="priced for megatron.*--engine runtime"):
        launch_commands(plan, tmp_path / "p.json", 4)


def torchrun_parser():
    """torchrun's own spellings for the options we use (torch.distributed.run)."""
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--nnodes", type=str)
    ap.add_argument("--nproc-per-node", "--nproc_per_node", type=int)
    ap.add_argument("--rdzv-backend", "--rdzv_backend", type=str)
    ap.add_argument("--rdzv-endpoint", "--rdzv_endpoint", type=str)
    ap.add_argument("--rdzv-id", "--rdzv_id", type=str)
    ap.add_argument("-m", "--module", action="store_true")
    ap.add_argument("training_script")
    ap.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return ap


def runtime_parser():
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--plan", required=True)
    ap.add_argument("rest", nargs="*")
    return ap


def command_lines(text):
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def parse_torchrun(line):
    words = shlex.split(line)
    if words[0] == "srun":
        words = words[1:]
    assert words[0] == "torchrun"
    a = torchrun_parser().parse_args(words[1:])
    return a, runtime_parser().parse_args(a.training_script_args)


@pytest.mark.parametrize("nnodes,tp,pp,dp,cluster", [
    (4, 8, 4, 1, "h100x32"), (8, 8, 2, 4, "h100x64"), (1, 2, 2, 2, "h100x8"),
])
def test_torchrun_lines(nnodes, tp, pp, dp, cluster):
    plan = mkplan(cluster, tp, pp, dp)
    text = launch_commands(plan, "runs/plan 70b.json", nnodes)
    lines = command_lines(text)
    assert len(lines) == 1
    a, r = parse_torchrun(lines[0])
    assert int(a.nnodes) == nnodes and a.nproc_per_node == plan.cluster.gpus_per_node
    assert int(a.nnodes) * a.nproc_per_node == tp * pp * dp
    assert a.rdzv_backend == "c10d"
    host, port = a.rdzv_endpoint.rsplit(":", 1)
    assert port == "29500"
    assert host == ("localhost" if nnodes == 1 else "$MASTER_ADDR")
    assert a.module and a.training_script == "runtime"
    assert r.plan == "runs/plan 70b.json" and r.rest == []
    if nnodes > 1:
        assert f"each of the {nnodes} nodes" in text


def test_gpus_per_node_override_and_extra_args():
    plan = mkplan("h100x32", 8, 4, 1)
    text = launch_commands(plan, "p.json", 8, gpus_per_node=4, port=12345,
                           extra_args=["--steps", "10"])
    words = shlex.split(command_lines(text)[0])
    a = torchrun_parser().parse_args(words[1:])
    assert (int(a.nnodes), a.nproc_per_node) == (8, 4)
    assert a.rdzv_endpoint == "$MASTER_ADDR:12345"
    assert a.training_script_args == ["--plan", "p.json", "--steps", "10"]


@pytest.mark.parametrize("nnodes,gpn,hint", [
    (3, 8, "use --nnodes 4"), (8, 8, "use --nnodes 4"), (1, 8, "use --nnodes 4"),
    (4, 6, "no whole number of 6-GPU nodes"),
])
def test_mismatch_is_one_clear_line(nnodes, gpn, hint):
    plan = mkplan("h100x32", 8, 4, 1)
    with pytest.raises(BadInput) as e:
        launch_commands(plan, "p.json", nnodes, gpus_per_node=gpn)
    msg = str(e.value)
    assert "\n" not in msg
    assert "tp*pp*dp = 8*4*1 = 32" in msg and hint in msg
    assert f"{nnodes * gpn} processes" in msg


@pytest.mark.parametrize("bad", [0, -1, 2.0, "4", True])
def test_bad_node_count(bad):
    with pytest.raises(BadInput):
        launch_commands(mkplan(), "p.json", bad)


def test_bad_port():
    with pytest.raises(BadInput):
        launch_commands(mkplan(), "p.json", 4, port=70000)


def test_slurm_script(tmp_path):
    plan = mkplan("h100x64", 8, 2, 4)
    text = launch_commands(plan, "plans/my plan.json", 8, slurm=True)
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    sbatch = dict(line[len("#SBATCH "):].split("=", 1) for line in lines
                  if line.startswith("#SBATCH "))
    assert sbatch["--nodes"] == "8"
    assert sbatch["--ntasks-per-node"] == "1"
    assert sbatch["--gpus-per-node"] == "8"
    assert sbatch["--job-name"] == "plan-llama3-70b"
    odd = launch_commands(plan, "p.json", 8, slurm=True, job_name="my job; rm -rf")
    assert "#SBATCH --job-name=my-job-rm--rf\n" in odd
    # every #SBATCH directive comes before the first command, as sbatch requires
    first_cmd = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    assert all(i < first_cmd for i, line in enumerate(lines) if line.startswith("#SBATCH"))
    srun = [line for line in lines if line.startswith("srun ")]
    assert len(srun) == 1
    a, r = parse_torchrun(srun[0])
    assert int(a.nnodes) * a.nproc_per_node == 64
    assert a.rdzv_endpoint == "$MASTER_ADDR:29500" and a.rdzv_id == "$SLURM_JOB_ID"
    assert r.plan == "plans/my plan.json"
    assert any("MASTER_ADDR=$(scontrol show hostnames" in line for line in lines)
    if shutil.which("bash"):
        f = tmp_path / "job.sbatch"
        f.write_text(text)
        subprocess.run(["bash", "-n", str(f)], check=True)


def test_slurm_mismatch_refused():
    with pytest.raises(BadInput):
        launch_commands(mkplan("h100x64", 8, 2, 4), "p.json", 4, slurm=True)


def test_shell_quoting_survives_odd_paths():
    path = "it's a \"plan\" $HOME.json"
    text = launch_commands(mkplan("h100x8", 2, 2, 2), path, 1)
    _, r = parse_torchrun(command_lines(text)[0])
    assert r.plan == path
