"""A broken rule, as data: what the rules layer (planner.rules) returns and every consumer
renders (the CLI, Plan.validate, the exporters, `plan launch`, the runtime's pre-flight).

Pure data, no imports: planner.precision and planner.rules both build these.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One rule a plan (or the fixed CLI values) breaks.

    rule     the rule's name ("zero_under_pp", "tp_divides_heads", ...): one home per rule
    knobs    the plan's knobs involved ("zero", "pp"), or ("model",) / ("cluster",)
    message  one line saying what is wrong, without an "invalid plan:" prefix
    source   where the engine states the rule: a file or document of Megatron-LM, torchtitan,
             DeepSpeed, PyTorch, or our runtime's module
    fix      what to change, in the CLI's words ("" where the message says it already)
    """
    rule: str
    knobs: tuple
    message: str
    source: str = ""
    fix: str = ""

    @property
    def line(self) -> str:
        """The one line shown: the message, then the fix."""
        return f"{self.message}; {self.fix}" if self.fix else self.message

    def __str__(self) -> str:
        return self.line
