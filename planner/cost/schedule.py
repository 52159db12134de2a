"""Pipeline schedules: step time from per-stage times, and micro-batches in flight per stage.

Step time. With stage times T_s for one micro-batch (forward + backward, all of a rank's
chunks), m micro-batches and v chunks per rank:

    step = m * max(T) + (sum(T) - max(T)) / v

For equal stages this is (m + (p - 1) / v) * T: the bubble fraction (p - 1) / (v * m) of
Narayanan et al. 2021 (Sec. 2.2, eqs. for 1F1B and interleaved). For v = 1 it is the usual
"sum of stage times plus (m - 1) times the slowest" of an uneven 1F1B/GPipe pipeline.

The zero-bubble schedules (interleaved-zb, zbv, dualpipev: planner.vocab) are priced by
running their own action order (below): no closed formula. Their parameters: DeepSeek's
bidirectional DualPipe keeps two copies of the model (2x parameters per device, DualPipe
README "Pipeline Bubbles and Memory Usage Comparison"); no engine planned for here runs it
(torch ships DualPipeV only). DualPipeV and ZB-V cut it in half: 2 pp stages on pp devices, each
rank holding two chunks of one model copy, so a rank's parameters are those of its layers, as
under any other split (the table's "2x" is per stage of the 2 pp). Their activations are
counted from a chunk-micro-batch's F to its W (zero_bubble_in_flight): measured equal on the
runtime (tests/test_schedules_runtime.py) and the table's PP (ZB1P) and PP + 1 (DualPipeV).
"""
from __future__ import annotations

from functools import lru_cache

from planner.vocab import V_SCHEDULES, ZERO_BUBBLE_SCHEDULES


def pipeline_time(stage_times, m: int, v: int = 1, schedule: str = "", fwd=None,
                  wgrad=None) -> tuple:
    """(step seconds, bubble seconds) for one pass over m micro-batches. A zero-bubble
    schedule (planner.vocab.ZERO_BUBBLE_SCHEDULES) is its own action order simulated
    (zero_bubble_time), with each rank's forward `fwd` and weight-gradient `wgrad` seconds."""
    if schedule in ZERO_BUBBLE_SCHEDULES and len(stage_times) > 1:
        p = len(stage_times)
        return zero_bubble_time(schedule, stage_times, fwd or [0.0] * p, wgrad or [0.0] * p,
                                m, v)
    tmax = max(stage_times)
    bubble = (sum(stage_times) - tmax) / v
    return m * tmax + bubble, bubble


def in_flight(schedule: str, p: int, rank: int, m: int, v: int = 1) -> float:
    """Micro-batches whose activations pipeline rank `rank` holds at its peak.

    In units of one micro-batch through all of the rank's layers.
    - gpipe: all m forwards before any backward.
    - 1f1b: p - rank warm-up forwards (Narayanan et al. 2021, Sec. 2.2.1), at most m.
    - interleaved: Megatron-LM's warm-up count (p - rank - 1) * 2 + (v - 1) * p, plus the one
      in steady state, in chunk-micro-batches, each 1/v of the rank's layers
      (megatron/core/pipeline_parallel/schedules.py, forward_backward_pipelining_with_interleaving).
    Megatron-Core's EP all-to-all overlap (combined 1F1B) holds what the same schedule holds
    without it, so it takes no part here. Its combined step runs a micro-batch's forward beside another's
    backward layer by layer, first forward layer with last backward layer, each backward
    layer's state released after it and the previous logits' backward before the new ones
    (megatron/core/pipeline_parallel/combined_1f1b.py combined_1f1b_schedule_for_no_pipelining,
    combined_forward_backward_step; models/common/model_chunk_schedule_plan.py
    TransformerModelChunkSchedulePlan.run: get_layer(i) with pop_layer()), so a step holds the
    micro-batches it started with and the layer in hand, the working layer the stage's memory
    counts apart. Without pipelining that is one; under interleaving the warm-up gains one
    forward (schedules.py: "if overlap_moe_expert_parallel_comm: num_warmup_microbatches += 1"),
    the one plain 1F1B's steady state runs before each backward, so the peak is the same.
    """
    if p == 1:
        return float(min(1, m))
    if schedule == "gpipe":
        return float(m)
    if schedule == "1f1b":
        return float(min(p - rank, m))
    if schedule == "interleaved":
        chunks = min((p - rank - 1) * 2 + (v - 1) * p + 1, m * v)
        return chunks / v
    if schedule in ZERO_BUBBLE_SCHEDULES:
        return zero_bubble_in_flight(schedule, p, rank, m, v)
    raise ValueError(schedule)


