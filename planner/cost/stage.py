"""From a candidate configuration to per-stage linear costs, and the evaluation of a plan.

A pipeline rank's time and memory are linear in the number of layers it holds (n) and the
number it recomputes (r): identical layers are interchangeable, so the search counts them.
`StageCoeffs` holds those coefficients; `evaluate` turns a choice of (n, r) per rank into the
estimate; the CP-SAT search in planner.search minimises the same expression.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from planner.cost import comm
from planner.cost.compute import (BF16, GEMM_BWD_FACTOR, attention_width, mean_attended_keys,
                                   mla_up_projection_times, rope_time)
from planner.cost.context import cp_exchange
from planner.cost.dataparallel import (QGZ_BYTES, QWZ_BYTES, ZeroPP, dp_collectives, hpz_size,
                                       effective_fsdp_outer_wrap, pipelined_fsdp_unsharded,
                                       weight_gather_bytes, zero3_end_bytes,
                                       zero3_unsharded_bytes)
from planner.cost.facts import facts_for
from planner.cost.memory import (GIB, gathered_copies_whole, model_state_bytes,
                                 userbuffer_bytes, weight_copy_bytes)
from planner.cost.offload import (activation_offload_stall, gpu_state_bytes, host_use,
                                  offloads, per_param)
from planner.cost.recompute import (DEFAULT_MODULES, Rerun, applying, attention_rerun,
                                    dense_mlp_rerun)
from planner.cost.schedule import (forward_and_wgrad, head_rank, in_flight, pipeline_time,
                                   stage_buffer_bytes, weight_grad_time)
from planner.engines import get_engine
from planner.engines.spec import Engine
from planner.precision import FP8_FORMATS, low_precision
from planner.specs import Cluster, Model

# Gradient-reduction buckets kept alive by DDP / the distributed optimizer: Megatron's default
# bucket of 40M parameters (megatron/core/distributed/distributed_data_parallel_config.py),
# in fp32; DDP's default bucket is 25 MiB (torch.nn.parallel.DistributedDataParallel), FSDP2
# reduces layer by layer: Megatron's, the largest, is taken for all.
DP_BUCKET_BYTES = 40e6 * 4
# Headroom below capacity the plan keeps free by default, a fraction of the GPU's memory
# (`plan --memory-margin GIB` sets it): allocator behaviour the model does not see (a burst of
# fragmentation, a larger NCCL buffer, a framework's workspace). Checked against the published
# rows that measured their reserved memory (benchmarks/fidelity.py memory_verdicts, the margin
# sweep of the fidelity tables): it covers every under-count (the largest, 1.7%, torchtitan's
# 8B on 8 H100s) but the open gap of five of torchtitan's 405B pipeline rows (4-14% of the GPU,
# which no margin of this size covers); 2% would leave one more uncovered (2.3%) and refuse three
# fewer configurations that ran (11 refused at 3%, 8 at 2%, of 535 rows: llm-foundry's A100 40GB
# runs without recompute, NeMo's GPT-3 20B, six of Megatron-Bridge's DeepSeek-V3 MXFP8 runs):
# kept at 3%, the out-of-memory side being the worse failure, on that little evidence (31 rows,
# all torchtitan runs: its own tables and torchao's).
DEFAULT_MARGIN_FRACTION = 0.03

# The memory categories of a pipeline rank (StageCoeffs.memory), and of them the model state:
# the weights, their gradients and the optimizer's state, a fixed set of tensors the run
# allocates once (Megatron's contiguous parameter and gradient buffers, megatron/core/
# distributed/param_and_grad_buffer.py; the optimizer's shards and moments) or again in the
# same sizes every step (FSDP's gradients). The activations and working memory ("activations",
# "other") churn within a step in many sizes: the caching allocator's reserve is on them alone
# (MemoryBudget).
MEMORY_CATEGORIES = ("params", "grads", "optimizer", "activations", "other")
MODEL_STATE = ("params", "grads", "optimizer")


@dataclass(frozen=True)
class Candidate:
    """The outer choices: everything but the per-stage layer and recompute counts."""
    tp: int
    pp: int
    dp: int
    zero: int
    sp: bool
    mbs: int
    seq_len: int
    global_batch: int
    schedule: str = "1f1b"
    vpp: int = 1
    recompute: str = "none"   # granularity of the recomputed layers
    # what "selective" recomputes of every layer (Megatron --recompute-modules;
    # planner.cost.recompute.MODULES): the attention core by default
    recompute_modules: tuple = DEFAULT_MODULES
    # software, not searched: FlashAttention kernels (else the unfused softmax attention of
    # Megatron-LM before 2022, which also keeps the s^2 scores unless recomputed)
    flash: bool = True
    # fixed by the user, not searched (planner.precision): bf16, fp8, mxfp8 or nvfp4 for the
    # block linears, with the engine's scaling recipe (None: its default for the precision)
    precision: str = "bf16"
    recipe: str | None = None
    # context parallelism: cp ranks share each sequence (s/cp tokens each), exchanging K and V
    # by `cp_comm` (CP_COMM_TYPES); weights replicated over cp, gradients reduced over dp*cp
    cp: int = 1
    cp_comm: str = "p2p"
    # expert parallelism of an MoE model (planner.cost.moe), folded out of tp x dp
    ep: int = 1
    etp: int = 1
    # the TP collectives overlap the layer's GEMMs (Megatron-Core --tp-comm-overlap, with sp):
    # what sticks out of them plus the slowdown they cause is priced (stage_coefficients)
    tp_comm_overlap: bool = False
    # MoE token dispatcher the user fixed ("": the cheapest the engine has, planner.cost.moe.
    # dispatcher) and the EP dispatch / combine of one micro-batch run beside another's
    # compute (Megatron-Core --overlap-moe-expert-parallel-comm; planner.cost.moe)
    moe_dispatcher: str = ""
    ep_comm_overlap: bool = False
    # MoE token dropping: every expert's tokens padded (and cut) to capacity_factor x the
    # balanced share (Megatron --moe-expert-capacity-factor with
    # --moe-pad-expert-input-to-capacity); None: dropless (planner.cost.moe)
    moe_capacity_factor: float | None = None
    # MoE routing imbalance: the busiest expert rank's tokens over its balanced share (1:
    # balanced, as the benchmarks force it; planner.cost.moe)
    moe_imbalance: float = 1.0
    # offload (planner.cost.offload; planner.vocab.OFFLOAD_DEVICES): where the optimizer
    # states with their fp32 master weights, and the parameters, live between steps
    offload_optimizer: str = "none"
    offload_params: str = "none"
    # hybrid sharding (HSDP): ZeRO shards over groups of dp_shard ranks of the dp x cp group,
    # replicated across the dp x cp / dp_shard groups; 0: over the whole dp x cp group
    dp_shard: int = 0
    # ZeRO++ under ZeRO-3 (DeepSpeed): int8 weight gathers, the node's secondary weight
    # partition for the backward gather, int4 gradients (planner.cost.dataparallel.ZeroPP)
    zeropp: bool = False

    @property
    def shard(self) -> int:
        """The ranks ZeRO shards the states over: dp_shard, or all of dp x cp."""
        return self.dp_shard or self.dp * self.cp

    @property
    def replicas(self) -> int:
        """Copies of the sharded states across the dp x cp group (1 but under HSDP)."""
        return self.dp * self.cp // self.shard

    @property
    def m(self) -> int:
        return self.global_batch // (self.dp * self.mbs)

    @property
    def num_gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def dp_cp(self) -> int:
        """The gradient-reduction and optimizer-sharding group: dp x cp (Megatron-Core's
        data_parallel_group_with_cp, megatron/core/parallel_state.py; torchtitan's FSDP mesh
        dp_shard_cp, torchtitan/distributed/parallel_dims.py)."""
        return self.dp * self.cp


@dataclass
class StageCoeffs:
    """Costs of pipeline rank `rank` as linear functions of n (layers) and r (recomputed).

    Times are seconds per micro-batch unless named `tail` (once per step); memory in bytes.
    A collective "hides" behind compute given as (h_layer, h_fixed): what of it sticks out
    is `exposed_comm`.
    """
    rank: int
    # per micro-batch stage time: t_fixed + n * t_layer + r * t_rec (+ ZeRO exposure)
    compute_fixed: float
    compute_layer: float
    compute_rec: float
    tp_layer: float
    tp_rec: float
    pp_fixed: float
    # forward and backward of one micro-batch (incl. TP collectives): what collectives hide behind
    fwd_layer: float
    fwd_fixed: float
    bwd_layer: float
    bwd_fixed: float
    # of bwd_layer, the weight-gradient GEMMs a zero-bubble schedule defers (W; the rest is
    # the input-gradient backward B): planner.cost.schedule.weight_grad_time
    wgrad_layer: float = 0.0
    # ZeRO-2/3 collectives of every micro-batch: the parameter all-gathers of the forward hide
    # behind the forward; the backward's all-gather and the gradient reduce-scatter behind the
    # backward (gradients exist only there)
    zf_layer: float = 0.0
    zf_fixed: float = 0.0
    zb_layer: float = 0.0
    zb_fixed: float = 0.0
    # step tail (after the last micro-batch): the gradient reduction, behind the last backward
    # where the engine overlaps it; the parameter all-gather after the step, behind the next
    # forward where it overlaps it; the optimizer step
    grad_layer: float = 0.0
    grad_fixed: float = 0.0
    grad_overlapped: bool = True
    gather_layer: float = 0.0
    gather_fixed: float = 0.0
    gather_overlapped: bool = True
    opt_layer: float = 0.0
    opt_fixed: float = 0.0
    # offload (planner.cost.offload): of opt_*, the host transfers the step waits for (the
    # rest is the optimizer step, on the CPU); offf_* / offb_*, the host copies of every
    # micro-batch beside its forward (parameters up) and backward (parameters up, gradients
    # down), on the copy engines (`exposures`)
    off_layer: float = 0.0
    off_fixed: float = 0.0
    offf_layer: float = 0.0
    offf_fixed: float = 0.0
    offb_layer: float = 0.0
    offb_fixed: float = 0.0
    # memory: m_fixed + n * m_layer - r * m_rec
    mem_fixed: dict = field(default_factory=dict)   # by category
    mem_layer: dict = field(default_factory=dict)
    mem_rec: float = 0.0                             # activations saved per recomputed layer
    # a collective hidden behind compute still slows it: NCCL runs on SMs (planner.specs.Gpu)
    overlap_slowdown: float = 0.0
    # context-parallel K/V exchange per layer and micro-batch, forward + backward, as exposed
    # (what sticks out of the attention it overlaps), and again in a recomputed layer
    cp_layer: float = 0.0
    cp_rec: float = 0.0
    # expert-parallel token dispatch and combine per layer (forward + backward), and what a
    # recomputed layer runs again (planner.cost.moe)
    ep_layer: float = 0.0
    ep_rec: float = 0.0
    # the TP overlap makes a pass slower than its plain collectives: the slowdown of the GEMMs
    # it runs beside exceeds what it hides (a tiny GEMM beside a long transfer), so the plan
    # without it is faster, at less memory (planner.search.enumeration without_tp_overlap)
    tp_overlap_slower: bool = False
    # of mem_fixed["other"], the TP overlap's userbuffers (planner.cost.memory
    # userbuffer_bytes): what the plan without the overlap does not hold; and the gradient
    # buckets, which only a rank sharding its states over others holds
    userbuffer_bytes: float = 0.0
    bucket_bytes: float = 0.0
    # a model with dense and MoE layers: the per-layer fields above describe a dense layer and
    # `moe` holds what one MoE layer adds to each (its layer fields; q of a rank's n layers are
    # MoE, rq of its r recomputed ones). None: every layer is alike.
    moe: "StageCoeffs | None" = None
    # the caching allocator's reserve on the bytes that churn within a step (MemoryBudget:
    # the engine's allocator_reserve), which the memory the plan needs adds to them
    churn_reserve: float = 0.0

    @property
    def t_fixed(self) -> float:
        return self.compute_fixed + self.pp_fixed

    @property
    def t_layer(self) -> float:
        return self.compute_layer + self.tp_layer + self.cp_layer + self.ep_layer

    @property
    def t_rec(self) -> float:
        return self.compute_rec + self.tp_rec + self.cp_rec + self.ep_rec

    def exposures(self):
        """(c_layer, c_fixed, h_layer, h_fixed) of what runs beside every micro-batch's forward
        and backward: the ZeRO collectives, then the offload's host copies (on the copy
        engines, beside the collectives as beside the compute)."""
        return ((self.zf_layer, self.zf_fixed, self.fwd_layer, self.fwd_fixed),
                (self.zb_layer, self.zb_fixed, self.bwd_layer, self.bwd_fixed),
                (self.offf_layer, self.offf_fixed, self.fwd_layer, self.fwd_fixed),
                (self.offb_layer, self.offb_fixed, self.bwd_layer, self.bwd_fixed))

    def exposure_slowdowns(self):
        """The compute slowdown of each of `exposures`: a collective's (NCCL runs on SMs);
        none for a host copy, which the GPU's copy engines run."""
        return (self.overlap_slowdown, self.overlap_slowdown, 0.0, 0.0)

    def tail_exposures(self):
        """(c_layer, c_fixed, h_layer, h_fixed) of the once-per-step collectives: the gradient
        reduction hides behind one micro-batch's backward of the rank's layers, the parameter
        gather behind one forward. Under the interleaved schedule Megatron reduces each model
        chunk's gradients once its last micro-batch's backward ends (megatron/core/
        pipeline_parallel/schedules.py backward_step_helper_preprocess), so all but the last
        chunk's reduction could hide behind the rest of the cool-down: not priced. The rows it
        would move most pull both ways (benchmarks/results/fidelity_heldout_*.md): MLPerf
        GPT-3 at 10752 GPUs, +24% with 0.48 s of its 1.15 s exposed data-parallel
        communication, and MLPerf Llama 3.1 405B at 8192 H100s, -1.4% with 0.53 s of 5.11 s;
        hidden, both would be too fast. What else sticks out at that scale is not known, so the
        window stays one micro-batch."""
        g = (self.bwd_layer, self.bwd_fixed) if self.grad_overlapped else (0.0, 0.0)
        a = (self.fwd_layer, self.fwd_fixed) if self.gather_overlapped else (0.0, 0.0)
        return ((self.grad_layer, self.grad_fixed) + g, (self.gather_layer, self.gather_fixed) + a)

    def exposed_comm(self, c_layer: float, c_fixed: float, h_layer: float, h_fixed: float,
                     n: int, q: int = 0, dc: float = 0.0, dh: float = 0.0,
                     slowdown: float | None = None) -> float:
        """Time a collective of c_fixed + n*c_layer adds when it overlaps h_fixed + n*h_layer of
        compute: what sticks out (at least its last layer's bucket, which has nothing left to
        hide behind), plus the compute it slows while it runs. q of the n layers are MoE layers,
        each adding dc to the collective and dh to the compute (the smaller bucket is the
        floor)."""
        comm = c_fixed + n * c_layer + q * dc
        if comm <= 0:
            return 0.0
        slow = self.overlap_slowdown if slowdown is None else slowdown
        return (max(min(c_layer, c_layer + dc), comm - (h_fixed + n * h_layer + q * dh))
                + slow * comm)

    def _moe_deltas(self, which: str):
        """(dc, dh) per exposure of one MoE layer; zeros without layer kinds."""
        if self.moe is None:
            n = len(self.exposures()) if which == "zero" else len(self.tail_exposures())
            return [(0.0, 0.0)] * n
        es = self.moe.exposures() if which == "zero" else self.moe.tail_exposures()
        return [(e[0], e[2]) for e in es]

    def zero_exposed(self, n: int, q: int = 0) -> float:
        """ZeRO-2/3 collectives of one micro-batch, overlapping its forward and its backward."""
        return sum(self.exposed_comm(*e, n, q, *d, slowdown=a)
                   for e, d, a in zip(self.exposures(), self._moe_deltas("zero"),
                                      self.exposure_slowdowns()))

    def time(self, n: int, r: int, q: int = 0, rq: int = 0) -> float:
        t = self.t_fixed + n * self.t_layer + r * self.t_rec + self.zero_exposed(n, q)
        if self.moe is not None:
            t += q * self.moe.t_layer + rq * self.moe.t_rec
        return t

    def tail(self, n: int, q: int = 0) -> float:
        """Once per step: the gradient reduction, the parameter all-gather and the optimizer."""
        out = (sum(self.exposed_comm(*e, n, q, *d)
                   for e, d in zip(self.tail_exposures(), self._moe_deltas("tail")))
               + self.opt_fixed + n * self.opt_layer)
        return out + (q * self.moe.opt_layer if self.moe is not None else 0.0)

    def tail_lower(self, n: int) -> float:
        """A lower bound on tail(n): every collective hidden but its last bucket."""
        out = self.opt_fixed + n * self.opt_layer
        for c_layer, c_fixed, h_layer, h_fixed in self.tail_exposures():
            comm = c_fixed + n * c_layer
            if comm > 0:
                exposed = c_layer if h_layer or h_fixed else comm
                out += exposed + self.overlap_slowdown * comm
        return out

    def memory(self, n: int, r: int, q: int = 0, rq: int = 0) -> dict:
        out = {k: self.mem_fixed.get(k, 0.0) + n * self.mem_layer.get(k, 0.0)
               for k in MEMORY_CATEGORIES}
        out["activations"] -= r * self.mem_rec
        if self.moe is not None:
            for k in out:
                out[k] += q * self.moe.mem_layer.get(k, 0.0)
            out["activations"] -= rq * self.moe.mem_rec
        out["total"] = sum(out.values())
        out["needed"] = self.needed(out)
        return out

    def needed(self, mem: dict) -> float:
        """The bytes a GPU must have for the allocated `mem` (by category): the model state
        as allocated, the churned categories with the allocator's reserve (MemoryBudget)."""
        g = mem.get   # MODEL_STATE as allocated, the rest of MEMORY_CATEGORIES with the reserve
        return (g("params", 0.0) + g("grads", 0.0) + g("optimizer", 0.0)
                + (g("activations", 0.0) + g("other", 0.0)) * (1.0 + self.churn_reserve))

    def needed_fixed(self) -> float:
        return self.needed(self.mem_fixed)

    def needed_layer(self) -> float:
        return self.needed(self.mem_layer)

    @property
    def needed_rec(self) -> float:
        """What recomputing a layer takes off `needed`: its saved activations, which churn."""
        return self.mem_rec * (1.0 + self.churn_reserve)


