"""The `plan` command.

    plan --model llama70b --cluster h100x32 [--engine E] [--tp 8 ...] [--json] [--out plan.json]
    plan show plan.json [--export FMT]
    plan sweep --model M --clusters h100x8,h100x16 [--csv FILE] [--plot FILE]
    plan launch plan.json --nnodes N [--slurm]
    plan models

Exit codes: 0 a plan that fits, 2 bad input, 3 nothing fits. Errors are one line on stderr.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys

from planner.limits import MAX_INT_ARG
from planner.catalog import get_cluster, get_model
from planner.cost.context import CP_COMM_TYPES
from planner.cost.moe import DISPATCHERS
from planner.cost.stage import memory_budget
from planner.engines import DEFAULT_ENGINE, ENGINES, get_engine
from planner.errors import BadInput, NothingFits, PlannerError
from planner.explain import (alternatives, describe_candidate, ensure_estimate,
                             no_configuration_message, render)
from planner.plan import Plan
from planner.precision import DEFAULT_PRECISION, PRECISIONS, RECIPES
from planner.search import Fixed, search, to_plan
from planner.specs import MixedCluster
from planner.precision_choice import AUTO, choice_record, search_formats
from planner.vocab import OFFLOAD_DEVICES, RECOMPUTE, SCHEDULES, schedule_name

EXPORT_FORMATS = ("megatron", "deepspeed", "torchtitan")
SUBCOMMANDS = """subcommands (each with --help):
  plan show PLAN.json [--export E] [--json] [--plot F]   explain or export a saved plan
  plan sweep --model M --clusters C1,C2 [...]            the best plan at each point of a grid
  plan launch PLAN.json --nnodes N [--slurm]             torchrun / SLURM lines for a plan
  plan models                                            the catalog's models

exit codes: 0 a plan that fits, 2 bad input, 3 nothing fits (with what would fit)"""


class _Parser(argparse.ArgumentParser):
    def error(self, message):            # one line, exit 2 (argparse prints usage too)
        raise BadInput(message)


def _positive(name):
    def conv(s):
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {s!r}") from None
        if v <= 0:
            raise argparse.ArgumentTypeError(f"{name} must be positive, got {v}")
        if v > MAX_INT_ARG:   # planner.limits: the cost model's floats never overflow
            raise argparse.ArgumentTypeError(f"{name} is too large (at most {MAX_INT_ARG})")
        return v
    return conv


def _layer_counts(s):
    """--stage-layers 11,12,12,12: decoder layers per pipeline rank."""
    one = _positive("--stage-layers")
    return tuple(one(x) for x in s.split(","))


def _module_names(s):
    """--recompute-modules moe_act,layernorm: Megatron's selective recompute modules."""
    from planner.cost.recompute import MODULES
    names = tuple(x.strip() for x in s.split(","))
    bad = [x for x in names if x not in MODULES]
    if bad or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"--recompute-modules takes distinct names of {', '.join(MODULES)}, got {s!r}")
    return names


def _non_negative_gib(s):
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--memory-margin must be a number, got {s!r}") from None
    if not v >= 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"--memory-margin must be a finite number >= 0, got {s}")
    return v


