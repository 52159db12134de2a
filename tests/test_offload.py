"""Offload (planner.cost.offload): host and NVMe as cluster facts, ZeRO-Offload and
ZeRO-Infinity priced, searched where nothing fits without, exported, refused where the engine
has no such offload, and bad input in one line."""
import json
from dataclasses import replace

import pytest

from cli_helpers import one_line, run, write
from planner.catalog import get_cluster, get_model
from planner.cost.memory import GIB
from planner.cost.price import candidate_of, price_plan
from planner.cost.stage import stage_coefficients
from planner.engines import get_engine
from planner.export.deepspeed import deepspeed_config
from planner.export.megatron import megatron_args
from planner.plan import Plan
from planner.rules import plan_problems
from planner.search import Fixed, search, to_plan

H100X8 = get_cluster("h100x8")
L70 = get_model("llama70b")
L405 = get_model("llama405b")


@pytest.fixture(scope="module")
def plans70():
    """llama70b on h100x8, searched under DeepSpeed and Megatron."""
    out = {}
    for e in ("deepspeed", "megatron"):
        rep = search(L70, H100X8, Fixed(), engine=e)
        out[e] = to_plan(L70, H100X8, rep.best, rep)
    return out


def test_catalog_host_figures_and_cluster_json_overrides(tmp_path, capsys):
    g = H100X8.gpu
    # DGX H100 datasheet: 2 TB system memory, PCIe Gen5 x16 128 GB/s both ways, 8 x 3.84 TB NVMe
    assert (g.host_memory_gib, g.host_link_gbps) == (2048.0, 64.0)
    assert g.nvme_tib == pytest.approx(8 * 3.84e12 / 2 ** 40)
    f = write(tmp_path, "c.json", {"base": "h100", "num_gpus": 8, "host_memory_gib": 512})
    assert get_cluster(f).gpu.host_memory_gib == 512
    bad = write(tmp_path, "bad.json", {"base": "h100", "num_gpus": 8, "host_memory_gib": -1})
    code, _, err = run(capsys, "--model", "llama3-8b", "--cluster", bad)
    one_line(code, err, needle="host_memory_gib")


def test_nothing_fits_70b_on_8_h100_without_offload():
    for e in ("deepspeed", "megatron"):
        f = Fixed(offload_optimizer="none", offload_params="none")
        assert search(L70, H100X8, f, engine=e).best is None


@pytest.mark.parametrize("engine", ["deepspeed", "megatron"])
def test_70b_plans_with_optimizer_offload(plans70, engine):
    plan = plans70[engine]
    p, est = plan.parallelism, plan.estimate
    assert est["fits"] and p.offload_optimizer == "cpu" and p.offload_params == "none"
    assert "offload" in est["time_breakdown_s"]
    # the optimizer states left the GPU: the same layout priced without offload holds
    # exactly engine.optimizer_bytes per local parameter more (12 B: fp32 master + Adam m, v)
    c = candidate_of(plan)
    eng = get_engine(engine)
    on_gpu = stage_coefficients(L70, H100X8, replace(c, offload_optimizer="none"), eng)
    off = stage_coefficients(L70, H100X8, c, eng)
    n = L70.num_layers
    # (the whole model on the one pipeline rank: its layers, embedding and head, over tp)
    local = eng.built_model(L70, p.tp).num_params() / p.tp / (p.dp if p.zero_stage else 1)
    assert off[0].memory(n, 0)["optimizer"] == 0.0
    assert on_gpu[0].memory(n, 0)["optimizer"] == pytest.approx(12 * local, rel=0.01)
    # host memory: DeepSpeed's own estimate for optimizer offload is 16 B per parameter
    # (fp32 master, m, v, fp32 gradient) x additional_buffer_factor 1.5 per node
    # (deepspeed/runtime/zero/stage3.py estimate_zero3_model_states_mem_needs); Megatron
    # publishes no such estimate, and its host side is priced with DeepSpeed's (an assumption)
    # beside them, where the plan also offloads activations (recompute "offload"): a node's 8
    # GPUs each hold their offloaded layers' activations in pinned buffers (rounded up to
    # powers of two: planner.cost.offload.pinned_round_factor)
    acts = 0.0
    if p.recompute == "offload":
        from planner.cost.offload import pinned_round_factor
        r = plan.stages[0].recompute_layers
        per_layer = off[0].memory(n, 0)["activations"] / n
        tokens = plan.batch.micro_batch_size * plan.batch.seq_len // p.cp
        acts = 8 * r * per_layer * pinned_round_factor(L70, tokens, p.tp,
                                                       p.sequence_parallel)
    assert est["host_memory_gib_per_node"] == pytest.approx(
        L70.num_params() * 16 * 1.5 / GIB + acts / GIB, rel=0.03)
    assert est["host_memory_gib_per_node"] <= est["host_capacity_gib_per_node"]
    # the CPU step: every parameter's Adam traffic at the node's memory bandwidth (the 8 GPUs'
    # processes of the node share it): fp32 weight, gradient and both moments read (16 B),
    # weight and moments written (12 B), the bf16 copy for the GPU (2 B), as DeepSpeed's CPU
    # Adam loop does (csrc/adam/cpu_adam_impl.cpp Step_AVX)
    cpu_s = L70.num_params() * (16 + 12 + 2) / (H100X8.gpu.host_memory_gbps * 1e9)
    assert est["time_breakdown_s"]["optimizer"] == pytest.approx(cpu_s, rel=0.05)


