"""Helpers the exporters share: what a plan says, in the shapes the engines ask for."""
from __future__ import annotations

from planner.engines import get_engine
from planner.errors import BadInput
from planner.explain import recompute_label
from planner.plan import Plan
from planner.rules import runner_problems


def check_exportable(plan: Plan, engine: str) -> None:
    """BadInput naming the one rule (planner.rules.runner_problems: the engine the plan was
    priced for, then what `engine` runs) that stops `engine` from running the plan exactly as
    priced; Plan.validate first (every plan rule, its precision on its GPU included)."""
    plan.validate()
    bad = runner_problems(plan, get_engine(engine))
    if bad:
        raise BadInput(f"cannot export to {engine} exactly: {bad[0].line}")


def header(plan: Plan, engine: str) -> list:
    """Opening comment lines (without the comment marker) naming the plan."""
    p, b = plan.parallelism, plan.batch
    return [
        f"{engine} settings exported by the parallelism planner from plan "
        f"'{plan.model.name}' on '{plan.cluster.name}'",
        f"tp={p.tp} pp={p.pp} dp={p.dp} "
        + (f"cp={p.cp} cp_comm={p.cp_comm_type} " if p.cp > 1 else "")
        + f"vpp={p.vpp} schedule={p.schedule} "
        f"zero={p.zero_stage} sp={str(p.sequence_parallel).lower()} "
        f"recompute={recompute_label(p.recompute, p.recompute_modules)}; "
        f"seq_len={b.seq_len} global_batch={b.global_batch_size} "
        f"micro_batch={b.micro_batch_size} microbatches={b.num_microbatches}; "
        f"precision={plan.precision}" + (f" recipe={plan.recipe}" if plan.recipe else "")
        + ("; torch.compile" if plan.compile else ""),
    ] + mixed_launch_note(plan)


def mixed_launch_note(plan: Plan) -> list:
    """On a mixed cluster: which hosts each group's pipeline ranks need (pp is the outermost
    rank dimension, so node ranks follow the pipeline's groups)."""
    cl, p = plan.cluster, plan.parallelism
    if not getattr(cl, "pipeline", None):
        return []
    per_rank = p.tp * p.cp * p.dp
    parts = [f"pipeline ranks {first}-{last} (global ranks {first * per_rank}-"
             f"{(last + 1) * per_rank - 1}) on group {cl.groups[g].name} ({cl.groups[g].gpu.name})"
             for g, first, last in cl.segments()]
    return ["mixed cluster: " + "; ".join(parts) + ": launch each group's hosts at those "
            "node ranks"]


def stage_layers(plan: Plan) -> list:
    """Decoder layers of each virtual stage, in model order."""
    return [s.num_layers for s in plan.stages]


def rank_layers(plan: Plan) -> list:
    """Decoder layers held by each pipeline rank (all its chunks)."""
    return plan.layer_counts()


def recompute_active(plan: Plan) -> bool:
    """True when some layer is recomputed."""
    return plan.parallelism.recompute != "none" and any(s.recompute_layers for s in plan.stages)


def uses_bf16(plan: Plan) -> bool:
    """The planner costs GPUs in bf16; its CPU entry is costed in fp32."""
    return plan.cluster.gpu.name != "cpu"


def fmt_list(xs) -> str:
    return "[" + ", ".join(str(x) for x in xs) + "]"
