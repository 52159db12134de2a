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

# engine: the GPUs its published runs ran on, from the "<engine> <gpu>" rows of TABLE; a plan on
# any other GPU (or a custom one) is not validated by them
VALIDATED_GPUS = {
    "fsdp": ("h100",),
    "megatron": ("a100", "b200", "h100"),
    "torchtitan": ("a100", "h100", "h200"),
}


def validated_on(engine: str, gpu_name: str) -> bool:
    """Whether published runs of `engine` on this catalog GPU validate its predictions."""
    return gpu_name in VALIDATED_GPUS.get(engine, ())


def validation_of(engine: str) -> Validation | None:
    v = VALIDATION.get(engine)
    return Validation(runs=v[0], median_abs_error_pct=v[1], table=TABLE) if v else None
