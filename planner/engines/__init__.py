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


def engine_for(name: str | Engine | None, compile_: bool = False) -> Engine:
    """The engine as a plan prices it: under torch.compile where `compile_` and the engine has
    the option (planner.engines.spec with_compile; one without it is refused by
    planner.rules.compile_problem, not silently run eager)."""
    engine = get_engine(name)
    return with_compile(engine) if compile_ and engine.compile_option else engine


def plan_engine(plan) -> Engine:
    """The engine a saved plan (planner.plan.Plan) was priced for, as priced."""
    return engine_for(plan.engine, plan.compile)


__all__ = ["ENGINES", "DEFAULT_ENGINE", "Engine", "engine_for", "get_engine", "plan_engine"]
