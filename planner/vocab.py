"""The plan's vocabularies: the names a plan's knobs may take.

One home for each list of choices the plan, the CLI, the cost model and the engine specs
share; this module imports nothing of the planner's, so any of them may read it. What a name
costs is the cost model's (planner.cost.*); which names an engine runs is its spec's
(planner.engines.*).
"""

# pipeline schedules (planner.cost.schedule prices them; an engine's `schedules` names those
# it runs). The zero-bubble ones split each backward into its input-gradient (B) and
# weight-gradient (W) parts (Qi et al. 2024, "Zero Bubble Pipeline Parallelism"), as
# torch.distributed.pipelining runs them (torch/distributed/pipelining/schedules.py):
# - "interleaved-zb": ScheduleInterleavedZeroBubble, the paper's ZB-1P over any number of
#   looped chunks per rank (stage i on rank i % pp);
# - "zbv": ScheduleZBVZeroBubble, the paper's ZB-V (Sec. 6): exactly 2 chunks per rank laid
#   out as a V (rank r holds stages r and 2 pp - 1 - r);
# - "dualpipev": ScheduleDualPipeV, DeepSeek's DualPipe cut in half (DeepSeek-V3 report,
#   arXiv 2412.19437 Sec. 3.2.1; github.com/deepseek-ai/DualPipe "DualPipeV"): the V layout,
#   2 chunks per rank, at least 2 pp micro-batches.
SCHEDULES = ("gpipe", "1f1b", "interleaved", "interleaved-zb", "zbv", "dualpipev")
# the schedules that run several model chunks per rank (vpp > 1)
MULTI_CHUNK_SCHEDULES = ("interleaved", "interleaved-zb", "zbv", "dualpipev")
# the V-shaped ones: exactly 2 chunks per rank (torch: "ZBV requires exactly 2 stages per
# rank"), the first and the last stage on rank 0
V_SCHEDULES = ("zbv", "dualpipev")
# the ones that defer weight gradients (W) into the bubble
ZERO_BUBBLE_SCHEDULES = ("interleaved-zb", "zbv", "dualpipev")
# the engines' own names for them, case-insensitive: torchtitan's [parallelism]
# pipeline_parallel_schedule "GPipe", "1F1B", "Interleaved1F1B" (torch.distributed.pipelining
# ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B); Megatron's interleaved schedule is
# its virtual pipeline (--num-virtual-stages-per-pipeline-rank); DeepSpeed's TrainSchedule is
# its 1F1B (deepspeed/runtime/pipe/schedule.py); torchtitan's zero-bubble names
# "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV" (ScheduleInterleavedZeroBubble, ...)
SCHEDULE_ALIASES = {"interleaved1f1b": "interleaved", "interleaved_1f1b": "interleaved",
                    "virtual": "interleaved", "trainschedule": "1f1b",
                    "interleavedzerobubble": "interleaved-zb", "zbvzerobubble": "zbv"}
# how a rank's layers avoid holding their activations: "none" holds them; recomputed,
# "selective" (the modules of RECOMPUTE_MODULES asked for), "full" (every layer's forward
# again), "op" (planner.cost.compute.op_recomputed_gemms); or "offload", moved to host memory
# and back (Megatron-Core's activation CPU offloading, which it runs only without recompute:
# planner.cost.offload). A plan's per-stage counts are the layers each applies to.
RECOMPUTE = ("none", "selective", "full", "op", "offload")
# rank order, outermost first: tp innermost, so a tensor-parallel group sits inside one node,
# then cp, dp and pp (Megatron-Core's "tp-cp-ep-dp-pp", megatron/core/parallel_state.py)
RANK_ORDER = ("pp", "dp", "cp", "tp")

# how a context-parallel group exchanges K/V (planner.cost.context prices each): Megatron-Core
# --cp-comm-type p2p | all_gather | a2a
CP_COMM_TYPES = ("p2p", "all_gather", "a2a")

# MoE token dispatchers (planner.cost.moe prices each): Megatron-Core
# --moe-token-dispatcher-type alltoall | allgather | flex
DISPATCHERS = ("alltoall", "allgather", "flex")

# what "selective" recompute may recompute of every layer: Megatron's --recompute-modules
# choices (megatron/core/transformer/transformer_config.py recompute_modules);
# planner.cost.recompute prices each
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe",
                     "shared_experts")
# what selective recompute recomputes of every layer where nothing else is asked for: the
# attention core (Korthikanti et al. 2022; Megatron's --recompute-modules default,
# megatron/core/transformer/transformer_config.py)
DEFAULT_RECOMPUTE_MODULES = ("core_attn",)

# how the runtime's learning rate decays after its linear warm-up (runtime.optimizer.lr_factor):
# torchtitan's lr_scheduler decay_type "cosine" | "linear"
# (torchtitan/components/optimizer/lr_scheduler.py, linear_warmup_stable_decay), or "constant"
# (the peak rate to the end)
LR_DECAYS = ("cosine", "linear", "constant")

def schedule_name(name: str) -> str:
    """A pipeline schedule named as this planner or an engine names it (SCHEDULE_ALIASES),
    as the planner's name; an unknown name comes back as given (lowercased) to be refused."""
    key = str(name).strip().lower()
    return SCHEDULE_ALIASES.get(key, key)

# where an offloaded state lives (planner.cost.offload): "none" -- on the GPU; "cpu" -- host
# memory (ZeRO-Offload, Ren et al. 2021; Megatron's HybridDeviceOptimizer; FSDP2's
# CPUOffloadPolicy); "nvme" -- the node's local NVMe (ZeRO-Infinity, Rajbhandari et al. 2021)
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
