"""The held-out published runs (benchmarks/data/published_runs_heldout.json, issue 22 item 5):
well-formed, each figure traceable to the quoted source row, and from sources the other data
files do not hold (so no fit has seen them)."""

import json
import re
from pathlib import Path

import pytest

from benchmarks import fidelity
from planner.catalog import get_gpu
from planner.engines import ENGINES

DATA = Path(fidelity.__file__).parent / "data"
HELDOUT = DATA / "published_runs_heldout.json"
OTHERS = ["published_runs.json", "published_runs_2.json", "published_runs_moe.json"]


@pytest.fixture(scope="module")
def doc():
    return json.loads(HELDOUT.read_text())


@pytest.fixture(scope="module")
def runs(doc):
    return doc["runs"]


@pytest.fixture(scope="module")
def other_runs():
    return [r for f in OTHERS for r in json.loads((DATA / f).read_text())["runs"]]


def test_shape(doc, runs):
    assert set(doc) == {"about", "runs"} and doc["about"]
    assert len(runs) >= 60


def test_ids_unique_and_new(runs, other_runs):
    ids = [r["id"] for r in runs]
    assert len(set(ids)) == len(ids)
    assert not set(ids) & {r["id"] for r in other_runs}


def test_sources_new(runs, other_runs):
    # no fit has seen these rows: no source string of the other data files recurs here
    assert not {r["source"] for r in runs} & {r["source"] for r in other_runs}


def test_every_row_cites_and_quotes(runs):
    for r in runs:
        assert r["source"] and r["quote"] and r["family"], r["id"]
        assert r.get("url") or all(r.get(k) for k in ("repo", "path", "commit")), r["id"]
        if r.get("commit"):
            assert re.fullmatch(r"[0-9a-f]{40}", r["commit"]), r["id"]
            assert r["commit"] in r["url"], r["id"]


def test_every_printed_figure_is_in_the_quote(runs):
    # `published` is the quoted table row cell by cell (a quoted log line: its figures)
    for r in runs:
        table = r["quote"].startswith("|")
        cells = [c.strip() for c in r["quote"].strip().strip("|").split("|")]
        for key, value in r["published"].items():
            if key.startswith("_"):
                continue
            assert (value in cells) if table else (value in r["quote"]), (r["id"], key, value)


def _printed(value, variant):
    """A printed cell: the figure outside parentheses, or inside for the 'inside' variant."""
    m = re.fullmatch(r"(.+?)\s*\((.+)\)", value)
    if not m:
        return value
    return m.group(2) if variant == "value inside parentheses" else m.group(1)


def test_step_time_follows_from_the_printed_figures(runs):
    for r in runs:
        p = r["published"]
        if "Throughput (T/s)" in p:         # llm-foundry
            expected = int(p["GlobalBatchSize (T)"]) / int(p["Throughput (T/s)"])
        elif "elapsed time per iteration (s)" in p:   # Megatron(-DeepSpeed) log line
            expected = float(p["elapsed time per iteration (s)"])
        elif "block_start time_ms" in p:      # MLPerf: the median block, its steps counted in samples
            block = (int(p["block_stop time_ms"]) - int(p["block_start time_ms"])) / 1000
            steps = int(p["epoch_count"]) / (int(p["global_batch_size"]) * int(p["max_sequence_length"]))
            expected = block / steps
        elif "train_step_time" in p:          # MLPerf v5.0: median of the logged step times; the quoted
            expected = float(p["train_step_time"])   # step is the one nearest that median
            assert r["step_time_s"] == pytest.approx(expected, rel=0.01), r["id"]
            continue
        elif "Median tokens/second" in p:    # torchao / torchtitan: per-GPU tokens/s, local batch 1
            expected = r["fixed"]["seq_len"] / float(p["Median tokens/second"])
        elif "last_10_steps_step_time_ms_avg" in p:   # Megatron-Bridge verification card
            expected = float(p["last_10_steps_step_time_ms_avg"]) / 1000
        else:                                # Megatron-Bridge, NeMo
            v = p.get("_variant")
            expected = (int(_printed(p["GBS"], v)) * int(_printed(p["Sequence Length"], v))
                        / (float(_printed(p["Tokens / sec / GPU"], v))
                           * int(_printed(p["#-GPUs"], v))))
        assert r["step_time_s"] > 0
        assert r["step_time_s"] == pytest.approx(expected, rel=1e-4), r["id"]


def test_layout_matches_the_gpu_count(runs):
    for r in runs:
        f, c = r["fixed"], r["cluster"]
        n = int(re.fullmatch(r"[a-z0-9\-]+?x(\d+)", c).group(1)) if isinstance(c, str) \
            else c["num_gpus"]
        assert f["tp"] * f["pp"] * f["dp"] * f.get("cp", 1) == n, r["id"]
        if "micro_batch" in f:
            assert f["global_batch"] % f["dp"] == 0 or "GradAccum" in r["published"], r["id"]


