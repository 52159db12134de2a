"""The one rules layer (planner.rules, planner.rules_fixed, planner.precision): a refusal names
the one rule that failed and how to fix it, whoever asks (the CLI's fixed values, a loaded plan,
the exporters, `plan launch`, the runtime's pre-flight), and the runtime refuses a plan priced
for another engine or precision before any work."""
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import one_line, run, write
from planner import rules as V
from planner.catalog import get_cluster, get_gpu
from planner.engines import get_engine
from planner.errors import BadInput
from planner.export import export
from planner.launch import launch_commands
from planner.plan import Batch, Parallelism, Plan, make_stages
from planner.problem import Problem
from planner.specs import Cluster, Model

ROOT = Path(__file__).resolve().parents[1]
TINY = json.loads((ROOT / "examples" / "tiny-llama.json").read_text())


def tiny_json(tmp_path, **changes):
    return write(tmp_path, "tiny.json", {**TINY, **changes})


# ---- the two messages that named the wrong reason ------------------------------------------

def test_zero3_under_pipelining_names_the_pipelining_rule(tmp_path, capsys):
    """dp is 2 here: the reason is that Megatron runs ZeRO 0-1 under pipelining, not dp."""
    code, _, err = run(capsys, "--model", tiny_json(tmp_path), "--cluster", "cpux8", "--tp", 2,
                       "--pp", 2, "--dp", 2, "--zero", 3)
    one_line(code, err, 2, "--zero 3 with --pp 2: megatron runs ZeRO 0-1 under pipelining")
    assert "use --zero 1, or --pp 1 for ZeRO-3" in err
    assert "dp > 1" not in err and "cannot be combined" not in err
    # pp left by the fixed tp, dp and cp (8 / (2 * 2 * 1)) says the same
    code, _, err = run(capsys, "--model", tiny_json(tmp_path), "--cluster", "cpux8", "--tp", 2,
                       "--dp", 2, "--cp", 1, "--zero", 3)
    one_line(code, err, 2, "pp 2 (the GPUs --tp and --dp leave): megatron runs ZeRO 0-1")
    # where ZeRO-3 runs (pp 1), it is planned
    code, out, err = run(capsys, "--model", tiny_json(tmp_path), "--cluster", "cpux8", "--tp", 2,
                         "--pp", 1, "--zero", 3, "--json")
    assert code == 0, err
    assert json.loads(out)


def test_deepspeed_uneven_stages_are_not_refused_by_the_rules(tmp_path, capsys):
    """70 layers over 12 stages: DeepSpeed's PipelineModule partitions them (stages differ by a
    layer, as BLOOM-176B ran), so no fixed-value rule refuses --pp 12 (it used to: "deepspeed
    puts the same number of layers on every pipeline stage", an engine-stricter rule, dropped
    in issue 22; the end-to-end plan is tests/test_engine_rules_cited.py)."""
    model = tiny_json(tmp_path, num_hidden_layers=70)
    code, _, err = run(capsys, "--model", model, "--cluster", "h100x96", "--engine", "deepspeed",
                       "--pp", 12, limit_s=30)
    assert "same number of layers" not in err
    # Megatron places any split: the same choice plans
    code, _, err = run(capsys, "--model", model, "--cluster", "h100x96", "--pp", 12, "--json",
                       limit_s=60)
    assert code == 0, err


# ---- rules as data ---------------------------------------------------------------------------

def _plan(model, cluster, tp=1, pp=1, dp=1, engine="runtime", precision="bf16", recipe=None,
          seq=16, nmb=4, layers=None, **par):
    return Plan(model=model, cluster=cluster, parallelism=Parallelism(tp=tp, pp=pp, dp=dp, **par),
                batch=Batch(seq_len=seq, global_batch_size=nmb * dp, micro_batch_size=1,
                            num_microbatches=nmb),
                stages=make_stages(model.num_layers, pp, par.get("vpp", 1),
                                   layers_per_rank=layers),
                engine=engine, precision=precision, recipe=recipe)


LLAMA = Model("tiny", num_layers=4, hidden=64, ffn_hidden=128, num_heads=4, num_kv_heads=2,
              vocab_size=128, max_seq_len=32)
MOE = LLAMA.scaled(name="tiny-moe", num_experts=4, experts_per_token=2, moe_ffn_hidden=32)
CPUX8 = Cluster("cpux8", get_gpu("cpu"), 8, 8)


