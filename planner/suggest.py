"""What would fit when nothing does, and which fixed choices match no configuration: constraint
changes, as data (planner.cli words them).

`suggestions` relaxes one choice at a time and searches again: [Suggestion]. `no_configuration`
frees one fixed choice at a time and enumerates again: NoConfiguration.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from planner.limits import MAX_GPUS
from planner.catalog.systems import SYSTEMS
from planner.errors import BadInput, PlannerError
from planner.cost.stage import capacity_bytes
from planner.engines import engine_for, get_engine
from planner.search import (Fixed, Result, check_fixed, default_global_batch, default_seq_len,
                            enumerate_candidates, offload_overflow, search,
                            states_per_gpu_bound)
from planner.specs import Cluster

# GPU counts searched one by one (each not ruled out by the memory bound) before the rest
# are tried at doublings of a host only (_doubled_unit); a Suggestion says whether its count
# is proven the smallest
MAX_COUNTS_SEARCHED = 12


def _fits(model, cluster, fixed, seq_len, gbs, engine, margin_gib):
    try:
        r = search(model, cluster, fixed, seq_len, gbs, top=1, engine=engine,
                   margin_gib=margin_gib, rejected=False, find_closest=False)
    except BadInput:
        return None
    return r.best


def _domain(cluster: Cluster) -> int:
    """GPUs a full NVLink domain of the cluster's system holds: its own, or where its hosts
    share one larger than a host, the catalog system's (a gb200x8 is 8 GPUs of a 72-GPU
    rack: planner.catalog.systems.SYSTEMS)."""
    if cluster.nvlink_domain <= cluster.gpus_per_node:
        return cluster.nvlink_domain
    return max(cluster.nvlink_domain, SYSTEMS.get(cluster.gpu.name, (0, 0))[1])


def gpu_counts(cluster: Cluster):
    """The GPU counts above the cluster's, ascending, in the cluster's own node granularity:
    whole hosts of `gpus_per_node` (h100x16: 24, 32, ...; a 7-GPU host: 14, 21, ...), and
    where hosts share a larger NVLink domain (an NVL72 rack of 4-GPU trays) whole trays
    until the domain is full, whole domains beyond (planner.catalog.systems). A user adds
    whole hosts: 20 GPUs on 8-GPU hosts leave 4 of the third host idle and cost 24."""
    n, gpn, domain = cluster.num_gpus, cluster.gpus_per_node, _domain(cluster)
    if domain > gpn:
        k = n // gpn + 1
        while k * gpn <= domain:
            yield k * gpn
            k += 1
        step = domain
    else:
        step = gpn
    k = max(n, domain if domain > gpn else 0) // step + 1
    while k * step <= MAX_GPUS:             # planner.limits: no cluster beyond it is planned
        yield k * step
        k += 1


def _doubled_unit(cluster: Cluster, n: int) -> bool:
    """n GPUs are the cluster's unit doubled (a power of two times it): a host of
    `gpus_per_node`, or where hosts share a larger NVLink domain, a tray within it and a whole
    domain beyond it (gpu_counts). The sizes clusters come in, and where a power-of-two global
    batch splits evenly: doublings of some other count (102, 204, 408, ...) may miss every one
    of them, each count with no configuration at that batch."""
    gpn, domain = cluster.gpus_per_node, _domain(cluster)
    unit = domain if domain > gpn and n >= domain else gpn
    k, rest = divmod(n, unit)
    return rest == 0 and k & (k - 1) == 0


def _more_gpus(cluster: Cluster, n: int) -> Cluster:
    """The cluster with n GPUs (one of gpu_counts): more of the same hosts; hosts joined by
    NVLink (an NVL72 rack) fill their domain first, then more whole domains."""
    gpn, domain = cluster.gpus_per_node, _domain(cluster)
    if domain > gpn:
        domain = min(n, domain)
    return dataclasses.replace(cluster, name=f"{cluster.gpu.name}x{n}", num_gpus=n,
                               gpus_per_node=min(gpn, n), nvlink_domain=domain)


def _hopeless(model, cluster: Cluster, engine, margin_gib, fixed: Fixed | None = None) -> bool:
    """Nothing can fit on this cluster: its GPUs cannot hold the model states even sharded
    over all of them (planner.search.states_per_gpu_bound; less what the engine's offloads may
    move off them unless `fixed` keeps everything on the GPUs), so no search is needed."""
    offload = fixed is None or fixed.offload_optimizer != "none"
    return (states_per_gpu_bound(model, get_engine(engine), cluster.num_gpus, offload)
            > capacity_bytes(cluster, get_engine(engine), margin_gib) * (1 + 1e-9))


# the fields of Fixed that lay the model out (searched again by a tip); the others are the
# user's assumptions (kernels, precision, overlaps, MoE routing), which a tip keeps
LAYOUT_FIELDS = ("tp", "pp", "dp", "zero", "mbs", "vpp", "recompute", "recompute_modules", "sp",
                 "schedule", "ep", "etp", "cp", "cp_comm_type")


def _layout_free(fixed: Fixed, **keep) -> Fixed:
    """`fixed` with its layout searched again (and the given fields kept)."""
    return dataclasses.replace(fixed, **{**{k: None for k in LAYOUT_FIELDS}, **keep})


@dataclass
class Suggestion:
    """A change of the constraints under which the model fits: `change` says which ("recompute":
    full recompute; "zero": the ZeRO stage searched; "layout": the layout searched again;
    "gpus": a larger cluster), `fixed` the constraints searched (`delta`: the fields changed
    from the user's), `best` the best plan found under them on `num_gpus` GPUs with global
    batch `global_batch`. `minimal` (a "gpus" tip): every smaller count of gpu_counts was
    searched or ruled out by the memory bound, so none fits."""
    change: str
    fixed: Fixed
    delta: dict
    best: Result
    num_gpus: int
    global_batch: int
    minimal: bool = True
    gpus_per_node: int = 0

    @property
    def step_time_s(self) -> float:
        return self.best.estimate.step_time_s


def _delta(before: Fixed, after: Fixed) -> dict:
    return {f.name: getattr(after, f.name) for f in dataclasses.fields(Fixed)
            if getattr(after, f.name) != getattr(before, f.name)}


def suggestions(model, cluster: Cluster, fixed: Fixed, seq_len: int, gbs: int,
                engine=None, margin_gib=None) -> list:
    """[Suggestion], the changes on the given GPUs first, smallest change first: a fixed
    recompute made full, a fixed ZeRO stage searched, a fixed layout searched again; when none
    of those fits, the smallest GPU count of gpu_counts that fits (counts whose GPUs cannot
    hold the model states, states_per_gpu_bound, are skipped unsearched)."""
    tips = []

    def tip(change, f, best, n=cluster.num_gpus, g=gbs, minimal=True,
            gpn=cluster.gpus_per_node):
        tips.append(Suggestion(change=change, fixed=f, delta=_delta(fixed, f), best=best,
                               num_gpus=n, global_batch=g, minimal=minimal,
                               gpus_per_node=gpn))

    def fits(cl, f, s, g):
        if _hopeless(model, cl, engine, margin_gib, fixed):
            return None
        return _fits(model, cl, f, s, g, engine, margin_gib)

    # with recompute free the search has tried "full" already: searching again finds nothing new
    if fixed.recompute not in ("full", None) and (engine is None
                                                  or "full" in engine.recompute_modes):
        f = dataclasses.replace(fixed, recompute=None if fixed.recompute is None else "full",
                                recompute_modules=None)
        best = fits(cluster, f, seq_len, gbs)
        if best is not None:
            tip("recompute", f, best)
    if fixed.zero is not None and fixed.zero < 3:
        f = dataclasses.replace(fixed, zero=None)
        best = fits(cluster, f, seq_len, gbs)
        if best is not None:
            tip("zero", f, best)
    if any(getattr(fixed, k) is not None for k in ("tp", "pp", "dp", "mbs", "sp", "schedule", "vpp")):
        f = _layout_free(fixed)
        best = fits(cluster, f, seq_len, gbs)
        if best is not None:
            tip("layout", f, best)
    if not tips:
        f = _layout_free(fixed, recompute=fixed.recompute,
                         recompute_modules=fixed.recompute_modules)
        searched = 0
        for n in gpu_counts(cluster):
            bigger = _more_gpus(cluster, n)
            if _hopeless(model, bigger, engine, margin_gib, fixed):
                continue            # a sound bound: no layout on n GPUs holds the model states
            if searched >= MAX_COUNTS_SEARCHED and not _doubled_unit(cluster, n):
                continue            # past the one-by-one budget: doublings of a host only
            g = max(gbs, n // 8) if gbs % (n // min(n, 8)) else gbs
            best = _fits(model, bigger, f, seq_len, g, engine, margin_gib)
            searched += 1
            if best is not None:
                tip("gpus", f, best, n, g, minimal=searched <= MAX_COUNTS_SEARCHED,
                    gpn=bigger.gpus_per_node)
                break
    return tips


# ---- fixed choices that match no configuration -------------------------------------------

# the fixed choices a NoConfiguration may name, in the order it names them
CHOICES = ("tp", "pp", "dp", "mbs", "vpp", "zero", "sp", "schedule", "recompute", "dp_shard")


@dataclass
class NoConfiguration:
    """No configuration of `num_gpus` GPUs matches `fixed` with `global_batch`; `culprits`: the
    fixed choices (fields of Fixed, in CHOICES order) that, set free, would give some."""
    num_gpus: int
    global_batch: int
    fixed: Fixed
    culprits: tuple


def no_configuration(model, cluster: Cluster, fixed: Fixed, seq_len: int, global_batch: int,
                     engine=None) -> NoConfiguration:
    """The fixed choices whose freeing gives some configuration."""
    culprits = tuple(
        name for name in CHOICES if getattr(fixed, name) is not None
        and enumerate_candidates(model, cluster, dataclasses.replace(fixed, **{name: None}),
                                 seq_len, global_batch, engine))
    return NoConfiguration(num_gpus=cluster.num_gpus, global_batch=global_batch, fixed=fixed,
                           culprits=culprits)


def diagnose_no_configuration(model, cluster: Cluster, fixed: Fixed, seq_len, global_batch,
                              engine=None) -> NoConfiguration | None:
    """no_configuration when the fixed choices pass the search's own checks
    (planner.search.check_fixed, whose messages are precise) but match no configuration;
    else None. Default sequence length and global batch as the search takes them."""
    engine = engine_for(engine, fixed.compile)       # as the search prices it
    s = seq_len or default_seq_len(model)
    g = global_batch or default_global_batch(s, cluster.num_gpus)
    try:
        check_fixed(model, cluster, fixed, s, g, engine)
        if enumerate_candidates(model, cluster, fixed, s, g, engine):
            return None
    except PlannerError:
        return None
    overflow = offload_overflow(model, cluster, fixed, s, g, get_engine(engine))
    if overflow:   # the fixed offload is what no layout holds: bad input, said as it is
        raise BadInput(overflow)
    return no_configuration(model, cluster, fixed, s, g, engine)
