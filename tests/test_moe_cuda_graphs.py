"""The CUDA graphs each Megatron-Bridge MoE row's recipe ran (issue 22): read for every row of
both MoE files from its release's recipes (benchmarks/data/heldout_build/mbridge_moe_graphs.json),
written into the rows, and consistent with what Megatron-Core accepts."""

import json
from pathlib import Path

import pytest

from benchmarks import fidelity

DATA = Path(fidelity.__file__).parent / "data"
GRAPHS = json.loads((DATA / "heldout_build" / "mbridge_moe_graphs.json").read_text())["rows"]
PER_LAYER = ("transformer_engine", "local")
# megatron/core/transformer/transformer_config.py cuda_graph_modules: the per-layer capture
# scopes of an MoE model ("full" is the deprecated name of the whole layer)
SCOPES = {"attn", "moe_router", "moe_preprocess", "full"}


@pytest.fixture(scope="module")
def moe_rows():
    rows = [r for f in ("published_runs_moe.json", "published_runs_heldout.json")
            for r in json.loads((DATA / f).read_text())["runs"] if "moe" in r.get("needs", ())]
    assert len(rows) >= 133
    return rows


def test_every_moe_row_had_its_recipe_read(moe_rows):
    assert {r["id"] for r in moe_rows} == set(GRAPHS)


def test_rows_carry_the_graphs_their_recipe_set(moe_rows):
    for r in moe_rows:
        g, f = GRAPHS[r["id"]], r["fixed"]
        if g["cuda_graph_impl"] in PER_LAYER:
            assert f["cuda_graph"] == g["cuda_graph_impl"], r["id"]
            assert f["cuda_graph_scope"] == g["cuda_graph_scope"], r["id"]
            assert g["revision"].split()[0] in r["cuda_graph_source"], r["id"]
        else:
            assert f.get("cuda_graph") in (None, "full_iteration"), r["id"]
            assert "cuda_graph_scope" not in f, r["id"]


def test_full_iteration_rows_agree_between_the_two_reads(moe_rows):
    # the builder's full-iteration rows (mbridge_moe.py FULL_ITERATION, read from the 26.06
    # release branch's pick commits) and the per-release read of every row's recipe are two
    # readings of the recipes: they name the same rows
    builder = {r["id"] for r in moe_rows if fidelity.full_iteration_graph(r)}
    read = {i for i, g in GRAPHS.items() if g["cuda_graph_impl"] == "full_iteration"}
    assert builder == read and builder


def test_scopes_are_what_megatron_captures(moe_rows):
    for r in moe_rows:
        scope = r["fixed"].get("cuda_graph_scope")
        if scope is None:
            continue
        assert scope and set(scope) <= SCOPES, r["id"]
        # transformer_config.py: "moe_preprocess" must be used together with "moe_router"
        assert "moe_preprocess" not in scope or "moe_router" in scope, r["id"]
        if "full" in scope:
            # the whole layer, MoE included: capturable only with static shapes, a capacity
            # factor with padding (megatron/core/transformer/moe/README.md @8479eb35, "CUDA
            # Graph Support": without them "the resulting dynamic shapes make MoE layers
            # uncapturable")
            assert r["fixed"].get("moe_capacity_factor") is not None, r["id"]
