"""`plan --compile`: torchtitan's model and loss under torch.compile, priced with fused
element-wise kernels, carried by the plan, re-priced as emitted, exported as torchtitan's
[compile] section, and refused where the engine has no such option."""
import json
import tomllib

import pytest

from cli_helpers import one_line, refused, run
from benchmarks import fidelity
from planner.cost.price import price_plan
from planner.export import export
from planner.plan import Plan

# torchtitan's 2024-12 8B table (benchmarks/data/published_runs_2.json): FSDP on 8 Grand Teton
# H100s, local batch 2, selective (per-op) recompute, eager then compiled
EAGER, COMPILED = ("torchtitan-202412-table1-8b-8gpu-fsdp",
                   "torchtitan-202412-table1-8b-8gpu-fsdp+torch.compile")


def _row_args(run_, tmp_path):
    model = tmp_path / "model.json"
    model.write_text(json.dumps(run_["model"]))
    c = run_["cluster"]
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"base": c["gpu"], "num_gpus": c["num_gpus"],
                                   "gpus_per_node": c["gpus_per_node"],
                                   "memory_gib": c["memory_gib"], "hbm_gbps": c["hbm_gbps"]}))
    f = run_["fixed"]
    return ["--model", model, "--cluster", cluster, "--engine", "torchtitan",
            "--seq-len", f["seq_len"], "--global-batch", f["global_batch"], "--tp", f["tp"],
            "--pp", f["pp"], "--dp", f["dp"], "--micro-batch", f["micro_batch"], "--zero",
            f["zero"], "--recompute", f["recompute"], "--memory-margin", 0, "--json"]


def _eager_and_compiled(capsys, args, limit_s=60) -> dict:
    """{False: step time planned eager, True: with --compile} of `plan ARGS --json`, each
    plan saying which it is."""
    times = {}
    for flag in ((), ("--compile",)):
        code, out, err = run(capsys, *args, *flag, limit_s=limit_s)
        assert code == 0, err
        plan = json.loads(out)
        plan = plan[0] if isinstance(plan, list) else plan
        assert plan.get("compile", False) is bool(flag)
        times[bool(flag)] = plan["estimate"]["step_time_s"]
    return times


def test_the_compiled_row_reproduces_from_the_command_line(capsys, tmp_path):
    """torchtitan's compiled 8B row planned with its knobs and --compile: the benchmark's
    prediction for the row (which prices it fused from its data, `compiled`). Planned eager,
    the same layout is slower, by less than the table's eager run was (15.7% of the compiled
    step): that run's RMSNorm was tensor expressions, which today's torch fuses."""
    runs = fidelity.load_runs()
    i = next(k for k, r in enumerate(runs) if r["id"] == COMPILED)
    row = fidelity.table(runs)[i]
    times = _eager_and_compiled(capsys, _row_args(runs[i], tmp_path))
    assert times[True] == pytest.approx(row["predicted_s"], rel=1e-6)
    eager = next(r for r in runs if r["id"] == EAGER)
    assert 1.0 < times[False] / times[True] < eager["step_time_s"] / runs[i]["step_time_s"]


def test_compiled_plan_reprices_and_exports_as_priced(capsys, tmp_path):
    out = tmp_path / "plan.json"
    code, _, err = run(capsys, "--model", "llama3-8b", "--cluster", "h100x8", "--engine",
                       "torchtitan", "--compile", "--out", out, limit_s=60)
    assert code == 0, err
    plan = Plan.load(out)
    assert plan.compile
    assert price_plan(plan).estimate.step_time_s == pytest.approx(
        plan.estimate["step_time_s"], rel=1e-9)
    cfg = tomllib.loads(export(plan, "torchtitan"))
    assert cfg["compile"]["enable"] is True
    assert {"model", "loss"} <= set(cfg["compile"]["components"])
    # the same plan said eager re-prices slower: the flag is what was priced
    eager = json.loads(out.read_text())
    del eager["compile"]
    assert price_plan(Plan.from_dict(eager)).estimate.step_time_s > plan.estimate["step_time_s"]


@pytest.mark.parametrize("engine", ["megatron", "deepspeed", "fsdp", "runtime"])
def test_compile_is_refused_where_the_planner_does_not_price_it(capsys, engine):
    refused(capsys, "--model", "llama3-8b", "--cluster", "h100x8", "--engine", engine,
            "--compile", needle=f"torch.compile for torchtitan only, not {engine}")


