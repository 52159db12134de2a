"""Training precision: which GPUs and engines run FP8 / MXFP8 / NVFP4, and what it costs.

`plan --precision {bf16,fp8,mxfp8,nvfp4}` (default bf16) is fixed by the user; `--precision auto`
plans each format the engine and GPU run and keeps the fastest (planner.precision_choice).
Low precision covers the block linears only (QKV, attention out-projection, MLP): attention,
the embedding, the LM head and the norms stay bf16, as every engine here runs them:
- Megatron-Core builds the decoder's linears from Transformer Engine modules
  (TELayerNormColumnParallelLinear, TERowParallelLinear) inside `te.fp8_autocast`; the output
  layer is Megatron's own ColumnParallelLinear (bf16), and FP8 attention is off unless
  --fp8-dot-product-attention is set (megatron/core/transformer/transformer_config.py).
- torchtitan's float8 converter swaps nn.Linear for torchao's Float8Linear and skips the
  `output` projection by default (torchtitan docs/float8.md, `filter_fqns = ["output"]`).
- llm-foundry's `precision: amp_fp8` runs Transformer Engine's te.Linear / LayerNormMLP inside
  te.fp8_autocast (composer/core/precision.py); its attention stays bf16.
Optimizer states, fp32 master weights and gradients keep their bytes. The GEMMs' weights are
bf16 weights cast to FP8 (cached per step where the engine passes is_first_microbatch), or,
where a plan keeps FP8 primary weights (fp8_primary_weights: Megatron's ZeRO-3, and the
published recipes that ran them), FP8 tensors the optimizer writes from its fp32 masters.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from planner.errors import BadInput
from planner.problem import Problem

PRECISIONS = ("bf16", "fp8", "mxfp8", "nvfp4")
DEFAULT_PRECISION = "bf16"

# Architecture of each catalog GPU (planner.catalog.gpus), for what its tensor cores run.
ARCH = {"a100": "ampere", "a100-40g": "ampere", "h100": "hopper", "h200": "hopper",
        "b200": "blackwell", "b300": "blackwell", "gb200": "blackwell", "gb300": "blackwell",
        "mi300x": "cdna3", "mi325x": "cdna3", "mi355x": "cdna4", "cpu": "cpu"}
# FP8 tensor cores: Hopper and Blackwell (NVIDIA H100 / Blackwell datasheets); MXFP8 and NVFP4
# (block-scaled, OCP microscaling) are Blackwell tensor-core formats (NVIDIA Blackwell
# architecture technical brief; Transformer Engine docs, "Using FP8 and FP4 with Transformer
# Engine": MXFP8 and NVFP4 recipes require compute capability 10.0+). A100 (Ampere) has none.
# AMD CDNA 3 (MI300X, MI325X) and CDNA 4 (MI355X) Matrix Cores run FP8 (AMD Instinct MI300X and
# MI325X datasheets: FP8 2614.9 TFLOP/s dense; CDNA 4: OCP FP8, AMD CDNA 4 architecture
# whitepaper), through ROCm's Transformer Engine and hipBLASLt FP8 GEMMs.
ARCHS = {"fp8": ("hopper", "blackwell", "cdna3", "cdna4"), "mxfp8": ("blackwell",),
         "nvfp4": ("blackwell",)}

# Dense (no sparsity) tensor-core peaks, TFLOP/s, from the datasheets the catalog cites:
# - H100 SXM / H200 SXM: FP8 3958 TFLOP/s with sparsity, 1979 dense (H100, H200 datasheets).
# - HGX B200: FP8/FP6 72 PFLOP/s and FP4 144 PFLOP/s with sparsity over 8 GPUs: 4500 and 9000
#   dense per GPU (NVIDIA HGX platform page / DGX B200 datasheet). MXFP8 runs at the FP8 rate.
# - HGX B300 (Blackwell Ultra): FP8 72 PFLOP/s sparse over 8 (4500 dense per GPU), FP4 108
#   PFLOP/s dense over 8 (13500 per GPU; HGX platform page, B300 column).
# - GB200 NVL72: FP8/FP6 720 PFLOP/s sparse over 72 GPUs (5000 dense each), FP4 1440 PFLOP/s
#   sparse (10000 dense each) (GB200 NVL72 product page).
# - GB300 NVL72: FP8 720 PFLOP/s sparse (5000 dense each), FP4 1080 PFLOP/s dense over 72
#   (15000 each) (GB300 NVL72 product page).
# - MI300X, MI325X: FP8 2614.9 TFLOP/s dense, 5229.8 with sparsity (AMD Instinct MI300X and
#   MI325X datasheets; 304 CUs x 4096 FP8 FLOPs a clock x 2.1 GHz).
# - MI355X: 5033.2 dense: 256 CUs (8 XCDs of 32 active CUs) x 8192 FP8 FLOPs a clock (AMD at
#   ISSCC 2026: per-CU FP8 doubled from MI300X's 4096 to 8192, "five petaflops" of FP8) x
#   2.4 GHz peak engine clock (AMD Instinct MI350 series at Hot Chips 2025: MI355X 1400 W,
#   2.4 GHz). Its MXFP8 / MXFP6 / MXFP4 formats are not offered here: no engine row or recipe
#   for them on CDNA 4 is cited yet (planner.precision prices NVIDIA's NVFP4, not MXFP4).
LOW_PRECISION_PEAK_TFLOPS = {
    "mi300x": {"fp8": 2614.9},
    "mi325x": {"fp8": 2614.9},
    "mi355x": {"fp8": 5033.2},
    "h100": {"fp8": 1979.0},
    "h200": {"fp8": 1979.0},
    "b200": {"fp8": 4500.0, "mxfp8": 4500.0, "nvfp4": 9000.0},
    "b300": {"fp8": 4500.0, "mxfp8": 4500.0, "nvfp4": 13500.0},
    "gb200": {"fp8": 5000.0, "mxfp8": 5000.0, "nvfp4": 10000.0},
    "gb300": {"fp8": 5000.0, "mxfp8": 5000.0, "nvfp4": 15000.0},
}

# Bytes per element of a GEMM operand: FP8 1; MXFP8 1 + one E8M0 scale per 32 elements; NVFP4
# 0.5 + one E4M3 scale per 16 elements (OCP Microscaling Formats spec v1.0; NVIDIA NVFP4 blog).
ELEMENT_BYTES = {"fp8": 1.0, "mxfp8": 1.0 + 1.0 / 32, "nvfp4": 0.5 + 1.0 / 16}
# The precisions whose quantised elements are FP8 (E4M3 / E5M2; MXFP8's with a scale per 32):
# what Megatron runs with --fp8-format (planner.export.megatron PRECISION_FLAGS) and Transformer
# Engine's TP-overlap all-gather buffers hold at a byte an element (planner.cost.memory
# userbuffer_bytes)
FP8_FORMATS = ("fp8", "mxfp8")

# Fraction of the bf16 large-GEMM efficiency (planner.catalog.gpus `gemm_efficiency`) that a
# low-precision GEMM reaches of its own (FP8 / FP4) peak, Transformer Engine: 0.85 x 0.70 x
# 1979 = 1177 TFLOP/s on H100. Fitted once by grid (0.70 ... 1.10 in steps of 0.05; median
# |error| on the fit rows 15.2, 9.9, 5.3, 1.2, 2.5, 5.7, 8.7, 11.3, 13.7%) on the
# Megatron-Bridge Llama 3 70B H100 FP8 rows only (benchmarks/data/published_runs_2.json,
# `mbridge-*-h100-llama370b-*`, 6 rows: benchmarks.fidelity.is_lowp_fit_row), priced with the
# TP communication overlap those runs had (Megatron-Core --tp-comm-overlap: the rows'
# fixed.tp_comm_overlap); every other FP8/MXFP8 row (Megatron 8B H100 and B200, the 405B CP
# rows, llm-foundry) is held out (benchmarks/results/fidelity_2026-12-02.md). Before the
# overlap was modelled the same grid chose 1.10 (2.2x bf16: it absorbed the TP communication
# priced exposed). Applied to MXFP8 and NVFP4 too, an assumption (B200 held-out rows).
TE_GEMM_SCALE = 0.85
# torchao's float8 GEMMs (torchtitan): derived, not fitted: torchao's Float8Linear calls
# torch._scaled_mm, whose tensorwise path is cuBLASLt's FP8 GEMM (pytorch aten/src/ATen/native/
# cuda/Blas.cpp, _scaled_mm_out_cuda -> at::cuda::blas::scaled_gemm), the kernel Transformer
# Engine runs too, so Transformer Engine's figure. (It was 1.10, the grid's choice on the
# Megatron-Bridge 70B rows while TP communication was priced exposed, kept after that was
# mended: ~19% faster FP8 GEMMs than Transformer Engine's on the same cuBLASLt kernel. A grid
# on torchtitan's two 70B tensorwise rows does not identify it: the vanilla-TP row wants ~0.97
# and the async-TP one more than 1.30, their gap being the TP overlap, not the GEMM; at 0.85
# they were +3.5% / +20.5%, and +7.5% / +25.1% priced on their Grand Teton HBM2e (async TP
# unpriced). torchtitan's FP8 median |error| 6.4% at 1.10, 7.9% at 0.85; 9.5% on the HBM2e.)
TORCHAO_GEMM_SCALE = TE_GEMM_SCALE
# torchao's rowwise float8 GEMM (per-row scales: _scaled_mm's rowwise path is a CUTLASS kernel,
# at::cuda::detail::f8f8bf16_rowwise in aten/src/ATen/native/cuda/RowwiseScaledMM.cu, not
# cuBLASLt) against its tensorwise one: fitted by grid (0.40 ... 0.75 in 0.05 steps, least
# median |error|: 25.7, 16.5, 9.2, 3.2, 3.2, 6.1, 9.7, 12.9% at 0.40 ... 0.75; 0.55 and 0.60
# tie to 0.001 and the first is kept) on torchtitan's two 70B rowwise rows (torchtitan asynctp
# benchmark, 2025-06), with the tensorwise figure above, the rows priced on their Grand Teton
# HBM2e (2.4 TB/s) and the async-TP row's forward TP overlap priced (planner.engines.torchtitan
# compiled_tp_comm_overlap); the two 8B rowwise rows held out (`python -m benchmarks.fidelity
# --fit-figures` reruns it). 0.65 while async TP was priced as vanilla TP (its grid: 31.0,
# 21.8, 14.5, 8.5, 3.5, 2.0, 4.4% at 0.40 ... 0.70), 0.60 before the HBM2e was.
ROWWISE_GEMM_SCALE = 0.55


@dataclass(frozen=True)
class Recipe:
    """How an engine's kernels scale one precision: the costs the planner prices.

    cast_in_bytes / cast_grad_bytes: HBM bytes per element of each linear's input (forward)
    and of its output gradient (backward) moved by the amax reduction and the quantising casts;
    recast_in_bytes: bytes per input element cast again in backward (a library that saves the
    bf16 input); weight_cast_bytes: per linear weight element and micro-batch (forward +
    backward) where weights are cast every micro-batch; weight_copy_bytes: quantised weight
    copies kept beside the bf16 weights, per linear parameter; saves_lowp_inputs: the linears
    save their quantised inputs for backward (instead of bf16); fsdp_lowp_all_gather: FSDP
    gathers the linear weights already quantised (1 byte each) and holds them so;
    lowp_param_sync: the data-parallel parameter all-gathers move the FP8 primary weights'
    1-byte data (held as the weight copies say once gathered)."""
    name: str
    gemm_scale: float
    cast_in_bytes: float
    cast_grad_bytes: float
    recast_in_bytes: float = 0.0
    weight_cast_bytes: float = 0.0
    weight_copy_bytes: float = 0.0
    saves_lowp_inputs: bool = False
    fsdp_lowp_all_gather: bool = False
    lowp_param_sync: bool = False


# Transformer Engine (Megatron-Core, llm-foundry). Current ("tensorwise") scaling computes the
# amax of each tensor (read 2 B) before TE's fused cast-transpose (read 2 B, write the FP8
# tensor and its transpose, 1 + 1 B): 6 B per element; delayed scaling takes the scale from the
# amax history and fuses the amax into the cast: 4 B (transformer_engine/pytorch/csrc,
# cast_transpose; TE docs, "FP8 recipes"). Weights are cast once per step and cached across
# micro-batches (te.Linear `is_first_microbatch`); TE keeps the FP8 weight and its transpose
# (Hopper's FP8 GEMM takes only the TN layout): 2 B per linear parameter beside the bf16
# weight, and saves the FP8 inputs of each linear for its weight gradient.
# MXFP8 (Blackwell): a fused quantise writes row- and column-wise MXFP8 copies, 2 x (1 + 1/32)
# B, from one read of 2 B, amax per 32-element block in-kernel; weights as FP8. NVFP4 (TE's
# NVFP4BlockScaling): row- and column-wise copies of 0.5 + 1/16 B each, plus the random
# Hadamard transform of the weight-gradient inputs (read and write 2 B more), an estimate.
_TE_FP8 = dict(weight_copy_bytes=2.0, saves_lowp_inputs=True)
TE_RECIPES = {
    "tensorwise": Recipe("tensorwise", TE_GEMM_SCALE, 6.0, 6.0, **_TE_FP8),
    "delayed": Recipe("delayed", TE_GEMM_SCALE, 4.0, 4.0, **_TE_FP8),
    "mxfp8": Recipe("mxfp8", TE_GEMM_SCALE, 2 + 2 * ELEMENT_BYTES["mxfp8"],
                    2 + 2 * ELEMENT_BYTES["mxfp8"], weight_copy_bytes=2 * ELEMENT_BYTES["mxfp8"],
                    saves_lowp_inputs=True),
    "nvfp4": Recipe("nvfp4", TE_GEMM_SCALE, 2 + 2 * ELEMENT_BYTES["nvfp4"] + 4,
                    2 + 2 * ELEMENT_BYTES["nvfp4"] + 4,
                    weight_copy_bytes=2 * ELEMENT_BYTES["nvfp4"], saves_lowp_inputs=True),
}
# torchao Float8Linear (torchtitan): dynamic scaling casts every operand of every GEMM: amax
# (read 2 B) and cast (read 2, write 1): 5 B per element, for the input in forward, the output
# gradient in backward, and the input again in backward (torchao's matmul_with_hp_or_float8_args
# saves the bf16 input and weight and re-casts them in the layout the backward GEMMs need:
# torchao/float8/float8_linear.py); the weight in forward and again in backward: 10 B per
# weight element and micro-batch (torch.compile fuses the amax and cast; the bytes stay). No
# FP8 weight copy kept and bf16 activations saved. Tensorwise with FSDP2 gathers the weights
# in FP8 (torchtitan `enable_fsdp_float8_all_gather`, torchao float8 FSDP2 extension), rowwise
# does not (torchtitan float8 converter: FP8 all-gather is for tensorwise only).
# MXFP8 (torchao.prototype.mx_formats, torchtitan's "mx" converter): as tensorwise with
# 1 + 1/32 B elements, no FP8 all-gather.
_AO = dict(recast_in_bytes=5.0, weight_cast_bytes=10.0)
TORCHAO_RECIPES = {
    "tensorwise": Recipe("tensorwise", TORCHAO_GEMM_SCALE, 5.0, 5.0,
                         fsdp_lowp_all_gather=True, **_AO),
    "rowwise": Recipe("rowwise", TORCHAO_GEMM_SCALE * ROWWISE_GEMM_SCALE, 5.0, 5.0, **_AO),
    "mxfp8": Recipe("mxfp8", TORCHAO_GEMM_SCALE, 5.0, 5.0, **_AO),
}
# Transformer Engine with FP8 primary weights (Megatron-Core --fp8-param-gather: the model is
# built under te.fp8_model_init, each linear weight a Float8Tensor; Megatron-Bridge's FP8
# presets bf16_with_fp8_delayed_scaling_mixed / bf16_with_fp8_current_scaling_mixed /
# bf16_with_mxfp8_mixed set fp8_param_gather = True, src/megatron/bridge/training/
# mixed_precision.py @618e1c40b; MLPerf's NeMo GPT-3 FP8_PARAMS=True): the quantised weight
# and its transpose (Hopper) or row- and column-wise copies (MXFP8) are the parameters, so no
# bf16 linear weight is kept beside them (the fp32 master stays in the optimizer): the bytes
# per linear parameter beyond a bf16 weight are the copies' less the bf16 weight's.
# The data-parallel parameter all-gathers then move the per-tensor FP8 weights' 1-byte data
# (`lowp_param_sync`): Megatron-Core's param buffer is uint8 for them (megatron/core/
# distributed/param_and_grad_buffer.py @d98e8a64: "param_dtype: storage dtype (torch.uint8 for
# FP8/NVFP4 parameters"), NeMo's MegatronDistributedFusedAdam syncs Float8Tensor params with
# param_sync_dtype=torch.uint8 (nemo/core/optim/distributed_adam.py init_params); MXFP8 primary
# weights gather through a bf16 buffer and are quantised again (param_and_grad_buffer.py
# reuse_grad_buf_for_mxfp8_param_ag), so 2 B.
BF16_WEIGHT_BYTES = 2.0
# the per-tensor FP8 recipes (one scale a tensor; MXFP8 and NVFP4 scale blocks)
PER_TENSOR_FP8_RECIPES = ("tensorwise", "delayed")
def fp8_param_recipe(r: Recipe) -> Recipe:
    """`r` with FP8 primary weights: the copies are the weights, no bf16 weight beside them
    (bytes per linear parameter beyond a bf16 weight: below 0 where the copies are smaller
    than it, as one FP8 copy without its transpose: `on_gpu`); per-tensor FP8 weights are
    gathered as their 1-byte data (`lowp_param_sync`)."""
    return dataclasses.replace(r, weight_copy_bytes=r.weight_copy_bytes - BF16_WEIGHT_BYTES,
                               lowp_param_sync=r.name in PER_TENSOR_FP8_RECIPES)


FP8_PARAM_RECIPE_NAMES = ("tensorwise", "delayed", "mxfp8")
TE_FP8_PARAM_RECIPES = {k: fp8_param_recipe(r) if k in FP8_PARAM_RECIPE_NAMES else r
                        for k, r in TE_RECIPES.items()}
LIBRARIES = {"te": TE_RECIPES, "torchao": TORCHAO_RECIPES, "te_fp8_params": TE_FP8_PARAM_RECIPES,
             "te_v1": TE_RECIPES}
RECIPES = tuple(dict.fromkeys([*TE_RECIPES, *TORCHAO_RECIPES]))


def arch_of(gpu) -> str | None:
    return ARCH.get(gpu.name)


# The software platform each architecture runs on: a PyTorch build is CUDA or ROCm, never both
# (torch/version.py: torch.version.cuda / torch.version.hip), its "nccl" backend NCCL or RCCL;
# CPU ranks talk gloo (ProcessGroupNCCL takes CUDA tensors only). One job is one platform.
PLATFORM = {"ampere": "CUDA", "hopper": "CUDA", "blackwell": "CUDA", "cdna3": "ROCm",
            "cdna4": "ROCm", "cpu": "CPU"}


def platform_of(gpu) -> str | None:
    """CUDA, ROCm or CPU for a catalog GPU (or one built on it); None where unknown."""
    return PLATFORM.get(arch_of(gpu))


def low_precision_peak(gpu, precision: str) -> float | None:
    """Dense TFLOP/s of `precision` on `gpu` (None where the catalog has no figure), at its
    power limit as its bf16 peak is (planner.specs.Gpu tensor_peak_tflops)."""
    peak = LOW_PRECISION_PEAK_TFLOPS.get(gpu.name, {}).get(precision)
    return None if peak is None else peak * gpu.tensor_peak_tflops / gpu.peak_tflops


def gpu_precision_problem(gpu, precision: str, recipe: str | None = None,
                          flags: bool = False) -> Problem | None:
    """`gpu`'s tensor cores run `precision` (a known one; a recipe only with a low one), or the
    Problem saying why not, whatever the engine. `flags`: worded for --precision / --recipe."""
    dash = "--" if flags else ""
    if precision not in PRECISIONS:
        return Problem("precision_known", ("precision",),
                       f"{dash}precision must be one of {', '.join(PRECISIONS)}, got "
                       f"{precision!r}")
    if precision == "bf16":
        if recipe is not None:
            return Problem("recipe_needs_low_precision", ("recipe", "precision"),
                           f"{dash}recipe {recipe} needs a low {dash}precision (fp8, mxfp8, "
                           f"nvfp4)")
        return None
    arch = arch_of(gpu)
    if arch not in ARCHS[precision] or low_precision_peak(gpu, precision) is None:
        return Problem("precision_on_gpu", ("precision", "cluster"),
                       f"{dash}precision {precision} needs a GPU with {precision.upper()} "
                       f"tensor cores ({' or '.join(ARCHS[precision])}); {gpu.name} has none "
                       f"in the catalog",
                       source="Transformer Engine docs, \"Using FP8 and FP4 with Transformer "
                              "Engine\"; NVIDIA datasheets (planner.precision ARCHS)",
                       fix="" if flags else "plan it again with --precision bf16 (or on a "
                                            f"{' or '.join(ARCHS[precision])} cluster)")
    return None


def precision_problem(engine, gpu, precision: str, recipe: str | None = None,
                      flags: bool = False) -> Problem | None:
    """The one home of the precision rules: `engine` runs `precision` (and `recipe`) on `gpu`
    (`gpu_precision_problem`, then what the engine offers), or the Problem saying why not."""
    problem = gpu_precision_problem(gpu, precision, recipe, flags)
    if problem or precision == "bf16":
        return problem
    dash = "--" if flags else ""
    offered = dict(engine.precisions)
    if precision not in offered:
        runs = ", ".join(p for p, _ in engine.precisions)
        return Problem("engine_precision", ("precision", "engine"),
                       f"engine {engine.name} does not run {dash}precision {precision} (it "
                       f"runs: {runs})",
                       source=f"planner.engines.{engine.name} (precisions)",
                       fix="" if flags else f"plan it with --engine {engine.name} "
                                            f"--precision {engine.precisions[0][0]}")
    if recipe is not None and recipe not in offered[precision]:
        return Problem("engine_recipe", ("recipe", "engine"),
                       f"engine {engine.name} has no {recipe} recipe for {precision} (it has: "
                       f"{', '.join(offered[precision])})",
                       source=f"planner.engines.{engine.name} (precisions)")
    return None


def check_precision(engine, gpu, precision: str, recipe: str | None = None) -> None:
    """BadInput (exit 2, one line) unless `engine` runs `precision` (and `recipe`) on `gpu`
    (`precision_problem`, worded for the CLI's flags)."""
    problem = precision_problem(engine, gpu, precision, recipe, flags=True)
    if problem:
        raise BadInput(problem.line)


def default_recipe(engine, precision: str) -> str | None:
    if precision == "bf16":
        return None
    return dict(engine.precisions)[precision][0]


def recipe_of(engine, precision: str, recipe: str | None = None,
              library: str | None = None) -> Recipe | None:
    """The cost figures of the engine's recipe for `precision` (None for bf16), in `library`
    (default the engine's)."""
    if precision == "bf16":
        return None
    name = recipe or default_recipe(engine, precision)
    return LIBRARIES[library or engine.lowp_library][name]


@dataclass(frozen=True)
class LowPrecision:
    """What the cost model needs of a low precision on one GPU under one engine's recipe."""
    precision: str
    recipe: Recipe
    peak_tflops: float
    element_bytes: float
    # FP8 primary weights (fp8_primary_weights): the quantised tensors are the weights, which
    # Transformer Engine uses as they are (module/base.py quantize_weight, "Already-quantized
    # weight"), so no copy of a gathered weight is kept beside them
    primary_weights: bool = False


# Transformer Engine's per-tensor FP8 on GPUs whose FP8 GEMMs take every operand layout:
# Hopper's take only TN, so each quantised tensor the backward reads transposed is kept twice
# (the FP8 data and its transpose: the 1 + 1 B of the casts and the weight copies above);
# Blackwell's (compute capability 10.x) take any, and TE's per-tensor quantizers then make no
# transpose (transformer_engine/pytorch/csrc/quantizer.cpp, Float8Quantizer and
# Float8CurrentScalingQuantizer create_tensor: with_transpose = columnwise_usage &&
# !is_non_tn_fp8_gemm_supported; compute capability 10.x, from TE 2.0, 544dd14b4, 2025-02; TE
# 1.x kept it on every GPU). So on them the cast writes 1 B, not 2, and the weight is kept
# once in FP8: the recipes' transpose byte off the casts and the copies. MXFP8 keeps both its
# row- and column-wise copies (their blocks run along different axes), NVFP4 too. "te_v1":
# TE 1.x (runs before 2025-02: benchmarks.fidelity RECIPE_MEMORY_FACTS), transposes kept.
NON_TN_FP8_ARCHS = ("blackwell",)
NON_TN_FP8_LIBRARIES = ("te", "te_fp8_params")
TE_FP8_TRANSPOSE_BYTES = 1.0


def on_gpu(recipe: Recipe, library: str, gpu) -> Recipe:
    """`recipe` (of `library`) as it runs on `gpu`: Transformer Engine's per-tensor FP8 without
    the transposes on GPUs whose FP8 GEMMs take every layout (NON_TN_FP8_ARCHS)."""
    if (library in NON_TN_FP8_LIBRARIES and recipe.name in PER_TENSOR_FP8_RECIPES
            and arch_of(gpu) in NON_TN_FP8_ARCHS):
        t = TE_FP8_TRANSPOSE_BYTES
        return dataclasses.replace(recipe, cast_in_bytes=recipe.cast_in_bytes - t,
                                   cast_grad_bytes=recipe.cast_grad_bytes - t,
                                   weight_copy_bytes=recipe.weight_copy_bytes - t)
    return recipe


def fp8_primary_weights(engine, precision: str, recipe: str | None, zero: int,
                        offload_optimizer: str = "none") -> bool:
    """Whether a plan keeps FP8 primary weights (Megatron --fp8-param-gather; priced by
    TE_FP8_PARAM_RECIPES): an engine that runs them under ZeRO-3
    (Engine.zero3_fp8_primary_weights) at ZeRO-3 in an FP8 recipe that has them
    (FP8_PARAM_RECIPE_NAMES), where the optimizer stays on the GPU or the recipe is delayed
    (Megatron refuses --fp8-param-gather with --optimizer-cpu-offload in any other:
    megatron/training/arguments.py @d98e8a64 "When `--fp8-param-gather` is enabled, the
    optimizer cpu offload must be used in conjunction with `--fp8-recipe delayed`")."""
    if precision == "bf16" or not engine.zero3_fp8_primary_weights or zero < 3:
        return False
    name = recipe or default_recipe(engine, precision)
    return name in FP8_PARAM_RECIPE_NAMES and (offload_optimizer == "none"
                                               or name == "delayed")


def low_precision(engine, gpu, precision: str, recipe: str | None = None, zero: int = 0,
                  offload_optimizer: str = "none") -> LowPrecision | None:
    """The low precision a plan runs (None for bf16): the engine's recipe on `gpu`, with FP8
    primary weights where the plan keeps them (`fp8_primary_weights`: its ZeRO stage and
    optimizer offload decide)."""
    if precision == "bf16":
        return None
    check_precision(engine, gpu, precision, recipe)
    library = ("te_fp8_params" if fp8_primary_weights(engine, precision, recipe, zero,
                                                      offload_optimizer)
               else engine.lowp_library)
    r = on_gpu(recipe_of(engine, precision, recipe, library), library, gpu)
    if (library == "te_fp8_params" and zero >= 3 and engine.zero3_drops_fp8_transposes
            and r.name in PER_TENSOR_FP8_RECIPES):
        # the sharded FP8 weight's data alone (its transpose made again after each gather)
        r = dataclasses.replace(r, weight_copy_bytes=min(
            r.weight_copy_bytes, ELEMENT_BYTES["fp8"] - BF16_WEIGHT_BYTES))
    return LowPrecision(precision, r, low_precision_peak(gpu, precision),
                        ELEMENT_BYTES[precision], primary_weights=library == "te_fp8_params")
