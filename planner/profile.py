"""Measured profiles (`python -m profiler`): read, check, merge, and plan with them.

    plan --model llama70b --cluster h100x32 --profile h100-node.json

A profile (JSON, `format` "planner-profile", `version` 1) holds:

    hardware   {device_type, device_name, catalog_gpu, world_size, procs_per_node, nodes, hosts,
                memory_gib (per process), ...}
    software   {python, torch, backend, cuda, nccl, platform}
    created_utc, settings {quick, dtype, command, seconds}, notes [...]
    device     {gemm: {m, n, k, time_s, tflops}, memory_bandwidth: {bytes, time_s, gbps}}
    models     [{model: spec, profiled_spec: spec, scaled, seq_len, tp_degrees, micro_batches,
                 layer: {points: [{tp, mbs, seq_len, fwd_s, bwd_s, saved_bytes, ...}],
                         fit: {tp: {fwd_s, bwd_s, saved_bytes: {intercept, slope}}}},
                 recompute: {tp: {mbs, none, selective, full: {bwd_s, extra_bwd_s, saved_bytes}}},
                 attention_core, embedding, head (+ _fit), optimizer: {s_per_param, ...}}]
    links      {intra|inter: {size: {size, stride, ops: {op: {points: [{bytes, time_s, algbw_gbps,
                busbw_gbps}], fit: {alpha_s, busbw_gbps}}}}}}
    overlap    {compute_s, comm_s, both_s, compute_slowdown, overlap_efficiency, overlap_slowdown}

Times are {median, p10, p90, min, max, n} in seconds, the slowest rank's.

How measured figures replace catalog ones (`apply_profile`):

* the cluster's Gpu gets the measured achieved GEMM efficiency, attention efficiency, memory
  bandwidth, memory per device, and per link class the bus bandwidth, point-to-point bandwidth
  and per-hop latency fitted to `planner.cost.comm`'s own formulas;
* the `runtime` engine it returns carries a `Measured`, through which the cost model
  (planner.cost.facts.MeasuredFacts) reads the measured per-layer forward, backward and
  recompute seconds, saved-activation bytes per layer, embedding and LM head (+ loss) seconds and
  saved bytes, and optimizer seconds per parameter.

Measured values are used as they are at the measured shapes (interpolated in micro-batch size);
elsewhere (another sequence length, tensor-parallel degree, sequence parallelism, a model scaled
down to be timed on a CPU, another model) the catalog formula is scaled by the measured / modelled
ratio at the nearest measured shape, so the formulas stay the single source of shape dependence.
This module does not import torch.
"""
from __future__ import annotations

import dataclasses
import json
import math

from planner import limits as B
from planner import filecheck as S
from planner.cost import comm
from planner.cost.compute import attention_efficiency, attention_rolloff
from planner.errors import BadInput
from planner.specs import GPU_FIELDS, MODEL_SCHEMA, Cluster, Model

FORMAT = "planner-profile"
VERSION = 1
LINK_OPS_COLLECTIVE = ("all_reduce", "all_gather", "reduce_scatter")


def catalog_gpu_name(device_name: str, device_type: str) -> str | None:
    """The catalog entry a device is (planner.catalog.gpus), or None."""
    if device_type == "cpu":
        return "cpu"
    n = (device_name or "").lower()
    for key in ("h200", "h100", "b200"):
        if key in n:
            return key
    if "a100" in n:
        return "a100-40g" if "40g" in n.replace(" ", "") else "a100"
    return None


# ---- loading and checking -------------------------------------------------------------------

class Profile:
    def __init__(self, data: dict, path: str = "<profile>"):
        self.data = data
        self.path = path

    @property
    def hardware(self) -> dict:
        return self.data["hardware"]

    def describe(self) -> str:
        hw, sw = self.hardware, self.data.get("software", {})
        models = ", ".join(m["model"]["name"] for m in self.data["models"])
        return (f"{hw.get('world_size')} x {hw.get('device_name')} on {hw.get('nodes', 1)} node(s), "
                f"torch {sw.get('torch')} {sw.get('backend')}, {self.data.get('created_utc')}; "
                f"models: {models}")

    def default_model(self) -> Model:
        return Model.from_dict(self.data["models"][0]["model"])

    def default_cluster(self) -> Cluster:
        from planner.catalog import get_gpu
        hw = self.hardware
        gpu = get_gpu(hw.get("catalog_gpu") or "cpu")
        return Cluster(name=f"{gpu.name}x{hw['world_size']}", gpu=gpu,
                       num_gpus=int(hw["world_size"]),
                       gpus_per_node=int(hw.get("procs_per_node") or hw["world_size"]))


# ---- the schema: every figure apply_profile, Measured and merge_profiles read ----------------
# Measurement records keep the profiler's other fields (extra=True); what is read is checked.

