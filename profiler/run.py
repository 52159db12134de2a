"""Orchestration: every rank measures at once; rank 0 gathers, fits and writes the profile."""
from __future__ import annotations

import datetime
import os
import platform
import socket
import sys
import time

import torch
import torch.distributed as dist

from planner.profile import FORMAT, VERSION, catalog_gpu_name, fit_line
from planner.specs import Model
from profiler import compute as C
from profiler import links as L
from profiler import timing as T


def _device():
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local), "nccl"
    return torch.device("cpu"), "gloo"


def init_distributed():
    device, backend = _device()
    if not dist.is_initialized():
        if "RANK" not in os.environ:        # plain `python -m profiler`: a world of one
            import socket as _s
            with _s.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                              MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        kw = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=20), **kw)
    return device, backend


def _slowest_point(points: list) -> dict:
    """Of the same measurement on every rank, the one whose forward+backward median is largest."""
    def key(p):
        return sum(p[k]["median"] for k in ("fwd_s", "bwd_s", "step_s", "time_s") if k in p)
    return max(points, key=key)


def _everywhere(fn, *a, **kw):
    """Run a measurement on every rank at once; every rank gets the slowest rank's result, or
    None when it ran out of memory on any rank (all ranks then skip it together)."""
    dist.barrier()
    try:
        res = fn(*a, **kw)
    except torch.OutOfMemoryError:
        res = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    got = [None] * dist.get_world_size()
    dist.all_gather_object(got, res)
    if any(g is None for g in got):
        return None
    return _slowest_point(got)


def _all(fn, items, notes, what, passes: int = 1):
    """`_everywhere` over argument tuples, in `passes` interleaved passes over all of them (a
    burst of load from other jobs then spreads over every point instead of spoiling a few);
    each point's timings are the samples of all passes. Points that ran out of memory are
    dropped and noted."""
    out = [None] * len(items)
    failed = set()
    for _ in range(passes):
        for i, args in enumerate(items):
            if i in failed:
                continue
            r = _everywhere(fn, *args)
            if r is None:
                failed.add(i)
                notes.append(f"{what} {args[1:3]}: out of memory, skipped")
            elif out[i] is None:
                out[i] = r
            else:
                for k, v in r.items():
                    if isinstance(v, dict) and "samples" in v:
                        out[i][k] = T.merge(out[i][k], v)
    return [r for i, r in enumerate(out) if r is not None and i not in failed]


