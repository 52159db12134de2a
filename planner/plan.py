"""The plan: the contract between planner, runtime and exporters (JSON, versioned).

Layout of `schema_version` 1:

    model       {name, num_layers, num_params, spec: {...Model fields...}}
    cluster     {name, num_gpus, gpus_per_node, nvlink_domain, gpu, gpu_memory_gib,
                 gpu_spec: {...}}   (nvlink_domain: gpus_per_node when absent)
    parallelism {tp, pp, dp, cp, cp_comm_type, ep, etp, zero_stage, sequence_parallel, vpp,
                 schedule, recompute, recompute_modules, rank_order, tp_comm_overlap,
                 moe_dispatcher, ep_comm_overlap, moe_capacity_factor, moe_imbalance,
                 offload_optimizer, offload_params, dp_shard, zeropp}
                 (ep, etp: 1 when absent; moe_imbalance 1, balanced routing, when absent;
                 recompute_modules ["core_attn"] when absent: what "selective" recomputes
                 of every layer, Megatron's --recompute-modules, planner.cost.recompute;
                 cp_comm_type "p2p" when absent: how a cp > 1 group exchanges K/V,
                 planner.cost.context; tp_comm_overlap, ep_comm_overlap false when absent;
                 moe_dispatcher "" when absent: the MoE token dispatcher priced,
                 planner.cost.moe, "" for a dense model; moe_capacity_factor null when
                 absent: dropless; offload_optimizer, offload_params "none" when absent:
                 "cpu" or "nvme" where that state lives, planner.cost.offload; dp_shard 0
                 when absent: ZeRO shards over all of dp x cp, else over groups of dp_shard
                 ranks replicated across the rest, HSDP; zeropp false when absent: DeepSpeed
                 ZeRO++ under ZeRO-3)
    batch       {seq_len, global_batch_size, micro_batch_size, num_microbatches}
    stages      [{index, pp_rank, chunk, layers: [first, end), recompute_layers,
                  memory_gib: {params, grads, optimizer, activations, other, total}}]
    estimate    {fits, step_time_s, tokens_per_s, tflops_per_gpu, mfu, peak_memory_gib,
                 time_breakdown_s: {compute, tp_comm, pp_comm, dp_comm_exposed, bubble, optimizer,
                                    cp_comm (cp > 1 only)}}
    search      {candidates, solver_status, seconds, ...}
    engine      the training engine the plan was priced for (planner.engines; "megatron" when
                absent, as plans before engines were)
    attention   "flash" or "eager": the attention kernel the plan was priced with
    precision   "bf16" (when absent, as plans before precision were), "fp8", "mxfp8" or "nvfp4":
                what the block linears run in (planner.precision)
    recipe      the engine's scaling recipe for a low precision ("tensorwise", "delayed",
                "rowwise", "mxfp8", "nvfp4"); null for bf16
    compile     true: the model and loss run under torch.compile, priced with fused
                element-wise kernels (planner.engines.spec with_compile; torchtitan's
                [compile] enable); false when absent
    run         {steps, lr, weight_decay, warmup_steps, lr_decay, min_lr_ratio,
                 max_grad_norm, lr_schedule_steps}: how `python -m runtime` trains the
                 plan (RunOptions; each key takes its default when absent, the runtime's
                 flags override them)

`stages` lists the pp * vpp virtual stages in model order; virtual stage i runs on pipeline rank
`pp_rank = i % pp` as its chunk `i // pp` (Megatron's interleaved assignment). `memory_gib` is
the memory of the pipeline rank that holds the stage (the same for all its chunks).
`recompute_layers` counts the stage's first layers that use `parallelism.recompute`; the others
store all activations. Ranks are laid out with `rank_order` (outermost first): tp innermost,
so a tensor-parallel group sits inside one node, then cp, dp and pp (Megatron-Core's
"tp-cp-ep-dp-pp", megatron/core/parallel_state.py). A plan written before context parallelism
has a 3-entry rank_order without cp (cp was 1): cp is read in just outside its innermost entry.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from planner import limits as B
from planner import filecheck as S
from planner.engines import DEFAULT_ENGINE, ENGINES
from planner.catalog.files import cluster_from_dict
from planner.errors import BadInput
from planner.precision import DEFAULT_PRECISION, PRECISIONS, RECIPES
from planner.layout import Stage, even_split, make_stages  # noqa: F401 (the plan's stages)
from planner.specs import MODEL_SCHEMA, PLAN_CLUSTER, Cluster, Model
from planner.rules import plan_problems
from planner.vocab import (CP_COMM_TYPES, DISPATCHERS, LR_DECAYS, OFFLOAD_DEVICES, RANK_ORDER,
                           RECOMPUTE, RECOMPUTE_MODULES, SCHEDULES)
from planner.vocab import DEFAULT_RECOMPUTE_MODULES as DEFAULT_MODULES

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Parallelism:
    tp: int
    pp: int
    dp: int
    zero_stage: int = 0
    sequence_parallel: bool = False
    vpp: int = 1
    schedule: str = "1f1b"
    recompute: str = "none"
    # what "selective" recomputes of every layer (Megatron --recompute-modules,
    # planner.cost.recompute.MODULES); the attention core in plans from before it
    recompute_modules: tuple = DEFAULT_MODULES
    cp: int = 1
    # expert parallelism (MoE models), folded out of dp x cp as Megatron's MoE parallel folding
    # does: ep ranks split the routed experts, etp is the experts' own tensor parallelism;
    # neither multiplies the world (expert data parallel = dp * cp * tp / (ep * etp))
    ep: int = 1
    etp: int = 1
    rank_order: tuple = RANK_ORDER
    cp_comm_type: str = "p2p"
    # the TP collectives overlapped with the layer's GEMMs (Megatron-Core --tp-comm-overlap,
    # tp > 1 with sequence parallelism); False in plans from before it
    tp_comm_overlap: bool = False
    # MoE: the token dispatcher the plan was priced with (planner.cost.moe.DISPATCHERS; "" for
    # a dense model, and in plans from before it: the export then takes the cheapest) and the
    # EP all-to-alls overlapped across micro-batches (Megatron-Core
    # --overlap-moe-expert-parallel-comm; False in plans from before it)
    moe_dispatcher: str = ""
    ep_comm_overlap: bool = False
    # MoE token dropping: experts padded to capacity_factor x the balanced share (Megatron
    # --moe-expert-capacity-factor --moe-pad-expert-input-to-capacity); None: dropless
    moe_capacity_factor: float | None = None
    # MoE routing imbalance the plan was priced with (the busiest expert rank's tokens over its
    # balanced share; 1: balanced): an assumption about the data, not an engine setting
    moe_imbalance: float = 1.0
    # offload (planner.cost.offload): where the optimizer states with their fp32 master
    # weights, and the parameters, live ("none", "cpu", "nvme"); "none" in plans from before it
    offload_optimizer: str = "none"
    offload_params: str = "none"
    # hybrid sharding (HSDP): ZeRO shards over groups of dp_shard consecutive ranks of dp x cp,
    # replicated across the others (planner.cost.dataparallel); 0 (and absent): over all
    dp_shard: int = 0
    # ZeRO++ (DeepSpeed ZeRO-3: qwZ, hpZ, qgZ; planner.cost.dataparallel.ZeroPP); false when
    # absent
    zeropp: bool = False

    def __post_init__(self):
        # a rank order without cp (plans and callers from before context parallelism)
        if isinstance(self.rank_order, (tuple, list)):
            object.__setattr__(self, "rank_order", with_cp(tuple(self.rank_order)))
        if isinstance(self.recompute_modules, list):
            object.__setattr__(self, "recompute_modules", tuple(self.recompute_modules))

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp


@dataclass(frozen=True)
class Batch:
    seq_len: int
    global_batch_size: int
    micro_batch_size: int
    num_microbatches: int


@dataclass(frozen=True)
class RunOptions:
    """How the runtime trains a plan: AdamW (betas 0.9/0.95, eps 1e-8: runtime.optimizer) at a
    peak rate `lr` reached by a linear warm-up over `warmup_steps`, then decayed (`lr_decay`)
    to `min_lr_ratio` x lr at the last of `steps`, as torchtitan's linear_warmup_stable_decay
    (torchtitan/components/optimizer/lr_scheduler.py); gradients clipped to a global norm of
    `max_grad_norm` (0: no clipping, Megatron's --clip-grad 0). The schedule spans
    `lr_schedule_steps` (None: the run's `steps`; torchtitan's lr_scheduler.total_steps, which
    keeps a shortened or stopped run on the full run's curve), at `min_lr_ratio` beyond it.

    Defaults: lr 8e-4 and weight decay 0.1 are torchtitan's AdamW (default_adamw,
    torchtitan/components/optimizer/optimizer.py); warm-up over a fifth of the steps when
    `warmup_steps` is None (torchtitan's guidance for lr_scheduler.warmup_steps, "normally 1/5
    of --training.steps"), more warm-up steps than `steps` warm up over all of them (as
    torchtitan clamps them); cosine decay to 1% of the peak (Llama 3 405B: 8e-5 to 8e-7, The
    Llama 3 Herd of Models, arXiv 2407.21783, section 3.4.1); max_grad_norm 1.0 (torchtitan's
    training.max_norm, Megatron's --clip-grad default, Llama 2's gradient clipping). `steps`
    20 is the runtime's default run, long enough to see a loss curve."""
    steps: int = 20
    lr: float = 8e-4
    weight_decay: float = 0.1
    warmup_steps: int | None = None
    lr_decay: str = "cosine"
    min_lr_ratio: float = 0.01
    max_grad_norm: float = 1.0
    lr_schedule_steps: int | None = None

    WARMUP_SHARE = 5           # warm-up over steps // 5 when warmup_steps is None (torchtitan)

    @property
    def schedule_steps(self) -> int:
        """The steps the learning-rate schedule spans."""
        return self.steps if self.lr_schedule_steps is None else self.lr_schedule_steps

    @property
    def warmup(self) -> int:
        """The warm-up steps of the schedule (never more than it spans)."""
        if self.warmup_steps is None:
            return self.schedule_steps // self.WARMUP_SHARE
        return min(self.warmup_steps, self.schedule_steps)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Plan:
    model: Model
    cluster: Cluster
    parallelism: Parallelism
    batch: Batch
    stages: list
    estimate: dict = field(default_factory=dict)
    search: dict = field(default_factory=dict)
    engine: str = DEFAULT_ENGINE
    attention: str = "flash"
    precision: str = DEFAULT_PRECISION
    recipe: str | None = None
    compile: bool = False
    run: RunOptions = field(default_factory=RunOptions)
    schema_version: int = SCHEMA_VERSION

    # ---- derived --------------------------------------------------------
    def stages_of_rank(self, pp_rank: int) -> list:
        return [s for s in self.stages if s.pp_rank == pp_rank]

    def rank_groups(self) -> list:
        """The group name of each pipeline rank on a mixed cluster (planner.specs.MixedCluster;
        its `pipeline`), else []."""
        cl = self.cluster
        if not getattr(cl, "pipeline", None):
            return []
        return [cl.groups[g].name for g in cl.pipeline]

    def layer_counts(self) -> list:
        """Layers held by each pipeline rank."""
        return [sum(s.num_layers for s in self.stages_of_rank(r)) for r in range(self.parallelism.pp)]

    # ---- JSON -----------------------------------------------------------
    def to_dict(self) -> dict:
        par = asdict(self.parallelism)
        par["rank_order"] = list(par["rank_order"])
        par["recompute_modules"] = list(par["recompute_modules"])
        for k in ("offload_optimizer", "offload_params"):   # written where something moves
            if par[k] == "none":
                del par[k]
        if not par["dp_shard"]:     # written under hybrid sharding only
            del par["dp_shard"]
        if not par["zeropp"]:
            del par["zeropp"]
        return {
            "schema_version": self.schema_version,
            "model": {"name": self.model.name, "num_layers": self.model.num_layers,
                      "num_params": self.model.num_params(), "spec": self.model.to_dict()},
            "cluster": self.cluster.to_dict(),
            "parallelism": par,
            "batch": asdict(self.batch),
            "stages": [{"index": s.index, "pp_rank": s.pp_rank, "chunk": s.chunk,
                        "layers": list(s.layers), "recompute_layers": s.recompute_layers,
                        "memory_gib": s.memory_gib} for s in self.stages],
            "estimate": self.estimate,
            "search": self.search,
            "engine": self.engine,
            "attention": self.attention,
            "precision": self.precision,
            "recipe": self.recipe,
            **({"compile": True} if self.compile else {}),
            "run": self.run.to_dict(),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def save(self, path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    @classmethod
    def from_dict(cls, d: dict, whole_cluster: bool = False) -> "Plan":
        """A Plan from its JSON form, checked against PLAN_SCHEMA (types, ranges, required and
        unknown keys) and then `validate` (consistency); BadInput with one line otherwise."""
        if not isinstance(d, dict) or "schema_version" not in d:
            raise BadInput("not a plan: no schema_version")
        v = d["schema_version"]
        if type(v) is not int or v != SCHEMA_VERSION:
            raise BadInput(f"plan schema_version {S.show(v)} is not supported "
                           f"(this version reads {SCHEMA_VERSION})")
        d = S.check(PLAN_SCHEMA, d, "not a valid plan")
        est = d.get("estimate", {})
        if est.get("step_time_s") is not None:      # shown as saved: then all of it
            missing = [k for k in ESTIMATE_SHOWN if k not in est]
            if missing:
                raise BadInput(f"not a valid plan: estimate has step_time_s but is missing "
                               f"{', '.join(missing)} (remove the estimate to recompute it)")
        try:
            model = Model(**d["model"]["spec"])
        except BadInput as e:
            raise BadInput(f"not a valid plan: model.spec: {e}") from None
        if d["model"]["name"] != model.name or d["model"]["num_layers"] != model.num_layers:
            raise BadInput(f"not a valid plan: model.name / model.num_layers "
                           f"({S.show(d['model']['name'])}, {d['model']['num_layers']}) differ "
                           f"from model.spec's ({S.show(model.name)}, {model.num_layers})")
        cluster = cluster_from_dict(d["cluster"], "not a valid plan: cluster")
        par = dict(d["parallelism"])
        par["rank_order"] = with_cp(tuple(par.get("rank_order", RANK_ORDER)))
        parallelism = Parallelism(**par)
        batch = Batch(**d["batch"])
        stages = [Stage(index=s["index"], pp_rank=s["pp_rank"], chunk=s["chunk"],
                        layers=tuple(s["layers"]), recompute_layers=s["recompute_layers"],
                        memory_gib=s.get("memory_gib", {})) for s in d["stages"]]
        plan = cls(model=model, cluster=cluster, parallelism=parallelism, batch=batch,
                   stages=stages, estimate=d.get("estimate", {}), search=d.get("search", {}),
                   engine=d.get("engine", DEFAULT_ENGINE), attention=d.get("attention", "flash"),
                   precision=d.get("precision", DEFAULT_PRECISION), recipe=d.get("recipe"),
                   compile=d.get("compile", False), run=RunOptions(**d.get("run", {})))
        plan.validate(whole_cluster=whole_cluster)
        return plan

    @classmethod
    def load(cls, path, whole_cluster: bool = False) -> "Plan":
        """Read and check a plan file. `whole_cluster`: refuse a plan whose tp*pp*dp*cp is not
        its cluster's GPU count (show, launch, export: the estimate and the launch lines are
        for the whole cluster); the runtime runs such plans on fewer processes."""
        d = S.read_json_object(path, "plan")
        try:
            return cls.from_dict(d, whole_cluster=whole_cluster)
        except BadInput as e:
            raise BadInput(f"plan {S.show_path(path)}: {e}") from None

    # ---- validation -----------------------------------------------------
    def validate(self, whole_cluster: bool = False) -> None:
        """Raise BadInput unless the plan is internally consistent and valid
        (planner.rules.plan_problems: the rules the search and the runtime share, its
        precision on its GPU included; with `whole_cluster`, it also uses every GPU of its
        cluster). What one engine runs of it is asked where it runs (the exporters, `plan
        launch`, the runtime's pre-flight: planner.rules.runner_problems)."""
        p, b = self.parallelism, self.batch

        def bad(msg):
            raise BadInput(f"invalid plan: {msg}")

        for k in ("tp", "pp", "dp", "cp", "vpp"):
            v = getattr(p, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                bad(f"parallelism.{k} must be a positive integer, got {S.show(v)}")
        if type(p.zero_stage) is not int or p.zero_stage not in (0, 1, 2, 3):
            bad(f"zero_stage {S.show(p.zero_stage)} not in 0..3")
        if not isinstance(p.sequence_parallel, bool):
            bad(f"sequence_parallel must be true or false, got {S.show(p.sequence_parallel)}")
        if not isinstance(p.tp_comm_overlap, bool):
            bad(f"tp_comm_overlap must be true or false, got {S.show(p.tp_comm_overlap)}")
        if not isinstance(p.ep_comm_overlap, bool):
            bad(f"ep_comm_overlap must be true or false, got {S.show(p.ep_comm_overlap)}")
        if p.tp_comm_overlap and not (p.sequence_parallel and p.tp > 1):
            bad("tp_comm_overlap needs tp > 1 with sequence_parallel (Megatron-Core "
                "--tp-comm-overlap)")
        for k in ("seq_len", "global_batch_size", "micro_batch_size", "num_microbatches"):
            v = getattr(b, k)
            if isinstance(v, bool) or not isinstance(v, int):
                bad(f"batch.{k} must be an integer, got {S.show(v)}")
        for i, s in enumerate(self.stages):
            vals = (s.index, s.pp_rank, s.chunk, s.recompute_layers, *s.layers)
            if len(s.layers) != 2 or any(isinstance(x, bool) or not isinstance(x, int)
                                         for x in vals):
                bad(f"stage {i}: index, pp_rank, chunk, layers [first, end) and "
                    f"recompute_layers must be integers")
        if p.schedule not in SCHEDULES:
            bad(f"schedule {p.schedule!r} not in {SCHEDULES}")
        if p.recompute not in RECOMPUTE:
            bad(f"recompute {p.recompute!r} not in {RECOMPUTE}")
        if (not isinstance(p.recompute_modules, tuple) or not p.recompute_modules
                or any(x not in RECOMPUTE_MODULES for x in p.recompute_modules)
                or len(set(p.recompute_modules)) != len(p.recompute_modules)):
            bad(f"recompute_modules {S.show(p.recompute_modules)} must be distinct names "
                f"of {', '.join(RECOMPUTE_MODULES)}")
        if p.recompute != "selective" and p.recompute_modules != DEFAULT_MODULES:
            bad(f"recompute_modules {', '.join(p.recompute_modules)} need recompute "
                f"selective (it is {p.recompute})")
        if self.engine not in ENGINES:
            bad(f"engine {self.engine!r} not in {tuple(ENGINES)}")
        if self.attention not in ("flash", "eager"):
            bad(f"attention {self.attention!r} not in ('flash', 'eager')")
        if self.precision not in PRECISIONS:
            bad(f"precision {self.precision!r} not in {PRECISIONS}")
        if (self.recipe is None) != (self.precision == "bf16") or (
                self.recipe is not None and self.recipe not in RECIPES):
            bad(f"recipe {S.show(self.recipe)} does not go with precision {self.precision!r} "
                f"(null for bf16, else one of {', '.join(RECIPES)})")
        if sorted(p.rank_order) != sorted(RANK_ORDER):
            bad(f"rank_order must be a permutation of {RANK_ORDER}")
        if p.dp_shard and (p.dp * p.cp) % p.dp_shard:
            bad(f"dp_shard {p.dp_shard} does not divide dp x cp = {p.dp * p.cp}")
        if p.cp_comm_type not in CP_COMM_TYPES:
            bad(f"cp_comm_type {S.show(p.cp_comm_type)} not in {CP_COMM_TYPES}")
        problems = plan_problems(self, whole_cluster)
        if problems:
            bad(problems[0])


_MEM = S.Num(ge=0.0, le=1e9)       # GiB
_POS = S.Num(ge=0.0)
PARALLELISM = S.Obj({
    "tp": S.Int(1, B.MAX_GPUS), "pp": S.Int(1, B.MAX_LAYERS), "dp": S.Int(1, B.MAX_GPUS),
    "zero_stage": (S.Enum(0, 1, 2, 3), 0), "sequence_parallel": (S.Bool(), False),
    "vpp": (S.Int(1, B.MAX_LAYERS), 1), "schedule": (S.Enum(*SCHEDULES), "1f1b"),
    "recompute": (S.Enum(*RECOMPUTE), "none"), "cp": (S.Int(1, B.MAX_GPUS), 1),
    "recompute_modules": (S.List(S.Enum(*RECOMPUTE_MODULES), 1, len(RECOMPUTE_MODULES)),
                          list(DEFAULT_MODULES)),
    "ep": (S.Int(1, B.MAX_GPUS), 1), "etp": (S.Int(1, B.MAX_GPUS), 1),
    "rank_order": (S.List(S.Enum(*RANK_ORDER), 3, 4), list(RANK_ORDER)),
    "cp_comm_type": (S.Enum(*CP_COMM_TYPES), "p2p"),
    "tp_comm_overlap": (S.Bool(), False),
    "moe_dispatcher": (S.Enum("", *DISPATCHERS), ""),
    "ep_comm_overlap": (S.Bool(), False),
    "moe_capacity_factor": (S.Nullable(S.Num(gt=0.0, le=1e3)), None),
    "moe_imbalance": (S.Num(ge=1.0, le=1e3), 1.0),
    "offload_optimizer": (S.Enum(*OFFLOAD_DEVICES), "none"),
    "offload_params": (S.Enum(*OFFLOAD_DEVICES), "none"),
    "dp_shard": (S.Int(0, B.MAX_GPUS), 0),
    "zeropp": (S.Bool(), False)})


def with_cp(order: tuple) -> tuple:
    """A rank order of a plan before context parallelism (pp, dp and tp in some order, cp 1):
    cp just outside its innermost dimension, where it sits in Megatron-Core's order."""
    if "cp" in order or len(order) != 3:
        return order
    return order[:-1] + ("cp",) + order[-1:]
BATCH = S.Obj({"seq_len": S.Int(1, B.MAX_SEQ_LEN), "global_batch_size": S.Int(1, B.MAX_BATCH),
               "micro_batch_size": S.Int(1, B.MAX_BATCH),
               "num_microbatches": S.Int(1, B.MAX_BATCH)})
STAGE = S.Obj({
    "index": S.Int(0, B.MAX_LAYERS), "pp_rank": S.Int(0, B.MAX_LAYERS),
    "chunk": S.Int(0, B.MAX_LAYERS), "layers": S.List(S.Int(0, B.MAX_LAYERS), 2, 2),
    "recompute_layers": S.Int(0, B.MAX_LAYERS),
    "memory_gib": (S.Obj({k: (_MEM, None) for k in ("params", "grads", "optimizer",
                                                     "activations", "other", "total",
                                                     "reserved", "needed")}), {})})
# estimate and search: what the planner writes is checked; keys a newer planner adds pass
ESTIMATE = S.Obj({
    "fits": (S.Bool(), None), "step_time_s": (S.Num(gt=0.0), None),
    "tokens_per_s": (_POS, None), "tflops_per_gpu": (_POS, None),
    "mfu": (S.Num(ge=0.0, le=1.0), None), "peak_memory_gib": (_MEM, None),
    "peak_reserved_gib": (_MEM, None), "peak_needed_gib": (_MEM, None),
    "memory_margin_gib": (_MEM, None),
    "capacity_gib": (S.Num(ge=-1e9, le=1e9), None),
    "host_memory_gib_per_node": (_POS, None), "host_capacity_gib_per_node": (_POS, None),
    "nvme_tib_per_node": (_POS, None), "nvme_capacity_tib_per_node": (_POS, None),
    "time_breakdown_s": (S.Map(S.Num(ge=-1e9, le=1e9), S.Str(100), max_len=100), None)},
    extra=True)
ESTIMATE_SHOWN = ("fits", "step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu",
                  "peak_memory_gib")
SEARCH = S.Obj({
    "solver_status": (S.Str(100), None), "gap": (S.Num(ge=0.0), None),
    "candidates": (S.Int(0), None), "solved": (S.Int(0), None),
    "pruned_memory": (S.Int(0), None), "pruned_bound": (S.Int(0), None),
    "seconds": (_POS, None), "search_gap": (S.Nullable(S.Num(ge=0.0)), None),
    "solver_limit_hit": (S.Int(0), None), "profile": (S.Str(4096), None),
    "profile_used": (S.List(S.Str(4096)), None), "estimate": (S.Str(4096), None)}, extra=True)
MAX_STEPS = 2 ** 40          # optimizer steps of a run (a bound on input, not a limit of training)
# the run options' checkers, also what the runtime checks its flags with (`--lr` etc.)
RUN_FIELDS = {
    "steps": S.Int(1, MAX_STEPS), "lr": S.Num(gt=0.0, le=1e3),
    "weight_decay": S.Num(ge=0.0, le=1e3), "warmup_steps": S.Nullable(S.Int(0, MAX_STEPS)),
    "lr_decay": S.Enum(*LR_DECAYS), "min_lr_ratio": S.Num(ge=0.0, le=1.0),
    "max_grad_norm": S.Num(ge=0.0, le=1e9),
    "lr_schedule_steps": S.Nullable(S.Int(1, MAX_STEPS))}
RUN = S.Obj({k: (c, getattr(RunOptions, k)) for k, c in RUN_FIELDS.items()})
PLAN_SCHEMA = S.Obj({
    "schema_version": S.Enum(SCHEMA_VERSION),
    "model": S.Obj({"name": S.Name(), "num_layers": S.Int(1, B.MAX_LAYERS),
                    "num_params": S.Int(0), "spec": MODEL_SCHEMA}),
    "cluster": PLAN_CLUSTER, "parallelism": PARALLELISM, "batch": BATCH,
    "stages": S.List(STAGE, 1, B.MAX_LAYERS),
    "estimate": (ESTIMATE, {}), "search": (SEARCH, {}),
    "engine": (S.Enum(*ENGINES), DEFAULT_ENGINE),
    "attention": (S.Enum("flash", "eager"), "flash"),
    "precision": (S.Enum(*PRECISIONS), DEFAULT_PRECISION),
    "recipe": (S.Nullable(S.Enum(*RECIPES)), None),
    "compile": (S.Bool(), False),
    "run": (RUN, {})})

