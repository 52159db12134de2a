"""Can an engine run a plan exactly as it was priced? One home for that rule.

The search only emits what `Engine` allows (planner.search reads the same predicates), the
exporters refuse a plan with any problem listed here, and `plan show --export` says why.
What no engine can run (divisibility, positions, chunks without pipelining) is
planner.validity's, checked first by Plan.validate.
"""
from __future__ import annotations

from planner.engines.spec import ALL_OR_NONE, EQUAL_SPLIT, PER_CHUNK, Engine


def problems(plan, engine: Engine) -> list:
    """What of `plan` the engine cannot run as priced (empty: it runs it exactly)."""
    p, out = plan.parallelism, []
    e = engine.name
    if plan.engine != engine.name:
        out.append(f"the plan was priced for {plan.engine}, not {e} (plan with --engine {e})")
    offered = dict(engine.precisions)
    if plan.precision not in offered:
        out.append(f"{e} does not run {plan.precision} (it runs: "
                   f"{', '.join(p_ for p_, _ in engine.precisions)})")
    elif plan.recipe is not None and plan.recipe not in offered[plan.precision]:
        out.append(f"{e} has no {plan.recipe} recipe for {plan.precision}")
    if plan.model.is_moe and not engine.moe_dispatchers:
        out.append(f"{e} runs no mixture-of-experts layers as the planner prices them")
    elif plan.model.is_moe and not engine.ep_layout_ok(p.ep, p.etp, p.tp, p.zero_stage):
        out.append(f"{e} cannot lay out ep={p.ep} etp={p.etp} with tp={p.tp} and "
                   f"ZeRO-{p.zero_stage}")
    if engine.model_features is not None:
        for key, phrase in plan.model.attention_feature_map().items():
            if key not in engine.model_features:
                out.append(f"{e}'s export cannot write the model's {phrase}")
    if p.tp > 1 and engine.max_tp == 1:
        out.append(f"{e} has no tensor parallelism (tp={p.tp})")
    if p.tp > 1 and p.sequence_parallel not in engine.sp_choices:
        out.append(f"{e} {'always' if engine.sp_choices == (True,) else 'never'} shards the "
                   f"sequence under tensor parallelism")
    if p.pp > 1:
        if not engine.pipelines:
            out.append(f"{e} has no pipeline parallelism (pp={p.pp})")
        elif p.schedule not in engine.schedules:
            out.append(f"{e} has no {p.schedule} schedule")
    if plan.model.is_moe and p.moe_dispatcher and engine.moe_dispatchers \
            and p.moe_dispatcher not in engine.moe_dispatchers:
        out.append(f"{e} has no {p.moe_dispatcher} token dispatcher (it has: "
                   f"{', '.join(engine.moe_dispatchers)})")
    if p.moe_capacity_factor is not None and not engine.moe_capacity_factor:
        out.append(f"{e} runs MoE layers dropless only (the plan drops tokens at capacity "
                   f"factor {p.moe_capacity_factor:g})")
    if p.ep_comm_overlap and not engine.ep_comm_overlap:
        out.append(f"{e} does not overlap the EP all-to-alls across micro-batches (plan with "
                   f"--no-ep-comm-overlap)")
    if p.tp_comm_overlap and not engine.tp_comm_overlap:
        out.append(f"{e} does not overlap TP communication with the GEMMs (plan with "
                   f"--no-tp-comm-overlap)")
    if p.cp > 1 and not engine.cp_comm_types:
        out.append(f"{e} has no context parallelism (cp={p.cp})")
    elif p.cp > 1 and p.cp_comm_type not in engine.cp_comm_types:
        out.append(f"{e} has no {p.cp_comm_type} context-parallel exchange (it has: "
                   f"{', '.join(engine.cp_comm_types)})")
    if not engine.zero_ok(p.zero_stage, p.tp, p.pp, p.dp, p.cp):
        out.append(f"{e} has no ZeRO-{p.zero_stage} with tp={p.tp} pp={p.pp} dp={p.dp}"
                   + (f" cp={p.cp}" if p.cp > 1 else ""))
    if engine.stage_layers == EQUAL_SPLIT and len(set(plan.layer_counts())) > 1:
        out.append(f"{e} splits the layers evenly; the plan holds {plan.layer_counts()} per rank")
    rec = [s.recompute_layers for s in plan.stages]
    if any(rec):
        if p.recompute not in engine.recompute_modes:
            out.append(f"{e} has no {p.recompute} recompute")
        elif p.recompute == "selective" and not set(p.recompute_modules) <= set(
                engine.recompute_modules):
            out.append(f"{e} recomputes only {', '.join(engine.recompute_modules)} "
                       f"selectively; the plan asks for {', '.join(p.recompute_modules)}")
        else:
            rule = engine.recompute_count(p.recompute)
            sizes = [s.num_layers for s in plan.stages]
            if rule == ALL_OR_NONE and rec != sizes:
                out.append(f"{e} recomputes every layer or none; the plan recomputes {rec} of "
                           f"{sizes} per stage")
            elif rule == PER_CHUNK and rec != [min(max(rec), n) for n in sizes]:
                out.append(f"{e} recomputes the same number of leading layers in every model "
                           f"chunk; the plan recomputes {rec} of {sizes}")
    return out


def per_chunk_recompute(plan) -> int:
    """The one count per model chunk of a plan whose stages recompute min(count, layers)."""
    return max((s.recompute_layers for s in plan.stages), default=0)
