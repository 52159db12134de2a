"""DeepSpeed: the plan as a DeepSpeed config JSON (the file given to --deepspeed_config).

The whole output is one JSON object that `json.loads` reads and DeepSpeed takes as it is.
DeepSpeed's JSON has no tensor- or pipeline-parallel degree: the model code sets them
(`PipelineModule(num_stages=...)`, or Megatron-DeepSpeed's --tensor/--pipeline-model-parallel-size).
So the planner's notes and those settings travel in two top-level keys starting with '_':

* "_comment": lines a reader needs (what the engine cannot express, and what was chosen instead);
* "_parallelism": tp/pp/dp, the planned layers per pipeline stage, the PipelineModule call and the
  Megatron-DeepSpeed flags that carry them.

DeepSpeed reads only the top-level keys it knows and ignores others (deepspeedai/DeepSpeed#653),
so the file stays a valid config. Only plans priced for the deepspeed engine are exported
(planner.engines.runnable): the layers per stage one of PipelineModule's partition methods
gives (named in "pipeline_module"), 1F1B, ZeRO < 2 with pipelining, every layer
recomputed or none. Everything else is a real DeepSpeed key:
train_batch_size = micro batch x gradient_accumulation_steps x data-parallel size (DeepSpeed
asserts this), zero_optimization.stage, bf16, activation_checkpointing and, for pipelines,
pipeline.activation_checkpoint_interval (the PipelineEngine copies it into the PipelineModule).
"""
from __future__ import annotations

import json

from planner.export._common import (check_exportable, header, rank_layers, recompute_active,
                                    uses_bf16)
from planner import rules as V
from planner.cost.dataparallel import hpz_size
from planner.engines import get_engine
from planner.plan import Plan


# where ZeRO-Infinity swaps to NVMe: a placeholder for the node's local NVMe mount
NVME_PATH = "/local_nvme"


def offload_settings(p) -> dict:
    """zero_optimization.offload_optimizer / offload_param of the plan's offload
    (deepspeed/runtime/zero/offload_config.py DeepSpeedZeroOffloadOptimizerConfig,
    DeepSpeedZeroOffloadParamConfig): the device, pinned host buffers (the copies priced at
    the host link's rate are pinned-memory DMA), and an NVMe path to fill in."""
    out = {}
    for key, device in (("offload_optimizer", p.offload_optimizer),
                        ("offload_param", p.offload_params)):
        if device != "none":
            out[key] = {"device": device, "pin_memory": True,
                        **({"nvme_path": NVME_PATH} if device == "nvme" else {})}
    return out


def deepspeed_config(plan: Plan) -> str:
    """The plan as a DeepSpeed config (JSON text; see the module doc)."""
    check_exportable(plan, "deepspeed")
    p, b, m = plan.parallelism, plan.batch, plan.model
    notes = list(header(plan, "DeepSpeed"))
    notes.append("keys starting with '_' are the planner's notes; DeepSpeed ignores them")
    per_rank = rank_layers(plan)

    # Activation recompute: every layer (interval 1) or none, as the deepspeed engine prices it.
    interval = 0
    md_recompute = []
    if recompute_active(plan):
        if p.recompute == "full":
            interval = 1
            md_recompute = ["--recompute-granularity", "full", "--recompute-method", "uniform",
                            "--recompute-num-layers", "1", "--deepspeed-activation-checkpointing"]
        else:
            md_recompute = ["--recompute-granularity", "selective"]

    # How deepspeed.checkpointing treats the activations it keeps; whether a layer is recomputed
    # is decided by the model code (the interval above, or the Megatron-DeepSpeed flags).
    activation_checkpointing = {
        "partition_activations": False,
        "cpu_checkpointing": False,
        "contiguous_memory_optimization": False,
        "synchronize_checkpoint_boundary": False,
        "profile": False,
    }

    md_args = ["--deepspeed", "--deepspeed_config", "ds_config.json",
               "--tensor-model-parallel-size", str(p.tp),
               "--pipeline-model-parallel-size", str(p.pp)]
    if p.pp == 1:
        md_args.append("--no-pipeline-parallel")
    if p.sequence_parallel and p.tp > 1:
        md_args.append("--sequence-parallel")
    md_args += ["--zero-stage", str(p.zero_stage), "--micro-batch-size", str(b.micro_batch_size),
                "--global-batch-size", str(b.global_batch_size), "--seq-length", str(b.seq_len)]
    md_args += md_recompute
    if uses_bf16(plan):
        md_args.append("--bf16")

    # the PipelineModule partition method that gives the planned split (an even split: any)
    method = V.partition_method(get_engine("deepspeed"), m.num_layers, plan.layer_counts()) \
        or "type:transformer"
    parallelism = {
        "tensor_parallel_size": p.tp,
        "pipeline_parallel_size": p.pp,
        "data_parallel_size": p.dp,
        "sequence_parallel": bool(p.sequence_parallel and p.tp > 1),
        "planned_layers_per_pipeline_rank": per_rank,
        "pipeline_module": (f"PipelineModule(layers=<{m.num_layers} transformer layers plus "
                            f"embedding and head>, num_stages={p.pp}, "
                            f"partition_method='{method}', "
                            f"activation_checkpoint_interval={interval})"),
        "megatron_deepspeed_args": md_args,
    }

    config = {
        "_comment": notes,
        "train_batch_size": b.micro_batch_size * b.num_microbatches * p.dp,
        "train_micro_batch_size_per_gpu": b.micro_batch_size,
        "gradient_accumulation_steps": b.num_microbatches,
        # overlap_comm: gradient reduction overlapped with backward, as priced; gradients
        # accumulated in fp32 (the deepspeed engine's 4 bytes per parameter)
        "zero_optimization": {"stage": p.zero_stage, "overlap_comm": True},
        "data_types": {"grad_accum_dtype": "fp32"},
        "bf16": {"enabled": uses_bf16(plan)},
        "activation_checkpointing": activation_checkpointing,
    }
    config["zero_optimization"].update(offload_settings(p))
    if p.zeropp:
        # ZeRO++ as priced (planner.cost.dataparallel.ZeroPP): the hpZ group the data-parallel
        # ranks of one node
        config["zero_optimization"].update(
            zero_quantized_weights=True, zero_quantized_gradients=True,
            zero_hpz_partition_size=hpz_size(p.dp * p.cp, plan.cluster.gpus_per_node, p.tp))
    if p.dp_shard:
        # MiCS: the ZeRO-3 states sharded inside groups of mics_shard_size ranks, replicated
        # across them (deepspeed/runtime/zero/config.py mics_shard_size); its hierarchical
        # all-gather stays off, as priced (one all-gather inside the shard group)
        config["zero_optimization"]["mics_shard_size"] = p.dp_shard
    if p.pp > 1:
        config["pipeline"] = {"activation_checkpoint_interval": interval}
    config["_parallelism"] = parallelism
    return json.dumps(config, indent=2) + "\n"
