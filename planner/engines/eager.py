"""Kernel figures of eager PyTorch training code with flash attention (FSDP stacks such as
llm-foundry, torchtitan without torch.compile, our runtime), relative to the GPU catalog's
Megatron-calibrated figures (planner.catalog.gpus).

Least-squares fitted once (`python -m benchmarks.fidelity --fit fsdp`: mean squared
log(predicted / published)) on llm-foundry's 8-64 GPU table of H100 runs (52 rows, sequence
lengths 512-65536, so attention separates from the rest). Held out: llm-foundry's 128-512 GPU
table and every torchtitan row (benchmarks/results/fidelity_2026-12-05.md); refitted by the same
procedure without llm-foundry's rows (`python -m benchmarks.fidelity --loso`, on torchtitan's
bf16 rows) to score llm-foundry's held out.

How each crosses GPUs: EAGER_GEMM_SCALE multiplies cuBLAS's large-GEMM fraction of the GPU's
tensor-core peak (CUBLAS_GEMM_FRACTION below) at the GEMM's shape; EAGER_ATTN_SCALE the GPU's
flash-attention fraction (planner.catalog.gpus attn_efficiency); EAGER_ELEMENTWISE_TRAFFIC the
element-wise bytes of the kernels the code runs (below), timed at the GPU's HBM bandwidth;
EAGER_LAYER_OVERHEAD_S is host time (hooks, launches), the same seconds on every GPU.

Which element-wise kernels: counted per op, not fitted (ElementwiseKernels below). MPT, the
fit's model, runs LayerNorm and GELU, one kernel each in eager PyTorch as in fused code; a
Llama in eager PyTorch runs RMSNorm (before torch's fused kernel), RoPE and SwiGLU as several
kernels each. Counted so, torchtitan's eager 8B rows of 2024-12 (Table 1 and 3, 8 and 128
H100s) went from -14.9% / -16.4% to -2.6% / -4.4%, beside their torch.compile twins at -1.5% /
-2.9% that the count prices fused; and without llm-foundry's rows the refit on torchtitan's
lands at attention 0.93 and element-wise 1.85 (with the traffic counted as fused it took 1.5
and 6.3), so llm-foundry's H100 rows held out went from 22.8% / 47.8% median / p90 |error| to
5.1% / 36.2% (benchmarks/results/fidelity_loso_2026-12-05.md).

Which attention kernel the figure describes: every kernel these engines run. llm-foundry's 8-64
GPU H100 table (llm-foundry #543, 2023-10) and its A100 tables ran MPT's Triton flash attention
(scripts/train/benchmarking/submit_benchmarks.py `--attn_impl` default 'triton', which sweep.sh
does not override); its 128-512 GPU table (#838, 2024-01, sweep.py) ran flash-attn 2.4.2 for
the 1B, 3B, 7B and 70B models and Triton for 13B and 30B; torchtitan runs PyTorch's SDPA.
FlashAttention-2 is 1.3-1.5x faster than the Triton kernel forward and about 2x backward (Dao
2023, Sec. 4.1), 1.8x over forward and backward at ATTN_BWD_FACTOR. Priced 1.5x faster on the
rows that ran flash-attn 2 or SDPA (element-wise kernels counted as below), torchtitan's rows
go from 8.4% to 10.5% median |error| (-7.4% mean, too fast) while llm-foundry's held out go
from 5.1% / 36.2% to 4.9% / 20.6%: torchtitan's runs show no such gap, so one figure prices
every kernel.
"""

from planner.cost.compute import ElementwiseKernels

EAGER_GEMM_SCALE = 0.922          # x the GPU's GEMM efficiency: cuBLAS without Megatron's fusions
EAGER_ATTN_SCALE = 0.454          # x the GPU's attention efficiency
EAGER_ELEMENTWISE_TRAFFIC = 1.0   # fitted: no more than the kernels' own traffic
# per layer and micro-batch (FSDP hooks, launches, gathers); 3.51 ms while a collective's ring
# hops inside a node were priced at the network latency (planner.cost.comm, NCCL's model)
EAGER_LAYER_OVERHEAD_S = 3.58e-3

