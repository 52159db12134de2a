"""Pipeline schedules: step time from per-stage times, and micro-batches in flight per stage.

Step time. With stage times T_s for one micro-batch (forward + backward, all of a rank's
chunks), m micro-batches and v chunks per rank:

    step = m * max(T) + (sum(T) - max(T)) / v

For equal stages this is (m + (p - 1) / v) * T: the bubble fraction (p - 1) / (v * m) of
Narayanan et al. 2021 (Sec. 2.2, eqs. for 1F1B and interleaved). For v = 1 it is the usual
"sum of stage times plus (m - 1) times the slowest" of an uneven 1F1B/GPipe pipeline.
"""
from __future__ import annotations


def pipeline_time(stage_times, m: int, v: int = 1) -> tuple:
    """(step seconds, bubble seconds) for one pass over m micro-batches."""
    tmax = max(stage_times)
    bubble = (sum(stage_times) - tmax) / v
    return m * tmax + bubble, bubble


def in_flight(schedule: str, p: int, rank: int, m: int, v: int = 1,
              ep_overlap: bool = False) -> float:
    """Micro-batches whose activations pipeline rank `rank` holds at its peak.

    In units of one micro-batch through all of the rank's layers.
    - gpipe: all m forwards before any backward.
    - 1f1b: p - rank warm-up forwards (Narayanan et al. 2021, Sec. 2.2.1), at most m.
    - interleaved: Megatron-LM's warm-up count (p - rank - 1) * 2 + (v - 1) * p, plus the one
      in steady state, in chunk-micro-batches, each 1/v of the rank's layers
      (megatron/core/pipeline_parallel/schedules.py, forward_backward_pipelining_with_interleaving).
    `ep_overlap` (Megatron-Core's EP all-to-all overlap, combined 1F1B): a micro-batch's
    forward runs while the previous one's activations still wait for their backward, so one
    more is held: the interleaved warm-up gains one (schedules.py: "if
    overlap_moe_expert_parallel_comm: num_warmup_microbatches += 1"), and without pipelining
    two are in flight instead of one.
    """
    extra = 1 if ep_overlap else 0
    if p == 1:
        return float(min(1 + extra, m))
    if schedule == "gpipe":
        return float(m)
    if schedule == "1f1b":
        return float(min(p - rank, m))
    if schedule == "interleaved":
        chunks = min((p - rank - 1) * 2 + (v - 1) * p + 1 + extra, m * v)
        return chunks / v
    raise ValueError(schedule)
