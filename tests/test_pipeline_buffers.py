"""torch.distributed.pipelining's receive buffers (planner.engines.spec pipeline_recv_buffers,
planner.cost.schedule stage_buffer_bytes) against what torch's own stages keep after a step:
tests/pipeline_buffers_probe.py runs each pipeline rank of a three-rank pipeline on CPU under
every schedule the runtime and torchtitan build, and counts the receive buffers and the input
gradients left on them. The price is exact for 1F1B, the looped interleaved schedules and
zbv's first ranks, and above the measurement by less than two buffers per micro-batch where
torch keeps less (zbv's last rank shares one gradient between its two stages; dualpipev
releases some of them); the stage's price carries it (a rank's memory grows with it)."""
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from planner.catalog import get_cluster                     # noqa: E402
from planner.catalog.models import MODELS                     # noqa: E402
from planner.cost.schedule import stage_buffer_bytes          # noqa: E402
from planner.search import Fixed, search                      # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PP, M = 3, 6
EXACT = ("1f1b", "interleaved", "interleaved-zb", "zbv")
SCHEDULES = (*EXACT, "dualpipev")


def probe(cases: list) -> list:
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "pipeline_buffers_probe.py"),
                          json.dumps(cases)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def kept():
    """{(schedule, rank): (bytes kept, boundary bytes)} at M micro-batches."""
    cases = [[s, PP, r, M] for s in SCHEDULES for r in range(PP)]
    return {(c[0], c[2]): (x["kept_bytes"], x["boundary_bytes"])
            for c, x in zip(cases, probe(cases))}


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_buffers_per_rank_as_torch_keeps_them(kept, schedule):
    v = 1 if schedule == "1f1b" else 2
    for rank in range(PP):
        measured, b = kept[(schedule, rank)]
        # the persistent part: no micro-batch in flight, the engine as torch 2.13 runs it
        priced = stage_buffer_bytes(schedule, PP, rank, M, v, 0.0, b)
        if schedule in EXACT and not (schedule == "zbv" and rank == PP - 1):
            assert priced == measured, (schedule, rank, priced / b, measured / b)
        else:
            assert measured <= priced < measured + 2 * M * b, (schedule, rank)


def test_the_rank_price_carries_them(kept):
    """Our runtime's price of a 1F1B pipeline grows by what torch keeps per micro-batch on each
    rank (measured above at M micro-batches; the micro-batches in flight, min(pp - rank, m),
    unchanged from 3 to 9)."""
    from tests.pipeline_buffers_probe import FFN, HEADS, HIDDEN, KV, SEQ, VOCAB
    model = dataclasses.replace(MODELS["llama3-8b"], num_layers=PP, hidden=HIDDEN,
                                ffn_hidden=FFN, num_heads=HEADS, num_kv_heads=KV,
                                vocab_size=VOCAB, tied_embeddings=False)

    def priced(m):
        fixed = Fixed(tp=1, pp=PP, dp=1, zero=0, mbs=1, recompute="none", schedule="1f1b",
                      stage_layers=(1,) * PP)
        r = search(model, get_cluster(f"cpux{PP}"), fixed, SEQ, m, top=1, engine="runtime",
                   margin_gib=0.0, rejected=False)
        return [s["total"] * 2**30 for s in (r.best or r.closest).estimate.stage_memory_gib]

    per_micro_batch = [kept[("1f1b", r)][0] / M for r in range(PP)]
    grown = [x - y for x, y in zip(priced(9), priced(3))]
    assert grown == pytest.approx([6 * k for k in per_micro_batch], rel=1e-6)