_SECONDS = S.Num(gt=0.0, le=1e6)
TIME = S.Obj({"median": _SECONDS, "min": _SECONDS,
              "samples": (S.List(S.Num(ge=0.0, le=1e6), max_len=100_000), None)}, extra=True)
_TP = S.Int(1, B.MAX_GPUS)
_MBS = S.Int(1, B.MAX_BATCH)
_BYTES = S.Num(ge=0.0, le=1e18)
_LINE = S.Obj({"intercept": S.Num(), "slope": S.Num()}, extra=True)
LAYER_POINT = S.Obj({"tp": _TP, "mbs": _MBS, "fwd_s": TIME, "bwd_s": TIME,
                     "saved_bytes": _BYTES,
                     # a point measured at another length than its entry's (_layer_rate)
                     "seq_len": (S.Int(1, B.MAX_SEQ_LEN), None)}, extra=True)
PART_POINT = S.Obj({"tp": _TP, "mbs": _MBS, "fwd_s": TIME, "bwd_s": TIME,
                    "saved_bytes": (_BYTES, None)}, extra=True)
RUNTIME_TP_POINT = S.Obj({"tp": _TP, "mbs": _MBS, "sp": (S.Bool(), False), "fwd_s": TIME,
                          "bwd_s": TIME}, extra=True)
FITS = S.Map(S.Obj({"fwd_s": (_LINE, None), "bwd_s": (_LINE, None),
                    "saved_bytes": (_LINE, None)}, extra=True), key=S.IntKey(1, B.MAX_GPUS))
_MODE = S.Obj({"saved_bytes": _BYTES, "extra_over_fwd": S.Num(ge=0.0, le=1e3)}, extra=True)
RECOMPUTE = S.Map(S.Obj({"none": S.Obj({"saved_bytes": _BYTES}, extra=True),
                         "selective": (_MODE, None), "full": (_MODE, None)}, extra=True),
                  key=S.IntKey(1, B.MAX_GPUS))
ATTENTION_POINT = S.Obj({"tp": _TP, "mbs": _MBS, "fwd_s": TIME,
                         "flops": (S.Num(ge=0.0, le=1e30), None)}, extra=True)
OPTIMIZER = S.Obj({"s_per_param": S.Num(ge=0.0, le=1.0), "step_s": (TIME, None),
                   "params": (S.Num(gt=0.0, le=1e15), None)}, extra=True)
ENTRY = S.Obj({
    "model": MODEL_SCHEMA, "profiled_spec": MODEL_SCHEMA, "seq_len": S.Int(1, B.MAX_SEQ_LEN),
    "scaled": (S.Bool(), False), "micro_batches": (S.List(_MBS), None),
    "tp_degrees": (S.List(_TP), None),
    "layer": S.Obj({"points": S.List(LAYER_POINT, 1), "fit": FITS}, extra=True),
    "comm_elem_bytes": (S.Nullable(S.Enum(1, 2, 4, 8)), None),
    "recompute": (RECOMPUTE, None), "attention_core": (S.List(ATTENTION_POINT), None),
    "embedding": S.List(PART_POINT, 1), "embedding_fit": (FITS, None),
    "head": S.List(PART_POINT, 1), "head_fit": (FITS, None),
    "layer_runtime_tp": (S.List(RUNTIME_TP_POINT), None), "optimizer": OPTIMIZER},
    extra=True)
LINK_FIT = S.Nullable(S.Obj({"alpha_s": S.Num(ge=0.0, le=10.0),
                             "busbw_gbps": GPU_FIELDS["nvlink_busbw_gbps"]}, extra=True))
LINKS = S.Map(S.Obj({"size": S.Int(1, B.MAX_GPUS),
                     "ops": S.Map(S.Obj({"fit": (LINK_FIT, None)}, extra=True))}, extra=True),
              key=S.IntKey(1, B.MAX_GPUS))
HARDWARE = S.Obj({
    "device_type": S.Str(100, 1), "world_size": S.Int(1, B.MAX_GPUS),
    "procs_per_node": (S.Nullable(S.Int(1, B.MAX_GPUS)), None),
    "nodes": (S.Int(1, B.MAX_GPUS), None), "hosts": (S.List(S.Str(1000)), None),
    "device_name": (S.Nullable(S.Str(1000)), None),
    "memory_gib": (S.Nullable(GPU_FIELDS["memory_gib"]), None),
    "catalog_gpu": (S.Nullable(S.Name()), None)}, extra=True)
