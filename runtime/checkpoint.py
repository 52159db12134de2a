"""Distributed checkpoints that reshard across plans of the same model, and never lose the last
good one.

Layout of `--checkpoint-dir`:

    step-00000004/            a complete checkpoint (never renamed into place before complete)
        .metadata, *.distcp   torch.distributed.checkpoint: model + optimizer state
        rng/rank<r>.pt        each rank's RNG state (restored when the world size matches)
        meta.json             {step, world_size, model spec, parallelism, batch, seed, data,
                              files: {relative path: {bytes, sha256}} of every other file}
        COMPLETE              marker, written last before the rename
    step-00000006.tmp/        a checkpoint being written (ignored)
    step-00000004.old/        the previous copy of step 4 while it is being replaced (a
                              fallback only if the rename of the new copy was interrupted)

Writing is atomic: everything goes into `step-N.tmp`, every file and the directory are fsynced,
the marker is written last, then the directory is renamed into place; an existing `step-N` is
moved aside first and deleted only after the new one is in place. Reading (`choose`) takes the
newest checkpoint whose marker, metadata and file checksums are all intact, and says in one line
why it skipped any newer one.

Keys are the whole model's fully-qualified parameter names (`get_model_state_dict`) and the
flattened optimizer state (`state.<fqn>.exp_avg`, `param_groups.<fqn>.lr`, ...), so any plan of
the same model loads any other plan's checkpoint. A tied output weight is stored once, as
`tok_embeddings.weight`. The learning-rate schedulers' state is `lr_scheduler.last_epoch` (the
number of steps taken), as torchtitan's LRSchedulersContainer saves only `last_epoch`: the
schedule is a pure function of it and of the run options (`runtime.optimizer.lr_factor`), so a
checkpoint of one layout resumes the same schedule under any other.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict,
                                                     set_model_state_dict,
                                                     set_optimizer_state_dict)

from planner.errors import BadInput
from runtime import outputs

STEP_DIR = re.compile(r"^step-(\d+)(\.old)?$")
MARKER = "COMPLETE"
OPTS = StateDictOptions(flatten_optimizer_state_dict=True)


class CheckpointError(ValueError):
    pass


def _to_ckpt_key(key: str, tied: bool) -> str:
    if not tied:
        return key
    return re.sub(r"(^|\.)output\.weight(\.|$)", r"\1tok_embeddings.weight\2", key)


SCHED_KEY = "lr_scheduler.last_epoch"


class TrainState:
    """Model parts + their optimizers (an optimizer may be None: ZeRO 1 rank owning nothing)
    and learning-rate schedulers (one per optimizer, None with it)."""

    def __init__(self, parts: list, optims: list, tied: bool, scheds: list = ()):
        self.parts, self.optims, self.tied = parts, optims, tied
        self.scheds = [s for s in scheds if s is not None]

    def _collect(self):
        """[(part_index, kind, original_key, ckpt_key, value)] of this rank."""
        items = []
        for i, (part, opt) in enumerate(zip(self.parts, self.optims)):
            for k, v in get_model_state_dict(part).items():
                items.append((i, "model", k, "model." + _to_ckpt_key(k, self.tied), v))
            if opt is not None:
                for k, v in get_optimizer_state_dict(part, opt, options=OPTS).items():
                    items.append((i, "optim", k, "optim." + _to_ckpt_key(k, self.tied), v))
        return items

    def state_dict(self):
        sd = {ck: v for _, _, _, ck, v in self._collect()}
        if self.scheds:     # the same on every rank that has one (dcp keeps one copy)
            sd[SCHED_KEY] = torch.tensor(self.scheds[0].last_epoch, dtype=torch.int64)
        return sd

    def load_from(self, path: str):
        """Load the model and optimizer state; the saved schedulers' `last_epoch`, or None
        from a checkpoint without it (written before schedules, or by a rank set with no
        optimizer at all)."""
        items = self._collect()
        flat = {ck: v for _, _, _, ck, v in items}
        saved = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
        if SCHED_KEY in saved:
            flat[SCHED_KEY] = torch.tensor(-1, dtype=torch.int64)
        dcp.load(flat, checkpoint_id=path)
        per_part = [({}, {}) for _ in self.parts]
        for i, kind, k, ck, _ in items:
            per_part[i][0 if kind == "model" else 1][k] = flat[ck]
        for (msd, osd), part, opt in zip(per_part, self.parts, self.optims):
            set_model_state_dict(part, msd)
            if opt is not None:
                set_optimizer_state_dict(part, opt, osd, options=OPTS)
        return int(flat[SCHED_KEY]) if SCHED_KEY in flat else None


def _step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _payload(d: Path) -> list:
    """Every file of a checkpoint directory but meta.json and the marker, sorted."""
    return sorted(f for f in d.rglob("*") if f.is_file() and f.name not in ("meta.json", MARKER))


def save(root: str, step: int, state: TrainState, meta: dict) -> Path:
    """Write `step`'s checkpoint (collective). A write that fails on any rank (a full disk)
    raises `runtime.outputs.WriteFailed` on every rank, with one line naming the checkpoint
    and the last good one, which is left as it was; the partial `.tmp` copy is removed."""
    root = Path(root)
    final = _step_dir(root, step)
    tmp = final.with_name(final.name + ".tmp")
    old = final.with_name(final.name + ".old")
    rank = dist.get_rank()

    def phase(write, needed_bytes: int = 0, on_rank0_only: bool = False):
        failure = None
        if rank == 0 or not on_rank0_only:
            try:
                write()
            except (OSError, RuntimeError, CheckpointException) as e:
                failure = outputs.describe(e, "checkpoint", final, needed_bytes)
        try:
            outputs.agree(failure)
        except outputs.WriteFailed as e:
            if rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
                if old.exists() and not final.exists():     # the replaced copy comes back
                    os.rename(old, final)
            kept = latest(root)
            raise outputs.WriteFailed(
                f"{e}; " + (f"the last good checkpoint, {kept[1]}, is kept" if kept
                            else "no earlier checkpoint")) from None

    def prepare():
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        (tmp / "rng").mkdir(parents=True)

    def write_shards():
        dcp.save(shards, checkpoint_id=str(tmp))
        rng = tmp / "rng" / f"rank{rank}.pt"
        buf = io.BytesIO()      # serialised here, written by Python: a full disk is an OSError
        torch.save({"cpu": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None},
                   buf)
        with open(rng, "wb") as f:
            f.write(buf.getvalue())
            f.flush()
            os.fsync(f.fileno())

    def finish():
        files = {}
        for f in _payload(tmp):
            _fsync_path(f)
            files[str(f.relative_to(tmp))] = {"bytes": f.stat().st_size, "sha256": _hash_file(f)}
        body = json.dumps({**meta, "step": step, "world_size": dist.get_world_size(),
                           "files": files}, indent=2) + "\n"
        for name, text in (("meta.json", body), (MARKER, "ok\n")):
            with open(tmp / name, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        for d in (tmp / "rng", tmp):
            _fsync_path(d)
        if final.exists():                 # the same step again: keep it until the new one is in
            if old.exists():
                shutil.rmtree(old)
            os.rename(final, old)
        os.rename(tmp, final)
        _fsync_path(root)
        if old.exists():
            shutil.rmtree(old)

    phase(prepare, on_rank0_only=True)
    shards = state.state_dict()
    phase(write_shards, needed_bytes=_local_bytes(shards))
    phase(finish, needed_bytes=META_MAX_BYTES, on_rank0_only=True)
    return final


def _local_bytes(state_dict: dict) -> int:
    """Bytes of this rank's shards of a state dict's tensors."""
    total = 0
    for v in state_dict.values():
        if isinstance(v, torch.Tensor):
            v = v.to_local() if hasattr(v, "to_local") else v
            total += v.numel() * v.element_size()
    return total


def candidates(root) -> list:
    """(step, path) of the checkpoints under `root` that carry the marker, newest first (a
    `step-N.old` copy after its `step-N`)."""
    p = Path(root)
    if not p.is_dir():
        return []
    found = []
    for d in p.iterdir():
        m = STEP_DIR.match(d.name)
        if m and d.is_dir() and (d / MARKER).is_file():
            found.append((int(m.group(1)), m.group(2) is not None, d))
    return [(s, d) for s, _, d in sorted(found, key=lambda t: (-t[0], t[1]))]


def verify(path, checksums: bool = True):
    """None if the checkpoint at `path` is intact, else why not (a few words)."""
    path = Path(path)
    try:
        meta = read_meta(path)
    except (OSError, ValueError, BadInput):
        return "meta.json is missing or unreadable"
    files = meta.get("files")
    if not isinstance(files, dict) or not files:
        return "meta.json lists no files (written by an older runtime?)"
    for rel, want in files.items():
        f = path / rel
        if not f.is_file():
            return f"{rel} is missing"
        if f.stat().st_size != want.get("bytes"):
            return f"{rel} has {f.stat().st_size} bytes, meta.json says {want.get('bytes')}"
        if checksums and _hash_file(f) != want.get("sha256"):
            return f"{rel} fails its sha256 checksum"
    return None


def choose(root, warn=None):
    """(step, path) of the newest intact checkpoint under `root`, or None; `warn(line)` is
    called for every newer one skipped."""
    for step, d in candidates(root):
        why = verify(d)
        if why is None:
            return step, d
        if warn is not None:
            warn(f"checkpoint {d} is damaged ({why}); falling back to an older one")
    return None


def latest(root: str):
    """(step, path) of the newest checkpoint under `root` that carries the marker, or None
    (no checksum verification: see `choose`)."""
    c = candidates(root)
    return c[0] if c else None


META_MAX_BYTES = 4 << 20     # a generous multiple of a real meta.json (a few KiB per file)


def meta_schema():
    """meta.json: {model: the plan's model fields, parallelism: the plan's parallelism, run:
    the run options trained with (absent before them), seed, data, global_batch_size, seq_len,
    step, world_size, files: {relative path: {bytes, sha256}}}, built from the planner's
    checkers and its model, parallelism and run-options schemas."""
    from planner.limits import MAX_BATCH, MAX_GPUS, MAX_SEQ_LEN
    from planner.plan import PARALLELISM, RUN
    from planner.filecheck import Int, Map, Nullable, Obj, Str
    from planner.specs import MODEL_SCHEMA
    file_entry = Obj({"bytes": Int(0, 2 ** 62), "sha256": Str(64, 64)})
    return Obj({"model": MODEL_SCHEMA, "parallelism": PARALLELISM, "run": (RUN, None),
                "seed": Int(-2 ** 63, 2 ** 64), "data": (Nullable(Str(4096)), None),
                "global_batch_size": (Int(1, MAX_BATCH), None),
                "seq_len": (Int(1, MAX_SEQ_LEN), None),
                "step": Int(0, 2 ** 62), "world_size": Int(1, MAX_GPUS),
                "files": (Map(file_entry, Str(4096), max_len=1 << 20), None)}, extra=False)


def read_meta(path) -> dict:
    """The checked meta.json of a checkpoint directory (or the file itself): a damaged or
    foreign one raises BadInput in one line."""
    from planner.filecheck import check, read_json_object, show_path
    p = os.path.join(str(path), "meta.json") if os.path.isdir(str(path)) else path
    d = read_json_object(p, "checkpoint metadata", META_MAX_BYTES)
    return check(meta_schema(), d, f"checkpoint metadata {show_path(p)}")


def restore_rng(path, world_size: int) -> bool:
    f = Path(path) / "rng" / f"rank{dist.get_rank()}.pt"
    if read_meta(path).get("world_size") != world_size or not f.is_file():
        return False
    st = torch.load(f, weights_only=False)
    torch.set_rng_state(st["cpu"])
    if st.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(st["cuda"])
    return True
