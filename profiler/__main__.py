"""python -m profiler --model MODEL [--seq-len N] [--quick] [--out FILE]
python -m profiler merge A.json B.json ... --out ALL.json
python -m profiler show FILE          (one line per measured figure the planner would use)

Run the first form under torchrun (one process per GPU; on a CPU machine, e.g.
`torchrun --standalone --nproc-per-node 2 -m profiler ...`, gloo). Errors are one line on stderr,
exit 2.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from planner.errors import BadInput


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise BadInput(message)


def _measure(argv) -> int:
    p = _Parser(prog="python -m profiler", description="Measure a node for the planner.")
    p.add_argument("--model", required=True, help="catalog name or config.json (as for plan)")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (default: as plan does)")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repeats (< 1 min on CPU)")
    p.add_argument("--statistic", choices=("median", "min"), default="median",
                   help="which statistic of the repeats `plan --profile` uses (min on a shared "
                        "machine, where other jobs only add time); both are always recorded")
    p.add_argument("--out", default="profile.json")
    a = p.parse_args(argv)
    if a.seq_len is not None and a.seq_len < 1:
        raise BadInput(f"--seq-len must be positive, got {a.seq_len}")
    from planner.catalog import get_model
    get_model(a.model)                     # refuse unknown models before starting anything
    _check_writable(a.out)                 # and an --out that cannot be written
    from profiler.run import run_profile
    prof = run_profile(a, lambda s: print(s, flush=True))
    if prof is not None:
        _write_profile(prof, a.out)
        print(f"profile written to {a.out} ({prof['settings']['seconds']} s)", flush=True)
    return 0


def _check_writable(path) -> None:
    """Refuse an --out that cannot be written, before minutes of measuring (every rank probes
    with a file of its own, so ranks do not race on the one path)."""
    p = Path(path)
    if p.is_dir():
        raise BadInput(f"--out {path}: is a directory")
    if p.exists() and not os.access(p, os.W_OK):
        raise BadInput(f"--out {path}: cannot write (permission denied)")
    probe = p.parent / f".{p.name}.{os.getpid()}.probe"
    try:
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise BadInput(f"--out {path}: cannot write ({e.strerror})") from None


def _write_profile(prof: dict, path) -> None:
    """Write a profile the planner will read: checked with the planner's own profile schema
    first. One that fails is kept beside it (`.rejected`), so the measurements are not lost."""
    from planner.profile import validate
    text = json.dumps(prof, indent=1) + "\n"
    try:
        validate(json.loads(text), str(path))
    except BadInput as e:
        Path(str(path) + ".rejected").write_text(text)
        raise BadInput(f"{e} (measurements kept in {path}.rejected)") from None
    Path(path).write_text(text)


def _merge(argv) -> int:
    p = _Parser(prog="python -m profiler merge", description="Merge profiles of several nodes.")
    p.add_argument("profiles", nargs="+")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    from planner.profile import load_profile, merge_profiles
    _check_writable(a.out)
    merged = merge_profiles([load_profile(x) for x in a.profiles])
    _write_profile(merged.data, a.out)
    print(f"merged {len(a.profiles)} profiles into {a.out}")
    return 0


def _show(argv) -> int:
    p = _Parser(prog="python -m profiler show")
    p.add_argument("profile")
    p.add_argument("--model", help="list what applies to this model (default: the profiled one)")
    p.add_argument("--cluster", help="cluster to apply to (default: the catalog GPU x world size)")
    a = p.parse_args(argv)
    from planner.catalog import get_cluster, get_model
    from planner.profile import apply_profile, load_profile
    prof = load_profile(a.profile)
    model = get_model(a.model) if a.model else prof.default_model()
    cluster = get_cluster(a.cluster) if a.cluster else prof.default_cluster()
    _, _, notes = apply_profile(prof, cluster, model)
    print(f"{a.profile}: {prof.describe()}")
    for n in notes:
        print(f"  {n}")
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "merge":
            return _merge(argv[1:])
        if argv and argv[0] == "show":
            return _show(argv[1:])
        return _measure(argv)
    except BadInput as e:
        print(f"profiler: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
