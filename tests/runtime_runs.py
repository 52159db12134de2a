"""Several `python -m runtime` runs in one launch, one after another in the same processes.

Starting a runtime process costs ~5 s of CPU (torch and torch.distributed imported) before any
step; a torchrun launch of 8 costs ~40 s. A test module whose checks need several runs in the
same world launches them once:

    python -m tests.runtime_runs RUNS.json                 # a world of one
    torchrun --standalone --nproc-per-node 8 -m tests.runtime_runs RUNS.json

RUNS.json is a list of argument lists of `python -m runtime`. Each run is the runtime's own
`main(argv)`; the first initialises the process group as the runtime does, and it is kept for
the later runs (the runtime's `destroy_process_group` at the end of a run is deferred to the
end of the launch), so each run builds its meshes, model, optimizer and schedule anew in the
same world. Rank 0 writes RUNS.json + ".out", after each run: [{"code": exit status,
"stdout": what the run printed}], so a test sees which run failed and what it said. The launch
exits 0 when every run did.

`launch_runs` is the tests' side: write the list, launch, read the results back; `runs_of`
names them, `ran` checks one ended with 0.
"""
from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _launcher(nproc: int) -> tuple:
    """(python, or torchrun --standalone on nproc processes; its environment: the launcher's
    variables of an enclosing launch cleared)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT"):
        env.pop(k, None)
    cmd = [sys.executable] if nproc == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         str(nproc)]
    return cmd, env


def launch(nproc: int, *args, timeout: float = 300) -> subprocess.CompletedProcess:
    """One `python -m runtime ARGS` on `nproc` CPU processes."""
    cmd, env = _launcher(nproc)
    return subprocess.run(cmd + ["-m", "runtime"] + [str(a) for a in args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def steps_of(path) -> dict:
    """The metrics file's step records, by step."""
    return {d["step"]: d for d in map(json.loads, Path(path).read_text().splitlines())
            if "step" in d}


def launch_runs(nproc: int, runs: list, path, timeout: float = 600) -> tuple:
    """Launch `runs` (argument lists) on `nproc` processes; (CompletedProcess of the launch,
    [{"code", "stdout"}] of the runs that ended, in order)."""
    path = Path(path)
    path.write_text(json.dumps([[str(a) for a in argv] for argv in runs]))
    cmd, env = _launcher(nproc)
    r = subprocess.run(cmd + ["-m", "tests.runtime_runs", str(path)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=timeout)
    out = Path(str(path) + ".out")
    return r, json.loads(out.read_text()) if out.exists() else []


def runs_of(nproc: int, named: dict, d) -> dict:
    """{name: (result, launch)} of the runs `named` ({name: runtime arguments}) launched
    together on `nproc` processes, the runs file in folder `d`; result is {"code", "stdout"},
    None for a run after a failed one (it did not run)."""
    r, results = launch_runs(nproc, list(named.values()), Path(d) / f"runs-{nproc}.json")
    results += [None] * (len(named) - len(results))
    return {name: (res, r) for name, res in zip(named, results)}


def ran(result, launched) -> dict:
    """`result` (of runs_of) ended with exit status 0; else its output and the launch's stderr
    say why."""
    assert result is not None and result["code"] == 0, \
        (result or {}).get("stdout", "") + launched.stderr[-3000:]
    return result


def main(path: str) -> int:
    import faulthandler

    import torch.distributed as dist
    faulthandler.enable()   # a crash in a run shows its Python stack in the launch's stderr

    from runtime.train import main as runtime_main
    runs = json.loads(Path(path).read_text())
    rank = int(os.environ.get("RANK", "0"))
    done = []
    destroy = dist.destroy_process_group
    dist.destroy_process_group = lambda *a, **k: None      # kept for the next run
    try:
        for argv in runs:
            text = io.StringIO()
            with contextlib.redirect_stdout(text):
                code = runtime_main(argv)
            sys.stdout.write(text.getvalue())
            done.append({"code": code, "stdout": text.getvalue()})
            if rank == 0:
                Path(path + ".out").write_text(json.dumps(done))
            if code != 0:
                break
            # what the run leaves behind (its modules, optimizer, DTensors and their pending
            # work) is freed now, on every rank at the same point, not at some allocation of
            # the next run
            gc.collect()
            if dist.is_initialized():
                dist.barrier()
    finally:
        dist.destroy_process_group = destroy
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0 if all(d["code"] == 0 for d in done) and len(done) == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