def exposed_comm_array(c_layer, c_fixed, h_layer, h_fixed, slowdown, n, q=0, dc=0.0, dh=0.0):
    """StageCoeffs.exposed_comm over numpy arrays of n and q (broadcast): what a collective of
    c_fixed + n*c_layer + q*dc sticks out of h_fixed + n*h_layer + q*dh of compute, at least
    its last layer's bucket (the smaller kind's), plus the compute it slows; 0 where there is
    no collective."""
    comm = c_fixed + n * c_layer + q * dc
    return np.where(comm > 0, np.maximum(np.minimum(c_layer, c_layer + dc),
                                         comm - (h_fixed + n * h_layer + q * dh))
                    + slowdown * comm, 0.0)


@dataclass(frozen=True)
class MemoryBudget:
    """What fits on one GPU under an engine: memory_gib - the engine's context - the margin
    is what its caching allocator may hold (`usable_gib`).

    Two figures of a plan's memory come from its allocated bytes:
    - `reserved`: allocated x (1 + allocator_reserve), what torch.cuda.max_memory_reserved
      reads at the peak (the figure the published rows measured, against which the reserve
      was checked). It counts cached blocks the allocator gives back before it fails: when
      cudaMalloc fails it frees every cached segment with no block in use and tries again
      (c10/cuda/CUDACachingAllocator.cpp, the allocator's header comment and its malloc's
      release_cached_blocks), so this figure does not decide an out-of-memory;
    - `needed` (StageCoeffs.needed): the model state as allocated, the churned categories
      with the reserve (MODEL_STATE), which decides whether the plan fits. The model state's
      tensors take whole segments that are never given back, so they leave no free fragment
      in a segment in use; what fragments is the activations' and working buffers' churn.
      Taken on the bytes allocated in all, the reserve had every one of seven configurations
      that ran (NeMo's GPT-3 20B, six of Megatron-Bridge's DeepSeek-V3 MXFP8 runs) over
      capacity: the most it can be of their allocated bytes is 3.5-4.9%; of their churned
      bytes, every configuration that ran leaves at least 6.1% (benchmarks/results
      fidelity_heldout_*.md)."""
    memory_gib: float
    context_gib: float
    margin_gib: float
    allocator_reserve: float

    @property
    def usable_gib(self) -> float:
        return self.memory_gib - self.context_gib - self.margin_gib

    def reserved(self, allocated: float) -> float:
        return allocated * (1.0 + self.allocator_reserve)

    @property
    def usable_bytes(self) -> float:
        """The most bytes the plan may need (StageCoeffs.needed)."""
        return self.usable_gib * GIB