def test_memory_rows_name_what_was_measured(runs):
    for r in runs:
        if "memory_gib" in r:
            assert r["memory_gib"] > 0 and r["memory_kind"], r["id"]
            assert str(r["memory_gib"]) in r["quote"], r["id"]


def test_planner_reads_every_row(runs):
    # the model through the loader benchmarks/fidelity.py uses, the GPU from the catalog, the
    # engine and the knobs through fidelity.fixed_of (the cluster itself is not built: GB200 /
    # GB300 jobs of 256 GPUs are the planner's open refusal, issue 22 item 1)
    for r in runs:
        model = fidelity.model_of(r)
        assert model.num_params() > 0, r["id"]
        c = r["cluster"]
        gpu = re.fullmatch(r"([a-z0-9\-]+?)x\d+", c).group(1) if isinstance(c, str) else c["gpu"]
        get_gpu(gpu)
        assert r["engine"] in ENGINES, r["id"]
        fidelity.fixed_of(r)


def test_what_the_source_footnotes_of_a_row_is_recorded_with_it(runs):
    """A row whose quoted table line carries a footnote marker ("[^name]") records what that
    footnote says (`source_caveat`), and only such rows do: the 26.06.01 GPT-OSS-120B GB200 and
    GB300 rows, which the table marks as a known performance regression (cudnn-frontend issue
    256)."""
    marked = {r["id"] for r in runs if re.search(r"\[\^[^\]]+\]", r.get("quote", ""))}
    caveated = {r["id"] for r in runs if r.get("source_caveat")}
    assert marked == caveated
    gptoss = {r["id"] for r in runs if r["id"].startswith("mbridge-26.06.01-")
              and "gptoss" in r["id"]}
    assert len(gptoss) == 2 and gptoss <= caveated
    for r in runs:
        if r["id"] in gptoss:
            name = re.search(r"\[\^([^\]]+)\]", r["quote"]).group(1)
            assert r["source_caveat"].startswith(f"[^{name}]: Performance regression")
            assert "cudnn-frontend/issues/256" in r["source_caveat"]


def test_the_rows_whose_recipe_offloaded_activations_are_priced_with_it(runs):
    """The Megatron-Bridge dense rows whose release's recipe offloaded activations to the host
    (cpu_offloading_num_layers) run the planner's recompute "offload" (Megatron-Core refuses
    it with recompute, so the recipe recomputed nothing): the Llama 3 70B FP8 current-scaling
    rows on 64 GB200 (40 layers) and GB300 (20 layers), Megatron FSDP, of 25.09-26.04.01, and
    25.09's Llama 3.1 405B FP8 row on 128 GB200 (tp 2, FSDP, 95 layers); no other row, and
    none is left `unpriced`. Each ran, so each fits with no margin, offloading layers (the
    planner places its own count), and its step is predicted within 15% (they were +9..+20%
    when the planner recomputed instead)."""
    offload = {r["id"]: r for r in runs if r["fixed"].get("recompute") == "offload"}
    want = {r["id"] for r in runs if re.fullmatch(
        r"mbridge-(26\.0[24](\.01)?-gb[23]00-llama370b-fp8-64gpu-tp1pp1cp1epnonevpnone-gbs256|"
        r"25\.(09|11)-gb[23]00-llama370b-fp8cs-64gpu-tp1pp1cp1ep1vp1-gbs(128|256)|"
        r"25\.09-gb200-llama31405b-fp8cs-128gpu-tp2pp1cp1ep1vp1-gbs64)", r["id"])}
    assert set(offload) == want and len(want) == 12
    assert not [r["id"] for r in runs if r.get("unpriced")]
    for rid, r in offload.items():
        layers = 95 if "405b" in rid else 40 if "-gb200-" in rid else 20
        assert r["recompute_source"].startswith(f"activation CPU offloading of {layers} layers")
        assert "cpu_offloading_num_layers" in r["recompute_source"]
        p = fidelity.predict(r, margin_gib=0.0)
        assert p["fits"] and p["candidate"].recompute == "offload" and p["recompute"][0] > 0, rid
        assert abs(p["error_pct"]) <= 15, (rid, p["error_pct"])


