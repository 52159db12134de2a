"""Distributed checkpoints that reshard across plans of the same model.

Layout of `--checkpoint-dir`:

    step-00000004/            a complete checkpoint (never renamed into place before complete)
        .metadata, *.distcp   torch.distributed.checkpoint: model + optimizer state
        rng/rank<r>.pt        each rank's RNG state (restored when the world size matches)
        meta.json             {step, model spec, parallelism}
        COMPLETE              marker, written last before the rename
    step-00000006.tmp/        a checkpoint being written (ignored)

Keys are the whole model's fully-qualified parameter names (`get_model_state_dict`) and the
flattened optimizer state (`state.<fqn>.exp_avg`, `param_groups.<fqn>.lr`, ...), so any plan of
the same model loads any other plan's checkpoint. A tied output weight is stored once, as
`tok_embeddings.weight`.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict,
                                                     set_model_state_dict,
                                                     set_optimizer_state_dict)

STEP_DIR = re.compile(r"^step-(\d+)$")
MARKER = "COMPLETE"
OPTS = StateDictOptions(flatten_optimizer_state_dict=True)


class CheckpointError(ValueError):
    pass


def _to_ckpt_key(key: str, tied: bool) -> str:
    if not tied:
        return key
    return re.sub(r"(^|\.)output\.weight(\.|$)", r"\1tok_embeddings.weight\2", key)


class TrainState:
    """Model parts + their optimizers (an optimizer may be None: ZeRO 1 rank owning nothing)."""

    def __init__(self, parts: list, optims: list, tied: bool):
        self.parts, self.optims, self.tied = parts, optims, tied

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
        return {ck: v for _, _, _, ck, v in self._collect()}

    def load_from(self, path: str):
        items = self._collect()
        flat = {ck: v for _, _, _, ck, v in items}
        dcp.load(flat, checkpoint_id=path)
        per_part = [({}, {}) for _ in self.parts]
        for i, kind, k, ck, _ in items:
            per_part[i][0 if kind == "model" else 1][k] = flat[ck]
        for (msd, osd), part, opt in zip(per_part, self.parts, self.optims):
            set_model_state_dict(part, msd)
            if opt is not None:
                set_optimizer_state_dict(part, opt, osd, options=OPTS)


def _step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def save(root: str, step: int, state: TrainState, meta: dict) -> Path:
    root = Path(root)
    final = _step_dir(root, step)
    tmp = final.with_name(final.name + ".tmp")
    rank = dist.get_rank()
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        (tmp / "rng").mkdir(parents=True)
    dist.barrier()
    dcp.save(state.state_dict(), checkpoint_id=str(tmp))
    torch.save({"cpu": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None},
               tmp / "rng" / f"rank{rank}.pt")
    dist.barrier()
    if rank == 0:
        (tmp / "meta.json").write_text(json.dumps({**meta, "step": step, "world_size":
                                                   dist.get_world_size()}, indent=2) + "\n")
        with open(tmp / MARKER, "w") as f:
            f.write("ok\n")
            f.flush()
            os.fsync(f.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
    dist.barrier()
    return final


def latest(root: str):
    """(step, path) of the newest complete checkpoint under `root`, or None."""
    best = None
    p = Path(root)
    if not p.is_dir():
        return None
    for d in p.iterdir():
        m = STEP_DIR.match(d.name)
        if m and d.is_dir() and (d / MARKER).is_file() and (d / "meta.json").is_file():
            s = int(m.group(1))
            if best is None or s > best[0]:
                best = (s, d)
    return best


def read_meta(path) -> dict:
    return json.loads((Path(path) / "meta.json").read_text())


def restore_rng(path, world_size: int) -> bool:
    f = Path(path) / "rng" / f"rank{dist.get_rank()}.pt"
    if read_meta(path).get("world_size") != world_size or not f.is_file():
        return False
    st = torch.load(f, weights_only=False)
    torch.set_rng_state(st["cpu"])
    if st.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(st["cuda"])
    return True
