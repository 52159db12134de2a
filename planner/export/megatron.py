"""Megatron-LM: the plan as `pretrain_gpt.py` command-line arguments.

Output is a bash fragment: comment lines, an `export` where Megatron needs one, and a bash array
`MEGATRON_ARGS=( ... )` holding one flag (and its shell-quoted value) per line, so that

    source megatron_args.sh
    torchrun ... pretrain_gpt.py "${MEGATRON_ARGS[@]}" <data, tokenizer, optimizer flags>

passes exactly these argv entries. Flag names and semantics follow megatron/training/arguments.py
and megatron-core (>= 0.14, where Megatron-FSDP and --pipeline-model-parallel-layout exist):

* uneven pipelines: --decoder-first/last-pipeline-num-layers give the first/last rank a different
  count and split the rest evenly (every rank's count must divide by vpp); anything else goes to
  --pipeline-model-parallel-layout, whose '|'-separated stages are listed in virtual-stage order
  (stage i on rank i % pp, chunk i // pp), 'E' (embedding) first and 'L' (loss) last.
* --recompute-method block recomputes the first --recompute-num-layers layers of every model
  chunk (all of a shorter chunk): a Megatron plan recomputes min(N, layers) in every stage.
* recompute "offload" is --cpu-offloading-num-layers N (the activations of a rank's first N
  layers to host memory; Megatron runs it at pp 1 without recompute, N < the layers).
* ZeRO-1 is --use-distributed-optimizer; ZeRO-2/3 are Megatron-FSDP sharding strategies
  (optim_grads / optim_grads_params), which Megatron does not combine with pipeline parallelism.
* --overlap-grad-reduce and --overlap-param-gather: the overlaps the megatron engine prices.
* context parallel: --context-parallel-size cp --cp-comm-type p2p|all_gather|a2a; Megatron's
  ranks are ordered tp-cp-ep-dp-pp (tp-cp-ep-pp-dp with --use-tp-pp-dp-mapping) and its data
  parallel size is WORLD_SIZE / (tp x cp x pp).
* precision (Transformer Engine, _add_transformer_engine_args): fp8 is --fp8-format hybrid
  (E4M3 forward, E5M2 gradients) --fp8-recipe tensorwise|delayed; mxfp8 is --fp8-format e4m3
  --fp8-recipe mxfp8; nvfp4 is --fp4-format e2m1 --fp4-recipe nvfp4. --bf16 stays: the rest
  of the model (and the master weights' compute copy) is bf16. Under ZeRO-3 FP8 primary
  weights: --fp8-param-gather (planner.precision fp8_primary_weights).

Only plans priced for the megatron engine are exported (planner.engines.runnable).
"""
from __future__ import annotations

import shlex

from planner.cost.recompute import DEFAULT_MODULES
from planner.engines.runnable import per_chunk_recompute
from planner.export._common import (check_exportable, fmt_list, header, rank_layers,
                                    recompute_active, stage_layers, uses_bf16)
from planner.engines import get_engine
from planner.plan import Plan
from planner.precision import fp8_primary_weights

FSDP_STRATEGY = {2: "optim_grads", 3: "optim_grads_params"}
# planner precision -> Megatron's Transformer Engine flags, given the plan's recipe
PRECISION_FLAGS = {
    "fp8": lambda r: [("--fp8-format", "hybrid"), ("--fp8-recipe", r)],
    "mxfp8": lambda r: [("--fp8-format", "e4m3"), ("--fp8-recipe", "mxfp8")],
    "nvfp4": lambda r: [("--fp4-format", "e2m1"), ("--fp4-recipe", "nvfp4")],
}


