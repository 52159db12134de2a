"""Can an engine run a plan exactly as it was priced? The rules are planner.rules's
(`runner_problems`: the engine it was priced for, then what the engine spec says it runs);
this module keeps the old entry point and the exporters' per-chunk recompute count.
"""
from __future__ import annotations

from planner.engines.spec import Engine
from planner.rules import runner_problems


def problems(plan, engine: Engine) -> list:
    """What of `plan` the engine cannot run as priced, one line each (empty: it runs it
    exactly): planner.rules.runner_problems, rendered."""
    return [p.line for p in runner_problems(plan, engine)]


def per_chunk_recompute(plan) -> int:
    """The one count per model chunk of a plan whose stages recompute min(count, layers)."""
    return max((s.recompute_layers for s in plan.stages), default=0)
