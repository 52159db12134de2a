"""Look up models, GPUs and clusters by name (or by file path).

gpus.py     catalog GPUs (figures cited) and `get_gpu`     models.py  catalog models
systems.py  how a catalog GPU's hosts and NVLink domains are built
files.py    model, cluster and GPU files (and a plan's cluster) read into planner.specs types
hf/         Hugging Face config.json readers, one module per model family
"""
import difflib
import os
import re

from planner.limits import MAX_GPUS
from planner.catalog.files import load_cluster_file, load_model_file
from planner.catalog.gpus import GPUS, get_gpu
from planner.catalog.models import ALIASES, MODELS
from planner.catalog.systems import HOST_GPUS, SYSTEMS, host_size, system_layout  # noqa: F401
from planner.errors import BadInput
from planner.filecheck import MAX_NAME, bad_name_reason, show
from planner.specs import Cluster, Model


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


def did_you_mean(name: str, known) -> str:
    """ "did you mean X?" for the known names closest to `name` (difflib), else ""."""
    close = difflib.get_close_matches(name.lower()[:MAX_NAME], list(known), n=3, cutoff=0.6)
    return f"did you mean {' or '.join(close)}? " if close else ""


def get_model(name: str) -> Model:
    """A catalog name or alias, or a path to a Hugging Face config.json (or its model
    directory)."""
    _check_arg(name, "--model")
    if _is_path(name):
        return load_model_file(name)
    key = ALIASES.get(name.lower(), name.lower())
    if key not in MODELS:
        known = ", ".join(list(MODELS) + list(ALIASES))
        hint = did_you_mean(name, list(MODELS) + list(ALIASES))
        raise BadInput(f"unknown model {name[:80]!r}; {hint}known: {known} (or a path to a "
                       f"config.json or a model directory)")
    return MODELS[key]


def model_table() -> str:
    """The catalog's models, one a line: total and active (per token) parameters of the main
    model, layers (and MTP modules), experts and top-k; aliases after."""
    rows = [("model", "total", "active", "layers", "experts")]
    for m in MODELS.values():
        experts = (f"{m.num_experts} top-{m.experts_per_token}, {m.num_moe_layers} MoE layers"
                   if m.is_moe else "dense")
        mtp = (f" +{m.mtp_layers} MTP ({m.mtp_params() / 1e9:.2f}B)" if m.mtp_layers else "")
        rows.append((m.name, f"{(m.num_params() - m.mtp_params()) / 1e9:.2f}B",
                     f"{(m.active_params() - m.mtp_active_params()) / 1e9:.2f}B",
                     str(m.num_layers) + mtp, experts))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r[:4], widths))) + "  " + r[4]
             for r in rows]
    lines.append("aliases: " + ", ".join(f"{a} = {t}" for a, t in ALIASES.items()))
    lines.append("total and active (what one token runs through) count the embedding and "
                 "the head, not the MTP modules (shown beside the layers)")
    return "\n".join(lines) + "\n"


def get_cluster(name: str) -> Cluster:
    """`<gpu>x<count>` (as the GPU's catalog system builds it: SYSTEMS), or a path to a
    cluster JSON."""
    _check_arg(name, "--cluster")
    if _is_path(name):
        return load_cluster_file(name)
    m = re.fullmatch(r"([a-z0-9\-]+?)x([0-9]+)", name.lower())
    if not m:
        close = difflib.get_close_matches(name.lower()[:MAX_NAME], list(GPUS), n=3,
                                          cutoff=0.6)
        hint = f"did you mean {' or '.join(g + 'x<count>' for g in close)}? " if close else ""
        raise BadInput(f"unknown cluster {name[:80]!r}; {hint}write <gpu>x<count> with gpu in "
                       f"{', '.join(GPUS)} (e.g. h100x32), or a path to a cluster JSON")
    try:
        gpu = get_gpu(m.group(1))
    except BadInput:
        close = [f"{g}x{m.group(2)}" for g in difflib.get_close_matches(
            m.group(1)[:MAX_NAME], list(GPUS), n=3, cutoff=0.6)]
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise BadInput(f"unknown GPU {m.group(1)[:60]!r} in cluster {name[:80]!r}; {hint}"
                       f"known GPUs: {', '.join(GPUS)}") from None
    digits = m.group(2).lstrip("0") or "0"
    # the count is compared as digits first: no int() of a 5000-digit number, no loop over it
    if len(digits) > len(str(MAX_GPUS)) or int(digits) > MAX_GPUS:
        shown = digits if len(digits) <= 20 else f"a {len(digits)}-digit number of"
        raise BadInput(f"cluster {name[:40]!r}: {shown} GPUs is more than this planner plans "
                       f"for (at most {MAX_GPUS})")
    count = int(digits)
    if count <= 0:
        raise BadInput(f"cluster {name!r}: the GPU count must be positive")
    try:
        gpn, domain = system_layout(gpu.name, count)
    except BadInput as e:
        raise BadInput(f"cluster {name[:40]!r}: {e}") from None
    return Cluster(name=name.lower(), gpu=gpu, num_gpus=count, gpus_per_node=gpn,
                   nvlink_domain=domain)
