"""Helpers of the in-process CLI tests: run `plan`, check a one-line refusal, write a file."""
import json
import time

from planner.cli import main


def run(capsys, *args, limit_s=10.0):
    """(exit code, stdout, stderr) of `plan ARGS`, which must answer within limit_s."""
    t = time.perf_counter()
    code = main([str(a) for a in args])
    took = time.perf_counter() - t
    out, err = capsys.readouterr()
    assert took < limit_s, f"{args}: {took:.1f} s"
    return code, out, err


def one_line(code, err, expect=2, needle=None):
    """Exit `expect`, exactly one line on stderr, no traceback (and `needle` in it)."""
    assert code == expect, err
    assert err.startswith("plan: error:") and err.count("\n") == 1, err
    assert "Traceback" not in err
    if needle:
        assert needle in err, err


def refused(capsys, *args, needle=None):
    """stderr of `plan ARGS`, which must exit 2 with one line (`one_line`)."""
    code, _, err = run(capsys, *args)
    one_line(code, err, needle=needle)
    return err.strip()


def write(tmp_path, name, obj, raw=False):
    p = tmp_path / name
    p.write_text(obj if raw else json.dumps(obj))
    return str(p)
