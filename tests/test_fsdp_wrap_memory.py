"""What ZeRO-3 holds unsharded while the layers' activations are held, as FSDP2 groups the
embedding and head (planner.cost.dataparallel.zero3_unsharded_bytes, Engine.fsdp_outer_wrap),
against torch's FSDPMemTracker measuring a small Llama on CPU (tests/fsdp_wrap_probe.py): the
weights gathered and all-gathered, the unsharded gradients and reduce-scatter inputs at every
block's and the head's backward, plus the output's unsharded gradient still held there."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.cost.dataparallel import zero3_end_bytes, zero3_unsharded_bytes

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
BF16, FP32 = 2.0, 4.0       # the probe's MixedPrecisionPolicy: bf16 params, fp32 reduce


@pytest.fixture(scope="module")
def measured():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "fsdp_wrap_probe.py")],
                         capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


@pytest.mark.parametrize("wrap", ["root", "split"])
@pytest.mark.parametrize("vocab", [8192, 1024])
def test_zero3_unsharded_bytes_bound_fsdp2_as_measured(measured, wrap, vocab):
    """The formula never under-counts the measured largest moment and is within 15% of it
    (the split head's moment counts the next layer's prefetch beside it, which the tracker's
    synchronous fake collectives show a moment later). At vocabulary 8192 the head's moment
    is the largest under "split"; at 1024 a layer's is."""
    m = measured[f"{wrap} {vocab}"]
    truth = m["unsharded_bytes"]
    predicted = zero3_unsharded_bytes(True, wrap, m["layer_params"], m["emb_params"],
                                      m["head_params"], BF16 * m["layer_params"], BF16, FP32)
    assert truth <= predicted <= 1.15 * truth, (wrap, vocab, truth, predicted)


@pytest.mark.parametrize("wrap", ["root", "split"])
@pytest.mark.parametrize("vocab", [8192, 1024])
def test_no_backward_moment_holds_more_than_priced(measured, wrap, vocab):
    """Over every module's backward and every group's reduce (the moment inside FSDP2's
    foreach_reduce when a group's unsharded gradients and its reduce-scatter input are both
    live, which no module snapshot falls on), the root's at the backward's end included (the
    activations freed then: zero3_end_bytes), FSDP2 never holds more unsharded than the larger
    of the two priced moments, and that is within 15% of what it holds at its largest. Under
    "root" at vocabulary 8192 the end is the largest (6 bytes a parameter of the embedding and
    head: bf16 gradients and fp32 reduce-scatter input)."""
    m = measured[f"{wrap} {vocab}"]
    args = (m["layer_params"], m["emb_params"], m["head_params"])
    peak = zero3_unsharded_bytes(True, wrap, *args, BF16 * m["layer_params"], BF16, FP32)
    end = zero3_end_bytes(wrap, *args, BF16, FP32)
    truth = m["unsharded_bytes_any_moment"]
    assert truth <= max(peak, end) <= 1.15 * truth, (wrap, vocab, m, peak, end)


def test_root_group_holds_the_heads_gradient_and_split_does_not(measured):
    """torchtitan before #1094 (the root group) keeps the output's bf16 gradient through every
    block's backward; since, the [norm, output] group reduces it before the blocks run."""
    for vocab in (8192, 1024):
        root, split = measured[f"root {vocab}"], measured[f"split {vocab}"]
        assert root["held_head_grad_bytes"] == BF16 * root["emb_params"]    # vocab x hidden
        assert split["held_head_grad_bytes"] == 0
