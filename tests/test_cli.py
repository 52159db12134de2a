"""`plan` end to end: output, JSON, exit codes and every error path."""
import json
import subprocess
import sys

import pytest

from planner.cli import main
from planner.plan import Plan


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_main_command_prints_a_plan(capsys):
    code, out, err = run(capsys, "--model", "llama8b", "--cluster", "h100x8")
    assert code == 0, err
    assert "Plan for llama3-8b" in out and "tokens/s" in out and "MFU" in out
    assert "Stages" in out and "Alternatives" in out


def test_json_and_out_roundtrip(capsys, tmp_path):
    path = tmp_path / "plan.json"
    code, out, err = run(capsys, "--model", "llama70b", "--cluster", "h100x32", "--json",
                         "--out", str(path), "--seq-len", "4096", "--global-batch", "64")
    assert code == 0, err
    d = json.loads(out)
    assert d["schema_version"] == 1
    for key in ("model", "cluster", "parallelism", "batch", "stages", "estimate", "search"):
        assert key in d
    par = d["parallelism"]
    assert par["tp"] * par["cp"] * par["pp"] * par["dp"] == 32
    assert d["batch"]["micro_batch_size"] * d["batch"]["num_microbatches"] * par["dp"] == 64
    assert d["estimate"]["fits"] and d["search"]["solver_status"] in ("OPTIMAL", "FEASIBLE")
    assert set(d["estimate"]["time_breakdown_s"]) == {"compute", "tp_comm", "pp_comm",
                                                      "dp_comm_exposed", "bubble", "optimizer"
                                                      } | ({"cp_comm"} if par["cp"] > 1 else set()) | (
        {"activation_offload"} if par["recompute"] == "offload" else set())
    plan = Plan.load(path)
    assert plan.to_dict() == d
    assert sum(s.num_layers for s in plan.stages) == 80


def test_fixed_dimensions_are_respected(capsys):
    code, out, _ = run(capsys, "--model", "llama70b", "--cluster", "h100x32", "--tp", "4", "--pp", "4",
                       "--cp", "1", "--zero", "1", "--micro-batch", "2", "--seq-len", "4096", "--global-batch", "64",
                       "--json", "--schedule", "interleaved", "--vpp", "2")
    assert code == 0
    d = json.loads(out)
    p = d["parallelism"]
    assert (p["tp"], p["pp"], p["dp"], p["zero_stage"], p["schedule"], p["vpp"]) == (4, 4, 2, 1, "interleaved", 2)
    assert d["batch"]["micro_batch_size"] == 2
    assert len(d["stages"]) == 8


def test_what_if_reports_a_configuration_that_does_not_fit(capsys):
    code, out, err = run(capsys, "--model", "llama70b", "--cluster", "h100x8", "--tp", "1", "--pp", "1",
                         "--dp", "8", "--zero", "0", "--micro-batch", "1", "--recompute", "none",
                         "--seq-len", "4096", "--global-batch", "8")
    assert code == 3
    assert "DOES NOT" in out
    assert "nothing fits" in err and "overflows stage 0 by" in err


def test_nothing_fits_says_what_would(capsys):
    code, out, err = run(capsys, "--model", "llama405b", "--cluster", "h100x8")
    assert code == 3 and out == ""
    assert err.count("\n") == 1
    assert "nothing fits" in err and "GiB" in err and "GPUs" in err


def test_nothing_fits_suggests_recompute(capsys):
    # on the GPUs alone (without --offload-optimizer none the search offloads the optimizer
    # there instead: tests/test_offload.py)
    code, _, err = run(capsys, "--model", "llama70b", "--cluster", "h100x32", "--recompute", "none",
                       "--tp", "8", "--pp", "4", "--micro-batch", "4", "--seq-len", "8192",
                       "--global-batch", "64", "--zero", "0", "--offload-optimizer", "none")
    assert code == 3
    assert "--recompute full" in err


