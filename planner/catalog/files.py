"""Model, cluster and GPU files read into planner.specs types, beside the catalog they may name.

A model file is a Hugging Face config.json (or its model directory: planner.catalog.hf) or a
planner model spec (Model's JSON form); a cluster file a catalog GPU or GPU figures with a GPU
count; a plan's cluster (Cluster.to_dict) its GPU's figures or a catalog GPU's name. Every file
is read strictly (planner.filecheck.read_json_object: size, depth, finite numbers, no duplicate
keys) and every value checked; bad input is one BadInput line naming the file.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from planner import limits as B
from planner import filecheck as S
from planner.catalog.gpus import GPUS, get_gpu
from planner.catalog.hf import model_from_hf_config
from planner.catalog.systems import host_size, system_layout
from planner.errors import BadInput
from planner.specs import (GPU_FIELDS, GPU_OVERRIDES, GPU_SCHEMA, HOST_FIELDS, PLAN_CLUSTER,
                           Cluster, Gpu, MixedCluster, Model)


def model_name_of(cfg: dict, path: Path) -> str:
    """A plan's name for a model file: the config's own name ("_name", "name", or the last
    part of Hugging Face's "_name_or_path"), else the model directory's name for a
    config.json (in it or given as the directory), else the file's stem."""
    for key in ("_name", "name"):
        if isinstance(cfg.get(key), str) and cfg[key].strip():
            return cfg[key]
    nop = cfg.get("_name_or_path")
    if isinstance(nop, str) and nop.strip("/ ").strip():
        return nop.rstrip("/").rsplit("/", 1)[-1]
    if path.name == "config.json":
        return path.resolve().parent.name or "model"
    return path.stem


def load_model_file(path: str) -> Model:
    """A model from a config.json, a model directory holding one, or a planner model spec."""
    p = Path(path)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise BadInput(f"model directory {S.show_path(path)} has no config.json")
        p = p / "config.json"
        path = str(p)
    cfg = S.read_json_object(path, "model config")
    where = f"model config {S.show_path(path)}"
    name = model_name_of(cfg, p)
    if S.bad_name_reason(name):
        raise BadInput(f"{where}: name {S.bad_name_reason(name)}")
    if "model_type" not in cfg and "num_layers" in cfg:   # our own Model JSON
        return Model.from_dict({**cfg, "name": name}, where)
    return model_from_hf_config(cfg, name, where)


# A cluster file: a catalog GPU ("gpu": "h100" or "base": "h100") with the figures that differ
# at the top level, or "gpu": {all the figures} / {"base": ..., figures}.
CLUSTER_FILE = S.Obj({"name": (S.Name(), None), "num_gpus": S.Int(1, None),
                      "gpus_per_node": (S.Int(1, None), None),
                      "nvlink_domain": (S.Int(1, None), None), "gpu": (S.Anything(), None),
                      "base": (S.Name(), None),
                      **{k: (GPU_FIELDS[k], None) for k in GPU_OVERRIDES}})


# a mixed cluster's file (issue 24): its groups, each a cluster of CLUSTER_FILE's form (named
# for its GPU unless "name" says otherwise), the link between groups (default: the slower
# side's NIC) and, optionally, the GPUs in all, which must be what the groups hold
MIXED_CLUSTER_FILE = S.Obj({"name": (S.Name(), None), "num_gpus": (S.Int(1, None), None),
                            "groups": S.List(CLUSTER_FILE, 1, 64),
                            "link_gbps": (GPU_FIELDS["internode_gbps_per_gpu"], None),
                            "link_latency_us": (GPU_FIELDS["internode_latency_us"], None)})


def load_cluster_file(path: str) -> Cluster:
    """A Cluster from a cluster file, or a MixedCluster from one with "groups" (a one-group
    file is a plain Cluster)."""
    where = f"cluster file {S.show_path(path)}"
    raw = S.read_json_object(path, "cluster file")
    name = Path(path).stem
    if "groups" not in raw:
        return _file_cluster(S.check(CLUSTER_FILE, raw, where), where, name)
    d = S.check(MIXED_CLUSTER_FILE, raw, where)
    name = d.get("name") or name
    groups = []
    for i, g in enumerate(d["groups"]):
        gwhere = f"{where}: groups[{i}]"
        groups.append(_file_cluster(g, gwhere, None))
    total = sum(g.num_gpus for g in groups)
    if "num_gpus" in d and d["num_gpus"] != total:
        raise BadInput(f"{where}: num_gpus {d['num_gpus']} is not what the groups hold "
                       f"({' + '.join(str(g.num_gpus) for g in groups)} = {total})")
    if len(groups) == 1:
        return dataclasses.replace(groups[0], name=name)
    try:
        return MixedCluster(name=name, groups=tuple(groups), link_gbps=d.get("link_gbps"),
                            link_latency_us=d.get("link_latency_us"))
    except BadInput as e:
        raise BadInput(f"{where}: {e}") from None


def _file_cluster(d: dict, where: str, name: str | None) -> Cluster:
    """The Cluster of a checked CLUSTER_FILE dict (`name`: the file's stem, None: the GPU's
    name, as a mixed cluster's groups are named)."""
    if ("gpu" in d) == ("base" in d):
        raise BadInput(f"{where}: give " + ("either 'gpu' or 'base', not both" if "gpu" in d else
                                            "'gpu' (a catalog GPU or an object of its figures) "
                                            "or 'base' (a catalog GPU) with the figures that "
                                            "differ"))
    gpu = gpu_from_json(d["gpu"] if "gpu" in d else d["base"], where,
                        "gpu" if "gpu" in d else "base")
    overrides = {k: d[k] for k in GPU_OVERRIDES if k in d}
    if overrides:
        try:
            gpu = dataclasses.replace(gpu, **overrides)
        except BadInput as e:
            raise BadInput(f"{where}: {e}") from None
    n = d["num_gpus"]
    gpn = d.get("gpus_per_node")
    if gpn is not None and gpn > n:
        raise BadInput(f"{where}: gpus_per_node {gpn} is more than num_gpus {n}")
    if n > B.MAX_GPUS:
        raise BadInput(f"{where}: {S.show(n)} GPUs is more than this planner plans for "
                       f"(at most {B.MAX_GPUS})")
    name = d.get("name") or name or gpu.name
    domain = d.get("nvlink_domain")
    # what is not given comes from the GPU's catalog system (planner.catalog.systems.SYSTEMS:
    # 8 to a host and an NVLink domain; GB200/GB300 NVL72: 4 to a host, 72 to a domain); a
    # given gpus_per_node alone is also the NVLink domain
    if gpn is None and domain is None:
        try:
            gpn, domain = system_layout(gpu.name, n)
        except BadInput as e:
            raise BadInput(f"{where}: {e}; or give gpus_per_node and nvlink_domain") from None
    elif gpn is None:
        gpn = host_size(gpu.name, n)
    try:
        return Cluster(name=name, gpu=gpu, num_gpus=n, gpus_per_node=gpn, nvlink_domain=domain)
    except BadInput as e:
        raise BadInput(f"{where}: {e}") from None


# a GPU in a file: all its figures, or "base": a catalog GPU and the figures that differ
GPU_OBJECT = S.Obj({"base": (S.Name(), None),
                    **{k: (v, None) for k, v in GPU_FIELDS.items()}})


def gpu_from_json(v, where: str, path: str = "gpu") -> Gpu:
    """A Gpu from a file's `gpu` value: a catalog name ("h100"), or an object with either all
    the figures or "base" plus the figures that differ."""
    try:
        if not isinstance(v, (str, dict)):
            raise S.Invalid(path, f"must be a catalog GPU name or an object of GPU figures, "
                                  f"got {S.show(v)}")
        if isinstance(v, str):
            S.Name()(v, path)
        else:
            d = GPU_OBJECT(v, path)
    except S.Invalid as e:
        raise BadInput(f"{where}: {e}") from None
    if isinstance(v, str):
        try:
            return get_gpu(v)
        except BadInput as e:
            raise BadInput(f"{where}: {path}: {e}") from None
    base = d.pop("base", None)
    if base is not None:
        try:
            start = get_gpu(base)
        except BadInput as e:
            raise BadInput(f"{where}: {path}.base: {e}") from None
        try:
            return dataclasses.replace(start, **d)
        except BadInput as e:
            raise BadInput(f"{where}: {path}: {e}") from None
    if d.get("name") in GPUS:
        # a plan from before the host figures (planner.specs.Gpu host_* / nvme_*): its
        # catalog GPU's
        known = get_gpu(d["name"])
        d = {**{k: getattr(known, k) for k in HOST_FIELDS}, **d}
    missing = [k for k, f in GPU_SCHEMA.fields.items() if f[1] is S.REQUIRED and k not in d]
    if missing:
        raise BadInput(f"{where}: {path} is missing {', '.join(missing)}; give them all, or "
                       f"\"base\": \"<catalog gpu>\" and only the figures that differ")
    try:
        return Gpu(**d)
    except BadInput as e:
        raise BadInput(f"{where}: {path}: {e}") from None


def cluster_from_dict(d: dict, what: str = "cluster") -> Cluster:
    """A Cluster from the plan's form (Cluster.to_dict): `gpu_spec` holds the GPU's figures
    (else the catalog's `gpu`); `gpu` and `gpu_memory_gib`, written for readers, must agree
    with it."""
    d = S.check(PLAN_CLUSTER, d, what)
    if "groups" in d:
        groups = tuple(cluster_from_dict(g, f"{what}: groups[{i}]")
                       for i, g in enumerate(d["groups"]))
        try:
            out = MixedCluster(name=d["name"], groups=groups, link_gbps=d.get("link_gbps"),
                               link_latency_us=d.get("link_latency_us"),
                               pipeline=tuple(d.get("pipeline", ())))
        except BadInput as e:
            raise BadInput(f"{what}: {e}") from None
        if d["num_gpus"] != out.num_gpus:
            raise BadInput(f"{what}: num_gpus {d['num_gpus']} is not what the groups hold "
                           f"({out.num_gpus})")
        return out
    if "gpu_spec" in d:
        gpu = gpu_from_json(d["gpu_spec"], what, "gpu_spec")
    elif "gpu" in d:
        gpu = gpu_from_json(d["gpu"], what, "gpu")
    else:
        raise BadInput(f"{what}: missing 'gpu_spec' (or a catalog 'gpu')")
    if "gpu_spec" in d and "gpu" in d and d["gpu"] != gpu.name:
        raise BadInput(f"{what}: gpu {S.show_path(d['gpu'])!r} is not gpu_spec's "
                       f"{gpu.name!r}; edit gpu_spec, the figures the planner uses")
    mem = d.get("gpu_memory_gib")
    if mem is not None and not math.isclose(mem, gpu.memory_gib, rel_tol=1e-9):
        raise BadInput(f"{what}: gpu_memory_gib {mem:g} differs from gpu_spec.memory_gib "
                       f"{gpu.memory_gib:g}; edit gpu_spec, the figures the planner uses")
    n = d["num_gpus"]
    gpn = d.get("gpus_per_node")
    try:       # plans written before nvlink_domain: the node is the NVLink domain
        return Cluster(name=d["name"], gpu=gpu, num_gpus=n,
                       gpus_per_node=min(8, n) if gpn is None else gpn,
                       nvlink_domain=d.get("nvlink_domain"))
    except BadInput as e:
        raise BadInput(f"{what}: {e}") from None
