"""The labels `plan` prints say what is true: precision and attention as the device runs them,
parameter counts in their unit, a custom GPU named so and not validated, one peak memory."""

import csv
import json
import re
from pathlib import Path

import pytest

from cli_helpers import run, write
from planner.catalog import get_cluster, get_model
from planner.engines.trust import VALIDATED_GPUS
from planner.explain import count_label
from planner.search import Fixed, search
from planner.sweep import sweep

ROOT = Path(__file__).resolve().parents[1]


def _newest(pattern: str) -> Path:
    return sorted((ROOT / "benchmarks/results").glob(pattern))[-1]


def test_validated_gpus_are_the_fidelity_tables_gpu_rows():
    """VALIDATED_GPUS are the GPUs of the fidelity table's per-GPU rows and of the held-out
    file's scored rows, no more and no fewer."""
    text = _newest("fidelity_2*.md").read_text()
    rows = re.findall(r"^\| (fsdp|megatron|torchtitan) ([a-z0-9-]+) \| (\d+) \|", text, re.M)
    got = {}
    for eng, scope, runs in rows:
        if scope not in ("held", "fp8/mxfp8") and int(runs) > 0:
            got.setdefault(eng, set()).add(scope)
    moe = _newest("fidelity_moe_2*.md").read_text()
    for eng, gpu, runs in re.findall(r"^\| (megatron) \| all \| ([a-z0-9-]+) \| (\d+) \|", moe,
                                     re.M):
        if gpu != "all" and int(runs) > 0:
            got.setdefault(f"{eng} moe", set()).add(gpu)
    with open(_newest("fidelity_heldout_2*.csv")) as f:
        for row in csv.DictReader(f):
            if row["predicted_s"]:
                scope = row["engine"] + (" moe" if "MoE" in row["family"] else "")
                got.setdefault(scope, set()).add(row["gpu"])
    assert {k: tuple(sorted(v)) for k, v in got.items()} == VALIDATED_GPUS


def test_a_dense_plan_is_not_validated_by_moe_runs_alone():
    """Megatron's published runs on B300 are MoE runs only: a dense Megatron plan on B300 is
    not validated by them, an MoE one is (with the MoE runs' band)."""
    from planner.catalog.gpus import GPUS
    from planner.engines import ENGINES
    from planner.explain import trust_label
    dense = trust_label(ENGINES["megatron"], GPUS["b300"])
    moe = trust_label(ENGINES["megatron"], GPUS["b300"], moe=True)
    ran_on = dense.split("ran on ")[1].rstrip(")").split(", ")
    assert dense.startswith("not validated on b300") and "b300" not in ran_on and "b200" in ran_on
    assert "held out" in moe and "MoE" in moe


@pytest.mark.parametrize("n,want", [(857_216, "857.2K"), (6.4e6, "6.4M"), (70.56e9, "70.6B"),
                                    (1.2e12, "1.2T"), (512, "512")])
def test_count_label(n, want):
    assert count_label(n) == want


def test_a_cpu_runtime_plan_says_fp32_and_sdpas_cpu_flash_kernel(capsys):
    code, out, _ = run(capsys, "--model", ROOT / "examples/tiny-llama.json", "--cluster",
                       "cpux2", "--engine", "runtime", "--global-batch", "16", "--seq-len",
                       "128")
    assert code == 0
    head = " ".join(out.splitlines()[:3])
    assert "bf16" not in head and "fp32" in head and "0.0B" not in head
    assert "flash attention (SDPA's CPU kernel)" in head
    # what torch really selects on a CPU for the runtime's causal GQA call, fp32
    torch = pytest.importorskip("torch")
    from torch.nn.attention import SDPBackend
    q = torch.randn(2, 8, 128, 32, requires_grad=True)
    k, v = torch.randn(2, 4, 128, 32), torch.randn(2, 4, 128, 32)
    assert torch._fused_sdp_choice(q, k, v, None, 0.0, True, enable_gqa=True) == int(
        SDPBackend.FLASH_ATTENTION.value)
    # and the runtime autocasts to bf16 on CUDA only
    src = (ROOT / "runtime/train.py").read_text()
    assert 'torch.autocast("cuda", dtype=torch.bfloat16' in src and "self.on_gpu and" in src


def test_a_custom_gpu_is_named_custom_and_not_validated(capsys, tmp_path):
    path = write(tmp_path, "c.json", {"name": "mya100", "base": "a100", "num_gpus": 16,
                                      "memory_gib": 40})
    code, out, _ = run(capsys, "--model", "llama8b", "--cluster", path)
    head = " ".join(out.splitlines()[:3]).replace("\n", " ")
    assert code == 0
    assert "custom GPU (catalog a100 with memory_gib changed)" in head
    assert "not validated on a custom GPU" in head and "predictions +/-" not in head
    code, out, _ = run(capsys, "--model", "llama8b", "--cluster", "mi300x8")
    assert "not validated on mi300x" in " ".join(out.splitlines()[:3])
    code, out, _ = run(capsys, "--model", "llama8b", "--cluster", "h100x8")
    assert "predictions +/-" in " ".join(out.splitlines()[:3])


def test_sweep_peak_is_the_plans_needed_with_allocated_beside():
    model, cluster = get_model("llama8b"), get_cluster("h100x8")
    df = sweep(model, [cluster], [4096], [64])
    best = search(model, cluster, Fixed(), 4096, 64, top=1, rejected=False).best
    r = df.iloc[0]
    assert r["peak_needed_gib"] == pytest.approx(best.estimate.peak_needed_gib, abs=0.01)
    assert r["peak_allocated_gib"] == pytest.approx(best.estimate.peak_memory_gib, abs=0.01)
    assert r["peak_needed_gib"] > r["peak_allocated_gib"]
    assert "peak_memory_gib" not in df.columns


# ---- help and names -----------------------------------------------------------------------

def test_every_flag_has_help_and_the_help_lists_every_subcommand(capsys):
    from planner.cli import COMMANDS, plan_parser
    from planner.sweep import sweep_parser
    from planner.cli import _Parser
    for parser in (plan_parser(), sweep_parser(_Parser)):
        bare = [a.option_strings or a.dest for a in parser._actions if not a.help]
        assert not bare, bare
    with pytest.raises(SystemExit) as e:
        plan_parser().parse_args(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert f"  plan {name}" in out, name


@pytest.mark.parametrize("args,needle", [
    (["--model", "lama70b", "--cluster", "h100x8"], "did you mean llama70b"),
    (["--model", "qwen3-32", "--cluster", "h100x8"], "did you mean qwen3-32b"),
    (["--model", "llama70b", "--cluster", "h10x8"], "did you mean h100x8?"),
    (["--model", "llama70b", "--cluster", "h100"], "did you mean h100x<count>"),
])
def test_a_misspelt_name_gets_did_you_mean(capsys, args, needle):
    from cli_helpers import one_line
    code, _, err = run(capsys, *args)
    one_line(code, err, expect=2, needle=needle)
