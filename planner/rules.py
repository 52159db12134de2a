"""The rules layer: the one home of every rule a plan must keep, asked by the search (per
candidate, and through planner.rules_fixed for the values fixed on the command line),
Plan.validate, the exporters, explain, `plan launch` and the runtime's pre-flight
(runtime.parallelize.check_layout). A broken rule is a planner.problem.Problem: its name, the
knobs involved, one line, the engine source that states it and a fix; a refusal shows the
first, never a list of rules that might have failed.

Two kinds of rules:
* what no engine can run (below): the model, the batch and the cluster split by the degrees,
  and the precision on the GPU (planner.precision) -- `rule_problems`, held by Plan.validate
  (a loaded plan is held to every rule as a planned one is);
* what one engine can run, read from its spec's data (planner.engines: ZeRO stages with and
  without pipelining, schedules, stage splits, recompute counts, dispatchers, precisions, and
  for our runtime what its model code does not build, MLA under tp, MoE with tp needing sp,
  etp = tp, no CP) -- `engine_problems`; `runner_problems` puts first that the plan was priced
  for that engine. Where a TP group may live is the engine's (Engine.tp_domain / tp_fits).

A configuration is valid when the model, the batch and the cluster can be split by its degrees
the way every consumer of a plan lays them out:

* tensor parallelism splits the attention heads, the FFN and the vocabulary; the KV heads are
  split too, or (the runtime's grouped-query layout) replicated when they divide tp. The
  search keeps to splitting them (`tp_ok`), which every engine runs. The vocabulary is the
  engine's (Engine.vocab_split): Megatron-LM and Megatron-DeepSpeed pad it to a multiple of
  128 x tp and the plan is priced padded (Engine.built_model), torchtitan's DTensor shards it
  unevenly, our runtime needs tp to divide it (its vocabulary-parallel loss);
* a tp group sits inside one host for an engine that places TP per host (our runtime:
  Engine.tp_runs; ranks are laid out tp innermost): tp divides it whenever the job spans more
  than one. Megatron, DeepSpeed and torchtitan run tp groups over nodes too (priced over the
  inter-node links), Megatron's TP communication overlap only inside an NVLink domain
  (`tp_comm_overlap_fits`); the search looks for tp inside the domain (Engine.tp_limit);
* sequence parallelism shards the sequence over the tp group: tp > 1 and seq_len % tp == 0
  (with context parallelism, each cp rank's s/cp tokens over tp);
* context parallelism (cp > 1) splits each sequence into 2*cp chunks for the causal load
  balance (zigzag: Megatron-Core asserts seq_len % (2*cp) == 0, megatron/core/utils.py
  get_batch_on_this_cp_rank; torch's context_parallel likewise): seq_len % (2*cp) == 0; it
  runs on flash/fused attention kernels only (TE's and torch's CP attention); Ulysses (a2a)
  splits the heads of a TP rank over cp: (KV heads / tp) % cp == 0 (TE asserts the heads and
  the GQA groups divisible by cp);
* the model has a position for every token: seq_len <= max_seq_len with learned positions (a
  table of that many rows; rope and ALiBi are computed for any length);
* every pipeline rank holds at least one layer per model chunk: pp * vpp <= layers; any pp
  up to the layers (`pp_allowed`): Megatron's layout and torchtitan's module lists place any
  contiguous split, DeepSpeed's PipelineModule the splits its partition methods give
  (`engine_partitions`: BLOOM-176B's 70 layers over 12 stages);
* the global batch splits over data parallelism and micro-batches: dp * mbs * m == global batch;
* interleaved 1F1B: torch's ScheduleInterleaved1F1B runs m micro-batches in rounds of
  max(1, m // pp), so m is a multiple of the rounds (`torch_interleaved_ok`); the search offers
  only m % pp == 0 (Megatron's rule, `interleaved_ok`), which implies it.

Every Problem carries the engine source that states it (`cited`: the engine's own statement,
RULE_SOURCES for the rules every engine states alike, the engine's options for what it offers
at all). The predicates are cheap (the search calls them per candidate); `plan_problems`
renders the problems of a Plan one line each (Plan.validate raises the first; with
runner="runtime" the runtime refuses with it before any work); `launch_problems` adds what
depends on how the runtime was launched. Pure Python: no torch, no numpy.
"""
from __future__ import annotations

from planner.engines import ENGINES, engine_for, get_engine
from planner.engines.spec import ALL_OR_NONE, BALANCED_SPLIT, PER_CHUNK
from planner.precision import gpu_precision_problem, platform_of, precision_problem
from planner.problem import Problem
from planner.cost.schedule import schedule_problem, stage_rank
from planner.vocab import MULTI_CHUNK_SCHEDULES, ZERO_BUBBLE_SCHEDULES

# ---- where each engine refuses: the `source` of every Problem ----------------------------

