"""`python -m runtime`: train the plan's model under the plan's layout.

    torchrun --standalone --nproc-per-node 8 -m runtime --plan plan.json --steps 20

Everything that can be refused is refused before any work, with one line on stderr and exit
status 2 (no traceback): bad arguments, an unreadable or invalid plan, a plan whose tp*pp*dp is
not the launched world (or, on GPUs, that puts more processes on a node than its
gpus_per_node or the visible GPUs, or splits a tp group over nodes), a layout or model this
runtime does not support. An output that cannot be written during the run (a full disk while
checkpointing or writing metrics) stops every rank with one line and exit status 1, the last
good checkpoint kept (`runtime.outputs`).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import resource
import sys
import time
import warnings
from contextlib import nullcontext
from pathlib import Path

from planner.errors import BadInput


DEFAULT_TIMEOUT_S = 300.0
LONG_STEP_S = 60.0        # a predicted step longer than this gets a warning before any work


class Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise Refused(f"runtime: {message}")


def parse_args(argv):
    ap = _Parser(prog="python -m runtime", description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", required=True, help="plan JSON (from `plan ... --out`)")
    ap.add_argument("--steps", type=int, default=None,
                    help="optimizer steps of the whole run (default: the plan's run.steps, 20)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", default="synthetic",
                    help="'synthetic' or a token file: .npy (1-D integer array), .i32/.int32 "
                         "(raw int32) or anything else (raw uint16, nanoGPT .bin)")
    ap.add_argument("--metrics", default=None, help="JSON-lines file written by rank 0")
    ap.add_argument("--checkpoint-dir", default=None)
    ap.add_argument("--checkpoint-every", type=int, default=0,
                    help="also checkpoint every K steps (needs --checkpoint-dir); "
                         "a checkpoint is always written at the end when a directory is given")
    ap.add_argument("--resume", action="store_true",
                    help="continue from the newest intact checkpoint in --checkpoint-dir (start "
                         "fresh if it holds none): the form to give `torchrun --max-restarts N`")
    ap.add_argument("--overwrite-checkpoints", action="store_true",
                    help="a fresh run deletes the checkpoints already in --checkpoint-dir "
                         "(otherwise it refuses to start)")
    ap.add_argument("--lr", type=float, default=None,
                    help="AdamW peak learning rate (default: the plan's run.lr, 8e-4)")
    ap.add_argument("--weight-decay", type=float, default=None,
                    help="AdamW weight decay (default: the plan's run.weight_decay, 0.1)")
    ap.add_argument("--warmup-steps", type=int, default=None,
                    help="steps of linear learning-rate warm-up (default: the plan's "
                         "run.warmup_steps; a fifth of the steps when that is null)")
    ap.add_argument("--lr-decay", default=None,
                    help="decay after the warm-up: cosine, linear or constant (default: the "
                         "plan's run.lr_decay, cosine)")
    ap.add_argument("--min-lr-ratio", type=float, default=None,
                    help="the last step's learning rate over the peak (default: the plan's "
                         "run.min_lr_ratio, 0.01)")
    ap.add_argument("--max-grad-norm", type=float, default=None,
                    help="clip gradients to this global norm, 0 for none (default: the plan's "
                         "run.max_grad_norm, 1.0)")
    ap.add_argument("--lr-schedule-steps", type=int, default=None,
                    help="steps the learning-rate schedule spans (default: the plan's "
                         "run.lr_schedule_steps; the run's steps when that is null)")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                    help="seconds a collective may wait for the other ranks before the job "
                         f"fails (default {DEFAULT_TIMEOUT_S:.0f})")
    a = ap.parse_args(argv)
    from planner.plan import RUN_FIELDS
    from planner.filecheck import Invalid
    a.run_overrides = {}
    for name, checker in RUN_FIELDS.items():      # the plan's run options' own checks
        v = getattr(a, name)
        if v is not None:
            try:
                a.run_overrides[name] = checker(v, "--" + name.replace("_", "-"))
            except Invalid as e:
                raise Refused(f"runtime: {e}") from None
    if a.checkpoint_every < 0:
        raise Refused(f"runtime: --checkpoint-every must be >= 0, got {a.checkpoint_every}")
    if not (math.isfinite(a.timeout) and a.timeout > 0):
        raise Refused(f"runtime: --timeout must be a positive number of seconds, got {a.timeout}")
    if (a.resume or a.checkpoint_every or a.overwrite_checkpoints) and not a.checkpoint_dir:
        raise Refused("runtime: --resume, --checkpoint-every and --overwrite-checkpoints need "
                      "--checkpoint-dir")
    if a.resume and a.overwrite_checkpoints:
        raise Refused("runtime: --resume continues the checkpoints that --overwrite-checkpoints "
                      "would delete: give one of them")
    return a


def check_world(plan, world_size: int, local_world_size: int, on_gpu: bool,
                visible_gpus: int | None = None) -> None:
    """Refuse a plan for the processes launched (planner.rules.launch_problems): the world
    must be the plan's; on GPUs, at most a node's GPUs and the visible ones per node, tp groups
    inside a node. `visible_gpus` defaults to torch.cuda.device_count() on GPUs."""
    from planner.rules import launch_problems
    if on_gpu and visible_gpus is None:
        import torch
        visible_gpus = torch.cuda.device_count()
    problems = launch_problems(plan, world_size, local_world_size, on_gpu, visible_gpus)
    if problems:
        raise Refused(f"runtime: {problems[0]}")


def preflight(plan, world_size: int, local_world_size: int, on_gpu: bool,
              visible_gpus: int | None = None) -> None:
    """Every check of a plan before torch.distributed starts (Refused, one line): the launched
    world, the model (runtime.model.check_supported) and the layout
    (runtime.parallelize.check_layout: planner.rules's rules)."""
    from runtime.model import UnsupportedModel, check_supported
    from runtime.parallelize import LayoutError, check_layout
    check_world(plan, world_size, local_world_size, on_gpu, visible_gpus)
    try:
        check_supported(plan.model)
        check_layout(plan)
    except (UnsupportedModel, LayoutError) as e:
        raise Refused(f"runtime: {e}") from None


def prepare(argv):
    """Everything checked before torch.distributed starts: (args, plan, source)."""
    from planner.plan import Plan
    args = parse_args(argv)
    try:
        plan = Plan.load(args.plan)
    except BadInput as e:
        raise Refused(f"runtime: {e}") from None
    import torch
    from runtime.data import DataError, make_source
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    preflight(plan, world, local_world, torch.cuda.is_available())
    args.run = run_options(args, plan)
    r = args.run
    if r.warmup_steps is not None and r.warmup_steps > r.schedule_steps:
        _say(f"runtime: warning: {r.warmup_steps} warm-up steps exceed the schedule's "
             f"{r.schedule_steps}; warming up over all of them")
    try:
        source = make_source(args.data, plan.model.vocab_size, plan.batch.seq_len, args.seed)
    except DataError as e:
        raise Refused(f"runtime: {e}") from None
    args.resume_from = None
    if args.checkpoint_dir:
        args.resume_from = check_checkpoint_dir(args, plan)
    check_writable(args)
    return args, plan, source


def run_options(args, plan):
    """The run options this run trains with: the plan's (planner.plan.RunOptions), each flag
    given overriding its own."""
    return dataclasses.replace(plan.run, **args.run_overrides)


def _say(line: str) -> None:
    """A warning on stderr, from rank 0 only."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(line, file=sys.stderr, flush=True)


def run_identity(args, plan) -> dict:
    """What a checkpoint must share with the run that resumes it (the layout may differ)."""
    data = args.data
    if data != "synthetic":
        data = f"{Path(data).name} ({Path(data).stat().st_size} bytes)"
    return {"model": plan.model.to_dict(), "seed": args.seed, "data": data,
            "global_batch_size": plan.batch.global_batch_size, "seq_len": plan.batch.seq_len}


def _differences(saved: dict, now: dict) -> list:
    out = []
    for k, v in now.items():
        w = saved.get(k)
        if k == "model" and isinstance(w, dict) and isinstance(v, dict):
            fields = [f for f in v if w.get(f) != v[f]] + [f for f in w if f not in v]
            out += [f"model {f} {w.get(f)!r} vs {v.get(f)!r}" for f in fields]
        elif w != v:
            out.append(f"{k} {w!r} vs {v!r}")
    return out


def check_checkpoint_dir(args, plan):
    """Refuse a checkpoint directory this run must not touch; on --resume, the (step, path) to
    resume from (or None: start fresh), after checksums and run identity are checked."""
    from runtime import checkpoint as ckpt
    root = Path(args.checkpoint_dir)
    if root.exists() and not root.is_dir():
        raise Refused(f"runtime: --checkpoint-dir {root} is not a directory")
    found = ckpt.candidates(root)
    if not args.resume:
        held = sorted(d.name for d in root.iterdir() if ckpt.STEP_DIR.match(d.name)) \
            if root.is_dir() else []
        if held and not args.overwrite_checkpoints:
            raise Refused(f"runtime: --checkpoint-dir {root} already holds checkpoints "
                          f"({held[-1]} newest); --resume continues them, "
                          f"--overwrite-checkpoints deletes them")
        return None
    if not found:
        return None
    chosen = ckpt.choose(root, warn=lambda line: _say(f"runtime: warning: {line}"))
    if chosen is None:
        raise Refused(f"runtime: no intact checkpoint in {root}: all {len(found)} fail their "
                      f"checks (newest: {found[0][1].name}, {ckpt.verify(found[0][1])})")
    meta = ckpt.read_meta(chosen[1])
    diff = _differences(meta, run_identity(args, plan))
    if diff:
        raise Refused(f"runtime: cannot resume {chosen[1]}: it was written by another run ("
                      + "; ".join(diff) + "; checkpoint's vs this run's)")
    saved, now = meta.get("run"), args.run.to_dict()
    if saved is not None and saved != now:
        changed = [f"{k} {saved.get(k)!r} -> {v!r}" for k, v in now.items() if saved.get(k) != v]
        _say(f"runtime: warning: resuming {chosen[1].name} with other run options ("
             + ", ".join(changed) + "); this run's apply from its step on")
    return chosen


def _probe_dir(d: Path, what: str) -> None:
    import tempfile
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=d, prefix=".write-probe-")
        os.close(fd)
        os.unlink(name)
    except OSError as e:
        raise Refused(f"runtime: {what} {d} is not writable ({e.strerror or e})") from None


def check_writable(args) -> None:
    """Every output path is writable, before any work."""
    if args.checkpoint_dir:
        _probe_dir(Path(args.checkpoint_dir), "--checkpoint-dir")
    if args.metrics:
        m = Path(args.metrics)
        if m.is_dir():
            raise Refused(f"runtime: --metrics {m} is a directory")
        _probe_dir(m.parent, "the directory of --metrics")
        if m.exists() and not os.access(m, os.W_OK):
            raise Refused(f"runtime: --metrics {m} is not writable")


def warn_long_steps(args, plan) -> None:
    """One warning line when the plan predicts long steps on the hardware this runs on (or
    was made for other hardware, where its prediction says little)."""
    import torch
    pred = (plan.estimate or {}).get("step_time_s")
    kind = plan.cluster.gpu.name
    here_gpu = torch.cuda.is_available()
    if (kind == "cpu") == here_gpu:
        _say(f"runtime: warning: the plan was made for {plan.cluster.name} ({kind}); on this "
             f"{'GPU' if here_gpu else 'CPU'} machine its predicted step time "
             f"({_duration(pred) if pred else 'none'}) does not apply")
    elif pred and pred > LONG_STEP_S:
        steps = run_options(args, plan).steps
        _say(f"runtime: warning: the plan predicts {_duration(pred)} per step on "
             f"{plan.cluster.name}, {_duration(pred * steps)} for {steps} steps; "
             f"re-plan with a smaller --global-batch for quicker steps")


def _duration(s: float) -> str:
    s = float(s)
    if s < 1:
        return f"{s:.2f} s"
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


class Progress:
    """Rank 0, stderr a terminal: one line rewritten after every step (step, loss, tokens/s
    and MFU, ETA from the mean step time after the first)."""

    def __init__(self, first: int, last: int, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.on = self.stream.isatty()
        self.first, self.last, self.times, self.line = first, last, [], ""
        if self.on and first <= last:
            self._write(f"step {first - 1}/{last}  first step running...")

    def _write(self, text: str, end: str = "") -> None:
        self.stream.write("\r\x1b[2K" + text + end)
        self.stream.flush()

    def redraw(self) -> None:
        if self.on and self.line:
            self._write(self.line)

    def clear(self) -> None:
        """Before a line on stdout (the same terminal, most likely)."""
        if self.on:
            self._write("")

    def step(self, step: int, loss: float, speed: str, dt: float) -> None:
        self.times.append(dt)
        if not self.on:
            return
        steady = self.times[1:] or self.times
        eta = (self.last - step) * sum(steady) / len(steady)
        self.line = f"step {step}/{self.last}  loss {loss:.4f}  {speed}  ETA {_duration(eta)}"
        self._write(self.line, end="\n" if step == self.last else "")
        if step == self.last:
            self.line = ""


class Speed:
    """A step's tokens/s and MFU beside the plan's prediction of them (`plan.estimate`
    tokens_per_s and mfu, absent in a plan without an estimate). The FLOPs are the planner's
    (planner.cost.stage.model_flops_per_step, Megatron's count, no recompute) over the
    launched ranks and the peak of the plan's GPUs (`cluster.peak_tflops_per_gpu`), as the
    estimate's mfu is defined: measured over predicted MFU is predicted over measured step
    time."""

    def __init__(self, plan, world_size: int):
        from planner.cost.stage import model_flops_per_step
        b = plan.batch
        self.tokens = b.global_batch_size * b.seq_len
        self.flops = model_flops_per_step(plan.model, b.seq_len, b.global_batch_size)
        # the GPUs' mean peak (a mixed cluster's groups differ; else its one GPU's)
        self.peak_flops = plan.cluster.peak_tflops_per_gpu * 1e12 * world_size
        est = plan.estimate or {}
        self.pred_tokens_per_s, self.pred_mfu = est.get("tokens_per_s"), est.get("mfu")

    def of(self, dt: float):
        """(tokens/s, MFU) of a step of `dt` seconds."""
        return self.tokens / dt, self.flops / dt / self.peak_flops

    def text(self, dt: float, short: bool = False) -> str:
        tps, mfu = self.of(dt)
        pt = "" if self.pred_tokens_per_s is None or short else \
            f" (plan {self.pred_tokens_per_s:,.0f})"
        pm = "" if self.pred_mfu is None else f" (plan {100 * self.pred_mfu:.2f}%)"
        return f"{tps:,.0f} tok/s{pt}  MFU {100 * mfu:.2f}%{pm}"


def describe_run(run) -> str:
    """The run options in a few words: "AdamW lr 8e-04 wd 0.1, warm-up 4, cosine to 1%, clip
    1"."""
    decay = ("constant" if run.lr_decay == "constant"
             else f"{run.lr_decay} to {100 * run.min_lr_ratio:g}%")
    clip = f"clip {run.max_grad_norm:g}" if run.max_grad_norm > 0 else "no clipping"
    span = ("" if run.lr_schedule_steps is None
            else f" over {run.lr_schedule_steps} steps")
    return (f"AdamW lr {run.lr:.0e} wd {run.weight_decay:g}, warm-up {run.warmup}, {decay}"
            f"{span}, {clip}")


def _peak_memory_gib(on_gpu: bool) -> float:
    import torch
    if on_gpu:
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30   # KiB on Linux


class Trainer:
    def __init__(self, args, plan, source):
        import torch
        import torch.distributed as dist
        self.args, self.plan, self.source = args, plan, source
        self.on_gpu = torch.cuda.is_available()
        if self.on_gpu:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            self.device = torch.device("cuda", torch.cuda.current_device())
            backend = "nccl"
        else:
            self.device = torch.device("cpu")
            backend = "gloo"
        if not dist.is_initialized():
            if "RANK" not in os.environ:     # plain `python -m runtime`: a world of one
                os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                                  MASTER_ADDR="127.0.0.1",
                                  MASTER_PORT=os.environ.get("MASTER_PORT", str(_free_port())))
            timeout = datetime.timedelta(seconds=self.args.timeout)
            store = _restart_safe_store(timeout)
            if store is None:
                dist.init_process_group(backend, timeout=timeout)
            else:
                dist.init_process_group(backend, timeout=timeout, store=store,
                                        rank=int(os.environ["RANK"]),
                                        world_size=int(os.environ["WORLD_SIZE"]))
        self.rank = dist.get_rank()
        self._build()

    # -- construction -------------------------------------------------------------------------
    def _build(self):
        """Meshes, the parts of the model on this pp rank laid out by `parallelize`, the syncs
        each step runs after backward, the optimizers (ZeRO 1: of the owned parameters), the
        pipeline schedule."""
        import torch
        import torch.distributed as dist
        stage_parts = self._build_parts()
        self._build_grad_syncs(stage_parts)
        self._build_optimizers()
        self.schedule = None
        if len(self.plan.stages) > 1:
            from runtime.pipeline import build_schedule
            self.schedule, self.stages = build_schedule(self.plan, stage_parts,
                                                        self.pp_mesh.get_group(), self.device)
        # ZeRO 0/1 on CUDA: bf16 autocast over the whole step; its cache keeps one bf16 cast of
        # each weight for the step (priced: planner/engines/runtime.py autocast_copy_bytes)
        self.autocast = (torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=True)
                         if self.on_gpu and self.plan.parallelism.zero_stage < 2
                         else nullcontext())
        dist.barrier()

    def _build_parts(self) -> list:
        """[(stage, part)] of this pp rank: split from the whole model on the meta device, laid
        out (TP -> EP -> activation checkpointing -> FSDP), then allocated and initialised."""
        import torch
        from runtime import parallelize as par
        from runtime.model import Transformer
        from runtime.pipeline import split_model
        plan = self.plan
        m = self.meshes = par.build_meshes(plan, self.device.type)
        self.mesh, self.tp_mesh, self.dp_mesh, self.pp_mesh = m.world, m.tp, m.dp, m.pp
        self.expert_mesh, self.edp_mesh = m.expert, m.edp
        self.dp_rank, self.pp_rank, self.tp_rank = (m.dp.get_local_rank(),
                                                    m.pp.get_local_rank(),
                                                    m.tp.get_local_rank())
        self.dp_group = m.dp.get_group()
        with torch.device("meta"):
            whole = Transformer(plan.model)
        stage_parts = split_model(whole, plan, self.pp_rank)
        self.first_stage = any(st.index == 0 for st, _ in stage_parts)
        self.last_stage = any(st.index == len(plan.stages) - 1 for st, _ in stage_parts)
        self.layouts = []
        for st, part in stage_parts:
            self.layouts.append(par.parallelize(part, st, plan, m, self.on_gpu))
            par.materialize_and_init(part, plan.model, self.args.seed, self.device)
        self.recomputed = [i for lay in self.layouts for i in lay.recomputed]
        self.parts = [part for _, part in stage_parts]
        return stage_parts

    def _build_grad_syncs(self, stage_parts) -> None:
        """The gradient syncs `train_step` runs after backward: the dp reduction (ZeRO 0/1:
        `GradAllReduce`, launched during each chunk's last backward), the TP placement fix-ups,
        the replicated kv-head sum, the tied-embedding sum over the pipeline, the expert
        gradients' sum over edp (or FSDP's rescale). Built with the dp reducer last: a sharded
        parameter's gradient is sliced (`AlignGradPlacements`' hook) before its hook reads it."""
        from runtime import expert
        from runtime.data_parallel import GradAllReduce
        from runtime.model import clean_name
        from runtime.pipeline import TiedGradSync
        from runtime.tensor_parallel import AlignGradPlacements, TpReplicatedGradSync
        plan, p = self.plan, self.plan.parallelism
        named = [(clean_name(n), q) for part in self.parts for n, q in part.named_parameters()]
        # under ep, the routed experts' gradients and ZeRO 1 ownership go over edp, not dp
        self.experts = ([q for n, q in named if expert.is_expert_param(n)]
                        if self.expert_mesh is not None else [])
        expert_ids = {id(e) for e in self.experts}
        self.dense = [q for _, q in named if id(q) not in expert_ids]
        self.align_grads = (AlignGradPlacements([q for _, q in named]) if p.tp > 1 else None)
        replicated = {n for lay in self.layouts for n in lay.tp_replicated}
        self.tp_sync = (TpReplicatedGradSync([q for n, q in named if n in replicated],
                                             self.tp_mesh.get_group()) if replicated else None)
        # tied embeddings split over the pipeline: sum the two copies' gradients
        self.tied = plan.model.tied_embeddings
        self.tied_sync = None
        if self.tied and p.pp > 1:
            last = len(plan.stages) - 1
            self.tied_sync = TiedGradSync(
                self.mesh, [w for st, part in stage_parts
                            for w in ([part.tok_embeddings.weight] if st.index == 0 else [])
                            + ([part.output.weight] if st.index == last else [])])
        self.grad_sync = self.expert_grad_sync = None
        if p.zero_stage <= 1:
            # reduced while each chunk's last micro-batch backward runs (DDP's overlap)
            self.grad_sync = GradAllReduce(self.dense, self.dp_group, p.dp,
                                           chunks=[list(part.parameters())
                                                   for part in self.parts])
            if self.experts:
                self.expert_grad_sync = GradAllReduce(self.experts, self.edp_mesh.get_group(),
                                                      expert.expert_grad_divisor(plan))
        elif self.experts:
            self.expert_grad_sync = expert.ExpertGradScale(self.experts, plan)

    def _build_optimizers(self) -> None:
        """One AdamW per part; under ZeRO 1 (dp > 1) of the parameters this dp rank owns (the
        experts': this edp rank), the others' updates broadcast by their owners after the step."""
        from runtime.data_parallel import Zero1ParamSync, zero1_owners
        from runtime.optimizer import adamw, schedulers
        p, a = self.plan.parallelism, self.args
        self.param_sync = self.expert_param_sync = None
        if not (p.zero_stage == 1 and p.dp > 1):
            self.optims = [adamw(list(part.parameters()), a.run.lr, a.run.weight_decay)
                           for part in self.parts]
            self.scheds = schedulers(self.optims, a.run)
            return
        owners = zero1_owners(self.dense, p.dp)
        mine = {id(q) for q, o in zip(self.dense, owners) if o == self.dp_rank}
        self.param_sync = Zero1ParamSync(self.dense, owners, self.dp_group, p.dp)
        if self.experts:
            edp = self.edp_mesh.size()
            e_owners = zero1_owners(self.experts, edp)
            mine |= {id(q) for q, o in zip(self.experts, e_owners)
                     if o == self.edp_mesh.get_local_rank()}
            self.expert_param_sync = Zero1ParamSync(self.experts, e_owners,
                                                    self.edp_mesh.get_group(), edp)
        self.optims = [adamw([q for q in part.parameters() if id(q) in mine], a.run.lr,
                             a.run.weight_decay) for part in self.parts]
        self.scheds = schedulers(self.optims, a.run)

    # -- one step -----------------------------------------------------------------------------
    def train_step(self, step0: int, memory=None):
        """0-based step; returns (mean token loss of the global batch, global gradient norm
        before clipping, learning rate of the update), the same on every rank. `memory`: a
        `runtime.memory.StepMemory` sampled after every micro-batch's backward and after the
        update."""
        import torch
        import torch.distributed as dist
        from runtime.data import local_batch
        from runtime.optimizer import clip_grads, grad_norm_sq_local
        from runtime.pipeline import loss_fn
        plan = self.plan
        b = plan.batch
        torch.manual_seed(hash((self.args.seed, step0, self.rank)) & 0x7FFFFFFF)
        inputs, targets = local_batch(self.source, step0, b.global_batch_size,
                                      plan.parallelism.dp, self.dp_rank)
        inputs, targets = inputs.to(self.device), targets.to(self.device)
        for opt in self.optims:
            if opt is not None:
                opt.zero_grad(set_to_none=True)
        for part in self.parts:   # parameters without an optimizer (ZeRO 1) too
            part.zero_grad(set_to_none=True)

        local_loss = torch.zeros((), device=self.device)
        sample = memory.sample if memory is not None else (lambda: None)
        if memory is not None and self.schedule is not None:
            memory.stages = self.stages
        for ci, st in enumerate(self.stages if self.schedule is not None else ()):
            st.after_backward = memory.sample if memory is not None else None
            st.before_last_backward = (None if self.grad_sync is None
                                       else (lambda ci=ci: self.grad_sync.arm(ci)))
            st.before_scale_grads = (None if self.grad_sync is None
                                     else (lambda ci=ci: self.grad_sync.flush(ci)))
        with self.autocast, (memory.hooks() if memory is not None else nullcontext()):
            if self.schedule is None:
                nmb = b.num_microbatches
                part = self.parts[0]
                fsdp = hasattr(part, "set_reshard_after_backward")
                for i, (x, y) in enumerate(zip(inputs.chunk(nmb), targets.chunk(nmb))):
                    if fsdp:   # gradients reduce-scattered every micro-batch (sharded, as
                        # planned); ZeRO 2 keeps the parameters whole until the last one
                        part.set_reshard_after_backward(plan.parallelism.zero_stage >= 3
                                                        or i == nmb - 1)
                    loss = loss_fn(part(x), y)
                    if i == nmb - 1 and self.grad_sync is not None:
                        self.grad_sync.arm(0)
                    (loss / nmb).backward()
                    local_loss += loss.detach() / nmb
                    sample()
            else:
                losses = []
                kwargs = {"target": targets, "losses": losses} if self.last_stage else {}
                kwargs["return_outputs"] = False    # no micro-batch's logits kept
                if self.first_stage:
                    self.schedule.step(inputs, **kwargs)
                else:
                    self.schedule.step(**kwargs)
                if self.last_stage:
                    local_loss = torch.stack([l.detach().float() for l in losses]).mean()

        if self.grad_sync is not None:    # ZeRO 0/1: finish the dp reduction backward started
            self.grad_sync()              # (linear, so before the tp / tied sums below)
        if self.align_grads is not None:
            self.align_grads()
        if self.tp_sync is not None:
            self.tp_sync()
        if self.tied_sync is not None:
            self.tied_sync()
        if self.expert_grad_sync is not None:
            self.expert_grad_sync()
        # the tied output copy of a pipeline's last stage is the embedding: count it once
        norm_params = [q for part in self.parts for n, q in part.named_parameters()
                       if not (self.tied_sync is not None and n == "output.weight")]
        gsq = grad_norm_sq_local(norm_params, plan.parallelism.tp * plan.parallelism.dp)
        # one all-reduce for the loss (mean over the dp replicas of the last stage, tp rank 0
        # speaking for its group) and the global gradient norm, which clipping needs before
        # the update (runtime.optimizer: torchtitan's clip_grad_norm_ in one collective)
        speaks = self.last_stage and self.tp_rank == 0
        t = torch.stack([local_loss.double().cpu() * speaks, torch.tensor(float(speaks),
                                                                          dtype=torch.float64),
                         gsq]).to(self.device)
        dist.all_reduce(t)
        t = t.cpu()
        loss, norm = float(t[0] / t[1]), float(t[2]) ** 0.5
        max_norm = self.args.run.max_grad_norm
        if max_norm > 0:      # every copy of every gradient, the tied output weight's too
            clip_grads([q for part in self.parts for q in part.parameters()], max_norm, norm)
        lr = next((g["lr"] for o in self.optims if o is not None for g in o.param_groups),
                  None)
        for opt in self.optims:
            if opt is not None:
                opt.step()
        for sched in self.scheds:
            if sched is not None:
                sched.step()
        if self.param_sync is not None:
            self.param_sync()
        if self.expert_param_sync is not None:
            self.expert_param_sync()
        sample()
        if lr is None:        # a rank owning no parameters: the schedule's rate
            from runtime.optimizer import run_factor
            lr = self.args.run.lr * run_factor(self.args.run, step0)
        return loss, norm, lr

    def resume_schedule(self, start: int) -> None:
        """After a checkpoint of step `start` is loaded: this run's options (the saved
        rates are replaced, as its peak rate and weight decay may differ) and the schedule at
        0-based step `start`."""
        from runtime.optimizer import set_schedule_step
        r = self.args.run
        for opt, sched in zip(self.optims, self.scheds):
            if opt is None:
                continue
            for g in opt.param_groups:
                g["weight_decay"], g["initial_lr"] = r.weight_decay, r.lr
            sched.base_lrs = [r.lr] * len(opt.param_groups)
        set_schedule_step(self.scheds, start)

    def train_state(self):
        from runtime.checkpoint import TrainState
        return TrainState(self.parts, self.optims, self.tied, self.scheds)


