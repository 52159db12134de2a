"""The cost model: time and memory of a configuration, per GPU, per step.

compute.py  layer / head / optimizer compute time     comm.py      alpha-beta collectives
memory.py   ZeRO model states, activations             schedule.py  pipeline step and in-flight
stage.py    per-stage linear coefficients and `evaluate`
"""
from planner.cost.stage import Candidate, Estimate, StageCoeffs, evaluate, stage_coefficients

__all__ = ["Candidate", "Estimate", "StageCoeffs", "evaluate", "stage_coefficients"]
