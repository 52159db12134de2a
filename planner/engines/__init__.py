"""Training engines: what each can run, how fast, what memory it keeps (planner.engines.spec).

    get_engine("torchtitan")  ->  Engine

The default engine is Megatron-LM: the cost model's figures were validated on its published
runs first, and it expresses the most of what the search chooses (uneven stages, interleaving,
ZeRO-1 with pipelining). `plan --engine NAME` plans for another.
"""
from __future__ import annotations

from planner.engines.deepspeed import DEEPSPEED
from planner.engines.fsdp import FSDP
from planner.engines.megatron import MEGATRON
from planner.engines.runtime import RUNTIME
from planner.engines.spec import Engine, with_compile
from planner.engines.torchtitan import TORCHTITAN
from planner.errors import BadInput

ENGINES = {e.name: e for e in (MEGATRON, TORCHTITAN, DEEPSPEED, FSDP, RUNTIME)}
DEFAULT_ENGINE = "megatron"


def get_engine(name: str | Engine | None) -> Engine:
    if isinstance(name, Engine):
        return name
    if name is None:
        return ENGINES[DEFAULT_ENGINE]
    key = name.lower() if isinstance(name, str) else name
    if key not in ENGINES:
        raise BadInput(f"unknown engine {name!r}; known: {', '.join(ENGINES)}")
    return ENGINES[key]


def plan_engine(plan) -> Engine:
    """The engine a saved plan (planner.plan.Plan) was priced for, as priced: its `engine`,
    under torch.compile where the plan says `compile`."""
    engine = get_engine(plan.engine)
    return with_compile(engine) if plan.compile and engine.compile_option else engine


__all__ = ["ENGINES", "DEFAULT_ENGINE", "Engine", "get_engine", "plan_engine"]
