"""The layer layout: decoder layers over pipeline ranks and their model chunks.

`stages` of a plan list the pp * vpp virtual stages in model order; virtual stage i runs on
pipeline rank `pp_rank = i % pp` as its chunk `i // pp` (Megatron's interleaved assignment);
under the V-shaped schedules (zbv, dualpipev) stage i >= pp runs on rank 2 pp - 1 - i.
Each rank's layers are split evenly over its chunks, and so are its recomputed layers; a stage
recomputes its first `recompute_layers`. This module imports nothing of the planner's but its
errors: the plan, the search and the cost model all lay layers out through it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from planner.errors import BadInput


@dataclass
class Stage:
    index: int
    pp_rank: int
    chunk: int
    layers: tuple          # [first, end)
    recompute_layers: int
    memory_gib: dict = field(default_factory=dict)

    @property
    def num_layers(self) -> int:
        return self.layers[1] - self.layers[0]


def even_split(total: int, parts: int) -> list:
    """`total` items over `parts` as evenly as possible, the larger shares last: the even
    split of layers over pipeline ranks (`even_split(num_layers, pp)`), of a rank's layers
    over its chunks, of a rank's recomputed layers over its chunks."""
    base, extra = divmod(total, parts)
    return [base + (1 if i >= parts - extra else 0) for i in range(parts)]


def split_count(total: int, least: list) -> int:
    """How many ways `total` layers split over len(least) ranks, rank i holding at least
    least[i]: the compositions of total - sum(least) into len(least) parts (stars and bars)."""
    free = total - sum(least)
    return math.comb(free + len(least) - 1, len(least) - 1) if free >= 0 else 0


def splits(total: int, least: list, most: list | None = None):
    """Every split of `total` layers over len(least) ranks, rank i holding least[i] to most[i]
    (at most `total` where `most` is None), in lexicographic order."""
    p = len(least)
    most = [total] * p if most is None else [min(total, x) for x in most]
    # the most the ranks after i can take, for pruning
    room = [sum(most[i:]) for i in range(p)] + [0]
    need = [sum(least[i:]) for i in range(p)] + [0]

    def rest(i, left):
        if i == p - 1:
            if least[i] <= left <= most[i]:
                yield [left]
            return
        for n in range(max(least[i], left - room[i + 1]), min(most[i], left - need[i + 1]) + 1):
            for tail in rest(i + 1, left - n):
                yield [n] + tail
    yield from rest(0, total)


def make_stages(num_layers: int, pp: int, vpp: int = 1, layers_per_rank=None,
                recompute_per_rank=None, v_shape: bool = False) -> list:
    """Stages in model order from per-rank layer and recompute counts.

    Each rank's layers are split evenly over its `vpp` chunks (virtual stage i = chunk * pp + rank),
    and so are its recomputed layers. `v_shape` (the zbv and dualpipev schedules, vpp 2): stage
    i < pp on rank i, stage i >= pp on rank 2 pp - 1 - i (torch.distributed.pipelining's
    "v" stage-to-rank mapping), so rank 0 holds the first and the last stage.
    """
    counts = list(layers_per_rank) if layers_per_rank is not None else even_split(num_layers, pp)
    recompute = list(recompute_per_rank) if recompute_per_rank is not None else [0] * pp
    if len(counts) != pp or sum(counts) != num_layers:
        raise BadInput(f"layer counts {counts} do not split {num_layers} layers over {pp} stages")
    chunk_layers = [even_split(c, vpp) for c in counts]
    chunk_recompute = [even_split(r, vpp) for r in recompute]
    stages, first = [], 0
    for i in range(pp * vpp):
        rank, chunk = i % pp, i // pp
        if v_shape and chunk == 1:
            rank = 2 * pp - 1 - i
        n = chunk_layers[rank][chunk]
        r = min(chunk_recompute[rank][chunk], n)
        stages.append(Stage(index=i, pp_rank=rank, chunk=chunk, layers=(first, first + n),
                            recompute_layers=r))
        first += n
    return stages
