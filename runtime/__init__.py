"""Runtime: trains a plan's model with the plan's layout (TP/SP, PP, ZeRO/FSDP2, recompute).

`python -m runtime --plan plan.json` (under torchrun for more than one process). Imports torch;
the planner never does.
"""