def test_the_runtime_refusals_are_data_on_its_engine_spec():
    """What the runtime cannot run is read from planner.engines.runtime, each with the runtime
    module that states it; Megatron runs the same plans."""
    rt, meg = get_engine("runtime"), get_engine("megatron")
    cases = [
        (LLAMA.scaled(name="mtp", mtp_layers=1), dict(dp=2), "model_parts"),
        (LLAMA.scaled(name="mla", kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                      v_head_dim=16), dict(tp=2, sequence_parallel=True), "mla_with_tp"),
        (MOE, dict(tp=2, etp=2), "moe_tp_needs_sp"),
        (MOE, dict(tp=2, etp=1, sequence_parallel=True), "etp"),
    ]
    for model, par, rule in cases:
        plan = _plan(model, CPUX8, **par)
        got = V.engine_problems(plan, rt)
        assert got and isinstance(got[0], Problem) and got[0].rule == rule, (rule, got)
        assert got[0].source.startswith("runtime/"), got[0]
        assert "\n" not in got[0].line
        if rule != "moe_tp_needs_sp":       # Megatron asserts sp with MoE and tp too
            assert [p.rule for p in V.engine_problems(dataclasses.replace(
                plan, engine="megatron"), meg)] in ([], ["export_features"]), rule


def test_a_refusal_names_one_rule_not_a_list():
    """DeepSpeed cannot run gpipe nor uneven stages: the export names the first rule only."""
    m = LLAMA.scaled(name="tiny6", num_layers=6)
    # 1, 3, 1, 1: no PipelineModule partition method gives it (issue 22: 1, 2, 2, 1 is
    # 'type:transformer|embedding', which DeepSpeed runs)
    plan = _plan(m, Cluster("cpux4", get_gpu("cpu"), 4, 4), pp=4, schedule="gpipe",
                 engine="deepspeed", layers=[1, 3, 1, 1])
    assert len(V.runner_problems(plan, get_engine("deepspeed"))) == 2
    with pytest.raises(BadInput) as e:
        export(plan, "deepspeed")
    msg = str(e.value)
    assert "gpipe" in msg and "1,3,1,1" not in msg and "\n" not in msg


# ---- a loaded plan is held to every rule ---------------------------------------------------

def test_nvfp4_edited_h100_plan_is_refused_on_show_and_export(tmp_path, capsys):
    code, out, err = run(capsys, "--model", "llama8b", "--cluster", "h100x8", "--out",
                         tmp_path / "p.json", limit_s=60)
    assert code == 0, err
    d = json.loads((tmp_path / "p.json").read_text())
    d["precision"], d["recipe"] = "nvfp4", "nvfp4"
    path = write(tmp_path, "p4.json", d)
    for args in (("show", path), ("show", path, "--export", "megatron")):
        code, out, err = run(capsys, *args)
        one_line(code, err, 2, "precision nvfp4 needs a GPU with NVFP4 tensor cores")
        assert "--precision bf16" in err and "--fp4-recipe" not in out
    # planning refuses the same, in the same words (worded for the flag)
    code, _, err = run(capsys, "--model", "llama8b", "--cluster", "h100x8", "--precision",
                       "nvfp4")
    one_line(code, err, 2, "--precision nvfp4 needs a GPU with NVFP4 tensor cores")


def test_launch_refuses_what_the_runtime_cannot_run(tmp_path):
    plan = _plan(LLAMA.scaled(name="mtp", mtp_layers=1), CPUX8, dp=8, nmb=1)
    plan.validate(whole_cluster=True)
    with pytest.raises(BadInput, match="the runtime cannot run this plan: model mtp: "
                                       "multi-token prediction"):
        launch_commands(plan, tmp_path / "p.json", 1)


def test_the_planner_refuses_for_the_runtime_what_the_runtime_refuses(tmp_path, capsys):
    """MTP is not built by the runtime: planning for it refuses in one line with the fix; MLA
    is planned at tp 1 only."""
    mtp = write(tmp_path, "mtp.json", {**LLAMA.scaled(name="mtp", mtp_layers=1).to_dict()})
    code, _, err = run(capsys, "--model", mtp, "--cluster", "cpux4", "--engine", "runtime",
                       "--global-batch", 8, "--seq-len", 16)
    one_line(code, err, 2, "multi-token prediction (1 mtp_layers) is not built by the runtime")
    assert "--engine megatron" in err
    mla = LLAMA.scaled(name="mla", kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                       v_head_dim=16)
    path = write(tmp_path, "mla.json", mla.to_dict())
    code, _, err = run(capsys, "--model", path, "--cluster", "cpux4", "--engine", "runtime",
                       "--tp", 2, "--global-batch", 8, "--seq-len", 16)
    one_line(code, err, 2, "multi-head latent attention with tp 2")
    code, out, err = run(capsys, "--model", path, "--cluster", "cpux4", "--engine", "runtime",
                         "--global-batch", 8, "--seq-len", 16, "--json", limit_s=60)
    assert code == 0, err
    plans = json.loads(out)
    ranked = plans if isinstance(plans, list) else [plans]
    assert all(p["parallelism"]["tp"] == 1 for p in ranked)