def default_margin_gib(gpu) -> float:
    """The margin `plan` keeps by default on `gpu`: a fraction of its memory."""
    return DEFAULT_MARGIN_FRACTION * gpu.memory_gib


def _gpu_budget(gpu, engine: Engine, margin_gib: float | None) -> MemoryBudget:
    """One GPU's MemoryBudget under `engine`; the default margin a fraction of its memory."""
    margin = default_margin_gib(gpu) if margin_gib is None else margin_gib
    return MemoryBudget(gpu.memory_gib, engine.context_gib, margin, engine.allocator_reserve)


def memory_budget(cluster: Cluster, engine: Engine | None = None,
                  margin_gib: float | None = None) -> MemoryBudget:
    return _gpu_budget(cluster.gpu, get_engine(engine), margin_gib)


def rank_budgets(cluster, engine: Engine | None = None, margin_gib: float | None = None,
                 pp: int = 1) -> list:
    """MemoryBudget of each of `pp` pipeline ranks, on its own GPU (Cluster.rank_gpus: one GPU
    on a plain cluster; a mixed cluster's pipeline groups); the default margin is a fraction of
    each GPU's memory. `margin_gib`: one for every rank, or one per rank (what a mixed plan's
    estimate records, Estimate.stage_margin_gib)."""
    engine = get_engine(engine)
    margins = list(margin_gib) if isinstance(margin_gib, (list, tuple)) else [margin_gib] * pp
    by_gpu = {}
    out = []
    for gpu, given in zip(cluster.rank_gpus(pp), margins):
        if (id(gpu), given) not in by_gpu:
            by_gpu[(id(gpu), given)] = _gpu_budget(gpu, engine, given)
        out.append(by_gpu[(id(gpu), given)])
    return out


def capacity_bytes(cluster: Cluster, engine: Engine | None = None,
                   margin_gib: float | None = None) -> float:
    """Bytes the plan may need on one GPU (MemoryBudget.usable_bytes, StageCoeffs.needed)."""
    return memory_budget(cluster, engine, margin_gib).usable_bytes


def _head_in_flight(schedule: str, p: int, c) -> int:
    """Micro-batches whose logits the last pipeline rank holds at once (planner.cost.schedule
    in_flight for the layers)."""
    if schedule == "gpipe" and p > 1:
        return c.m
    # one, with the EP overlap too: its combined step runs the previous micro-batch's logits
    # backward before the new micro-batch's logits (planner.cost.schedule.in_flight)
    return 1


