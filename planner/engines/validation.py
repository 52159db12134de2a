"""How far to trust each engine's predictions: its median |error| on published runs.

Written from the committed fidelity table (`python -m benchmarks.fidelity`, which prints these
lines); tests/test_fidelity.py checks that they match the table, so they cannot drift from it.
"""
from planner.engines.spec import Validation

TABLE = "benchmarks/results/fidelity_2026-12-02.md"
# engine: (runs, median |error| %), from the "scope" rows of TABLE
VALIDATION = {
    "fsdp": (77, 2.7),
    "megatron": (44, 4.9),
    "torchtitan": (43, 6.4),
}


def validation_of(engine: str) -> Validation | None:
    v = VALIDATION.get(engine)
    return Validation(runs=v[0], median_abs_error_pct=v[1], table=TABLE) if v else None