def first_last_split(num_layers: int, pp: int, vpp: int, first, last):
    """Per-virtual-stage layer counts Megatron-core builds from --decoder-first/last-pipeline-
    num-layers (None for an unset flag), or None where its checks reject the pair."""
    middle = pp - (first is not None) - (last is not None)
    remaining = num_layers - (first or 0) - (last or 0)
    for n in (first, last):
        if n is not None and (n <= 0 or n % vpp):
            return None
    if middle < 0 or remaining < 0 or bool(remaining) != bool(middle):
        return None
    if middle and (remaining % middle or (remaining // middle) % vpp):
        return None
    per_rank = []
    for r in range(pp):
        if r == 0 and first is not None:
            per_rank.append(first)
        elif r == pp - 1 and last is not None:
            per_rank.append(last)
        else:
            per_rank.append(remaining // middle)
    return [per_rank[i % pp] // vpp for i in range(pp * vpp)]


def layout_string(counts: list, mtp: int = 0) -> str:
    """--pipeline-model-parallel-layout for per-virtual-stage decoder counts; `mtp` MTP layers
    ("m", megatron/core/transformer/pipeline_parallel_layer_layout.py) before the loss on the
    last virtual stage, where the planner prices them (planner.cost.stage) and where
    Megatron-Core puts them without a layout (multi_token_prediction.py mtp_on_this_rank)."""
    stages = []
    for i, n in enumerate(counts):
        s = "E" if i == 0 else ""
        s += "" if n == 0 else ("t" if n == 1 else f"t*{n}")
        if i == len(counts) - 1:
            s += "" if mtp == 0 else ("m" if mtp == 1 else f"m*{mtp}")
            s += "L"
        stages.append(s)
    return "|".join(stages)


def _pipeline(plan: Plan, args: list, notes: list) -> None:
    p, m = plan.parallelism, plan.model
    args.append(("--pipeline-model-parallel-size", p.pp))
    counts = stage_layers(plan)
    if p.pp == 1:
        return
    if len(set(counts)) == 1:
        if p.vpp > 1:
            args.append(("--num-virtual-stages-per-pipeline-rank", p.vpp))
        return
    per_rank = rank_layers(plan)
    vpp = p.vpp
    for first, last in ((per_rank[0], None), (None, per_rank[-1]), (per_rank[0], per_rank[-1])):
        if first_last_split(m.num_layers, p.pp, vpp, first, last) == counts:
            if first is not None:
                args.append(("--decoder-first-pipeline-num-layers", first))
            if last is not None:
                args.append(("--decoder-last-pipeline-num-layers", last))
            if vpp > 1:
                args.append(("--num-virtual-stages-per-pipeline-rank", vpp))
            return
    # The layout sets the virtual pipeline size itself (stages / pp); no other vpp flag with it.
    args.append(("--pipeline-model-parallel-layout", layout_string(counts, m.mtp_layers)))
    notes.append(f"stages hold {fmt_list(counts)} layers (virtual-stage order): "
                 "--pipeline-model-parallel-layout")


def _recompute(plan: Plan, args: list, notes: list) -> None:
    p = plan.parallelism
    if p.recompute == "none":
        return
    if not recompute_active(plan):
        return
    if p.recompute == "offload":
        # the activations of the first N layers to host memory (sets --cpu-offloading:
        # megatron/training/arguments.py); pp 1, so one stage
        args.append(("--cpu-offloading-num-layers", plan.stages[0].recompute_layers))
        notes.append(f"activations of {plan.stages[0].recompute_layers} of "
                     f"{plan.stages[0].num_layers} layers offloaded to host memory")
        return
    if p.recompute == "selective":
        args.append(("--recompute-granularity", "selective"))
        if p.recompute_modules != DEFAULT_MODULES:
            # nargs="*" (megatron/training/arguments.py); the default is core_attn
            args.append(("--recompute-modules", p.recompute_modules))
            notes.append(f"selective recompute of {', '.join(p.recompute_modules)} in every "
                         "layer")
        return
    args += [("--recompute-granularity", "full"), ("--recompute-method", "block"),
             ("--recompute-num-layers", per_chunk_recompute(plan))]


def _zero(plan: Plan, args: list, notes: list) -> bool:
    """Emit the data-parallel sharding flags; True when Megatron-FSDP is used."""
    p = plan.parallelism
    if p.dp * p.cp > 1:      # gradients are reduced over dp x cp
        args.append(("--overlap-grad-reduce", None))
    if p.offload_optimizer == "cpu":
        # the HybridDeviceOptimizer, all of this rank's optimizer on the CPU, its copies
        # overlapped with the CPU step as priced (megatron/core/optimizer/cpu_offloading/
        # README.md); arguments.py requires the precision-aware optimizer with it
        args += [("--optimizer-cpu-offload", None), ("--optimizer-offload-fraction", 1.0),
                 ("--use-precision-aware-optimizer", None),
                 ("--overlap-cpu-optimizer-d2h-h2d", None)]
    if p.zero_stage == 0:
        if p.offload_optimizer != "none":
            # over one data-parallel rank the distributed optimizer keeps what ZeRO-0 keeps,
            # and the precision-aware optimizer needs it (optimizer_config.py)
            args.append(("--use-distributed-optimizer", None))
        return False
    if p.zero_stage == 1:
        args += [("--use-distributed-optimizer", None), ("--overlap-param-gather", None)]
        if p.dp_shard:
            # each instance of the distributed optimizer sharded over dp_shard ranks
            args.append(("--num-distributed-optimizer-instances",
                         p.dp * p.cp // p.dp_shard))
        return False
    if p.pp == 1:
        args += [("--use-megatron-fsdp", None),
                 ("--data-parallel-sharding-strategy", FSDP_STRATEGY[p.zero_stage]),
                 ("--use-distributed-optimizer", None), ("--overlap-param-gather", None),
                 # Megatron-FSDP's user guide requires it (no fused wgrad accumulation)
                 ("--no-gradient-accumulation-fusion", None),
                 # the model built on the meta device and materialised sharded: without it
                 # get_model moves each rank's whole tp shard to the GPU before Megatron-FSDP
                 # shards it (megatron/training/training.py get_model), beyond the sharded
                 # states priced (a TransformerConfig field; every Megatron-Bridge FSDP
                 # recipe sets it)
                 ("--init-model-with-meta-device", None),
                 ("--ckpt-format", "fsdp_dtensor")]
        notes.append(f"ZeRO-{p.zero_stage} is Megatron-FSDP "
                     f"({FSDP_STRATEGY[p.zero_stage]}); it wants CUDA_DEVICE_MAX_CONNECTIONS "
                     "unset and writes fsdp_dtensor checkpoints")
        return True
    raise AssertionError("checked by planner.engines.runnable")


def _attention(m, args: list) -> None:
    """The attention features beyond Llama's the engine spec says this export writes
    (planner.engines.megatron `model_features`), as Megatron-Core's arguments
    (megatron/training/arguments.py): --kv-channels is the per-head projection width
    (default hidden / heads); multi-latent attention takes its ranks and head widths
    (--qk-head-dim the no-rope part, --qk-pos-emb-head-dim the rope part; --qk-layernorm the
    norms on its low-rank latents); --window-size "left,right" with --window-attn-skip-freq N,
    one full-attention layer after N-1 windowed ones, as the model's full_attention_interval;
    --softmax-type learnable: a learned sink logit per head (GPT-OSS); --mtp-num-layers N: the
    model's multi-token prediction modules."""
    if m.head_dim_override:
        args.append(("--kv-channels", m.head_dim))
    if m.is_mla:
        args.append(("--multi-latent-attention", None))
        if m.q_lora_rank:
            args.append(("--q-lora-rank", m.q_lora_rank))
        args += [("--kv-lora-rank", m.kv_lora_rank), ("--qk-head-dim", m.qk_nope_head_dim),
                 ("--qk-pos-emb-head-dim", m.qk_rope_head_dim), ("--v-head-dim", m.v_head_dim),
                 ("--qk-layernorm", None)]
    if m.sliding_window:
        args.append(("--window-size", f"{m.sliding_window},0"))
        if m.full_attention_interval:
            args.append(("--window-attn-skip-freq", m.full_attention_interval))
    if m.attention_sinks:
        args.append(("--softmax-type", "learnable"))
    if m.mtp_layers:
        # multi-token prediction modules on the last pipeline stage (megatron/core/transformer/
        # multi_token_prediction.py), each one decoder layer of the last layer's kind
        args.append(("--mtp-num-layers", m.mtp_layers))


def _model(plan: Plan, args: list, notes: list) -> None:
    m, b = plan.model, plan.batch
    args += [("--num-layers", m.num_layers), ("--hidden-size", m.hidden),
             ("--ffn-hidden-size", m.ffn_hidden), ("--num-attention-heads", m.num_heads)]
    if m.num_kv_heads != m.num_heads:
        args += [("--group-query-attention", None), ("--num-query-groups", m.num_kv_heads)]
    _attention(m, args)
    max_pos = max(m.max_seq_len, b.seq_len)
    if max_pos != m.max_seq_len:
        notes.append(f"--max-position-embeddings raised from the model's {m.max_seq_len} to the "
                     f"planned seq_len {b.seq_len}: Megatron requires it to be at least seq_len")
    args.append(("--max-position-embeddings", max_pos))

    if m.gated_mlp:
        if m.activation == "silu":
            args.append(("--swiglu", None))
        elif m.activation == "gelu":
            args.append(("--quick-geglu", None))
            notes.append("GeGLU: Megatron's --quick-geglu uses the quick-GELU approximation")
        else:
            args.append(("--swiglu", None))
            notes.append(f"gated {m.activation} has no Megatron flag; --swiglu keeps the shapes "
                         "but changes the activation")
    elif m.activation == "relu2":
        args.append(("--squared-relu", None))
    elif m.activation == "silu":
        notes.append("a plain (ungated) SiLU MLP has no Megatron flag; the default GELU is used")

    args.append(("--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm"))
    args.append(("--norm-epsilon", repr(float(m.norm_eps))))

    if m.position == "rope":
        args.append(("--position-embedding-type", "rope"))
        base = m.rope_theta
        if float(base).is_integer():
            args.append(("--rotary-base", int(base)))
        else:
            args.append(("--rotary-base", int(round(base))))
            notes.append(f"--rotary-base takes an integer; rope_theta {base} rounded")
    elif m.position == "learned":
        args.append(("--position-embedding-type", "learned_absolute"))
    else:
        args.append(("--position-embedding-type", "none"))
        notes.append("Megatron-LM has no ALiBi; the position bias needs a custom layer spec")

    if not m.tied_embeddings:
        args.append(("--untie-embeddings-and-output-weights", None))
    if not m.linear_bias:
        args.append(("--disable-bias-linear", None))
        if m.attn_bias:
            args.append(("--add-qkv-bias", None))
    elif not m.attn_bias:
        notes.append("Megatron adds q/k/v biases whenever the other linears have biases; "
                     "the model has them only outside attention")
    if m.parallel_residual:
        notes.append("Megatron-core's GPT layer has no parallel-residual (GPT-NeoX) option; "
                     "the layer spec must supply it")
    args += [("--attention-dropout", repr(float(m.dropout))),
             ("--hidden-dropout", repr(float(m.dropout)))]
    tp = plan.parallelism.tp
    engine = get_engine("megatron")
    notes.append(f"vocabulary: {m.vocab_size} tokens from your tokenizer flags; Megatron pads it "
                 f"to a multiple of {engine.vocab_pad_multiple} x tp = "
                 f"{engine.vocab_pad_multiple * tp} (--make-vocab-size-divisible-by "
                 f"{engine.vocab_pad_multiple}): {engine.built_vocab(m.vocab_size, tp)} rows, "
                 f"as priced")


def moe_layer_freq(model) -> str:
    """--moe-layer-freq as the Python list Megatron evaluates (1 = MoE layer, 0 = dense),
    one entry per layer (megatron/training/arguments.py, moe_freq_type)."""
    return "[" + ",".join("1" if model.moe_layer(i) else "0"
                          for i in range(model.num_layers)) + "]"


def _experts(plan: Plan, args: list, notes: list) -> None:
    """MoE flags: the experts, their parallelism and the dispatcher the plan was priced with
    (planner.cost.moe.dispatcher)."""
    m, p = plan.model, plan.parallelism
    if not m.is_moe:
        return
    from planner.cost.moe import plan_dispatcher
    args += [("--num-experts", m.num_experts), ("--moe-router-topk", m.experts_per_token),
             ("--moe-ffn-hidden-size", m.moe_ffn_hidden)]
    if m.shared_expert_ffn_hidden:
        args.append(("--moe-shared-expert-intermediate-size", m.shared_expert_ffn_hidden))
    if m.num_moe_layers != m.num_layers:
        args.append(("--moe-layer-freq", moe_layer_freq(m)))
    disp = plan_dispatcher(plan)     # the one priced (planner.cost.moe)
    args += [("--expert-model-parallel-size", p.ep), ("--expert-tensor-parallel-size", p.etp),
             ("--moe-grouped-gemm", None), ("--moe-token-dispatcher-type", disp)]
    # priced as a deduplicating dispatch, DeepEP's and HybridEP's alike, without the FP8
    # padding copies DeepEP leaves to the experts (planner.cost.moe LOWP_PADDED_DISPATCHERS)
    if disp == "flex":
        args.append(("--moe-flex-dispatcher-backend", "deepep"))
    if p.moe_capacity_factor is not None:   # priced padded to capacity, no host sync
        args += [("--moe-expert-capacity-factor", p.moe_capacity_factor),
                 ("--moe-pad-expert-input-to-capacity", None)]
    if p.ep_comm_overlap:   # priced overlapped across micro-batches (planner.cost.moe)
        args += [("--overlap-moe-expert-parallel-comm", None), ("--delay-wgrad-compute", None)]
    if p.moe_capacity_factor is None and p.moe_imbalance == 1.0:
        notes.append("MoE priced dropless (no --moe-expert-capacity-factor) with balanced "
                     "routing, as Megatron-Bridge benchmarks run it "
                     "(--moe-router-force-load-balancing); an uneven real routing is slower "
                     "(plan --moe-imbalance prices it)")
    elif p.moe_capacity_factor is None:
        notes.append(f"MoE priced dropless with the busiest expert rank at "
                     f"{p.moe_imbalance:g}x its balanced share of tokens (time and memory)")
    if disp == "flex":
        notes.append("the flex dispatcher needs DeepEP installed and megatron-core >= 0.15 "
                     "(--moe-flex-dispatcher-backend; megatron/core/transformer/moe/fused_a2a.py)")
    if p.ep_comm_overlap:
        notes.append("the EP overlap needs torch >= 2.6 and, with --delay-wgrad-compute, "
                     "Transformer Engine >= 2.8 (megatron/training/arguments.py)")


def megatron_args(plan: Plan) -> str:
    """The plan as Megatron-LM arguments (a sourceable bash fragment; see the module doc)."""
    check_exportable(plan, "megatron")
    p, b = plan.parallelism, plan.batch
    args, notes = [], []

    args.append(("--tensor-model-parallel-size", p.tp))
    if p.sequence_parallel and p.tp > 1:
        args.append(("--sequence-parallel", None))
    if p.tp_comm_overlap:   # priced overlapped: userbuffers (needs sp and Transformer Engine)
        args.append(("--tp-comm-overlap", None))
    if p.cp > 1:
        args += [("--context-parallel-size", p.cp), ("--cp-comm-type", p.cp_comm_type)]
    _pipeline(plan, args, notes)
    order = tuple(p.rank_order)
    if order == ("dp", "pp", "cp", "tp"):
        args.append(("--use-tp-pp-dp-mapping", None))
    elif order != ("pp", "dp", "cp", "tp"):
        notes.append(f"rank order {'-'.join(order)} (outermost first) is not available: "
                     "Megatron orders ranks tp-cp-dp-pp (default) or tp-cp-pp-dp, tp innermost")
    fsdp = _zero(plan, args, notes)
    _recompute(plan, args, notes)
    args += [("--micro-batch-size", b.micro_batch_size),
             ("--global-batch-size", b.global_batch_size),
             ("--seq-length", b.seq_len)]
    if uses_bf16(plan):
        args.append(("--bf16", None))
    args += PRECISION_FLAGS.get(plan.precision, lambda r: [])(plan.recipe)
    if fp8_primary_weights(get_engine("megatron"), plan.precision, plan.recipe, p.zero_stage,
                           p.offload_optimizer):
        # priced so (planner.precision fp8_primary_weights): Megatron-FSDP's FP8 shards, no
        # bf16 weight whose gathered copy TE would cache
        args.append(("--fp8-param-gather", None))
        notes.append("FP8 primary weights under Megatron-FSDP (--fp8-param-gather), as priced")
    _model(plan, args, notes)
    _experts(plan, args, notes)

    world = p.world_size
    lines = ["#!/usr/bin/env bash"]
    lines += [f"# {h}" for h in header(plan, "Megatron-LM")]
    if p.cp > 1:
        lines.append(f"# launch on {world} GPUs: Megatron infers data-parallel size = "
                     f"WORLD_SIZE / (tp x cp x pp) = {world} / {p.tp * p.cp * p.pp} = {p.dp}")
    else:
        lines.append(f"# launch on {world} GPUs: Megatron infers data-parallel size = "
                     f"WORLD_SIZE / (tp x pp) = {world} / {p.tp * p.pp} = {p.dp}")
    lines.append('# use: source this file; torchrun ... pretrain_gpt.py "${MEGATRON_ARGS[@]}" '
                 "<data, tokenizer and optimizer flags>")
    flex = plan.model.is_moe and "flex" in (v for _, v in args if isinstance(v, str))
    lines.append(f"# flags as in Megatron-LM with megatron-core >= {'0.15' if flex else '0.14'}")
    lines += [f"# NOTE: {n}" for n in notes]
    if p.ep_comm_overlap:
        # the overlap's all-to-alls run on their own stream, which one hardware queue would
        # serialise behind the compute (Megatron-Bridge sets 32 for it)
        lines.append("export CUDA_DEVICE_MAX_CONNECTIONS=32  "
                     "# the EP overlap needs concurrent streams (Megatron-Bridge's setting)")
    elif p.tp > 1 and not fsdp:
        lines.append("export CUDA_DEVICE_MAX_CONNECTIONS=1  "
                     "# Megatron wants this with tensor parallelism (before Blackwell)")
    lines.append("MEGATRON_ARGS=(")
    for flag, value in args:
        values = value if isinstance(value, tuple) else (value,)
        lines.append(f"    {flag}" if value is None else
                     f"    {flag} {' '.join(shlex.quote(str(v)) for v in values)}")
    lines.append(")")
    return "\n".join(lines) + "\n"