# ---- zero-bubble schedules: their own action orders, simulated ---------------------------
#
# torch.distributed.pipelining generates, for every pipeline rank, the list of actions it runs
# (`pipeline_order`): F (forward of a stage's micro-batch), I (its input-gradient backward,
# the paper's B), W (its weight-gradient backward) and B (the full backward, I then W).
# `rank_orders` builds the same lists as torch does (torch/distributed/pipelining/
# schedules.py: ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble, ScheduleDualPipeV;
# tests/test_schedules_torch.py checks them against torch's own), without importing torch,
# and `simulate` runs them with per-action durations: each rank runs its actions in order,
# an action starting when the rank is free and its inputs exist (F after the previous
# stage's F; I / B after this stage's F and the next stage's I / B; W after this stage's I).

F_, I_, W_, B_ = "F", "I", "W", "B"


def stage_rank(schedule: str, p: int, stage: int) -> int:
    """Pipeline rank that runs virtual stage `stage`: looped (stage % p), or the V of
    zbv / dualpipev (torch's generate_stage_to_rank_mapping style "v": rank r holds stages
    r and 2p - 1 - r)."""
    if schedule in V_SCHEDULES:
        return stage if stage < p else 2 * p - 1 - stage
    return stage % p


def stage_buffer_bytes(schedule: str, p: int, rank: int, m: int, v: int, in_flight_mb: float,
                       boundary_bytes: float, input_grads_kept: bool = False) -> float:
    """What torch.distributed.pipelining's stages on pipeline rank `rank` hold beside the
    activations their layers save (planner.engines.spec pipeline_recv_buffers): for each of
    the rank's v stages, one receive buffer per micro-batch for the stage input (but on the
    first stage) and for the gradient of its output (but on the last), `boundary_bytes` each
    (torch/distributed/pipelining/stage.py: args_recv_info and grad_recv_info, one entry per
    micro-batch, each with its own buffer); and the stage outputs kept for backward (fwd_cache)
    of the micro-batches in flight. A received input of a micro-batch in flight is its first
    layer's saved input, counted with the activations; on a stage that both receives and sends
    that one and the held output even out, so what remains is the first stage's outputs
    (counted for all `in_flight_mb` micro-batches of the rank, `in_flight` units, over all v
    of its stages: at most that) and the last stage's in-flight inputs (not taken off).
    `input_grads_kept` (planner.engines.spec pipeline_keeps_input_grads), and always under the
    zero-bubble schedules, whose split backward leaves each received input's gradient on its
    buffer (torch/distributed/pipelining/_backward.py stage_backward_input sets `inp.grad`,
    cleared by the next step's clear_runtime_states only): one more per micro-batch and stage
    but the first (their sum at the end of the step, taken with the activations' peak: at
    most; torch's dualpipev releases some, and zbv's two stages of its last rank share one)."""
    if p == 1:
        return 0.0
    first, last = rank == 0, rank == head_rank(schedule, p)
    grads_kept = input_grads_kept or schedule in ZERO_BUBBLE_SCHEDULES
    buffers = (v - first) * m * (2 if grads_kept else 1) + (v - last) * m
    return boundary_bytes * (buffers + (in_flight_mb * v if first else 0.0))


