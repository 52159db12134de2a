"""Catalog GPUs and their nodes. Each figure names its source.

Conventions: bandwidths in GB/s (1e9 bytes/s), one direction; memory in GiB as `nvidia-smi`
(rocm-smi) reports the total; `peak_tflops` is dense bf16 without sparsity; the `nvlink_*`
figures are the GPU's scale-up fabric (NVLink; AMD's xGMI), which groups inside one
`Cluster.nvlink_domain` use.

Efficiency figures (`gemm_efficiency`, `attn_efficiency`) are the fraction of the datasheet peak
that a large, well-shaped kernel reaches. `overlap_slowdown` (default 0.15 on every GPU) is the
compute lost while a collective runs beside it, as a fraction of the collective's time: NCCL
runs collectives as kernels on SMs, about 16-32 channels (one CTA each) on A100/H100 for
large messages, i.e. roughly 15-25% of H100's 132 SMs (NCCL docs, NCCL_MIN/MAX_NCHANNELS); we
take the low end. The profiler measures it. They are the defaults a profile replaces
(`plan --profile`); how they were chosen is in benchmarks/README.md (fidelity section).
"""
import dataclasses

from planner.errors import BadInput
from planner.filecheck import show
from planner.specs import Gpu

# Blackwell's fused attention, measured: NVIDIA's cuDNN SDPA benchmark on GB200 and GB300
# (NVIDIA/cudnn-frontend @3929da2 benchmark/sdpa_benchmark_training/results/{llama3.1,dsv3,
# kimiK26}/{gb200,gb300}/*_20260424_*.csv, cuDNN 9.22: bf16, causal, forward + backward, sequences
# 2048 to 32768; the rows in benchmarks/data/cudnn_sdpa_blackwell.csv). The efficiency falls
# with the keys a query attends (planner.cost.compute.attention_efficiency): the long-sequence
# fraction of the bf16 peak and the keys at which it is halved, least-squares fitted on those 15
# points per GPU by `python -m benchmarks.attention_fit` (every fitted point within 15.4% of the
# measured time; benchmarks/results/attention_blackwell_*.md). GB300's (Blackwell Ultra, whose
# softmax exponentials run twice as fast: NVIDIA, "Inside NVIDIA Blackwell Ultra", 2025) serve
# B300; GB200's serve B200, the same die at a lower clock (its peak is its own).
BLACKWELL_ATTENTION = {
    "gb200": dict(attn_efficiency=0.539, attn_half_keys=474.0),
    "gb300": dict(attn_efficiency=0.627, attn_half_keys=560.0),
}

