"""Collectives and point-to-point under an alpha-beta model, per link class.

Bandwidths follow the nccl-tests conventions (NVIDIA nccl-tests, doc/PERFORMANCE.md): a
collective over n ranks moving S bytes takes  S * factor / busbw  with factor 2(n-1)/n for
all-reduce and (n-1)/n for all-gather and reduce-scatter (S = the full, unsharded size).

Rank placement is topology-aware: ranks are laid out with tp innermost, then dp, then pp
(planner.plan.RANK_ORDER), so a group of `size` ranks `stride` apart sits inside one node when
size * stride <= gpus_per_node.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from planner.specs import Cluster


@dataclass(frozen=True)
class Link:
    busbw_gbps: float   # collective bus bandwidth
    p2p_gbps: float     # point-to-point, one direction
    latency_s: float    # per hop


def group_link(cluster: Cluster, size: int, stride: int) -> Link:
    """The link class a group of `size` ranks, `stride` apart, communicates over."""
    gpu, g = cluster.gpu, cluster.gpus_per_node
    intra = Link(gpu.nvlink_busbw_gbps, gpu.nvlink_p2p_gbps, gpu.nvlink_latency_us * 1e-6)
    if size <= 1 or size * stride <= g:
        return intra
    # Across nodes: with one NIC per GPU (rail-optimised fabric) the k group members of a node
    # drive k NICs at once, so the ring's inter-node hop carries k NICs' worth of bandwidth
    # (hierarchical/ring NCCL algorithms; Jeaugey, "Massively Scale Your Deep Learning Training
    # with NCCL 2.4", 2019). The node's NVLink caps it.
    per_node = max(1, min(size, g // stride)) if stride < g else 1
    bw = min(gpu.nvlink_busbw_gbps, per_node * gpu.internode_gbps_per_gpu)
    return Link(bw, gpu.internode_gbps_per_gpu, gpu.internode_latency_us * 1e-6)


def _tree_latency(link: Link, n: int) -> float:
    # All-reduce: NCCL's double binary tree reaches every rank in ~log2(n) hops, up and down
    # (Jeaugey, "Massively Scale Your Deep Learning Training with NCCL 2.4", 2019).
    return 2 * link.latency_s * math.ceil(math.log2(n))


def _ring_latency(link: Link, n: int) -> float:
    # All-gather and reduce-scatter run as rings in NCCL (its tree algorithm serves only
    # all-reduce; NCCL docs, NCCL_ALGO): n - 1 steps, each a hop.
    return link.latency_s * (n - 1)


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