def head_rank(schedule: str, p: int) -> int:
    """Pipeline rank that holds the last stage (the LM head): rank 0 under the V layouts."""
    return 0 if schedule in V_SCHEDULES and p > 1 else p - 1


def _zb_warmup(rank: int, v: int, per_round: int, p: int, m: int) -> int:
    # torch _get_warmup_ops with multiply_factor=1 (ScheduleInterleavedZeroBubble)
    return min((v - 1) * per_round + (p - 1 - rank), m * v)


def _interleaved_zb(p: int, m: int, v: int, rank: int) -> list:
    """torch ScheduleInterleavedZeroBubble._calculate_single_rank_operations
    (_get_1f1b_rank_ops with enable_zero_bubble), before its bubbles are added."""
    rounds = max(1, m // p)
    per_round = m // rounds
    warm = _zb_warmup(rank, v, per_round, p, m)
    total = v * m
    fwd_bwd = total - warm
    cooldown = total - fwd_bwd

    def fwd_stage(step):
        return ((step // per_round) % v) * p + rank

    def bwd_stage(step):
        return (v - 1 - ((step - warm) // per_round) % v) * p + rank

    fmb, bmb, wmb = {}, {}, {}
    ops: list = []
    bwd_ids: list = []
    n_w = 0

    def nxt(d, s):
        d[s] = d.get(s, 0) + 1
        return d[s] - 1

    def weight():
        nonlocal n_w
        s = bwd_stage(bwd_ids[n_w])
        ops.append((s, W_, nxt(wmb, s)))
        n_w += 1

    for op in range(warm + fwd_bwd + cooldown):
        if op < warm:
            s = fwd_stage(op)
            ops.append((s, F_, nxt(fmb, s)))
        elif op < warm + fwd_bwd:
            s = fwd_stage(op)
            ops.append((s, F_, nxt(fmb, s)))
            s = bwd_stage(op)
            ops.append((s, I_, nxt(bmb, s)))
            bwd_ids.append(op)
            if op - warm >= rank:
                weight()
        else:
            s = bwd_stage(op)
            ops.append((s, I_, nxt(bmb, s)))
            bwd_ids.append(op)
            if op - warm >= rank:
                weight()
    while n_w < len(bwd_ids):
        weight()
    return ops


def _zbv(p: int, m: int, rank: int) -> list:
    """torch ScheduleZBVZeroBubble._calculate_single_rank_operations (ZB-V, Qi et al. 2024
    Sec. 6), with the micro-batches beyond m dropped as torch drops them."""
    n = max(2 * p - 1, m)
    s0, s1 = rank, 2 * p - 1 - rank
    ops: list = []
    f0 = f1 = b0 = b1 = 0
    for _ in range(2 * (p - rank) - 1):
        ops.append((s0, F_, f0)); f0 += 1
    for _ in range(rank):
        ops.append((s1, F_, f1)); f1 += 1
        ops.append((s0, F_, f0)); f0 += 1
    for _ in range(p - rank):
        ops.append((s1, F_, f1)); f1 += 1
        ops += [(s1, I_, b1), (s1, W_, b1)]; b1 += 1
    while f1 < f0 or f0 < n:
        if f0 < n:
            ops.append((s0, F_, f0)); f0 += 1
        ops += [(s0, I_, b0), (s0, W_, b0)]; b0 += 1
        ops.append((s1, F_, f1)); f1 += 1
        ops += [(s1, I_, b1), (s1, W_, b1)]; b1 += 1
    w0, w1 = b0, b1
    for _ in range(rank):
        ops.append((s0, I_, b0)); b0 += 1
        ops.append((s1, I_, b1)); b1 += 1
    for _ in range(p - rank):
        ops.append((s0, I_, b0)); b0 += 1
        ops.append((s0, W_, w0)); w0 += 1
    while w1 < b1:
        ops.append((s1, W_, w1)); w1 += 1
    while w0 < b0:
        ops.append((s0, W_, w0)); w0 += 1
    return [a for a in ops if a[2] < m]


def _dualpipev(p: int, m: int, rank: int) -> list:
    """torch ScheduleDualPipeV._calculate_single_rank_operations (after
    github.com/deepseek-ai/DualPipe dualpipev.py). Its overlapped forward+backward pairs
    (OVERLAP_F_B) appear as their two actions, F then B: torch's runtime performs the
    sub-actions one after the other (_PipelineScheduleRuntime._step_microbatches) unless a
    custom overlap function is registered."""
    s0, s1 = rank, 2 * p - 1 - rank
    cnt: dict = {}
    wq: list = []
    ops: list = []

    def add(stage, kind):
        key = (stage, I_ if kind == B_ else kind)
        mb = cnt.get(key, 0)
        ops.append((stage, kind, mb))
        if kind == B_:
            cnt[(stage, I_)] = cnt.get((stage, I_), 0) + 1
            cnt[(stage, W_)] = cnt.get((stage, W_), 0) + 1
        else:
            if kind == I_:
                wq.append((stage, mb))
            cnt[key] = mb + 1

    def overlap(fs, bs):
        fmb = cnt.get((fs, F_), 0)
        bmb = cnt.get((bs, I_), 0)
        ops.append((fs, F_, fmb))
        ops.append((bs, B_, bmb))
        cnt[(fs, F_)] = fmb + 1
        cnt[(bs, I_)] = bmb + 1
        cnt[(bs, W_)] = cnt.get((bs, W_), 0) + 1

    def weight():
        if wq:
            st, mb = wq.pop(0)
            ops.append((st, W_, mb))

    for _ in range((p - rank - 1) * 2):
        add(s0, F_)
    for _ in range(rank + 1):
        add(s0, F_); add(s1, F_)
    for _ in range(p - rank - 1):
        add(s1, I_); weight(); add(s1, F_)
    for i in range(m - 2 * p + rank + 1):
        if i == 0 and rank == p - 1:
            add(s0, F_); add(s1, B_)
        else:
            overlap(s0, s1)
        overlap(s1, s0)
    for _ in range(p - rank - 1):
        add(s1, B_); overlap(s1, s0)
    zb = False
    steps = rank + 1
    for i in range(steps):
        if i == steps // 2 and rank % 2 == 1:
            zb = True
        add(s1, I_ if zb else B_)
        if i == steps // 2 and rank % 2 == 0:
            zb = True
        add(s0, I_ if zb else B_)
    for _ in range(p - rank - 1):
        weight(); add(s0, I_ if zb else B_)
    for _ in range(rank + 1):
        weight()
    return ops


def schedule_problem(schedule: str, p: int, m: int, v: int) -> str:
    """Why torch cannot run `schedule` at pp = p, m micro-batches and v chunks per rank
    ("" when it can): torch/distributed/pipelining/schedules.py's own checks."""
    if schedule in V_SCHEDULES:
        if v != 2:
            return f"{schedule} needs exactly 2 model chunks per rank (vpp 2), not {v}"
        if schedule == "dualpipev" and m < 2 * p:
            return (f"dualpipev needs at least as many micro-batches as stages "
                    f"({2 * p}), not {m}")
    if schedule == "interleaved-zb":
        rounds = max(1, m // p)
        if m % rounds:
            return (f"interleaved-zb needs num_microbatches {m} to be a multiple of "
                    f"{rounds} (rounds of pp = {p})")
    return ""


@lru_cache(maxsize=256)
def rank_orders(schedule: str, p: int, m: int, v: int) -> tuple:
    """Per pipeline rank, its actions in the order torch runs them: (stage, kind, mb)."""
    why = schedule_problem(schedule, p, m, v)
    if why:
        raise ValueError(why)
    if schedule == "interleaved-zb":
        return tuple(tuple(_interleaved_zb(p, m, v, r)) for r in range(p))
    if schedule == "zbv":
        return tuple(tuple(_zbv(p, m, r)) for r in range(p))
    if schedule == "dualpipev":
        return tuple(tuple(_dualpipev(p, m, r)) for r in range(p))
    raise ValueError(schedule)


@lru_cache(maxsize=256)
def _run_order(schedule: str, orders) -> tuple:
    """`orders` (rank_orders) in an order simulate can run them: each action after the actions
    it waits on (F on the previous stage's F, I or B on its own F and the next stage's input
    gradient, W on its own input gradient), ranks visited round-robin. Per action: (rank,
    action, index of its duration in simulate's (f, i, w, i + w, 0.0) when stage 0's backward
    runs in W, the same when every action is as long as its kind, [run-order indices of the
    actions it waits on]). It depends on the orders alone, so the search's many pricings of
    one schedule share it."""
    p = len(orders)
    n_stages = max(a[0] for o in orders for a in o) + 1
    done: dict = {}
    pos = [0] * p
    seq = []
    left = sum(len(o) for o in orders)
    while left:
        moved = False
        for r in range(p):
            o = orders[r]
            while pos[r] < len(o):
                s, kind, mb = o[pos[r]]
                if kind == F_:
                    deps = [(s - 1, F_, mb)] if s > 0 else []
                elif kind in (I_, B_):
                    deps = [(s, F_, mb)]
                    if s < n_stages - 1:
                        deps.append((s + 1, "grad", mb))
                else:
                    deps = [(s, "grad", mb)]
                if any(d not in done for d in deps):
                    break
                as_kind = {F_: 0, I_: 1, W_: 2, B_: 3}[kind]
                # stage 0 has no input gradient to send: its I is empty, its W the whole B
                in_w = {I_: 4, W_: 3}.get(kind, as_kind) if s == 0 else as_kind
                seq.append((r, o[pos[r]], in_w, as_kind, [done[d] for d in deps]))
                # the input gradient exists once I (or B) has run; W needs it
                done[(s, "grad" if kind in (I_, B_) else kind, mb)] = len(seq) - 1
                pos[r] += 1
                left -= 1
                moved = True
        if not moved:
            raise RuntimeError(f"schedule {schedule} deadlocked")
    return tuple(seq)


def simulate(schedule: str, orders, durations, first_stage_in_w: bool = True) -> tuple:
    """Run `orders` (rank_orders) with `durations[rank] = (f, i, w)`, the seconds of one
    chunk-micro-batch's forward, input-gradient and weight-gradient backward on that rank (a
    full backward B takes i + w). `first_stage_in_w`: stage 0 has no input gradient to send,
    so torch skips its I and runs its whole backward in W (torch/distributed/pipelining/
    stage.py backward_one_chunk, "Skip the backward for the first stage"); False: every action
    as long as its kind (the unit-time comparison with torch's spacing).
    Returns (makespan, per rank [(start, end, action)])."""
    seq = _run_order(schedule, tuple(tuple(o) for o in orders))
    starts = [0.0] * len(seq)
    makespan, ends = _run(seq, len(orders), durations, first_stage_in_w, starts)
    out = [[] for _ in orders]
    for (r, action, *_), start, end in zip(seq, starts, ends):
        out[r].append((start, end, action))
    return makespan, out


def _run(seq, p: int, durations, first_stage_in_w: bool, starts=None) -> tuple:
    """(makespan, each action's end) of the run order `seq` (_run_order) on `p` ranks: an
    action starts when its rank is free and the actions it waits on have ended; `starts`, if
    given, receives each action's start."""
    lengths = [(f, i, w, i + w, 0.0) for f, i, w in durations]
    free = [0.0] * p
    ends = [0.0] * len(seq)
    n = 0
    for r, _, in_w, as_kind, deps in seq:
        start = free[r]
        for d in deps:
            if ends[d] > start:
                start = ends[d]
        ends[n] = free[r] = start + lengths[r][in_w if first_stage_in_w else as_kind]
        if starts is not None:
            starts[n] = start
        n += 1
    return max(free), ends


def zero_bubble_time(schedule: str, stage_times, fwd, wgrad, m: int, v: int) -> tuple:
    """(step seconds, bubble seconds) of a zero-bubble schedule: its own action order
    simulated. Per rank, for one micro-batch through all its chunks: `stage_times` the whole
    time, `fwd` its forward, `wgrad` its weight-gradient GEMMs (weight_grad_time); the input
    gradient is the rest (the backward's other GEMMs, attention, element-wise, recompute and
    communication). Each chunk takes 1/v of its rank's. The bubble is what the makespan
    exceeds the busiest rank's work by."""
    durs = tuple((f / v, max(0.0, t - f - w) / v, w / v)
                 for t, f, w in zip(stage_times, fwd, wgrad))
    makespan = _makespan(schedule, m, v, durs)
    busiest = m * max(stage_times)
    return makespan, max(0.0, makespan - busiest)


@lru_cache(maxsize=4096)
def _makespan(schedule: str, m: int, v: int, durs: tuple) -> float:
    """simulate's makespan, remembered: a search prices the same stage times many times over
    (a llama405b torchtitan search: 5758 pricings, 2128 distinct)."""
    seq = _run_order(schedule, rank_orders(schedule, len(durs), m, v))
    return _run(seq, len(durs), durs, True)[0]


@lru_cache(maxsize=4096)
def zero_bubble_in_flight(schedule: str, p: int, rank: int, m: int, v: int) -> float:
    """Micro-batches (through all of a rank's layers) whose tensors rank `rank` holds at its
    peak under a zero-bubble schedule, from its own action order: a chunk-micro-batch's
    activations from its F until its W (or full B) ran. Between I and W a layer keeps the
    inputs of its linears and their output gradients (the weight-gradient buffers) rather than
    all it saved: counting the whole micro-batch until W is an upper bound on both (Qi et al.
    2024 Sec. 3: ZB-1P and ZB-V hold 1F1B's p micro-batches, ZB-2P twice)."""
    held = peak = 0
    for _, kind, _ in rank_orders(schedule, p, m, v)[rank]:
        if kind == F_:
            held += 1
            peak = max(peak, held)
        elif kind in (W_, B_):
            held -= 1
    return peak / v


def forward_and_wgrad(coeffs, layers, moe_layers) -> tuple:
    """([forward seconds], [weight-gradient seconds]) per pipeline rank for one micro-batch:
    of planner.cost.stage StageCoeffs `coeffs` with `layers` layers per rank, `moe_layers` of
    them MoE (their forward added; their W counted as a dense layer's, the smaller)."""
    fwd = [k.fwd_fixed + n * k.fwd_layer + (q * k.moe.fwd_layer if k.moe is not None else 0.0)
           for k, n, q in zip(coeffs, layers, moe_layers)]
    return fwd, [n * k.wgrad_layer for k, n in zip(coeffs, layers)]


def weight_grad_time(lt) -> float:
    """Seconds of a layer's backward that are its weight gradients (W): one of the two
    backward GEMMs of every linear, dW = X^T dY, as long as the forward GEMM (Qi et al. 2024,
    Sec. 2, Table 1: F, B and W each the forward's matmul FLOPs for the linears). The
    attention core has no weights, element-wise backward and recompute run in B.
    `lt` is a planner.cost.compute.LayerTime; a measured profile keeps the modelled share."""
    from planner.cost.compute import GEMM_BWD_FACTOR
    w = (GEMM_BWD_FACTOR - 1.0) * lt.gemm_fwd
    if lt.measured is None:
        return w
    import dataclasses
    modelled = dataclasses.replace(lt, measured=None).bwd
    return lt.bwd * (w / modelled) if modelled > 0 else 0.0