# Blackwell's large-GEMM fraction, measured through H100's: one benchmark on both GPUs (Azure's
# AI-benchmarking-guide: superbench cublaslt_gemm, FP8 cuBLASLt on random data after 10,000
# warm-ups; ND H100 v5, ND GB200 v6 (four runs), ND GB300 v6; the rows in
# benchmarks/data/azure_cublaslt_fp8_gemm.csv). On GEMMs of 4096 and more a side GB200 sustains
# 0.566 of its FP8 datasheet peak and GB300 0.656, where H100 sustains 0.683: the GPU's clock
# under load (and the cuBLASLt version: CUDA 12.6 on H100, 12.8 on GB200, 13.0 on GB300).
# gemm_efficiency = H100's 0.70 x that ratio (0.829, 0.961), fitted
# by `python -m benchmarks.gemm_fit` (benchmarks/results/gemm_blackwell_*.md). Assumed: the ratio
# measured in FP8 holds in bf16; GB200's serves B200 and GB300's B300 (the same dies, each a
# fraction of its own datasheet peak). H200, measured 0.964 of H100 (inside GB200's run-to-run
# spread of 0.93-1.04), keeps H100's figure.
BLACKWELL_GEMM = {"gb200": dict(gemm_efficiency=0.580), "gb300": dict(gemm_efficiency=0.672)}

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
    # H200 SXM: 141 GB HBM3e (143771 MiB = 140.4 GiB in nvidia-smi), 4800 GB/s; 989 TFLOP/s
    # bf16 dense and NVLink4 900 GB/s as H100 (NVIDIA H200 datasheet; reviewed for issue 12: the
    # figures stand). Inter-node as DGX H100: DGX H200 has the same 8x400 Gb/s ConnectX-7
    # (NVIDIA DGX H200 datasheet). Efficiencies: H100's (same SMs and clocks; the extra HBM
    # bandwidth helps memory-bound kernels, which the cost model prices with hbm_gbps).
    "h200": Gpu("h200", peak_tflops=989.0, memory_gib=140.4, hbm_gbps=4800.0,
                gemm_efficiency=0.70, attn_efficiency=0.40,
                nvlink_busbw_gbps=370.0, nvlink_p2p_gbps=400.0, nvlink_latency_us=8.0,
                internode_gbps_per_gpu=46.0, internode_latency_us=15.0),
    # B200 (HGX B200): 2250 TFLOP/s bf16 dense, 192 GB HBM3e (~179 GiB usable), 8000 GB/s,
    # NVLink5 1800 GB/s total (NVIDIA Blackwell datasheet). Bus bandwidth: twice H100's ring
    # figure, an estimate until measured. Inter-node: 8x400 Gb/s ConnectX-7 as DGX H100.
    # GEMM and attention: GB200's measured figures (BLACKWELL_GEMM, BLACKWELL_ATTENTION above;
    # the same die, a fraction of its own peak).
    "b200": Gpu("b200", peak_tflops=2250.0, memory_gib=179.0, hbm_gbps=8000.0,
                **BLACKWELL_GEMM["gb200"], **BLACKWELL_ATTENTION["gb200"],
                nvlink_busbw_gbps=740.0, nvlink_p2p_gbps=800.0, nvlink_latency_us=8.0,
                internode_gbps_per_gpu=46.0, internode_latency_us=15.0),
    # ---- Blackwell (Ultra) and GB200/GB300 NVL72 (issue 12) --------------------------------
    # Memory: NVIDIA gives usable HBM per GPU as B200 180 GB (HGX B200, 1.4 TB / 8), GB200 186 GB
    # (GB200 NVL72, 13.4 TB / 72), B300 270 GB (HGX B300, 2.1 TB / 8; 288 GB of HBM3e raw),
    # GB300 279 GB (GB300 NVL72, 20 TB / 72; Verda, "NVIDIA GB300 NVL72: GPU Architecture &
    # Performance", per-GPU table). B200 reads 183359 MiB = 179.06 GiB in nvidia-smi, 0.995 of
    # its 180; the others are their figure x 0.995 in GiB, estimates until a driver reports them.
    # Inter-node: H100's measured 46 of 50 GB/s per 400 Gb/s NIC (92%) applied to each system's
    # NIC per GPU, an estimate. Latencies: H100's, an assumption (no published measurement
    # yet); GEMM and attention: measured (BLACKWELL_GEMM, BLACKWELL_ATTENTION); a profile
    # (`plan --profile`) replaces them.
    #
    # B300 (HGX B300, Blackwell Ultra): 2250 TFLOP/s bf16 dense (HGX B300: 36 PFLOP/s FP16/BF16
    # with sparsity over 8 GPUs; as B200, Blackwell Ultra adds FP4, not bf16), 8000 GB/s HBM3e,
    # NVLink5 1.8 TB/s total per GPU through the NVLink 5 switch as HGX B200 (NVIDIA HGX
    # platform page, HGX B300 / B200 table) so B200's NVLink figures. ConnectX-8 800 Gb/s per
    # GPU (HGX B300 "networking bandwidth 1.6 TB/s" = 8 x 200 GB/s bidirectional): 92 GB/s.
    "b300": Gpu("b300", peak_tflops=2250.0, memory_gib=268.6, hbm_gbps=8000.0,
                **BLACKWELL_GEMM["gb300"], **BLACKWELL_ATTENTION["gb300"],
                nvlink_busbw_gbps=740.0, nvlink_p2p_gbps=800.0, nvlink_latency_us=8.0,
                internode_gbps_per_gpu=92.0, internode_latency_us=15.0),
    # GB200 (one GPU of GB200 NVL72; catalog clusters gb200xN: 4 GPUs to a host, 72 to an
    # NVLink domain, planner.catalog.SYSTEMS): 2500 TFLOP/s bf16 dense (GB200 NVL72: 360
    # PFLOP/s FP16/BF16 with sparsity over 72 GPUs; 1200 W part), 8000 GB/s (576 TB/s / 72),
    # NVLink5 1.8 TB/s total to the rack's NVLink switches. Bus bandwidth: nccl-tests all-reduce
    # over multi-node NVLink on 2 trays (8 GPUs) reaches 811 GB/s (lixueduan.com, "GB200 MNNVL
    # NCCL test"); 800 taken for groups up to the whole rack, an estimate there. ConnectX-7
    # 400 Gb/s per GPU (4 per compute tray): 46 GB/s as DGX H100.
    "gb200": Gpu("gb200", peak_tflops=2500.0, memory_gib=185.0, hbm_gbps=8000.0,
                 **BLACKWELL_GEMM["gb200"], **BLACKWELL_ATTENTION["gb200"],
                 nvlink_busbw_gbps=800.0, nvlink_p2p_gbps=800.0, nvlink_latency_us=8.0,
                 internode_gbps_per_gpu=46.0, internode_latency_us=15.0),
    # GB300 (one GPU of GB300 NVL72; clusters gb300xN as gb200xN): 2500 TFLOP/s bf16 dense
    # (GB300 NVL72: 180 PFLOP/s FP16/BF16 dense over 72 GPUs, Verda rack table; NVIDIA's 360
    # with sparsity), 8000 GB/s (576 TB/s / 72), 288 GB HBM3e raw, NVLink5 as GB200 (130 TB/s
    # over 72 GPUs = 1.8 TB/s each), so GB200's NVLink figures. 72 ConnectX-8 800 Gb/s, one per
    # GPU (GB300 NVL72 product page): 92 GB/s.
    "gb300": Gpu("gb300", peak_tflops=2500.0, memory_gib=277.5, hbm_gbps=8000.0,
                 **BLACKWELL_GEMM["gb300"], **BLACKWELL_ATTENTION["gb300"],
                 nvlink_busbw_gbps=800.0, nvlink_p2p_gbps=800.0, nvlink_latency_us=8.0,
                 internode_gbps_per_gpu=92.0, internode_latency_us=15.0),
    # ---- AMD --------------------------------------------------------------------------------
    # MI300X (OAM, 8-GPU platform; xGMI): 1307.4 TFLOP/s bf16 dense (2614.9 with sparsity),
    # 192 GB HBM3 in 8 stacks of 24 GiB, 5300 GB/s (AMD Instinct MI300X datasheet). Memory:
    # 191.7 GiB, the 205822885888 bytes rocm-smi reports as VRAM total on MI300X systems (192
    # GiB less a driver reserve), not checked on hardware here. xGMI: each GPU has one link to
    # each of its 7 peers, 64 GB/s per direction, ~48 GB/s usable after CRC and protocol
    # overhead (AMD ROCm blog, "Understanding RCCL Bandwidth and xGMI Performance on AMD
    # Instinct MI300X", 2025): p2p between two GPUs uses one link, 48 GB/s; a collective over
    # all 8 drives all 7, at most 7 x 48 = 336 GB/s; busbw 300 taken, an estimate. Inter-node:
    # 8x400 Gb/s NICs per node as DGX H100 (the MI300X platform's reference design), 46 GB/s.
    # Latency 10 us, RCCL's small-message all-reduce being slower than NCCL's, an estimate.
    # GEMM: bf16 reaches ~45-50% of the datasheet peak on large shapes (SemiAnalysis, "MI300X
    # vs H100 vs H200 Benchmark Part 1: Training", Dec 2024), 0.47 taken; attention: H100's
    # 0.40 x (0.47 / 0.70) = 0.27, an estimate until profiled.
    "mi300x": Gpu("mi300x", peak_tflops=1307.4, memory_gib=191.7, hbm_gbps=5300.0,
                  gemm_efficiency=0.47, attn_efficiency=0.27,
                  nvlink_busbw_gbps=300.0, nvlink_p2p_gbps=48.0, nvlink_latency_us=10.0,
                  internode_gbps_per_gpu=46.0, internode_latency_us=15.0),
    # MI325X (OAM, a drop-in for the MI300X platform): the MI300X's CDNA 3 compute (1307.4
    # TFLOP/s bf16 dense, FP8 2614.9) with 256 GB HBM3E at 6000 GB/s (AMD Instinct MI325X
    # datasheet). Memory: 256 x (191.7 / 192) = 255.6 GiB, MI300X's reported fraction, an
    # estimate. xGMI, inter-node and efficiencies: MI300X's (same silicon and platform).
    "mi325x": Gpu("mi325x", peak_tflops=1307.4, memory_gib=255.6, hbm_gbps=6000.0,
                  gemm_efficiency=0.47, attn_efficiency=0.27,
                  nvlink_busbw_gbps=300.0, nvlink_p2p_gbps=48.0, nvlink_latency_us=10.0,
                  internode_gbps_per_gpu=46.0, internode_latency_us=15.0),
    # MI355X (CDNA 4, OAM, 8-GPU platform): 288 GB HBM3E at 8000 GB/s (AMD Instinct MI355X
    # datasheet); bf16 2516.6 TFLOP/s dense, half its FP8 5033.2 (planner.precision: 256 CUs x
    # 8192 FP8 FLOPs a clock x 2.4 GHz; CDNA 3 and 4 run bf16 at half the FP8 rate, as the
    # MI300X datasheet's 1307.4 / 2614.9). Memory 288 x
    # (191.7 / 192) = 287.5 GiB, an estimate. xGMI, inter-node (a 400 Gb/s NIC per GPU) and
    # efficiencies: MI300X's, estimates until profiled.
    "mi355x": Gpu("mi355x", peak_tflops=2516.6, memory_gib=287.5, hbm_gbps=8000.0,
                  gemm_efficiency=0.47, attn_efficiency=0.27,
                  nvlink_busbw_gbps=300.0, nvlink_p2p_gbps=48.0, nvlink_latency_us=10.0,
                  internode_gbps_per_gpu=46.0, internode_latency_us=15.0),
    # cpu: one process of the CPU runtime (gloo) on a small x86 machine. Rough order-of-magnitude
    # figures for a 2-core VM (fp32 AVX2 ~ 50 GFLOP/s a core, DDR ~ 10 GB/s, loopback TCP ~ 2 GB/s,
    # gloo latency ~ 50 us); meant to be replaced by `python -m profiler` measurements.
    "cpu": Gpu("cpu", peak_tflops=0.05, memory_gib=8.0, hbm_gbps=10.0,
               gemm_efficiency=0.5, attn_efficiency=0.2,
               nvlink_busbw_gbps=2.0, nvlink_p2p_gbps=2.0, nvlink_latency_us=50.0,
               internode_gbps_per_gpu=1.0, internode_latency_us=100.0),
}

