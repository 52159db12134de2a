"""Megatron-Core's fine-grained selective recompute: `--recompute-granularity selective
--recompute-modules ...`, every layer. What each module gives back of one layer's saved
activations (one micro-batch, one GPU) and what it runs again in the backward.

Sources (Megatron-LM, megatron/core/transformer/): transformer_config.py `recompute_modules`
(choices, default ["core_attn"]; "moe_act", "layernorm" and "mla_up_proj" discard the output
they recompute, the others checkpoint normally); transformer_layer.py (layernorm: only a norm
that is its own module, not one fused into Transformer Engine's LayerNormColumnParallelLinear;
mlp: a dense MLP only); multi_latent_attention.py (mla_up_proj: the q / kv up projections and
RoPE, whose outputs Q, K, V feed the attention core); moe/experts.py (moe_act: the experts'
activation, whose output is the second grouped GEMM's input); moe/moe_layer.py (moe: the whole
MoE layer, dispatch and combine included; shared_experts: the shared expert MLP).

With Transformer Engine's layer spec (gpt_layer_specs.py) a dense layer's two norms are fused
into the QKV and FC1 linears; an MoE layer's pre-MLP norm is a separate TENorm (the router and
the dispatcher read its output), and so is multi-head latent attention's input norm (the q and
kv down projections read its output).

"core_attn" is `planner.cost.memory.activation_bytes` mode "selective" and
`planner.cost.compute.LayerTime.recompute("selective")` (Korthikanti et al. 2022).
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.specs import Model
from planner.vocab import DEFAULT_RECOMPUTE_MODULES as DEFAULT_MODULES  # noqa: F401
from planner.vocab import RECOMPUTE_MODULES as MODULES  # noqa: F401 (re-exported)
# discard their output and recompute it just before the backward that needs it: nearly free
# memory for a short re-run (transformer_config.py); what the search offers beside the default
CHEAP_MODULES = ("moe_act", "layernorm", "mla_up_proj")


@dataclass(frozen=True)
class Rerun:
    """What recomputing some modules of one layer frees and costs."""
    freed_bytes: float = 0.0     # saved activations given back
    fwd_s: float = 0.0           # forward seconds run again in the backward
    mlp_tp: bool = False         # the MLP's tensor-parallel forward collectives run again
    dispatch: bool = False       # the MoE dispatch and combine run again

    def __add__(self, o: "Rerun") -> "Rerun":
        return Rerun(self.freed_bytes + o.freed_bytes, self.fwd_s + o.fwd_s,
                     self.mlp_tp or o.mlp_tp, self.dispatch or o.dispatch)


def applying(model: Model, modules) -> tuple:
    """The modules that change something for `model` (Megatron accepts the others and does
    nothing with them)."""
    def applies(m):
        if m in ("moe_act", "moe"):
            return model.is_moe
        if m == "shared_experts":
            return bool(model.shared_expert_ffn_hidden)
        if m == "mla_up_proj":
            return model.is_mla
        if m == "layernorm":
            return model.is_moe or model.is_mla
        if m == "mlp":
            return not model.is_moe or any(not model.moe_layer(i)
                                           for i in range(model.num_layers))
        return m == "core_attn"
    return tuple(m for m in modules if applies(m))


def cheap_modules(model: Model) -> tuple:
    """The output-discarding modules that apply to `model` (empty for a dense GQA model)."""
    return applying(model, CHEAP_MODULES)


def norm_rerun(model: Model, tokens: float, tp: int, sp: bool, hbm_bps: float,
               input_bytes: float) -> Rerun:
    """One separate norm discarded: its output (the next linear's input, `input_bytes` per
    element as that linear keeps it) freed; the norm's read and write run again. Under
    sequence parallelism it sees the rank's s/tp tokens."""
    n = tokens * model.hidden / (tp if sp else 1)
    return Rerun(freed_bytes=input_bytes * n, fwd_s=2 * 2.0 * n / hbm_bps)


def attention_rerun(model: Model, modules, tokens: float, tp: int, sp: bool, hbm_bps: float,
                    act_bytes: float, linear_input_bytes: float, up_proj_s: float,
                    rope_s: float) -> Rerun:
    """The attention side's modules of one layer beyond core_attn: MLA's input norm
    ("layernorm") and its up projections with RoPE ("mla_up_proj", freeing Q, K and V of this
    rank's heads; `up_proj_s` their GEMMs' seconds, `rope_s` RoPE's)."""
    out = Rerun()
    if not model.is_mla:
        return out
    if "layernorm" in modules:
        out += norm_rerun(model, tokens, tp, sp, hbm_bps, linear_input_bytes)
    if "mla_up_proj" in modules:
        qkv = model.q_dim + model.kv_dim + model.value_dim
        out += Rerun(freed_bytes=act_bytes * tokens * qkv / tp, fwd_s=up_proj_s + rope_s)
    return out


def dense_mlp_rerun(modules, mlp_fwd_s: float, mlp_saved_bytes: float) -> Rerun:
    """"mlp" on a dense layer: the MLP checkpointed (its input, the residual stream the fused
    norm reads, is kept anyway); its saved tensors (`mlp_saved_bytes`: the FC1 input and the
    intermediates) freed, its forward and TP collectives run again."""
    if "mlp" not in modules:
        return Rerun()
    return Rerun(freed_bytes=mlp_saved_bytes, fwd_s=mlp_fwd_s, mlp_tp=True)


def moe_mlp_rerun(model: Model, modules, norm: Rerun, layer_saved_bytes: float,
                  layer_fwd_s: float, act_out_bytes: float, act_fwd_s: float,
                  shared_saved_bytes: float, shared_fwd_s: float) -> Rerun:
    """The MoE side's modules of one MoE layer: the pre-MLP norm ("layernorm", `norm`), the
    whole layer ("moe": `layer_saved_bytes` / `layer_fwd_s`, dispatch included), else the
    experts' activation ("moe_act": its output, `act_out_bytes`) and the shared expert
    ("shared_experts")."""
    out = norm if "layernorm" in modules else Rerun()
    if "moe" in modules:
        return out + Rerun(freed_bytes=layer_saved_bytes, fwd_s=layer_fwd_s, dispatch=True)
    if "moe_act" in modules:
        out += Rerun(freed_bytes=act_out_bytes, fwd_s=act_fwd_s)
    if "shared_experts" in modules and model.shared_expert_ffn_hidden:
        out += Rerun(freed_bytes=shared_saved_bytes, fwd_s=shared_fwd_s)
    return out
