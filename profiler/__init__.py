"""`python -m profiler`: measure what the planner's cost model assumes, on this hardware.

    torchrun --nproc-per-node 8 -m profiler --model llama70b --out h100-node.json
    torchrun --standalone --nproc-per-node 2 -m profiler --model tiny.json --quick --out cpu.json
    python -m profiler merge a.json b.json --out all.json
    plan --model llama70b --cluster h100x32 --profile h100-node.json

What is measured (every rank measures at once, as in training; the slowest rank's median counts):

* compute (`profiler.compute`): forward and backward of the runtime's own `DecoderLayer` at the
  per-rank shard shapes of each tensor-parallel degree the node allows (q/k/v/MLP linears
  column-sharded, out/down projections row-sharded, exactly the local shapes `runtime.parallelize`
  produces), for several micro-batch sizes at the planned sequence length; the attention core
  alone (what selective recompute redoes); embedding, final norm + LM head + loss; the runtime's
  optimizer step (AdamW foreach, gradient norm) per parameter; a large GEMM and a copy (achieved
  matmul efficiency, memory bandwidth). Warm-up, repeats, median and spread are kept, and the
  points are fitted (time = a + c * micro-batch, per tp).
* memory: parameter bytes per layer, saved-activation bytes per layer for none / selective /
  full recompute (saved-tensor hooks on any device; on GPUs also the allocator's view), the LM
  head's saved bytes, optimizer-state bytes per parameter.
* links (`profiler.links`): all-reduce, all-gather, reduce-scatter, send/recv and all-to-all over
  message sizes (1 KiB .. 256 MiB, `--quick` caps them) for each group shape a plan can use
  (inside a node; across nodes when launched on several), as algorithm and bus bandwidth with
  the nccl-tests conventions, fitted to latency + size / bandwidth; and the slowdown of compute
  that runs beside a collective.

The output is a versioned JSON (schema in `planner.profile`) naming hardware, software and date.
GPU paths (CUDA events, allocator statistics, NCCL, bf16 autocast) follow the same code as the
CPU ones but were written without a GPU to test them on.
"""