def _restart_safe_store(timeout):
    """Under torchrun, the workers share the launcher's TCPStore, which outlives a restart of
    the worker group: a restarted group would read the dead group's gloo/NCCL addresses. Give
    each attempt (TORCHELASTIC_RESTART_COUNT) its own key prefix. None: the default env://."""
    import torch.distributed as dist
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          int(os.environ["WORLD_SIZE"]), is_master=False, timeout=timeout)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"runtime/attempt_{attempt}/", store)


# how long the other ranks wait for rank 0 to say why the plan is refused (a guard: rank 0
# refuses within the same start-up as they do, well under a second apart on 2 loaded cores)
REFUSAL_WAIT_S = 60


def _refuse(message: str) -> int:
    """Every rank refuses alike (the same plan, the same world) and rank 0 says the one line.
    torchrun ends the other workers as soon as one exits, so under torchrun the others first
    wait, on the launcher's store, until rank 0 has said it: without the wait the line was lost
    whenever another rank was quicker than rank 0 (a 2-rank refusal in CI, 2026-12-04). A rank
    that cannot learn that rank 0 said it (rank 0 did not refuse: a path only this node lacks;
    no launcher store) says its own line, with its rank."""
    rank = int(os.environ.get("RANK", "0"))
    said = rank == 0
    if said:
        print(message, file=sys.stderr, flush=True)
    try:
        store = _restart_safe_store(datetime.timedelta(seconds=REFUSAL_WAIT_S))
        if store is not None:
            if rank == 0:
                store.set("refused", "said")
            else:
                store.wait(["refused"])
                said = True
    except Exception:            # no launcher store, it went, or rank 0 never refused
        pass
    if not said:
        print(message.replace("runtime: ", f"runtime: rank {rank}: ", 1), file=sys.stderr,
              flush=True)
    return 2


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _trim_metrics(path: Path, keep_upto: int):
    """On resume: keep the step lines up to the checkpoint's step, drop later ones/summaries."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "step" in d and d["step"] <= keep_upto:
            kept.append(line)
    path.write_text("".join(l + "\n" for l in kept))


def _clear_checkpoint_dir(root: Path, args) -> None:
    """Rank 0, after every check: --overwrite-checkpoints deletes the directory's checkpoints;
    --resume moves aside (`step-N.damaged`) those newer than the one it resumes, which failed
    their checks, so that new checkpoints of those steps are not mixed up with them."""
    import shutil
    from runtime import checkpoint as ckpt
    if not root.is_dir():
        return
    for d in sorted(root.iterdir()):
        m = ckpt.STEP_DIR.match(d.name) or (d.name.endswith(".tmp") and d.name.startswith("step-"))
        if not m or not d.is_dir():
            continue
        if args.overwrite_checkpoints:
            shutil.rmtree(d)
        elif args.resume and args.resume_from is not None and m is not True \
                and int(m.group(1)) > args.resume_from[0]:
            dst = d.with_name(d.name.replace(".old", "") + ".damaged")
            if dst.exists():
                shutil.rmtree(dst)
            os.rename(d, dst)


def _rank0_write(rank: int, what: str, path, write) -> None:
    """Rank 0 calls `write()`; every rank then learns whether it could (one tiny collective:
    `runtime.outputs.agree`), so a full disk stops all of them at the same point."""
    from runtime import outputs
    failure = None
    if rank == 0:
        try:
            write()
        except OSError as e:
            failure = outputs.describe(e, what, path)
    outputs.agree(failure)


def run(args, plan, source) -> int:
    """Train; 0, or 1 after one line on stderr when an output could not be written (a full
    disk: `runtime.outputs`; the last good checkpoint is kept)."""
    import torch.distributed as dist
    from runtime.outputs import WriteFailed
    try:
        _train(args, plan, source)
        status = 0
    except WriteFailed as e:
        if dist.get_rank() == 0:
            if sys.stderr.isatty():          # over the progress line
                sys.stderr.write("\r\x1b[2K")
            print(f"runtime: {e}", file=sys.stderr, flush=True)
        status = 1
    # every rank ends here (failed at the same point, or trained): none tears its process
    # group down, nor exits before rank 0's line, while another still runs a collective
    # (gloo aborted one rank with "terminate called without an active exception" at the end
    # of a 2-rank ZeRO-3 run under load, benchmarks/closed_loop, 2026-12-03)
    dist.barrier()
    dist.destroy_process_group()
    return status


def _train(args, plan, source) -> None:
    import torch
    import torch.distributed as dist
    from runtime import checkpoint as ckpt

    # pipeline stages return hidden states that the schedule never modifies in place
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    tr = Trainer(args, plan, source)
    rank = tr.rank
    start = 0
    if args.checkpoint_dir and rank == 0:
        _clear_checkpoint_dir(Path(args.checkpoint_dir), args)
    dist.barrier()
    if args.resume:
        if args.resume_from is None:
            if rank == 0:
                print(f"runtime: no complete checkpoint in {args.checkpoint_dir}; starting fresh",
                      flush=True)
        else:
            start, path = args.resume_from
            saved_step = tr.train_state().load_from(str(path))
            if saved_step is not None and saved_step != start:
                raise ckpt.CheckpointError(f"checkpoint {path} of step {start} holds a learning-"
                                           f"rate schedule at step {saved_step}")
            tr.resume_schedule(start)
            ckpt.restore_rng(path, dist.get_world_size())
            if rank == 0:
                print(f"runtime: resumed from {path} (step {start})", flush=True)
    metrics = Path(args.metrics) if args.metrics else None
    if metrics is not None:
        def start_metrics():
            metrics.parent.mkdir(parents=True, exist_ok=True)
            if start > 0:
                _trim_metrics(metrics, start)
            else:
                metrics.write_text("")
        _rank0_write(rank, "--metrics", metrics, start_metrics)
    meta = {**run_identity(args, plan), "parallelism": plan.to_dict()["parallelism"]}
    meta["run"] = args.run.to_dict()
    p, run = plan.parallelism, args.run
    if rank == 0:
        print(f"runtime: {plan.model.name} tp={p.tp} pp={p.pp} dp={p.dp} ep={p.ep} "
              f"zero={p.zero_stage} vpp={p.vpp} schedule={p.schedule} recompute={p.recompute} "
              f"sp={p.sequence_parallel} on {dist.get_world_size()} x {tr.device.type}; "
              f"{describe_run(run)}; steps {start + 1}..{run.steps}", flush=True)

    if rank == 0 and start >= run.steps:
        print(f"runtime: checkpoint is at step {start}, nothing left of {run.steps} steps",
              flush=True)
    speed = Speed(plan, dist.get_world_size())
    progress = Progress(start + 1, run.steps) if rank == 0 else None
    times, mfus = [], []
    last_saved = start if args.resume and start else None
    for step0 in range(start, run.steps):
        if tr.on_gpu:
            torch.cuda.synchronize()
        memory = None
        if step0 == start:       # the first step of this run is measured
            from runtime.memory import StepMemory
            memory = StepMemory(tr.parts, tr.optims, tr.on_gpu)
        t0 = time.perf_counter()
        loss, gnorm, lr = tr.train_step(step0, memory)
        if tr.on_gpu:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        times.append(dt)
        peak = torch.tensor(_peak_memory_gib(tr.on_gpu), dtype=torch.float64)
        if not tr.on_gpu:
            dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        else:
            peak = peak.to(tr.device)
            dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        tps, mfu = speed.of(dt)
        mfus.append(mfu)
        rec = {"step": step0 + 1, "loss": loss, "step_time_s": dt, "tokens_per_s": tps,
               "mfu": mfu, "peak_memory_gib": float(peak), "grad_norm": gnorm, "lr": lr,
               "clipped": bool(run.max_grad_norm > 0 and gnorm > run.max_grad_norm)}
        if memory is not None:
            mine = memory.result(tr.pp_rank)
            every = [None] * dist.get_world_size()
            dist.all_gather_object(every, mine)
            rec["measured_memory_gib"] = every
        if rank == 0:
            progress.clear()
            print(f"step {rec['step']:>5}  loss {loss:.6f}  grad norm {gnorm:.4f}"
                  f"{' (clipped)' if rec['clipped'] else ''}  lr {lr:.3e}  {dt:.3f} s  "
                  f"{speed.text(dt)}  peak {rec['peak_memory_gib']:.2f} GiB", flush=True)
            progress.step(rec["step"], loss, speed.text(dt, short=True), dt)
        if metrics is not None:
            _rank0_write(rank, "--metrics", metrics, lambda: _append(metrics, rec))
        done = step0 + 1
        if args.checkpoint_dir and (
                (args.checkpoint_every and done % args.checkpoint_every == 0)
                or done == run.steps):
            path = ckpt.save(args.checkpoint_dir, done, tr.train_state(), meta)
            last_saved = done
            if rank == 0:
                progress.clear()
                print(f"runtime: checkpoint {path}", flush=True)
                progress.redraw()

    if rank == 0:
        steady = times[1:] if len(times) > 1 else times
        measured = sum(steady) / len(steady) if steady else None
        predicted = plan.estimate.get("step_time_s") if plan.estimate else None
        summary = {"steps": len(times), "first_step": start + 1,
                   "measured_step_time_s": measured,
                   "predicted_step_time_s": predicted,
                   "measured_over_predicted": (measured / predicted
                                               if measured and predicted else None),
                   "tokens_per_s": speed.of(measured)[0] if measured else None,
                   "predicted_tokens_per_s": speed.pred_tokens_per_s,
                   "mfu": speed.of(measured)[1] if measured else None,
                   "predicted_mfu": speed.pred_mfu,
                   "last_checkpoint_step": last_saved}
        pred = f"{predicted:.4f} s" if predicted else "n/a"
        meas = f"{measured:.4f} s" if measured else "n/a"
        print(f"summary: step time measured {meas} (mean over steps after the first), "
              f"predicted {pred}"
              + (f"; {speed.text(measured)}" if measured else ""), flush=True)
    if metrics is not None:
        _rank0_write(rank, "--metrics", metrics, lambda: _append(metrics, {"summary": summary}))
    dist.barrier()


def _append(path: Path, record: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args, plan, source = prepare(argv)
    except Refused as e:
        return _refuse(str(e))
    warn_long_steps(args, plan)
    return run(args, plan, source)
