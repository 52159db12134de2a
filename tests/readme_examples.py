"""Run the examples of README.md and docs/*.md and compare (or update) the output they show.

An example is a fenced block whose info string is `console` (run by the fast suite) or
`console slow` (run under `-m slow` only: the torchrun examples). In it, a line starting with
"$ " is a command (a trailing backslash continues it on the next line); the lines after it, up
to the next command or the closing fence, are its expected stdout (a command shows its stderr
with `2>&1`). Blocks of one file run in order, in one scratch directory outside the checkout
(with `examples/` and `benchmarks/` linked in), with `plan` running this checkout's planner
and COLUMNS=99 for README.md (its lines stay under 100 columns), 120 for docs/; output lines
longer than that are shown folded at the last space that fits. What may differ between runs is
masked before comparing (MASKS: the search time; in torchrun examples every measured time, rate
and peak memory), nothing else; a trained loss is compared as a number, to a relative 1e-5
(LOSS_RTOL: another CPU sums fp32 in another order).

A generated section, `<!-- generated: NAME -->` ... `<!-- /generated -->`, holds figures
written from the committed benchmark tables by GENERATORS[NAME]; it is compared too.

    python -m tests.readme_examples               # check: print the differences, exit 1
    python -m tests.readme_examples --update      # rewrite outputs and generated sections
    python -m tests.readme_examples --slow FILE   # also the slow examples; only FILE

Other blocks (```text, ```, a language) are not run: commands that need GPUs or a cluster.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 120
WIDTH_OF = {"README.md": 99}      # the README's lines stay under 100 columns
FENCE = re.compile(r"^```(console(?: slow)?)\n(.*?)^```\n", re.M | re.S)
GENERATED = re.compile(r"(<!-- generated: ([\w-]+) -->\n)(.*?)(<!-- /generated -->)", re.S)
TIME_MASK = "<time>"
# what may change between two runs of the same example, each replaced by TIME_MASK
SEARCH_TIME = re.compile(r"(?<=, )\d+(\.\d+)? s$")                  # "... gap 0.00%, 0.27 s"
MEASURED = [re.compile(p) for p in (
    r"\d[\d,]*(\.\d+)? ?(s|ms|us|µs|min)\b",        # step and run times
    r"\d[\d,]*(\.\d+)? (tokens|tok)/s(/GPU)?",       # rates
    r"(?<=MFU )\d+(\.\d+)?%",
    r"^\d+(\.\d+)?%(?= \(plan)",                  # a measured MFU wrapped onto its own line
    r"\d[\d,]*(\.\d+)?$(?=\s*$)",                   # a measured rate whose unit wrapped
    r"(?<=ETA )\S+",
    r"(?<=peak )\d+(\.\d+)? GiB",                  # measured memory (allocator-dependent)
)]
# a trained loss is compared as a number, to LOSS_RTOL: the same fp32 run sums in another order
# on a CPU with other vector units (oneDNN picks its kernels by ISA): 4.974202 on one machine,
# 4.974204 on another, at 20 steps of the README's run
TRAINED_LOSS = re.compile(r"(?<=loss )\d+\.\d+")
LOSS_RTOL = 1e-5


@dataclass
class Command:
    line: str                  # as written, continuation lines joined
    expected: list             # the output lines shown
    start: int = 0             # offsets of the expected text in the file
    end: int = 0


@dataclass
class Block:
    slow: bool
    commands: list = field(default_factory=list)


def files() -> list:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def parse(text: str) -> list:
    """[Block] of a markdown text, each command with where its expected output sits."""
    blocks = []
    for m in FENCE.finditer(text):
        b = Block(slow=m.group(1).endswith("slow"))
        pos = m.start(2)
        lines = m.group(2).splitlines(keepends=True)
        i = 0
        while i < len(lines):
            ln = lines[i]
            if not ln.startswith("$ "):
                raise ValueError(f"output before any command in a console block: {ln!r}")
            cmd = ln[2:].rstrip("\n")
            pos += len(ln)
            i += 1
            while cmd.endswith("\\") and i < len(lines):
                cmd = cmd[:-1] + " " + lines[i].strip()
                pos += len(lines[i])
                i += 1
            start = pos
            out = []
            while i < len(lines) and not lines[i].startswith("$ "):
                out.append(lines[i].rstrip("\n"))
                pos += len(lines[i])
                i += 1
            b.commands.append(Command(cmd, out, start, pos))
        blocks.append(b)
    return blocks


def wrap(lines: list, width: int) -> list:
    """Lines folded at `width` columns, at the last space that fits (as `fold -s` does)."""
    out = []
    for ln in lines:
        ln = ln.rstrip()
        while len(ln) > width:
            cut = ln.rfind(" ", 0, width + 1)
            cut = cut if cut > 0 else width
            out.append(ln[:cut].rstrip())
            ln = ln[cut:].lstrip(" ")
        out.append(ln)
    return out


def mask(lines: list, command: str) -> list:
    measured = command.lstrip().startswith("torchrun")
    out = []
    for ln in lines:
        if ln.lstrip().startswith("search:") or "whole-search gap" in ln:
            ln = SEARCH_TIME.sub(TIME_MASK, ln)
        if measured:
            for p in MEASURED:
                ln = p.sub(TIME_MASK, ln)
        out.append(ln)
    return out


def environment(work: Path, width: int = WIDTH) -> dict:
    """A scratch directory with examples/ and benchmarks/ linked in and `plan` on PATH."""
    for name in ("examples", "benchmarks"):
        link = work / name
        if not link.exists():
            link.symlink_to(ROOT / name)
    bin_dir = work / ".bin"
    bin_dir.mkdir(exist_ok=True)
    for name, module in (("plan", "planner.cli"), ("torchrun", "torch.distributed.run"),
                         ("python", None)):
        target = (f"exec {sys.executable} -m {module} \"$@\"" if module
                  else f"exec {sys.executable} \"$@\"")
        p = bin_dir / name
        p.write_text(f"#!/bin/sh\n{target}\n")
        p.chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                        "MASTER_PORT", "OMP_NUM_THREADS", "COLUMNS", "LINES")}
    env.update(PATH=f"{bin_dir}:{env.get('PATH', '')}", PYTHONPATH=str(ROOT),
               COLUMNS=str(width), PYTHONWARNINGS="ignore")
    return env


def run_command(cmd: Command, work: Path, env: dict, timeout: float = 600,
                stderr: list | None = None) -> list:
    """The command's stdout lines (wrapped at WIDTH); AssertionError when it fails, unless
    its expected output says how it fails (a command ending in `2>&1`). Its stderr is
    appended to `stderr` when given."""
    r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd.line], cwd=work, env=env,
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0 and not cmd.line.rstrip().endswith("2>&1"):
        raise AssertionError(f"`{cmd.line}` exited {r.returncode}:\n{r.stderr[-3000:]}")
    if stderr is not None:
        stderr.append(r.stderr)
    return wrap(r.stdout.splitlines(), int(env["COLUMNS"]))


def losses_apart(want: list, have: list, command: str) -> tuple:
    """(want, have) with each trained loss that agrees within LOSS_RTOL written as the shown
    one (torchrun examples only); a loss further apart stays as it is and shows in the diff."""
    if not command.lstrip().startswith("torchrun") or len(want) != len(have):
        return want, have
    out = []
    for w, h in zip(want, have):
        ws, hs = TRAINED_LOSS.findall(w), TRAINED_LOSS.findall(h)
        if (ws and len(ws) == len(hs) and TRAINED_LOSS.sub("", w) == TRAINED_LOSS.sub("", h)
                and all(abs(float(a) - float(b)) <= LOSS_RTOL * abs(float(a))
                        for a, b in zip(ws, hs))):
            h = w
        out.append(h)
    return want, out


def differences(cmd: Command, got: list) -> str:
    want, have = mask(cmd.expected, cmd.line), mask(got, cmd.line)
    want, have = losses_apart(want, have, cmd.line)
    if want == have:
        return ""
    import difflib
    return "\n".join(difflib.unified_diff(want, have, "shown", "got", lineterm="", n=1))


# ---- figures generated from the committed benchmark tables -------------------------------

def latest(stem: str) -> Path:
    """The newest committed benchmarks/results/<stem>_<date>.md."""
    paths = sorted((ROOT / "benchmarks/results").glob(f"{stem}_20*.md"))
    if not paths:
        raise FileNotFoundError(f"no benchmarks/results/{stem}_<date>.md")
    return paths[-1]


def _scope_rows(path: Path) -> dict:
    """scope -> the cells of its row, from a fidelity table's summary."""
    rows = {}
    for ln in path.read_text().splitlines():
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        if len(cells) == 9 and cells[1].isdigit():
            rows[cells[0]] = cells
    return rows


