"""The README (and docs/*.md) show what the commands print: each console example is run and its
output compared with the page (tests/readme_examples.py says how, and how to regenerate)."""

import re
import shlex
import subprocess

import pytest

import readme_examples as rx

ROOT = rx.ROOT
# one pytest-xdist worker for the modules whose tests read the README's examples, each run once
# a session (conftest.py page_examples)
pytestmark = pytest.mark.xdist_group("readme-examples")


def _examples():
    """(file, block index, Block) of every console block, slow ones marked."""
    out = []
    for path in rx.files():
        for i, block in enumerate(rx.parse(path.read_text())):
            marks = [pytest.mark.slow] if block.slow else []
            out.append(pytest.param(path, i, id=f"{path.name}:{i}", marks=marks))
    return out


@pytest.mark.parametrize("path,index", _examples())
def test_example_prints_what_the_page_shows(path, index, page_examples):
    block = rx.parse(path.read_text())[index]
    ran = page_examples(path, index)         # (conftest.py: each block runs once a session)
    for cmd, got in zip(block.commands, ran.outputs):
        diff = rx.differences(cmd, got)
        assert not diff, (f"{path.name}: `{cmd.line}` prints something else than the page "
                          f"shows (python -m tests.readme_examples --update rewrites it):\n"
                          f"{diff}")


def test_an_edited_output_fails_and_only_timing_may_differ():
    cmd = rx.parse((ROOT / "README.md").read_text())[0].commands[0]
    assert cmd.line.startswith("plan --model llama70b --cluster h100x32")
    edited = rx.Command(cmd.line, [ln.replace("105.", "106.") for ln in cmd.expected])
    assert edited.expected != cmd.expected
    assert rx.differences(edited, cmd.expected)                # a changed figure fails
    faster = [re.sub(r"(?<=, )\d+\.\d+ s$", "9.99 s", ln) for ln in cmd.expected]
    assert faster != cmd.expected and not rx.differences(cmd, faster)   # search time may differ
    assert rx.differences(cmd, cmd.expected[:-1])              # a missing line fails


def test_a_trained_loss_may_differ_only_in_its_last_digits():
    """Another CPU's kernels sum fp32 in another order: 4.974202 vs 4.974204 passes (2e-6
    apart, within LOSS_RTOL 1e-5); 4.9743 does not, nor a plan's line, where losses are words."""
    shown = ["step    20  loss 4.974202  grad norm 0.8349  lr 5.853e-05  0.185 s"]
    run = rx.Command("torchrun --nproc-per-node 2 -m runtime --plan p.json", shown)
    assert not rx.differences(run, [shown[0].replace("4.974202", "4.974204")])
    assert rx.differences(run, [shown[0].replace("4.974202", "4.974300")])
    assert rx.differences(run, [shown[0].replace("0.8349", "0.8350")])   # grad norm: exact
    planned = rx.Command("plan --model m --cluster c", shown)
    assert rx.differences(planned, [shown[0].replace("4.974202", "4.974204")])


def test_the_readme_reads_in_five_minutes():
    text = (ROOT / "README.md").read_text()
    long = [i + 1 for i, ln in enumerate(text.splitlines()) if len(ln) >= 100]
    assert not long, f"README.md lines of 100 columns or more: {long}"
    assert len(text.split()) < 1500                  # ~5 minutes at 300 words a minute
    assert not re.search(r"\bissue \d+|\bwas \d", text)   # no history


def test_generated_figures_are_the_committed_tables():
    for path in rx.files():
        bad = rx.generated_problems(path.read_text())
        assert not bad, f"{path.name}: {[b[0] for b in bad]} (run python -m tests.readme_examples --update)"
    assert "<!-- generated: fidelity-summary -->" in (ROOT / "README.md").read_text()


def _written_paths():
    """What the pages' commands write in the working directory: --out, --metrics, > FILE."""
    paths = set()
    for path in rx.files():
        text = path.read_text()
        for block in re.findall(r"^```[a-z ]*\n(.*?)^```", text, re.M | re.S):
            for ln in block.replace("\\\n", " ").splitlines():
                ln = ln[2:] if ln.startswith("$ ") else ln
                try:
                    words = shlex.split(ln, comments=True)
                except ValueError:
                    continue
                for a, b in zip(words, words[1:]):
                    if a in ("--out", "--metrics", "--checkpoint-dir", "--csv", "--plot", ">") \
                            and b != "/dev/null" and not b.startswith("-"):
                        paths.add(b)
    return sorted(paths)


def test_what_the_examples_write_is_ignored_by_git():
    paths = _written_paths()
    assert "tiny-plan.json" in paths and "m.jsonl" in paths
    for p in paths:
        r = subprocess.run(["git", "check-ignore", "-q", p], cwd=ROOT)
        assert r.returncode == 0, f"{p} (written by an example) is not in .gitignore"
