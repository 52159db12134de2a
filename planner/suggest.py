"""What would fit when nothing does: relax one choice at a time and search again."""
from __future__ import annotations

import dataclasses

from planner.bounds import MAX_GPUS
from planner.errors import BadInput
from planner.explain import describe_candidate
from planner.cost.stage import capacity_bytes
from planner.engines import get_engine
from planner.search import Fixed, search, states_per_gpu_bound
from planner.specs import Cluster

MAX_DOUBLINGS = 8


def _fits(model, cluster, fixed, seq_len, gbs, engine, margin_gib):
    try:
        r = search(model, cluster, fixed, seq_len, gbs, top=1, engine=engine,
                   margin_gib=margin_gib, rejected=False)
    except BadInput:
        return None
    return r.best


def _more_gpus(cluster: Cluster, n: int) -> Cluster:
    """The cluster with n GPUs (a multiple of its count): hosts joined by NVLink (an NVL72
    rack) stay as they are, more of them; otherwise hosts of up to 8, each its NVLink domain."""
    if cluster.nvlink_domain > cluster.gpus_per_node:
        gpn, domain = cluster.gpus_per_node, cluster.nvlink_domain
    else:
        gpn = domain = max(cluster.gpus_per_node, min(8, n))
    return dataclasses.replace(cluster, name=f"{cluster.gpu.name}x{n}", num_gpus=n,
                               gpus_per_node=gpn, nvlink_domain=domain)


def _hopeless(model, cluster: Cluster, engine, margin_gib) -> bool:
    """Nothing can fit on this cluster: its GPUs cannot hold the model states even sharded
    over all of them (planner.search.states_per_gpu_bound), so no search is needed."""
    return (states_per_gpu_bound(model, get_engine(engine), cluster.num_gpus)
            > capacity_bytes(cluster, get_engine(engine), margin_gib) * (1 + 1e-9))


# the fields of Fixed that lay the model out (searched again by a tip); the others are the
# user's assumptions (kernels, precision, overlaps, MoE routing), which a tip keeps
LAYOUT_FIELDS = ("tp", "pp", "dp", "zero", "mbs", "vpp", "recompute", "recompute_modules", "sp",
                 "schedule", "ep", "etp", "cp", "cp_comm_type")


def _layout_free(fixed: Fixed, **keep) -> Fixed:
    """`fixed` with its layout searched again (and the given fields kept)."""
    return dataclasses.replace(fixed, **{**{k: None for k in LAYOUT_FIELDS}, **keep})


def suggestions(model, cluster: Cluster, fixed: Fixed, seq_len: int, gbs: int,
                engine=None, margin_gib=None) -> list:
    tips = []

    def fits(cl, f, s, g):
        if _hopeless(model, cl, engine, margin_gib):
            return None
        return _fits(model, cl, f, s, g, engine, margin_gib)

    # with recompute free the search has tried "full" already: searching again finds nothing new
    if fixed.recompute not in ("full", None) and (engine is None
                                                  or "full" in engine.recompute_modes):
        best = fits(cluster, dataclasses.replace(fixed, recompute=None if
                    fixed.recompute is None else "full", recompute_modules=None), seq_len, gbs)
        if best is not None:
            tips.append(f"--recompute full ({describe_candidate(best.candidate)})")
    if fixed.zero is not None and fixed.zero < 3:
        best = fits(cluster, dataclasses.replace(fixed, zero=None), seq_len, gbs)
        if best is not None:
            tips.append(f"ZeRO-{best.candidate.zero} ({describe_candidate(best.candidate)})")
    if any(getattr(fixed, k) is not None for k in ("tp", "pp", "dp", "mbs", "sp", "schedule", "vpp")):
        best = fits(cluster, _layout_free(fixed), seq_len, gbs)
        if best is not None:
            tips.append(f"another layout: {describe_candidate(best.candidate)}")
    if not tips:
        n = cluster.num_gpus
        for _ in range(MAX_DOUBLINGS):
            n *= 2
            if n > MAX_GPUS:            # planner.bounds: no cluster beyond it is planned
                break
            bigger = _more_gpus(cluster, n)
            g = max(gbs, n // 8) if gbs % (n // min(n, 8)) else gbs
            best = fits(bigger, _layout_free(fixed, recompute=fixed.recompute,
                                             recompute_modules=fixed.recompute_modules),
                        seq_len, g)
            if best is not None:
                tips.append(f"{n} GPUs ({describe_candidate(best.candidate)}, global batch {g})")
                break
    return tips