def fidelity_summary() -> str:
    """Per engine (MoE apart), over all GPUs: published runs, the held-out median and p90
    |error| of the step time (every fitted figure refitted without the run's source family,
    or rows no fit has seen) and the in-sample median beside it: the committed
    leave-one-source-out table's "all" rows."""
    path = latest("fidelity_loso")
    out = ["| engine | published runs | held-out median | held-out p90 | in-sample median |",
           "|:---|---:|---:|---:|---:|"]
    for ln in path.read_text().splitlines():
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        if len(cells) == 8 and cells[1] == "all" and cells[2].isdigit():
            out.append(f"| {cells[0]} | {cells[2]} | {cells[3]}% | {cells[4]}% | {cells[5]}% |")
    rel = path.relative_to(ROOT)
    return "\n".join(out) + f"\n\nFrom [{rel.name}]({rel}).\n"


def fidelity_table() -> str:
    """The committed fidelity table's summary (every scope row), as it is."""
    path = latest("fidelity")
    lines = path.read_text().splitlines()
    head = [i for i, ln in enumerate(lines) if ln.startswith("| scope |")][0]
    out = []
    for ln in lines[head:]:
        if not ln.startswith("|"):
            break
        out.append(ln)
    rel = path.relative_to(ROOT)
    return "\n".join(out) + f"\n\nFrom [{rel.name}](../{rel}).\n"


