"""From a candidate configuration to per-stage linear costs, and the evaluation of a plan.

A pipeline rank's time and memory are linear in the number of layers it holds (n) and the
number it recomputes (r): identical layers are interchangeable, so the search counts them.
`StageCoeffs` holds those coefficients; `evaluate` turns a choice of (n, r) per rank into the
estimate; the CP-SAT search in planner.search minimises the same expression.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from planner.cost import comm
from planner.cost.compute import (BF16, embedding_time, head_time, layer_time,
                                  optimizer_time)
from planner.cost.memory import (GIB, activation_bytes, logits_bytes, model_state_bytes)
from planner.cost.schedule import in_flight, pipeline_time
from planner.specs import Cluster, Model

# Megatron-LM accumulates and all-reduces gradients in fp32 when training in bf16
# (megatron/training/arguments.py: accumulate_allreduce_grads_in_fp32 = True for --bf16).
GRAD_REDUCE_BYTES = 4
# Memory the framework needs beyond tensors we count: CUDA context (~0.5 GiB), NCCL
# communicator buffers (~1 GiB for a few communicators at the default NCCL_BUFFSIZE of 4 MiB
# per channel and peer) and allocator fragmentation headroom. A documented allowance.
RUNTIME_RESERVE_GIB = 2.0
# Gradient-reduction buckets kept alive by DDP / the distributed optimizer: Megatron's default
# bucket of 40M parameters (megatron/core/distributed/distributed_data_parallel_config.py),
# in fp32.
DP_BUCKET_BYTES = 40e6 * GRAD_REDUCE_BYTES


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
    # software, not searched: FlashAttention kernels (else the unfused softmax attention of
    # Megatron-LM before 2022, which also keeps the s^2 scores unless recomputed)
    flash: bool = True

    @property
    def m(self) -> int:
        return self.global_batch // (self.dp * self.mbs)

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp


@dataclass
class StageCoeffs:
    """Costs of pipeline rank `rank` as linear functions of n (layers) and r (recomputed).

    Times are seconds per micro-batch unless named `tail` (once per step); memory in bytes.
    """
    rank: int
    # per micro-batch stage time: t_fixed + n * t_layer + r * t_rec (+ ZeRO exposure)
    compute_fixed: float
    compute_layer: float
    compute_rec: float
    tp_layer: float
    tp_rec: float
    pp_fixed: float
    # ZeRO-2/3 per-micro-batch collectives, hidden behind that micro-batch's compute
    z_layer: float
    z_fixed: float
    # step tail (after the last micro-batch): gradient reduction hidden behind the last
    # backward, the parameter all-gather and the optimizer step
    grad_layer: float
    grad_fixed: float
    bwd_layer: float
    bwd_fixed: float
    gather_layer: float
    gather_fixed: float
    fwd_layer: float          # forward of one micro-batch: hides the parameter gather
    fwd_fixed: float
    opt_layer: float
    opt_fixed: float
    # memory: m_fixed + n * m_layer - r * m_rec
    mem_fixed: dict = field(default_factory=dict)   # by category
    mem_layer: dict = field(default_factory=dict)
    mem_rec: float = 0.0                             # activations saved per recomputed layer
    # a collective hidden behind compute still slows it: NCCL runs on SMs (planner.specs.Gpu)
    overlap_slowdown: float = 0.0

    @property
    def t_fixed(self) -> float:
        return self.compute_fixed + self.pp_fixed

    @property
    def t_layer(self) -> float:
        return self.compute_layer + self.tp_layer

    @property
    def t_rec(self) -> float:
        return self.compute_rec + self.tp_rec

    def z_overlap(self, n: int) -> float:
        return self.compute_fixed + n * self.compute_layer

    def hidden_comm(self, c_layer: float, c_fixed: float, h_layer: float, h_fixed: float,
                    n: int) -> float:
        """Time a collective of c_fixed + n*c_layer adds when it overlaps h_fixed + n*h_layer of
        compute: what sticks out (at least its last layer's bucket, which has nothing left to
        hide behind), plus the compute it slows while it runs."""
        comm = c_fixed + n * c_layer
        if comm <= 0:
            return 0.0
        return max(c_layer, comm - (h_fixed + n * h_layer)) + self.overlap_slowdown * comm

    def zero_exposed(self, n: int) -> float:
        """ZeRO-2/3 collectives of one micro-batch, overlapping its forward and backward."""
        return self.hidden_comm(self.z_layer, self.z_fixed, self.compute_layer,
                                self.compute_fixed, n)

    def time(self, n: int, r: int) -> float:
        return self.t_fixed + n * self.t_layer + r * self.t_rec + self.zero_exposed(n)

    def tail(self, n: int) -> float:
        """Once per step: the gradient reduction behind the last backward, the parameter
        all-gather behind the next forward (Megatron's --overlap-grad-reduce and
        --overlap-param-gather), and the optimizer step."""
        return (self.hidden_comm(self.grad_layer, self.grad_fixed, self.bwd_layer,
                                 self.bwd_fixed, n)
                + self.hidden_comm(self.gather_layer, self.gather_fixed, self.fwd_layer,
                                   self.fwd_fixed, n)
                + self.opt_fixed + n * self.opt_layer)

    def tail_lower(self, n: int) -> float:
        """A lower bound on tail(n): every collective hidden but its last bucket."""
        out = self.opt_fixed + n * self.opt_layer
        for c_layer, c_fixed in ((self.grad_layer, self.grad_fixed),
                                 (self.gather_layer, self.gather_fixed)):
            comm = c_fixed + n * c_layer
            if comm > 0:
                out += c_layer + self.overlap_slowdown * comm
        return out

    def memory(self, n: int, r: int) -> dict:
        out = {k: self.mem_fixed.get(k, 0.0) + n * self.mem_layer.get(k, 0.0)
               for k in ("params", "grads", "optimizer", "activations", "other")}
        out["activations"] -= r * self.mem_rec
        out["total"] = sum(out.values())
        return out

    def mem_total_fixed(self) -> float:
        return sum(self.mem_fixed.values())

    def mem_total_layer(self) -> float:
        return sum(self.mem_layer.values())


def capacity_bytes(cluster: Cluster) -> float:
    return (cluster.gpu.memory_gib - RUNTIME_RESERVE_GIB) * GIB


def stage_coefficients(model: Model, cluster: Cluster, c: Candidate) -> list:
    gpu, b, s, t, p, v = cluster.gpu, c.mbs, c.seq_len, c.tp, c.pp, c.vpp
    flash = c.flash
    meas = cluster.measured   # profile hook: measured figures replace the catalog's (--profile)
    lt = layer_time(model, gpu, b, s, t, c.sp, flash)
    tp_link = comm.group_link(cluster, t, 1)
    dp_link = comm.group_link(cluster, c.dp, t)
    pp_link = comm.group_link(cluster, 2, t * c.dp)

    # tensor parallel: per layer 2 all-reduces forward and 2 backward (Megatron, Shoeybi et al.
    # 2019, Fig. 4), or with sequence parallel 2 all-gathers + 2 reduce-scatters each way
    # (Korthikanti et al. 2022, Sec. 4.2.2): the same volume.
    act = (meas.comm_elem_bytes if meas is not None else BF16) * b * s * model.hidden
    if t > 1:
        one = (comm.all_gather(act, t, tp_link) + comm.reduce_scatter(act, t, tp_link)) if c.sp \
            else comm.all_reduce(act, t, tp_link)
        tp_fwd = 2 * one
    else:
        tp_fwd = 0.0
    tp_layer = 2 * tp_fwd
    tp_rec = tp_fwd if c.recompute == "full" else 0.0

    # pipeline point-to-point: the activation forward and its gradient backward per chunk;
    # Megatron sends 1/t of it per rank (scatter-gather, Narayanan et al. 2021, Sec. 4.1).
    pp_fixed = 2 * v * comm.p2p(act / t, pp_link) if p > 1 else 0.0

    # parameters held by one GPU (tensor-parallel shard)
    layer_params = ((model.attn_matmul_params() + model.mlp_matmul_params()
                     + model.bias_params()) / t + 2 * model.norm_params())
    emb_params = model.vocab_size * model.hidden / t + (
        model.max_seq_len * model.hidden if model.position == "learned" else 0)
    head_params = model.norm_params() + (model.vocab_size * model.hidden / t
                                         if (not model.tied_embeddings or p > 1) else 0)

    act_none = activation_bytes(model, b, s, t, c.sp, "none", flash)
    act_rec = activation_bytes(model, b, s, t, c.sp, c.recompute, flash)
    emb_f, emb_b = embedding_time(model, gpu, b, s, t)
    head_f, head_b = head_time(model, gpu, b, s, t)
    head_act = logits_bytes(model, b, s, t)
    opt_time = lambda params: optimizer_time(gpu, params)  # noqa: E731
    if meas is not None:
        lt = meas.layer_time(lt, b, s, t, c.sp, flash, tp_fwd)
        act_none = meas.activation_bytes(act_none, b, s, t, c.sp, "none", flash)
        act_rec = meas.activation_bytes(act_rec, b, s, t, c.sp, c.recompute, flash)
        emb_f, emb_b = meas.embedding_time((emb_f, emb_b), b, s, t)
        head_f, head_b = meas.head_time((head_f, head_b), b, s, t)
        head_act = meas.logits_bytes(head_act, b, s, t)
        opt_time = meas.optimizer_time

    coeffs = []
    for rank in range(p):
        first, last = rank == 0, rank == p - 1
        fixed_params = (emb_params if first else 0.0) + (head_params if last else 0.0)
        compute_fixed = (emb_f + emb_b if first else 0.0) + (head_f + head_b if last else 0.0)
        bwd_fixed = (emb_b if first else 0.0) + (head_b if last else 0.0)
        fwd_fixed = (emb_f if first else 0.0) + (head_f if last else 0.0)

        # data parallel
        grad_bytes_layer = GRAD_REDUCE_BYTES * layer_params
        grad_bytes_fixed = GRAD_REDUCE_BYTES * fixed_params
        w_bytes_layer, w_bytes_fixed = BF16 * layer_params, BF16 * fixed_params
        dp = c.dp
        z_layer = z_fixed = grad_layer = grad_fixed = gather_layer = gather_fixed = 0.0
        if dp > 1:
            ar = lambda x: comm.all_reduce(x, dp, dp_link)
            rs = lambda x: comm.reduce_scatter(x, dp, dp_link)
            ag = lambda x: comm.all_gather(x, dp, dp_link)
            if c.zero == 0:
                grad_layer, grad_fixed = ar(grad_bytes_layer), ar(grad_bytes_fixed)
            elif c.zero == 1:
                grad_layer, grad_fixed = rs(grad_bytes_layer), rs(grad_bytes_fixed)
                gather_layer, gather_fixed = ag(w_bytes_layer), ag(w_bytes_fixed)
            elif c.zero == 2:
                # gradients reduce-scattered every micro-batch (sharded gradients cannot
                # accumulate unsharded); parameters gathered once after the step
                z_layer, z_fixed = rs(grad_bytes_layer), rs(grad_bytes_fixed)
                gather_layer, gather_fixed = ag(w_bytes_layer), ag(w_bytes_fixed)
            else:
                # ZeRO-3: all-gather for forward and again for backward, reduce-scatter grads,
                # every micro-batch (Rajbhandari et al. 2020, Sec. 5.3)
                z_layer = 2 * ag(w_bytes_layer) + rs(grad_bytes_layer)
                z_fixed = 2 * ag(w_bytes_fixed) + rs(grad_bytes_fixed)
        local = lambda x: x / dp if c.zero >= 1 else x
        opt_layer = opt_time(local(layer_params))
        opt_fixed = opt_time(local(fixed_params))

        # memory
        infl = in_flight(c.schedule, p, rank, c.m, v)
        wl, gl, ol = model_state_bytes(layer_params, dp, c.zero, GRAD_REDUCE_BYTES)
        wf, gf, of = model_state_bytes(fixed_params, dp, c.zero, GRAD_REDUCE_BYTES)
        other = DP_BUCKET_BYTES if dp > 1 else 0.0
        if c.zero == 3 and dp > 1:
            # two unsharded layers (the one in use and the prefetched one) and one layer's
            # unsharded gradients before the reduce-scatter
            other += 2 * BF16 * layer_params + GRAD_REDUCE_BYTES * layer_params
        # working memory of the layer being computed: a recomputed layer re-materialises its
        # full activations in backward; in any case one layer's worth is live.
        other += act_none
        fixed_act = 0.0
        if last:
            fixed_act += head_act
        if first:
            fixed_act += BF16 * b * s * model.hidden * infl   # embedding output
        coeffs.append(StageCoeffs(
            rank=rank,
            compute_fixed=compute_fixed,
            compute_layer=lt.fwd + lt.bwd,
            compute_rec=lt.recompute(c.recompute),
            tp_layer=tp_layer, tp_rec=tp_rec, pp_fixed=pp_fixed,
            z_layer=z_layer, z_fixed=z_fixed,
            grad_layer=grad_layer, grad_fixed=grad_fixed,
            bwd_layer=lt.bwd + tp_fwd, bwd_fixed=bwd_fixed,
            gather_layer=gather_layer, gather_fixed=gather_fixed,
            fwd_layer=lt.fwd + tp_fwd, fwd_fixed=fwd_fixed,
            opt_layer=opt_layer, opt_fixed=opt_fixed,
            mem_fixed={"params": wf, "grads": gf, "optimizer": of, "activations": fixed_act,
                       "other": other},
            mem_layer={"params": wl, "grads": gl, "optimizer": ol,
                       "activations": act_none * infl},
            mem_rec=(act_none - act_rec) * infl,
            overlap_slowdown=gpu.overlap_slowdown,
        ))
    return coeffs


def model_flops_per_step(model: Model, seq_len: int, global_batch: int) -> float:
    """Model FLOPs of one step (no recompute), counted as Megatron-LM counts them:
    6 x matmul parameters x tokens + non-causal attention 12*B*s^2*h per layer; for GPT this is
    72*B*s*l*h^2*(1 + s/(6h) + V/(12*h*l)) (Narayanan et al. 2021, Appendix)."""
    tokens = seq_len * global_batch
    matmul = model.num_layers * (model.attn_matmul_params() + model.mlp_matmul_params()) \
        + model.vocab_size * model.hidden
    attn = model.num_layers * 12.0 * global_batch * seq_len ** 2 * model.hidden
    return 6.0 * matmul * tokens + attn


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
    capacity_gib: float

    def overflow_gib(self) -> list:
        return [m["total"] - self.capacity_gib for m in self.stage_memory_gib]

    def to_dict(self) -> dict:
        return {"fits": self.fits, "step_time_s": self.step_time_s,
                "tokens_per_s": self.tokens_per_s, "tflops_per_gpu": self.tflops_per_gpu,
                "mfu": self.mfu, "peak_memory_gib": self.peak_memory_gib,
                "capacity_gib": self.capacity_gib,
                "time_breakdown_s": self.time_breakdown_s}


def evaluate(model: Model, cluster: Cluster, c: Candidate, layers: list, recompute: list,
             coeffs: list | None = None) -> Estimate:
    """Estimate of a full plan: per-rank layer counts `layers` and recomputed counts."""
    coeffs = coeffs or stage_coefficients(model, cluster, c)
    times = [k.time(n, r) for k, n, r in zip(coeffs, layers, recompute)]
    pipe, bubble = pipeline_time(times, c.m, c.vpp)
    tails = [k.tail(n) for k, n in zip(coeffs, layers)]
    step = pipe + max(tails)
    crit = max(range(len(times)), key=lambda i: times[i])
    k, n, r = coeffs[crit], layers[crit], recompute[crit]
    tk = max(range(len(tails)), key=lambda i: tails[i])
    kt, nt = coeffs[tk], layers[tk]
    opt = kt.opt_fixed + nt * kt.opt_layer
    breakdown = {
        "compute": c.m * (k.compute_fixed + n * k.compute_layer + r * k.compute_rec),
        "tp_comm": c.m * (n * k.tp_layer + r * k.tp_rec),
        "pp_comm": c.m * k.pp_fixed,
        "dp_comm_exposed": c.m * k.zero_exposed(n) + tails[tk] - opt,
        "bubble": bubble,
        "optimizer": opt,
    }
    mems = [{key: val / GIB for key, val in kk.memory(nn, rr).items()}
            for kk, nn, rr in zip(coeffs, layers, recompute)]
    cap = capacity_bytes(cluster) / GIB
    peak = max(mm["total"] for mm in mems)
    tokens = c.seq_len * c.global_batch
    flops = model_flops_per_step(model, c.seq_len, c.global_batch)
    tflops = flops / step / c.num_gpus / 1e12
    return Estimate(fits=peak <= cap, step_time_s=step, tokens_per_s=tokens / step,
                    tflops_per_gpu=tflops, mfu=tflops / cluster.gpu.peak_tflops,
                    peak_memory_gib=peak, time_breakdown_s=breakdown,
                    stage_memory_gib=mems, stage_time_s=times, capacity_gib=cap)