_RATE = S.Obj({"tflops": GPU_FIELDS["peak_tflops"]}, extra=True)
PROFILE_SCHEMA = S.Obj({
    "format": S.Enum(FORMAT), "version": S.Enum(VERSION),
    "created_utc": (S.Nullable(S.Str(100)), None), "hardware": HARDWARE,
    "software": (S.Map(S.Anything()), None),
    "settings": (S.Obj({"statistic": (S.Nullable(S.Enum("median", "min")), None)},
                       extra=True), None),
    "device": (S.Obj({"gemm": (S.Nullable(_RATE), None),
                      "memory_bandwidth": (S.Nullable(S.Obj({"gbps": GPU_FIELDS["hbm_gbps"]},
                                                            extra=True)), None)},
                     extra=True), None),
    "models": S.List(ENTRY, 1, 1000),
    "links": S.Obj({"intra": (LINKS, None), "inter": (LINKS, None)}, extra=True),
    "overlap": (S.Nullable(S.Obj({"overlap_slowdown": GPU_FIELDS["overlap_slowdown"],
                                  "compute_slowdown": S.Num(ge=0.0, le=1e3),
                                  "overlap_efficiency": S.Num(ge=-1e3, le=1e3)},
                                 extra=True)), None),
    "notes": (S.List(S.Str()), None), "merged_from": (S.List(S.Anything()), None)})


def _cross_check(d, where: str) -> None:
    """What the types alone do not say: one point per (tp, micro-batch) (interpolation divides
    by their differences), and embedding and head measured at every tp the layers were."""
    for i, m in enumerate(d["models"]):
        w = f"{where}: models[{i}]"
        for key in ("layer", "embedding", "head", "layer_runtime_tp"):
            pts = m["layer"]["points"] if key == "layer" else m.get(key) or []
            seen = set()
            for p in pts:
                k = (p["tp"], p["mbs"], bool(p.get("sp")) if key == "layer_runtime_tp" else None)
                if k in seen:
                    raise BadInput(f"{w}.{key}: two points at tp={k[0]} micro-batch {k[1]}")
                seen.add(k)
        tps = sorted({p["tp"] for p in m["layer"]["points"]})
        for key in ("embedding", "head"):
            have = {p["tp"] for p in m[key]}
            for tp in tps:
                if tp not in have:
                    raise BadInput(f"{w}.{key}: no point at tp={tp} (the layer points have tp "
                                   f"{', '.join(map(str, tps))})")
        for p in m["head"]:
            if p.get("saved_bytes") is None:
                raise BadInput(f"{w}.head: a point without saved_bytes")


def validate(d, where: str = "profile") -> None:
    """Raise BadInput (one line) unless `d` is a profile this version reads."""
    if not isinstance(d, dict):
        raise BadInput(f"{where}: not a profile (expected a JSON object)")
    if d.get("format") != FORMAT:
        what = ("a plan" if "schema_version" in d and "parallelism" in d else
                f"format {S.show(d.get('format'))}" if "format" in d else "no 'format' field")
        raise BadInput(f"{where}: not a planner profile ({what}); make one with "
                       f"`torchrun ... -m profiler --model M --out FILE`")
    if d.get("version") != VERSION or type(d.get("version")) is not int:
        raise BadInput(f"{where}: profile version {S.show(d.get('version'))} is not supported "
                       f"(this planner reads version {VERSION}); re-run the profiler")
    S.check(PROFILE_SCHEMA, d, where)
    for i, m in enumerate(d["models"]):
        for key in ("model", "profiled_spec"):
            try:
                Model.from_dict(m[key], f"models[{i}].{key}")
            except BadInput as e:
                raise BadInput(f"{where}: {e}") from None
    _cross_check(d, where)


def load_profile(path) -> Profile:
    """Read and check a profile; BadInput with one line for anything wrong."""
    d = S.read_json(path, "profile")
    validate(d, f"profile {S.show_path(path)}")
    return Profile(d, str(path))


# ---- merging --------------------------------------------------------------------------------

