"""`--plot`: the simulated pipeline schedule against the cost model, and the pictures written."""
from __future__ import annotations

import json
import struct

import pytest

from planner.cli import main
from planner.cost.schedule import in_flight, pipeline_time
from planner.plan import Plan
from planner.plot import (MAX_DRAWN, drawn_microbatches, plan_figure, schedule_order,
                          simulate)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24]), len(data)


# ---- the schedule simulation -------------------------------------------------------------

CASES = [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("1f1b", 8, 3, 1), ("1f1b", 1, 5, 1),
         ("interleaved", 4, 8, 2), ("interleaved", 4, 8, 4), ("interleaved", 4, 4, 2),
         ("interleaved", 2, 6, 3)]


@pytest.mark.parametrize("schedule, p, m, v", CASES)
def test_simulated_uniform_pipeline_matches_the_cost_model(schedule, p, m, v):
    F, B = 1.0, 2.0
    ops = simulate(schedule, [[F / v] * v] * p, [[B / v] * v] * p, m, v)
    makespan = max(op[-1] for op in ops)
    assert makespan == pytest.approx(pipeline_time([F + B] * p, m, v)[0])


@pytest.mark.parametrize("schedule, p, m, v", CASES)
def test_simulated_schedule_is_a_valid_execution(schedule, p, m, v):
    fwd = [[0.3 + 0.1 * r + 0.05 * c for c in range(v)] for r in range(p)]   # uneven stages
    bwd = [[2 * x for x in row] for row in fwd]
    ops = simulate(schedule, fwd, bwd, m, v)
    # every (kind, micro-batch, virtual stage) exactly once
    seen = {(k, mb, c * p + r) for r, k, mb, c, _, _ in ops}
    assert len(seen) == len(ops) == 2 * m * p * v
    end = {(k, mb, c * p + r): e for r, k, mb, c, _, e in ops}
    for r, k, mb, c, s, e in ops:
        vs = c * p + r
        assert e - s == pytest.approx((fwd if k == "F" else bwd)[r][c])
        if k == "F" and vs > 0:
            assert s >= end[("F", mb, vs - 1)] - 1e-12
        if k == "B":
            assert s >= end[("F", mb, vs)] - 1e-12
            if vs < p * v - 1:
                assert s >= end[("B", mb, vs + 1)] - 1e-12
    for r in range(p):   # a rank runs one thing at a time
        spans = sorted((s, e) for rr, *_, s, e in ops if rr == r)
        assert all(a[1] <= b[0] + 1e-12 for a, b in zip(spans, spans[1:]))


@pytest.mark.parametrize("schedule, p, m, v", CASES)
def test_schedule_order_peak_in_flight_matches_the_memory_model(schedule, p, m, v):
    """The most forwards a rank has run without their backward is what planner.cost.schedule
    charges activation memory for."""
    for r in range(p):
        live = peak = 0
        for kind, _, _ in schedule_order(schedule, p, m, v, r):
            live += 1 if kind == "F" else -1
            peak = max(peak, live)
        assert peak / v == pytest.approx(in_flight(schedule, p, r, m, v)), (r, peak)


def test_drawn_microbatches_capped():
    assert drawn_microbatches("1f1b", 4, 8) == 8
    assert drawn_microbatches("1f1b", 4, 512) == MAX_DRAWN
    assert drawn_microbatches("1f1b", 16, 512) == 32            # room for a steady state
    assert drawn_microbatches("interleaved", 6, 60) == 18       # a multiple of p
    assert drawn_microbatches("interleaved", 16, 64) == 32
    assert drawn_microbatches("interleaved", 32, 64) == 64


# ---- the pictures ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    d = tmp_path_factory.mktemp("plot")
    out = {}
    for name, args in {
        "interleaved": ["--pp", "4", "--vpp", "2", "--tp", "2", "--global-batch", "8"],
        "many_mb": ["--pp", "2", "--tp", "1", "--schedule", "1f1b", "--global-batch", "256",
                    "--micro-batch", "1"],
        "single": ["--pp", "1", "--global-batch", "16"],
    }.items():
        path = d / f"{name}.json"
        assert main(["--model", "llama8b", "--cluster", "h100x8", "--seq-len", "4096", *args,
                     "--out", str(path), "--json"]) == 0
        out[name] = path
    return out


def test_plan_plot_writes_a_png_and_keeps_json_stdout(capsys, tmp_path):
    png = tmp_path / "p.png"
    code = main(["--model", "llama8b", "--cluster", "h100x8", "--pp", "2", "--seq-len", "4096",
                 "--global-batch", "32", "--json", "--plot", str(png)])
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    json.loads(out)
    (w, h), size = png_size(png)
    assert w >= 1000 and h >= 600 and size > 20_000


def test_show_plot_for_each_schedule(capsys, plans, tmp_path):
    for name, path in plans.items():
        png = tmp_path / f"{name}.png"
        code = main(["show", str(path), "--plot", str(png)])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert "Plan for" in out
        (w, h), size = png_size(png)
        assert w >= 1000 and h >= 600 and size > 20_000, name


def test_svg_output(capsys, plans, tmp_path):
    svg = tmp_path / "p.svg"
    assert main(["show", str(plans["single"]), "--plot", str(svg)]) == 0
    assert svg.read_text().lstrip().startswith("<?xml") and "<svg" in svg.read_text()


def test_timeline_and_memory_bars_follow_the_plan(plans):
    plan = Plan.load(plans["interleaved"])
    p, v, m = plan.parallelism.pp, plan.parallelism.vpp, plan.batch.num_microbatches
    fig = plan_figure(plan)
    timeline, memory = fig.axes[0], fig.axes[1]
    assert fig.drawn_microbatches == m == 8
    rects = sum(len(col.get_paths()) for col in timeline.collections)
    assert rects == 2 * m * p * v + p                        # every block, and each tail
    # stacked bars: one container per memory part, p bars each, stacked to the stage totals
    assert len(memory.containers) == 5
    totals = [0.0] * p
    for cont in memory.containers:
        assert len(cont.patches) == p
        for i, bar in enumerate(cont.patches):
            totals[i] += bar.get_height()
    for r in range(p):
        assert totals[r] == pytest.approx(plan.stages_of_rank(r)[0].memory_gib["total"], abs=0.02)
    cap_lines = [ln for ln in memory.get_lines() if "usable capacity" in ln.get_label()]
    assert cap_lines and cap_lines[0].get_ydata()[0] == pytest.approx(
        plan.estimate["capacity_gib"])


def test_many_microbatches_are_capped_and_said_so(plans):
    plan = Plan.load(plans["many_mb"])
    m = plan.batch.num_microbatches
    assert m > MAX_DRAWN
    fig = plan_figure(plan)
    assert fig.drawn_microbatches == MAX_DRAWN
    title = fig.axes[0].get_title(loc="left")
    assert f"first {MAX_DRAWN} of {m} micro-batches" in title
    rects = sum(len(col.get_paths()) for col in fig.axes[0].collections)
    assert rects == 2 * MAX_DRAWN * plan.parallelism.pp + plan.parallelism.pp


def test_matplotlib_is_not_imported_without_plot():
    import subprocess
    import sys
    code = ("import sys; from planner.cli import main; "
            "main(['--model', 'llama8b', '--cluster', 'h100x8', '--json']); "
            "sys.exit(3 if 'matplotlib' in sys.modules or 'torch' in sys.modules else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
