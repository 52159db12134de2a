"""Plans the search emits (engine `runtime`) run, train like one process and hold the memory
the plan counts.

Hypothesis draws a small model, a world of 2 or 4 CPU processes, a ZeRO stage, a pipeline
degree and whether micro-batches hold one sequence; the search picks everything else (splits, micro-batches, schedule, recompute, tp) and
one of its ranked plans is run for 2 steps under torchrun. Per step the loss and gradient norm
must equal one process's to 1e-4; the first step's measured gradient and optimizer bytes per
rank must be the plan's stage memory for that pipeline rank (grads 10%, optimizer 5%), and so
must the parameters under ZeRO 0/1 (5%). Few examples by default (RUNTIME_PLAN_EXAMPLES raises
it).

Saved activations per pipeline rank must be the plan's within 30% (the runtime computes in
fp32 on CPUs, and the runtime engine prices 4-byte activations there), ZeRO 2 parameters (shards
plus the gathered fp32 copy) within 5%, and ZeRO 3 parameters between the shards plus the
gathered root group and one layer and the shards plus root group and two layers (the plan counts
those under `other`).

Not compared, because the cost model counts them otherwise than this runtime holds them:
GPT-style models under tp (learned positions are sharded over tp here, counted whole).

Found with RUNTIME_PLAN_EXAMPLES=10 and fixed (tests/test_runtime_pipeline_memory.py): pipelining's
first-step shape inference runs stage 0's forward with grad on and drops it without a backward;
the measurement's saved-tensor hooks held each saved tensor itself, a cycle through the autograd
node of a saved output, so that graph was never freed and pipeline rank 0 measured one extra
micro-batch (1.82x the plan at pp2 m = 1). Without the hooks autograd frees it (no real gap).
"""
import os
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
from tests.runtime_runs import launch, ran, runs_of, steps_of  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
STEPS = 2
RTOL = 1e-4
EXAMPLES = int(os.environ.get("RUNTIME_PLAN_EXAMPLES", "3"))
GIB = 2 ** 30


def run_best(model, cluster, fixed: dict, seq_len: int, gbs: int, prefix: str):
    """Search a runtime plan with `fixed` knobs, run its best for one step on as many CPU
    processes as the cluster has GPUs: (plan, the search's Result, the first step's
    measured_memory_gib per rank)."""
    report = search(model, cluster, Fixed(**fixed), seq_len=seq_len, global_batch=gbs,
                    engine="runtime")
    best = report.ranked[0]
    plan = to_plan(model, cluster, best, report, engine="runtime")
    d = Path(tempfile.mkdtemp(prefix=prefix))
    plan.save(d / "plan.json")
    r = launch(cluster.num_gpus, "--plan", d / "plan.json", "--steps", 1, "--metrics",
               d / "m.jsonl")
    assert r.returncode == 0, r.stderr[-3000:]
    return plan, best, steps_of(d / "m.jsonl")[1]["measured_memory_gib"]


_baselines = {}


def one_process(model, seq, gbs):
    key = (model, seq, gbs)
    if key not in _baselines:
        d = Path(tempfile.mkdtemp(prefix="searched-base-"))
        plan = Plan(model=model, cluster=Cluster("cpux1", get_gpu("cpu"), 1, 1),
                    parallelism=Parallelism(tp=1, pp=1, dp=1), stages=make_stages(model.num_layers, 1),
                    batch=Batch(seq_len=seq, global_batch_size=gbs, micro_batch_size=1,
                                num_microbatches=gbs), engine="runtime")
        plan.validate()
        plan.save(d / "plan.json")
        r = launch(1, "--plan", d / "plan.json", "--steps", STEPS, "--metrics", d / "m.jsonl")
        assert r.returncode == 0, r.stderr[-3000:]
        _baselines[key] = steps_of(d / "m.jsonl")
    return _baselines[key]


def _facts(plan):
    from planner.engines import get_engine
    from planner.cost.facts import facts_for
    return facts_for(get_engine("runtime"), plan.cluster.gpu)


def planned_activations(plan, best, pp_rank):
    """(low, high) GiB of saved activations the plan prices for a pipeline rank: its
    `activations`, and on a rank that recomputes layers, also the one layer's activations that
    backward re-materialises (the plan counts that working set under `other`; saved-tensor hooks
    see it under pipelining, not inside FSDP2's checkpointed layers)."""
    p, b = plan.parallelism, plan.batch
    low = high = best.estimate.stage_memory_gib[pp_rank]["activations"]
    chunks = [s for i, s in enumerate(plan.stages) if i % p.pp == pp_rank]
    if any(s.recompute_layers for s in chunks):
        high += _facts(plan).activation_bytes(plan.model, b.micro_batch_size, b.seq_len, p.tp,
                                              p.sequence_parallel, "none", True) / GIB
    return low, high


