"""torchtitan: the plan as the [training], [parallelism], [activation_checkpoint] and [compile]
sections of a torchtitan job config (TOML, read with --job.config_file).

Keys are those of torchtitan/config/job_config.py in the releases that read TOML. (Later
torchtitan builds configs in Python; the same `section.key` names still work there as
`--parallelism.tensor_parallel_degree 8`-style overrides.) Mapping:

* dp: ZeRO-0 is DDP (data_parallel_replicate_degree = dp, 1-D only); ZeRO-2/3 are FSDP2
  (data_parallel_shard_degree = dp) with fsdp_reshard_after_forward "never" for ZeRO-2
  (parameters gathered every micro-batch and kept from forward to backward, as the torchtitan
  engine prices it) and "always" for ZeRO-3.
* pipeline: module_fqns_per_model_part lists the modules of every virtual stage in model order,
  which torchtitan places on rank i % pp for looped schedules, as the plan does, and as a V
  for ZBVZeroBubble and DualPipeV (rank r runs stages r and 2 pp - 1 - r: torchtitan/
  distributed/pipeline_parallel.py, style "v", which asserts 2 stages per rank), as the plan
  does for zbv and dualpipev; the stages per rank are len(module_fqns_per_model_part) / pp.
  It names torchtitan's decoder modules (tok_embeddings, layers.N, norm, output).
* batch: local_batch_size is the per-data-parallel-rank batch. With pp > 1 the pipeline splits
  it into local_batch_size / pipeline_parallel_microbatch_size microbatches; with pp = 1
  torchtitan accumulates gradients global / (local x dp) times.
* context parallel: context_parallel_degree = cp with context_parallel_rotate_method
  "allgather" (the plan's all_gather exchange) or "alltoall" (its p2p ring); FSDP2 then shards
  over data_parallel_shard_degree x cp, as priced (torchtitan/distributed/parallel_dims.py).
* recompute: mode "full" recomputes every layer; "op" is mode "selective" with torchtitan's
  per-op policy (selective_ac_option "op"), on every layer.

* precision: fp8 is `[model] converters = ["quantize.linear.float8"]` with a
  `[quantize.linear.float8]` section (recipe_name "tensorwise" or "rowwise";
  enable_fsdp_float8_all_gather and precompute_float8_dynamic_scale_for_fsdp for tensorwise
  under FSDP2, as priced; filter_fqns ["output"] keeps the LM head bf16); mxfp8 is converters
  ["quantize.linear.mx"] with `[quantize.linear.mx]` recipe_name "mxfp8_cublas"
  (torchtitan/config/job_config.py Quantize, Float8Linear, MXLinear, at the last release that
  reads TOML, 9810191bb's parent, whose keys every section here uses).

* experts: expert_parallel_degree = ep and expert_tensor_parallel_degree = etp (1 or tp); the
  experts themselves (count, top-k, widths) are the model flavor's, set in [model].
* compile: `[compile] enable` is the plan's `compile` (components "model" and "loss",
  torchtitan/config/job_config.py Compile), priced with fused element-wise kernels when true;
  [parallelism] enable_async_tensor_parallel is the plan's tp_comm_overlap (async TP, which
  torchtitan runs only compiled: the planner offers it only with `compile`).

Only plans priced for the torchtitan engine are exported (planner.engines.runnable).
"""
from __future__ import annotations

import json

from planner.export._common import (check_exportable, header, recompute_active, stage_layers,
                                    uses_bf16)
from planner.plan import Plan

# the plan's schedule as torch's get_schedule_class name (torch/distributed/pipelining/
# schedules.py), which torchtitan's [parallelism] pipeline_parallel_schedule takes
SCHEDULE = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B",
            "interleaved-zb": "InterleavedZeroBubble", "zbv": "ZBVZeroBubble",
            "dualpipev": "DualPipeV"}
RESHARD = {2: "never", 3: "always"}
# the plan's K/V exchange as torch's context_parallel rotate method (planner.engines.torchtitan)
ROTATE = {"all_gather": "allgather", "p2p": "alltoall"}


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