def selective_reruns(model: Model, c: Candidate, facts, lp, b: int, s: int, t: int) -> tuple:
    """(activation mode, attention-side Rerun, dense-MLP Rerun) of a layer under `c`'s
    recompute, for one micro-batch of b x s tokens (s: this context-parallel rank's): the
    mode planner.cost.memory / compute price ("selective" only where the attention core is
    among the recomputed modules, else "none"), and what the other modules of
    `c.recompute_modules` free and run again (planner.cost.recompute)."""
    if c.recompute != "selective":
        return c.recompute, Rerun(), Rerun()
    mods = applying(model, c.recompute_modules)
    mode = "selective" if "core_attn" in mods else "none"
    if mods in ((), ("core_attn",)):
        return mode, Rerun(), Rerun()
    from planner.cost.moe import dense_mlp_fwd
    gpu, tokens, eb = facts.gpu, b * s, facts.compute_elem_bytes
    # a linear's saved input: its low-precision copy where the recipe keeps that
    lin_b = lp.element_bytes if lp is not None and lp.recipe.saves_lowp_inputs else eb
    hbm = gpu.hbm_gbps * 1e9
    up_q, up_kv = mla_up_projection_times(model, gpu, tokens, t, lp) if model.is_mla else (0, 0)
    attn = attention_rerun(model, mods, tokens, t, c.sp, hbm, eb, lin_b, up_q + up_kv,
                           rope_time(model, gpu, tokens, t, facts.engine.elementwise_kernels))
    if "mlp" not in mods:
        return mode, attn, Rerun()
    gemm, elem = dense_mlp_fwd(model, gpu, b, s, t, lp, facts.engine.elementwise_traffic,
                               facts.engine.elementwise_kernels)
    kept = 3 if model.gated_mlp else 2    # gate, up, act out (plain: act in, act out)
    mlp_saved = tokens * (lin_b * model.hidden / (t if c.sp else 1)
                          + (eb * (kept - 1) + lin_b) * model.ffn_hidden / t)
    return mode, attn, dense_mlp_rerun(mods, gemm + elem, mlp_saved)


def _step_time(facts, off, c: Candidate, params_local: float) -> float:
    """The optimizer step of `params_local` parameters: on the GPU, or on the CPU with the
    host transfers it waits for where the optimizer is offloaded (planner.cost.offload)."""
    if c.offload_optimizer == "none":
        return facts.optimizer_time(params_local)
    return (off.step_cpu_s + off.step_move_s) * params_local


