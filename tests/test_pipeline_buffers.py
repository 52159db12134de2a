"""torch.distributed.pipelining's receive buffers, one per micro-batch and stage (planner.engines.
spec pipeline_recv_buffers, planner.cost.schedule stage_buffer_bytes), against torch's own
allocations: tests/pipeline_buffers_probe.py runs one stage of a three-stage 1F1B pipeline on
CPU under torch's MemTracker at 3 and at 9 micro-batches (the same micro-batches in flight), and
the memory the planner prices for that pipeline rank grows with the micro-batches as the
measurement does: the first stage by a gradient buffer each, the last by an input buffer, the
middle one by both (at its peak and after the step)."""
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner.catalog import get_cluster
from planner.catalog.models import MODELS
from planner.search import Fixed, search

ROOT = Path(__file__).resolve().parent.parent
PP, MBS, SEQ, LAYERS = 3, 1, 256, 2
FEW, MANY = 3, 9          # micro-batches; 1F1B holds min(pp - rank, m) of them either way


def spec():
    from tests.pipeline_buffers_probe import FFN, HEADS, HIDDEN, KV, VOCAB
    return dataclasses.replace(MODELS["llama3-8b"], num_layers=PP * LAYERS, hidden=HIDDEN,
                               ffn_hidden=FFN, num_heads=HEADS, num_kv_heads=KV,
                               vocab_size=VOCAB, tied_embeddings=False)


@pytest.fixture(scope="module")
def measured():
    """{(stage, micro-batches): the probe's figures}; our runtime's step (return_outputs
    False, runtime/train.py)."""
    cases = [[PP, i, m, MBS, SEQ, LAYERS, False] for i in range(PP) for m in (FEW, MANY)]
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "pipeline_buffers_probe.py"),
                          json.dumps(cases)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert out.returncode == 0, out.stderr[-2000:]
    return {(c[1], c[2]): r for c, r in zip(cases, json.loads(out.stdout))}


def priced_bytes(m: int) -> list:
    """What the runtime engine prices per pipeline rank, in bytes, with m micro-batches."""
    fixed = Fixed(tp=1, pp=PP, dp=1, zero=0, mbs=MBS, recompute="none", schedule="1f1b",
                  stage_layers=(LAYERS,) * PP)
    r = search(spec(), get_cluster(f"cpux{PP}"), fixed, SEQ, m * MBS, top=1, engine="runtime",
               margin_gib=0.0, rejected=False)
    best = r.best or r.closest
    return [s["total"] * 2**30 for s in best.estimate.stage_memory_gib]


def test_each_stage_grows_by_its_buffers_per_micro_batch(measured):
    few, many = priced_bytes(FEW), priced_bytes(MANY)
    b = measured[(0, FEW)]["boundary_bytes"]
    for stage, buffers in ((0, 1), (1, 2), (2, 1)):
        kept = {m: measured[(stage, m)]["after_step_bytes"] - measured[(stage, m)]["fed_bytes"]
                for m in (FEW, MANY)}
        grown = kept[MANY] - kept[FEW]
        assert grown == buffers * (MANY - FEW) * b, stage      # torch, as the spec says
        assert many[stage] - few[stage] == pytest.approx(grown, rel=1e-6), stage
    # the middle stage's peak too (its in-flight micro-batches and their activations unchanged)
    peak = measured[(1, MANY)]["peak_bytes"] - measured[(1, FEW)]["peak_bytes"]
    assert many[1] - few[1] == pytest.approx(peak, rel=1e-6)
