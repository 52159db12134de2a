"""Review of mixed clusters (issue 24): what a pipeline over GPU groups must refuse or get
right beyond tests/test_mixed.py. Each test was written failing against 5fa8409."""
import json

import pytest

from planner.catalog import get_cluster, get_model
from planner.cli import main
from planner.search.groups import search_mixed


def _one_line_exit_2(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("plan: error:"), err
    return err


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
    err = _one_line_exit_2(capsys, ["--model", "llama8b", "--cluster", str(path)])
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
    err = _one_line_exit_2(capsys, ["show", str(tmp_path / "p.json")])
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
