"""The rules for the values fixed on the command line, worded for their flags.

`fixed_problems` yields, in order, the Problems (planner.problem) of the fixed values that can
never work: each rule is planner.rules's (or planner.precision's) predicate, asked of the
flags; only the flags' own rules (a positive --tp, --recompute-modules with --recompute
selective) live here. `check_fixed` raises the first as one line (exit 2); the search calls it
before it enumerates anything, and writes no message of its own.
"""
from __future__ import annotations

import math

from planner import rules as V
from planner.cost.context import CP_COMM_TYPES
from planner.cost.moe import PADDED_DISPATCHERS
from planner.engines import get_engine
from planner.errors import BadInput
from planner.precision import precision_problem
from planner.vocab import MULTI_CHUNK_SCHEDULES, V_SCHEDULES, ZERO_BUBBLE_SCHEDULES
from planner.problem import Problem


def _p(rule: str, knobs: tuple, message: str, source: str = "", fix: str = "") -> Problem:
    return Problem(rule, knobs, message, source, fix)


def offload_fixed_problems(model, cluster, engine, f):
    """The fixed offload (--offload-optimizer, --offload-params, --recompute offload) the
    engine cannot run here."""
    if f.recompute == "offload" and f.recompute in engine.recompute_modes:
        problem = V.activation_offload_problem(engine, cluster, f.pp or 1)
        if problem:
            yield V.cited(problem, engine)
    if f.offload_optimizer is None and f.offload_params is None:
        return
    problem = V.offload_problem(engine, cluster, f.offload_optimizer or "none",
                                f.offload_params or "none", f.zero, model,
                                f.dp * (f.cp or 1) if f.dp else None)
    if problem:
        yield V.cited(problem, engine)


def hsdp_fixed_problems(model, engine, f):
    """A fixed --dp-shard the engine cannot run (with --dp: one that does not divide it)."""
    if not f.dp_shard:
        return
    dp, cp = (f.dp, f.cp or 1) if f.dp else (f.dp_shard * 2, 1)   # dp unknown: any multiple
    problem = V.hsdp_problem(engine, f.dp_shard, dp, cp, f.zero, model)
    if problem:
        yield V.cited(problem, engine)


def engine_fixed_problems(engine, f):
    """The fixed values the engine cannot run at all (Problems, in order)."""
    e = engine.name
    if f.tp and f.tp > 1 and engine.max_tp == 1:
        yield _p("engine_tp", ("tp",), f"engine {e} has no tensor parallelism (--tp {f.tp})")
    if f.pp and f.pp > 1 and not engine.pipelines:
        yield _p("engine_pp", ("pp",), f"engine {e} has no pipeline parallelism (--pp {f.pp})")
    if f.schedule and f.schedule not in engine.schedules and (f.pp or 2) > 1:
        yield _p("engine_schedule", ("schedule",),
                 f"engine {e} has no {f.schedule} schedule (it has: "
                 f"{', '.join(engine.schedules) or 'no pipelining'})",
                 engine.source_of("schedule"))
    if (f.schedule in ZERO_BUBBLE_SCHEDULES and f.zero is not None
            and engine.zero_bubble_zero_stages is not None
            and f.zero not in engine.zero_bubble_zero_stages):
        yield _p("zero_bubble_zero", ("schedule", "zero"),
                 f"engine {e} runs --schedule {f.schedule} with ZeRO "
                 f"{'/'.join(map(str, engine.zero_bubble_zero_stages))} only, not --zero {f.zero}",
                 engine.source_of("zero_bubble_zero"))
    if f.zero is not None and f.zero not in engine.zero_stages + engine.zero_stages_with_pp:
        yield _p("zero_stage", ("zero",), f"engine {e} has no ZeRO-{f.zero} (it has: "
                 f"{', '.join(map(str, sorted(set(engine.zero_stages))))})")
    if f.recompute not in (None, "none") and f.recompute not in engine.recompute_modes:
        yield _p("engine_recompute", ("recompute",),
                 f"engine {e} has no {f.recompute} recompute (it has: "
                 f"{', '.join(engine.recompute_modes)})")
    if f.recompute_modules:
        if f.recompute != "selective":
            yield _p("recompute_modules_need_selective", ("recompute_modules", "recompute"),
                     f"--recompute-modules needs --recompute selective, not "
                     f"{f.recompute or 'a searched one'}")
        unknown = [x for x in f.recompute_modules if x not in engine.recompute_modules]
        if unknown:
            yield _p("engine_recompute_modules", ("recompute_modules",),
                     f"engine {e} does not recompute {', '.join(unknown)} selectively "
                     f"(it recomputes: {', '.join(engine.recompute_modules)})")
    if f.sp is not None and (f.tp or 2) > 1 and f.sp not in engine.sp_choices:
        yield _p("engine_sp", ("sequence_parallel",),
                 f"engine {e} {'always' if engine.sp_choices == (True,) else 'never'} "
                 f"uses sequence parallelism with tp > 1")