def plan_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="plan", description="Plan how to split a model over a cluster.",
                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=SUBCOMMANDS)
    p.add_argument("--model", required=True, help="catalog name (llama70b, ...) or config.json")
    p.add_argument("--cluster", required=True, help="<gpu>x<count> (h100x32) or cluster JSON")
    p.add_argument("--seq-len", type=_positive("--seq-len"),
                   help="tokens per sequence (default: the model's context, at most 8192)")
    p.add_argument("--global-batch", type=_positive("--global-batch"),
                   help="sequences per step (default: 4M tokens, >= 1 sequence per 8 GPUs)")
    p.add_argument("--tp", type=_positive("--tp"),
                   help="tensor-parallel degree (default: searched, within a node's NVLink)")
    p.add_argument("--pp", type=_positive("--pp"),
                   help="pipeline-parallel degree (default: searched)")
    p.add_argument("--dp", type=_positive("--dp"),
                   help="data-parallel degree (default: what tp x cp x pp leave of the GPUs)")
    p.add_argument("--cp", type=_positive("--cp"),
                   help="context-parallel degree (default: searched where the engine has CP)")
    p.add_argument("--cp-comm-type", choices=CP_COMM_TYPES,
                   help="context-parallel K/V exchange: p2p ring, all_gather or a2a (Ulysses) "
                        "(default: searched among the engine's)")
    p.add_argument("--zero", type=int, choices=(0, 1, 2, 3),
                   help="ZeRO stage: 1 shards the optimizer states over dp, 2 the gradients "
                        "too, 3 the parameters too (default: searched among the engine's)")
    p.add_argument("--micro-batch", type=_positive("--micro-batch"),
                   help="sequences per micro-batch (default: searched)")
    p.add_argument("--vpp", type=_positive("--vpp"),
                   help="virtual pipeline stages per rank (> 1: the interleaved schedule; "
                        "default: searched where the engine interleaves)")
    p.add_argument("--stage-layers", type=_layer_counts, metavar="N,N,...",
                   help="decoder layers per pipeline rank, in rank order (default: placed by "
                        "the search; --pp defaults to their count); each rank's layers are "
                        "split evenly over its virtual stages")
    p.add_argument("--ep", type=_positive("--ep"),
                   help="expert parallelism (MoE models; searched when absent)")
    p.add_argument("--etp", type=_positive("--etp"),
                   help="expert tensor parallelism (MoE models; searched when absent)")
    p.add_argument("--recompute", choices=RECOMPUTE,
                   help="activation recompute: none, selective (modules of every layer), full "
                        "(whole layers, as many as memory needs), op (torchtitan's per-op "
                        "selective checkpointing), or offload (whole layers' activations to "
                        "host memory, as many as memory needs: Megatron's "
                        "--cpu-offloading-num-layers, pp 1) (default: searched)")
    p.add_argument("--recompute-modules", type=_module_names, metavar="M,M",
                   help="what selective recompute recomputes of every layer (Megatron's "
                        "--recompute-modules; implies --recompute selective; default "
                        "core_attn, or searched for the engine)")
    p.add_argument("--sp", dest="sp", action="store_true", default=None,
                   help="sequence parallelism with tp > 1 (default: searched where optional)")
    p.add_argument("--no-sp", dest="sp", action="store_false",
                   help="no sequence parallelism")
    p.add_argument("--schedule", type=schedule_name, choices=SCHEDULES,
                   help="pipeline schedule with pp > 1 (default: searched among the engine's; "
                        "--vpp > 1 implies interleaved); interleaved-zb, zbv and dualpipev are "
                        "torch's zero-bubble ones, zbv and dualpipev with 2 chunks per rank; "
                        "engine names (Interleaved1F1B, ZBVZeroBubble, ...) accepted")
    p.add_argument("--top", type=_positive("--top"), default=5, help="alternatives to show")
    p.add_argument("--json", action="store_true", help="print the plan JSON")
    p.add_argument("--out", help="write the plan JSON to this file")
    p.add_argument("--profile", help="measured profile JSON (python -m profiler)")
    p.add_argument("--engine", choices=tuple(ENGINES),
                   help=f"the training stack that will run the plan: searched within what it "
                        f"can run, priced as it runs (default: {DEFAULT_ENGINE}; --export E "
                        f"implies --engine E)")
    p.add_argument("--attention", choices=("flash", "eager"), default="flash",
                   help="attention kernel: flash (default) or eager (materialised scores)")
    p.add_argument("--precision", choices=PRECISIONS + (AUTO,), default=DEFAULT_PRECISION,
                   help="what the block linears (QKV, out-proj, MLP) run in; attention, "
                        "embedding, head and norms stay bf16 (default: bf16; 'auto': the "
                        "fastest format the engine and GPU run, chosen and said so)")
    p.add_argument("--recipe", choices=RECIPES,
                   help="the engine's scaling recipe for a low --precision (default: the "
                        "engine's: megatron tensorwise, torchtitan tensorwise, fsdp delayed)")
    p.add_argument("--compile", action="store_true",
                   help="run the model and loss under torch.compile (torchtitan [compile]): "
                        "priced with fused element-wise kernels (default: eager)")
    p.add_argument("--no-tp-comm-overlap", dest="tp_comm_overlap", action="store_false",
                   help="price and export the TP collectives exposed (default: overlapped with "
                        "the GEMMs where the engine offers it, Megatron-Core --tp-comm-overlap)")
    p.add_argument("--moe-dispatcher", choices=DISPATCHERS,
                   help="MoE token dispatcher (default: the cheapest the engine has; Megatron: "
                        "alltoall, allgather, or flex, DeepEP's node-deduplicated dispatch)")
    p.add_argument("--moe-capacity-factor", type=float, metavar="F",
                   help="drop MoE tokens beyond F x each expert's balanced share and pad every "
                        "expert to it (default: dropless; Megatron "
                        "--moe-expert-capacity-factor --moe-pad-expert-input-to-capacity)")
    p.add_argument("--moe-imbalance", type=float, default=1.0, metavar="F",
                   help="MoE routing imbalance to price: the busiest expert rank gets F x its "
                        "balanced share of tokens, in time and memory (default 1: balanced, as "
                        "benchmarks force it; a real dropless run is less even)")
    p.add_argument("--no-ep-comm-overlap", dest="ep_comm_overlap", action="store_false",
                   help="price and export the EP all-to-alls exposed (default: overlapped "
                        "across micro-batches where the engine offers it and the layout "
                        "allows, Megatron-Core --overlap-moe-expert-parallel-comm)")
    p.add_argument("--offload-optimizer", choices=OFFLOAD_DEVICES,
                   help="keep the optimizer states and fp32 master weights in host memory "
                        "(cpu) or on the nodes' NVMe, the optimizer step on the CPU "
                        "(ZeRO-Offload; Megatron --optimizer-cpu-offload) (default: none, "
                        "searched among the engine's when nothing fits without)")
    p.add_argument("--offload-params", choices=OFFLOAD_DEVICES,
                   help="keep the ZeRO-3 parameter shards in host memory (cpu) or on NVMe "
                        "(ZeRO-Infinity, DeepSpeed) (default: as --offload-optimizer)")
    p.add_argument("--dp-shard", type=_positive("--dp-shard"), metavar="S",
                   help="hybrid sharding (HSDP): ZeRO shards over groups of S data-parallel "
                        "ranks, replicated across dp / S groups (torchtitan "
                        "data_parallel_shard_degree, DeepSpeed MiCS, Megatron "
                        "--num-distributed-optimizer-instances) (default: searched, the "
                        "ranks of one node)")
    p.add_argument("--zeropp", dest="zeropp", action="store_true", default=None,
                   help="ZeRO++ under ZeRO-3 (DeepSpeed): int8 weight all-gathers, the node's "
                        "secondary weight partition for backward, int4 gradients (default: "
                        "searched where the engine has it)")
    p.add_argument("--no-zeropp", dest="zeropp", action="store_false",
                   help="no ZeRO++")
    p.add_argument("--memory-margin", type=_non_negative_gib, metavar="GIB",
                   help="GiB per GPU kept free beside what the plan needs "
                        "(default: 3%% of the GPU's memory)")
    p.add_argument("--export", choices=EXPORT_FORMATS,
                   help="print the engine's configuration (plans for that engine)")
    p.add_argument("--plot", help="write the schedule and memory picture (PNG)")
    return p


