"""The one home of what this runtime cannot lay out of a plan that planner.validity accepts.

`runtime_problems(plan)`: one line each, read by `runtime.parallelize.check_layout` (which
refuses with the first, before any work). The MoE limits live beside the expert code
(`runtime.expert.runtime_problems`); the attention and model-shape ones are here.
"""
from __future__ import annotations


def attention_problems(plan) -> list:
    """Attention the runtime builds (runtime.model: head_dim_override, sliding windows, sinks,
    MLA) but cannot split as the plan asks."""
    p, m = plan.parallelism, plan.model
    out = []
    if m.is_mla and p.tp > 1:
        out.append(f"model {m.name}: multi-head latent attention with tp {p.tp} is not "
                   f"supported by the runtime yet (tp 1 only)")
    return out


def model_problems(plan) -> list:
    """Parts of the model the runtime does not build (runtime.model.check_whole_model_supported
    says the same at construction)."""
    m = plan.model
    if m.mtp_layers:
        return [f"model {m.name}: multi-token prediction ({m.mtp_layers} mtp_layers) is not "
                f"built by the runtime yet"]
    return []


def runtime_problems(plan) -> list:
    from runtime.expert import runtime_problems as expert_problems
    return model_problems(plan) + attention_problems(plan) + expert_problems(plan)
