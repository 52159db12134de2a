"""Fixtures shared by test modules, and how the suite is spread over processes.

The suite runs on pytest-xdist workers (pyproject.toml addopts: `-n auto --dist loadgroup`):
each test module on one worker, its module-scoped fixtures built once; modules that share a
session fixture's work name one xdist_group (test_readme and test_runtime_example: the README's
examples, each run once). `python -m pytest -n 0` runs it all in one process.
"""
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

# The text reports' expected lines are the default width's (planner.cli: 120 columns where
# $COLUMNS is unset). xdist's workers set COLUMNS=80, and a shell may export its own.
os.environ.pop("COLUMNS", None)

# Workers on `-n auto`: one per CPU, at most this many (each holds torch and the planner's
# caches, and a multi-process test launches up to 8 ranks of its own)
MOST_WORKERS = 4


def pytest_xdist_auto_num_workers(config):
    return max(1, min(MOST_WORKERS, os.cpu_count() or 1))


@pytest.hookimpl(tryfirst=True)     # before xdist reads the groups into its node ids
def pytest_collection_modifyitems(config, items):
    """A test without an xdist_group of its own module's: modules go whole to a worker."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


@dataclass
class BlockRun:
    outputs: list          # per command of the block, its stdout lines (wrapped)
    stderr: list           # per command, its stderr
    seconds: float         # the block's own commands, from the first's start to the last's end
    work: Path             # the scratch directory it ran in (what it wrote stays there)


@pytest.fixture(scope="session")
def page_examples(tmp_path_factory):
    """run(path, index) -> BlockRun of a console block of a page (README.md, docs/*.md), run
    as tests/readme_examples.py runs its examples: in a scratch directory, the file's earlier
    blocks that write files (--out, --metrics, > FILE) first, then the block's commands. Each
    block runs once a session: tests/test_readme.py compares its output with the page, and
    tests/test_runtime_example.py checks what the README's runtime example trained."""
    import readme_examples as rx
    done = {}

    def run(path, index):
        key = (str(path), index)
        if key not in done:
            blocks = rx.parse(Path(path).read_text())
            block = blocks[index]
            work = tmp_path_factory.mktemp("readme-test")
            env = rx.environment(work, rx.WIDTH_OF.get(Path(path).name, rx.WIDTH))
            for earlier in blocks[:index]:
                if not earlier.slow or block.slow:
                    for cmd in earlier.commands:
                        if re.search(r"--out |--metrics |> (?!/dev/null)", cmd.line):
                            rx.run_command(cmd, work, env)
            stderr = []
            t0 = time.monotonic()
            outputs = [rx.run_command(cmd, work, env, stderr=stderr) for cmd in block.commands]
            done[key] = BlockRun(outputs, stderr, time.monotonic() - t0, work)
        return done[key]
    return run