# Rules every engine states alike, as the engine source that refuses them (Megatron-LM's, with
# torch's where PyTorch's engines refuse in torch). An engine's own statement of a rule
# (Engine.sources) comes first; rules of what an engine offers at all (engine_*) cite that
# engine's options (ENGINE_OPTIONS).
RULE_SOURCES = {
    "zero_bubble_layout": "torch/distributed/pipelining/schedules.py (ScheduleZBVZeroBubble and "
                          "ScheduleDualPipeV: exactly 2 stages per rank; ScheduleDualPipeV: at "
                          "least 2 x pp micro-batches)",
    "zero_bubble_needs_pp": "torch/distributed/pipelining/schedules.py (the multi-stage "
                            "schedules need more than one pipeline rank)",
    "batch_positive": "megatron/training/arguments.py (batch sizes and --seq-length must be "
                      "positive)",
    "positive": "megatron/training/arguments.py (parallel sizes, batch sizes must be positive)",
    "batch_splits": "megatron/core/num_microbatches_calculator.py (global batch divisible by "
                    "micro batch x data-parallel size); DeepSpeed train_batch_size assertion "
                    "(deepspeed/runtime/config.py _batch_assertion)",
    "capacity_dispatcher": "megatron/core/transformer/transformer_config.py "
                           "(moe_pad_expert_input_to_capacity with the alltoall dispatcher)",
    "capacity_needs_moe": "megatron/core/transformer/transformer_config.py "
                          "(moe_expert_capacity_factor needs num_moe_experts)",
    "capacity_positive": "megatron/core/transformer/transformer_config.py "
                         "(moe_expert_capacity_factor)",
    "cp_comm_known": "megatron/training/arguments.py --cp-comm-type choices",
    "cp_split": "megatron/core/utils.py get_batch_on_this_cp_rank (seq_len divisible by 2*cp); "
                "transformer_engine/pytorch/attention (CP needs fused/flash attention)",
    "dispatcher_needs_moe": "megatron/core/transformer/transformer_config.py "
                            "(moe_token_dispatcher_type with num_moe_experts)",
    "divides_cluster": "megatron/core/parallel_state.py initialize_model_parallel (world size "
                       "divisible by tp x pp x cp)",
    "world_fits": "megatron/core/parallel_state.py initialize_model_parallel (world size "
                  "divisible by tp x pp x cp)",
    "whole_cluster": "megatron/core/parallel_state.py initialize_model_parallel (dp = world "
                     "size / (tp x pp x cp): every launched rank is in the grid)",
    "ep_comm_overlap": "megatron/core/transformer/transformer_config.py "
                       "(overlap_moe_expert_parallel_comm checks)",
    "ep_needs_moe": "megatron/core/parallel_state.py initialize_model_parallel "
                    "(expert_model_parallel_size > 1 needs num_moe_experts)",
    "ep_split": "megatron/core/parallel_state.py initialize_model_parallel (MoE parallel "
                "folding); megatron/core/transformer/moe/moe_layer.py (num_experts % ep)",
    "export_features": "the engine's model definition (planner/export/<engine>.py writes what "
                       "its flags can say)",
    "flex_needs_ep": "megatron/core/transformer/moe/token_dispatcher.py MoEFlexTokenDispatcher "
                     "(\"Flex token dispatcher requires TPxEP > 1\")",
    "interleaved_needs_pp": "megatron/training/arguments.py (virtual pipeline stages need "
                            "pipeline-model-parallel-size > 1)",
    "vpp_needs_pp": "megatron/training/arguments.py (virtual pipeline stages need "
                    "pipeline-model-parallel-size > 1)",
    "vpp_needs_interleaved": "megatron/core/pipeline_parallel/schedules.py get_forward_backward_"
                             "func (virtual stages run the interleaved schedule)",
    "interleaved_rounds": "torch/distributed/pipelining/schedules.py ScheduleInterleaved1F1B",
    "moe_imbalance": "planner input (--moe-imbalance is the planner's own pricing knob)",
    "moe_imbalance_needs_moe": "planner input (--moe-imbalance is the planner's own pricing "
                               "knob)",
    "positions": "megatron/core/models/common/embeddings/language_model_embedding.py (the "
                 "learned position table of max_position_embeddings rows); runtime/model.py "
                 "pos_embeddings",
    "mixed_platform": "torch/version.py (a build is CUDA or ROCm: torch.version.cuda / "
                      "torch.version.hip); torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp "
                      "(NCCL, RCCL on ROCm builds; CUDA tensors only)",
    "mixed_groups": "megatron/core/parallel_state.py initialize_model_parallel (order "
                    "tp-cp-ep-dp-pp: pp outermost, so a pipeline rank's tp*cp*dp ranks are "
                    "consecutive and the hosts launched in node-rank order hold them)",
    "pp_layers": "megatron/core/transformer/transformer_block.py get_num_layers_to_build (every "
                 "pipeline rank and virtual stage builds at least one layer); "
                 "deepspeed/runtime/pipe/module.py",
    "priced_for_engine": "planner/engines/<engine>.py (a plan is priced for one engine)",
    "recompute_modules_need_selective": "megatron/training/arguments.py (--recompute-modules "
                                        "with --recompute-granularity selective)",
    "sp_splits_sequence": "megatron/core/tensor_parallel/mappings.py "
                          "_reduce_scatter_along_first_dim (the sequence divisible by tp)",
    "stage_layers": "megatron/training/arguments.py --pipeline-model-parallel-layout",
    "tp_splits_model": "megatron/core/transformer/attention.py / megatron/core/tensor_parallel/"
                       "layers.py: divide() asserts tp divides the heads, query groups and FFN "
                       "(megatron/core/utils.py ensure_divisibility)",
    "stage_layers_need_pp": "megatron/training/arguments.py --pipeline-model-parallel-layout "
                            "(one stage per pipeline rank)",
    "stages": "megatron/core/transformer/pipeline_parallel_layer_layout.py (contiguous stages "
              "covering every layer)",
    "tp_comm_overlap_in_domain": "transformer_engine/common/comm_gemm_overlap/userbuffers/"
                                 "userbuffers-host.cpp create_communicator_grouped2 (the "
                                 "tensor-parallel group inside a node or an MNNVL clique)",
    "tp_in_domain": "megatron/core/parallel_state.py (tp innermost: a tp group is consecutive "
                    "ranks, so it spans domains unless tp divides them); NCCL over NVLink",
    "zero_known": "deepspeed/runtime/zero/config.py ZeroStageEnum (stages 0-3)",
    "zero_needs_dp": "deepspeed/runtime/zero (ZeRO partitions over the data-parallel group)",
    "precision_known": "megatron/training/arguments.py (--fp8-format, --fp4-format)",
    "recipe_needs_low_precision": "megatron/training/arguments.py (--fp8-recipe with "
                                  "--fp8-format)",
    "precision_on_gpu": "Transformer Engine docs, \"Using FP8 and FP4 with Transformer "
                        "Engine\"; NVIDIA and AMD datasheets (planner.precision ARCHS)",
    # offload: the planner's own, where its figures of the host come from and what it prices
    "offload_host_known": "planner/catalog/gpus.py HOSTS (the host figures of each catalog "
                          "system; a cluster JSON gives host_memory_gib, host_link_gbps, "
                          "host_memory_gbps, nvme_gbps, nvme_tib)",
    "ep_overlap_offload": "the planner's rule, not Megatron's (which runs both): the EP overlap "
                          "runs each layer through its own schedule plan (megatron/core/models/"
                          "gpt/fine_grained_callables.py), outside TransformerBlock's CPU-offload "
                          "context (megatron/core/transformer/transformer_block.py "
                          "offload_context), so the offload the plan prices would not run",
    "offload_moe": "planner/cost/moe.py (an MoE layer's optimizer is priced on the GPU only)",
    "engine_compile": "planner/engines/spec.py with_compile (compiled pricing, the engines "
                      "whose compile_option is set) and planner/export/torchtitan.py "
                      "([compile] enable): the planner prices and exports torch.compile for "
                      "torchtitan only",
    "dp_shard_divides": "torchtitan/distributed/parallel_dims.py _validate (dp_replicate x "
                        "dp_shard = dp); megatron/core/parallel_state.py (data-parallel size "
                        "divisible by num_distributed_optimizer_instances)",
    "engine_zeropp": "deepspeed/runtime/zero/config.py (zero_quantized_weights, "
                     "zero_hpz_partition_size, zero_quantized_gradients: DeepSpeed's own)",
    "hsdp_priced": "planner/cost/dataparallel.py (the dense, cp = 1 data-parallel groups of "
                   "torchtitan, DeepSpeed MiCS, Megatron and the runtime)",
    "offload_host_memory": "planner/cost/offload.py host_use (host memory x 1.5, DeepSpeed's "
                           "additional_buffer_factor: deepspeed/runtime/zero/stage3.py "
                           "estimate_zero3_model_states_mem_needs)",
}

# the rules of what one engine offers (its spec's data): cited by the engine's own statement
# (Engine.sources) or else its options (ENGINE_OPTIONS)
ENGINE_RULES = frozenset((
    "engine_tp", "engine_pp", "engine_sp", "engine_schedule", "engine_recompute",
    "engine_recompute_modules", "engine_dispatcher", "engine_moe", "engine_capacity_factor",
    "engine_ep_comm_overlap", "engine_tp_comm_overlap", "engine_cp", "engine_cp_comm",
    "engine_precision", "engine_recipe", "zero_stage", "zero_under_pp",
    "zero0_without_tp_pp", "etp", "ep_needs_sharded_dp", "moe_with_tp", "mla_with_tp",
    "model_parts", "moe_tp_needs_sp",
    "engine_offload", "offload_param_zero3", "offload_distributed_optimizer", "engine_hsdp",
    "zeropp_zero3", "offload_together", "offload_zero",
    "recompute_all_or_none", "recompute_per_chunk", "partition_stage_layers",
    "offload_activations_pp", "offload_activations_kept",
    "tp_splits_model", "zero_bubble_zero"))

# where each engine lists what it runs: the citation of a rule of what it offers at all
ENGINE_OPTIONS = {
    "megatron": "megatron/training/arguments.py",
    "deepspeed": "deepspeed/runtime/config.py; deepspeed/runtime/pipe/engine.py",
    "torchtitan": "torchtitan/config/job_config.py; torchtitan/distributed/parallel_dims.py",
    "fsdp": "torch/distributed/fsdp ShardingStrategy; llm-foundry (no tensor, pipeline or "
            "context parallelism)",
    "runtime": "runtime/parallelize.py, runtime/pipeline.py",
}


def rule_source(rule: str, engine=None) -> str:
    """The engine source that states `rule`: the engine's own (Engine.sources), the shared
    RULE_SOURCES, or, for what an engine offers at all, its options (ENGINE_OPTIONS)."""
    own = engine.source_of(rule) if engine is not None else ""
    if own:
        return own
    if rule in RULE_SOURCES:
        return RULE_SOURCES[rule]
    if engine is not None:
        return f"{ENGINE_OPTIONS.get(engine.name, 'planner/engines/' + engine.name + '.py')} " \
               f"(planner/engines/{engine.name}.py)"
    return ENGINE_OPTIONS["megatron"]


def cited(problem: Problem, engine=None) -> Problem:
    """`problem` with its engine source (`rule_source`) where it has none."""
    if problem.source:
        return problem
    return Problem(problem.rule, problem.knobs, problem.message,
                   rule_source(problem.rule, engine), problem.fix)


# ---- predicates (called per candidate by the search) --------------------------------------


def tp_blockers(model, tp: int, replicate_kv: bool = False, engine=None) -> list:
    """The model's dimensions tp does not divide, as "heads (32)", "KV heads (8)", "FFN (130)",
    "vocabulary (128)". `replicate_kv`: KV heads that divide tp are fine (each rank keeps the
    one KV head its query heads use, as the runtime does). The vocabulary is the `engine`'s to
    split (Engine.vocab_splits: Megatron and DeepSpeed pad it, torchtitan shards it unevenly);
    without an engine tp must divide it."""
    if tp <= 1:
        return []
    out = []
    if model.num_heads % tp:
        out.append(f"heads ({model.num_heads})")
    kv = model.num_kv_heads
    if kv % tp and not (replicate_kv and tp % kv == 0):
        out.append(f"KV heads ({kv})")
    if model.ffn_hidden % tp:
        out.append(f"FFN ({model.ffn_hidden})")
    if model.shared_expert_ffn_hidden % tp:     # a TP-split MLP beside the routed experts
        out.append(f"shared-expert FFN ({model.shared_expert_ffn_hidden})")
    if not vocab_splits(engine, model.vocab_size, tp):
        out.append(f"vocabulary ({model.vocab_size})")
    return out