def plan_quality_summary() -> str:
    """The committed plan-quality table's tallies, per section, as it states them."""
    path = latest("plan_quality")
    out = []
    for ln in path.read_text().splitlines():
        if ln.startswith("## "):
            out.append(f"{ln[3:]}:")
        elif ln.startswith("- "):
            out.append(ln)
    rel = path.relative_to(ROOT)
    return "\n".join(out) + f"\n\nFrom [{rel.name}](../{rel}).\n"


GENERATORS = {"fidelity-summary": fidelity_summary, "fidelity-table": fidelity_table,
              "plan-quality-summary": plan_quality_summary}


def generated_problems(text: str) -> list:
    """(name, shown, generated) of each generated section that differs."""
    out = []
    for m in GENERATED.finditer(text):
        want = GENERATORS[m.group(2)]()
        if m.group(3) != want:
            out.append((m.group(2), m.group(3), want))
    return out


def update_generated(text: str) -> str:
    return GENERATED.sub(lambda m: m.group(1) + GENERATORS[m.group(2)]() + m.group(4), text)


# ---- the command line ----------------------------------------------------------------------

def check_file(path: Path, slow: bool, update: bool) -> list:
    """Run the file's examples; [problem text]; with `update`, rewrite what differs."""
    text = path.read_text()
    problems = []
    replacements = []
    with tempfile.TemporaryDirectory(prefix="readme-examples-") as tmp:
        work = Path(tmp)
        env = environment(work, WIDTH_OF.get(path.name, WIDTH))
        for block in parse(text):
            if block.slow and not slow:
                continue
            for cmd in block.commands:
                got = run_command(cmd, work, env)
                diff = differences(cmd, got)
                if diff:
                    problems.append(f"{path.relative_to(ROOT)}: $ {cmd.line}\n{diff}")
                    replacements.append((cmd.start, cmd.end,
                                         "".join(ln + "\n" for ln in got)))
    for name, shown, want in generated_problems(text):
        problems.append(f"{path.relative_to(ROOT)}: generated section {name} differs from the "
                        f"committed tables")
    if update and (replacements or generated_problems(text)):
        for start, end, new in sorted(replacements, reverse=True):
            text = text[:start] + new + text[end:]
        path.write_text(update_generated(text))
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", help="markdown files (default: README.md, docs/*.md)")
    ap.add_argument("--update", action="store_true",
                    help="rewrite the shown outputs and generated sections that differ")
    ap.add_argument("--slow", action="store_true", help="run the slow (torchrun) examples too")
    a = ap.parse_args(argv)
    paths = [Path(f).resolve() for f in a.files] or files()
    problems = []
    for p in paths:
        problems += check_file(p, a.slow, a.update)
    for p in problems:
        print(p + "\n")
    verb = "updated" if a.update else "differ"
    print(f"{len(problems)} example(s) {verb}" if problems else "all examples match")
    return 1 if problems and not a.update else 0


if __name__ == "__main__":
    sys.exit(main())
