"""Collective and point-to-point bandwidth per group shape, nccl-tests conventions.

For S bytes (the full buffer: the all-reduce buffer, the gathered output of an all-gather, the
input of a reduce-scatter, one rank's all-to-all buffer, the message of a send/recv) taking t
seconds over n ranks:  algbw = S / t  and  busbw = algbw * factor, factor = 2(n-1)/n for
all-reduce, (n-1)/n for all-gather, reduce-scatter and all-to-all, 1 for send/recv
(NVIDIA nccl-tests, doc/PERFORMANCE.md). Each op is fitted to t = alpha + S * factor / busbw.

Group classes: "intra" (ranks of one node, tp-like: consecutive ranks) and "inter" (one rank per
node, stride = processes per node), the two link classes of `planner.cost.comm.group_link`.
Every rank joins every measurement (ranks outside the group wait at the barrier), so the
figures are those of all groups of the shape running at once, as in training.
"""
from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from profiler.timing import summarize

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


def bus_factor(op: str, n: int) -> float:
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op == "send_recv":
        return 1.0
    return (n - 1) / n


def sizes(max_bytes: int, min_bytes: int = 1024, step: int = 4) -> list:
    out, s = [], min_bytes
    while s <= max_bytes:
        out.append(s)
        s *= step
    return out


def _ag(out, inp, group):
    f = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return f(out, inp, group=group)


def _rs(out, inp, group):
    f = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return f(out, inp, group=group)


