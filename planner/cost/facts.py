"""An engine's facts on one GPU: the figures the cost model reads, from one interface.

The engine spec (planner.engines) holds the engine's figures as data; this module applies them
to the GPU's and the cost formulas.

`facts_for(engine, gpu)` gives the catalog facts: the cost formulas (planner.cost.compute,
planner.cost.memory) with the engine's kernel figures applied to the GPU's. An engine that
carries a profile (`python -m profiler`, applied by planner.profile.apply_profile) gives
measured facts instead: each figure measured at the measured shapes, or the formula scaled by
measured / modelled at the nearest one (planner.profile.Measured).
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from planner.cost.compute import (BF16, embedding_time, head_time, layer_time, optimizer_time)
from planner.cost.memory import (activation_bytes, head_input_bytes, logits_bytes,
                                  lowp_saved_input_savings, saved_lse_bytes)
from planner.engines.eager import CUBLAS_GEMM_FRACTION
from planner.engines.spec import Engine
from planner.specs import Gpu

FP32 = 4   # planner.cost.memory.logits_bytes counts fp32 logits


@dataclass(frozen=True)
class HeadMemory:
    """Bytes of the last stage's head for one micro-batch (CatalogFacts.head_memory)."""
    norm_input: float   # the final norm's saved input (the last layer's output)
    held: float         # from forward to backward: the norm's and projection's saved inputs,
    #                     the loss's saved tensors and the logits where the pipeline keeps them
    working: float      # what the loss's peak adds once beyond `held`
    output: float       # the logits, the stage's output (Engine.pipeline_returns_outputs)


def engine_gpu(engine: Engine, gpu: Gpu) -> Gpu:
    """The GPU as the engine's kernels drive it."""
    changes = {}
    if engine.gemm_scale != 1.0:
        # an engine's own GEMM scale (the eager engines': planner.engines.eager) is relative to
        # cuBLAS's large-GEMM fraction of the GPU's peak, the catalog's figure but where that
        # is a Megatron fit (CUBLAS_GEMM_FRACTION)
        changes["gemm_efficiency"] = (CUBLAS_GEMM_FRACTION.get(gpu.name, gpu.gemm_efficiency)
                                      * engine.gemm_scale)
    if engine.attn_scale != 1.0:
        changes["attn_efficiency"] = gpu.attn_efficiency * engine.attn_scale
    if engine.overlap_slowdown is not None:
        changes["overlap_slowdown"] = engine.overlap_slowdown
    return dataclasses.replace(gpu, **changes) if changes else gpu


def _memo(fn):
    """Remember a fact per arguments: the search asks the same shapes for every ZeRO stage,
    schedule and recompute choice of a candidate (arguments are frozen specs and numbers)."""
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        key = (fn.__name__, args, tuple(sorted(kwargs.items())))
        try:
            return self._memo[key]
        except KeyError:
            out = self._memo[key] = fn(self, *args, **kwargs)
            return out
        except TypeError:      # an unhashable argument: compute it
            return fn(self, *args, **kwargs)
    return wrapper