def check_engine(engine, f) -> None:
    """Exit-2 errors for fixed values the engine cannot run."""
    for problem in engine_fixed_problems(engine, f):
        raise BadInput(problem.line)


def _known_pp(cluster, f, engine):
    """The pipeline degree the fixed values leave: --pp, or what tp, dp (and cp) leave of the
    cluster's GPUs when those are fixed (None: searched)."""
    if f.pp is not None:
        return f.pp
    cp = f.cp if f.cp is not None else (None if engine.cp_comm_types else 1)
    if None in (f.tp, f.dp, cp):
        return None
    rest = f.tp * f.dp * cp
    return cluster.num_gpus // rest if rest and cluster.num_gpus % rest == 0 else None


def fixed_problems(model, cluster, f, seq_len: int, gbs: int, engine=None):
    """The Problems of the fixed values (planner.search.Fixed) that can never work, in the
    order they are checked (a later check may assume an earlier one passed), each with the
    engine source that refuses it (planner.rules.cited)."""
    eng = get_engine(engine)
    for problem in _fixed_problems(model, cluster, f, seq_len, gbs, eng):
        yield V.cited(problem, eng)


def _fixed_problems(model, cluster, f, seq_len: int, gbs: int, eng):
    if f.moe_imbalance != 1.0:
        if not (f.moe_imbalance >= 1.0 and math.isfinite(f.moe_imbalance)):
            yield _p("moe_imbalance", ("moe_imbalance",),
                     f"--moe-imbalance must be at least 1 (the busiest expert rank's "
                     f"tokens over its balanced share), got {f.moe_imbalance}")
        if not model.is_moe:
            yield _p("moe_imbalance_needs_moe", ("moe_imbalance",),
                     f"model {model.name} has no experts (--moe-imbalance needs an MoE model)")
    if f.moe_capacity_factor is not None:
        if not (f.moe_capacity_factor > 0 and math.isfinite(f.moe_capacity_factor)):
            yield _p("capacity_positive", ("moe_capacity_factor",),
                     f"--moe-capacity-factor must be positive, got {f.moe_capacity_factor}")
        if not model.is_moe:
            yield _p("capacity_needs_moe", ("moe_capacity_factor",),
                     f"model {model.name} has no experts (--moe-capacity-factor needs an "
                     f"MoE model)")
        if not eng.moe_capacity_factor:
            yield _p("engine_capacity_factor", ("moe_capacity_factor",),
                     f"engine {eng.name} runs MoE layers dropless only (--moe-capacity-factor)")
        if f.moe_dispatcher and f.moe_dispatcher not in PADDED_DISPATCHERS:
            yield _p("capacity_dispatcher", ("moe_capacity_factor", "moe_dispatcher"),
                     f"token dropping pads experts on the {', '.join(PADDED_DISPATCHERS)} "
                     f"dispatcher only, not {f.moe_dispatcher}")
    if f.moe_dispatcher == "flex" and f.ep == 1 and (f.etp or 1) == 1:
        yield _p("flex_needs_ep", ("moe_dispatcher", "ep", "etp"),
                 "the flex dispatcher needs ep x etp > 1 (Megatron's "
                 "MoEFlexTokenDispatcher); drop --ep 1 or --moe-dispatcher flex",
                 "megatron/core/transformer/moe/token_dispatcher.py")
    if f.moe_dispatcher and model.is_moe and f.moe_dispatcher not in eng.moe_dispatchers:
        yield _p("engine_dispatcher", ("moe_dispatcher",),
                 f"engine {eng.name} has no {f.moe_dispatcher} token dispatcher (it has: "
                 f"{', '.join(eng.moe_dispatchers) or 'none'})")
    if model.is_moe and not eng.moe_dispatchers:
        yield _p("engine_moe", ("model",),
                 f"engine {eng.name} runs no mixture-of-experts layers as the planner "
                 f"prices them (model {model.name}: {model.num_experts} experts); "
                 f"use --engine megatron or torchtitan")
    if not model.is_moe and ((f.ep or 1) > 1 or (f.etp or 1) > 1):
        yield _p("ep_needs_moe", ("ep", "etp"),
                 f"--ep/--etp need a mixture-of-experts model ({model.name} is dense)")
    if model.is_moe:
        for name in ("ep", "etp"):
            v = getattr(f, name)
            if v is not None and v < 1:
                yield _p("positive", (name,), f"--{name} must be positive, got {v}")
        if f.ep is not None and model.num_experts % f.ep:
            yield _p("ep_split", ("ep",),
                     f"--ep {f.ep} does not divide the model's {model.num_experts} experts")
        if f.etp is not None and model.moe_ffn_hidden % f.etp:
            yield _p("ep_split", ("etp",),
                     f"--etp {f.etp} does not divide the expert FFN ({model.moe_ffn_hidden})")
    yield from engine_fixed_problems(eng, f)
    yield from offload_fixed_problems(model, cluster, eng, f)
    yield from hsdp_fixed_problems(model, eng, f)
    if f.zeropp:
        problem = V.zeropp_problem(eng, f.zero, f.dp_shard or 0)
        if problem:
            yield V.cited(problem, eng)
    problem = precision_problem(eng, cluster.gpu, f.precision, f.recipe, flags=True)
    if problem:
        yield problem
    problem = V.compile_problem(eng, f.compile)
    if problem:
        yield V.cited(problem, eng)
    problem = V.model_part_problem(eng, model)
    if problem:
        mtp = model.mtp_layers and "mtp" in eng.model_lacks
        yield _p(problem.rule, problem.knobs, problem.message, problem.source,
                 "plan it with --engine megatron, which builds it" if mtp else
                 f"plan it with another --engine than {eng.name}")
    n = cluster.num_gpus
    if f.cp is not None and f.cp > 1 and not eng.cp_comm_types:
        yield _p("engine_cp", ("cp",),
                 f"engine {eng.name} has no context parallelism (--cp {f.cp})",
                 eng.source_of("cp"))
    if f.cp_comm_type is not None:
        if f.cp_comm_type not in CP_COMM_TYPES:
            yield _p("cp_comm_known", ("cp_comm_type",),
                     f"--cp-comm-type must be one of {', '.join(CP_COMM_TYPES)}, got "
                     f"{f.cp_comm_type}")
        if f.cp_comm_type not in eng.cp_comm_types:
            yield _p("engine_cp_comm", ("cp_comm_type",),
                     f"engine {eng.name} has no {f.cp_comm_type} context-parallel exchange "
                     f"(it has: {', '.join(eng.cp_comm_types) or 'no CP'})")
    for name in ("tp", "pp", "dp", "mbs", "vpp", "cp"):
        v = getattr(f, name)
        if v is not None and v < 1:
            yield _p("positive", (name,),
                     f"--{name.replace('mbs', 'micro-batch')} must be positive, got {v}")
    if seq_len < 1 or gbs < 1:
        yield _p("positive", ("seq_len", "global_batch"),
                 "--seq-len and --global-batch must be positive")
    if f.zero is not None and f.zero not in (0, 1, 2, 3):
        yield _p("zero_known", ("zero",), f"--zero must be 0, 1, 2 or 3, got {f.zero}")
    if f.cp is not None and f.cp > 1:
        problems = V.cp_problems(model, seq_len, f.tp or 1, f.cp, f.cp_comm_type or "p2p",
                                 f.flash)
        if problems:
            yield _p("cp_split", ("cp",), f"--cp {f.cp}: {problems[0]}",
                     "megatron/core/utils.py get_batch_on_this_cp_rank")
    for name in ("tp", "pp", "dp", "cp"):
        v = getattr(f, name)
        if v is not None and n % v:
            yield _p("divides_cluster", (name,), f"--{name} {v} does not divide the cluster's "
                                                 f"{n} GPUs")
    if f.tp is not None and not V.tp_ok(model, f.tp, engine=eng):
        yield _p("tp_splits_model", ("tp",), f"--tp {f.tp} does not divide the model's "
                 f"{V.and_list(V.tp_blockers(model, f.tp, engine=eng))}",
                 V.tp_split_source(eng, model, f.tp))
    if f.tp is not None and f.tp_comm_overlap and eng.tp_comm_overlap and (f.sp is not False) \
            and not V.tp_comm_overlap_fits(eng, cluster, f.tp, cluster.num_gpus):
        yield _p("tp_comm_overlap_in_domain", ("tp_comm_overlap", "tp"),
                 f"--tp {f.tp} groups span NVLink domains of {cluster.nvlink_domain} GPUs: "
                 f"{eng.name} runs them, but not with its TP communication overlap "
                 f"(it runs inside one domain)",
                 fix="plan with --no-tp-comm-overlap")
    if f.tp is not None and not eng.tp_runs(cluster, f.tp):
        yield _p("tp_in_domain", ("tp", "cluster"),
                 f"--tp {f.tp} would split tensor-parallel groups over nodes of "
                 f"{eng.tp_domain(cluster)} GPUs (tp must divide the GPUs per node)")
    if f.tp is not None:
        problem = V.mla_tp_problem(eng, model, f.tp)
        if problem:
            yield _p(problem.rule, problem.knobs, problem.message, problem.source,
                     "plan it with --tp 1")
        if model.is_moe and f.tp > 1 and f.sp is False and eng.moe_tp_needs_sp:
            yield _p("moe_tp_needs_sp", ("tp", "sequence_parallel"),
                     f"--tp {f.tp} with an MoE model needs sequence parallelism (as Megatron: "
                     f"\"sequence parallel must be used with MoE and tensor parallel\"); drop "
                     f"--no-sp", eng.source_of("moe_tp_needs_sp"))
    if f.pp is not None and not V.pp_ok(model, f.pp):
        yield _p("pp_layers", ("pp",), f"--pp {f.pp} exceeds the model's {model.num_layers} "
                                       f"layers")
    prod = 1
    for v in (f.tp, f.pp, f.dp, f.cp):
        prod *= v or 1
    name = "tp*cp*pp*dp" if (f.cp or 1) > 1 else "tp*pp*dp"
    if n % prod:
        yield _p("world_fits", ("tp", "pp", "dp", "cp"),
                 f"{name} = {prod} does not divide the cluster's {n} GPUs")
    if None not in (f.tp, f.pp, f.dp) and prod != n:
        rest = f.tp * f.pp * (f.cp or 1)
        yield _p("whole_cluster", ("tp", "pp", "dp", "cp"),
                 f"{name} = {prod} but the cluster has {n} GPUs; use them all "
                 f"(e.g. --dp {n // rest})" if n % rest == 0 else
                 f"{name} = {prod} but the cluster has {n} GPUs")
    pp = _known_pp(cluster, f, eng)
    how = "" if pp is None else (f"--pp {f.pp}" if f.pp is not None else
                                 f"pp {pp} (the GPUs --tp and --dp leave)")
    if f.zero is not None and pp is not None and pp > 1:
        problem = V.zero_under_pp_problem(eng, f.zero, f"--zero {f.zero} with {how}")
        if problem:
            yield problem
    if f.dp is not None and not V.batch_ok(gbs, f.dp):
        yield _p("batch_splits", ("global_batch", "dp"),
                 f"--global-batch {gbs} is not divisible by --dp {f.dp}")
    if f.mbs is not None and f.dp is not None and not V.batch_ok(gbs, f.dp, f.mbs):
        yield _p("batch_splits", ("global_batch", "dp", "mbs"),
                 f"--global-batch {gbs} is not divisible by dp*micro-batch = {f.dp * f.mbs}")
    if f.vpp is not None and f.vpp > 1:
        if f.schedule not in (None,) + MULTI_CHUNK_SCHEDULES:
            yield _p("vpp_needs_interleaved", ("vpp", "schedule"),
                     "--vpp > 1 needs --schedule " + " | ".join(MULTI_CHUNK_SCHEDULES))
        if f.pp is not None and not V.pp_ok(model, f.pp, f.vpp, eng):
            yield _p("pp_layers", ("pp", "vpp"), f"pp*vpp = {f.pp * f.vpp} exceeds the model's "
                                                 f"{model.num_layers} layers"
                     + ("" if not eng.end_chunks_may_be_empty else
                        " and its embedding and loss"))
    if f.schedule == "interleaved" and f.pp == 1:
        yield _p("interleaved_needs_pp", ("schedule", "pp"),
                 "--schedule interleaved needs --pp > 1")
    yield from _zero_bubble_fixed_problems(f, gbs)
    if f.stage_layers is not None:
        if f.pp is None:
            yield _p("stage_layers_need_pp", ("stage_layers", "pp"),
                     "--stage-layers needs --pp (one count per pipeline rank)")
        else:
            problems = V.split_blockers(model.num_layers, f.pp, f.vpp or 1, f.stage_layers,
                                        eng)
            if problems:
                yield _p("stage_layers", ("stage_layers",),
                         f"--stage-layers {','.join(map(str, f.stage_layers))}: "
                         f"{V.and_list(problems)}")
    # --sp with --tp 1 is not refused: Megatron disables sequence parallelism at tp 1 with a
    # warning (megatron/training/arguments.py: "Disabling sequence parallelism because tensor
    # model parallelism is disabled"), and the search plans tp 1 without it
    if f.sp and f.tp is not None and f.tp > 1 and not V.sp_ok(f.tp, seq_len, f.cp or 1):
        k = f.tp * (f.cp or 1)
        yield _p("sp_splits_sequence", ("sequence_parallel", "seq_len"),
                 f"--sp shards the sequence over --tp {f.tp}: --seq-len {seq_len} is not "
                 f"divisible by {k}")
    if not V.has_positions(model, seq_len):
        yield _p("positions", ("seq_len",),
                 f"--seq-len {seq_len} exceeds the model's {model.max_seq_len} "
                 f"{model.position} positions (max_seq_len)")