def _runner(op, nbytes, group, ranks, me, device):
    """A closure doing one `op` of `nbytes` on this rank, or None if this rank sits it out."""
    n = len(ranks)
    if me not in ranks:
        return None
    elems = max(n, nbytes // 4 // n * n)
    if op == "all_reduce":
        x = torch.ones(elems, device=device)
        return lambda: dist.all_reduce(x, group=group)
    if op == "all_gather":
        x = torch.ones(elems // n, device=device)
        y = torch.empty(elems, device=device)
        return lambda: _ag(y, x, group)
    if op == "reduce_scatter":
        x = torch.ones(elems, device=device)
        y = torch.empty(elems // n, device=device)
        return lambda: _rs(y, x, group)
    if op == "all_to_all":
        x = torch.ones(elems, device=device)
        y = torch.empty(elems, device=device)
        return lambda: dist.all_to_all_single(y, x, group=group)
    if op == "send_recv":
        # pairs (0,1), (2,3), ... of the group's ranks: both directions at once, as a pipeline
        # exchanges activations and gradients
        i = ranks.index(me)
        if n % 2 or i // 2 * 2 + 1 >= n:
            return None
        peer = ranks[i ^ 1]
        x = torch.ones(max(1, nbytes // 4), device=device)
        y = torch.empty_like(x)

        def sr():
            ops = [dist.P2POp(dist.isend, x, peer), dist.P2POp(dist.irecv, y, peer)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
        return sr
    raise ValueError(op)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure_group(op, ranks, group, me, device, byte_sizes, budget_s, max_repeats):
    """Points {bytes, time_s, algbw_gbps, busbw_gbps} of `op` over `ranks` (on rank 0's view:
    the slowest rank's median is taken by the caller)."""
    n = len(ranks)
    pts = []
    for nbytes in byte_sizes:
        fn = None
        err = None
        try:
            fn = _runner(op, nbytes, group, ranks, me, device)
        except RuntimeError as e:      # out of memory for the largest sizes
            err = str(e).splitlines()[0]
        ok = torch.tensor([0 if err else 1], dtype=torch.int32, device=device)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        if not ok.item():
            break
        # nccl-tests style: warm up, then trials of k back-to-back ops (k from the warm-up,
        # rank 0 decides), each trial's time / k is one sample
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(2):
            if fn is not None:
                fn()
        _sync(device)
        warm = (time.perf_counter() - t0) / 2
        k = max(1, min(50, int(budget_s / 5 / max(warm, 1e-6))))
        trials = max(3, min(max_repeats, int(budget_s / max(warm * k, 1e-6))))
        kt = torch.tensor([k, trials], dtype=torch.int32, device=device)
        dist.broadcast(kt, src=0)
        k, trials = (int(v) for v in kt.tolist())
        samples = []
        for _ in range(trials):
            dist.barrier()
            _sync(device)
            t0 = time.perf_counter()
            if fn is not None:
                for _ in range(k):
                    fn()
                _sync(device)
            samples.append((time.perf_counter() - t0) / k)
        if fn is None:
            continue
        s = summarize(samples)
        t = s["median"]
        algbw = nbytes / t / 1e9
        pts.append({"bytes": nbytes, "time_s": s, "algbw_gbps": algbw,
                    "busbw_gbps": algbw * bus_factor(op, n)})
    return pts


def fit_alpha_beta(points, op, n) -> dict | None:
    """t = alpha + S * factor / busbw, least squares weighted by 1/t (relative error)."""
    if len(points) < 2:
        return None
    f = bus_factor(op, n)
    xs = [p["bytes"] * f for p in points]
    ts = [p["time_s"]["median"] for p in points]
    w = [1.0 / t ** 2 for t in ts]
    sw = sum(w)
    sx = sum(wi * x for wi, x in zip(w, xs))
    sy = sum(wi * t for wi, t in zip(w, ts))
    sxx = sum(wi * x * x for wi, x in zip(w, xs))
    sxy = sum(wi * x * t for wi, x, t in zip(w, xs, ts))
    den = sw * sxx - sx * sx
    if den <= 0:
        return None
    inv_bw = (sw * sxy - sx * sy) / den
    alpha = (sy - inv_bw * sx) / sw
    if inv_bw <= 0:      # latency-bound everywhere: bandwidth from the largest message
        alpha = min(ts)
        inv_bw = max(ts[-1] - alpha, 1e-3 * ts[-1]) / xs[-1]
    elif alpha < 0:      # refit through the origin
        alpha = 0.0
        inv_bw = sum(wi * x * t for wi, x, t in zip(w, xs, ts)) / sum(wi * x * x for wi, x in zip(w, xs))
    return {"alpha_s": alpha, "busbw_gbps": 1.0 / inv_bw / 1e9,
            "max_rel_error": max(abs(alpha + x * inv_bw - t) / t for x, t in zip(xs, ts))}


def group_shapes(world: int, local: int) -> list:
    """(class, ranks of the group containing rank 0's layout, all groups) to measure."""
    shapes = []
    size = 2
    while size <= local:
        if local % size == 0:
            groups = [list(range(g, g + size)) for g in range(0, world, size)]
            shapes.append(("intra", size, 1, groups))
        size *= 2
    nodes = world // local
    if nodes > 1:
        size = 2
        while size <= nodes:
            if nodes % size == 0:
                # one rank per node, `size` nodes: the dp / pp group shape across nodes
                groups = []
                for base in range(0, world, size * local):
                    for r in range(local):
                        groups.append([base + r + j * local for j in range(size)])
                shapes.append(("inter", size, local, groups))
            size *= 2
    return shapes


def measure_links(device, quick: bool, log) -> dict:
    """Every op for every group shape; only rank 0's result is meaningful (others return {})."""
    world, me = dist.get_world_size(), dist.get_rank()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    max_bytes = (4 << 20) if quick else (256 << 20)
    if device.type == "cuda" and quick:
        max_bytes = 64 << 20
    byte_sizes = sizes(max_bytes)
    budget = 0.15 if quick else 1.0
    reps = 5 if quick else 20
    out = {}
    for cls, size, stride, groups in group_shapes(world, local):
        mine = None
        handles = []
        for g in groups:      # every rank creates every group, in the same order
            pg = dist.new_group(ranks=g)
            handles.append(pg)
            if me in g:
                mine = (g, pg)
        ranks, pg = mine if mine else (None, None)
        ops = {}
        for op in OPS:
            if ranks is None:
                pts = measure_group(op, [], None, me, device, byte_sizes, budget, reps)
            else:
                pts = measure_group(op, ranks, pg, me, device, byte_sizes, budget, reps)
            # the slowest group / rank governs: gather every rank's medians
            gathered = [None] * world
            dist.all_gather_object(gathered, pts)
            merged = _slowest(gathered)
            fit = fit_alpha_beta(merged, op, size)
            ops[op] = {"points": merged, "fit": fit}
            if log and fit:
                log(f"  {cls} n={size} {op:<14} alpha {fit['alpha_s'] * 1e6:8.1f} us  "
                    f"busbw {fit['busbw_gbps']:7.2f} GB/s  "
                    f"(max {max(p['busbw_gbps'] for p in merged):.2f} GB/s)")
        out.setdefault(cls, {})[str(size)] = {"size": size, "stride": stride, "ops": ops}
    return out


def _slowest(per_rank: list) -> list:
    by_size = {}
    for pts in per_rank:
        for p in pts or []:
            cur = by_size.get(p["bytes"])
            if cur is None or p["time_s"]["median"] > cur["time_s"]["median"]:
                by_size[p["bytes"]] = p
    return [by_size[k] for k in sorted(by_size)]


def measure_overlap(device, layer_fn, busbw_gbps: float | None, repeats: int) -> dict | None:
    """Compute beside communication: a layer's forward+backward alone, an all-reduce over all
    ranks alone (sized to take about as long, from the measured bus bandwidth), and both at once
    (the collective issued asynchronously first, as DDP issues gradient buckets).

    compute_slowdown = compute time beside the collective / alone; overlap_efficiency = the
    share of the shorter of the two that running them together hides:
    (t_compute + t_comm - t_both) / min(t_compute, t_comm), clamped to [0, 1]; overlap_slowdown
    = (t_compute_beside - t_compute) / (time they ran side by side), the planner's
    Gpu.overlap_slowdown (extra compute time per second of collective running beside it)."""
    world = dist.get_world_size()
    if world < 2:
        return None
    # compute alone first, to size the collective
    ts = []
    for _ in range(3):
        dist.barrier()
        t0 = time.perf_counter()
        layer_fn()
        _sync(device)
        ts.append(time.perf_counter() - t0)
    t_c0 = torch.tensor([summarize(ts)["median"]], dtype=torch.float64, device=device)
    dist.all_reduce(t_c0, op=dist.ReduceOp.MAX)
    bw = (busbw_gbps or 1.0) * 1e9 / bus_factor("all_reduce", world)
    nbytes = int(min(max(t_c0.item() * bw, 1 << 20), 256 << 20)) // 4 * 4
    x = torch.ones(nbytes // 4, device=device)

    def comm():
        dist.all_reduce(x)
        _sync(device)

    def both():
        w = dist.all_reduce(x, async_op=True)
        t0 = time.perf_counter()
        layer_fn()
        _sync(device)
        tc = time.perf_counter() - t0
        w.wait()
        _sync(device)
        return tc

    tc, tm, tb, tcb = [], [], [], []
    for i in range(repeats + 1):
        dist.barrier()
        t0 = time.perf_counter()
        layer_fn()
        _sync(device)
        a = time.perf_counter() - t0
        dist.barrier()
        t0 = time.perf_counter()
        comm()
        b = time.perf_counter() - t0
        dist.barrier()
        t0 = time.perf_counter()
        c_in = both()
        c = time.perf_counter() - t0
        if i:
            tc.append(a); tm.append(b); tb.append(c); tcb.append(c_in)
    med = lambda xs: summarize(xs)["median"]   # noqa: E731
    vals = torch.tensor([med(tc), med(tm), med(tb), med(tcb)], dtype=torch.float64,
                        device=device)
    dist.all_reduce(vals, op=dist.ReduceOp.MAX)
    t_c, t_m, t_b, t_cb = vals.tolist()
    eff = (t_c + t_m - t_b) / min(t_c, t_m) if min(t_c, t_m) > 0 else 0.0
    side = min(t_m, t_cb)
    slow = (t_cb - t_c) / side if side > 0 else 0.0
    return {"bytes": nbytes, "compute_s": t_c, "comm_s": t_m, "both_s": t_b,
            "compute_beside_comm_s": t_cb, "compute_slowdown": t_cb / t_c if t_c else 1.0,
            "overlap_efficiency": min(1.0, max(0.0, eff)),
            "overlap_slowdown": min(1.0, max(0.0, slow)), "repeats": repeats}