# ---- the host and its storage, per node of the GPU's catalog system (planner.specs.Gpu
# host_* / nvme_*; planner.cost.offload prices what is offloaded there). Not listed: not known
# (0), so nothing is offloaded there unless a cluster JSON gives the figures.
# GPU <-> host, one direction: PCIe Gen4 x16 "64 GB/s" (A100 SXM datasheet, both directions
# together) = 32 GB/s; PCIe Gen5 x16 "128 GB/s" (H100 SXM datasheet) = 64 GB/s; Grace-Blackwell
# NVLink-C2C 900 GB/s both directions between one Grace and its two GPUs (GB200 NVL72
# datasheet) = 450 GB/s one way, 225 per GPU. Host memory bandwidth: the channels of the
# node's CPUs x their DDR rate (8 bytes a transfer): DGX A100, 2 AMD EPYC 7742 x 8 channels
# DDR4-3200 = 409.6 GB/s; DGX H100 / H200, 2 Xeon Platinum 8480C x 8 channels DDR5-4800 =
# 614.4 GB/s; DGX B200, 2 Xeon Platinum 8570 x 8 channels DDR5-5600 = 716.8 GB/s; a GB200 /
# GB300 compute tray, 2 Grace at "up to 512 GB/s" LPDDR5X each (GB200 NVL72 datasheet) =
# 1024 GB/s. Host memory: DGX A100 640GB 2 TB, DGX A100 320GB 1 TB (DGX A100 datasheet);
# DGX H100 2 TB (DGX H100 datasheet); DGX H200 2 TB (DGX H200 datasheet); DGX B200 2 TB, its
# base configuration ("2TB, configurable to 4TB", DGX B200 datasheet); a GB200 NVL72 tray 2 x
# 480 GB LPDDR5X (GB200 NVL72: "up to 17 TB LPDDR5X" over 18 trays), GB300 likewise. Taken
# as GiB as the DIMMs count them (32 x 64 GiB = 2 TiB). NVMe: the DGX data-cache drives, DGX
# A100 640GB / H100 / H200 / B200 8 x 3.84 TB NVMe U.2 = 30.72 TB = 27.9 TiB (DGX A100 320GB:
# 4 x 3.84 TB = 14.0 TiB) (the DGX datasheets); bandwidth the drives' sequential write, the
# slower direction, of a PCIe Gen4 U.2 data-center drive of that size (Samsung PM1733 3.84 TB
# datasheet: 3800 MB/s write, 7000 MB/s read) x the drives: 30.4 GB/s (15.2 for 4), an
# estimate: ZeRO-Infinity's NVMe path (DeepSpeed's aio library) reaches the drives' rate only
# with its tuned queue depth and block size (DeepSpeed docs, "ZeRO-Infinity" / aio config).
_DGX_NVME = dict(nvme_gbps=8 * 3.8, nvme_tib=8 * 3.84e12 / 2 ** 40)
HOSTS = {
    "a100": dict(host_memory_gib=2048.0, host_link_gbps=32.0, host_memory_gbps=409.6,
                 **_DGX_NVME),
    "a100-40g": dict(host_memory_gib=1024.0, host_link_gbps=32.0, host_memory_gbps=409.6,
                     nvme_gbps=4 * 3.8, nvme_tib=4 * 3.84e12 / 2 ** 40),
    "h100": dict(host_memory_gib=2048.0, host_link_gbps=64.0, host_memory_gbps=614.4,
                 **_DGX_NVME),
    "h200": dict(host_memory_gib=2048.0, host_link_gbps=64.0, host_memory_gbps=614.4,
                 **_DGX_NVME),
    "b200": dict(host_memory_gib=2048.0, host_link_gbps=64.0, host_memory_gbps=716.8,
                 **_DGX_NVME),
    "gb200": dict(host_memory_gib=960.0, host_link_gbps=225.0, host_memory_gbps=1024.0),
    "gb300": dict(host_memory_gib=960.0, host_link_gbps=225.0, host_memory_gbps=1024.0),
}
GPUS = {name: dataclasses.replace(gpu, **HOSTS.get(name, {})) for name, gpu in GPUS.items()}

# "mi300": what `mi300x16` names (catalog cluster names split at the last x before the count)
GPU_ALIASES = {"a100-80g": "a100", "h100-80g": "h100", "h100-sxm": "h100", "a100-sxm": "a100",
               "h200-sxm": "h200", "b300-sxm": "b300", "mi300": "mi300x",
               "mi325": "mi325x", "mi355": "mi355x"}


def get_gpu(name: str) -> Gpu:
    if not isinstance(name, str):
        raise BadInput(f"a GPU name must be a string, got {show(name)}")
    key = GPU_ALIASES.get(name.lower(), name.lower())
    if key not in GPUS:
        raise BadInput(f"unknown GPU {name[:60]!r}; known: {', '.join(GPUS)}")
    return GPUS[key]
