"""How far to trust each engine's predictions: its |error| on published runs no fit has seen.

Read from planner/engines/trust.json, which `python -m benchmarks.fidelity --loso` generates
(leave one source out: every fitted figure of the planner refitted without one source family of
published runs, that family's rows predicted with the refitted figures), per engine (MoE
models apart) and GPU generation (planner.precision ARCH), with the in-sample median (the
committed figures, fitted on some of those rows) beside it. tests/test_fidelity_loso.py checks
the file against the committed table it names.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from planner.engines.spec import Validation
from planner.power import limit_suffix
from planner.precision import ARCH

TRUST_FILE = Path(__file__).with_name("trust.json")
_TRUST = json.loads(TRUST_FILE.read_text())
TABLE = _TRUST["table"]
# scope ("megatron", "megatron moe", ...) -> GPU generation ("all", "hopper", ...) -> figures
TRUST = _TRUST["engines"]
# engine: (runs, held-out median |error| %), over all its dense-model rows
VALIDATION = {e: (v["all"]["runs"], v["all"]["held_out_median_abs_pct"])
              for e, v in TRUST.items() if " " not in e}

# trust scope (scope_of below: the engine, its MoE models apart where it has MoE rows): the
# catalog GPUs its published runs ran on, from the "<engine> <gpu>" rows of the fidelity tables
# (benchmarks/results/fidelity_<date>.md, fidelity_moe_<date>.md) and the GPUs of the held-out
# file's scored rows (fidelity_heldout_<date>.csv); a plan on any other GPU (or a custom one) is
# not validated by them. tests/test_labels.py checks this against the tables.
VALIDATED_GPUS = {
    "deepspeed": ("a100",),
    "fsdp": ("a100", "a100-40g", "h100"),
    "megatron": ("a100", "b200", "gb200", "gb300", "h100"),
    "megatron moe": ("b200", "b300", "gb200", "gb300", "h100"),
    "torchtitan": ("a100", "b200", "h100", "h200", "mi300x"),
}


def validated_gpus(engine: str, moe: bool = False) -> tuple:
    """The catalog GPUs published runs of `engine` (its MoE models where it has MoE rows) ran on."""
    return VALIDATED_GPUS.get(scope_of(engine, moe), VALIDATED_GPUS.get(engine, ()))


def validated_on(engine: str, gpu_name: str, moe: bool = False) -> bool:
    """Whether published runs of `engine` (of MoE models, for an MoE model, where it has them)
    on this catalog GPU validate its predictions."""
    return gpu_name in validated_gpus(engine, moe)


@dataclass(frozen=True)
class HeldOutValidation(Validation):
    """Validation whose median is held out (leave one source out), with its p90 and the
    in-sample median beside it, over the runs of one GPU generation or all."""
    p90_abs_error_pct: float = 0.0
    in_sample_median_abs_error_pct: float = 0.0
    scope: str = ""

    def describe(self, engine: str) -> str:
        return (f"+/-{self.median_abs_error_pct:.0f}% held out (median |error|, {self.runs} "
                f"published {engine} runs{self.scope}; p90 "
                f"{self.p90_abs_error_pct:.0f}%, in-sample {self.in_sample_median_abs_error_pct:.0f}%)")


def gen_key(gen: str, gpu: str, power_limit_w: float = 0.0) -> str:
    """The trust scope of GPU generation `gen` as catalog GPU `gpu` ran it: "blackwell", or
    under a power limit below the part's rating "blackwell at 750 W" (what
    benchmarks.fidelity writes and validation_of reads)."""
    return gen + limit_suffix(gpu, power_limit_w)


def scope_of(engine: str, moe: bool = False) -> str:
    return f"{engine} moe" if moe and f"{engine} moe" in TRUST else engine


def validation_of(engine: str, gpu: str | None = None, moe: bool = False,
                  power_limit_w: float = 0.0) -> HeldOutValidation | None:
    """The held-out figures of `engine` (MoE models apart where it has MoE rows), on `gpu`'s
    generation where it has published runs there, else over all its runs. Under a power limit
    only runs at that limit count (the scope "<generation> at <W> W"); None where there are
    none."""
    scopes = TRUST.get(scope_of(engine, moe))
    if not scopes:
        return None
    gen = ARCH.get(gpu) if gpu else None
    limit = limit_suffix(gpu, power_limit_w) if gpu else ""
    if limit:
        key = gen_key(gen, gpu, power_limit_w)
        if key not in scopes:
            return None
        label = f" on {gen.title()} GPUs{limit}"
    else:
        key = gen if gen in scopes else "all"
        label = f" on {gen.title()} GPUs" if key != "all" else ""
    v = scopes[key]
    return HeldOutValidation(runs=v["runs"], median_abs_error_pct=v["held_out_median_abs_pct"],
                             table=TABLE, p90_abs_error_pct=v["held_out_p90_abs_pct"],
                             in_sample_median_abs_error_pct=v["in_sample_median_abs_pct"],
                             scope=label)


def trust_on(engine, gpu: str | None = None, moe: bool = False,
             power_limit_w: float = 0.0) -> str:
    """What `plan` prints as its trust band for `engine` on `gpu` (a catalog GPU name, under
    `power_limit_w` where it runs under one)."""
    v = validation_of(engine.name, gpu, moe, power_limit_w)
    scope = scope_of(engine.name, moe)
    return v.describe(scope.replace(" moe", " MoE")) if v else "not validated"