def _precision_sections(plan: Plan) -> list:
    """[model] converters and the converter's [quantize.linear.*] section for a low-precision
    plan (torchtitan/config/job_config.py Quantize; the converters' registered names,
    torchtitan/components/quantization/float8.py and mx.py)."""
    if plan.precision == "fp8":
        fp8 = {"recipe_name": plan.recipe, "filter_fqns": ["output"]}
        if plan.recipe == "tensorwise":
            gather = plan.parallelism.zero_stage >= 2
            fp8["enable_fsdp_float8_all_gather"] = gather
            fp8["precompute_float8_dynamic_scale_for_fsdp"] = gather
        return [("model", {"converters": ["quantize.linear.float8"]}),
                ("quantize.linear.float8", fp8)]
    if plan.precision == "mxfp8":
        # torchao's MXFP8 on cuBLAS's block-scaled GEMM (the recipe torchtitan defaults to)
        return [("model", {"converters": ["quantize.linear.mx"]}),
                ("quantize.linear.mx", {"recipe_name": "mxfp8_cublas", "filter_fqns": ["output"]})]
    return []


def torchtitan_toml(plan: Plan) -> str:
    """The plan as torchtitan TOML sections (see the module doc)."""
    check_exportable(plan, "torchtitan")
    p, b = plan.parallelism, plan.batch

    training = {}
    if p.pp > 1:
        training["local_batch_size"] = b.micro_batch_size * b.num_microbatches
    else:
        training["local_batch_size"] = b.micro_batch_size
    training["global_batch_size"] = b.global_batch_size
    training["seq_len"] = b.seq_len
    training["mixed_precision_param"] = "bfloat16" if uses_bf16(plan) else "float32"
    training["mixed_precision_reduce"] = "float32"
    if p.offload_params != "none":      # FSDP2's CPUOffloadPolicy, all states in CPU memory
        training["enable_cpu_offload"] = True

    par = {}
    if p.zero_stage == 0:
        par["data_parallel_replicate_degree"] = p.dp
        par["data_parallel_shard_degree"] = 1
    else:
        # HSDP: FSDP2 over dp_shard ranks, replicated across the rest (dp_shard 0: all dp)
        shard = p.dp_shard or p.dp
        par["data_parallel_replicate_degree"] = p.dp // shard
        par["data_parallel_shard_degree"] = shard
        par["fsdp_reshard_after_forward"] = RESHARD[p.zero_stage]
    par["tensor_parallel_degree"] = p.tp
    if p.tp > 1:    # async TP, as priced (it runs only compiled: [compile] below)
        par["enable_async_tensor_parallel"] = p.tp_comm_overlap
    par["pipeline_parallel_degree"] = p.pp
    if p.pp > 1:
        par["pipeline_parallel_schedule"] = SCHEDULE[p.schedule]
        par["pipeline_parallel_microbatch_size"] = b.micro_batch_size
        par["module_fqns_per_model_part"] = module_fqns(stage_layers(plan))
    par["context_parallel_degree"] = p.cp
    if p.cp > 1:
        par["context_parallel_rotate_method"] = ROTATE[p.cp_comm_type]
    if plan.model.is_moe:
        # experts over ep ranks carved out of dp_shard (x tp when etp = 1), all-to-all dispatch
        par["expert_parallel_degree"] = p.ep
        par["expert_tensor_parallel_degree"] = p.etp

    ac = {}
    if not recompute_active(plan):
        ac["mode"] = "none"
    elif p.recompute == "full":
        ac["mode"] = "full"
    else:
        ac["mode"] = "selective"
        ac["selective_ac_option"] = "op"

    sections = [("training", training), ("parallelism", par), ("activation_checkpoint", ac)]
    sections += _precision_sections(plan)
    # the model and loss under torch.compile, as priced (planner.engines.spec with_compile);
    # without it torchtitan runs eager, Compile.enable's default
    sections.append(("compile", {"enable": plan.compile, "components": ["model", "loss"]}))

    lines = [f"# {h}" for h in header(plan, "torchtitan")]
    lines.append("# a job config for torchtitan releases that read TOML (--job.config_file)")
    lines.append(f"# launch on {p.world_size} GPUs; add [job], [model] (e.g. name = "
                 "\"llama3\", flavor) and [optimizer] as usual")
    if p.pp > 1 and p.vpp > 1:
        lines.append(f"# {SCHEDULE[p.schedule]}: {p.vpp} stages per rank "
                     f"({len(plan.stages)} parts in module_fqns_per_model_part over pp {p.pp})")
    for name, section in sections:
        lines.append("")
        lines.append(f"[{name}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in section.items()]
    return "\n".join(lines) + "\n"
