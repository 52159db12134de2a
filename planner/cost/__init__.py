"""The cost model: time and memory of a configuration, per GPU, per step.

compute.py    layer / head / optimizer compute time   comm.py      alpha-beta collectives
memory.py     ZeRO model states, activations           schedule.py  pipeline step and in-flight
context.py    context-parallel K/V exchange            moe.py       MoE layers, dispatch
recompute.py  selective recompute's modules            dataparallel.py  DP collectives
facts.py      an engine's figures on one GPU (catalog formulas or a profile's measurements)
stage.py      per-stage linear coefficients and `evaluate` (Candidate, Estimate, StageCoeffs)

The package imports none of its modules: `from planner.cost.comm import ...` loads comm.py
and what it needs, not the whole model.
"""