def test_a_compiled_plan_for_another_engine_is_refused_on_export(capsys, tmp_path):
    out = tmp_path / "plan.json"
    code, _, err = run(capsys, "--model", "llama3-8b", "--cluster", "h100x8", "--out", out,
                       limit_s=60)
    assert code == 0, err
    d = json.loads(out.read_text())
    d["compile"] = True              # a megatron plan said compiled: no engine runs it so
    out.write_text(json.dumps(d))
    code, _, err = run(capsys, "show", out, "--export", "megatron")
    one_line(code, err, needle="torch.compile for torchtitan only")


def test_async_tp_is_offered_compiled_and_exported_so(capsys, tmp_path):
    """torchtitan's async TP ([parallelism] enable_async_tensor_parallel) runs only compiled:
    planned with --compile at tp 8 it is priced (the plan says tp_comm_overlap) and exported
    with [compile] enable; eager, asking for it is refused in one line, and the searched eager
    plan leaves it off."""
    base = ("--model", "llama70b", "--cluster", "h100x64", "--engine", "torchtitan", "--tp", 8)
    out = tmp_path / "plan.json"
    code, _, err = run(capsys, *base, "--compile", "--out", out, limit_s=60)
    assert code == 0, err
    plan = Plan.load(out)
    assert plan.compile and plan.parallelism.tp_comm_overlap
    cfg = tomllib.loads(export(plan, "torchtitan"))
    assert cfg["parallelism"]["enable_async_tensor_parallel"] is True
    assert cfg["compile"]["enable"] is True
    code, _, err = run(capsys, *base, "--out", out, limit_s=60)
    assert code == 0, err
    assert not Plan.load(out).parallelism.tp_comm_overlap
    d = json.loads(out.read_text())
    d["parallelism"]["tp_comm_overlap"] = True     # eager plan said overlapped
    out.write_text(json.dumps(d))
    code, _, err = run(capsys, "show", out, "--export", "torchtitan")
    one_line(code, err, needle="only under torch.compile")


def test_async_tp_hides_forward_collectives_only():
    """torchtitan's async TP hides what Inductor's micro-pipelining reaches, the forward
    pass's TP collectives (its authors' ~20-29% faster forward, ~8% faster steps): the
    compiled plan with it gains less than Megatron's two-pass overlap would on the same
    layout, and more than nothing."""
    import dataclasses

    from planner.catalog import get_cluster, get_model
    from planner.engines import get_engine
    from planner.engines.spec import with_compile
    from planner.search import Fixed, search
    m, c = get_model("llama70b"), get_cluster("h100x64")
    f = dict(tp=8, pp=8, dp=1, mbs=1, recompute="full")   # no data-parallel traffic to expose
    titan = with_compile(get_engine("torchtitan"))
    both = dataclasses.replace(titan, tp_comm_overlap_passes=("fwd", "bwd"))
    t = {}
    for name, eng, overlap in (("none", titan, False), ("fwd", titan, True),
                               ("both", both, True)):
        rep = search(m, c, Fixed(**f, tp_comm_overlap=overlap), engine=eng)
        t[name] = rep.best.estimate.step_time_s
    assert t["both"] < t["fwd"] < t["none"]


def test_an_async_tp_plan_reprices_as_saved(capsys, tmp_path):
    out = tmp_path / "plan.json"
    code, _, err = run(capsys, "--model", "llama70b", "--cluster", "h100x64", "--engine",
                       "torchtitan", "--tp", 8, "--compile", "--out", out, limit_s=60)
    assert code == 0, err
    plan = Plan.load(out)
    assert plan.parallelism.tp_comm_overlap
    assert price_plan(plan).estimate.step_time_s == pytest.approx(
        plan.estimate["step_time_s"], rel=1e-9)
    assert "torch.compile" in export(plan, "torchtitan").splitlines()[1]   # the header says so


def test_fixed_knobs_are_checked_against_the_compiled_engine(capsys):
    """--tp 16 spans two 8-GPU nodes: with async TP offered (compiled), torchtitan refuses the
    overlap there as Megatron does, rather than quietly planning without it."""
    for engine, extra in (("megatron", ()), ("torchtitan", ("--compile",))):
        refused(capsys, "--model", "gpt3-175b", "--cluster", "h100x256", "--engine", engine,
                "--tp", 16, *extra, needle="not with its TP communication overlap")


def test_mixed_clusters_plan_compiled(capsys):
    """On a mixed cluster the pipeline over the groups is priced compiled too, as the single
    groups it is compared with are."""
    args = ("--model", "llama70b", "--cluster", "examples/mixed.json", "--global-batch", 256,
            "--engine", "torchtitan", "--json")
    got = _eager_and_compiled(capsys, args, limit_s=120)
    assert got[True] < got[False]
