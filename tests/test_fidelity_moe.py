"""The cost model against the published Megatron-Bridge MoE runs (benchmarks/data/
published_runs_moe.json): runs the real predictor on every committed row (about 5 s)."""

import statistics

import pytest

from benchmarks import fidelity
from planner.catalog import get_model

# Regression guards: the median |error| of the table as measured with the flex (DeepEP)
# dispatcher, the EP all-to-all overlap, drop-and-pad on the token-drop rows, Megatron's
# unpermute keeping no expert outputs, each row's pipeline layout and selective recompute
# modules as its recipe ran them, and the dropless host stall (per MoE layer, and per local
# expert where the layer's GPU work does not hide it) fitted on that table's 26.04 / 26.04.01
# rows, rounded up. They were 10.5% over the 10 BF16 rows, 8.9% over all 42, 9.0% over the 29
# rows held out of the fit until the rows were mended for issue 22 (item 4, reported even where
# worse): the three GPT-OSS-120B B200 ep8 rows run their recipe's layernorm + moe_act recompute
# and every row its recipe's bf16 gradients (`recompute_source`, `grad_dtype_source`), and the
# host stall was refitted on the mended rows (4.33 -> 4.78 ms, 0.213 -> 0.200 ms): now 14.4%,
# 10.2% and 11.3% (benchmarks/results/fidelity_moe_2026-12-02.md), the GPT-OSS B200 rows
# predicted 31-35% fast. Lowering these needs physics, never a constant chosen on the held-out
# rows.
BF16_MEDIAN_GUARD_PCT = 15.0
ALL_MEDIAN_GUARD_PCT = 10.5
HELD_OUT_MEDIAN_GUARD_PCT = 12.0


@pytest.fixture(scope="module")
def runs():
    return fidelity.load_runs(fidelity.DATA_MOE)


@pytest.fixture(scope="module")
def table(runs):
    md, rows = fidelity.moe_markdown(runs)
    return md, rows


def test_data_set_is_complete(runs):
    # the 42 "moe" rows of published-runs-2.json; dropping one would improve the figures
    assert len(runs) == 42 and len({r["id"] for r in runs}) == 42
    for r in runs:
        assert r["engine"] == "megatron" and r["step_time_s"] > 0 and r["source"]
        assert "moe" in r["needs"]
        if "not_evaluable" in r:
            assert r["not_evaluable"].strip(), r["id"]
            continue
        # evaluated with the catalog model the row's config.json describes
        cfg, m = r["model"], get_model(r["catalog_model"])
        assert m.num_layers == cfg["num_hidden_layers"] and m.hidden == cfg["hidden_size"]
        if "head_dim" in cfg:
            assert m.head_dim == cfg["head_dim"], r["id"]
        if cfg["model_type"] == "deepseek_v3":
            assert m.kv_lora_rank == cfg["kv_lora_rank"] and m.q_lora_rank == cfg["q_lora_rank"]
            # the recipe ran one MTP layer (the row's mtp_source)
            assert r["model_overrides"]["mtp_layers"] == 1 and "mtp_num_layers" in r["mtp_source"]
        # a low precision names its recipe; H100 has no MXFP8
        if r["precision"] != "bf16":
            assert r["recipe"] in ("tensorwise", "mxfp8")
            assert not ("-h100-" in r["id"] and r["precision"] == "mxfp8"), r["id"]
        # tp > 1 rows say whether their recipe overlapped TP communication, with the source
        if r["fixed"]["tp"] > 1:
            assert "tp_comm_overlap" in r["fixed"] and r["tp_comm_overlap_source"]


def test_every_row_is_evaluated_or_says_why(runs, table):
    md, rows = table
    evaluated = {r["run"] for r in rows}
    for r in runs:
        assert r["id"] in evaluated or r["id"] in md, r["id"]
    assert len(rows) + sum("not_evaluable" in r for r in runs) == len(runs)


def test_no_published_configuration_is_predicted_not_to_fit(table):
    _, rows = table
    assert [r["run"] for r in rows if not r["fits"]] == []


def test_candidates_honour_the_published_knobs(runs, table):
    _, rows = table
    by_id = {r["id"]: r for r in runs}
    for row in rows:
        f, c = by_id[row["run"]]["fixed"], row["candidate"]
        assert (c.tp, c.pp, c.dp, c.ep, c.mbs) == (f["tp"], f["pp"], f["dp"], f["ep"],
                                                   f["micro_batch"]), row["run"]
        assert row["precision"] == by_id[row["run"]]["precision"]
        if f.get("stage_layers"):     # the recipe's pipeline layout, as it ran
            assert row["layers"] == f["stage_layers"], row["run"]
        if f.get("recompute_modules"):   # the recipe's selective recompute, every layer
            assert "Megatron-Bridge" in by_id[row["run"]]["recompute_source"], row["run"]
            assert (c.recompute, c.recompute_modules) == (
                "selective", tuple(f["recompute_modules"])), row["run"]
            assert row["recompute"] == row["layers"], row["run"]


def test_pipeline_rows_carry_their_recipes_layout(runs):
    """Every pp > 1 row fixes the decoder layers per rank its recipe ran, cited; the counts
    cover the model (MTP layers are not decoder layers) and give every chunk a layer."""
    for r in runs:
        f = r["fixed"]
        if f.get("pp", 1) == 1:
            assert "stage_layers" not in f
            continue
        layers = f["stage_layers"]
        model = get_model(r["catalog_model"])
        assert len(layers) == f["pp"] and sum(layers) == model.num_layers, r["id"]
        assert min(layers) >= f.get("vpp", 1), r["id"]
        assert "Megatron-Bridge" in r["layout_source"], r["id"]


def test_median_error_guard(table):
    _, rows = table
    bf16 = [abs(r["error_pct"]) for r in rows if r["precision"] == "bf16"]
    everything = [abs(r["error_pct"]) for r in rows]
    assert len(bf16) == 10 and len(everything) == 42
    assert statistics.median(bf16) <= BF16_MEDIAN_GUARD_PCT
    assert statistics.median(everything) <= ALL_MEDIAN_GUARD_PCT


def test_held_out_rows_guard(table):
    _, rows = table
    held = [abs(r["error_pct"]) for r in rows if r["fit"] == "held out"]
    assert len(held) == 29
    assert statistics.median(held) <= HELD_OUT_MEDIAN_GUARD_PCT


def test_rows_name_their_dispatcher_and_overlap_with_a_source(runs):
    """The dispatcher and EP overlap a row is priced with are its recipe's, cited; the rows
    that name none leave the planner's choice (only where the ep group sits inside a node, so
    every dispatcher prices the same)."""
    for r in runs:
        f = r["fixed"]
        if "moe_dispatcher" in f:
            assert f["moe_dispatcher"] in ("alltoall", "flex") and r["moe_comm_source"]
            assert isinstance(f["ep_comm_overlap"], bool)
            # Megatron refuses the overlap without vpp under pp > 1 (transformer_config.py)
            assert not f["ep_comm_overlap"] or f["pp"] == 1 or f.get("vpp", 1) > 1, r["id"]
        else:
            assert f["ep"] * f.get("etp", 1) <= r["gpus_per_node"], r["id"]
