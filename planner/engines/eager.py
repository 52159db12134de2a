"""Kernel figures of eager PyTorch training code with flash attention (FSDP stacks such as
llm-foundry, torchtitan without torch.compile, our runtime), relative to the GPU catalog's
Megatron-calibrated figures (planner.catalog.gpus).

Least-squares fitted once (`python -m benchmarks.fidelity --fit fsdp`: mean squared
log(predicted / published)) on llm-foundry's 8-64 GPU table of H100 runs (52 rows, sequence
lengths 512-65536, so attention separates from the rest). Held out: llm-foundry's 128-512 GPU
table and every torchtitan row (benchmarks/results/fidelity_2026-12-02.md); refitted by the same
procedure without llm-foundry's rows (`python -m benchmarks.fidelity --loso`, on torchtitan's
bf16 rows) to score llm-foundry's held out.

How each crosses GPUs: EAGER_GEMM_SCALE multiplies cuBLAS's large-GEMM fraction of the GPU's
tensor-core peak (CUBLAS_GEMM_FRACTION below) at the GEMM's shape; EAGER_ATTN_SCALE the GPU's
flash-attention fraction (planner.catalog.gpus attn_efficiency); EAGER_ELEMENTWISE_TRAFFIC the
fused element-wise bytes, timed at the GPU's HBM bandwidth; EAGER_LAYER_OVERHEAD_S is host
time (hooks, launches), the same seconds on every GPU.

Which attention kernel the figure describes: every kernel these engines run. llm-foundry's 8-64
GPU H100 table (llm-foundry #543, 2023-10) and its A100 tables ran MPT's Triton flash attention
(scripts/train/benchmarking/submit_benchmarks.py `--attn_impl` default 'triton', which sweep.sh
does not override); its 128-512 GPU table (#838, 2024-01, sweep.py) ran flash-attn 2.4.2 for
the 1B, 3B, 7B and 70B models and Triton for 13B and 30B; torchtitan runs PyTorch's SDPA.
FlashAttention-2 is 1.3-1.5x faster than the Triton kernel forward and about 2x backward (Dao
2023, Sec. 4.1), 1.8x over forward and backward at ATTN_BWD_FACTOR: priced so (0.83 on the
rows that ran flash-attn 2 or SDPA), the 12 flash-attn 2 rows of the 128-512 GPU table move from
+2.3% to -2.9% mean signed error and torchtitan's rows from 7.4% to 10.1% median |error| (-11%
mean): the published runs show no such gap between the kernels, so one figure prices them all.
"""

EAGER_GEMM_SCALE = 0.922          # x the GPU's GEMM efficiency: cuBLAS without Megatron's fusions
EAGER_ATTN_SCALE = 0.454          # x the GPU's attention efficiency
EAGER_ELEMENTWISE_TRAFFIC = 1.0   # fitted: no more than the fused traffic is needed
EAGER_LAYER_OVERHEAD_S = 3.51e-3  # per layer and micro-batch (FSDP hooks, launches, gathers)

# The GEMM efficiency EAGER_GEMM_SCALE multiplies, crossing GPUs through the tensor-core peak:
# cuBLAS's own large-GEMM fraction of the GPU's bf16 peak, as eager PyTorch calls cuBLAS. The
# catalog's `gemm_efficiency` is that figure on every GPU but A100, where it is a fit to
# Megatron's 2021 runs (0.72, planner.catalog.gpus: it absorbs what those runs lost beside
# their GEMMs); cuBLAS bf16 reaches ~80% of A100's peak on large shapes (NVIDIA "Matrix
# Multiplication Background" user guide, the figure the catalog quotes). Carrying the H100 fit
# to A100 through Megatron's 0.72 predicted torchtitan's eight A100 rows +8.6% slow on average
# (median |error| 9.1%); through cuBLAS's 0.80, +0.4% (3.0%): benchmarks/results/fidelity_*.md.
CUBLAS_GEMM_FRACTION = {"a100": 0.80, "a100-40g": 0.80}