def _slowest_link(a: dict, b: dict) -> dict:
    def bw(e):
        fits = [o["fit"]["busbw_gbps"] for o in e["ops"].values() if o.get("fit")]
        return sorted(fits)[len(fits) // 2] if fits else math.inf
    return a if bw(a) <= bw(b) else b


def merge_profiles(profiles: list) -> Profile:
    """One profile from several (e.g. one per node): the slowest figure of each measurement."""
    if not profiles:
        raise BadInput("merge: no profiles given")
    base = profiles[0]
    kind = (base.hardware.get("device_type"), base.hardware.get("catalog_gpu"))
    for p in profiles[1:]:
        k = (p.hardware.get("device_type"), p.hardware.get("catalog_gpu"))
        if k != kind:
            raise BadInput(f"merge: {p.path} was measured on {k[1] or k[0]}, {base.path} on "
                           f"{kind[1] or kind[0]}; profiles of different hardware do not merge")
    out = json.loads(json.dumps(base.data))
    hosts = set(out["hardware"].get("hosts", []))
    out["merged_from"] = [{"path": p.path, "created_utc": p.data.get("created_utc"),
                           "hosts": p.hardware.get("hosts"),
                           "world_size": p.hardware.get("world_size")} for p in profiles]
    for p in profiles[1:]:
        d = p.data
        hosts |= set(p.hardware.get("hosts", []))
        # device figures: the slower
        for key, fld in (("gemm", "tflops"), ("memory_bandwidth", "gbps")):
            a, b = out.get("device", {}).get(key), d.get("device", {}).get(key)
            if b and (not a or b[fld] < a[fld]):
                out.setdefault("device", {})[key] = b
        if d["hardware"].get("memory_gib") and out["hardware"].get("memory_gib"):
            out["hardware"]["memory_gib"] = min(out["hardware"]["memory_gib"],
                                                d["hardware"]["memory_gib"])
        # models: same model and shapes -> keep the slower layer points
        for m in d["models"]:
            same = next((e for e in out["models"] if e["profiled_spec"] == m["profiled_spec"]
                         and e["seq_len"] == m["seq_len"] and e["model"] == m["model"]), None)
            if same is None:
                out["models"].append(m)
                continue
            pts = {(q["tp"], q["mbs"]): q for q in same["layer"]["points"]}
            for q in m["layer"]["points"]:
                k = (q["tp"], q["mbs"])
                cur = pts.get(k)
                tq = q["fwd_s"]["median"] + q["bwd_s"]["median"]
                if cur is None or tq > cur["fwd_s"]["median"] + cur["bwd_s"]["median"]:
                    pts[k] = q
            same["layer"]["points"] = [pts[k] for k in sorted(pts)]
            same["layer"]["fit"] = _refit(same["layer"]["points"])
        # links: per class and size, the slower
        for cls, shapes in d.get("links", {}).items():
            for size, e in shapes.items():
                cur = out["links"].setdefault(cls, {}).get(size)
                out["links"][cls][size] = e if cur is None else _slowest_link(cur, e)
        o1, o2 = out.get("overlap"), d.get("overlap")
        if o2 and (not o1 or o2["overlap_efficiency"] < o1["overlap_efficiency"]):
            out["overlap"] = o2
    out["hardware"]["hosts"] = sorted(hosts)
    out["hardware"]["nodes"] = max(len(hosts), max(p.hardware.get("nodes", 1) for p in profiles))
    validate(out, "merged profile")
    return Profile(out, "merged")


def fit_line(xs, ys) -> dict:
    """Least squares y = a + c x; with one point, a line through the origin (shared with the
    profiler, which fits its measurements with it)."""
    n = len(xs)
    if n == 1:
        return {"intercept": 0.0, "slope": ys[0] / xs[0] if xs[0] else 0.0}
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    c = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return {"intercept": my - c * mx, "slope": c}


def _refit(points) -> dict:
    fits = {}
    for tp in sorted({p["tp"] for p in points}):
        pts = [p for p in points if p["tp"] == tp]
        xs = [p["mbs"] for p in pts]
        fits[str(tp)] = {k: fit_line(xs, [p[k]["median"] for p in pts])
                         for k in ("fwd_s", "bwd_s")}
        fits[str(tp)]["saved_bytes"] = fit_line(xs, [p["saved_bytes"] for p in pts])
    return fits


# ---- measured figures for the cost model ----------------------------------------------------

def _interp(xs_ys: list, x: float, slope: float) -> float:
    """Piecewise-linear through measured (x, y) points (sorted); beyond them, the fitted slope
    from the nearest end (proportional below the first point)."""
    xs = [p[0] for p in xs_ys]
    ys = [p[1] for p in xs_ys]
    if x <= xs[0]:
        return ys[0] * x / xs[0]
    if x >= xs[-1]:
        return ys[-1] + max(slope, 0.0) * (x - xs[-1]) if len(xs) > 1 else ys[-1] * x / xs[-1]
    for (x0, y0), (x1, y1) in zip(xs_ys, xs_ys[1:]):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[-1]


def _shape_key(m: Model) -> dict:
    d = dataclasses.asdict(m)
    d.pop("name")
    return d


class Measured:
    """The measured figures of one profile entry, in the units `planner.cost.stage` uses.

    Each method takes the catalog's (modelled) value for the requested shape and returns the
    measured one: measured directly at measured shapes, else the modelled value times the
    measured / modelled ratio at the nearest measured shape (`_calibrate`)."""

    def __init__(self, entry: dict, model: Model, gpu, stat: str = "median"):
        self.entry = entry
        # which statistic of the repeated timings to plan with: "median" (the default), or "min"
        # on a shared machine where other jobs only ever add time (profile settings.statistic)
        self.stat = stat
        self.spec = Model.from_dict(entry["profiled_spec"])
        self.seq = entry["seq_len"]
        self.exact = not entry.get("scaled") and _shape_key(self.spec) == _shape_key(model)
        self.model = model
        self.gpu = gpu
        self.tps = sorted({p["tp"] for p in entry["layer"]["points"]})
        # bytes per element of the activations tensor parallelism and the pipeline move (the
        # row-parallel output under the runtime's precision: 2 under bf16 autocast, 4 in fp32)
        self.comm_elem_bytes = entry.get("comm_elem_bytes") or 2
        pts = entry["layer"]["points"]
        self._layer = {}
        for tp in self.tps:
            mine = sorted((p for p in pts if p["tp"] == tp), key=lambda p: p["mbs"])
            self._layer[tp] = mine

    def _stat(self, p: dict, key: str) -> float:
        """`key` ("fwd_s" / "bwd_s") of point `p` under the statistic. For the min, the forward
        and backward of the same repeat with the least fwd + bwd (summing the two separate
        minima would make a step no repeat ever ran)."""
        if self.stat == "min":
            f, b = p.get("fwd_s", {}).get("samples"), p.get("bwd_s", {}).get("samples")
            if f and b and len(f) == len(b):
                i = min(range(len(f)), key=lambda j: f[j] + b[j])
                return (f if key == "fwd_s" else b)[i]
        return p[key][self.stat]

    # -- where to look ------------------------------------------------------------------------
    def _tp(self, tp: int) -> int:
        return min(self.tps, key=lambda t: (abs(math.log2(t) - math.log2(tp)), -t))

    def _direct(self, s: int, tp: int, sp: bool = False) -> bool:
        return self.exact and s == self.seq and tp in self.tps and not (sp and tp > 1)

    def _mbs_at(self, tp: int, b: float, s: int) -> float:
        """The micro-batch at the profiled shape to compare with: the same one when the shapes
        are measured, else the same number of tokens within the measured range."""
        if self.exact and s == self.seq:
            return b
        mbs = [p["mbs"] for p in self._layer[tp]]
        return min(max(b * s / self.seq, mbs[0]), mbs[-1])

    def _calibrate(self, modelled_req: float, measured_fn, modelled_fn, b, s, tp, sp=False):
        tpm = self._tp(tp)
        bm = self._mbs_at(tpm, b, s)
        meas = measured_fn(tpm, bm)
        if self._direct(s, tp, sp):
            return meas
        ref = modelled_fn(self.spec, bm, self.seq, tpm)
        return modelled_req * meas / ref if ref > 0 else meas

    def _layer_value(self, tp, b, key) -> float:
        pts = self._layer[tp]
        fit = self.entry["layer"]["fit"].get(str(tp), {}).get(key, {"slope": 0.0})
        if key == "saved_bytes":
            xy = [(p["mbs"], p["saved_bytes"]) for p in pts]
        else:
            xy = [(p["mbs"], self._stat(p, key)) for p in pts]
        return _interp(xy, b, fit["slope"])

    # -- compute ------------------------------------------------------------------------------
    def layer_time(self, lt, b, s, tp, sp, flash, tp_comm_fwd=0.0, kernels=None):
        """LayerTime with measured forward, backward and recompute seconds.

        `lt` is the modelled layer at the asked shape with the element-wise `kernels` of the
        profiled code (planner.cost.compute.ElementwiseKernels); the profiled shape is modelled
        with the same kernels, so that the ratio carries only the shapes.
        With tp > 1 the shard's compute is what the planner adds its modelled collectives to;
        where the profile also timed the layer under the runtime's own tensor parallelism
        (DTensor, collectives included), whatever that costs beyond shard compute + the
        modelled collectives (`tp_comm_fwd` per pass) is added to the compute, as a factor."""
        from planner.cost.compute import FUSED_KERNELS, layer_time
        kernels = FUSED_KERNELS if kernels is None else kernels

        def modelled(spec, bb, ss, t, which, sp_=False):
            return getattr(layer_time(spec, self.gpu, bb, ss, t, sp_, flash, kernels=kernels),
                           which)

        fwd = self._calibrate(lt.fwd, lambda t, bb: self._layer_value(t, bb, "fwd_s"),
                              lambda spec, bb, ss, t: modelled(spec, bb, ss, t, "fwd"), b, s, tp,
                              sp)
        bwd = self._calibrate(lt.bwd, lambda t, bb: self._layer_value(t, bb, "bwd_s"),
                              lambda spec, bb, ss, t: modelled(spec, bb, ss, t, "bwd"), b, s, tp,
                              sp)
        if tp > 1:
            fwd, bwd = (x * self._tp_overhead(tp, b, s, sp, key, tp_comm_fwd)
                        for x, key in ((fwd, "fwd_s"), (bwd, "bwd_s")))
        rec = self.entry.get("recompute", {}).get(str(self._tp(tp)), {})
        measured = {"fwd": fwd, "bwd": bwd}
        for mode in ("selective", "full"):
            if mode in rec:
                measured[mode] = rec[mode]["extra_over_fwd"] * fwd
        return dataclasses.replace(lt, measured=measured)

    def _tp_overhead(self, tp, b, s, sp, key, comm) -> float:
        """(runtime-TP layer - modelled collectives) / shard layer, at the nearest measured
        shape (with or without sequence parallelism as asked); 1 where not measured."""
        tpm = self._tp(tp)
        pts = sorted((p for p in self.entry.get("layer_runtime_tp", [])
                      if p["tp"] == tpm and bool(p.get("sp")) == bool(sp)),
                     key=lambda p: p["mbs"])
        if tpm == 1 or not pts:
            return 1.0
        bm = self._mbs_at(tpm, b, s)
        xy = [(p["mbs"], self._stat(p, key)) for p in pts]
        slope = (xy[-1][1] - xy[-2][1]) / (xy[-1][0] - xy[-2][0]) if len(xy) > 1 else 0.0
        real = _interp(xy, bm, slope)
        shard = self._layer_value(tpm, bm, key)
        comm_m = comm * bm / b if b else comm
        return max(1.0, (real - comm_m) / shard) if shard > 0 else 1.0

    def _part(self, key, which, tp, b):
        pts = sorted((p for p in self.entry[key] if p["tp"] == tp), key=lambda p: p["mbs"])
        fit = self.entry.get(key + "_fit", {}).get(str(tp), {}).get(which, {"slope": 0.0})
        if which == "saved_bytes":
            return _interp([(p["mbs"], p[which]) for p in pts], b, fit["slope"])
        return _interp([(p["mbs"], self._stat(p, which)) for p in pts], b, fit["slope"])

    def _fixed_times(self, key, modelled_pair, fn, b, s, tp):
        out = []
        for i, which in enumerate(("fwd_s", "bwd_s")):
            out.append(self._calibrate(
                modelled_pair[i], lambda t, bb: self._part(key, which, t, bb),
                lambda spec, bb, ss, t: fn(spec, self.gpu, bb, ss, t)[i], b, s, tp))
        return tuple(out)

    def embedding_time(self, modelled_pair, b, s, tp):
        from planner.cost.compute import embedding_time
        return self._fixed_times("embedding", modelled_pair, embedding_time, b, s, tp)

    def head_time(self, modelled_pair, b, s, tp, ce_bytes=None):
        """`ce_bytes`: the engine's loss traffic the modelled pair was priced with
        (LossMemory.traffic; head_time's default where None), so that the profiled shape is
        modelled alike."""
        from planner.cost.compute import head_time
        kw = {} if ce_bytes is None else {"ce_bytes": ce_bytes}
        return self._fixed_times(
            "head", modelled_pair,
            lambda spec, gpu, bb, ss, t: head_time(spec, gpu, bb, ss, t, **kw), b, s, tp)

    def optimizer_time(self, params: float) -> float:
        opt = self.entry["optimizer"]
        if self.stat != "median" and "step_s" in opt and "params" in opt:
            return opt["step_s"][self.stat] / opt["params"] * params
        return opt["s_per_param"] * params

    # -- memory -------------------------------------------------------------------------------
    def activation_bytes(self, modelled: float, b, s, tp, sp, mode, flash) -> float:
        """Saved bytes of one layer for one micro-batch under `mode` recompute."""
        from planner.cost.memory import activation_bytes
        rec = self.entry.get("recompute", {}).get(str(self._tp(tp)), {})
        ratio = 1.0
        if mode != "none" and mode in rec and rec["none"]["saved_bytes"] > 0:
            ratio = rec[mode]["saved_bytes"] / rec["none"]["saved_bytes"]
        elif mode != "none":
            return modelled
        return self._calibrate(
            modelled, lambda t, bb: ratio * self._layer_value(t, bb, "saved_bytes"),
            lambda spec, bb, ss, t: activation_bytes(spec, bb, ss, t, False, mode, flash),
            b, s, tp, sp)

    def head_saved_bytes(self, modelled: float, b, s, tp, reference) -> float:
        """Saved bytes of final norm, LM head and loss for one micro-batch: measured, or
        `modelled` scaled by measured / `reference(spec, mbs, seq, tp)` at the profiled shape
        (the catalog's figure for what the profile measured)."""
        return self._calibrate(modelled, lambda t, bb: self._part("head", "saved_bytes", t, bb),
                               reference, b, s, tp)


# ---- applying a profile ---------------------------------------------------------------------

def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


def _link_figures(shapes: dict) -> dict | None:
    """Fit the planner's alpha-beta formulas (planner.cost.comm) to one link class: bus
    bandwidth and per-hop latency from the collectives of the largest group measured, the
    point-to-point bandwidth from send/recv. Returns None if nothing usable was measured."""
    if not shapes:
        return None
    size = max(shapes, key=lambda k: int(k))
    e = shapes[size]
    n = int(e["size"])
    bws, lats = [], []
    for op in LINK_OPS_COLLECTIVE:
        fit = e["ops"].get(op, {}).get("fit")
        if not fit:
            continue
        bws.append(fit["busbw_gbps"])
        # the hops planner.cost.comm prices each collective's latency with, on one link class
        # (the group measured lies inside a node, or holds one rank per node): the all-reduce's
        # tree, the all-gather's and reduce-scatter's ring
        hops = comm.tree_hops(n) if op == "all_reduce" else comm.ring_hops(n)
        lats.append(fit["alpha_s"] / max(1, hops))
    if not bws:
        return None
    sr = e["ops"].get("send_recv", {}).get("fit")
    return {"size": n, "busbw_gbps": _median(bws), "latency_s": _median(lats),
            "p2p_gbps": sr["busbw_gbps"] if sr else None}


def apply_profile(profile: Profile, cluster: Cluster, model: Model, statistic: str | None = None):
    """(cluster with the measured GPU figures, the runtime engine with the measured facts,
    notes naming each measured figure used).

    The profile measures our runtime on that machine: the engine returned is `runtime` whose
    facts are the measurements (planner.cost.facts.MeasuredFacts); its catalog speed
    figures are dropped, the measured GPU figures replace them.

    `statistic`: "median" or "min" of the repeated timings; default: the profile's
    settings.statistic (the profiler's --statistic), else the median."""
    d, hw = profile.data, profile.hardware
    stat = statistic or d.get("settings", {}).get("statistic") or "median"
    if stat not in ("median", "min"):
        raise BadInput(f"profile {profile.path}: statistic {stat!r} is not median or min")
    measured_on = hw.get("catalog_gpu")
    if measured_on and cluster.gpu.name != measured_on and \
            not (cluster.gpu.name.startswith("a100") and measured_on.startswith("a100")):
        raise BadInput(f"profile {profile.path} was measured on {hw.get('device_name')} "
                       f"({measured_on}); the cluster's GPU is {cluster.gpu.name}")
    gpu = cluster.gpu
    notes = []
    changes = {}
    dev = d.get("device") or {}
    attn = [dict(e, seq_len=m["seq_len"]) for m in d["models"]
            for e in m.get("attention_core") or [] if e.get("flops")]
    best = max(attn, key=lambda e: e["flops"]) if attn else None
    gemm_rate = dev["gemm"]["tflops"] if dev.get("gemm") else None
    attn_rate = best["flops"] / best["fwd_s"]["median"] / 1e12 if best else None
    # an efficiency is a fraction of the peak: a measured rate above the catalog's peak (a CPU
    # whose vector units the rough catalog figure undercounts) raises the peak to it; times,
    # which depend on peak x efficiency = the measured rate, are unchanged
    # (at the GPU's power limit, where it has one: its efficiencies are of that peak); the
    # measured layers' model-FLOP rate counts too, or a plan's MFU over this peak passes 1
    entry = _pick_entry(d["models"], model)
    peak = gpu.tensor_peak_tflops
    top = max([r for r in (gemm_rate, attn_rate, _layer_rate(entry, stat)) if r is not None],
              default=0.0)
    if top > peak:
        changes["peak_tflops"] = top * gpu.peak_tflops / peak
        peak = top
        notes.append(f"peak {top * 1e3:.3g} GFLOP/s: the measured rate, above the catalog's "
                     f"{gpu.tensor_peak_tflops * 1e3:.3g}")
    if gemm_rate is not None:
        eff = gemm_rate / peak
        changes["gemm_efficiency"] = eff
        notes.append(f"GEMM efficiency {eff:.2f} of peak (measured "
                     f"{gemm_rate * 1e3:.3g} GFLOP/s, catalog {gpu.gemm_efficiency:.2f})")
    if attn_rate is not None:
        # measured at its causal keys (seq / 2). Where the catalog's GPU has a roll-off with
        # the keys (planner.cost.compute.attention_rolloff), the curve is moved to pass through
        # the measurement: its long-sequence figure scaled, or, were that above the peak, the
        # peak with the half-way keys that give the measured rate there
        keys = best["seq_len"] / 2.0
        measured = attn_rate / peak
        eff = measured / attention_rolloff(gpu, keys)
        if eff > 1.0:
            changes["attn_half_keys"] = keys * (1.0 / measured - 1.0)
            eff = 1.0
        changes["attn_efficiency"] = eff
        notes.append(f"attention efficiency {measured:.2f} of peak at {keys:.0f} keys a query "
                     f"(catalog {attention_efficiency(gpu, keys):.2f} there)")
    if dev.get("memory_bandwidth"):
        changes["hbm_gbps"] = dev["memory_bandwidth"]["gbps"]
        notes.append(f"memory bandwidth {changes['hbm_gbps']:.3g} GB/s (catalog {gpu.hbm_gbps:.3g})")
    if hw.get("memory_gib"):
        changes["memory_gib"] = float(hw["memory_gib"])
        notes.append(f"memory {changes['memory_gib']:.1f} GiB per device (catalog "
                     f"{gpu.memory_gib:.1f})")
    intra = _link_figures(d.get("links", {}).get("intra", {}))
    if intra:
        changes.update(nvlink_busbw_gbps=intra["busbw_gbps"],
                       nvlink_latency_us=intra["latency_s"] * 1e6)
        if intra["p2p_gbps"]:
            changes["nvlink_p2p_gbps"] = intra["p2p_gbps"]
        notes.append(f"intra-node links (n={intra['size']}): bus {intra['busbw_gbps']:.3g} GB/s, "
                     f"p2p {changes.get('nvlink_p2p_gbps', gpu.nvlink_p2p_gbps):.3g} GB/s, "
                     f"latency {intra['latency_s'] * 1e6:.0f} us/hop")
    inter = _link_figures(d.get("links", {}).get("inter", {}))
    if inter:
        changes.update(internode_gbps_per_gpu=inter["busbw_gbps"],
                       internode_latency_us=inter["latency_s"] * 1e6)
        notes.append(f"inter-node links (n={inter['size']}): bus {inter['busbw_gbps']:.3g} GB/s "
                     f"per GPU, latency {inter['latency_s'] * 1e6:.0f} us/hop")
    elif cluster.num_nodes > 1:
        notes.append("inter-node links: not measured (single-node profile), catalog figures")
    try:
        gpu2 = dataclasses.replace(gpu, **changes)
    except BadInput as e:
        raise BadInput(f"profile {profile.path}: the measured figures do not make a GPU ({e})") \
            from None

    overlap = d.get("overlap")
    if overlap and "overlap_slowdown" in {f.name for f in dataclasses.fields(gpu)}:
        gpu2 = dataclasses.replace(gpu2, overlap_slowdown=overlap["overlap_slowdown"])
        notes.append(f"overlap slowdown {overlap['overlap_slowdown']:.2f} of a collective's time "
                     f"(catalog {gpu.overlap_slowdown:.2f}; compute x"
                     f"{overlap['compute_slowdown']:.2f} beside an all-reduce)")
    measured = Measured(entry, model, gpu2, stat)
    tps = ",".join(map(str, measured.tps))
    mbs = ",".join(map(str, entry.get("micro_batches", [])))
    how = ("measured" if measured.exact else
           f"calibrated on {entry['profiled_spec']['name']} (measured / modelled)")
    notes.append(f"layer forward/backward: {how}, tp {tps} x micro-batch {mbs} at seq "
                 f"{entry['seq_len']} ({stat} of the repeats)")
    if entry.get("recompute"):
        notes.append("recompute: measured extra backward and saved bytes (selective, full)")
    notes.append(f"activations per layer: {how} saved bytes; {measured.comm_elem_bytes}-byte "
                 f"activations in tensor/pipeline-parallel messages")
    notes.append(f"embedding, LM head + loss: {how} seconds and saved bytes")
    notes.append(f"optimizer step: measured {entry['optimizer']['s_per_param'] * 1e9:.3g} ns per "
                 f"parameter")
    from planner.engines import ENGINES
    engine = dataclasses.replace(ENGINES["runtime"], gemm_scale=1.0, attn_scale=1.0,
                                 elementwise_traffic=1.0, layer_overhead_s=0.0,
                                 overlap_slowdown=None, measured=measured)
    return dataclasses.replace(cluster, gpu=gpu2), engine, notes


def _layer_rate(entry: dict, stat: str) -> float | None:
    """The highest model-FLOP rate, TFLOP/s, of the entry's measured layers (forward and
    backward, counted as a plan's MFU counts them: planner.cost.stage dense_layer_flops); None
    for a mixture-of-experts model, whose layers that count does not describe."""
    from planner.cost.stage import dense_layer_flops
    spec = Model.from_dict(entry["profiled_spec"])
    if spec.is_moe:
        return None
    return max((dense_layer_flops(spec, p.get("seq_len", entry["seq_len"]), p["mbs"]) / p["tp"]
                / (p["fwd_s"][stat] + p["bwd_s"][stat]) / 1e12
                for p in entry["layer"]["points"]), default=None)


def _pick_entry(entries: list, model: Model) -> dict:
    """The entry of this model (same shapes), else the one closest in hidden size."""
    key = _shape_key(model)
    for e in entries:
        if _shape_key(Model.from_dict(e["model"])) == key:
            return e
    return min(entries, key=lambda e: abs(math.log(e["model"]["hidden"] / model.hidden)))