def vocab_splits(engine, vocab: int, tp: int) -> bool:
    """tp splits a vocabulary of `vocab` tokens as `engine` builds it (None: evenly only)."""
    return engine.vocab_splits(vocab, tp) if engine is not None else vocab % tp == 0


def tp_ok(model, tp: int, replicate_kv: bool = False, engine=None) -> bool:
    """tp splits the heads, the KV heads (or replicates them), the FFN and the vocabulary (as
    `engine` splits it: `tp_blockers`)."""
    kv = model.num_kv_heads
    return (model.num_heads % tp == 0
            and (kv % tp == 0 or replicate_kv and tp % kv == 0)
            and model.ffn_hidden % tp == 0 and model.shared_expert_ffn_hidden % tp == 0
            and vocab_splits(engine, model.vocab_size, tp))


def sp_ok(tp: int, seq_len: int, cp: int = 1) -> bool:
    """Sequence parallelism shards the sequence (a cp rank's s/cp tokens) over the tp group."""
    return tp > 1 and seq_len % (tp * cp) == 0


def cp_ok(seq_len: int, cp: int) -> bool:
    """The sequence splits into 2*cp equal chunks (zigzag load balance)."""
    return cp == 1 or (cp > 1 and seq_len % (2 * cp) == 0)


def cp_a2a_ok(model, tp: int, cp: int) -> bool:
    """Ulysses all-to-all: every cp rank gets whole KV heads of the TP rank's share."""
    return model.num_kv_heads % tp == 0 and (model.num_kv_heads // tp) % cp == 0


def cp_problems(model, seq_len: int, tp: int, cp: int, comm_type: str, flash: bool) -> list:
    """Why context parallelism cp (exchanging K/V by comm_type) cannot split this model and
    sequence, as phrases (empty for cp 1)."""
    if cp == 1:
        return []
    out = []
    if not cp_ok(seq_len, cp):
        out.append(f"context parallel needs seq_len {seq_len} divisible by 2*cp = {2 * cp} "
                   f"(zigzag load balance)")
    if not flash:
        out.append("context parallel runs on flash attention kernels only (attention eager)")
    if comm_type == "a2a" and not cp_a2a_ok(model, tp, cp):
        out.append(f"cp comm a2a (Ulysses) needs the KV heads per tp rank "
                   f"({model.num_kv_heads} / tp {tp}) divisible by cp {cp}")
    return out


def has_positions(model, seq_len: int) -> bool:
    """Learned positions are a table of max_seq_len rows (Megatron's learned_absolute
    embedding, our runtime's pos_embeddings: runtime/model.py). RoPE and ALiBi have no table:
    every engine computes them for the sequence it trains (runtime/model.py rope_cos_sin(s);
    Megatron's RotaryEmbedding for --max-position-embeddings, which its export sets to the
    sequence), as Megatron-Bridge's llama3_8b_16k/64k/128k recipes train Llama 3 8B (8192
    positions) at 16K-128K tokens."""
    return seq_len <= model.max_seq_len or model.position != "learned"


def rank_min_layers(engine, pp: int, vpp: int) -> list:
    """The fewest decoder layers each of pp pipeline ranks may hold with vpp model chunks: one
    per chunk, except where the engine lets the embedding and the loss stand for a layer
    (`Engine.end_chunks_may_be_empty`: Megatron's --account-for-embedding-in-pipeline-split
    and --account-for-loss-in-pipeline-split), whose first and last rank may leave one chunk
    empty: Llama 3.1 405B's 126 layers over pp 16 x vpp 8 as 7, 8 x 14, 7 (Megatron-Bridge's
    405B recipes)."""
    mins = [vpp] * pp
    if engine is not None and engine.end_chunks_may_be_empty and pp > 1 and vpp > 1:
        mins[0] -= 1
        mins[-1] -= 1
    return mins


def pp_ok(model, pp: int, vpp: int = 1, engine=None) -> bool:
    """Every pipeline rank holds at least one layer of each of its vpp model chunks (but the
    end chunks the engine lets go empty: `rank_min_layers`)."""
    return sum(rank_min_layers(engine, pp, vpp)) <= model.num_layers


def split_blockers(num_layers: int, pp: int, vpp: int, layers, engine=None) -> list:
    """Why decoder layers per pipeline rank `layers` cannot lay out pp ranks of vpp model chunks,
    as phrases: one count per rank, all layers placed, at least one per chunk (each rank's
    layers are split evenly over its chunks: planner.plan.make_stages), and for an `engine`
    that partitions by its own methods, a split one of them gives (`partition_problem`)."""
    out = []
    if len(layers) != pp:
        out.append(f"{len(layers)} layer counts for pp {pp}")
    if sum(layers) != num_layers:
        out.append(f"the counts sum to {sum(layers)}, not the model's {num_layers} layers")
    short = [(n, lo) for n, lo in zip(layers, rank_min_layers(engine, len(layers), vpp))
             if n < lo]
    if short or not layers:
        n, lo = short[0] if short else (0, vpp)
        out.append(f"a rank holds {n} layers, fewer than its {vpp} model chunks"
                   + ("" if lo == vpp else f" less the one the embedding or loss stands for"))
    problem = partition_problem(engine, num_layers, layers) if engine and not out else None
    if problem:
        out.append(problem.message)
    return out


def interleaved_ok(m: int, pp: int) -> bool:
    """The interleaved schedule the search offers: m divisible by pp (Megatron's rule, and
    within torch's)."""
    return m % pp == 0


def torch_interleaved_ok(m: int, pp: int) -> bool:
    """torch's ScheduleInterleaved1F1B: m a multiple of its max(1, m // pp) rounds."""
    rounds = max(1, m // pp)
    return m % rounds == 0


def ep_blockers(model, ep: int, etp: int, tp: int, dp: int, cp: int = 1) -> list:
    """Why expert parallelism ep with expert tensor parallelism etp cannot split this model on
    this grid, as phrases. Megatron's MoE parallel folding (megatron/core/parallel_state.py,
    initialize_model_parallel with expert_model_parallel_size and
    expert_tensor_parallel_size): the expert grid etp x ep x expert-dp x pp covers the same
    ranks as tp x cp x dp x pp, so ep * etp divides tp * cp * dp; ep splits the routed experts
    and etp each expert's FFN."""
    out = []
    if (ep > 1 or etp > 1) and not model.is_moe:
        out.append(f"model {model.name} has no experts (ep and etp need an MoE model)")
        return out
    if not model.is_moe:
        return out
    if model.num_experts % ep:
        out.append(f"ep {ep} does not divide the {model.num_experts} experts")
    if model.moe_ffn_hidden % etp:
        out.append(f"etp {etp} does not divide the expert FFN ({model.moe_ffn_hidden})")
    if (tp * cp * dp) % (ep * etp):
        out.append(f"ep*etp = {ep * etp} does not divide tp*cp*dp = {tp * cp * dp} "
                   f"(experts are folded out of the dense grid)")
    return out


def ep_ok(model, ep: int, etp: int, tp: int, dp: int, cp: int = 1) -> bool:
    return not ep_blockers(model, ep, etp, tp, dp, cp)


def flex_ok(ep: int, etp: int) -> bool:
    """Megatron's flex dispatcher (DeepEP / HybridEP) spans the experts' tensor x expert
    parallel group and asserts it has more than one rank (megatron/core/transformer/moe/
    token_dispatcher.py MoEFlexTokenDispatcher: "Flex token dispatcher requires TPxEP > 1")."""
    return ep * etp > 1


def ep_overlap_offload_problem(recompute: str) -> str | None:
    """Why the EP overlap cannot go with this recompute as priced: the layers it runs are not
    offloaded (RULE_SOURCES ep_overlap_offload), else None."""
    if recompute == "offload":
        return "runs its layers outside the activation offload (--cpu-offloading-num-layers)"
    return None


def ep_comm_overlap_blockers(ep: int, pp: int, schedule: str, recompute: str,
                             dispatcher: str, mtp_layers: int = 0,
                             recompute_modules: tuple = ()) -> list:
    """Why Megatron-Core cannot overlap the EP all-to-alls across micro-batches
    (--overlap-moe-expert-parallel-comm) in this layout, as phrases: its checks in
    megatron/core/transformer/transformer_config.py (expert parallelism, the alltoall or flex
    dispatcher, no full recompute and no recompute of the whole MoE layer, which re-runs the
    dispatch, virtual pipeline stages when pp > 1)."""
    out = []
    if ep <= 1:
        out.append("needs expert parallelism (ep > 1)")
    if dispatcher not in ("alltoall", "flex"):
        out.append(f"runs with the alltoall or flex dispatcher, not {dispatcher or 'none'}")
    if recompute == "full":
        out.append("does not run with full recompute")
    if recompute == "selective" and "moe" in recompute_modules:
        out.append("does not run with the moe recompute module")
    if pp > 1 and schedule != "interleaved":
        out.append("needs the interleaved schedule when pp > 1")
    if mtp_layers > 1:
        out.append(f"supports at most one MTP layer (the model has {mtp_layers})")
    return out


def batch_ok(global_batch: int, dp: int, mbs: int = 1) -> bool:
    """The global batch splits into dp ranks of micro-batches of mbs sequences."""
    return global_batch % (dp * mbs) == 0


# ---- messages of the rules (one line each, no "invalid plan:" prefix) --------------------

def positions_problem(model, seq_len: int) -> str | None:
    if has_positions(model, seq_len):
        return None
    return (f"seq_len {seq_len} exceeds the model's max_seq_len {model.max_seq_len} "
            f"({model.position} positions)")


def tp_problem(model, tp: int, replicate_kv: bool = True, engine=None) -> str | None:
    blockers = tp_blockers(model, tp, replicate_kv, engine)
    if not blockers:
        return None
    return f"tp {tp} does not divide the model's {and_list(blockers)}"


def node_problem(tp: int, world_size: int, domain: int,
                 rank_order=("pp", "dp", "tp")) -> str | None:
    """tp groups that would span TP domains (Engine.tp_domain: the GPUs a TP group may span)
    when the job spans more than one."""
    if rank_order[-1] == "tp" and world_size > domain and domain % tp:
        return (f"tp {tp} groups would span nodes of {domain} GPUs "
                f"(tp must divide the GPUs per node)")
    return None


def tp_allowed(engine, cluster, model, tp: int) -> bool:
    """A searched tp the engine runs for this model on this cluster: within its limit and its
    TP domain (Engine.tp_fits, the one answer to where a TP group may live), splitting the
    model, and MLA only where the engine splits it."""
    return (tp <= engine.tp_limit(cluster) and engine.tp_fits(cluster, tp)
            and tp_ok(model, tp, engine=engine) and not mla_tp_problem(engine, model, tp))


def tp_comm_overlap_fits(engine, cluster, tp: int, world_size: int) -> bool:
    """Megatron's --tp-comm-overlap (Transformer Engine userbuffers) runs a tp group inside one
    NVLink domain (transformer_engine/common/comm_gemm_overlap/userbuffers/userbuffers-host.cpp
    create_communicator_grouped2: the tensor group among a node's GPUs, or an MNNVL clique)."""
    return (tp <= 1 or world_size <= cluster.nvlink_domain
            or cluster.nvlink_domain % tp == 0)


def tp_split_source(engine, model, tp: int) -> str:
    """Where the engine refuses a tp that does not split the model: its vocabulary rule when
    only the vocabulary is left over, else the heads' and FFN's."""
    megatron = ("megatron/core/transformer/attention.py / megatron/core/tensor_parallel/"
                "layers.py: divide() asserts tp divides the heads, query groups and FFN "
                "(megatron/core/utils.py ensure_divisibility)")
    if engine is None:
        return megatron
    if tp_blockers(model, tp, True, engine) == [f"vocabulary ({model.vocab_size})"]:
        return engine.source_of("vocab_split", "megatron/core/tensor_parallel/utils.py "
                                               "VocabUtility.vocab_range_from_global_vocab_size")
    return engine.source_of("tp_splits_model", megatron)


def world_product(p) -> str:
    """How a plan's world is named in messages: tp*pp*dp, or tp*cp*pp*dp with context
    parallelism."""
    return "tp*cp*pp*dp" if p.cp > 1 else "tp*pp*dp"


def and_list(items: list) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


# ---- what an engine can run: the rules that read the engine spec's data -------------------

# parts of a model an engine's model code may not build (Engine.model_lacks): the predicate
# on the model and how a message names it
MODEL_PARTS = {
    "mtp": (lambda m: m.mtp_layers > 0,
            lambda m: f"multi-token prediction ({m.mtp_layers} mtp_layers)"),
    "alibi": (lambda m: m.position == "alibi", lambda m: "ALiBi position embeddings"),
}


def model_part_problem(engine, model) -> Problem | None:
    """A part of the model the engine's model code does not build."""
    for key in engine.model_lacks:
        has, phrase = MODEL_PARTS[key]
        if has(model):
            return Problem("model_parts", ("model",),
                           f"model {model.name}: {phrase(model)} is not built by the "
                           f"{engine.name} yet" if engine.name != "runtime" else
                           f"model {model.name}: {phrase(model)} is not built by the runtime "
                           f"yet", source=engine.source_of("model_parts"))
    return None


def mla_tp_problem(engine, model, tp: int) -> Problem | None:
    if model.is_mla and tp > 1 and not engine.mla_with_tp:
        who = "the runtime" if engine.name == "runtime" else engine.name
        return Problem("mla_with_tp", ("tp", "model"),
                       f"model {model.name}: multi-head latent attention with tp {tp} is not "
                       f"supported by {who} yet (tp 1 only)",
                       source=engine.source_of("mla_with_tp"))
    return None


def zero_problem(engine, zero: int, tp: int, pp: int, dp: int, cp: int = 1) -> Problem | None:
    """Why the engine has no ZeRO-`zero` on this grid (Engine.zero_ok), naming the one rule:
    ZeRO needs data parallelism, DDP only as 1-D data parallelism, the stages it runs under
    pipelining, the stages it runs at all."""
    if engine.zero_ok(zero, tp, pp, dp, cp):
        return None
    e = engine.name
    grid = f"tp={tp} pp={pp} dp={dp}" + (f" cp={cp}" if cp > 1 else "")
    head = f"{e} has no ZeRO-{zero} with {grid}"
    if dp * cp == 1:
        return Problem("zero_needs_dp", ("zero", "dp"),
                       f"{head}: ZeRO shards over data parallelism and dp*cp is 1",
                       fix="use --zero 0")
    if zero == 0 and not engine.zero0_with_tp_pp and (tp > 1 or pp > 1 or cp > 1):
        return Problem("zero0_without_tp_pp", ("zero", "tp", "pp", "cp"),
                       f"{head}: it runs ZeRO-0 (DDP) only as 1-D data parallelism",
                       source=engine.source_of("zero0_with_tp_pp"),
                       fix=f"use --zero {min(engine.zero_stages_with_pp or (2,))}")
    if pp > 1:
        return zero_under_pp_problem(engine, zero, head)
    return Problem("zero_stage", ("zero",), f"{head}: it runs ZeRO {_stages(engine.zero_stages)}",
                   fix=f"use --zero {max(engine.zero_stages)}")


def zero_under_pp_problem(engine, zero: int, head: str) -> Problem | None:
    """The ZeRO stages the engine runs under pipelining (pp > 1); `head` opens the message."""
    e, stages = engine.name, engine.zero_stages_with_pp
    if zero in stages:
        return None
    if not stages:
        return Problem("zero_under_pp", ("zero", "pp"),
                       f"{head}: {e} has no pipeline parallelism", fix="use --pp 1")
    return Problem("zero_under_pp", ("zero", "pp"),
                   f"{head}: {e} runs ZeRO {_stages(stages)} under pipelining (pp > 1)",
                   source=engine.source_of("zero_with_pp"),
                   fix=f"use --zero {max(stages)}, or --pp 1 for ZeRO-{zero}"
                   if zero in engine.zero_stages else f"use --zero {max(stages)}")


# ---- offload (planner.cost.offload) --------------------------------------------------------

# The layers of a rank whose activations an activation offload keeps on the GPU at least: the
# one engine that offloads them, Megatron-Core, offloads fewer than the layers it builds
# (transformer_config.py, `offload_activations_kept` in planner.engines.megatron sources)
OFFLOAD_KEPT_LAYERS = 1


def activation_offload_problem(engine, cluster, pp: int) -> Problem | None:
    """Why `engine` cannot offload activations (recompute "offload") at pipeline size `pp` on
    this cluster: none without pipeline parallelism, or the host link unknown (nothing to
    price the copies with). Whether the engine offloads at all is recompute_problem's."""
    if pp > 1:
        return Problem("offload_activations_pp", ("recompute", "pp"),
                       f"{engine.name} offloads activations only without pipeline "
                       f"parallelism (pp {pp})", source=engine.source_of("offload_activations_pp"),
                       fix="use --pp 1, or recompute instead")
    return host_figures_problem(cluster, ("host_link_gbps", "host_memory_gib"), ("recompute",))


def host_figures_problem(cluster, names: tuple, knobs: tuple) -> Problem | None:
    """The host figures (planner.specs.Gpu host_* / nvme_*) among `names` that the cluster
    leaves unknown (0), which an offload is priced with."""
    missing = [k for k in names if getattr(cluster.gpu, k) <= 0]
    if not missing:
        return None
    return Problem("offload_host_known", knobs,
                   f"cluster {cluster.name} gives no {', '.join(missing)} of its hosts, "
                   f"which an offload is priced with", source=RULE_SOURCES["offload_host_known"],
                   fix="give them in a cluster JSON (--cluster FILE)")



def offload_problem(engine, cluster, optimizer: str, params: str, zero: int | None,
                    model=None, dp_cp: int | None = None) -> Problem | None:
    """Why the engine cannot offload the optimizer to `optimizer` and the parameters to
    `params` ("none", "cpu", "nvme") at ZeRO-`zero` (None: not fixed yet) on this cluster:
    devices it has, DeepSpeed's offload_param at ZeRO-3 only, the host figures the cluster
    must give to price it, a dense model (`model`, when given)."""
    if optimizer == "none" and params == "none":
        return None
    e = engine.name
    src = engine.source_of("offload") or rule_source("engine_offload", engine)
    for knob, dev, have in (("offload_optimizer", optimizer, engine.offload_optimizer_devices),
                            ("offload_params", params, engine.offload_param_devices)):
        if dev != "none" and dev not in have:
            what = "the optimizer states" if knob == "offload_optimizer" else "the parameters"
            has = f"it offloads them to {' or '.join(have)} only" if have else \
                f"it has no such offload"
            return Problem("engine_offload", (knob,), f"{e} does not offload {what} to {dev}: "
                           f"{has}", source=src,
                           fix="plan with --engine deepspeed (ZeRO-Offload / ZeRO-Infinity)"
                           if e != "deepspeed" else "")
    if engine.offload_optimizer_with_params and (optimizer == "none") != (params == "none"):
        return Problem("offload_together", ("offload_optimizer", "offload_params"),
                       f"{e} offloads the parameters, gradients and optimizer states together "
                       f"(give --offload-optimizer cpu --offload-params cpu)", source=src)
    if (engine.offload_zero_stages is not None and zero is not None
            and zero not in engine.offload_zero_stages):
        return Problem("offload_zero", ("offload_optimizer", "zero"),
                       f"{e} offloads under ZeRO "
                       f"{'/'.join(map(str, engine.offload_zero_stages))} only, not ZeRO-{zero}",
                       source=src, fix=f"use --zero {max(engine.offload_zero_stages)}")
    if params != "none" and engine.offload_param_zero3 and zero is not None and zero != 3:
        return Problem("offload_param_zero3", ("offload_params", "zero"),
                       f"{e} offloads the parameters under ZeRO-3 only (offload_param), not "
                       f"ZeRO-{zero}", source=src, fix="use --zero 3")
    if (optimizer != "none" and engine.offload_needs_distributed_optimizer and zero == 0
            and dp_cp is not None and dp_cp > 1):
        return Problem("offload_distributed_optimizer", ("offload_optimizer", "zero"),
                       f"{e} offloads the optimizer with its distributed optimizer only (ZeRO-1 "
                       f"or more), not ZeRO-0 over dp x cp = {dp_cp}", source=src,
                       fix="use --zero 1")
    if model is not None and model.is_moe:
        return Problem("offload_moe", ("model",), f"offload is not priced for MoE models "
                       f"({model.name})", source=RULE_SOURCES["offload_moe"])
    need = ("host_link_gbps", "host_memory_gib", "host_memory_gbps") + (
        ("nvme_gbps", "nvme_tib") if "nvme" in (optimizer, params) else ())
    return host_figures_problem(cluster, need, ("cluster",))


def hsdp_problem(engine, dp_shard: int, dp: int, cp: int, zero: int | None,
                 model=None) -> Problem | None:
    """Why the engine cannot shard the ZeRO states over groups of `dp_shard` of the dp x cp
    ranks (HSDP; 0 or dp x cp: not hybrid) at ZeRO-`zero` (None: not fixed yet)."""
    n = dp * cp
    if dp_shard in (0, n):
        return None
    e = engine.name
    if dp_shard < 1 or n % dp_shard:
        return Problem("dp_shard_divides", ("dp_shard", "dp"),
                       f"dp shard {dp_shard} does not divide dp x cp = {n}",
                       source=RULE_SOURCES["dp_shard_divides"],
                       fix="give --dp-shard a divisor of dp x cp")
    if not engine.hsdp_zero_stages:
        # not the engine's refusal: FSDP1 has ShardingStrategy.HYBRID_SHARD, which the
        # planner neither prices nor exports for it
        return Problem("hsdp_priced", ("dp_shard",),
                       f"hybrid sharding (--dp-shard {dp_shard}) is not planned for {e}",
                       source=RULE_SOURCES["hsdp_priced"],
                       fix="plan with --engine torchtitan, deepspeed (MiCS) or megatron")
    if zero is not None and zero not in engine.hsdp_zero_stages:
        return Problem("engine_hsdp", ("dp_shard", "zero"),
                       f"{e} shards inside groups (--dp-shard) under ZeRO "
                       f"{'/'.join(map(str, engine.hsdp_zero_stages))} only, not ZeRO-{zero}",
                       source=engine.source_of("hsdp"),
                       fix=f"use --zero {max(engine.hsdp_zero_stages)}")
    if cp > 1 or (model is not None and (model.is_moe or model.mtp_layers)):
        return Problem("hsdp_priced", ("dp_shard",),
                       "hybrid sharding is priced for dense models without context parallelism "
                       "or MTP only", source=RULE_SOURCES["hsdp_priced"])
    return None


def zeropp_problem(engine, zero: int | None, dp_shard: int = 0) -> Problem | None:
    """Why the engine cannot run ZeRO++ (quantized weight and gradient collectives, the
    node's secondary partition) at ZeRO-`zero` (None: not fixed yet)."""
    if not engine.zeropp:
        return Problem("engine_zeropp", ("zeropp",), f"{engine.name} has no ZeRO++ (it is "
                       f"DeepSpeed's: zero_quantized_weights, zero_hpz_partition_size, "
                       f"zero_quantized_gradients)", source=RULE_SOURCES["engine_zeropp"],
                       fix="plan with --engine deepspeed")
    if zero is not None and zero != 3:
        return Problem("zeropp_zero3", ("zeropp", "zero"),
                       f"{engine.name} runs ZeRO++ under ZeRO-3 only, not ZeRO-{zero}",
                       source=engine.source_of("zeropp"), fix="use --zero 3")
    if dp_shard:
        return Problem("hsdp_priced", ("zeropp", "dp_shard"),
                       "ZeRO++ is priced without hybrid sharding (MiCS)",
                       source=RULE_SOURCES["hsdp_priced"])
    return None


def offload_capacity_problem(host, knobs: str) -> Problem | None:
    """An offload whose states one node's host memory or NVMe cannot hold (`host`:
    planner.cost.offload.HostUse of the layout that needs the least); `knobs` names it."""
    if host.fits:
        return None
    if host.host_gib > host.host_capacity_gib:
        what = (f"{host.host_gib:,.0f} GiB of host memory per node, more than its "
                f"{host.host_capacity_gib:,.0f} GiB")
    else:
        what = (f"{host.nvme_tib:,.1f} TiB of NVMe per node, more than its "
                f"{host.nvme_capacity_tib:,.1f} TiB")
    return Problem("offload_host_memory", ("offload_optimizer", "offload_params"),
                   f"{knobs} needs at least {what}",
                   source=RULE_SOURCES["offload_host_memory"],
                   fix="offload to nvme, or plan on more GPUs")


def _stages(stages) -> str:
    s = sorted(stages)
    return f"{s[0]}-{s[-1]}" if len(s) >= 2 and s == list(range(s[0], s[-1] + 1)) else \
        ", ".join(map(str, s))


def pp_allowed(engine, model, pp: int) -> bool:
    """A pipeline degree the engine runs for this model: every rank holds a layer (`pp_ok`);
    every engine here places any pp up to the layers (DeepSpeed by its partition methods,
    `engine_partitions`), so no divisibility of the layers is asked."""
    return pp_ok(model, pp)


def default_split(engine, num_layers: int, pp: int, vpp: int = 1) -> list:
    """Decoder layers per pipeline rank where the placement is not searched: the engine's own
    partition (DeepSpeed's 'type:transformer', the first stages one layer more), else the even
    split (planner.layout.even_split, the larger shares last); where that leaves a rank fewer
    layers than `rank_min_layers`, Megatron's account-for-embedding-and-loss split (the
    embedding and the loss counted as a layer each on the first and last rank)."""
    from planner.layout import even_split
    splits = engine_partitions(engine, num_layers, pp)
    if "type:transformer" in splits:
        return list(splits["type:transformer"])
    split = even_split(num_layers, pp)
    mins = rank_min_layers(engine, pp, vpp)
    if pp > 1 and any(n < lo for n, lo in zip(split, mins)) and mins[0] < vpp:
        split = even_split(num_layers + 2, pp)
        split[0], split[-1] = split[0] - 1, split[-1] - 1
    return split


def engine_partitions(engine, num_layers: int, pp: int) -> dict:
    """{partition method: decoder layers per stage} the engine's pipeline partitions give
    (BALANCED_SPLIT engines: DeepSpeed's PipelineModule; empty for any other)."""
    if engine.stage_layers != BALANCED_SPLIT or engine.stage_partitions is None or pp <= 1:
        return {}
    return engine.stage_partitions(num_layers, pp)


def partition_method(engine, num_layers: int, counts) -> str | None:
    """The engine's partition method that gives `counts` (None: none does, or any split
    runs)."""
    for method, split in engine_partitions(engine, num_layers, len(counts)).items():
        if list(counts) == split:
            return method
    return None


def partition_problem(engine, num_layers: int, counts) -> Problem | None:
    """Decoder layers per pipeline rank the engine's partition methods do not give
    (DeepSpeed: deepspeed/runtime/pipe/module.py _partition_layers)."""
    splits = engine_partitions(engine, num_layers, len(counts))
    if not splits or list(counts) in splits.values():
        return None
    shown = "; ".join(f"{','.join(map(str, v))} ({k})" for k, v in splits.items())
    return Problem("partition_stage_layers", ("stages",),
                   f"{engine.name}'s PipelineModule partitions {num_layers} layers over "
                   f"{len(counts)} stages as {shown}, not {','.join(map(str, counts))}",
                   source=engine.source_of("stage_layers"),
                   fix=f"use --stage-layers {','.join(map(str, next(iter(splits.values()))))}")


def priced_for_problem(plan, engine) -> Problem | None:
    """A plan runs on the engine it was priced for: its step time, memory and settings are that
    engine's (planner.engines)."""
    if plan.engine == engine.name:
        return None
    fix = f"plan it with --engine {engine.name}"
    if engine.name == "runtime" and plan.engine in ("megatron", "deepspeed", "torchtitan"):
        fix += f", or run it on {plan.engine} (plan show PLAN --export {plan.engine})"
    return Problem("priced_for_engine", ("engine",),
                   f"the plan was priced for {plan.engine}, not {engine.name}", fix=fix)


def compile_problem(engine, compile_: bool):
    """torch.compile asked for an engine the planner neither prices nor exports compiled: a
    limit of the planner (RULE_SOURCES "engine_compile"), not of the engine -- Megatron is
    priced with its fused kernels already, and the planner's DeepSpeed, FSDP and runtime
    exports set no compile step."""
    if compile_ and not engine.compile_option:
        return Problem("engine_compile", ("compile",),
                       f"the planner prices and exports torch.compile for torchtitan only, "
                       f"not {engine.name}",
                       fix="plan it without --compile, or with --engine torchtitan")
    return None


def engine_problems(plan, engine) -> list:
    """What of `plan` the engine cannot run as priced, as Problems (empty: it runs it exactly),
    from the engine spec's data. The plan's own engine is not compared here
    (`priced_for_problem`)."""
    p, m, out = plan.parallelism, plan.model, []
    e = engine.name
    for problem in (model_part_problem(engine, m), mla_tp_problem(engine, m, p.tp)):
        if problem:
            out.append(problem)
    if m.is_moe and p.tp > 1 and not p.sequence_parallel and engine.moe_tp_needs_sp:
        out.append(Problem(
            "moe_tp_needs_sp", ("tp", "sequence_parallel"),
            f"MoE model {m.name} with tp {p.tp} needs sequence parallel (as Megatron: "
            f"\"sequence parallel must be used with MoE and tensor parallel\")",
            source=engine.source_of("moe_tp_needs_sp")))
    precision = precision_problem(engine, plan.cluster.gpu, plan.precision, plan.recipe)
    if precision:
        out.append(precision)
    problem = compile_problem(engine, plan.compile)
    if problem:
        out.append(problem)
    if m.is_moe and not engine.moe_dispatchers:
        out.append(Problem("engine_moe", ("model",),
                           f"{e} runs no mixture-of-experts layers as the planner prices them",
                           fix="plan it with --engine megatron or torchtitan"))
    elif m.is_moe and p.tp > 1 and not engine.moe_with_tp:
        out.append(Problem("moe_with_tp", ("tp",), f"{e} runs MoE layers at tp 1 only (tp={p.tp})"))
    elif m.is_moe and not engine.etp_ok(p.etp, p.tp):
        if engine.moe_etp == "equal_tp":
            msg = (f"expert tensor parallelism etp {p.etp} with tp {p.tp}: the "
                   f"{'runtime' if e == 'runtime' else e} splits each expert over the tp ranks "
                   f"only (etp = tp)")
        elif engine.moe_etp == "tp":
            msg = f"{e} runs etp 1 or etp = tp, not etp {p.etp} with tp {p.tp}"
        else:
            msg = f"{e} has no expert tensor parallelism (etp={p.etp})"
        out.append(Problem("etp", ("etp", "tp"), msg, source=engine.source_of("etp")))
    elif m.is_moe and not engine.ep_layout_ok(p.ep, p.etp, p.tp, p.zero_stage):
        out.append(Problem("ep_needs_sharded_dp", ("ep", "etp", "tp", "zero"),
                           f"{e} cannot lay out ep={p.ep} etp={p.etp} with tp={p.tp} and "
                           f"ZeRO-{p.zero_stage}: its experts borrow from sharded data "
                           f"parallelism (ZeRO 2-3) or from tp"))
    if engine.model_features is not None:
        for key, phrase in m.attention_feature_map().items():
            if key not in engine.model_features:
                out.append(Problem("export_features", ("model",),
                                   f"{e}'s export cannot write the model's {phrase}"))
    if p.tp > 1 and engine.max_tp == 1:
        out.append(Problem("engine_tp", ("tp",), f"{e} has no tensor parallelism (tp={p.tp})"))
    if p.tp > 1 and p.sequence_parallel not in engine.sp_choices:
        out.append(Problem("engine_sp", ("sequence_parallel",),
                           f"{e} {'always' if engine.sp_choices == (True,) else 'never'} shards "
                           f"the sequence under tensor parallelism"))
    if p.pp > 1:
        if not engine.pipelines:
            out.append(Problem("engine_pp", ("pp",), f"{e} has no pipeline parallelism "
                                                     f"(pp={p.pp})"))
        elif p.schedule not in engine.schedules:
            out.append(Problem("engine_schedule", ("schedule",), f"{e} has no {p.schedule} "
                               f"schedule", source=engine.source_of("schedule")))
        elif (p.schedule in ZERO_BUBBLE_SCHEDULES and engine.zero_bubble_zero_stages is not None
              and p.zero_stage not in engine.zero_bubble_zero_stages):
            out.append(Problem("zero_bubble_zero", ("schedule", "zero_stage"),
                               f"{e} runs {p.schedule} with ZeRO "
                               f"{'/'.join(map(str, engine.zero_bubble_zero_stages))} only, "
                               f"not ZeRO-{p.zero_stage}",
                               source=engine.source_of("zero_bubble_zero")))
    if m.is_moe and p.moe_dispatcher and engine.moe_dispatchers \
            and p.moe_dispatcher not in engine.moe_dispatchers:
        out.append(Problem("engine_dispatcher", ("moe_dispatcher",),
                           f"{e} has no {p.moe_dispatcher} token dispatcher (it has: "
                           f"{', '.join(engine.moe_dispatchers)})"))
    if p.moe_capacity_factor is not None and not engine.moe_capacity_factor:
        out.append(Problem("engine_capacity_factor", ("moe_capacity_factor",),
                           f"{e} runs MoE layers dropless only (the plan drops tokens at "
                           f"capacity factor {p.moe_capacity_factor:g})"))
    if p.ep_comm_overlap and not engine.ep_comm_overlap:
        out.append(Problem("engine_ep_comm_overlap", ("ep_comm_overlap",),
                           f"{e} does not overlap the EP all-to-alls across micro-batches (plan "
                           f"with --no-ep-comm-overlap)"))
    if p.tp_comm_overlap and not engine.tp_comm_overlap:
        out.append(Problem("engine_tp_comm_overlap", ("tp_comm_overlap",),
                           f"{e} overlaps TP communication with the GEMMs (async TP) only under "
                           f"torch.compile (plan with --compile, or --no-tp-comm-overlap)"
                           if engine.compiled_tp_comm_overlap else
                           f"{e} does not overlap TP communication with the GEMMs (plan with "
                           f"--no-tp-comm-overlap)"))
    if p.cp > 1:
        problem = cp_engine_problem(engine, p.cp, p.cp_comm_type)
        if problem:
            out.append(problem)
    # a ZeRO over one data-parallel rank shards nothing: every engine runs it as its ZeRO-0
    # (the search offers only ZeRO-0 there: Engine.zero_ok)
    problem = zero_problem(engine, p.zero_stage, p.tp, p.pp, p.dp, p.cp) \
        if p.dp * p.cp > 1 else None
    if problem:
        out.append(problem)
    problem = partition_problem(engine, m.num_layers, plan.layer_counts())
    if problem:
        out.append(problem)
    problem = (offload_problem(engine, plan.cluster, p.offload_optimizer, p.offload_params,
                               p.zero_stage, m, p.dp * p.cp)
               or hsdp_problem(engine, p.dp_shard, p.dp, p.cp, p.zero_stage, m)
               or (zeropp_problem(engine, p.zero_stage, p.dp_shard) if p.zeropp else None))
    if problem:
        out.append(problem)
    problem = recompute_problem(plan, engine)
    if problem:
        out.append(problem)
    elif p.recompute == "offload" and any(s.recompute_layers for s in plan.stages):
        problem = activation_offload_problem(engine, plan.cluster, p.pp)
        if problem:
            out.append(problem)
    return [cited(x, engine) for x in out]


def cp_engine_problem(engine, cp: int, comm_type: str | None) -> Problem | None:
    """Context parallelism the engine runs: cp > 1 at all, and its K/V exchange."""
    e = engine.name
    if cp > 1 and not engine.cp_comm_types:
        if e == "runtime":
            return Problem("engine_cp", ("cp",),
                           f"the runtime has no context parallelism (cp {cp})",
                           source=engine.source_of("cp"),
                           fix="plan with --engine runtime, which never chooses cp > 1")
        return Problem("engine_cp", ("cp",), f"{e} has no context parallelism (cp={cp})")
    if cp > 1 and comm_type is not None and comm_type not in engine.cp_comm_types:
        return Problem("engine_cp_comm", ("cp_comm_type",),
                       f"{e} has no {comm_type} context-parallel exchange (it has: "
                       f"{', '.join(engine.cp_comm_types)})")
    return None


def recompute_problem(plan, engine) -> Problem | None:
    """The recompute the plan asks for, as the engine counts it: a granularity it offers, the
    modules it recomputes selectively, and per stage, per chunk or every layer or none."""
    p, e = plan.parallelism, engine.name
    rec = [s.recompute_layers for s in plan.stages]
    if not any(rec):
        return None
    if p.recompute not in engine.recompute_modes:
        return Problem("engine_recompute", ("recompute",), f"{e} has no {p.recompute} recompute")
    if p.recompute == "selective" and not set(p.recompute_modules) <= set(
            engine.recompute_modules):
        return Problem("engine_recompute_modules", ("recompute_modules",),
                       f"{e} recomputes only {', '.join(engine.recompute_modules)} "
                       f"selectively; the plan asks for {', '.join(p.recompute_modules)}")
    rule = engine.recompute_count(p.recompute)
    sizes = [s.num_layers for s in plan.stages]
    if p.recompute == "offload":
        kept = [n - r for n, r in zip(sizes, rec)]
        if min(kept) < OFFLOAD_KEPT_LAYERS:
            return Problem("offload_activations_kept", ("recompute", "stages"),
                           f"{e} offloads the activations of fewer layers than a rank holds; "
                           f"the plan offloads {rec} of {sizes} per stage",
                           source=engine.source_of("offload_activations_kept"))
    if rule == ALL_OR_NONE and rec != sizes:
        return Problem("recompute_all_or_none", ("recompute", "stages"),
                       f"{e} recomputes every layer or none; the plan recomputes {rec} of "
                       f"{sizes} per stage")
    if rule == PER_CHUNK and rec != [min(max(rec), n) for n in sizes]:
        return Problem("recompute_per_chunk", ("recompute", "stages"),
                       f"{e} recomputes the same number of leading layers in every model "
                       f"chunk; the plan recomputes {rec} of {sizes}")
    return None


def runner_problems(plan, engine) -> list:
    """Everything that stops `engine` from running `plan` as priced: the engine it was priced
    for first, then what the engine cannot run (exports, `plan launch`, the runtime)."""
    engine = engine_for(engine, plan.compile)      # as priced (planner.engines.plan_engine)
    first = priced_for_problem(plan, engine)
    return ([cited(first, engine)] if first else []) + engine_problems(plan, engine)


# ---- a whole plan -------------------------------------------------------------------------

def rule_problems(plan, whole_cluster: bool = False) -> list:
    """Every rule a plan whose fields have the right types (Plan.validate checks those first)
    breaks, as Problems, whatever engine runs it: the splits, the batch, the stages, the
    precision on its GPU (the TP domain is its engine's). `whole_cluster`: its tp*pp*dp*cp must be its
    cluster's GPU count."""
    p, m, b, c = plan.parallelism, plan.model, plan.batch, plan.cluster
    engine = ENGINES.get(plan.engine)
    out = []

    def add(rule, knobs, message, source=""):
        out.append(Problem(rule, knobs, message, source))

    problem = gpu_precision_problem(c.gpu, plan.precision, plan.recipe)
    if problem:
        out.append(problem)
    for why in cp_problems(m, b.seq_len, p.tp, p.cp, p.cp_comm_type, plan.attention == "flash"):
        add("cp_split", ("cp", "seq_len"), why, "megatron/core/utils.py get_batch_on_this_cp_rank")
    for why in ep_blockers(m, p.ep, p.etp, p.tp, p.dp, p.cp):
        add("ep_split", ("ep", "etp"), why, "megatron/core/parallel_state.py "
                                            "initialize_model_parallel (MoE parallel folding)")
    if p.ep_comm_overlap:
        for why in ep_comm_overlap_blockers(p.ep, p.pp, p.schedule, p.recompute,
                                            p.moe_dispatcher, m.mtp_layers, p.recompute_modules):
            add("ep_comm_overlap", ("ep_comm_overlap",), f"ep_comm_overlap {why}",
                "megatron/core/transformer/transformer_config.py")
        why = ep_overlap_offload_problem(p.recompute)
        if why:
            add("ep_overlap_offload", ("ep_comm_overlap", "recompute"), f"ep_comm_overlap {why}",
                RULE_SOURCES["ep_overlap_offload"])
    if p.moe_dispatcher == "flex" and not flex_ok(p.ep, p.etp):
        add("flex_needs_ep", ("moe_dispatcher", "ep", "etp"),
            "the flex dispatcher needs ep x etp > 1 (Megatron's MoEFlexTokenDispatcher)",
            "megatron/core/transformer/moe/token_dispatcher.py")
    if p.moe_capacity_factor is not None and not m.is_moe:
        add("capacity_needs_moe", ("moe_capacity_factor",),
            "moe_capacity_factor on a model without experts")
    elif p.moe_capacity_factor is not None and p.moe_dispatcher not in ("", "alltoall"):
        add("capacity_dispatcher", ("moe_capacity_factor", "moe_dispatcher"),
            f"moe_capacity_factor pads experts on the alltoall dispatcher only, not "
            f"{p.moe_dispatcher}")
    if p.moe_dispatcher and not m.is_moe:
        add("dispatcher_needs_moe", ("moe_dispatcher",),
            f"moe_dispatcher {p.moe_dispatcher} on a model without experts")
    if p.vpp > 1 and p.schedule not in MULTI_CHUNK_SCHEDULES:
        add("vpp_needs_interleaved", ("vpp", "schedule"),
            "vpp > 1 needs a schedule with model chunks (" + ", ".join(MULTI_CHUNK_SCHEDULES) + ")")
    if p.pp > 1 and p.schedule in ZERO_BUBBLE_SCHEDULES:
        why = schedule_problem(p.schedule, p.pp, b.num_microbatches, p.vpp)
        if why:
            add("zero_bubble_layout", ("schedule", "vpp", "num_microbatches"), why,
                "torch/distributed/pipelining/schedules.py")
    if p.vpp > 1 and p.pp == 1:
        add("vpp_needs_pp", ("vpp", "pp"),
            f"{p.vpp} model chunks on a single pipeline rank (vpp > 1 needs pp > 1)")
    if p.world_size > c.num_gpus:
        add("world_fits", ("tp", "pp", "dp", "cp"),
            f"{world_product(p)} = {p.world_size} exceeds the cluster's {c.num_gpus} GPUs")
    if whole_cluster and p.world_size != c.num_gpus:
        add("whole_cluster", ("tp", "pp", "dp", "cp"),
            f"{world_product(p)} = {p.world_size} GPUs but the plan's cluster {c.name} has "
            f"{c.num_gpus}; plan for this cluster again (plan --cluster ...)")
    problem = tp_problem(m, p.tp, replicate_kv=True, engine=engine)
    if problem:
        add("tp_splits_model", ("tp",), problem, tp_split_source(engine, m, p.tp))
    domain = engine.tp_domain(c) if engine is not None else c.gpus_per_node
    problem = node_problem(p.tp, p.world_size, domain, p.rank_order) \
        if engine is None or not engine.tp_runs(c, p.tp) else None
    if problem:
        add("tp_in_domain", ("tp", "cluster"), problem)
    if p.tp_comm_overlap and not tp_comm_overlap_fits(engine, c, p.tp, p.world_size):
        add("tp_comm_overlap_in_domain", ("tp_comm_overlap", "tp"),
            f"tp_comm_overlap with tp {p.tp} groups spanning NVLink domains of {c.nvlink_domain} "
            f"GPUs (the TP overlap runs inside one)")
    if p.sequence_parallel and p.tp > 1 and b.seq_len % (p.tp * p.cp):
        add("sp_splits_sequence", ("sequence_parallel", "seq_len"),
            f"sequence parallel needs seq_len {b.seq_len} divisible by tp {p.tp}"
            + (f" x cp {p.cp}" if p.cp > 1 else ""))
    bad_batch = [k for k in ("seq_len", "global_batch_size", "micro_batch_size",
                             "num_microbatches") if getattr(b, k) < 1]
    for k in bad_batch:
        add("batch_positive", (k,), f"batch.{k} must be positive")
    if not bad_batch:
        problem = positions_problem(m, b.seq_len)
        if problem:
            add("positions", ("seq_len",), problem)
        if b.micro_batch_size * b.num_microbatches * p.dp != b.global_batch_size:
            add("batch_splits", ("micro_batch_size", "num_microbatches", "dp"),
                f"micro_batch_size {b.micro_batch_size} x num_microbatches "
                f"{b.num_microbatches} x dp {p.dp} != global_batch_size {b.global_batch_size}")
        if p.pp > 1 and (p.schedule == "interleaved" or p.vpp > 1) \
                and p.schedule not in ZERO_BUBBLE_SCHEDULES \
                and not torch_interleaved_ok(b.num_microbatches, p.pp):
            rounds = max(1, b.num_microbatches // p.pp)
            add("interleaved_rounds", ("num_microbatches", "pp"),
                f"interleaved 1F1B needs num_microbatches {b.num_microbatches} to be a "
                f"multiple of {rounds} (rounds of pp = {p.pp})",
                "torch/distributed/pipelining/schedules.py ScheduleInterleaved1F1B")
    why = mixed_platform_problem(c)
    if why:
        add("mixed_platform", ("cluster",), why)
    for why in mixed_cluster_problems(c, p):
        add("mixed_groups", ("cluster", "pp", "tp", "dp", "cp"), why)
    if not pp_ok(m, p.pp, p.vpp, engine):
        add("pp_layers", ("pp", "vpp"),
            f"pp*vpp = {p.pp * p.vpp} exceeds the model's {m.num_layers} layers")
    out += [Problem("stages", ("stages",), why) for why in stage_problems(plan)]
    return [cited(x, engine) for x in out]


def mixed_platform_problem(cluster) -> str | None:
    """Why the groups of a mixed cluster cannot be one job (None when they can): every rank
    runs one PyTorch build, CUDA or ROCm, and one collective library (NCCL, RCCL; gloo for
    CPUs), so the groups' GPUs must share a platform (planner.precision.PLATFORM; a GPU of
    unknown architecture is not held to it)."""
    groups = getattr(cluster, "groups", None)
    if not groups:
        return None
    kinds = {}
    for g in groups:
        k = platform_of(g.gpu)
        if k is not None:
            kinds.setdefault(k, []).append(g.name)
    if len(kinds) < 2:
        return None
    return ("groups " + " and ".join(f"{', '.join(n)} ({k})" for k, n in kinds.items())
            + " cannot run one job: a PyTorch build and its collectives are CUDA (NCCL), ROCm "
            "(RCCL) or CPU (gloo), one of them for every rank; plan each platform's groups "
            "as a cluster of their own")


def mixed_cluster_problems(cluster, p) -> list:
    """A plan over GPU groups (planner.specs.MixedCluster): one group per pipeline rank, and
    each group holding exactly its ranks' GPUs (pp is outermost in the rank order, so pipeline
    rank s is the tp*cp*dp ranks from s*tp*cp*dp, all on the group the pipeline names)."""
    groups = getattr(cluster, "groups", None)
    if not groups:
        return []
    pipe = cluster.pipeline
    if len(pipe) != p.pp:
        return [f"cluster.pipeline names the groups of {len(pipe)} pipeline ranks; pp is {p.pp}"]
    per_rank = p.tp * p.cp * p.dp
    out = []
    for i, g in enumerate(groups):
        uses = pipe.count(i) * per_rank
        if uses != g.num_gpus:
            out.append(f"group {g.name} has {g.num_gpus} GPUs but the plan puts {pipe.count(i)} "
                       f"pipeline rank(s) of tp*cp*dp = {per_rank} GPUs on it ({uses}); the "
                       f"groups' GPUs must be what the plan uses")
    return out


def plan_problems(plan, whole_cluster: bool = False, runner: str | None = None) -> list:
    """Every validity problem of a plan, one line each (Problem.line); empty: the search, the
    exporters and the runtime can all lay it out. `runner` (an engine name, "runtime" for
    runtime.parallelize.check_layout): the plan is about to run there, which refuses first
    what it cannot run as priced (`runner_problems`: the engine it was priced for, then the
    engine spec's data)."""
    first = runner_problems(plan, runner) if runner else []
    return list(dict.fromkeys(x.line for x in first + rule_problems(plan, whole_cluster)))


def stage_problems(plan) -> list:
    """The stages: pp*vpp of them in model order, contiguous, covering every layer."""
    p, m = plan.parallelism, plan.model
    if len(plan.stages) != p.pp * p.vpp:
        return [f"{len(plan.stages)} stages, expected pp*vpp = {p.pp * p.vpp}"]
    end = 0
    for i, s in enumerate(plan.stages):
        if s.index != i or s.pp_rank != stage_rank(p.schedule, p.pp, i) or s.chunk != i // p.pp:
            return [f"stage {i}: index/pp_rank/chunk out of order"]
        if s.layers[0] != end or s.layers[1] < s.layers[0]:
            return [f"stage {i}: layers {list(s.layers)} do not continue from layer {end}"]
        if not 0 <= s.recompute_layers <= s.num_layers:
            return [f"stage {i}: recompute_layers {s.recompute_layers} outside "
                    f"0..{s.num_layers}"]
        end = s.layers[1]
    if end != m.num_layers:
        return [f"stages cover {end} layers, the model has {m.num_layers}"]
    return []


def launch_problems(plan, world_size: int, local_world_size: int, on_gpu: bool,
                    visible_gpus: int | None = None) -> list:
    """What refuses a valid plan for the processes it was launched with: the world must be the
    plan's tp*cp*pp*dp; on GPUs, at most a node's GPUs (and the visible ones) per node, and tp
    groups inside a node."""
    p = plan.parallelism
    out = []
    if p.world_size != world_size:
        degrees = "*".join(str(getattr(p, d)) for d in world_product(p).split("*"))
        out.append(f"plan needs {world_product(p)} = {degrees} = {p.world_size} processes, "
                   f"launched with {world_size}")
    if on_gpu:
        # a mixed cluster's hosts are its groups' (planner.launch starts each its own GPUs)
        gpn = max((g.gpus_per_node for g in getattr(plan.cluster, "groups", ())),
                  default=plan.cluster.gpus_per_node)
        if local_world_size > gpn:
            out.append(f"plan's cluster has {gpn} GPUs per node, launched {local_world_size} "
                       f"processes per node")
        if p.rank_order[-1] == "tp" and local_world_size % p.tp and world_size > local_world_size:
            out.append(f"tp {p.tp} groups would span nodes of {local_world_size} processes; "
                       f"launch a multiple of tp processes per node")
        if visible_gpus is not None and visible_gpus < local_world_size:
            out.append(f"{local_world_size} processes per node but only {visible_gpus} GPUs "
                       f"visible")
    return out