def _tp_mesh(device, tp: int):
    """The tp sub-mesh of a (rest, tp) mesh over all ranks (tp innermost, as plans lay out)."""
    if tp == 1:
        return None
    from torch.distributed.device_mesh import init_device_mesh
    world = dist.get_world_size()
    mesh = init_device_mesh(device.type, (world // tp, tp), mesh_dim_names=("rest", "tp"))
    return mesh["tp"]


def hardware(device, backend) -> dict:
    world = dist.get_world_size()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    hosts = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    hw = {"device_type": device.type, "world_size": world, "procs_per_node": local,
          "nodes": max(1, world // local), "hosts": sorted(set(hosts)),
          "threads_per_proc": torch.get_num_threads(), "cpu": platform.processor() or
          platform.machine(), "cpu_count": os.cpu_count()}
    if device.type == "cuda":
        prop = torch.cuda.get_device_properties(device)
        hw.update(device_name=prop.name, memory_gib=prop.total_memory / 2 ** 30,
                  sm_count=prop.multi_processor_count)
    else:
        try:
            pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            pages = 0
        hw.update(device_name=f"cpu ({platform.machine()}, {os.cpu_count()} cores)",
                  memory_gib=pages / 2 ** 30 / local if pages else None)
    hw["catalog_gpu"] = catalog_gpu_name(hw["device_name"], device.type)
    return hw


def software(backend) -> dict:
    sw = {"python": platform.python_version(), "torch": torch.__version__, "backend": backend,
          "platform": platform.platform()}
    if torch.cuda.is_available():
        sw["cuda"] = torch.version.cuda
        try:
            sw["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:   # noqa: BLE001 - informational only
            pass
    return sw


def profile_model(spec: Model, seq: int, device, quick: bool, log) -> dict:
    world = dist.get_world_size()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    tps = [t for t in C.divisors(local) if C.is_valid_tp(spec, t)]
    small, s, note = C.scaled_spec(spec, device, seq, max(tps))
    tps = [t for t in tps if C.is_valid_tp(small, t)]
    # full: 3 interleaved passes of 3 repeats (9 samples a point); quick: one pass of 3
    warmup, repeats, passes = (1, 3, 1) if quick else (1, 3, 3)
    budget = 1.0 if quick else 2.0
    mbss = C.default_mbs(quick, device)
    notes = [note] if note else []
    entry = {"model": spec.to_dict(), "profiled_spec": small.to_dict(), "scaled": note is not None,
             "seq_len": s, "requested_seq_len": seq, "tp_degrees": tps,
             "micro_batches": list(mbss), "notes": notes}

    # --- layers --------------------------------------------------------------------------
    points = _all(C.layer_point, [(small, tp, b, s, device, warmup, repeats, budget)
                                  for tp in tps for b in mbss], notes, "layer", passes)
    for p in points:
        log(f"  layer tp={p['tp']} mbs={p['mbs']} seq={s}: fwd {C.ms(p['fwd_s']['median'])} ms  "
            f"bwd {C.ms(p['bwd_s']['median'])} ms  saved {p['saved_bytes'] / 2**20:.1f} MiB "
            f"(min {C.ms(p['fwd_s']['min'])} + {C.ms(p['bwd_s']['min'])} ms, "
            f"{p['fwd_s']['n']} samples)")
    fits = {}
    for tp in tps:
        pts = [p for p in points if p["tp"] == tp]
        if not pts:
            continue
        xs = [p["mbs"] for p in pts]
        fits[str(tp)] = {k: fit_line(xs, [p[k]["median"] for p in pts])
                         for k in ("fwd_s", "bwd_s")}
        fits[str(tp)]["saved_bytes"] = fit_line(xs, [p["saved_bytes"] for p in pts])
        if any(p["allocator_bytes"] is not None for p in pts):
            fits[str(tp)]["allocator_bytes"] = fit_line(
                xs, [p["allocator_bytes"] or 0 for p in pts])
    entry["layer"] = {"points": points, "fit": fits}
    entry["comm_elem_bytes"] = points[0]["comm_elem_bytes"] if points else None

    # --- recompute: its extra backward time and what it saves ------------------------------
    rec = {}
    b_rec = mbss[min(1, len(mbss) - 1)]
    for tp in tps:
        base = next((p for p in points if p["tp"] == tp and p["mbs"] == b_rec), None)
        if base is None:
            continue
        rec[str(tp)] = {"mbs": b_rec, "none": {"saved_bytes": base["saved_bytes"],
                                               "allocator_bytes": base["allocator_bytes"]}}
        for mode in C.RECOMPUTE_MODES:
            r = _everywhere(C.recompute_point, small, tp, b_rec, s, device, warmup, repeats * passes,
                            budget, mode)
            if r is None:
                notes.append(f"recompute {mode} tp={tp}: out of memory, skipped")
                continue
            extra = max(0.0, r["extra_bwd_paired_s"]["median"])
            r["extra_bwd_s"] = extra
            r["extra_over_fwd"] = extra / base["fwd_s"]["median"]
            rec[str(tp)][mode] = r
            log(f"  recompute {mode:<9} tp={tp} mbs={b_rec}: +{C.ms(extra)} ms backward  "
                f"saved {r['saved_bytes'] / 2**20:.1f} MiB")
    entry["recompute"] = rec

    # --- attention core, embedding, head, optimizer ------------------------------------------
    entry["attention_core"] = _all(C.attention_core_point,
                                   [(small, tp, b, s, device, warmup, repeats, budget)
                                    for tp in tps for b in mbss[:2]], notes, "attention core")
    # embedding and head as the runtime lays them out (apply_tp: the vocabulary-sharded
    # embedding's all-reduce, the LM head's logits gather and the loss it then computes);
    # layers with the runtime's TP too, to measure what DTensor adds beyond the shard's compute
    meshes = {tp: _tp_mesh(device, tp) for tp in tps}
    for kind in ("embedding", "head"):
        entry[kind] = _all(C.runtime_point,
                           [(small, tp, kind, b, s, device, meshes[tp], warmup, repeats, budget)
                            for tp in tps for b in mbss], notes, kind, passes)
    entry["layer_runtime_tp"] = _all(
        C.runtime_point, [(small, tp, "layer", b, s, device, meshes[tp], warmup, repeats, budget,
                           sp) for tp in tps if tp > 1 and s % tp == 0 and not small.is_mla
                          for sp in (False, True)
                          for b in (mbss[:2] if quick else mbss)],
        notes, "layer with the runtime's TP", passes)
    for p in entry["layer_runtime_tp"]:
        log(f"  layer with the runtime's TP tp={p['tp']}{' sp' if p['sp'] else ''} "
            f"mbs={p['mbs']}: fwd "
            f"{C.ms(p['fwd_s']['median'])} ms  bwd {C.ms(p['bwd_s']['median'])} ms")
    for key in ("embedding", "head"):
        fit = {}
        for tp in tps:
            pts = [p for p in entry[key] if p["tp"] == tp]
            if not pts:
                continue
            xs = [p["mbs"] for p in pts]
            fit[str(tp)] = {k: fit_line(xs, [p[k]["median"] for p in pts])
                            for k in ("fwd_s", "bwd_s")}
            if key == "head":
                fit[str(tp)]["saved_bytes"] = fit_line(xs, [p["saved_bytes"] for p in pts])
        entry[key + "_fit"] = fit
    entry["optimizer"] = _everywhere(C.optimizer_point, small, device, warmup, max(repeats, 5),
                                     budget)
    log(f"  embedding / head / optimizer: head tp=1 mbs=1 fwd+bwd "
        f"{C.ms(entry['head'][0]['fwd_s']['median'] + entry['head'][0]['bwd_s']['median'])} ms, "
        f"optimizer {entry['optimizer']['s_per_param'] * 1e9:.2f} ns/param")
    entry["gemm"] = _everywhere(C.gemm_point, small, min(8192, max(mbss) * s), device, warmup,
                                repeats, budget)
    return entry


def run_profile(args, log) -> dict | None:
    from planner.catalog import get_model
    from planner.search import default_seq_len
    device, backend = init_distributed()
    rank = dist.get_rank()
    say = log if rank == 0 else (lambda *_: None)
    t0 = time.perf_counter()
    spec = get_model(args.model)
    seq = args.seq_len or default_seq_len(spec)
    hw = hardware(device, backend)
    say(f"profiler: {spec.name} seq_len {seq} on {hw['world_size']} x {hw['device_name']} "
        f"({backend}){' --quick' if args.quick else ''}")
    say("compute:")
    entry = profile_model(spec, seq, device, args.quick, say)
    bw = _everywhere(C.bandwidth_point, device, (64 << 20) if device.type == "cpu" else (1 << 30),
                     1, 3 if args.quick else 7, 2.0)
    say(f"  gemm {entry['gemm']['tflops'] * 1e3:.1f} GFLOP/s, copy bandwidth {bw['gbps']:.1f} GB/s")
    say("links:")
    links = L.measure_links(device, args.quick, say) if dist.get_world_size() > 1 else {}
    overlap = None
    if dist.get_world_size() > 1:
        small = Model.from_dict(entry["profiled_spec"])
        layer = C.shard_layer(small, 1, device)
        x = torch.randn(entry["micro_batches"][0], entry["seq_len"], small.hidden, device=device,
                        requires_grad=True)

        def layer_step():
            with C.autocast_for(device):
                y = layer(x)
            y.backward(torch.ones_like(y))

        intra = links.get("intra", {})
        ar = intra[max(intra, key=int)]["ops"]["all_reduce"]["fit"] if intra else None
        overlap = L.measure_overlap(device, layer_step, ar["busbw_gbps"] if ar else None,
                                    5 if args.quick else 11)
        if overlap:
            say(f"overlap: layer fwd+bwd {C.ms(overlap['compute_s'])} ms beside a "
                f"{overlap['bytes'] / 2**20:.1f} MiB all-reduce ({C.ms(overlap['comm_s'])} ms): "
                f"compute x{overlap['compute_slowdown']:.2f}, slowdown "
                f"{overlap['overlap_slowdown']:.2f} of the collective's time, "
                f"overlap efficiency {overlap['overlap_efficiency']:.2f}")
    prof = {
        "format": FORMAT, "version": VERSION,
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hardware": hw, "software": software(backend),
        "settings": {"quick": bool(args.quick), "command": " ".join(sys.argv),
                     "statistic": getattr(args, "statistic", "median"),
                     "dtype": "bf16 autocast" if device.type == "cuda" else "fp32",
                     "seconds": None},
        "device": {"gemm": entry.pop("gemm"), "memory_bandwidth": bw},
        "models": [entry],
        "links": links,
        "overlap": overlap,
        "notes": ([] if device.type == "cuda" else
                  ["CPU: one process = one 'GPU'; the CUDA-event, allocator and NCCL paths of the "
                   "profiler are not exercised here"]),
    }
    prof["settings"]["seconds"] = round(time.perf_counter() - t0, 1)
    dist.barrier()
    dist.destroy_process_group()
    return prof if rank == 0 else None