def _fixed(a, engine=None) -> Fixed:
    vpp = a.vpp
    schedule = a.schedule
    if vpp and vpp > 1 and schedule is None:
        schedule = "interleaved"
    pp = a.pp if a.pp is not None or a.stage_layers is None else len(a.stage_layers)
    recompute = a.recompute or ("selective" if a.recompute_modules else None)
    if engine is not None and not a.recompute_modules:
        recompute = engine.native_recompute(recompute)   # torchtitan's "selective" is "op"
    return Fixed(tp=a.tp, pp=pp, dp=a.dp, zero=a.zero, mbs=a.micro_batch, vpp=vpp,
                 recompute=recompute, recompute_modules=a.recompute_modules, sp=a.sp,
                 schedule=schedule,
                 flash=a.attention == "flash", precision=a.precision, recipe=a.recipe,
                 ep=a.ep, etp=a.etp, cp=a.cp, cp_comm_type=a.cp_comm_type,
                 tp_comm_overlap=a.tp_comm_overlap, moe_dispatcher=a.moe_dispatcher,
                 ep_comm_overlap=a.ep_comm_overlap, moe_capacity_factor=a.moe_capacity_factor,
                 moe_imbalance=a.moe_imbalance, stage_layers=a.stage_layers,
                 offload_optimizer=a.offload_optimizer, offload_params=a.offload_params,
                 dp_shard=a.dp_shard, zeropp=a.zeropp, compile=a.compile)


