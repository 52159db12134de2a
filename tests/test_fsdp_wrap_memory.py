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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.cost.dataparallel import zero3_end_bytes, zero3_unsharded_bytes

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
BF16, FP32 = 2.0, 4.0       # the probe's MixedPrecisionPolicy: bf16 params, fp32 reduce


def probe(*args) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "fsdp_wrap_probe.py"), *args],
                         capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def measured():
    return probe()


def in_flight(m: dict) -> float:
    """What a GPU may still hold of a collective in flight that the fake process group, whose
    collectives complete at once, never shows: the prefetched layer's all-gather output beside
    a layer's backward (bf16), the first layer's reduce-scatter input at the backward's end
    (fp32): the larger of the two."""
    return max(BF16, FP32) * m["layer_params"]


def priced(m: dict, wrap: str) -> tuple:
    """(the peak's, the backward end's) unsharded bytes the planner prices for the probe's
    model: bf16 compute, fp32 reduce."""
    args = (m["layer_params"], m["emb_params"], m["head_params"])
    return (zero3_unsharded_bytes(True, wrap, *args, BF16 * m["layer_params"], BF16, FP32),
            zero3_end_bytes(wrap, *args, BF16, FP32))


@pytest.mark.parametrize("wrap", ["root", "split"])
@pytest.mark.parametrize("vocab", [8192, 1024])
def test_zero3_unsharded_bytes_bound_fsdp2_as_measured(measured, wrap, vocab):
    """The formula never under-counts the measured largest moment and exceeds it by no more
    than a collective in flight (`in_flight`: the split head's moment counts the next layer's
    prefetch beside it, which the synchronous fake collectives show a moment later). At
    vocabulary 8192 the head's moment is the largest under "split"; at 1024 a layer's is."""
    m = measured[f"{wrap} {vocab}"]
    truth, predicted = m["unsharded_bytes"], priced(m, wrap)[0]
    assert truth <= predicted <= truth + in_flight(m), (wrap, vocab, truth, predicted)


@pytest.mark.parametrize("wrap", ["root", "split"])
@pytest.mark.parametrize("vocab", [8192, 1024])
def test_no_backward_moment_holds_more_than_priced(measured, wrap, vocab):
    """Over every module's backward and every group's reduce (the moment inside FSDP2's
    foreach_reduce when a group's unsharded gradients and its reduce-scatter input are both
    live, which no module snapshot falls on), the root's at the backward's end included (the
    activations freed then: zero3_end_bytes), FSDP2 never holds more unsharded than the larger
    of the two priced moments, and that exceeds what it holds at its largest by no more than a
    collective in flight (`in_flight`). Under "root" at vocabulary 8192 the end is the largest
    (6 bytes a parameter of the embedding and head: bf16 gradients and fp32 reduce-scatter
    input)."""
    m = measured[f"{wrap} {vocab}"]
    peak, end = priced(m, wrap)
    truth = m["unsharded_bytes_any_moment"]
    assert truth <= max(peak, end) <= truth + in_flight(m), (wrap, vocab, m, peak, end)


def test_root_group_holds_the_heads_gradient_and_split_does_not(measured):
    """torchtitan before #1094 (the root group) keeps the output's bf16 gradient through every
    block's backward; since, the [norm, output] group reduces it before the blocks run."""
    for vocab in (8192, 1024):
        root, split = measured[f"root {vocab}"], measured[f"split {vocab}"]
        assert root["held_head_grad_bytes"] == BF16 * root["emb_params"]    # vocab x hidden
        assert split["held_head_grad_bytes"] == 0


SHAPES = st.tuples(st.sampled_from([2, 3, 5]), st.sampled_from([128, 192, 320]),
                   st.sampled_from([256, 512, 768]), st.just(4), st.sampled_from([1, 2, 4]),
                   st.sampled_from([128, 384]), st.sampled_from([512, 3072, 16384]))


@settings(max_examples=4, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(shape=SHAPES)
def test_no_moment_holds_more_than_priced_over_shapes(shape):
    """The same bounds over drawn shapes (layers, widths, heads, tokens, vocabulary), one probe
    per draw: never under the measurement, over it by no more than a collective in flight."""
    out = probe(json.dumps([list(shape)]))
    for key, m in out.items():
        peak, end = priced(m, key.split()[0])
        truth = m["unsharded_bytes_any_moment"]
        assert truth <= max(peak, end) <= truth + in_flight(m), (key, shape, m, peak, end)
