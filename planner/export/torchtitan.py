"""torchtitan: the plan as the [training], [parallelism] and [activation_checkpoint] sections of a
torchtitan job config (TOML, read with --job.config_file).

Keys are those of torchtitan/config/job_config.py in the releases that read TOML. (Later
torchtitan builds configs in Python; the same `section.key` names still work there as
`--parallelism.tensor_parallel_degree 8`-style overrides.) Mapping:

* dp: ZeRO-0 is DDP (data_parallel_replicate_degree = dp); ZeRO-1/2/3 are FSDP2
  (data_parallel_shard_degree = dp) with fsdp_reshard_after_forward "never" for ZeRO-1/2
  (parameters stay gathered from forward to backward, as in ZeRO-2) and "always" for ZeRO-3.
  torchtitan has no optimizer-only sharding, so ZeRO-1 becomes FSDP without resharding.
* pipeline: module_fqns_per_model_part lists the modules of every virtual stage in model order,
  which torchtitan places on rank i % pp for looped schedules, as the plan does; it names
  torchtitan's decoder modules (tok_embeddings, layers.N, norm, output).
* batch: local_batch_size is the per-data-parallel-rank batch. With pp > 1 the pipeline splits
  it into local_batch_size / pipeline_parallel_microbatch_size microbatches; with pp = 1
  torchtitan accumulates gradients global / (local x dp) times.
* recompute: mode "full" recomputes every layer; "selective" with an integer option N
  checkpoints every N-th layer; "op" is torchtitan's per-op policy.
"""
from __future__ import annotations

import json

from planner.export._common import (fmt_list, header, recompute_active,
                                    recompute_is_uniform_all, stage_layers, uses_bf16)
from planner.plan import Plan

SCHEDULE = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B"}
RESHARD = {1: "never", 2: "never", 3: "always"}


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)            # a TOML basic string for these ASCII names
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {v!r}")


def module_fqns(counts: list) -> list:
    """torchtitan module names of each virtual stage (model order)."""
    parts, first = [], 0
    for i, n in enumerate(counts):
        names = ["tok_embeddings"] if i == 0 else []
        names += [f"layers.{j}" for j in range(first, first + n)]
        if i == len(counts) - 1:
            names += ["norm", "output"]
        parts.append(names)
        first += n
    return parts


def every_nth_layer(plan: Plan) -> int:
    """Largest N such that checkpointing every N-th layer recomputes, in every stage, at least
    the fraction of layers the plan recomputes there."""
    n = min(s.num_layers // s.recompute_layers for s in plan.stages if s.recompute_layers)
    return max(n, 1)


def torchtitan_toml(plan: Plan) -> str:
    """The plan as torchtitan TOML sections (see the module doc)."""
    plan.validate()
    p, b = plan.parallelism, plan.batch
    notes = []

    training = {}
    if p.pp > 1:
        local = b.micro_batch_size * b.num_microbatches
        training["local_batch_size"] = local
    else:
        training["local_batch_size"] = b.micro_batch_size
    training["global_batch_size"] = b.global_batch_size
    training["seq_len"] = b.seq_len
    training["mixed_precision_param"] = "bfloat16" if uses_bf16(plan) else "float32"

    par = {}
    if p.zero_stage == 0:
        par["data_parallel_replicate_degree"] = p.dp
        par["data_parallel_shard_degree"] = 1
        if p.dp > 1 and (p.tp > 1 or p.pp > 1):
            notes.append("DDP with tp/pp: torchtitan releases that reject it ('DDP has not "
                         "supported > 1D parallelism') need data_parallel_shard_degree = "
                         f"{p.dp} and data_parallel_replicate_degree = 1 instead (FSDP)")
    elif p.dp == 1:
        par["data_parallel_replicate_degree"] = 1
        par["data_parallel_shard_degree"] = 1
        notes.append(f"ZeRO-{p.zero_stage} with dp = 1 shards nothing; no FSDP")
    else:
        par["data_parallel_replicate_degree"] = 1
        par["data_parallel_shard_degree"] = p.dp
        par["fsdp_reshard_after_forward"] = RESHARD[p.zero_stage]
        if p.zero_stage == 1:
            notes.append("ZeRO-1: torchtitan has no optimizer-only sharding; FSDP with "
                         "fsdp_reshard_after_forward = \"never\" (ZeRO-2-like) shards more, "
                         "so it needs no more memory than planned")
    par["tensor_parallel_degree"] = p.tp
    if p.tp > 1:
        par["enable_async_tensor_parallel"] = False
        if not p.sequence_parallel:
            notes.append("torchtitan's tensor parallelism always shards the sequence (sequence "
                         "parallel); the plan does not, so activations take less memory than "
                         "planned")
    par["pipeline_parallel_degree"] = p.pp
    if p.pp > 1:
        # one chunk per rank: the interleaved schedule is plain 1F1B
        par["pipeline_parallel_schedule"] = SCHEDULE["1f1b" if p.schedule == "interleaved"
                                                     and p.vpp == 1 else p.schedule]
        par["pipeline_parallel_microbatch_size"] = b.micro_batch_size
        par["module_fqns_per_model_part"] = module_fqns(stage_layers(plan))
    elif p.vpp > 1:
        notes.append(f"{p.vpp} chunks on one pipeline rank run as a single stage")
    par["context_parallel_degree"] = 1

    ac = {}
    if not recompute_active(plan):
        ac["mode"] = "none"
        if p.recompute != "none":
            notes.append(f"the plan picks {p.recompute} recompute but applies it to no layer")
    elif p.recompute == "full":
        if recompute_is_uniform_all(plan):
            ac["mode"] = "full"
        else:
            nth = every_nth_layer(plan)
            if nth == 1:
                ac["mode"] = "full"
            else:
                ac["mode"] = "selective"
                ac["selective_ac_option"] = str(nth)
            counts = [s.recompute_layers for s in plan.stages]
            notes.append(f"the plan fully recomputes the leading {fmt_list(counts)} layers of "
                         f"stages of {fmt_list(stage_layers(plan))}; torchtitan cannot set this "
                         "per stage, so it recomputes "
                         f"{'every layer' if nth == 1 else f'one layer in every {nth}'}, "
                         "at least the planned share in every stage")
    else:
        ac["mode"] = "selective"
        ac["selective_ac_option"] = "op"
        notes.append("selective recompute: torchtitan's per-op policy (\"op\") keeps attention "
                     "and every other matmul output rather than recomputing attention as the plan "
                     "assumes, and applies to every layer; check memory")

    lines = [f"# {h}" for h in header(plan, "torchtitan")]
    lines.append("# a job config for torchtitan releases that read TOML (--job.config_file)")
    lines.append(f"# launch on {p.tp * p.pp * p.dp} GPUs; add [job], [model] (e.g. name = "
                 "\"llama3\", flavor) and [optimizer] as usual")
    lines += [f"# NOTE: {n}" for n in notes]
    for name, section in (("training", training), ("parallelism", par),
                          ("activation_checkpoint", ac)):
        lines.append("")
        lines.append(f"[{name}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in section.items()]
    return "\n".join(lines) + "\n"