def test_70b_offload_exports(plans70):
    ds = json.loads(deepspeed_config(plans70["deepspeed"]))
    assert ds["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    args = megatron_args(plans70["megatron"])
    for flag in ("--optimizer-cpu-offload", "--optimizer-offload-fraction 1.0",
                 "--use-precision-aware-optimizer", "--use-distributed-optimizer"):
        assert flag in args


def test_70b_offload_plan_round_trips(plans70, tmp_path):
    plan = plans70["deepspeed"]
    path = tmp_path / "p.json"
    plan.save(path)
    back = Plan.load(path, whole_cluster=True)
    assert back.parallelism == plan.parallelism
    assert price_plan(back).estimate.step_time_s == pytest.approx(
        plan.estimate["step_time_s"], rel=1e-9)
    # a plan without the offload keys (every plan before them) loads as no offload
    d = json.loads(path.read_text())
    for k in ("offload_optimizer", "offload_params"):
        d["parallelism"].pop(k, None)
    d.pop("estimate")
    old = Plan.from_dict(d)
    assert (old.parallelism.offload_optimizer, old.parallelism.offload_params) == ("none",
                                                                                   "none")


def test_405b_on_8_h100_offloads_parameters_under_deepspeed():
    rep = search(L405, H100X8, Fixed(), engine="deepspeed")
    plan = to_plan(L405, H100X8, rep.best, rep)
    p, est = plan.parallelism, plan.estimate
    assert est["fits"] and p.zero_stage == 3 and p.offload_params != "none"
    # 405B's optimizer states (16 B a parameter, 6.5 TB) exceed the node's 2 TiB of host
    # memory: they go to NVMe, which holds them
    assert p.offload_optimizer == "nvme"
    assert est["nvme_tib_per_node"] == pytest.approx(L405.num_params() * 16 / 2 ** 40, rel=0.03)
    assert est["nvme_tib_per_node"] <= est["nvme_capacity_tib_per_node"]
    ds = json.loads(deepspeed_config(plan))["zero_optimization"]
    assert ds["offload_optimizer"]["device"] == "nvme" and "nvme_path" in ds["offload_optimizer"]
    assert ds["offload_param"]["device"] == p.offload_params


@pytest.mark.parametrize("args,needle", [
    (("--model", "llama405b", "--engine", "megatron", "--offload-params", "cpu"),
     "megatron does not offload the parameters"),
    (("--model", "llama70b", "--engine", "torchtitan", "--offload-optimizer", "cpu"),
     "torchtitan offloads the parameters, gradients and optimizer states together"),
    (("--model", "llama70b", "--engine", "fsdp", "--offload-optimizer", "cpu"),
     "fsdp does not offload the optimizer"),
    (("--model", "llama405b", "--engine", "deepspeed", "--offload-optimizer", "cpu"),
     "GiB of host memory per node, more than its 2,048 GiB"),
    (("--model", "llama70b", "--engine", "deepspeed", "--offload-params", "cpu", "--zero", "2"),
     "under ZeRO-3 only"),
    (("--model", "llama70b", "--engine", "megatron", "--offload-optimizer", "cpu", "--zero", "0",
      "--dp", "2"), "distributed optimizer"),
    (("--model", "llama70b", "--engine", "deepspeed", "--offload-optimizer", "cpu",
      "--cluster", "mi300xx8"), "gives no host_link_gbps"),
])
def test_bad_offload_is_one_line_exit_2(capsys, args, needle):
    if "--cluster" not in args:
        args = args + ("--cluster", "h100x8")
    code, _, err = run(capsys, *args, limit_s=60)
    one_line(code, err, needle=needle)


def test_runtime_refuses_an_offload_plan_before_any_work(plans70, tmp_path, capsys):
    """Our runtime has no offload path (planner.engines.runtime): an offload plan, priced for
    it or not, is refused in its pre-flight, before torch.distributed starts."""
    from runtime.train import main
    from test_runtime import make_plan
    plan = Plan.load(make_plan(tmp_path / "r.json"))
    plan.parallelism = replace(plan.parallelism, offload_optimizer="cpu")
    assert any("runtime does not offload" in x for x in plan_problems(plan, runner="runtime"))
    d = plan.to_dict()
    path = write(tmp_path, "off.json", d)
    capsys.readouterr()
    rc = main(["--plan", path, "--steps", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "offload" in err[0], err


def test_plans_that_fit_do_not_offload():
    """Offload is searched only where nothing fits without: llama3-8b on h100x8 unchanged."""
    rep = search(get_model("llama3-8b"), H100X8, Fixed(), engine="deepspeed")
    assert rep.best.candidate.offload_optimizer == "none"


def test_offload_respects_the_fixed_choices_where_nothing_else_fits(capsys):
    """--recompute none --tp 8 --pp 4 --micro-batch 4 fits no 70B layout on h100x32's GPUs
    alone (tests/test_cli.py test_nothing_fits_suggests_recompute): with the optimizer in host
    memory it fits, keeping every fixed choice."""
    code, out, err = run(capsys, "--model", "llama70b", "--cluster", "h100x32", "--recompute",
                         "none", "--tp", "8", "--pp", "4", "--micro-batch", "4", "--seq-len",
                         "8192", "--global-batch", "64", "--zero", "0", "--json", limit_s=60)
    assert code == 0, err
    plan = json.loads(out)
    par = plan["parallelism"]
    assert par["offload_optimizer"] == "cpu" and par["recompute"] == "none"
    assert (par["tp"], par["pp"], par["zero_stage"]) == (8, 4, 0)
    assert plan["estimate"]["fits"]


def test_70b_on_8_h100_under_torchtitan_offloads_with_fsdp2_cpu_offload():
    """torchtitan's enable_cpu_offload (FSDP2 CPUOffloadPolicy) moves parameters, gradients
    and optimizer states together; its all-gathers copy the fp32 shard up in every
    micro-batch's forward and backward."""
    from planner.export.torchtitan import torchtitan_toml
    rep = search(L70, H100X8, Fixed(), engine="torchtitan")
    plan = to_plan(L70, H100X8, rep.best, rep)
    p = plan.parallelism
    assert (p.offload_optimizer, p.offload_params) == ("cpu", "cpu") and p.zero_stage >= 2
    assert "enable_cpu_offload = true" in torchtitan_toml(plan)
    assert plan.stages[0].memory_gib["optimizer"] == 0.0


def test_the_would_fit_bound_with_offload_never_skips_a_count_that_fits():
    """planner.suggest skips GPU counts whose GPUs cannot hold the states even with the
    engine's offloads (states_per_gpu_bound with offload): a sound bound, checked against the
    search on small GPUs (h100 with 2.4-4 GiB: a tiny model's states overflow them)."""
    import dataclasses
    import itertools
    from planner import suggest as sg
    from planner.specs import Cluster, Model
    tiny = Model("tiny", num_layers=8, hidden=1024, ffn_hidden=4096, num_heads=8,
                 num_kv_heads=8, vocab_size=32000, max_seq_len=4096)
    skipped = 0
    for gib, n, engine in itertools.product((2.4, 3.0), (1, 2, 4), ("megatron", "deepspeed")):
        gpu = dataclasses.replace(get_cluster("h100x1").gpu, memory_gib=gib)
        c = Cluster(f"h100x{n}", gpu, n, 1)
        if sg._hopeless(tiny, c, engine, None, Fixed()):
            skipped += 1
            assert search(tiny, c, Fixed(), 1024, 12, top=1, rejected=False,
                          engine=engine).best is None
    assert skipped   # the bound does skip some
