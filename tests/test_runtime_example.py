"""The README's runtime example runs as written, on 2 cores in under a minute; the terminal
progress line and the long-step warning."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from test_runtime import make_plan, run_runtime  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# one pytest-xdist worker for the modules whose tests read the README's examples, each run once
# a session (conftest.py page_examples)
pytestmark = pytest.mark.xdist_group("readme-examples")


def readme_runtime_example() -> tuple:
    """(index, commands) of the README's runtime example (its `console slow` block, which
    tests/test_readme.py also compares with the output the README shows)."""
    import readme_examples as rx
    blocks = list(enumerate(rx.parse((ROOT / "README.md").read_text())))
    i, block = next((i, b) for i, b in blocks
                    if any(c.line.startswith("torchrun ") and " -m runtime " in c.line
                           for c in b.commands))
    return i, [c.line for c in block.commands]


@pytest.mark.slow
def test_readme_example_runs_as_written(page_examples):
    """Run as written (bash, `plan` and `torchrun` on PATH, a scratch directory with examples/;
    conftest.py runs it once for this test and tests/test_readme.py): within a minute, 20
    steps whose loss falls by more than 0.5, no warning, a predicted step time."""
    index, lines = readme_runtime_example()
    assert lines[0].startswith("plan ") and lines[1].startswith("torchrun ")
    ran = page_examples(ROOT / "README.md", index)
    assert ran.seconds < 60, ran.seconds
    m = [json.loads(l) for l in (ran.work / "m.jsonl").read_text().splitlines()]
    steps = [d for d in m if "step" in d]
    assert [d["step"] for d in steps] == list(range(1, 21))
    assert steps[-1]["loss"] < steps[0]["loss"] - 0.5, (steps[0]["loss"], steps[-1]["loss"])
    assert "warning" not in ran.stderr[-1]
    assert m[-1]["summary"]["predicted_step_time_s"] > 0


def test_progress_line_on_a_terminal(tmp_path):
    """stderr a terminal: a line per step with step/total, loss, tokens/s, MFU and ETA; the
    same loss, tokens/s and MFU as the step's metrics line."""
    import pty
    plan = make_plan(tmp_path / "p.json")
    master, slave = pty.openpty()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    p = subprocess.Popen([sys.executable, "-m", "runtime", "--plan", str(plan), "--steps", "3",
                          "--metrics", str(tmp_path / "m")], cwd=ROOT, env=env,
                         stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    assert p.wait(timeout=60) == 0
    os.close(master)
    text = out.decode()
    shown = re.findall(r"step (\d+)/3  loss ([0-9.]+)  ([0-9,]+) tok/s  MFU ([0-9.]+)%  "
                       r"ETA ([0-9.]+ (?:s|min|h))", text)
    assert [int(s) for s, *_ in shown] == [1, 2, 3], text
    m = [json.loads(l) for l in (tmp_path / "m").read_text().splitlines() if '"step"' in l]
    for (s, loss, tps, mfu, _), rec in zip(shown, m):
        assert float(loss) == pytest.approx(rec["loss"], abs=1e-4)
        assert int(tps.replace(",", "")) == round(rec["tokens_per_s"])
        assert float(mfu) == pytest.approx(100 * rec["mfu"], abs=0.06)
    assert shown[-1][4] == "0.00 s"


def test_no_progress_line_off_a_terminal(tmp_path):
    r = run_runtime("--plan", make_plan(tmp_path / "p.json"), "--steps", 2)
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_warns_when_the_plan_predicts_long_steps(tmp_path, capsys):
    plan = make_plan(tmp_path / "p.json")
    d = json.loads(Path(plan).read_text())
    d["estimate"] = {"fits": True, "step_time_s": 900.0, "tokens_per_s": 256.0,
                     "tflops_per_gpu": 0.01, "mfu": 0.1, "peak_memory_gib": 0.5}
    Path(plan).write_text(json.dumps(d))
    r = run_runtime("--plan", plan, "--steps", 2)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [
        "runtime: warning: the plan predicts 15.0 min per step on cpux8, 30.0 min for "
        "2 steps; re-plan with a smaller --global-batch for quicker steps"]
    # 50 s per step: no warning
    from planner.plan import Plan

    from runtime.train import parse_args, warn_long_steps
    d["estimate"]["step_time_s"] = 50.0
    Path(plan).write_text(json.dumps(d))
    capsys.readouterr()
    warn_long_steps(parse_args(["--plan", str(plan), "--steps", "1000"]), Plan.load(plan))
    assert capsys.readouterr().err == ""


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a CPU machine")
def test_warns_when_the_plan_is_for_other_hardware(tmp_path):
    from planner.catalog import get_gpu
    from planner.plan import Plan
    from planner.specs import Cluster
    plan = Plan.load(make_plan(tmp_path / "p.json"))
    plan.cluster = Cluster("h100x1", get_gpu("h100"), 1, 1)
    plan.estimate = {"fits": True, "step_time_s": 0.01, "tokens_per_s": 1e4,
                     "tflops_per_gpu": 1.0, "mfu": 0.1, "peak_memory_gib": 0.5}
    plan.save(tmp_path / "h.json")
    r = run_runtime("--plan", tmp_path / "h.json", "--steps", 1)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [
        "runtime: warning: the plan was made for h100x1 (h100); on this CPU machine its "
        "predicted step time (0.01 s) does not apply"]


def test_gpu_check_refuses_a_machine_without_a_gpu(tmp_path):
    """benchmarks/gpu_check.py (the prepared GPU run) says in one line that there is no GPU and
    exits 2, writing nothing (its CPU path is `--cpu-dry-run`)."""
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--out", str(tmp_path)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--cpu-dry-run" in r.stderr and not list(tmp_path.iterdir())
