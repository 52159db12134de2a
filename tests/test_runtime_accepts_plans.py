"""What the planner emits for engine `runtime`, the runtime accepts: drawn small models (dense;
MoE with MLA, MTP, shared experts, attention sinks, sliding windows) on CPU clusters are either
refused by the planner in one line (exit 2 or 3) or every ranked plan passes the runtime's own
pre-flight (runtime.train.preflight: the launched world, runtime.model.check_supported and
runtime.parallelize.check_layout) and builds (runtime.model.check_whole_model_supported); a few
fixed draws train one step under torchrun (gloo).

The runtime's refusals are data on its engine spec (planner.engines.runtime) read by the one
rules layer (planner.rules), so the search never emits what the pre-flight refuses.
"""
import json
import os

import pytest

pytest.importorskip("hypothesis")
pytest.importorskip("torch")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from planner.catalog import get_cluster  # noqa: E402
from planner.errors import PlannerError  # noqa: E402
from planner.plan import Plan  # noqa: E402
from planner.search import search, to_plan  # noqa: E402
from planner.specs import Model  # noqa: E402
from runtime.model import check_whole_model_supported  # noqa: E402
from runtime.train import preflight  # noqa: E402
from tests.runtime_runs import ran, runs_of  # noqa: E402

EXAMPLES = int(os.environ.get("PLANNER_RUNTIME_PLAN_EXAMPLES", "25"))
CLUSTERS = ("cpux2", "cpux4", "cpux8")


@st.composite
def models(draw):
    heads = draw(st.sampled_from([2, 4, 8]))
    kv = draw(st.sampled_from([d for d in (1, 2, 4, 8) if heads % d == 0]))
    head_dim = draw(st.sampled_from([8, 16]))
    kw = dict(num_layers=draw(st.integers(1, 4)), hidden=heads * head_dim,
              ffn_hidden=draw(st.sampled_from([32, 48, 64, 96])), num_heads=heads,
              num_kv_heads=kv, vocab_size=draw(st.sampled_from([64, 96, 128])), max_seq_len=32)
    # attention features (planner.specs.Model.attention_feature_map)
    if draw(st.booleans()):
        kw.update(sliding_window=draw(st.sampled_from([4, 8])),
                  full_attention_interval=draw(st.sampled_from([0, 2])))
    if draw(st.booleans()):
        kw.update(attention_sinks=True)
    if draw(st.booleans()):       # multi-head latent attention (DeepSeek-V3's)
        kw.update(kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
                  q_lora_rank=draw(st.sampled_from([0, 24])))
    kind = draw(st.sampled_from(["dense", "moe"]))
    if kind == "moe":
        experts = draw(st.sampled_from([2, 4, 8]))
        kw.update(num_experts=experts, experts_per_token=draw(st.integers(1, 2)),
                  moe_ffn_hidden=draw(st.sampled_from([16, 32])),
                  shared_expert_ffn_hidden=draw(st.sampled_from([0, 32])),
                  first_dense_layers=draw(st.integers(0, min(1, kw["num_layers"] - 1))))
    kw.update(mtp_layers=draw(st.sampled_from([0, 0, 1])))
    return Model(f"drawn-{kind}", **kw)


def plans_for_runtime(model, cluster, seq, gbs, **fixed):
    """The ranked plans of `plan --engine runtime` (with `fixed` choices), or the one line it
    refuses with."""
    from planner.search import Fixed
    try:
        rep = search(model, cluster, Fixed(**fixed), seq_len=seq, global_batch=gbs, top=10,
                     engine="runtime")
    except PlannerError as e:
        assert e.exit_code in (2, 3) and "\n" not in str(e) and str(e), str(e)
        return None, str(e)
    results = rep.ranked or ([rep.best] if rep.best else [])
    return [to_plan(model, cluster, r, rep, engine="runtime") for r in results], None


def assert_runtime_accepts(plan: Plan) -> None:
    world = plan.parallelism.world_size
    assert plan.engine == "runtime"
    loaded = Plan.from_dict(json.loads(json.dumps(plan.to_dict())), whole_cluster=True)
    for p in (plan, loaded):
        preflight(p, world, world, on_gpu=False)
        check_whole_model_supported(p.model)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(model=models(), cluster=st.sampled_from(CLUSTERS), seq=st.sampled_from([16, 32]),
       gbs=st.sampled_from([4, 8]))
