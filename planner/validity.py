"""The validity rules of a parallel configuration: one home, shared by the search, plan
validation, explain and the runtime.

A configuration is valid when the model, the batch and the cluster can be split by its degrees
the way every consumer of a plan lays them out:

* tensor parallelism splits the attention heads, the FFN and the vocabulary; the KV heads are
  split too, or (the runtime's grouped-query layout) replicated when they divide tp. The
  search keeps to splitting them (`tp_ok`), which every engine runs;
* a tp group sits inside one node (ranks are laid out tp innermost): tp divides the GPUs of a
  node whenever the job spans more than one;
* sequence parallelism shards the sequence over the tp group: tp > 1 and seq_len % tp == 0
  (with context parallelism, each cp rank's s/cp tokens over tp);
* context parallelism (cp > 1) splits each sequence into 2*cp chunks for the causal load
  balance (zigzag: Megatron-Core asserts seq_len % (2*cp) == 0, megatron/core/utils.py
  get_batch_on_this_cp_rank; torch's context_parallel likewise): seq_len % (2*cp) == 0; it
  runs on flash/fused attention kernels only (TE's and torch's CP attention); Ulysses (a2a)
  splits the heads of a TP rank over cp: (KV heads / tp) % cp == 0 (TE asserts the heads and
  the GQA groups divisible by cp);
* the model has a position for every token: seq_len <= max_seq_len with learned positions and
  with rope (the runtime's rule; ALiBi extrapolates);
* every pipeline rank holds at least one layer per model chunk: pp * vpp <= layers;
* the global batch splits over data parallelism and micro-batches: dp * mbs * m == global batch;
* interleaved 1F1B: torch's ScheduleInterleaved1F1B runs m micro-batches in rounds of
  max(1, m // pp), so m is a multiple of the rounds (`torch_interleaved_ok`); the search offers
  only m % pp == 0 (Megatron's rule, `interleaved_ok`), which implies it.

The predicates are cheap (the search calls them per candidate); `plan_problems` lists every
problem of a Plan in one line each (Plan.validate raises the first; the runtime refuses with it
before any work); `launch_problems` adds what depends on how the runtime was launched. Pure
Python: no torch, no numpy.
"""
from __future__ import annotations

# ---- predicates (called per candidate by the search) --------------------------------------


def tp_blockers(model, tp: int, replicate_kv: bool = False) -> list:
    """The model's dimensions tp does not divide, as "heads (32)", "KV heads (8)", "FFN (130)",
    "vocabulary (128)". `replicate_kv`: KV heads that divide tp are fine (each rank keeps the
    one KV head its query heads use, as the runtime does)."""
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
    if model.vocab_size % tp:
        out.append(f"vocabulary ({model.vocab_size})")
    return out


def tp_ok(model, tp: int, replicate_kv: bool = False) -> bool:
    """tp splits the heads, the KV heads (or replicates them), the FFN and the vocabulary."""
    kv = model.num_kv_heads
    return (model.num_heads % tp == 0
            and (kv % tp == 0 or replicate_kv and tp % kv == 0)
            and model.ffn_hidden % tp == 0 and model.shared_expert_ffn_hidden % tp == 0
            and model.vocab_size % tp == 0)


def tp_in_node(tp: int, gpus_per_node: int) -> bool:
    """A tp group of a whole-cluster job sits inside one node: tp divides the node's GPUs."""
    return gpus_per_node % tp == 0


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


# The runtime (runtime/) has no context parallelism: PyTorch's context_parallel needs the
# CUDA SDPA flash / efficient backends, and the runtime does not wire it (planner.engines.runtime).
RUNTIME_NO_CP = ("the runtime has no context parallelism (cp {cp}); plan with "
                 "--engine runtime, which never chooses cp > 1")


def has_positions(model, seq_len: int) -> bool:
    """Learned positions are a table of max_seq_len rows; the runtime also refuses rope beyond
    max_seq_len. ALiBi has no limit here."""
    return seq_len <= model.max_seq_len or model.position not in ("learned", "rope")


def pp_ok(model, pp: int, vpp: int = 1) -> bool:
    """Every pipeline rank holds at least one layer of each of its vpp model chunks."""
    return pp * vpp <= model.num_layers


def split_blockers(num_layers: int, pp: int, vpp: int, layers, equal_only: bool = False) -> list:
    """Why decoder layers per pipeline rank `layers` cannot lay out pp ranks of vpp model chunks,
    as phrases: one count per rank, all layers placed, at least one per chunk (each rank's
    layers are split evenly over its chunks: planner.plan.make_stages); `equal_only`: the
    engine needs the same count on every rank."""
    out = []
    if len(layers) != pp:
        out.append(f"{len(layers)} layer counts for pp {pp}")
    if sum(layers) != num_layers:
        out.append(f"the counts sum to {sum(layers)}, not the model's {num_layers} layers")
    if min(layers, default=0) < vpp:
        out.append(f"a rank holds {min(layers, default=0)} layers, fewer than its {vpp} "
                   f"model chunks")
    if equal_only and len(set(layers)) > 1:
        out.append("the engine puts the same number of layers on every rank")
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


def tp_problem(model, tp: int, replicate_kv: bool = True) -> str | None:
    blockers = tp_blockers(model, tp, replicate_kv)
    if not blockers:
        return None
    return f"tp {tp} does not divide the model's {and_list(blockers)}"