def _zero_bubble_fixed_problems(f, gbs: int):
    """--schedule interleaved-zb / zbv / dualpipev: what torch's schedule classes refuse
    (torch/distributed/pipelining/schedules.py), asked of the flags."""
    if f.schedule not in ZERO_BUBBLE_SCHEDULES:
        return
    src = "torch/distributed/pipelining/schedules.py"
    if f.pp == 1:
        yield _p("zero_bubble_needs_pp", ("schedule", "pp"),
                 f"--schedule {f.schedule} needs --pp > 1", src)
    if f.schedule in V_SCHEDULES and f.vpp is not None and f.vpp != 2:
        yield _p("zero_bubble_layout", ("schedule", "vpp"),
                 f"--schedule {f.schedule} runs exactly 2 model chunks per rank (--vpp 2), "
                 f"not {f.vpp}", src + " ScheduleZBVZeroBubble / ScheduleDualPipeV")
    if f.schedule == "dualpipev" and f.pp:
        most = gbs // ((f.dp or 1) * (f.mbs or 1))   # the most micro-batches the flags allow
        if most < 2 * f.pp:
            yield _p("zero_bubble_layout", ("schedule", "pp", "global_batch"),
                     f"--schedule dualpipev needs at least 2 x pp = {2 * f.pp} micro-batches; "
                     f"--global-batch {gbs} gives at most {most}",
                     src + " ScheduleDualPipeV")


def check_fixed(model, cluster, f, seq_len: int, gbs: int, engine=None) -> None:
    """Exit-2 errors for fixed values that can never work: the first of `fixed_problems`."""
    for problem in fixed_problems(model, cluster, f, seq_len, gbs, engine):
        raise BadInput(problem.line)
