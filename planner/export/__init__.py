"""Export a plan to the settings another training engine takes.

Each exporter is pure: a `Plan` in, the text the engine reads out (Megatron-LM arguments as a
bash fragment, a DeepSpeed config JSON, torchtitan TOML sections). An export is exact: every knob
of the plan appears, priced as the engine runs it. A plan the engine cannot run as priced
(planner.engines.runnable) is refused in one line; plan it with --engine for that engine.
"""
from __future__ import annotations

from planner.errors import BadInput
from planner.export.deepspeed import deepspeed_config
from planner.export.megatron import megatron_args
from planner.export.torchtitan import torchtitan_toml

EXPORTERS = {
    "megatron": megatron_args,
    "deepspeed": deepspeed_config,
    "torchtitan": torchtitan_toml,
}


def export(plan, fmt: str) -> str:
    """The plan in format `fmt` (a key of EXPORTERS); BadInput for an unknown format."""
    key = fmt.lower() if isinstance(fmt, str) else fmt
    if key not in EXPORTERS:
        raise BadInput(f"unknown export format {fmt!r}; known: {', '.join(EXPORTERS)}")
    return EXPORTERS[key](plan)