@pytest.mark.parametrize("args, needle", [
    (["--model", "nope", "--cluster", "h100x8"], "unknown model"),
    (["--model", "llama8b", "--cluster", "zzz"], "unknown cluster"),
    (["--model", "llama8b", "--cluster", "h100x8", "--tp", "3"], "does not divide"),
    (["--model", "llama8b", "--cluster", "h100x8", "--tp", "0"], "must be positive"),
    (["--model", "llama8b", "--cluster", "h100x8", "--global-batch", "-4"], "must be positive"),
    (["--model", "llama8b", "--cluster", "h100x8", "--zero", "5"], "invalid choice"),
    (["--model", "llama8b", "--cluster", "h100x8", "--seq-len", "abc"], "integer"),
    (["--model", "llama8b"], "required"),
    (["--model", "llama8b", "--cluster", "h100x8", "--pp", "3"], "does not divide"),
])
def test_bad_input_is_one_line_exit_2(capsys, args, needle):
    code, out, err = run(capsys, *args)
    assert code == 2
    assert needle in err
    assert err.startswith("plan: error:") and err.count("\n") == 1


def test_sp_at_tp1_plans_without_it(capsys):
    """Issue 22: --sp --tp 1 used to be refused ("--sp needs --tp > 1"); Megatron disables
    sequence parallelism at tp 1 with a warning (megatron/training/arguments.py), so the plan
    is made without it."""
    code, out, err = run(capsys, "--model", "llama8b", "--cluster", "h100x8", "--sp", "--tp",
                         "1", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["parallelism"]["tp"] == 1 and plan["parallelism"]["sequence_parallel"] is False


def test_bad_files(capsys, tmp_path):
    bad = tmp_path / "cfg.json"
    bad.write_text("[1, 2")
    code, _, err = run(capsys, "--model", str(bad), "--cluster", "h100x8")
    assert code == 2 and "not valid JSON" in err
    notplan = tmp_path / "x.json"
    notplan.write_text(json.dumps({"hello": 1}))
    code, _, err = run(capsys, "show", str(notplan))
    assert code == 2 and "not a plan" in err
    code, _, err = run(capsys, "--model", "llama8b", "--cluster", "h100x8", "--out",
                       str(tmp_path / "missing-dir" / "p.json"))
    assert code == 2 and "--out" in err


def test_console_script_never_tracebacks():
    r = subprocess.run([sys.executable, "-m", "planner.cli", "--model", "llama8b", "--cluster", "h100x8",
                        "--tp", "5"], capture_output=True, text=True)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and r.stderr.strip().startswith("plan: error:")


def test_planner_never_imports_torch():
    code = ("import sys, planner.cli, planner.search, planner.export, planner.explain; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_stage_layers_fix_the_split_and_bad_ones_get_one_line():
    """--stage-layers places exactly those decoder layers per rank (--pp from their count),
    recompute placed on them; a wrong count, sum or a rank with fewer layers than its chunks
    is exit 2 with one line."""
    import json
    import subprocess
    import sys
    base = [sys.executable, "-m", "planner.cli", "--model", "llama8b", "--cluster", "h100x8",
            "--tp", "1", "--dp", "2", "--global-batch", "64", "--seq-len", "4096"]
    r = subprocess.run(base + ["--stage-layers", "7,9,9,7", "--json"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    per_rank = [0] * 4
    for s in json.loads(r.stdout)["stages"]:     # virtual stages where interleaved
        per_rank[s["pp_rank"]] += s["layers"][1] - s["layers"][0]
    assert per_rank == [7, 9, 9, 7]
    for bad, why in ((["--stage-layers", "8,8,8", "--pp", "4"], "3 layer counts for pp 4"),
                     (["--stage-layers", "8,8,8,9"], "sum to 33, not the model's 32"),
                     # a middle rank: Megatron lets only the first rank's first chunk (the
                     # embedding's) and the last rank's last (the loss's) go empty
                     (["--stage-layers", "8,1,15,8", "--vpp", "2"], "fewer than its 2"),
                     (["--stage-layers", "8,x"], "must be an integer")):
        r = subprocess.run(base + bad, capture_output=True, text=True)
        assert r.returncode == 2, (bad, r.stdout)
        assert why in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
