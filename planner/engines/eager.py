"""Kernel figures of eager PyTorch training code with flash attention (FSDP stacks such as
llm-foundry, torchtitan without torch.compile, our runtime), relative to the GPU catalog's
Megatron-calibrated figures (planner.catalog.gpus).

Least-squares fitted once (`python -m benchmarks.fidelity --fit fsdp`: mean squared
log(predicted / published)) on llm-foundry's 8-64 GPU table of H100 runs (52 rows, sequence
lengths 512-65536, so attention separates from the rest). Held out: llm-foundry's 128-512 GPU
table and every torchtitan row (benchmarks/results/fidelity_2026-12-02.md).
"""

EAGER_GEMM_SCALE = 0.922          # x the GPU's GEMM efficiency: cuBLAS without Megatron's fusions
EAGER_ATTN_SCALE = 0.454          # x the GPU's attention efficiency
EAGER_ELEMENTWISE_TRAFFIC = 1.0   # fitted: no more than the fused traffic is needed
EAGER_LAYER_OVERHEAD_S = 3.51e-3  # per layer and micro-batch (FSDP hooks, launches, gathers)