class CatalogFacts:
    def __init__(self, engine: Engine, gpu: Gpu):
        self.engine = engine
        self.gpu = engine_gpu(engine, gpu)
        self._memo = {}
        # bytes per element of what the engine computes with on this device: its saved
        # activations, the parameter copies it gathers and the activations TP and PP move
        self.compute_elem_bytes = FP32 if gpu.name in engine.fp32_compute_on else BF16
        self.comm_elem_bytes = self.compute_elem_bytes
        # the unsharded copy of parameters held while computing (engine.compute_copy_bytes is
        # the bf16 copy): as wide as the compute dtype
        self.compute_copy_bytes = engine.compute_copy_bytes * self.compute_elem_bytes / BF16
        self.math_attention_for_unequal_heads = (
            gpu.name in engine.math_attention_for_unequal_heads_on)

    @_memo
    def layer_time(self, model, b, s, tp, sp, flash, tp_comm_fwd=0.0, lp=None, cp=1):
        """`lp`: the plan's low precision (planner.precision.LowPrecision), None for bf16;
        `cp`: the context-parallel degree (each rank's s/cp tokens)."""
        lt = layer_time(model, self.gpu, b, s, tp, sp, flash, self.engine.elementwise_traffic,
                        self.engine.layer_overhead_s, lp, cp, self.engine.elementwise_kernels)
        if self.engine.op_recomputes_attention:
            lt = dataclasses.replace(lt, op_recomputes_attention=True)
        return lt

    def fused_attention(self, model, flash: bool) -> bool:
        """Whether the attention runs a fused kernel that keeps no s x s softmax: `flash`,
        unless the engine falls back to the math path for the model's head widths here
        (Engine.math_attention_for_unequal_heads_on)."""
        return flash and not (self.math_attention_for_unequal_heads
                              and model.head_dim != model.value_head_dim)

    @_memo
    def activation_bytes(self, model, b, s, tp, sp, mode, flash, lp=None):
        out = self.bf16_activation_bytes(model, b, s, tp, sp, mode, flash, lp)
        if self.compute_elem_bytes == BF16:
            return out
        # the formula's bf16 elements are compute_elem_bytes wide here; flash attention's
        # log-sum-exp is fp32 either way
        fused = self.fused_attention(model, flash)
        lse = saved_lse_bytes(model, b * s, tp, mode, fused, self.engine.op_recomputes_attention)
        return lse + (out - lse) * self.compute_elem_bytes / BF16

    def bf16_activation_bytes(self, model, b, s, tp, sp, mode, flash, lp=None):
        """The cost model's saved bytes of one layer, computing in bf16."""
        gathered = self.engine.sp_keeps_gathered_inputs
        fused = self.fused_attention(model, flash)
        out = activation_bytes(model, b, s, tp, sp, mode, fused, gathered,
                               op_recomputes_attention=self.engine.op_recomputes_attention)
        if lp is not None and lp.recipe.saves_lowp_inputs:
            out -= lowp_saved_input_savings(model, b, s, tp, sp, mode, lp.element_bytes,
                                            gathered, attention_keeps_output=fused)
        return out

    @_memo
    def embedding_time(self, model, b, s, tp):
        return embedding_time(model, self.gpu, b, s, tp)

    @_memo
    def head_time(self, model, b, s, tp):
        return head_time(model, self.gpu, b, s, tp, self._loss(tp).traffic)

    def _loss(self, tp):
        """The engine's loss kernel at tensor parallelism `tp` (LossMemory)."""
        e = self.engine
        return e.tp_loss_memory if tp > 1 and e.tp_loss_memory is not None else e.loss_memory

    @_memo
    def head_memory(self, model, b, s, tp, sp=False, pp=1) -> HeadMemory:
        """The last stage's head for one micro-batch: the final norm's and the output
        projection's saved inputs (planner.cost.memory.head_input_bytes) and what the loss
        holds over the logits (the engine's LossMemory, logits as wide as the compute dtype):
        what is held from forward to backward, and what the loss's peak adds beyond it."""
        e = self.engine
        loss = self._loss(tp)
        width, kept = self.compute_elem_bytes, e.pipeline_keeps_logits and pp > 1
        logits = logits_bytes(model, b, s, tp) / FP32
        norm_in, proj_in = head_input_bytes(model, b, s, tp, sp, e.sp_keeps_gathered_inputs,
                                            width)
        held = loss.held(width, kept) * logits
        return HeadMemory(norm_input=norm_in, held=norm_in + proj_in + held,
                          working=loss.peak(width, kept) * logits - held,
                          output=width * logits)

    def optimizer_time(self, params):
        return optimizer_time(self.gpu, params)


class MeasuredFacts(CatalogFacts):
    """Catalog facts corrected by a profile's measurements (planner.profile.Measured)."""

    def __init__(self, engine: Engine, gpu: Gpu, measured):
        super().__init__(engine, gpu)
        self.measured = measured
        self.comm_elem_bytes = measured.comm_elem_bytes

    # a profile measures our runtime, which runs bf16 only (lp is always None here)
    def layer_time(self, model, b, s, tp, sp, flash, tp_comm_fwd=0.0, lp=None, cp=1):
        # profiles measure our runtime, which has no context parallelism (cp is always 1 here)
        lt = super().layer_time(model, b, s, tp, sp, flash, lp=lp, cp=cp)
        return self.measured.layer_time(lt, b, s, tp, sp, flash, tp_comm_fwd,
                                        self.engine.elementwise_kernels)

    def activation_bytes(self, model, b, s, tp, sp, mode, flash, lp=None):
        # the profile measured what runs (its dtype included), relative to the bf16 formula
        return self.measured.activation_bytes(
            self.bf16_activation_bytes(model, b, s, tp, sp, mode, flash, lp), b, s, tp, sp,
            mode, flash)

    def embedding_time(self, model, b, s, tp):
        return self.measured.embedding_time(super().embedding_time(model, b, s, tp), b, s, tp)

    def head_time(self, model, b, s, tp):
        return self.measured.head_time(super().head_time(model, b, s, tp), b, s, tp,
                                       self._loss(tp).traffic)

    def head_memory(self, model, b, s, tp, sp=False, pp=1) -> HeadMemory:
        # the profile measures what the final norm, the LM head and the loss save (profiler/
        # compute.py head_point, no sequence parallelism), scaled from the catalog's figure at
        # the profiled shape; the logits a pipeline stage keeps come on top
        head = super().head_memory(model, b, s, tp, sp, pp)
        kept = head.held - super().head_memory(model, b, s, tp, sp, 1).held
        saved = self.measured.head_saved_bytes(
            head.held - kept, b, s, tp,
            lambda spec, bb, ss, t: CatalogFacts.head_memory(self, spec, bb, ss, t).held)
        return dataclasses.replace(head, held=saved + kept)

    def optimizer_time(self, params):
        return self.measured.optimizer_time(params)


def facts_for(engine: Engine, gpu: Gpu) -> CatalogFacts:
    if engine.measured is not None:
        return MeasuredFacts(engine, gpu, engine.measured)
    return _catalog_facts(engine, gpu)


@functools.lru_cache(maxsize=64)
def _catalog_facts(engine: Engine, gpu: Gpu) -> CatalogFacts:
    # keyed on the frozen specs; a measured engine (whose measurements do not enter its hash)
    # is never cached
    return CatalogFacts(engine, gpu)