def test_the_405b_rows_carry_their_recipe_layout(runs):
    """Megatron-Bridge's Llama 3.1 405B recipe counts the embedding and the loss as a layer
    each in its pipeline split (account_for_*_in_pipeline_split): every dense Megatron-Bridge
    405B row with pipelining carries [per - 1, per x (pp - 2), per - 1] decoder layers per rank
    with per = 128 / pp (Megatron-Core get_num_layers_to_build), and no recompute exactly where
    its printed parallelism is a preset's that sets none (`recompute_source`); the prediction
    honours the layout."""
    rows = [r for r in runs if r["id"].startswith("mbridge-") and "llama31405b" in r["id"]
            and r["fixed"]["pp"] > 1]
    assert len(rows) == 23 and all(r.get("layout_source") for r in rows)
    for r in rows:
        pp = r["fixed"]["pp"]
        per = 128 // pp
        assert r["fixed"]["stage_layers"] == [per - 1] + [per] * (pp - 2) + [per - 1], r["id"]
        assert (r["fixed"].get("recompute") == "none") == bool(r.get("recompute_source")), r["id"]
    no_rec = {r["id"] for r in rows if not r.get("recompute_source")}
    assert no_rec == {"mbridge-26.02.01-gb300-llama31405b-fp8-256gpu-tp2pp8cp2epnonevp4-gbs1536",
                      "mbridge-25.11-gb200-llama31405b-fp8cs-256gpu-tp4pp16cp1ep1vp4-gbs1536",
                      "mbridge-25.11-gb300-llama31405b-fp8cs-256gpu-tp2pp8cp2ep1vp4-gbs1536"}
    row = next(r for r in rows if r["id"].startswith("mbridge-26.06-gb200-llama31405b-mxfp8"))
    assert fidelity.predict(row)["layers"] == row["fixed"]["stage_layers"]


@pytest.mark.xfail(strict=True, reason=(
    "known over-count (review of the activation offload, 2026-12-05): priced with the recipe's "
    "own 40 offloaded layers, Megatron-Bridge's Llama 3 70B FP8 GB200 runs need 188.9 GiB of "
    "183.0, 180.6 allocated (the planner offloads 44 to fit): the allocator reserve (5% of the "
    "churned bytes, 8.3 GiB) and a layer in flight (3.6 GiB, which Transformer Engine >= "
    "2.10's schedule does not hold) are the allowances these runs say are too large; nothing "
    "measured settles either"))
def test_the_gb200_70b_runs_fit_with_the_recipes_own_offload_count(runs):
    """A configuration that ran fits as it ran: the recipe's count of offloaded layers, not the
    planner's, at no margin."""
    from planner.cost.price import price
    rows = [r for r in runs if r["fixed"].get("recompute") == "offload"
            and "-gb200-llama370b-" in r["id"]]
    assert len(rows) == 5
    for r in rows:
        p = fidelity.predict(r, margin_gib=0.0)
        est = price(fidelity.model_of(r), fidelity.cluster_of(r), p["candidate"], p["layers"],
                    [40], fidelity.engine_of(r), 0.0).estimate
        assert est.fits, (r["id"], est.peak_needed_gib, est.capacity_gib)


def test_the_moe_rows_carry_their_recipe_knobs(runs):
    """The held-out Megatron-Bridge MoE rows carry the dispatcher, EP overlap, recompute and
    pipeline layout their release's recipe ran (`recipe_source`, read into
    heldout_build/mbridge_moe_recipes.json), as published_runs_moe.json's rows do; worked by
    hand from Megatron-Core's rules: DeepSeek-V3's layout "Et*4|(t*4|)*14tmL" is 16 stages
    of 4 decoder layers but the last (1 and the MTP layer), stage i on rank i % pp
    (pipeline_parallel_layer_layout.py), so on pp 2 rank 0 holds 8 x 4 = 32 and rank 1 7 x 4 +
    1 = 29; Qwen3-235B's recipe counts the embedding and the loss as a layer each
    (account_for_*_in_pipeline_split), (94 + 2) / 8 = 12 a rank but one fewer on the first
    and the last; GPT-OSS on GB200 (26.04) recomputes layernorm and moe_act under the EP
    overlap with HybridEP (gpt_oss_workload_base_configs.py GB200_BF16_V1 / V2)."""
    moe = [r for r in runs if "moe" in r["needs"] and r["id"].startswith("mbridge-")]
    read = [r for r in moe if r.get("recipe_source")]
    assert len(read) >= 80
    by_id = {r["id"]: r for r in moe}
    dsv3 = by_id["mbridge-26.04-gb300-deepseekv3-mxfp8-256gpu-tp1pp2cp1ep32vp8-gbs4096"]["fixed"]
    assert dsv3["stage_layers"] == [32, 29]
    assert (dsv3["recompute"], dsv3["recompute_modules"]) == ("selective", ["mla_up_proj"])
    qwen = by_id["mbridge-26.04-gb200-qwen3235ba22b-mxfp8-256gpu-tp1pp8cp1ep32vp3-gbs8192"]
    assert qwen["fixed"]["stage_layers"] == [11] + [12] * 6 + [11]
    oss = by_id["mbridge-26.04-gb200-gptoss120b-bf16-64gpu-tp1pp1cp1ep64vpnone-gbs1280"]["fixed"]
    assert (oss["moe_dispatcher"], oss["ep_comm_overlap"], oss["recompute_modules"]) == (
        "flex", True, ["layernorm", "moe_act"])
    layers = {"deepseek-v3": 61, "qwen3-235b-a22b": 94}
    for r in read:
        if "stage_layers" in r["fixed"]:
            assert sum(r["fixed"]["stage_layers"]) == layers[r["catalog_model"]], r["id"]
