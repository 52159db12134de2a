"""Moved: an engine's facts on one GPU are the cost model's, `planner.cost.facts`.

The engine specs (planner.engines.*) hold data only; applying their kernel figures to a GPU's
is a formula, and formulas live in planner.cost. This module keeps the old import path.
"""
from planner.cost.facts import (FP32, CatalogFacts, HeadMemory, MeasuredFacts,  # noqa: F401
                                engine_gpu, facts_for)