def _engine_of(a):
    """--engine, or the --export target's engine; they must agree."""
    if a.export and a.engine and a.export != a.engine:
        raise BadInput(f"--export {a.export} runs on {a.export}, but --engine is {a.engine}: "
                       f"an export carries exactly the plan priced for its engine")
    return get_engine(a.export or a.engine)


class SearchProgress:
    """The `progress` callback of search(): a transient rich bar on stderr, only when stderr is
    a terminal (never on stdout, so --json and --export output stay clean)."""

    def __init__(self, label: str, stream=None):
        self.stream = sys.stderr if stream is None else stream
        self.enabled = _isatty(self.stream)
        self.label = label
        self._bar = self._task = None

    def __enter__(self):
        if self.enabled:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn,
                                       TextColumn, TimeElapsedColumn)
            self._bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), transient=True,
                                 console=Console(file=self.stream, force_terminal=True))
            self._task = self._bar.add_task(self.label, total=None)
            self._bar.start()
        return self

    def __call__(self, done: int, total: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=done, total=total,
                             description=f"{self.label}: solving candidates")

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.stop()
        return False


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _diagnose_no_configuration(model, cluster, fixed, seq_len, global_batch, engine) -> None:
    """Raise a precise BadInput when no configuration matches the fixed choices."""
    from planner.suggest import diagnose_no_configuration
    nc = diagnose_no_configuration(model, cluster, fixed, seq_len, global_batch, engine)
    if nc is not None:
        raise BadInput(no_configuration_message(model, nc)) from None


def _load_profile(path):
    if not path:
        return None
    from planner.profile import load_profile
    return load_profile(path)


def suggestion_text(s) -> str:
    """A would-fit tip in words (planner.suggest.Suggestion)."""
    plan = describe_candidate(s.best.candidate)
    if s.change == "recompute":
        return f"--recompute full ({plan})"
    if s.change == "zero":
        return f"ZeRO-{s.best.candidate.zero} ({plan})"
    if s.change == "layout":
        return f"another layout: {plan}"
    fewest = "the fewest that fit" if s.minimal else "the fewest found"
    return (f"{s.num_gpus} GPUs, {fewest} in whole hosts of {s.gpus_per_node} ({plan}, step "
            f"{s.step_time_s:.2f} s, global batch {s.global_batch})")


def closest_text(c) -> str:
    """The closest plan that does not fit, in words: its most overflowing stage, and where that
    overflow lies inside the margin kept free, the margin that would accept it (the margin
    covers the planner's measured under-counts: planner.cost.stage DEFAULT_MARGIN_FRACTION)."""
    e = c.estimate
    over = e.overflow_gib()
    k = max(range(len(over)), key=lambda i: over[i])
    caps = e.stage_capacity_gib or [e.capacity_gib] * len(over)
    margin = (e.stage_margin_gib or [e.margin_gib] * len(over))[k]
    text = (f"closest: {describe_candidate(c.candidate)} overflows stage {k} by "
            f"{over[k]:.1f} GiB ({e.stage_memory_gib[k]['needed']:.1f} needed of {caps[k]:.1f} "
            "GiB)")
    # GiB, rounded down to show (less a hair, so that a float at the boundary still accepts)
    accepting = math.floor((margin - over[k] - 1e-6) * 10) / 10
    host_fits = e.host is None or e.host.fits
    if 0 < over[k] and accepting >= 0 and host_fits and not e.stage_margin_gib:
        text += (f", inside the {margin:.1f} GiB margin kept free for what the model may "
                 f"under-count (--memory-margin {accepting:.1f} accepts it)")
    return text


def _nothing_fits_message(model, cluster, fixed, report) -> str:
    from planner.suggest import suggestions
    msg = f"nothing fits {model.name} on {cluster.name} under {report.engine.name}"
    if report.closest is not None:
        msg += "; " + closest_text(report.closest)
    tips = suggestions(model, cluster, fixed, report.seq_len, report.global_batch,
                       report.engine, report.margin_gib)
    if tips:
        msg += "; would fit: " + "; ".join(suggestion_text(t) for t in tips)
    return msg