def activations_as_planned(measured, low, high, tol=0.30):
    return (1 - tol) * low <= measured <= (1 + tol) * high


def zero3_gathered_bounds(plan, pp_rank):
    """GiB FSDP2 holds gathered under ZeRO 3 on a pipeline rank: (root group + one layer, root
    group + two layers), each parameter in the runtime's compute dtype on this device."""
    m, p = plan.model, plan.parallelism
    t = p.tp
    layer = (m.attn_matmul_params() + m.mlp_matmul_params() + m.bias_params()) / t \
        + 2 * m.norm_params()
    first, last = pp_rank == 0, pp_rank == p.pp - 1
    fixed = (m.vocab_size * m.hidden / t + (m.max_seq_len * m.hidden
                                           if m.position == "learned" else 0)) * first
    fixed += (m.norm_params() + (m.vocab_size * m.hidden / t
                                 if not m.tied_embeddings or p.pp > 1 else 0)) * last
    e = _facts(plan).compute_elem_bytes
    return e * (fixed + layer) / GIB, e * (fixed + 2 * layer) / GIB


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
        act = planned_activations(plan, best, m["pp_rank"])
        assert activations_as_planned(m["activations"], *act), (what, rank, m, act)
        if p.zero_stage <= 2:
            assert close(m["params"], plan_r["params"], 0.05), (what, rank, m, plan_r)
        elif p.dp > 1:
            # ZeRO 3: the shards plus what FSDP2 holds gathered while computing, which the plan
            # counts under `other`: the root group (embedding, head) for the whole step and the
            # layer in use (one) and the prefetched one (two)
            low, high = zero3_gathered_bounds(plan, m["pp_rank"])
            assert plan_r["params"] + 0.95 * low <= m["params"] \
                <= 1.05 * (plan_r["params"] + high), (what, rank, m, plan_r, low, high)
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


SAVED_ACTIVATIONS = {
    # pipelined, tp 1: within 30% (before the runtime engine priced fp32 activations on CPUs
    # and the runtime's RMSNorm and gated MLP saved only their inputs, it was 2.1-2.9x)
    "pp2": (dict(zero=0, pp=2), 0.30),
    # tp 2 with sequence parallelism: DTensor TP keeps the QKV and MLP-in linears' all-gathered
    # input (planner.engines.spec sp_keeps_gathered_inputs), within 5% (priced as Megatron's
    # 1/t shards it was 1.17x the plan)
    "tp2_sp": (dict(zero=0, pp=1, tp=2, sp=True, recompute="none"), 0.05),
}


@pytest.fixture(scope="module")
def saved_activations(tmp_path_factory):
    """Each SAVED_ACTIVATIONS search's best plan for a Llama-style model on cpux2 (no
    profile) and its candidate, run for one step in one 2-process launch (tests.runtime_runs):
    {name: (plan, best, result, launch)}."""
    model = Model("tiny", num_layers=4, hidden=64, ffn_hidden=128, num_heads=4, num_kv_heads=2,
                  vocab_size=128, max_seq_len=64)
    cluster = Cluster("cpux2", get_gpu("cpu"), 2, 2)
    d = tmp_path_factory.mktemp("saved-act")
    plans, runs = {}, {}
    for name, (fixed, _) in SAVED_ACTIVATIONS.items():
        report = search(model, cluster, Fixed(**fixed), seq_len=32, global_batch=8,
                        engine="runtime")
        best = report.ranked[0]
        plans[name] = (to_plan(model, cluster, best, report, engine="runtime"), best)
        plans[name][0].save(d / f"{name}.json")
        runs[name] = ["--plan", d / f"{name}.json", "--steps", 1,
                      "--metrics", d / f"{name}.jsonl"]
    done = runs_of(2, runs, d)
    return {name: (*plans[name], *done[name], d / f"{name}.jsonl") for name in runs}


@pytest.mark.parametrize("name", sorted(SAVED_ACTIVATIONS))
def test_saved_activations_are_what_the_plan_prices(saved_activations, name):
    """The "fits, then runs out of memory" check for a catalog-only CPU plan: a searched
    Llama-style plan on cpux2 (no profile) runs one step, and every rank's measured peak of
    saved activations is what the plan prices for its pipeline rank, within `tol`."""
    _, tol = SAVED_ACTIVATIONS[name]
    plan, best, result, launched, metrics = saved_activations[name]
    ran(result, launched)
    for rank, m in enumerate(steps_of(metrics)[1]["measured_memory_gib"]):
        want = planned_activations(plan, best, m["pp_rank"])
        assert activations_as_planned(m["activations"], *want, tol=tol), (rank, m, want)
