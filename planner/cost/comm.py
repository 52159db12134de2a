"""Collectives and point-to-point under an alpha-beta model, per link class.

Bandwidths follow the nccl-tests conventions (NVIDIA nccl-tests, doc/PERFORMANCE.md): a
collective over n ranks moving S bytes takes  S * factor / busbw  with factor 2(n-1)/n for
all-reduce and (n-1)/n for all-gather and reduce-scatter (S = the full, unsharded size).

Rank placement is topology-aware: ranks are laid out with tp innermost, then cp, then dp, then
pp (planner.plan.RANK_ORDER; Megatron-Core's order "tp-cp-ep-dp-pp",
megatron/core/parallel_state.py initialize_model_parallel), so a tp group has stride 1, a cp
group stride tp, a dp group stride tp*cp (the gradient group dp*cp, stride tp, spans both) and
a pp group stride tp*cp*dp. A group of `size` ranks `stride` apart spans a block of
size * stride consecutive ranks, and these blocks tile the ranks. Every group sits inside one
NVLink domain (`Cluster.nvlink_domain`: a host, or an NVL72 rack of 18 four-GPU hosts) when
its block does and the blocks do not straddle domains: size * stride divides the domain.
"""
from __future__ import annotations

import functools

import math
from dataclasses import dataclass

from planner.specs import Cluster


@dataclass(frozen=True)
class Link:
    busbw_gbps: float   # collective bus bandwidth
    p2p_gbps: float     # point-to-point, one direction
    latency_s: float    # per hop (across domains: per hop between two domains)
    # inside one NVLink domain (what an all-to-all's bandwidth and a collective's hop count
    # depend on)
    intra: bool = True
    # across domains: the group's members per domain, and the latency of a hop between two
    # of them (over NVLink): a ring's hops inside a domain are NVLink hops
    per_domain: int = 1
    intra_latency_s: float = 0.0


@functools.lru_cache(maxsize=4096)
def group_link(cluster: Cluster, size: int, stride: int) -> Link:
    """The link class a group of `size` ranks, `stride` apart, communicates over."""
    gpu, d = cluster.gpu, cluster.nvlink_domain
    intra = Link(gpu.nvlink_busbw_gbps, gpu.nvlink_p2p_gbps, gpu.nvlink_latency_us * 1e-6)
    span = size * stride
    if size <= 1 or (span <= d and d % span == 0):
        return intra        # NVLink, across the hosts of an NVL72 rack too
    # Across domains: with one NIC per GPU (rail-optimised fabric) the k group members of a
    # domain drive k NICs at once, so the ring's inter-domain hop carries k NICs' worth of
    # bandwidth (hierarchical/ring NCCL algorithms; Jeaugey, "Massively Scale Your Deep Learning
    # Training with NCCL 2.4", 2019). NVLink caps it. A domain holds at least gcd(span, d)
    # consecutive ranks of a group's block (all d when blocks are whole domains; fewer where a
    # block straddles two, e.g. 16-rank blocks on 72-GPU domains), so k is that many ranks'
    # members: the fewest, which the slowest group has.
    per_domain = max(1, min(size, math.gcd(span, d) // stride))
    bw = min(gpu.nvlink_busbw_gbps, per_domain * gpu.internode_gbps_per_gpu)
    return Link(bw, gpu.internode_gbps_per_gpu, gpu.internode_latency_us * 1e-6, intra=False,
                per_domain=per_domain, intra_latency_s=gpu.nvlink_latency_us * 1e-6)


# Latency of a collective over n ranks spanning N NVLink domains, its hops split as NCCL's own
# cost model splits them (NVIDIA/nccl src/graph/tuning.cc ncclTopoTuneModel, @5067397c): a ring
# of n ranks on N nodes takes n - 1 steps, of which N - 1 cross the network at the network
# latency and the rest stay inside a node at the intra-node one; the double binary tree
# log2(N) network hops each way and the hops inside a node beside them. Inside a domain the
# tree's hops are counted as for a group inside one domain (log2 of its members, the count the
# catalog's and the profiler's NVLink latency per hop go with), so a group one rank past a
# domain adds network hops, not a chain of NVLink ones. N: the domains the group spans at
# `per_domain` members each (the fewest any domain holds, so N is at least the count).
def _domains(link: Link, n: int) -> int:
    return 1 if link.intra else max(1, math.ceil(n / link.per_domain))


def tree_hops(n: int) -> int:
    """Hops of an all-reduce over n ranks of one link class: NCCL's double binary tree reaches
    every rank in ~log2(n) hops, up and down (Jeaugey, "Massively Scale Your Deep Learning
    Training with NCCL 2.4", 2019)."""
    return 2 * math.ceil(math.log2(n)) if n > 1 else 0


def ring_hops(n: int) -> int:
    """Hops of an all-gather or reduce-scatter over n ranks: NCCL runs them as rings (its tree
    algorithm serves only all-reduce; NCCL docs, NCCL_ALGO), n - 1 steps."""
    return max(0, n - 1)


def _tree_latency(link: Link, n: int) -> float:
    if link.intra:
        return tree_hops(n) * link.latency_s
    return (tree_hops(link.per_domain) * link.intra_latency_s
            + tree_hops(_domains(link, n)) * link.latency_s)


def _ring_latency(link: Link, n: int) -> float:
    # across domains the hops between two domains at the network latency, the others over
    # NVLink
    if link.intra:
        return ring_hops(n) * link.latency_s
    inter = _domains(link, n) - 1
    return inter * link.latency_s + (ring_hops(n) - inter) * link.intra_latency_s


def all_reduce(nbytes: float, n: int, link: Link) -> float:
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (n - 1) / n * nbytes / (link.busbw_gbps * 1e9) + _tree_latency(link, n)


def all_gather(nbytes: float, n: int, link: Link) -> float:
    """`nbytes` is the gathered (full) size."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) / n * nbytes / (link.busbw_gbps * 1e9) + _ring_latency(link, n)


reduce_scatter = all_gather   # same volume and steps, the other direction


def p2p(nbytes: float, link: Link) -> float:
    if nbytes <= 0:
        return 0.0
    return nbytes / (link.p2p_gbps * 1e9) + link.latency_s


def all_to_all(nbytes: float, n: int, cluster: Cluster, stride: int = 1) -> float:
    """All-to-all over n ranks `stride` apart, each sending `nbytes` in total (n slices, one
    staying local). nccl-tests (doc/PERFORMANCE.md, alltoall): busbw = algbw * (n-1)/n, so a
    rank moves (n-1)/n of its data. Inside one NVLink domain every slice goes over NVLink at
    the point-to-point bandwidth; across domains a rank's slices to the k-1 other members of its
    domain go over NVLink and the (n-k)/n to other domains over its own NIC, concurrently: the
    slower share sets the time. NCCL issues the n-1 sends as one group (ncclGroupStart/End), so
    latency is paid about once per peer class, not per peer."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    gpu, d = cluster.gpu, cluster.nvlink_domain
    span = n * stride
    if span <= d and d % span == 0:
        return (n - 1) / n * nbytes / (gpu.nvlink_p2p_gbps * 1e9) + gpu.nvlink_latency_us * 1e-6
    k = max(1, min(n, math.gcd(span, d) // stride))   # group members sharing a domain
    intra = (k - 1) / n * nbytes / (gpu.nvlink_p2p_gbps * 1e9)
    inter = (n - k) / n * nbytes / (gpu.internode_gbps_per_gpu * 1e9)
    return max(intra, inter) + gpu.internode_latency_us * 1e-6
