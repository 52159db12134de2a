"""Catalog GPUs and their nodes. Each figure names its source.

Conventions: bandwidths in GB/s (1e9 bytes/s), one direction; memory in GiB as `nvidia-smi`
reports the total; `peak_tflops` is dense bf16 without sparsity.

Efficiency figures (`gemm_efficiency`, `attn_efficiency`) are the fraction of the datasheet peak
that a large, well-shaped kernel reaches. `overlap_slowdown` (default 0.15 on every GPU) is the
compute lost while a collective runs beside it, as a fraction of the collective's time: NCCL
runs collectives as kernels on SMs, about 16-32 channels (one CTA each) on A100/H100 for
large messages, i.e. roughly 15-25% of H100's 132 SMs (NCCL docs, NCCL_MIN/MAX_NCHANNELS); we
take the low end. The profiler measures it. They are the defaults a profile replaces
(`plan --profile`); how they were chosen is in benchmarks/README.md (fidelity section).
"""
from planner.specs import Gpu

GPUS = {
    # A100 SXM4 80GB. Peak 312 TFLOP/s bf16 dense, 2039 GB/s HBM2e: NVIDIA A100 datasheet.
    # Memory 81920 MiB (nvidia-smi). NVLink3 600 GB/s total = 300 GB/s per direction;
    # 8-GPU all-reduce bus bandwidth ~230 GB/s (nccl-tests on DGX A100, NVIDIA DGX A100 user guide).
    # Inter-node: 8x200 Gb/s HDR per node, ~24 GB/s measured per NIC (published-runs hardware notes).
    # GEMM: cuBLAS bf16 reaches ~80% of peak on ideal shapes (NVIDIA "Matrix multiplication
    # background" guide); the 0.72 used here is fitted once, as a single global constant, to the
    # 14 published A100 runs (benchmarks/fidelity.py; grid 0.72/0.75/0.78, median |error|
    # 4.8/6.6/9.4%). Flash attention fwd+bwd ~ 60% (Dao 2023, FlashAttention-2, Fig. 5).
    "a100": Gpu("a100", peak_tflops=312.0, memory_gib=80.0, hbm_gbps=2039.0,
                gemm_efficiency=0.72, attn_efficiency=0.60,
                nvlink_busbw_gbps=230.0, nvlink_p2p_gbps=250.0, nvlink_latency_us=8.0,
                internode_gbps_per_gpu=24.0, internode_latency_us=15.0),
    # A100 SXM4 40GB: as the 80GB part with 40960 MiB and 1555 GB/s HBM2 (A100 datasheet).
    "a100-40g": Gpu("a100-40g", peak_tflops=312.0, memory_gib=40.0, hbm_gbps=1555.0,
                    gemm_efficiency=0.72, attn_efficiency=0.60,
                    nvlink_busbw_gbps=230.0, nvlink_p2p_gbps=250.0, nvlink_latency_us=8.0,
                    internode_gbps_per_gpu=24.0, internode_latency_us=15.0),
    # H100 SXM5 80GB. Peak 989 TFLOP/s bf16 dense, 3350 GB/s HBM3: NVIDIA H100 datasheet.
    # Memory 81559 MiB (nvidia-smi). NVLink4 900 GB/s total; 8-GPU all-reduce busbw ~370 GB/s ring
    # (nccl-tests issues #212, #290). Inter-node 8x400 Gb/s NDR, 46-48 GB/s measured per NIC.
    # GEMM: bf16 cuBLAS ~ 700 TFLOP/s on large shapes (~70%); FlashAttention-2 on H100
    # ~ 350 TFLOP/s fwd+bwd (~35%, Dao 2023; FlashAttention-3 reaches more).
    "h100": Gpu("h100", peak_tflops=989.0, memory_gib=79.6, hbm_gbps=3350.0,
                gemm_efficiency=0.70, attn_efficiency=0.40,
                nvlink_busbw_gbps=370.0, nvlink_p2p_gbps=400.0, nvlink_latency_us=8.0,
                internode_gbps_per_gpu=46.0, internode_latency_us=15.0),
    # H200 SXM: 141 GB HBM3e (143771 MiB in nvidia-smi), 4800 GB/s; compute and NVLink as H100
    # (NVIDIA H200 datasheet).
    "h200": Gpu("h200", peak_tflops=989.0, memory_gib=140.4, hbm_gbps=4800.0,
                gemm_efficiency=0.70, attn_efficiency=0.40,
                nvlink_busbw_gbps=370.0, nvlink_p2p_gbps=400.0, nvlink_latency_us=8.0,
                internode_gbps_per_gpu=46.0, internode_latency_us=15.0),
    # B200 (HGX B200): 2250 TFLOP/s bf16 dense, 192 GB HBM3e (~179 GiB usable), 8000 GB/s,
    # NVLink5 1800 GB/s total (NVIDIA Blackwell datasheet). Bus bandwidth: twice H100's ring
    # figure, an estimate until measured. Inter-node: 8x400 Gb/s ConnectX-7 as DGX H100.
    # Efficiencies: H100's, an assumption until a profile says otherwise.
    "b200": Gpu("b200", peak_tflops=2250.0, memory_gib=179.0, hbm_gbps=8000.0,
                gemm_efficiency=0.70, attn_efficiency=0.40,
                nvlink_busbw_gbps=740.0, nvlink_p2p_gbps=800.0, nvlink_latency_us=8.0,
                internode_gbps_per_gpu=46.0, internode_latency_us=15.0),
    # cpu: one process of the CPU runtime (gloo) on a small x86 machine. Rough order-of-magnitude
    # figures for a 2-core VM (fp32 AVX2 ~ 50 GFLOP/s a core, DDR ~ 10 GB/s, loopback TCP ~ 2 GB/s,
    # gloo latency ~ 50 us); meant to be replaced by `python -m profiler` measurements.
    "cpu": Gpu("cpu", peak_tflops=0.05, memory_gib=8.0, hbm_gbps=10.0,
               gemm_efficiency=0.5, attn_efficiency=0.2,
               nvlink_busbw_gbps=2.0, nvlink_p2p_gbps=2.0, nvlink_latency_us=50.0,
               internode_gbps_per_gpu=1.0, internode_latency_us=100.0),
}

GPU_ALIASES = {"a100-80g": "a100", "h100-80g": "h100", "h100-sxm": "h100", "a100-sxm": "a100"}
