"""Look up models, GPUs and clusters by name (or by file path)."""
import os
import re

from planner.catalog.gpus import GPU_ALIASES, GPUS
from planner.catalog.models import ALIASES, MODELS
from planner.errors import BadInput
from planner.specs import Cluster, Gpu, Model, load_cluster_file, load_model_file


def _is_path(s: str) -> bool:
    return s.endswith(".json") or os.sep in s or os.path.exists(s)


def get_model(name: str) -> Model:
    """A catalog name or alias, or a path to a Hugging Face config.json."""
    if _is_path(name):
        return load_model_file(name)
    key = ALIASES.get(name.lower(), name.lower())
    if key not in MODELS:
        known = ", ".join(list(MODELS) + list(ALIASES))
        raise BadInput(f"unknown model {name!r}; known: {known} (or a path to a config.json)")
    return MODELS[key]


def get_gpu(name: str) -> Gpu:
    key = GPU_ALIASES.get(name.lower(), name.lower())
    if key not in GPUS:
        raise BadInput(f"unknown GPU {name!r}; known: {', '.join(GPUS)}")
    return GPUS[key]


def get_cluster(name: str) -> Cluster:
    """`<gpu>x<count>` (8 GPUs per node), or a path to a cluster JSON."""
    if _is_path(name):
        return load_cluster_file(name)
    m = re.fullmatch(r"([a-z0-9\-]+?)x(\d+)", name.lower())
    if not m:
        raise BadInput(f"unknown cluster {name!r}; write <gpu>x<count> with gpu in "
                       f"{', '.join(GPUS)} (e.g. h100x32), or a path to a cluster JSON")
    gpu = get_gpu(m.group(1))
    count = int(m.group(2))
    if count <= 0:
        raise BadInput(f"cluster {name!r}: the GPU count must be positive")
    return Cluster(name=name.lower(), gpu=gpu, num_gpus=count, gpus_per_node=min(8, count))