def test_every_runtime_plan_passes_the_runtime_preflight(model, cluster, seq, gbs):
    plans, refusal = plans_for_runtime(model, get_cluster(cluster), seq, gbs)
    if plans is None:
        # what the runtime does not build is refused by the planner, naming it
        if model.mtp_layers:
            assert "multi-token prediction" in refusal, refusal
        return
    assert plans and not model.mtp_layers
    for plan in plans:
        assert_runtime_accepts(plan)
        if model.is_mla:
            assert plan.parallelism.tp == 1


def test_the_issue_model_is_refused_by_the_planner_not_by_torchrun():
    """A 4-layer DeepSeek-V3-style config (MLA, 4 experts, one MTP layer) on cpux4: once
    emitted as tp=2 etp=2 and refused by every torchrun; now the planner refuses it."""
    m = Model("tiny-dsv3", num_layers=4, hidden=64, ffn_hidden=128, num_heads=4, num_kv_heads=4,
              vocab_size=128, max_seq_len=32, num_experts=4, experts_per_token=2,
              moe_ffn_hidden=32, shared_expert_ffn_hidden=32, first_dense_layers=1,
              kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
              mtp_layers=1)
    for ep in (None, 2):
        plans, refusal = plans_for_runtime(m, get_cluster("cpux4"), 32, 16, ep=ep)
        assert plans is None and "multi-token prediction (1 mtp_layers)" in refusal
        assert "--engine megatron" in refusal
    # without MTP it plans, at tp 1 (MLA), and the runtime takes every plan
    plans, refusal = plans_for_runtime(m.scaled(mtp_layers=0), get_cluster("cpux4"), 32, 16)
    assert plans, refusal
    for plan in plans:
        assert plan.parallelism.tp == 1
        assert_runtime_accepts(plan)


# ---- a few fixed draws train one step under torchrun ---------------------------------------

TRAINED = {
    # MoE with a shared expert, sinks and sliding windows on two processes
    # MoE under tp 2 (sequence parallel, each expert split over the tp ranks: etp = tp)
    "moe_tp2": (Model("t-moe-tp", num_layers=2, hidden=32, ffn_hidden=64, num_heads=4,
                      num_kv_heads=2, vocab_size=64, max_seq_len=32, num_experts=4,
                      experts_per_token=2, moe_ffn_hidden=16), "cpux2", 16, 4, dict(tp=2)),
    "moe_sinks_window": (Model("t-moe", num_layers=2, hidden=32, ffn_hidden=64, num_heads=4,
                               num_kv_heads=2, vocab_size=64, max_seq_len=32, num_experts=4,
                               experts_per_token=2, moe_ffn_hidden=16,
                               shared_expert_ffn_hidden=32, attention_sinks=True,
                               sliding_window=4, full_attention_interval=2), "cpux2", 16, 4, {}),
    # MLA (tp 1 only) dense
    "mla_dense": (Model("t-mla", num_layers=2, hidden=32, ffn_hidden=64, num_heads=4,
                        num_kv_heads=4, vocab_size=64, max_seq_len=32, kv_lora_rank=16,
                        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8), "cpux2", 16, 4, {}),
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """{name: (result, launch)} of one 2-process launch (tests.runtime_runs) training each
    fixed draw's first plan for one step; the plans under "plans"."""
    d = tmp_path_factory.mktemp("trained")
    runs, plans = {}, {}
    for name, (model, cluster, seq, gbs, fixed) in TRAINED.items():
        found, refusal = plans_for_runtime(model, get_cluster(cluster), seq, gbs, **fixed)
        plans[name] = (found[0] if found else None, refusal)
        if found:
            assert found[0].parallelism.world_size == 2, name
            found[0].save(d / f"{name}.json")
            runs[name] = ["--plan", d / f"{name}.json", "--steps", 1,
                          "--metrics", d / f"{name}.jsonl"]
    return {**runs_of(2, runs, d), "plans": plans, "dir": d}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TRAINED))
def test_fixed_draws_train_one_step_under_torchrun(name, trained):
    _, _, _, _, fixed = TRAINED[name]
    plan, refusal = trained["plans"][name]
    assert plan, refusal
    if fixed.get("tp"):
        assert plan.parallelism.etp == plan.parallelism.tp and plan.parallelism.sequence_parallel
    assert_runtime_accepts(plan)
    ran(*trained[name])
    steps = [json.loads(line)
             for line in (trained["dir"] / f"{name}.jsonl").read_text().splitlines()]
    step = [d for d in steps if d.get("step") == 1]
    assert step and step[0]["loss"] > 0, steps