# The GEMM efficiency EAGER_GEMM_SCALE multiplies, crossing GPUs through the tensor-core peak:
# cuBLAS's own large-GEMM fraction of the GPU's bf16 peak, as eager PyTorch calls cuBLAS. The
# catalog's `gemm_efficiency` is that figure on every GPU but A100, where it is a fit to
# Megatron's 2021 runs (0.72, planner.catalog.gpus: it absorbs what those runs lost beside
# their GEMMs); cuBLAS bf16 reaches ~80% of A100's peak on large shapes (NVIDIA "Matrix
# Multiplication Background" user guide, the figure the catalog quotes). Carrying the H100 fit
# to A100 through Megatron's 0.72 predicted torchtitan's eight A100 rows +8.6% slow on average
# (median |error| 9.1%); through cuBLAS's 0.80, +0.4% (3.0%): benchmarks/results/fidelity_*.md
# (+3.8% mean, 5.2% median, since their eager RoPE and SwiGLU kernels are counted).
CUBLAS_GEMM_FRACTION = {"a100": 0.80, "a100-40g": 0.80}

# ---- element-wise kernels as each eager code base runs them (planner.cost.compute.
# ElementwiseKernels: HBM bytes per element of one op's forward; fused: 4, gated activation 6)
# RMSNorm written as tensor expressions, x.float() -> pow(2) -> mean -> x * rsqrt(.) ->
# type_as(x) -> * weight: 6 + 8 + 4 + 8 + 6 + 4 bytes (torchtitan's norms.py RMSNorm until it
# took nn.RMSNorm, HF transformers' LlamaRMSNorm, runtime/model.py _RMSNormFn). torch's own
# nn.RMSNorm ran the same ops until its fused CUDA kernel, aten::_fused_rms_norm (PyTorch
# #153666, 2025-05; the torch 2.13 here has it), which its author measured ~9x faster than
# the unfused ops, as 36 / 4 bytes says.
RMSNORM_COMPOSITE_BYTES = 36.0
# RoPE on complex pairs (torchtitan's apply_rotary_emb: view_as_complex(x.float()) *
# freqs_cis, view_as_real, type_as): 6 + 8 + 6 bytes; HF's rotate_half in bf16 (x * cos,
# -x2 and the cat, * sin, the add) moves about the same, 4 + 6 + 4 + 6.
ROPE_EAGER_BYTES = 20.0
# runtime/model.py apply_rope: x.float(), four half-width products, a subtraction and an
# addition, the cat and type_as, in fp32: 6 + 16 + 12 + 8 + 6 bytes.
ROPE_RUNTIME_BYTES = 48.0
# SwiGLU as w2(silu(w1 x) * w3 x): silu reads and writes one (4), the product reads two and
# writes one (6).
SWIGLU_EAGER_BYTES = 10.0
# Squared ReLU as relu then the square, each reading and writing the MLP width: 4 + 4 bytes
# (runtime/model.py torch.square(F.relu(x)); HF transformers' ReLUSquaredActivation, relu then
# torch.square; Megatron-Core's squared_relu, torch.pow(F.relu(x), 2) in
# megatron/core/activations.py, not under its jit_fuser, which its MLP calls as it is: its
# bias-activation fusions cover GELU, SiLU and quick-GELU only, megatron/core/transformer/mlp.py
# @d98e8a64dd).
RELU2_EAGER_BYTES = 8.0

# HF transformers / accelerate / llm-foundry's Llama under plain FSDP (LayerNorm and GELU
# models, MPT's included, run one kernel per op either way)
HF_EAGER_KERNELS = ElementwiseKernels(rmsnorm=RMSNORM_COMPOSITE_BYTES, rope=ROPE_EAGER_BYTES,
                                      gated_act=SWIGLU_EAGER_BYTES, relu2=RELU2_EAGER_BYTES)
# torchtitan without torch.compile today: nn.RMSNorm (torchtitan/models/common/nn_modules.py)
# runs torch's fused kernel (aten::_fused_rms_norm); RoPE and SwiGLU eager
# (models/common/rope.py, feed_forward.py)
TORCHTITAN_EAGER_KERNELS = ElementwiseKernels(rope=ROPE_EAGER_BYTES,
                                              gated_act=SWIGLU_EAGER_BYTES)
# our runtime (runtime/model.py)
RUNTIME_KERNELS = ElementwiseKernels(rmsnorm=RMSNORM_COMPOSITE_BYTES, rope=ROPE_RUNTIME_BYTES,
                                     gated_act=SWIGLU_EAGER_BYTES, relu2=RELU2_EAGER_BYTES)