def _check_margin(margin_gib, cluster, engine) -> None:
    """A --memory-margin that leaves a GPU of the cluster no memory for the plan (its memory
    less the engine's context, planner.cost.stage.MemoryBudget) is bad input, not a search
    where nothing fits."""
    if margin_gib is None:
        return
    for group in (cluster.groups if isinstance(cluster, MixedCluster) else (cluster,)):
        budget = memory_budget(group, engine, margin_gib)
        if budget.usable_gib <= 0:
            left = budget.memory_gib - budget.context_gib
            raise BadInput(f"--memory-margin {margin_gib:g} GiB leaves no memory for the plan on "
                           f"{group.gpu.name}: its {budget.memory_gib:g} GiB less {engine.name}'s "
                           f"{budget.context_gib:g} GiB context leave {left:.1f} GiB; give a "
                           f"margin below {left:.1f}")


def run_plan(argv) -> int:
    a = plan_parser().parse_args(argv)
    _check_plot_path(a)
    model = get_model(a.model)
    cluster = get_cluster(a.cluster)
    profile = _load_profile(a.profile)
    if profile is not None and a.engine is None and a.export is None:
        a.engine = "runtime"           # a profile measures our runtime
    engine = _engine_of(a)
    if profile is not None:
        if engine.name != "runtime":
            raise BadInput(f"--profile measures our runtime; it cannot price {engine.name}")
        from planner.profile import apply_profile
        cluster, engine, model_notes = apply_profile(profile, cluster, model)
    if a.precision == AUTO and a.recipe:
        raise BadInput("--recipe names the recipe of a fixed --precision; --precision auto "
                       "tries every recipe the engine offers")
    _check_margin(a.memory_margin, cluster, engine)
    fixed = _fixed(a, engine)
    if isinstance(cluster, MixedCluster):
        return _run_mixed(a, model, cluster, engine, fixed, profile)
    with SearchProgress(f"planning {model.name} on {cluster.name}") as progress:
        try:
            # the rejected layouts are only for the text output's Alternatives table
            kw = dict(top=a.top, progress=progress, margin_gib=a.memory_margin,
                      rejected=not (a.json or a.export))
            choice = None
            if a.precision == AUTO:   # the fastest format, chosen (planner.precision_choice)
                chosen, results = search_formats(model, cluster, fixed, a.seq_len,
                                                 a.global_batch, engine, **kw)
                report, choice = chosen.report, choice_record(chosen, results)
                fixed = dataclasses.replace(fixed, precision=chosen.precision,
                                            recipe=chosen.recipe)
            else:
                report = search(model, cluster, fixed, a.seq_len, a.global_batch,
                                engine=engine, **kw)
        except BadInput:
            if fixed.precision != AUTO:
                _diagnose_no_configuration(model, cluster, fixed, a.seq_len, a.global_batch,
                                           engine)
            raise
    best = report.best
    what_if = report.candidates == 1
    if best is None:
        if what_if and report.closest is not None:
            plan = to_plan(model, cluster, report.closest, report)
            _emit(a, plan, [])
        raise NothingFits(_nothing_fits_message(model, cluster, fixed, report))
    plan = to_plan(model, cluster, best, report)
    if choice is not None:
        plan.search["precision_choice"] = choice
    if profile is not None:
        plan.search["profile"] = a.profile
        plan.search["profile_used"] = model_notes
    alts = [] if (a.json or a.export) else alternatives(model, cluster, report, best, fixed)
    _emit(a, plan, alts)
    return 0


