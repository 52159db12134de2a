"""Context parallelism: the K/V exchange of one layer and the buffers it keeps.

cp ranks share each sequence, s/cp tokens each in the zigzag layout (2*cp chunks, rank i holds
chunks i and 2*cp-1-i; planner.cost.compute.layer_time), so every linear, norm and saved
activation is per s/cp tokens and each rank does 1/cp of the causal attention. What attention
needs from the other ranks is exchanged one of three ways (Megatron-LM `--cp-comm-type`,
megatron/training/arguments.py; implemented by Transformer Engine,
transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py):

* "p2p" -- ring attention (AttnFuncWithCPAndKVP2P): cp steps, each computing attention against
  the K,V chunk in hand while sending it to the next rank and receiving the previous one's
  (cp - 1 sends of a rank's K,V); the backward also passes dK,dV around the ring (twice the
  bytes). Each send overlaps the attention of the current step: exposed is what sticks out.
* "all_gather" (AttnFuncWithCPAndKVAllGather): K,V all-gathered before attention and, in the
  backward, gathered again with dK,dV reduce-scattered; not overlapped (Megatron-LM's help:
  "the all-gather is not async, and cannot be overlapped").
* "a2a" -- DeepSpeed-Ulysses (Jacobs et al. 2023; AttnFuncWithCPAndQKVOA2A): Q,K,V all-to-all
  from sequence shards to head shards before attention, O back after; the reverse in the
  backward (dO, then dQ,dK,dV). Not overlapped. Needs the KV heads of a TP rank divisible by cp
  (planner.rules.cp_a2a_ok).

torchtitan runs PyTorch's context_parallel (torch/distributed/tensor/experimental/_attention.py)
with `context_parallel_rotate_method` "allgather" (_AllGatherRotater: K,V gathered, then
attended chunk by chunk) or "alltoall" (_AllToAllRotater: the ring shift done as an
all_to_all_single each step): priced as "all_gather" and "p2p" (planner.engines.torchtitan).
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.cost import comm
from planner.cost.compute import ATTN_BWD_FACTOR, BF16
from planner.vocab import CP_COMM_TYPES


@dataclass(frozen=True)
class CpExchange:
    """One layer, one micro-batch, one CP rank: seconds the exchange adds to the forward and
    to the backward (exposed), and bytes of the buffers it keeps while the layer computes."""
    fwd: float
    bwd: float
    buffer_bytes: float


def cp_exchange(model, b: int, s: int, tp: int, cp: int, kind: str, cluster,
                attn_fwd: float) -> CpExchange:
    """`attn_fwd`: this rank's attention forward seconds (1/cp of the causal attention),
    what the ring's sends hide behind. The cp group: cp ranks tp apart (planner.cost.comm)."""
    if cp <= 1:
        return CpExchange(0.0, 0.0, 0.0)
    link = comm.group_link(cluster, cp, tp)
    local = b * s / cp                                   # tokens of this rank
    kv_local = BF16 * local * (model.kv_dim + model.value_dim) / tp   # its K and V (TP shard)
    if kind == "p2p":
        # per step the attention of one of the cp chunk pairs: attn / cp
        step_f, step_b = attn_fwd / cp, ATTN_BWD_FACTOR * attn_fwd / cp
        send_f = comm.p2p(kv_local, link)
        send_b = comm.p2p(2 * kv_local, link)           # K,V and dK,dV
        fwd = (cp - 1) * max(0.0, send_f - step_f)
        bwd = (cp - 1) * max(0.0, send_b - step_b)
        # the K,V chunk in hand and the one arriving (TE's two p2p_comm_buffers); in the
        # backward also the dK,dV chunk in hand and the one in flight: 4 chunks at the peak
        return CpExchange(fwd, bwd, 4 * kv_local)
    if kind == "all_gather":
        full = kv_local * cp
        fwd = comm.all_gather(full, cp, link)
        bwd = comm.all_gather(full, cp, link) + comm.reduce_scatter(full, cp, link)
        return CpExchange(fwd, bwd, 2 * full)          # gathered K,V and their gradients
    if kind == "a2a":
        qkvo = BF16 * local * (model.q_dim + model.kv_dim + model.value_dim
                               + model.attn_out_dim) / tp     # Q, K, V and O of this rank
        fwd = comm.all_to_all(qkvo, cp, cluster, stride=tp)
        bwd = comm.all_to_all(qkvo, cp, cluster, stride=tp)
        return CpExchange(fwd, bwd, qkvo)              # the head-sharded copies
    raise ValueError(f"unknown cp comm type {kind!r}; known: {', '.join(CP_COMM_TYPES)}")