def node_problem(tp: int, world_size: int, gpus_per_node: int,
                 rank_order=("pp", "dp", "tp")) -> str | None:
    """tp groups that would span nodes when the job runs on nodes of gpus_per_node GPUs."""
    if rank_order[-1] == "tp" and world_size > gpus_per_node and gpus_per_node % tp:
        return (f"tp {tp} groups would span nodes of {gpus_per_node} GPUs "
                f"(tp must divide the GPUs per node)")
    return None


def world_product(p) -> str:
    """How a plan's world is named in messages: tp*pp*dp, or tp*cp*pp*dp with context
    parallelism."""
    return "tp*cp*pp*dp" if p.cp > 1 else "tp*pp*dp"


def and_list(items: list) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


# ---- a whole plan -------------------------------------------------------------------------

def plan_problems(plan, whole_cluster: bool = False, runner: str | None = None) -> list:
    """Every validity problem of a plan whose fields have the right types (Plan.validate checks
    those first), one line each; empty: the search, the exporters and the runtime can all lay
    it out. `whole_cluster`: its tp*pp*dp*cp must be its cluster's GPU count. `runner`
    "runtime": the plan is about to run on our runtime (runtime.parallelize.check_layout),
    which refuses what it cannot run, first."""
    p, m, b, c = plan.parallelism, plan.model, plan.batch, plan.cluster
    out = []
    if p.cp > 1 and "runtime" in (runner, plan.engine):
        out.append(RUNTIME_NO_CP.format(cp=p.cp))
    out += cp_problems(m, b.seq_len, p.tp, p.cp, p.cp_comm_type, plan.attention == "flash")
    out += ep_blockers(m, p.ep, p.etp, p.tp, p.dp, p.cp)
    if p.ep_comm_overlap:
        out += [f"ep_comm_overlap {why}" for why in ep_comm_overlap_blockers(
            p.ep, p.pp, p.schedule, p.recompute, p.moe_dispatcher, m.mtp_layers,
            p.recompute_modules)]
    if p.moe_dispatcher == "flex" and not flex_ok(p.ep, p.etp):
        out.append("the flex dispatcher needs ep x etp > 1 (Megatron's MoEFlexTokenDispatcher)")
    if p.moe_capacity_factor is not None and not m.is_moe:
        out.append("moe_capacity_factor on a model without experts")
    elif p.moe_capacity_factor is not None and p.moe_dispatcher not in ("", "alltoall"):
        out.append(f"moe_capacity_factor pads experts on the alltoall dispatcher only, not "
                   f"{p.moe_dispatcher}")
    if p.moe_dispatcher and not m.is_moe:
        out.append(f"moe_dispatcher {p.moe_dispatcher} on a model without experts")
    if p.vpp > 1 and p.schedule != "interleaved":
        out.append("vpp > 1 needs the interleaved schedule")
    if p.vpp > 1 and p.pp == 1:
        out.append(f"{p.vpp} model chunks on a single pipeline rank (vpp > 1 needs pp > 1)")
    if p.world_size > c.num_gpus:
        out.append(f"{world_product(p)} = {p.world_size} exceeds the cluster's {c.num_gpus} GPUs")
    if whole_cluster and p.world_size != c.num_gpus:
        out.append(f"{world_product(p)} = {p.world_size} GPUs but the plan's cluster {c.name} has "
                   f"{c.num_gpus}; plan for this cluster again (plan --cluster ...)")
    problem = tp_problem(m, p.tp, replicate_kv=True)
    if problem:
        out.append(problem)
    from planner.engines import ENGINES
    engine = ENGINES.get(plan.engine)
    domain = engine.tp_domain(c) if engine is not None else c.gpus_per_node
    problem = node_problem(p.tp, p.world_size, domain, p.rank_order)
    if problem:
        out.append(problem)
    if p.sequence_parallel and p.tp > 1 and b.seq_len % (p.tp * p.cp):
        out.append(f"sequence parallel needs seq_len {b.seq_len} divisible by tp {p.tp}"
                   + (f" x cp {p.cp}" if p.cp > 1 else ""))
    bad_batch = [k for k in ("seq_len", "global_batch_size", "micro_batch_size",
                             "num_microbatches") if getattr(b, k) < 1]
    for k in bad_batch:
        out.append(f"batch.{k} must be positive")
    if not bad_batch:
        problem = positions_problem(m, b.seq_len)
        if problem:
            out.append(problem)
        if b.micro_batch_size * b.num_microbatches * p.dp != b.global_batch_size:
            out.append(f"micro_batch_size {b.micro_batch_size} x num_microbatches "
                       f"{b.num_microbatches} x dp {p.dp} != global_batch_size "
                       f"{b.global_batch_size}")
        if p.pp > 1 and (p.schedule == "interleaved" or p.vpp > 1) \
                and not torch_interleaved_ok(b.num_microbatches, p.pp):
            rounds = max(1, b.num_microbatches // p.pp)
            out.append(f"interleaved 1F1B needs num_microbatches {b.num_microbatches} to be a "
                       f"multiple of {rounds} (rounds of pp = {p.pp})")
    if not pp_ok(m, p.pp, p.vpp):
        out.append(f"pp*vpp = {p.pp * p.vpp} exceeds the model's {m.num_layers} layers")
    out += stage_problems(plan)
    return out


def stage_problems(plan) -> list:
    """The stages: pp*vpp of them in model order, contiguous, covering every layer."""
    p, m = plan.parallelism, plan.model
    if len(plan.stages) != p.pp * p.vpp:
        return [f"{len(plan.stages)} stages, expected pp*vpp = {p.pp * p.vpp}"]
    end = 0
    for i, s in enumerate(plan.stages):
        if s.index != i or s.pp_rank != i % p.pp or s.chunk != i // p.pp:
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
        gpn = plan.cluster.gpus_per_node
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
