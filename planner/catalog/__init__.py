"""Look up models, GPUs and clusters by name (or by file path)."""
import os
import re

from planner.bounds import MAX_GPUS
from planner.catalog.gpus import GPU_ALIASES, GPUS
from planner.catalog.models import ALIASES, MODELS
from planner.errors import BadInput
from planner.schema import MAX_NAME, bad_name_reason, show
from planner.specs import Cluster, Gpu, Model, load_cluster_file, load_model_file


def _is_path(s: str) -> bool:
    try:
        return s.endswith(".json") or os.sep in s or os.path.exists(s)
    except (ValueError, OSError):       # an embedded NUL, a name too long for the OS
        return False


def _check_arg(name, what: str) -> None:
    """A name or path from the command line: a string without control characters (its length
    is not limited here: a long path is a path, a long name is unknown)."""
    if not isinstance(name, str):
        raise BadInput(f"{what} must be a string, got {show(name)}")
    why = bad_name_reason(name[:MAX_NAME]) if name.strip() else "must not be empty"
    if why:
        raise BadInput(f"{what} {show(name)}: {why}" if "control" not in why else
                       f"{what} must not contain control characters (got {show(name)})")


def get_model(name: str) -> Model:
    """A catalog name or alias, or a path to a Hugging Face config.json."""
    _check_arg(name, "--model")
    if _is_path(name):
        return load_model_file(name)
    key = ALIASES.get(name.lower(), name.lower())
    if key not in MODELS:
        known = ", ".join(list(MODELS) + list(ALIASES))
        raise BadInput(f"unknown model {name[:80]!r}; known: {known} (or a path to a config.json)")
    return MODELS[key]


def get_gpu(name: str) -> Gpu:
    if not isinstance(name, str):
        raise BadInput(f"a GPU name must be a string, got {show(name)}")
    key = GPU_ALIASES.get(name.lower(), name.lower())
    if key not in GPUS:
        raise BadInput(f"unknown GPU {name[:60]!r}; known: {', '.join(GPUS)}")
    return GPUS[key]


def get_cluster(name: str) -> Cluster:
    """`<gpu>x<count>` (8 GPUs per node), or a path to a cluster JSON."""
    _check_arg(name, "--cluster")
    if _is_path(name):
        return load_cluster_file(name)
    m = re.fullmatch(r"([a-z0-9\-]+?)x([0-9]+)", name.lower())
    if not m:
        raise BadInput(f"unknown cluster {name[:80]!r}; write <gpu>x<count> with gpu in "
                       f"{', '.join(GPUS)} (e.g. h100x32), or a path to a cluster JSON")
    gpu = get_gpu(m.group(1))
    digits = m.group(2).lstrip("0") or "0"
    # the count is compared as digits first: no int() of a 5000-digit number, no loop over it
    if len(digits) > len(str(MAX_GPUS)) or int(digits) > MAX_GPUS:
        shown = digits if len(digits) <= 20 else f"a {len(digits)}-digit number of"
        raise BadInput(f"cluster {name[:40]!r}: {shown} GPUs is more than this planner plans "
                       f"for (at most {MAX_GPUS})")
    count = int(digits)
    if count <= 0:
        raise BadInput(f"cluster {name!r}: the GPU count must be positive")
    return Cluster(name=name.lower(), gpu=gpu, num_gpus=count, gpus_per_node=min(8, count))