# ---- the runtime refuses a plan priced for another engine or precision ---------------------

def _runtime(nproc, *args, timeout=120):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = ([sys.executable, "-m", "runtime"] if nproc == 1 else
           [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            str(nproc), "-m", "runtime"])
    return subprocess.run(cmd + [str(a) for a in args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _runtime_lines(stderr: str) -> list:
    return [line for line in stderr.splitlines() if line.startswith("runtime:")]


def test_the_runtime_refuses_a_megatron_priced_plan_in_one_line(tmp_path, capsys):
    pytest.importorskip("torch")
    code, _, err = run(capsys, "--model", ROOT / "examples" / "tiny-llama.json", "--cluster",
                       "cpux2", "--global-batch", 4, "--seq-len", 32, "--out",
                       tmp_path / "p.json", limit_s=60)
    assert code == 0, err
    assert json.loads((tmp_path / "p.json").read_text())["engine"] == "megatron"
    r = _runtime(2, "--plan", tmp_path / "p.json", "--steps", 1, "--metrics",
                 tmp_path / "m.jsonl")
    assert r.returncode != 0
    lines = _runtime_lines(r.stderr)
    assert lines and len(set(lines)) == 1, r.stderr            # each rank says the same line
    assert "priced for megatron, not runtime" in lines[0] and "--engine runtime" in lines[0]
    assert not (tmp_path / "m.jsonl").exists()                 # before any work


def test_the_runtime_refuses_a_runtime_plan_edited_to_fp8(tmp_path, capsys):
    pytest.importorskip("torch")
    from runtime.train import Refused, preflight
    # on CPUs: no FP8 tensor cores (Plan.load, before any work)
    code, _, err = run(capsys, "--model", ROOT / "examples" / "tiny-llama.json", "--cluster",
                       "cpux2", "--engine", "runtime", "--global-batch", 4, "--seq-len", 32,
                       "--out", tmp_path / "p.json", limit_s=60)
    assert code == 0, err
    d = json.loads((tmp_path / "p.json").read_text())
    d["precision"], d["recipe"] = "fp8", "tensorwise"
    r = _runtime(1, "--plan", write(tmp_path, "p8.json", d), "--steps", 1, "--metrics",
                 tmp_path / "m.jsonl")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "precision fp8 needs a GPU with FP8 tensor cores" in r.stderr
    assert not (tmp_path / "m.jsonl").exists()
    # on H100s: the GPU runs FP8, the runtime does not (its pre-flight)
    plan = _plan(LLAMA, get_cluster("h100x8"), dp=8, nmb=1, precision="fp8",
                 recipe="tensorwise")
    plan.validate(whole_cluster=True)
    with pytest.raises(Refused) as e:
        preflight(plan, 8, 8, on_gpu=True, visible_gpus=8)
    assert str(e.value) == ("runtime: engine runtime does not run precision fp8 (it runs: "
                            "bf16); plan it with --engine runtime --precision bf16")


def test_a_refusal_is_said_once_and_never_lost(monkeypatch, capsys):
    """Under torchrun (the launcher's store): rank 0 says the line and the others, having
    waited for it, say nothing; a rank that rank 0 never answers says its own, with its rank."""
    pytest.importorskip("torch")
    import torch.distributed as dist

    from runtime import train
    from runtime.train import _free_port
    port = _free_port()
    server = dist.TCPStore("127.0.0.1", port, 2, is_master=True, wait_for_workers=False)
    monkeypatch.setattr(train, "REFUSAL_WAIT_S", 2)
    env = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
               TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT="0")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    line = "runtime: the plan was priced for megatron, not runtime"
    monkeypatch.setenv("RANK", "1")                      # rank 0 has not said it: its own
    assert train._refuse(line) == 2
    assert capsys.readouterr().err.splitlines() == [
        "runtime: rank 1: the plan was priced for megatron, not runtime"]
    monkeypatch.setenv("RANK", "0")                      # rank 0 says it ...
    assert train._refuse(line) == 2
    monkeypatch.setenv("RANK", "1")                      # ... and rank 1, told, says nothing
    assert train._refuse(line) == 2
    assert capsys.readouterr().err.splitlines() == [line]
    del server
