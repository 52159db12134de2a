"""`plan sweep`: one row per point, the same plan `plan` picks, CSV, plot, and error paths."""
from __future__ import annotations

import io
import json

import pandas as pd
import pytest

from planner.cli import main
from planner.sweep import COLUMNS

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# on the GPUs alone (with the optimizer offloaded the 8B model fits one H100: test_offload.py)
SMALL = ["--model", "llama8b", "--seq-lens", "4096", "--global-batches", "32",
         "--offload-optimizer", "none"]


def run(capsys, *args):
    code = main(["sweep", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def cluster_sweep(tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep")
    csv, png = d / "s.csv", d / "s.png"
    code = main(["sweep", *SMALL, "--clusters", "h100x1,h100x8,h100x16", "--csv", str(csv),
                 "--plot", str(png)])
    return code, pd.read_csv(csv), png


def test_cluster_sweep_csv_rows_and_columns(cluster_sweep):
    code, df, _ = cluster_sweep
    assert code == 0
    assert list(df.columns) == COLUMNS
    assert list(df["cluster"]) == ["h100x1", "h100x8", "h100x16"]
    assert list(df["gpus"]) == [1, 8, 16]
    assert list(df["fits"]) == [False, True, True]
    # the 8B model does not fit on one GPU: a row that says so, with how far off it is
    one = df.iloc[0]
    assert one["note"].startswith("nothing fits; closest") and "over by" in one["note"]
    assert one["peak_needed_gib"] > one["capacity_gib"]
    assert pd.isna(one["step_time_s"]) and pd.isna(one["tokens_per_s"])
    for _, r in df[df["fits"]].iterrows():
        assert r["tp"] * r["pp"] * r["dp"] == r["gpus"]
        assert r["micro_batch"] * r["num_microbatches"] * r["dp"] == r["global_batch"]
        assert r["tokens_per_s"] == pytest.approx(r["seq_len"] * r["global_batch"]
                                                  / r["step_time_s"])
        assert r["tokens_per_s_per_gpu"] == pytest.approx(r["tokens_per_s"] / r["gpus"])
        assert 0 < r["mfu"] < 1
        assert r["peak_needed_gib"] <= r["capacity_gib"]
        tp, pp, dp, zero = (int(r[k]) for k in ("tp", "pp", "dp", "zero"))  # NaN elsewhere
        assert f"tp={tp} pp={pp} dp={dp} zero={zero}" in r["config"]
    # twice the GPUs, more throughput
    assert df["tokens_per_s"].iloc[2] > df["tokens_per_s"].iloc[1]


def test_sweep_rows_are_the_plans_plan_picks(capsys, cluster_sweep):
    _, df, _ = cluster_sweep
    assert main(["--model", "llama8b", "--cluster", "h100x16", "--seq-len", "4096",
                 "--global-batch", "32", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    row = df.iloc[2]
    p = d["parallelism"]
    assert (row["tp"], row["pp"], row["dp"], row["zero"]) == (p["tp"], p["pp"], p["dp"],
                                                               p["zero_stage"])
    assert row["step_time_s"] == pytest.approx(d["estimate"]["step_time_s"], rel=1e-9)
    assert row["mfu"] == pytest.approx(d["estimate"]["mfu"], rel=1e-9)


def test_sweep_plot_is_a_png(cluster_sweep):
    _, _, png = cluster_sweep
    data = png.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 15_000


def test_sweep_table_on_stdout(capsys):
    code, out, err = run(capsys, *SMALL, "--clusters", "h100x1,h100x8")
    assert code == 0 and err == ""
    assert "Sweep: llama3-8b" in out and "nothing fits" in out
    assert "│ NO " in out and "│ yes " in out and "tokens/s" in out and "MFU" in out


def test_sequence_length_sweep(capsys):
    code, out, _ = run(capsys, "--model", "llama8b", "--clusters", "h100x8", "--seq-lens",
                       "2048,4096", "--global-batches", "32", "--csv", "-")
    assert code == 0
    df = pd.read_csv(io.StringIO(out))            # --csv -: only CSV on stdout
    assert list(df["seq_len"]) == [2048, 4096] and list(df["fits"]) == [True, True]
    assert df["step_time_s"].iloc[1] > df["step_time_s"].iloc[0]


def test_global_batch_sweep_json(capsys):
    code, out, _ = run(capsys, "--model", "llama8b", "--clusters", "h100x8", "--seq-lens",
                       "4096", "--global-batches", "16,32", "--json")
    assert code == 0
    rows = json.loads(out)
    assert [r["global_batch"] for r in rows] == [16, 32]
    assert set(rows[0]) == set(COLUMNS)


def test_point_with_no_configuration_is_a_row(capsys):
    code, out, _ = run(capsys, *SMALL, "--clusters", "h100x1,h100x8", "--zero", "1",
                       "--csv", "-")
    assert code == 0
    df = pd.read_csv(io.StringIO(out))
    assert list(df["fits"]) == [False, True]
    assert "--zero 1" in df["note"].iloc[0] and "dp > 1" in df["note"].iloc[0]
    assert df["zero"].iloc[1] == 1


def test_nothing_fits_anywhere_exits_3(capsys, tmp_path):
    png = tmp_path / "none.png"
    code, out, err = run(capsys, "--model", "llama70b", "--clusters", "h100x1,h100x2",
                         "--seq-lens", "4096", "--global-batches", "8", "--plot", str(png))
    assert code == 3 and err == ""
    assert out.count("nothing fits") == 2
    assert png.read_bytes()[:8] == PNG_MAGIC


@pytest.mark.parametrize("args, needle", [
    (["--clusters", "h100x8"], "required: --model"),
    (["--model", "llama8b"], "required: --clusters"),
    (["--model", "nope", "--clusters", "h100x8"], "unknown model"),
    (["--model", "llama8b", "--clusters", "h100x8,zzz"], "unknown cluster 'zzz'"),
    (["--model", "llama8b", "--clusters", ","], "empty list"),
    (["--model", "llama8b", "--clusters", "h100x8", "--seq-lens", "4096,abc"],
     "'abc' is not an integer"),
    (["--model", "llama8b", "--clusters", "h100x8", "--global-batches", "0"], "must be positive"),
    (["--model", "llama8b", "--clusters", "h100x8", "--plot", "x.txt"], ".png"),
    (["--model", "llama8b", "--clusters", "h100x8", "--csv", "/no/such/dir/x.csv"],
     "no such directory"),
    (["--model", "llama8b", "--clusters", "h100x8", "--zero", "7"], "invalid choice"),
    (["--model", "llama8b", "--clusters", "h100x8", "--compile"],
     "torch.compile for torchtitan only, not megatron"),
])
def test_sweep_errors_are_one_line_exit_2(capsys, args, needle):
    code, out, err = run(capsys, *args)
    assert code == 2, err
    assert out == ""
    assert err.startswith("plan: error:") and err.count("\n") == 1
    assert needle in err


def test_sweep_figure_lines_follow_the_swept_axes():
    from planner.catalog import get_cluster, get_model
    from planner.search import Fixed
    from planner.sweep import sweep, sweep_figure

    m = get_model("llama8b")
    # sequence lengths with the default batch (which follows them): one line, x = seq_len
    df = sweep(m, [get_cluster("h100x8")], [2048, 4096], None, Fixed())
    assert df["global_batch"].nunique() == 2
    tps, mfu = sweep_figure(df).axes
    assert len(tps.get_lines()) == 1
    assert list(tps.get_lines()[0].get_xdata()) == [2048, 4096]
    assert list(tps.get_lines()[0].get_ydata()) == pytest.approx(list(df["tokens_per_s"]))
    assert list(mfu.get_lines()[0].get_ydata()) == pytest.approx(list(df["mfu"] * 100))
    # clusters of one size and two GPU types, two batches: categories, one line per batch
    df = sweep(m, [get_cluster("h100x8"), get_cluster("a100x8")], [4096], [16, 32], Fixed())
    tps, _ = sweep_figure(df).axes
    assert len(tps.get_lines()) == 2
    assert [t.get_text() for t in tps.figure.axes[1].get_xticklabels()] == ["h100x8", "a100x8"]
    assert sorted(t.get_text() for t in tps.get_legend().get_texts()) == [
        "global batch 16", "global batch 32"]


def test_sweep_rows_are_the_plans_plan_picks_for_the_engine(capsys):
    """--engine and --compile reach every point: each row is `plan`'s answer for them."""
    common = ["--model", "llama8b", "--seq-len", "4096", "--global-batch", "32", "--engine",
              "torchtitan", "--compile"]
    code, out, _ = run(capsys, "--clusters", "h100x8", *common, "--json")
    assert code == 0
    row = json.loads(out)[0]
    assert main(["--cluster", "h100x8", *common, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["engine"] == "torchtitan" and d["compile"] is True
    assert row["step_time_s"] == pytest.approx(d["estimate"]["step_time_s"], rel=1e-9)
