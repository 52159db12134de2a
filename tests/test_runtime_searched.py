"""Plans the search emits (engine `runtime`) run, train like one process and hold the memory
the plan counts.

Hypothesis draws a small model, a world of 2 or 4 CPU processes, a ZeRO stage, a pipeline
degree and whether micro-batches hold one sequence; the search picks everything else (splits, micro-batches, schedule, recompute, tp) and
one of its ranked plans is run for 2 steps under torchrun. Per step the loss and gradient norm
must equal one process's to 1e-4; the first step's measured gradient and optimizer bytes per
rank must be the plan's stage memory for that pipeline rank (grads 10%, optimizer 5%), and so
must the parameters under ZeRO 0/1 (5%). Few examples by default (RUNTIME_PLAN_EXAMPLES raises
it).

Not compared yet, because the cost model counts them otherwise than this runtime holds them on
CPU: GPT-style models under tp (learned positions are sharded over tp here, counted whole); ZeRO 2/3 parameters (the gathered copy is fp32 here, the plan counts a bf16 copy; ZeRO 3's
FSDP root group stays gathered through the step and its layer being computed is counted under
`other`), and activations (fp32 here, counted as bf16).
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("torch")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from planner.catalog import get_gpu  # noqa: E402
from planner.errors import BadInput  # noqa: E402
from planner.plan import Batch, Parallelism, Plan, make_stages  # noqa: E402
from planner.search import Fixed, search, to_plan  # noqa: E402
from planner.specs import Cluster, Model  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
STEPS = 2
RTOL = 1e-4
EXAMPLES = int(os.environ.get("RUNTIME_PLAN_EXAMPLES", "3"))
GIB = 2 ** 30


def launch(nproc, *args):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "runtime"] if nproc == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         str(nproc), "-m", "runtime"]
    return subprocess.run(cmd + [str(a) for a in args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def steps_of(path):
    return {d["step"]: d for d in map(json.loads, Path(path).read_text().splitlines())
            if "step" in d}


_baselines = {}


def one_process(model, seq, gbs):
    key = (model, seq, gbs)
    if key not in _baselines:
        d = Path(tempfile.mkdtemp(prefix="searched-base-"))
        plan = Plan(model=model, cluster=Cluster("cpux1", get_gpu("cpu"), 1, 1),
                    parallelism=Parallelism(tp=1, pp=1, dp=1), stages=make_stages(model.num_layers, 1),
                    batch=Batch(seq_len=seq, global_batch_size=gbs, micro_batch_size=1,
                                num_microbatches=gbs))
        plan.validate()
        plan.save(d / "plan.json")
        r = launch(1, "--plan", d / "plan.json", "--steps", STEPS, "--metrics", d / "m.jsonl")
        assert r.returncode == 0, r.stderr[-3000:]
        _baselines[key] = steps_of(d / "m.jsonl")
    return _baselines[key]


models = st.builds(
    lambda layers, kv, gpt: Model(
        "tiny-gpt" if gpt else "tiny", num_layers=layers, hidden=64, ffn_hidden=128,
        num_heads=4, num_kv_heads=4 if gpt else kv, vocab_size=128, max_seq_len=64,
        **(dict(gated_mlp=False, activation="gelu", norm="layernorm", position="learned",
                tied_embeddings=True, attn_bias=True, linear_bias=True) if gpt else {})),
    st.sampled_from([2, 4, 6]), st.sampled_from([1, 2, 4]), st.booleans())


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(model=models, world=st.sampled_from([2, 4]), zero=st.sampled_from([0, 1, 2, 3]),
       pp_pick=st.integers(0, 2), rank_pick=st.integers(0, 4), gbs=st.sampled_from([8, 16]),
       mbs=st.sampled_from([1, None]))
def test_searched_plans_run_as_planned(model, world, zero, pp_pick, rank_pick, gbs, mbs):
    pps = [p for p in (2, 1, 4) if p <= world and model.num_layers % p == 0]
    pp = pps[pp_pick % len(pps)]
    cluster = Cluster(f"cpux{world}", get_gpu("cpu"), world, world)
    try:
        report = search(model, cluster, Fixed(zero=zero, pp=pp, mbs=mbs), seq_len=32, global_batch=gbs,
                        engine="runtime", top=5)
    except BadInput:          # e.g. ZeRO > 0 with no data parallelism left
        assume(False)
    assert report.ranked, "the search found no plan"
    best = report.ranked[rank_pick % len(report.ranked)]
    plan = to_plan(model, cluster, best, report, engine="runtime")
    d = Path(tempfile.mkdtemp(prefix="searched-"))
    plan.save(d / "plan.json")
    p = plan.parallelism
    what = (f"tp={p.tp} pp={p.pp} dp={p.dp} zero={p.zero_stage} vpp={p.vpp} {p.schedule} "
            f"m={plan.batch.num_microbatches} mbs={plan.batch.micro_batch_size} "
            f"sp={p.sequence_parallel} recompute={p.recompute} "
            f"{[(s.layers, s.recompute_layers) for s in plan.stages]}")
    print("searched plan:", what)
    r = launch(world, "--plan", d / "plan.json", "--steps", STEPS, "--metrics", d / "m.jsonl")
    assert r.returncode == 0, (what, r.stderr[-3000:])
    got, want = steps_of(d / "m.jsonl"), one_process(model, 32, gbs)
    for s in range(1, STEPS + 1):
        for k in ("loss", "grad_norm"):
            assert abs(got[s][k] - want[s][k]) <= RTOL * abs(want[s][k]), (what, s, k)

    planned = best.estimate.stage_memory_gib          # per pipeline rank, GiB
    measured = got[1]["measured_memory_gib"]
    assert len(measured) == world

    def close(a, b, tol):
        return abs(a - b) <= tol * b

    # under tp the cost model counts learned position embeddings whole and some biases
    # otherwise than the runtime shards them: compare GPT-style models only without tp
    if p.tp > 1 and (model.position == "learned" or model.linear_bias):
        for m in measured:     # still, no gradient is held less sharded than its parameter
            if p.zero_stage <= 1:
                assert close(m["grads"], m["params"], 0.02), (what, m)
        return
    for rank, m in enumerate(measured):
        plan_r = planned[m["pp_rank"]]
        if p.zero_stage <= 1:
            assert close(m["params"], plan_r["params"], 0.05), (what, rank, m, plan_r)
        assert close(m["grads"], plan_r["grads"], 0.10), (what, rank, m, plan_r)
        if p.zero_stage != 1 or p.dp == 1:
            assert close(m["optimizer"], plan_r["optimizer"], 0.05), (what, rank, m, plan_r)
    if p.zero_stage == 1 and p.dp > 1:
        # whole parameters are given to owners, so a dp rank's share is uneven; the tp x dp
        # ranks of a pipeline rank together hold its state exactly tp times (once per shard)
        for pr in range(p.pp):
            group = [m["optimizer"] for m in measured if m["pp_rank"] == pr]
            assert close(sum(group), p.tp * p.dp * planned[pr]["optimizer"], 0.05), \
                (what, pr, group, planned[pr])