def _run_mixed(a, model, cluster, engine, fixed, profile) -> int:
    """`plan` on a cluster of GPU groups (planner.search.groups): the best pipeline over the
    groups, or the best single group's plan when mixing does not pay (search.mixing says)."""
    from planner.search.groups import search_mixed
    if profile is not None or a.precision == AUTO:
        raise BadInput(f"{'--profile' if profile is not None else '--precision auto'} is not "
                       f"planned on a mixed cluster yet; plan each group alone")
    report = search_mixed(model, cluster, fixed, a.seq_len, a.global_batch, top=a.top,
                          engine=engine, margin_gib=a.memory_margin)
    best = report.best
    if best is None:
        msg = (f"nothing fits {model.name} on {cluster.name} under {engine.name}: no pipeline "
               f"over its groups nor any group alone")
        closest, where = report.closest, ""
        if closest is None:
            # no pipeline over the groups was priced (their model states fit no placement):
            # the closest of a group alone or of every GPU as the slowest, the one that
            # overflows least
            tried = [a for a in (*report.alone, report.slowest)
                     if a is not None and a.report is not None and a.report.closest is not None]
            if tried:
                least = min(tried, key=lambda a: max(a.report.closest.estimate.overflow_gib()))
                closest = least.report.closest
                where = least.name + (", " if least is report.slowest else " alone, ")
        if closest is not None:
            msg += f"; {where}" + closest_text(closest)
        raise NothingFits(msg)
    if report.chosen == "mixed":
        plan = to_plan(model, best.cluster, best, report)
    else:
        alone = next(x for x in report.alone if x.name == report.chosen)
        plan = to_plan(model, alone.cluster, best, alone.report)
    plan.search["mixing"] = report.mixing_record()
    _emit(a, plan, [])
    return 0


def output_width() -> int:
    """Columns of the text report: $COLUMNS where set (at least 60), else 120."""
    import os
    try:
        return max(60, int(os.environ["COLUMNS"]))
    except (KeyError, ValueError):
        return 120


def _check_plot_path(a) -> None:
    if getattr(a, "plot", None):
        from planner.plot import check_path
        check_path(a.plot)              # a bad --plot path fails before searching or writing


def _emit(a, plan: Plan, alts) -> None:
    _check_plot_path(a)
    if a.out:
        try:
            plan.save(a.out)
        except OSError as e:
            raise BadInput(f"--out {a.out}: {e.strerror}") from None
    if getattr(a, "plot", None):
        from planner.plot import plot_plan
        plot_plan(plan, a.plot)
    if a.json:
        print(plan.to_json())
    elif getattr(a, "export", None):
        from planner.export import export
        print(export(plan, a.export))
    else:
        print(render(plan, alts, width=output_width()), end="")
        if a.out:
            print(f"plan written to {a.out}")


def run_show(argv) -> int:
    p = _Parser(prog="plan show", description="Explain or export a saved plan.")
    p.add_argument("plan", help="a plan JSON (plan ... --out FILE)")
    p.add_argument("--export", choices=EXPORT_FORMATS,
                   help="the plan's own engine (plan with --engine E to export to E)")
    p.add_argument("--json", action="store_true", help="print the plan JSON")
    p.add_argument("--plot", help="write the schedule and memory picture (PNG)")
    a = p.parse_args(argv)
    _check_plot_path(a)
    plan = ensure_estimate(Plan.load(a.plan, whole_cluster=True))
    a.out = None
    _emit(a, plan, [])
    return 0


def run_launch(argv) -> int:
    p = _Parser(prog="plan launch", description="torchrun command lines for a saved plan.")
    p.add_argument("plan", help="a plan JSON (plan ... --engine runtime --out FILE)")
    p.add_argument("--nnodes", type=_positive("--nnodes"), required=True,
                   help="hosts to launch on")
    p.add_argument("--slurm", action="store_true", help="write a SLURM batch script instead")
    a = p.parse_args(argv)
    plan = Plan.load(a.plan)
    from planner.launch import launch_commands
    print(launch_commands(plan, a.plan, a.nnodes, slurm=a.slurm))
    return 0


def run_sweep(argv) -> int:
    from planner.sweep import run_sweep_cli
    return run_sweep_cli(argv, _Parser)


def run_models(argv) -> int:
    _Parser(prog="plan models", description="The catalog's models: total and active "
                                            "parameters.").parse_args(argv)
    from planner.catalog import model_table
    print(model_table(), end="")
    return 0


COMMANDS = {"show": run_show, "launch": run_launch, "sweep": run_sweep, "models": run_models}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in COMMANDS:
            return COMMANDS[argv[0]](argv[1:])
        return run_plan(argv)
    except PlannerError as e:
        print(f"plan: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("plan: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
