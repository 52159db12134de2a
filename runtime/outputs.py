"""What happens when the run cannot write an output (a full disk, a quota, an I/O error): every
rank learns it at the same point, the run stops with one line naming the path and the reason
(exit 1), and the last good checkpoint stays as it was (`runtime.checkpoint.save` writes into a
temporary directory and renames it into place only when complete)."""
from __future__ import annotations

import errno
import os
from pathlib import Path

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class WriteFailed(Exception):
    """An output the run could not write; str() is the one line to print."""


def _os_errors(err):
    """The OSErrors inside `err`: its cause / context chain and, for a checkpoint write, the
    per-rank failures torch.distributed.checkpoint collects (CheckpointException.failures)."""
    seen, todo = set(), [err]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError):
            yield e
        todo += [e.__cause__, e.__context__]
        for wrapped in (getattr(e, "failures", None) or {}).values():
            todo.append(wrapped[0] if isinstance(wrapped, tuple) else wrapped)


def free_bytes(path) -> int:
    """Bytes an unprivileged writer may still use on the file system of `path` (or of its
    nearest existing parent)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    st = os.statvfs(p)
    return st.f_bavail * st.f_frsize


def describe(err: BaseException, what: str, path, needed_bytes: int = 0) -> str:
    """One line for a failed write of `what` at `path`. torch's writers (torch.save to a path,
    torch.distributed.checkpoint) turn a full disk into a RuntimeError ("unexpected pos ...",
    torch 2.13) that drops the errno: a failure while the file system has less room left than
    this write needed is read as a full disk."""
    oses = list(_os_errors(err))
    try:
        full = free_bytes(path) <= needed_bytes
    except OSError:
        full = False
    if any(e.errno in NO_SPACE for e in oses) or full:
        return f"no space left on device writing {what} {path}"
    reason = next((e.strerror for e in oses if e.strerror), None)
    if reason is None:
        lines = str(err).strip().splitlines()
        reason = lines[0][:200] if lines else type(err).__name__
    return f"cannot write {what} {path}: {reason}"


def agree(failure: str | None) -> None:
    """Collective over the world: raise WriteFailed on every rank when any rank failed (with
    the first failing rank's line), else return. One tiny all-reduce when nothing failed."""
    import torch
    import torch.distributed as dist
    if not dist.is_initialized() or dist.get_world_size() == 1:
        if failure is not None:
            raise WriteFailed(failure)
        return
    device = (torch.device("cuda", torch.cuda.current_device())
              if dist.get_backend() == "nccl" else torch.device("cpu"))
    flag = torch.tensor([float(failure is not None)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item() == 0:
        return
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, failure)
    raise WriteFailed(next(f for f in every if f is not None))