def tp_forward_comm(model: Model, cluster: Cluster, c: Candidate, facts) -> float:
    """Seconds of one layer's tensor-parallel communication in forward (backward moves as much):
    2 all-reduces (Megatron, Shoeybi et al. 2019, Fig. 4), or with sequence parallel 2
    all-gathers + 2 reduce-scatters (Korthikanti et al. 2022, Sec. 4.2.2), the same volume,
    of the hidden states of a context-parallel rank's tokens. `model` as the engine builds
    it (Engine.built_model)."""
    t = c.tp
    if t == 1:
        return 0.0
    tp_link = comm.group_link(cluster, t, 1)
    act = facts.comm_elem_bytes * c.mbs * (c.seq_len // c.cp) * model.hidden
    one = (comm.all_gather(act, t, tp_link) + comm.reduce_scatter(act, t, tp_link)) if c.sp \
        else comm.all_reduce(act, t, tp_link)
    return 2 * one


def _tp_overlapped(c: Candidate) -> bool:
    """Whether c overlaps its TP communication with the GEMMs (sequence parallel only)."""
    return c.tp_comm_overlap and c.tp > 1 and c.sp


def tp_passes(c: Candidate, facts, lt, tp_fwd: float) -> tuple:
    """(forward, backward) seconds one layer's tensor-parallel communication (`tp_fwd` each
    pass, tp_forward_comm) adds to its passes: all of it, or under the TP overlap (Megatron-
    Core's userbuffers; torchtitan's async TP, torch's symmetric-memory fused ops, alike) in
    the passes the engine overlaps (Engine.tp_comm_overlap_passes) what sticks out of the
    GEMMs of `lt` (the layer's LayerTime): each all-gather / reduce-scatter is split into t
    chunks pipelined with the GEMM that consumes / produces it (QKV, out-proj, FC1, FC2), t - 1
    transfers beside t GEMM chunks, so one chunk's GEMM (the local shard's first, or the last
    before its reduce-scatter) has nothing to hide: what sticks out of the other (t - 1) / t
    of the pass's GEMMs, plus the slowdown of the GEMMs it runs beside (the GPU's
    overlap_slowdown, as for every overlapped collective: StageCoeffs.exposed_comm)."""
    if not _tp_overlapped(c):
        return tp_fwd, tp_fwd
    t, slow = c.tp, facts.gpu.overlap_slowdown
    passes = facts.engine.tp_comm_overlap_passes
    return tuple(max(0.0, tp_fwd - g * (t - 1) / t) + slow * tp_fwd if name in passes
                 else tp_fwd
                 for name, g in (("fwd", lt.gemm_fwd), ("bwd", GEMM_BWD_FACTOR * lt.gemm_fwd)))


def _layer_time(model: Model, c: Candidate, facts, lp, tp_fwd: float):
    """The compute of one (dense) layer and micro-batch on one GPU (planner.cost.facts)."""
    return facts.layer_time(model, c.mbs, c.seq_len, c.tp, c.sp, c.flash, tp_fwd, lp=lp,
                            cp=c.cp)


def time_floor_figures(model: Model, cluster: Cluster, c: Candidate,
                       engine: Engine | None = None) -> tuple:
    """(fixed, dense, moe), seconds of one micro-batch on one GPU, at most what
    stage_coefficients prices c laid out on one pipeline rank at ZeRO < 3 without ZeRO++'s
    quantising kernels (under the TP overlap, the faster of it and its twin without it):
    `fixed` the embedding's and the head's forward and backward compute and the MTP modules'
    but their eh_proj (StageCoeffs compute_fixed); `dense` a layer's forward and backward
    with its TP and CP communication (t_layer); `moe` what an MoE layer adds to it at least
    (planner.cost.moe moe_layer_floor: the dropless host stall at its least, the EP overlap's
    dispatch at its least), 0 for a dense model. For any count of MoE layers up to the
    layers, L x dense + Q x moe is at most the layers' time (an MoE layer drops at most half
    the dense layer's TP communication). None needs the stage coefficients built: the
    searches order candidates by the bound these give before they build any
    (planner.search.bounds SharedCoefficients.time_floor)."""
    engine = get_engine(engine)
    model = engine.built_model(model, c.tp)
    facts = facts_for(engine, cluster.gpu)
    lp = low_precision(engine, cluster.gpu, c.precision, c.recipe, c.zero, c.offload_optimizer)
    b, sl, t = c.mbs, c.seq_len // c.cp, c.tp
    fixed = sum(facts.embedding_time(model, b, sl, t)) + sum(facts.head_time(model, b, sl, t))
    tp_fwd = tp_forward_comm(model, cluster, c, facts)
    lt = _layer_time(model, c, facts, lp, tp_fwd)
    tp = sum(tp_passes(c, facts, lt, tp_fwd))
    cpx = cp_exchange(model, b, c.seq_len, t, c.cp, c.cp_comm, cluster, lt.attn_fwd)
    dense = lt.fwd + lt.bwd + min(tp, 2 * tp_fwd) + cpx.fwd + cpx.bwd
    moe = 0.0
    if model.is_moe:
        from planner.cost.moe import moe_layer_floor
        moe = moe_layer_floor(model, cluster, c, engine, facts, lp, max(tp, 2 * tp_fwd))
    # each MTP module: a layer of the last layer's kind, the embedding and head again (its
    # eh_proj left out: _with_mtp_modules)
    last = dense + (moe if model.moe_layer(model.num_layers - 1) else 0.0)
    return fixed * (1 + model.mtp_layers) + model.mtp_layers * last, dense, moe


def stage_coefficients(model: Model, cluster: Cluster, c: Candidate,
                       engine: Engine | None = None, ranks=None) -> list:
    """StageCoeffs of every pipeline rank (or of the pipeline ranks `ranks`), for the model as
    the engine builds it at this tp (Engine.built_model: Megatron's padded vocabulary)."""
    engine = get_engine(engine)
    model = engine.built_model(model, c.tp)
    facts = facts_for(engine, cluster.gpu)
    b, s, t, p, v = c.mbs, c.seq_len, c.tp, c.pp, c.vpp
    cp = c.cp
    sl = s // cp            # tokens of a sequence on this context-parallel rank
    flash = c.flash
    lp = low_precision(engine, cluster.gpu, c.precision, c.recipe, c.zero, c.offload_optimizer)
    # ranks tp innermost, then cp, dp, pp (planner.cost.comm): the gradient group dp x cp
    tp_link = comm.group_link(cluster, t, 1)
    # the ZeRO shard group: consecutive ranks of dp x cp (all of it but under HSDP), and the
    # replicas of it, shard x t apart
    dp_link = comm.group_link(cluster, c.shard, t)
    rep_link = comm.group_link(cluster, c.replicas, t * c.shard)
    pp_link = comm.group_link(cluster, 2, t * cp * c.dp)

    act = facts.comm_elem_bytes * b * sl * model.hidden
    tp_fwd = tp_forward_comm(model, cluster, c, facts)

    # pipeline point-to-point: the activation forward and its gradient backward per chunk;
    # Megatron sends 1/t of it per rank (scatter-gather, Narayanan et al. 2021, Sec. 4.1).
    pp_fixed = 2 * v * comm.p2p(act / t, pp_link) if p > 1 else 0.0

    # parameters held by one GPU (tensor-parallel shard)
    layer_params = (model.attn_matmul_params_on_rank(t)
                    + (model.mlp_matmul_params() + model.bias_params()) / t
                    + 2 * model.norm_params())
    emb_params = model.vocab_size * model.hidden / t + (
        model.max_seq_len * model.hidden if model.position == "learned" else 0)
    head_params = model.norm_params() + (model.vocab_size * model.hidden / t
                                         if (not model.tied_embeddings or p > 1) else 0)

    # the block linears' weights on this GPU: what low precision quantises
    linear_params = model.attn_matmul_params_on_rank(t) + model.mlp_matmul_params() / t
    lt = _layer_time(model, c, facts, lp, tp_fwd)
    tp_overlapped = _tp_overlapped(c)
    tp_pass = tp_passes(c, facts, lt, tp_fwd)   # what forward and backward pay of it
    tp_layer = tp_pass[0] + tp_pass[1]
    # selective recompute of modules (planner.cost.recompute): the attention core as the
    # "selective" formulas price it, the other modules what they free and run again
    rec_mode, attn_rerun, mlp_rerun = selective_reruns(model, c, facts, lp, b, sl, t)
    tp_rec = (tp_pass[0] if c.recompute == "full" else 0.0) + (
        tp_pass[0] / 2 if mlp_rerun.mlp_tp else 0.0)
    # saved activations, logits, embedding and head: per token, so per s/cp tokens
    act_none = facts.activation_bytes(model, b, sl, t, c.sp, "none", flash, lp=lp)
    act_rec = (facts.activation_bytes(model, b, sl, t, c.sp, rec_mode, flash, lp=lp)
               - attn_rerun.freed_bytes - mlp_rerun.freed_bytes)
    emb_f, emb_b = facts.embedding_time(model, b, sl, t)
    head_f, head_b = facts.head_time(model, b, sl, t)
    head = facts.head_memory(model, b, sl, t, c.sp, p)
    # context parallel K/V exchange (planner.cost.context); a recompute that re-runs the
    # attention (full, selective: the attention core, or "op" where the engine's policy
    # recomputes the attention kernel) exchanges again
    cpx = cp_exchange(model, b, s, t, cp, c.cp_comm, cluster, lt.attn_fwd)
    cp_layer = cpx.fwd + cpx.bwd
    cp_rec = cpx.fwd if rec_mode in ("full", "selective") or (
        rec_mode == "op" and engine.op_recomputes_attention) else 0.0
    schedule = engine.effective_schedule(c.schedule, p, c.m)
    grad_bytes = engine.grad_bytes
    states = dict(grad_bytes=grad_bytes, weight_bytes=engine.weight_bytes,
                  optimizer_bytes=engine.optimizer_bytes,
                  compute_copy_bytes=facts.compute_copy_bytes,
                  autocast_copy_bytes=engine.autocast_copy_bytes * (facts.compute_elem_bytes == BF16))
    # what stays in GPU memory of them under an offload (planner.cost.offload)
    gpu_states = gpu_state_bytes(engine, states, c)
    off = per_param(engine, cluster, c)

    # data parallel: gradients reduced in the engine's gradient dtype, parameters gathered in
    # its compute dtype (bf16; fp32 where it computes in fp32)
    # weights replicated over cp: reduced and sharded over dp x cp (its shard group under HSDP)
    dp = c.shard
    g_layer = grad_bytes * layer_params
    w_layer = facts.compute_elem_bytes * layer_params
    if lp is not None and lp.recipe.fsdp_lowp_all_gather and c.zero >= 2:
        # FSDP2 gathers the linear weights in FP8 and holds them so (torchtitan
        # enable_fsdp_float8_all_gather)
        w_layer -= (BF16 - lp.element_bytes) * linear_params
    # what one all-gather of a layer's weights moves (FP8 primary weights' 1-byte data too)
    w_gather = weight_gather_bytes(lp, c.zero, facts.compute_elem_bytes, layer_params,
                                   linear_params)
    local = (lambda x: x / dp) if c.zero >= 1 else (lambda x: x)   # noqa: E731
    # memory of a layer, the same on every rank but for the micro-batches in flight
    wl, gl, ol = model_state_bytes(layer_params, dp, c.zero, **gpu_states)
    wl, gl = (a + x for a, x in zip((wl, gl), pipelined_fsdp_unsharded(
        engine, c, layer_params, states, dp)))
    # the quantised weight copies kept beside the bf16 weights (Transformer Engine), of the
    # shard this rank holds under ZeRO-3
    wl += weight_copy_bytes(lp, c.zero, (linear_params, dp),
                            whole=gathered_copies_whole(engine, lp, c.recompute))
    zpp, (q_fwd, q_bwd) = None, (0.0, 0.0)
    if c.zeropp and c.zero == 3 and dp > 1:
        # hpZ's group: the data-parallel ranks of one node (zero_hpz_partition_size)
        hpz = hpz_size(dp, cluster.gpus_per_node, t)
        zpp = ZeroPP(hpz, comm.group_link(cluster, hpz, t), QWZ_BYTES / facts.compute_elem_bytes,
                     QGZ_BYTES / grad_bytes)
        q_fwd, q_bwd = zpp.kernel_times(layer_params, dp, facts.gpu.hbm_gbps)
        wl += facts.compute_elem_bytes * layer_params / hpz     # hpZ's secondary partition
    head_in_flight = _head_in_flight(schedule, p, c)
    layer = dict(
        compute_layer=lt.fwd + lt.bwd + q_fwd + q_bwd,
        compute_rec=lt.recompute(rec_mode) + attn_rerun.fwd_s + mlp_rerun.fwd_s,
        tp_layer=tp_layer, tp_rec=tp_rec, pp_fixed=pp_fixed,
        tp_overlap_slower=tp_overlapped and max(tp_pass) > tp_fwd,
        cp_layer=cp_layer, cp_rec=cp_rec,
        fwd_layer=lt.fwd + tp_pass[0] + cpx.fwd + q_fwd,
        bwd_layer=lt.bwd + tp_pass[1] + cpx.bwd + q_bwd,
        wgrad_layer=weight_grad_time(lt),
        grad_overlapped=engine.overlap_grad_reduce,
        gather_overlapped=engine.overlap_param_gather,
        opt_layer=_step_time(facts, off, c, local(layer_params)),
        off_layer=off.step_move_s * local(layer_params),
        offf_layer=off.fwd_s * local(layer_params),
        offb_layer=off.bwd_s * local(layer_params),
        overlap_slowdown=facts.gpu.overlap_slowdown)

    def fixed_part(first: bool, last: bool) -> dict:
        """What a rank's place in the pipeline adds: the embedding on the first, the head on
        the last (their times, states, collectives and working memory)."""
        fixed_params = (emb_params if first else 0.0) + (head_params if last else 0.0)
        compute_fixed = (emb_f + emb_b if first else 0.0) + (head_f + head_b if last else 0.0)
        bwd_fixed = (emb_b if first else 0.0) + (head_b if last else 0.0)
        fwd_fixed = (emb_f if first else 0.0) + (head_f if last else 0.0)
        g_fixed = grad_bytes * fixed_params
        w_fixed = facts.compute_elem_bytes * fixed_params
        z = dp_collectives(c.zero, engine, dp, dp_link, g_layer, g_fixed, w_gather, w_fixed,
                           c.replicas, rep_link, zpp)
        wf, gf, of = model_state_bytes(fixed_params, dp, c.zero, **gpu_states)
        if zpp is not None:     # hpZ's secondary partition of the embedding and head
            wf += facts.compute_elem_bytes * fixed_params / zpp.hpz
        wf, gf = (a + x for a, x in zip((wf, gf), pipelined_fsdp_unsharded(
            engine, c, fixed_params, states, dp)))
        buckets = DP_BUCKET_BYTES if dp > 1 else 0.0
        other, buffers = buckets, 0.0
        if engine.tp_overlap_userbuffers and tp_overlapped:
            # the TP overlap's userbuffers, outside PyTorch's allocator (counted here, so
            # under its reserve too: 5% more of them than they take)
            buffers = userbuffer_bytes(b * sl, model.hidden,
                                       lp is not None and lp.precision in FP8_FORMATS)
            other += buffers
        z3_peak = z3_end = 0.0
        if c.zero == 3 and dp > 1:
            # gathered while computing: the layers' and the embedding's and head's unsharded
            # weights and gradients at the peak, as the engine groups them, and what the
            # backward's last reduce-scatter holds once the activations are freed
            wrap = effective_fsdp_outer_wrap(engine, model, p)
            emb, head_p = emb_params if first else 0.0, head_params if last else 0.0
            z3_peak = zero3_unsharded_bytes(
                engine.zero3_is_fsdp2, wrap, layer_params, emb, head_p, w_layer,
                facts.compute_elem_bytes, grad_bytes)
            z3_end = zero3_end_bytes(wrap, layer_params, emb, head_p, facts.compute_elem_bytes,
                                     grad_bytes)
            other += z3_peak
        # working memory of the layer being computed: a recomputed layer re-materialises its
        # full activations in backward; in any case one layer's worth is live.
        work = act_none + cpx.buffer_bytes
        if rec_mode == "offload":
            # an offloaded layer's activations stay until their copy to the host ends, beside
            # the next layers': one layer's more, as Transformer Engine's first offload handler
            # held (cpu_offload_v1.py, double-buffered groups); its schedule from TE 2.10
            # holds no more than the kept layers' (each copy ends before the kept layers'
            # count of layers later: cpu_offload.py DefaultOffloadSynchronizer)
            work += act_none
        # the last stage holds its head's saved tensors for every micro-batch whose backward
        # has not run (one under 1F1B, with the EP overlap too; all m under GPipe), and the
        # loss's peak beyond them once, as working memory. The embedding
        # output is the first layer's input, counted with that layer's activations.
        fixed_act = head.held * head_in_flight if last else 0.0
        if last and p > 1 and engine.pipeline_returns_outputs:
            # the logits of every micro-batch whose backward has run, kept to the step's end
            fixed_act += head.output * max(c.m - head_in_flight, 0)
        if last and c.recompute in ("none", "offload"):
            # no layer recomputed (an offloaded one is reloaded, not run again): a layer's
            # working set (its backward's temporaries, within
            # one layer's activations) and the loss's peak are of different moments: the loss
            # peaks with its micro-batch's head held; the layers' backward runs after the
            # head's has freed that micro-batch's head (autograd frees saved tensors as their
            # node runs), so the larger of the two is live, not both. (Under recompute both
            # stay counted: torchtitan's measured Llama 3 70B, tp 8, mbs 16, full recompute,
            # max_memory_reserved 71.9 GiB, was -1.3% with the sum and -12.6% with the larger
            # when this was measured (2026-12-02; -2.1% with the sum since ZeRO-3's state is
            # priced at the peak, planner.cost.dataparallel.zero3_unsharded_bytes):
            # backward re-materialises the layer beside something this model does not name.)
            work = max(head.working, work - head.held)
        elif last:
            work += head.working
        # the backward's end holds no layer's working set: the larger of the two moments
        other += max(work, z3_end - z3_peak)
        return dict(compute_fixed=compute_fixed, fwd_fixed=fwd_fixed, bwd_fixed=bwd_fixed,
                    opt_fixed=_step_time(facts, off, c, local(fixed_params)),
                    off_fixed=off.step_move_s * local(fixed_params),
                    offf_fixed=off.fwd_s * local(fixed_params),
                    offb_fixed=off.bwd_s * local(fixed_params),
                    mem_fixed={"params": wf, "grads": gf, "optimizer": of,
                               "activations": fixed_act, "other": other},
                    userbuffer_bytes=buffers, bucket_bytes=buckets, **z)

    coeffs, fixed_parts = [], {}
    for rank in (range(p) if ranks is None else ranks):
        place = (rank == 0, rank == head_rank(schedule, p))
        if place not in fixed_parts:
            fixed_parts[place] = fixed_part(*place)
        fixed = dict(fixed_parts[place])
        fixed["mem_fixed"] = dict(fixed["mem_fixed"])
        infl = in_flight(schedule, p, rank, c.m, v)
        if engine.pipeline_recv_buffers:
            # the stage boundary: the hidden state of a micro-batch, sequence-sharded under sp
            fixed["mem_fixed"]["other"] = fixed["mem_fixed"].get("other", 0.0) + (
                stage_buffer_bytes(schedule, p, rank, c.m, v, infl,
                                   act / (t if c.sp and t > 1 else 1),
                                   engine.pipeline_keeps_input_grads))
        coeffs.append(StageCoeffs(
            rank=rank, **layer, **fixed,
            mem_layer={"params": wl, "grads": gl, "optimizer": ol,
                       "activations": act_none * infl},
            mem_rec=(act_none - act_rec) * infl, churn_reserve=engine.allocator_reserve))
    if model.is_moe:
        from planner.cost.moe import with_moe_layers
        infl = [in_flight(schedule, p, k.rank, c.m, v) for k in coeffs]
        coeffs = with_moe_layers(model, cluster, c, engine, facts, coeffs, lp=lp, states=states,
                                 tp_pass=tp_pass, infl=infl,
                                 reruns=(rec_mode, attn_rerun, mlp_rerun))
    if model.mtp_layers:
        head_in_flight = _head_in_flight(schedule, p, c)
        extra_emb = 0.0 if p == 1 else (emb_params - (model.vocab_size * model.hidden / t
                                                     if model.tied_embeddings else 0.0))
        coeffs = [_with_mtp_modules(model, c, engine, facts, k, states=states, act=act,
                                    tp_link=tp_link, dp_link=dp_link, extra_emb=extra_emb,
                                    emb=(emb_f, emb_b), head=(head_f, head_b),
                                    head_held=(head.held - head.norm_input) * head_in_flight,
                                    infl=in_flight(schedule, p, k.rank, c.m, v))
                  if k.rank == head_rank(schedule, p) else k for k in coeffs]
    return coeffs


# What one MTP module saves for backward beside its transformer layer, in hidden-wide bf16
# tensors per token (megatron/core/transformer/multi_token_prediction.py,
# MultiTokenPredictionLayer.forward): the enorm and hnorm inputs (the shifted tokens' embedding
# and the previous depth's hidden states), the 2*hidden-wide eh_proj input (their
# concatenation) and the final layernorm's input (the layer's output).
MTP_SAVED_HIDDENS = 2 + 2 + 1


def _with_mtp_modules(model: Model, c: Candidate, engine: Engine, facts, k: StageCoeffs,
                      states: dict, act: float, tp_link, dp_link, extra_emb: float,
                      emb: tuple, head: tuple, head_held: float, infl: int) -> StageCoeffs:
    """The last pipeline rank's coefficients with the model's MTP modules added to its fixed
    parts, as Megatron-Core builds them there (multi_token_prediction.py: without a custom
    layout mtp_on_this_rank is the last pipeline stage, its last virtual chunk). Each module
    (MultiTokenPredictionLayer; DeepSeek-V3 report Sec. 2.2): the embedding of the tokens
    shifted by one more (GPTModel keeps an `embedding` on the MTP stage: `if self.pre_process
    or self.mtp_process`, a copy of the word embeddings under pp > 1 unless the output layer's
    shared weight already is it), enorm and hnorm, eh_proj (a ColumnParallelLinear 2h -> h),
    one transformer layer of the decoder's layer spec (the last layer's kind, MoE for
    DeepSeek-V3), the final layernorm, and the shared output layer and cross-entropy again.
    The layer is priced as the rank's own layers are (its fwd/bwd with TP, CP and EP
    communication, its states, ZeRO collectives and optimizer, its activations x micro-batches
    in flight), without recompute: Megatron's MultiTokenPredictionLayer has a
    _checkpointed_forward it uses under --recompute-granularity full, not priced yet, so
    under full recompute this over-counts the module's activations (the safe side for "fits")
    and under-counts its time by one forward of the module."""
    from planner.cost.compute import gemm_time
    from planner.cost.moe import replace_coeffs
    L = model.mtp_layers
    t = c.tp
    b, sl = c.mbs, c.seq_len // c.cp
    h = model.hidden
    kind = k.moe if (k.moe is not None and model.moe_layer(model.num_layers - 1)) else None

    def per_layer(f):
        return getattr(k, f) + (getattr(kind, f) if kind is not None else 0.0)

    def per_layer_mem(key):
        return k.mem_layer.get(key, 0.0) + (kind.mem_layer.get(key, 0.0) if kind else 0.0)

    # eh_proj: one (b*sl x 2h) @ (2h x h/t) GEMM (bf16: it runs outside the decoder's
    # low-precision linears); under sequence parallel its input is all-gathered and, being
    # column-parallel, its output gathered over tp (gather_from_tensor_model_parallel_region)
    # and scattered back to the sequence shards; the backward moves the same volumes.
    eh_f = gemm_time(facts.gpu, b * sl, h / t, 2 * h)
    eh_b = GEMM_BWD_FACTOR * eh_f
    eh_comm = 0.0
    if t > 1:
        eh_comm = comm.all_gather(act, t, tp_link) + (
            comm.all_gather(2 * act, t, tp_link) if c.sp else 0.0)
    emb_f, emb_b = emb
    head_f, head_b = head
    fwd = per_layer("fwd_layer") + eh_f + eh_comm + emb_f + head_f
    bwd = per_layer("bwd_layer") + eh_b + eh_comm + emb_b + head_b
    # parameters beside the layers: each module's eh_proj shard and three norms, and the one
    # embedding copy they share (counted here per module: divided by L)
    extra = 2 * h * h / t + 3 * model.norm_params() + extra_emb / L
    dp = c.dp_cp
    we, ge, oe = model_state_bytes(extra, dp, c.zero, **states)
    ze = dp_collectives(c.zero, engine, dp, dp_link, states["grad_bytes"] * extra, 0.0,
                        facts.compute_elem_bytes * extra, 0.0)
    local = extra / dp if c.zero >= 1 else extra
    saved = MTP_SAVED_HIDDENS * BF16 * b * sl * h / (t if c.sp and t > 1 else 1)
    mem_fixed = dict(k.mem_fixed)
    for key, add in (("params", we), ("grads", ge), ("optimizer", oe)):
        mem_fixed[key] = mem_fixed.get(key, 0.0) + L * (per_layer_mem(key) + add)
    mem_fixed["activations"] = mem_fixed.get("activations", 0.0) + L * (
        per_layer_mem("activations") + saved * infl + head_held)
    if c.zero == 3 and dp > 1:   # the gathered eh_proj and embedding copy, as the head's
        mem_fixed["other"] = mem_fixed.get("other", 0.0) + L * (
            facts.compute_elem_bytes + states["grad_bytes"]) * extra
    return replace_coeffs(k, mem_fixed=mem_fixed,
                   compute_fixed=k.compute_fixed + L * (fwd + bwd),
                   fwd_fixed=k.fwd_fixed + L * fwd, bwd_fixed=k.bwd_fixed + L * bwd,
                   opt_fixed=k.opt_fixed + L * (per_layer("opt_layer")
                                                + facts.optimizer_time(local)),
                   **{f"{x}_fixed": getattr(k, f"{x}_fixed") + L * (per_layer(f"{x}_layer")
                                                                    + ze[f"{x}_fixed"])
                      for x in ("zf", "zb", "grad", "gather")})


def model_flops_per_step(model: Model, seq_len: int, global_batch: int) -> float:
    """Model FLOPs of one step (no recompute), counted as Megatron-LM counts them:
    6 x matmul parameters x tokens + non-causal attention 12*B*s^2*h per layer; for GPT this is
    72*B*s*l*h^2*(1 + s/(6h) + V/(12*h*l)) (Narayanan et al. 2021, Appendix). The attention
    term takes the model's attention width and window (compute.attention_width,
    mean_attended_keys: s keys a query, fewer under a sliding window).

    MTP modules count as Megatron's num_floating_point_operations counts them
    (megatron/training/training.py, transformer_flops): each adds one layer of the last
    layer's kind (attention and MLP or MoE), its norms and eh_proj (3h + 2h^2 per token) and
    one more output logit GEMM (V*h x (mtp_num_layers + 1))."""
    tokens = seq_len * global_batch
    dense = model.attn_matmul_params() + model.mlp_matmul_params()
    mtp = model.mtp_layers
    other = model.vocab_size * model.hidden * (1 + mtp)
    if model.is_moe:   # an MoE layer's token runs its router, shared and top-k experts
        from planner.cost.moe import flops_per_token_layer
        q = model.num_moe_layers + (mtp if model.moe_layer(model.num_layers - 1) else 0)
        other += q * (flops_per_token_layer(model) - dense)
    other += mtp * (3 * model.hidden + 2 * model.hidden * model.hidden)
    return ((model.num_layers + mtp) * dense_layer_flops(model, seq_len, global_batch)
            + 6.0 * other * tokens)


def dense_layer_flops(model: Model, seq_len: int, batch: int) -> float:
    """Model FLOPs of one dense layer's forward and backward over `batch` sequences, counted as
    model_flops_per_step counts them: 6 x its matmul parameters x tokens + non-causal
    attention 12*B*s*keys*width."""
    return (6.0 * (model.attn_matmul_params() + model.mlp_matmul_params()) * seq_len * batch
            + 12.0 * batch * seq_len * mean_attended_keys(model, seq_len, causal=False)
            * attention_width(model))


@dataclass
class Estimate:
    fits: bool
    step_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float
    peak_memory_gib: float
    time_breakdown_s: dict
    stage_memory_gib: list     # per pipeline rank, by category
    stage_time_s: list         # per pipeline rank, one micro-batch
    capacity_gib: float        # what the allocator may hold: memory - context - margin
    peak_reserved_gib: float = 0.0   # the allocator's reserve at the peak (max over ranks)
    margin_gib: float = 0.0
    # what the plan needs at the peak (max over ranks), which decides it fits (MemoryBudget)
    peak_needed_gib: float = 0.0
    # per pipeline rank where the ranks' GPUs differ (a mixed cluster); empty: capacity_gib
    stage_capacity_gib: list = field(default_factory=list)
    stage_margin_gib: list = field(default_factory=list)   # likewise; empty: margin_gib
    host: object = None   # planner.cost.offload.HostUse of an offload plan, else None

    def overflow_gib(self) -> list:
        caps = self.stage_capacity_gib or [self.capacity_gib] * len(self.stage_memory_gib)
        return [m["needed"] - c for m, c in zip(self.stage_memory_gib, caps)]

    def to_dict(self) -> dict:
        return {"fits": self.fits, "step_time_s": self.step_time_s,
                "tokens_per_s": self.tokens_per_s, "tflops_per_gpu": self.tflops_per_gpu,
                "mfu": self.mfu, "peak_memory_gib": self.peak_memory_gib,
                "peak_reserved_gib": self.peak_reserved_gib,
                "peak_needed_gib": self.peak_needed_gib,
                "capacity_gib": self.capacity_gib, "memory_margin_gib": self.margin_gib,
                "time_breakdown_s": self.time_breakdown_s,
                **({"stage_capacity_gib": self.stage_capacity_gib}
                   if self.stage_capacity_gib else {}),
                **({"stage_margin_gib": self.stage_margin_gib}
                   if self.stage_margin_gib else {}),
                **({"host_memory_gib_per_node": self.host.host_gib,
                    "host_capacity_gib_per_node": self.host.host_capacity_gib,
                    "nvme_tib_per_node": self.host.nvme_tib,
                    "nvme_capacity_tib_per_node": self.host.nvme_capacity_tib}
                   if self.host is not None else {})}


def offload_stalls(model: Model, cluster: Cluster, c: Candidate, engine: Engine, coeffs: list,
                   layers: list, recompute: list) -> list:
    """Per pipeline rank, the seconds per micro-batch its activation offload (recompute
    "offload": its first `recompute` layers') adds (planner.cost.offload
    activation_offload_stall), its layers in model order, each with its kind's passes and
    activations (a layer's freed activations: mem_rec, per micro-batch in flight)."""
    sched = engine.effective_schedule(c.schedule, c.pp, c.m)
    link = cluster.gpu.host_link_gbps * 1e9
    out, start = [], 0
    for k, n, r in zip(coeffs, layers, recompute):
        per = 1.0 / in_flight(sched, c.pp, k.rank, c.m, c.vpp)
        fwd, bwd, copy = [], [], []
        for idx in range(start, start + n):
            d = k.moe if k.moe is not None and model.moe_layer(idx) else None
            fwd.append(k.fwd_layer + (d.fwd_layer if d else 0.0))
            bwd.append(k.bwd_layer + (d.bwd_layer if d else 0.0))
            copy.append((k.mem_rec + (d.mem_rec if d else 0.0)) * per / link)
        out.append(activation_offload_stall(fwd, bwd, copy, r) if r else 0.0)
        start += n
    return out


def _kind_counts(model: Model, c: Candidate, coeffs: list, layers: list, recompute: list
                 ) -> tuple:
    """(MoE layers, recomputed MoE layers) per rank where dense and MoE layers mix, else 0s."""
    if coeffs[0].moe is not None:   # dense and MoE layers: how many of each a rank holds
        from planner.cost.moe import moe_counts
        return moe_counts(model, c.pp, c.vpp, layers, recompute)
    return [0] * len(coeffs), [0] * len(coeffs)


def _stage_memory(coeffs: list, layers: list, recompute: list, qs: list, rqs: list,
                  budgets: list) -> list:
    """Per rank, its memory in GiB as Estimate.stage_memory_gib holds it."""
    mems = []
    for kk, nn, rr, qq, rqq, budget in zip(coeffs, layers, recompute, qs, rqs, budgets):
        m = {key: val / GIB for key, val in kk.memory(nn, rr, qq, rqq).items()}
        m["reserved"] = budget.reserved(m["total"])
        mems.append(m)
    return mems


def overflow(model: Model, cluster: Cluster, c: Candidate, layers: list, recompute: list,
             coeffs: list, engine: Engine | None = None, margin_gib: float | None = None
             ) -> tuple:
    """(Estimate.overflow_gib(), Estimate.stage_memory_gib, the ranks' usable GiB) of the
    plan, as `evaluate` gives them, without its time: what a search that only asks by how
    much a placement misses (the closest candidate, the rejected layouts) needs."""
    engine = get_engine(engine)
    budgets = rank_budgets(cluster, engine, margin_gib, len(coeffs))
    qs, rqs = _kind_counts(model, c, coeffs, layers, recompute)
    mems = _stage_memory(coeffs, layers, recompute, qs, rqs, budgets)
    caps = [b.usable_gib for b in budgets]
    return [m["needed"] - cb for m, cb in zip(mems, caps)], mems, caps


def evaluate(model: Model, cluster: Cluster, c: Candidate, layers: list, recompute: list,
             coeffs: list | None = None, engine: Engine | None = None,
             margin_gib: float | None = None) -> Estimate:
    """Estimate of a full plan: per-rank layer counts `layers` and recomputed counts."""
    engine = get_engine(engine)
    coeffs = coeffs or stage_coefficients(model, cluster, c, engine)
    budgets = rank_budgets(cluster, engine, margin_gib, len(coeffs))
    qs, rqs = _kind_counts(model, c, coeffs, layers, recompute)
    times = [k.time(n, r, q, rq) for k, n, r, q, rq in zip(coeffs, layers, recompute, qs, rqs)]
    stalls = [0.0] * len(coeffs)
    if c.recompute == "offload" and any(recompute):
        stalls = offload_stalls(model, cluster, c, engine, coeffs, layers, recompute)
        times = [x + s for x, s in zip(times, stalls)]
    fwd, wgrad = forward_and_wgrad(coeffs, layers, qs)
    pipe, bubble = pipeline_time(times, c.m, c.vpp,
                                 engine.effective_schedule(c.schedule, c.pp, c.m), fwd, wgrad)
    tails = [k.tail(n, q) for k, n, q in zip(coeffs, layers, qs)]
    step = pipe + max(tails)
    crit = max(range(len(times)), key=lambda i: times[i])
    k, n, r, q, rq = coeffs[crit], layers[crit], recompute[crit], qs[crit], rqs[crit]
    tk = max(range(len(tails)), key=lambda i: tails[i])
    kt, nt = coeffs[tk], layers[tk]
    opt = kt.opt_fixed + nt * kt.opt_layer + (qs[tk] * kt.moe.opt_layer if kt.moe else 0.0)
    km = k.moe
    breakdown = {
        "compute": c.m * (k.compute_fixed + n * k.compute_layer + r * k.compute_rec
                          + (q * km.compute_layer + rq * km.compute_rec if km else 0.0)),
        "tp_comm": c.m * (n * k.tp_layer + r * k.tp_rec
                          + (q * km.tp_layer + rq * km.tp_rec if km else 0.0)),
        "pp_comm": c.m * k.pp_fixed,
        "dp_comm_exposed": c.m * k.zero_exposed(n, q) + tails[tk] - opt,
        "bubble": bubble,
        "optimizer": opt,
    }
    if offloads(c):
        # the host transfers the step waits for, and what those of every micro-batch add to
        # the exposed collectives they hide with (planner.cost.offload)
        moved = kt.off_fixed + nt * kt.off_layer
        per_mb = c.m * sum(k.exposed_comm(*e, n, slowdown=0.0) for e in k.exposures()[2:])
        breakdown["optimizer"] = opt - moved
        breakdown["offload"] = moved + per_mb
        breakdown["dp_comm_exposed"] -= per_mb
    if c.recompute == "offload":   # the offloaded layers' host copies that stick out
        breakdown["activation_offload"] = c.m * stalls[crit]
    if c.cp > 1:   # the exposed context-parallel exchange (a plan without CP has no entry)
        breakdown["cp_comm"] = c.m * (n * k.cp_layer + r * k.cp_rec)
    if model.is_moe:   # expert-parallel dispatch and combine (all-to-all or all-gather)
        breakdown["ep_comm"] = c.m * (n * k.ep_layer + r * k.ep_rec
                                      + (q * km.ep_layer + rq * km.ep_rec if km else 0.0))
    mems = _stage_memory(coeffs, layers, recompute, qs, rqs, budgets)
    caps = [b.usable_gib for b in budgets]
    cap = min(caps)
    fits = all(mm["needed"] <= cb for mm, cb in zip(mems, caps))
    peak = max(mm["total"] for mm in mems)
    peak_reserved = max(mm["reserved"] for mm in mems)
    peak_needed = max(mm["needed"] for mm in mems)
    tokens = c.seq_len * c.global_batch
    flops = model_flops_per_step(model, c.seq_len, c.global_batch)
    tflops = flops / step / c.num_gpus / 1e12
    # what the busiest rank's offloaded layers hold on the host: every tensor they save (an
    # MoE layer's expert side too, which Transformer Engine's current offload moves and its
    # first handler leaves on the GPU, planner.cost.moe: counted on both sides)
    act_host = max(rr * kk.mem_layer.get("activations", 0.0)
                   + (rqq * kk.moe.mem_layer.get("activations", 0.0) if kk.moe else 0.0)
                   for kk, rr, rqq in zip(coeffs, recompute, rqs)) \
        if c.recompute == "offload" else 0.0
    host = (host_use(model, cluster, c, engine, layers, activation_bytes=act_host)
            if offloads(c) or act_host else None)
    return Estimate(fits=fits and (host is None or host.fits),
                    host=host, step_time_s=step, tokens_per_s=tokens / step,
                    tflops_per_gpu=tflops, mfu=tflops / cluster.peak_tflops_per_gpu,
                    peak_memory_gib=peak, time_breakdown_s=breakdown,
                    stage_memory_gib=mems, stage_time_s=times, capacity_gib=cap,
                    peak_reserved_gib=peak_reserved, peak_needed_gib=peak_needed,
                    margin_gib=budgets[0].margin_gib,
                    stage_capacity_gib=caps if len(set(caps)) > 1 else [],
                    stage_margin_gib=[b.margin_gib for b in budgets] if len(set(caps)) > 1
                    else [])
