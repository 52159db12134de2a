"""Fixtures shared by test modules."""
import re
import time
from dataclasses import dataclass
from pathlib import Path

import pytest


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
