"""Explain output of `plan` and `plan show`: tables, alternatives with reasons, progress, errors.

End to end through planner.cli.main, with stdout/stderr captured and exit codes checked; the
alternatives' claims are checked against the cost model they come from.
"""
from __future__ import annotations

import io
import json
import re
import sys

import pytest

from planner.catalog import get_cluster, get_model
from planner.cli import main
from planner.cost.stage import capacity_bytes, evaluate, memory_budget, stage_coefficients
from planner.engines import get_engine
from planner.explain import alternatives, describe_candidate, render
from planner.plan import Plan
from planner.search import Fixed, heuristic, rules_for, search

BREAKDOWN = ("compute", "TP comm", "PP comm", "exposed DP comm", "bubble", "optimizer")


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def big():
    """llama70b on 32 H100s (defaults: 8K sequences, 512 per step): many candidates are out of
    memory, some of which would be faster than the chosen plan."""
    m, c = get_model("llama70b"), get_cluster("h100x32")
    report = search(m, c, Fixed(cp=1), top=5)   # the layouts before context parallelism
    return m, c, report


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("plans") / "plan.json"
    assert main(["--model", "llama8b", "--cluster", "h100x8", "--pp", "2", "--seq-len", "4096",
                 "--global-batch", "32", "--out", str(path), "--json"]) == 0
    return path


# ---- the default report ------------------------------------------------------------------

def test_report_has_plan_stages_memory_breakdown_and_alternatives(capsys):
    code, out, err = run(capsys, "--model", "llama8b", "--cluster", "h100x8", "--pp", "2",
                         "--schedule", "1f1b", "--seq-len", "4096", "--global-batch", "32")
    assert code == 0, err
    assert err == ""                                  # not a TTY: no progress bar
    assert "Plan for llama3-8b" in out and "pp=2" in out and "MFU" in out
    for col in ("layers", "recomp", "params", "grads", "optim", "activ", "other", "total",
                "free"):
        assert col in out
    assert "usable capacity" in out
    for part in BREAKDOWN:
        assert re.search(rf"│ {re.escape(part)} +│", out), part
    # one row per stage, its layers and memory total read back from the table
    rows = re.findall(r"│ +(\d) │ +(\d) │ +(\d+)-(\d+) \((\d+)\) │ +(\d+) │(.*)", out)
    assert [int(r[0]) for r in rows] == [0, 1]
    assert sum(int(r[4]) for r in rows) == 32
    assert "Alternatives" in out and "slower by" in out


def test_alternatives_slower_by_is_the_real_difference(big):
    m, c, report = big
    alts = alternatives(m, c, report, report.best, Fixed())
    slower = [a for a in alts if a[1] is not None]
    assert len(slower) == len(report.ranked) - 1 >= 2
    base = report.best.estimate.step_time_s
    for (desc, step, why), r in zip(slower, report.ranked[1:]):
        pct = float(re.search(r"slower by ([\d.]+)%", why).group(1))
        assert pct == pytest.approx((r.estimate.step_time_s / base - 1) * 100, abs=0.06)
        assert step == r.estimate.step_time_s
        assert "(more " in why or pct < 0.05


def test_out_of_memory_alternatives_name_the_stage_and_the_gib(big):
    m, c, report = big
    alts = alternatives(m, c, report, report.best, Fixed())
    oom = [a for a in alts if a[2].startswith("out of memory")]
    assert 1 <= len(oom) <= 3
    assert any(" on stage " in why for _, _, why in oom)      # a pipelined one is shown
    rejected = {describe_candidate(cand): cand for cand, _ in report.rejected}
    cap = capacity_bytes(c)
    base = report.best.estimate.step_time_s
    for desc, step, why in oom:
        assert step is None
        cand = rejected[desc]                                   # really rejected by the search
        mt = re.match(r"out of memory(?: on stage (\d+))? by ([\d.]+) GiB \(([\d.]+) needed "
                      r"of ([\d.]+) GiB", why)
        assert mt, why
        k = int(mt.group(1) or 0)
        h = heuristic(m, c, cand, stage_coefficients(m, c, cand), cap,
                      rules_for(get_engine(None), cand, Fixed()))
        over = h.estimate.overflow_gib()
        assert over[k] == pytest.approx(float(mt.group(2)), abs=0.06)
        assert over[k] == pytest.approx(max(over), abs=1e-9) and over[k] > 0
        assert h.estimate.stage_memory_gib[k]["needed"] == pytest.approx(float(mt.group(3)),
                                                                        abs=0.06)
        assert float(mt.group(4)) == pytest.approx(memory_budget(c).usable_gib, abs=0.06)
        # "would be x% faster if it fit": the even split without recompute really is faster
        pct = float(re.search(r"would be ([\d.]+)% faster if it fit", why).group(1))
        L, p = m.num_layers, cand.pp
        split = [L // p + (1 if i >= p - L % p else 0) for i in range(p)]
        ideal = evaluate(m, c, cand, split, [0] * p).step_time_s
        assert ideal < base
        assert pct == pytest.approx((1 - ideal / base) * 100, abs=0.06)


def test_the_report_shows_out_of_memory_rows(capsys):
    code, out, err = run(capsys, "--model", "llama70b", "--cluster", "h100x32", "--top", "2")
    assert code == 0, err
    assert re.search(r"out of memory( on stage \d+)? by \d+\.\d GiB", out)
    # the table wraps its cells: read them with the borders and line breaks folded away
    assert "faster if it fit" in re.sub(r"[│\s]+", " ", out)


def test_not_divisible_alternatives(capsys, tmp_path):
    cfg = tmp_path / "odd.json"           # 6 heads: tp=4 and tp=8 cannot split them
    cfg.write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 4, "hidden_size": 384,
        "intermediate_size": 1024, "num_attention_heads": 6, "num_key_value_heads": 6,
        "vocab_size": 32000, "max_position_embeddings": 2048}))
    code, out, err = run(capsys, "--model", str(cfg), "--cluster", "h100x8", "--seq-len", "2048",
                         "--global-batch", "12")
    assert code == 0, err
    assert re.search(r"tp=4,8 +│ +- │ not divisible: heads \(6\), KV heads \(6\)", out), out
    assert re.search(r"dp=8 .*not divisible: global batch 12 by dp", out), out
    d = json.loads(run(capsys, "--model", str(cfg), "--cluster", "h100x8", "--seq-len", "2048",
                       "--global-batch", "12", "--json")[1])
    assert d["parallelism"]["tp"] in (1, 2)


def test_impossible_explicit_choice_says_not_divisible(capsys):
    code, out, err = run(capsys, "--model", "llama8b", "--cluster", "h100x8", "--micro-batch", "3")
    assert code == 2 and out == ""
    assert err.startswith("plan: error:") and err.count("\n") == 1
    assert "--micro-batch 3: not divisible" in err and "512 at dp=1" in err
    code, _, err = run(capsys, "--model", "llama8b", "--cluster", "h100x8", "--tp", "8",
                       "--pp", "1", "--global-batch", "6", "--micro-batch", "4")
    assert code == 2 and "not divisible" in err and err.count("\n") == 1
    code, _, err = run(capsys, "--model", "llama8b", "--cluster", "h100x8", "--tp", "3")
    assert code == 2 and "--tp 3 does not divide" in err      # the search's own reason


# ---- plan show ---------------------------------------------------------------------------

def test_show_prints_everything_but_alternatives(capsys, saved):
    code, out, err = run(capsys, "show", str(saved))
    assert code == 0, err
    assert "Plan for llama3-8b" in out and "Stages" in out and "usable capacity" in out
    for part in BREAKDOWN:
        assert part in out
    assert "Alternatives" not in out
    d = json.loads(saved.read_text())
    assert f"{d['estimate']['tokens_per_s']:,.0f} tokens/s" in out


def test_show_json_roundtrips(capsys, saved):
    code, out, _ = run(capsys, "show", str(saved), "--json")
    assert code == 0 and json.loads(out) == json.loads(saved.read_text())


def test_show_recomputes_a_missing_estimate(capsys, saved, tmp_path):
    d = json.loads(saved.read_text())
    d["estimate"] = {}
    for s in d["stages"]:
        s["memory_gib"] = {}
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(d))
    code, out, err = run(capsys, "show", str(bare))
    assert code == 0, err
    assert "estimate recomputed" in out and "tokens/s" in out
    full = json.loads(saved.read_text())
    assert f"{full['estimate']['tokens_per_s']:,.0f} tokens/s" in out


def test_render_without_estimate_does_not_crash(saved):
    plan = Plan.load(saved)
    plan.estimate = {}
    text = render(plan)
    assert "Plan for" in text and "Stages" in text


# ---- progress ------------------------------------------------------------------------------

class FakeTTY(io.StringIO):
    def isatty(self):
        return True


def test_progress_goes_to_a_tty_stderr_and_never_to_stdout(capsys, monkeypatch):
    tty = FakeTTY()
    monkeypatch.setattr(sys, "stderr", tty)
    code = main(["--model", "llama70b", "--cluster", "h100x32", "--seq-len", "4096",
                 "--global-batch", "64", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    json.loads(out)                                   # stdout is the plan JSON only
    assert "planning llama3-70b on h100x32" in tty.getvalue()


def test_no_progress_when_stderr_is_not_a_tty(capsys):
    code, out, err = run(capsys, "--model", "llama8b", "--cluster", "h100x8", "--json")
    assert code == 0 and err == ""
    json.loads(out)


# ---- errors: one line on stderr, exit 2 ----------------------------------------------------

def _one_line_error(code, out, err):
    assert code == 2, err
    assert out == ""
    assert err.startswith("plan: error:") and err.count("\n") == 1
    assert "Traceback" not in err


def test_error_unknown_export_format(capsys, saved):
    for args in (["show", str(saved), "--export", "nemo"],
                 ["--model", "llama8b", "--cluster", "h100x8", "--export", "nemo"]):
        code, out, err = run(capsys, *args)
        _one_line_error(code, out, err)
        assert "invalid choice: 'nemo'" in err and "megatron" in err


def test_error_missing_plan_file(capsys, tmp_path):
    code, out, err = run(capsys, "show", str(tmp_path / "nope.json"))
    _one_line_error(code, out, err)
    assert "no such file" in err


@pytest.mark.parametrize("content, needle", [
    ('{"hello": 1}', "not a plan"),
    ("[1, 2, 3]", "not a plan"),
    ("{not json", "not valid JSON"),
    ('{"schema_version": 99}', "schema_version 99"),
    ('{"schema_version": 1, "model": "x"}', "not a valid plan"),
])
def test_error_file_that_is_not_a_plan(capsys, tmp_path, content, needle):
    f = tmp_path / "x.json"
    f.write_text(content)
    for cmd in (["show", str(f)], ["show", str(f), "--plot", str(tmp_path / "x.png")],
                ["launch", str(f), "--nnodes", "1"]):
        code, out, err = run(capsys, *cmd)
        _one_line_error(code, out, err)
        assert needle in err


def test_error_plan_that_is_inconsistent(capsys, saved, tmp_path):
    d = json.loads(saved.read_text())
    d["parallelism"]["dp"] = 3
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(d))
    code, out, err = run(capsys, "show", str(f))
    _one_line_error(code, out, err)
    assert "invalid plan" in err


def test_error_plan_path_is_a_directory(capsys, tmp_path):
    code, out, err = run(capsys, "show", str(tmp_path))
    _one_line_error(code, out, err)
    assert "cannot read" in err


def test_error_show_without_a_file(capsys):
    code, out, err = run(capsys, "show")
    _one_line_error(code, out, err)
    assert "required" in err


def test_error_bad_plot_paths(capsys, saved, tmp_path):
    code, out, err = run(capsys, "show", str(saved), "--plot", str(tmp_path / "p.txt"))
    _one_line_error(code, out, err)
    assert "--plot" in err and ".png" in err
    code, out, err = run(capsys, "show", str(saved), "--plot", str(tmp_path / "no" / "p.png"))
    _one_line_error(code, out, err)
    assert "no such directory" in err
    assert not (tmp_path / "p.txt").exists()


# ---- one price per plan; explain renders, suggest returns data ---------------------------

def _imports(path) -> set:
    """Modules a source file imports (at top level or inside functions)."""
    import ast
    out = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_explain_and_the_plot_never_import_the_search_nor_the_search_presentation():
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent / "planner"
    for name in ("explain.py", "plot.py"):
        assert not {m for m in _imports(root / name) if m.startswith("planner.search")}, name
    presentation = {"planner.explain", "planner.plot", "planner.cli", "rich"}
    below = [*sorted((root / "search").glob("*.py")), root / "suggest.py",
             *sorted((root / "cost").glob("*.py"))]
    for path in below:
        got = {m for m in _imports(path) if m in presentation or m.startswith("rich.")}
        assert not got, (path.name, got)


def test_a_saved_plan_is_priced_as_the_search_priced_it(saved):
    """plan show's times and memory (planner.cost.price.price_plan) are the search's own."""
    from planner.cost.price import price_plan
    plan = Plan.load(saved)
    again = price_plan(plan)
    assert again.estimate.step_time_s == pytest.approx(plan.estimate["step_time_s"], rel=1e-12)
    for s in plan.stages:
        for k, v in s.memory_gib.items():
            assert again.estimate.stage_memory_gib[s.pp_rank][k] == pytest.approx(v, abs=1e-3)
    # the per-rank times the stage table and the plot show add up to the ranks' stage times
    for t, want in zip(again.rank_times(), again.estimate.stage_time_s):
        assert t.fwd + t.bwd == pytest.approx(want, rel=1e-12) and 0 < t.fwd < t.total


def test_rejected_layouts_are_the_search_reports_and_explain_words_them(big):
    m, c, report = big
    assert 1 <= len(report.rejected_layouts) <= 3
    alts = alternatives(m, c, report, report.best, Fixed())
    oom = [(desc, why) for desc, _, why in alts if why.startswith("out of memory")]
    assert [d for d, _ in oom] == [describe_candidate(r.candidate)
                                   for r in report.rejected_layouts]
    base = report.best.estimate.step_time_s
    for r, (_, why) in zip(report.rejected_layouts, oom):
        assert f"by {r.overflow_gib:.1f} GiB" in why and r.overflow_gib > 0
        pct = (r.ideal_step_s / base - 1) * 100
        assert (f"would be {-pct:.1f}% faster" if pct < 0 else f"{pct:.1f}% slower") in why


def test_suggestions_are_constraint_changes_the_cli_words(capsys):
    from planner.suggest import suggestions
    m, c = get_model("llama70b"), get_cluster("h100x32")
    fixed = Fixed(recompute="none", tp=8, pp=4, mbs=4, zero=0)
    tips = suggestions(m, c, fixed, 8192, 64)
    full = [t for t in tips if t.change == "recompute"]
    assert full and full[0].delta == {"recompute": "full"}
    assert full[0].best.estimate.fits and full[0].num_gpus == 32
    # the search under the suggested constraints finds that plan
    again = search(m, c, full[0].fixed, 8192, 64, top=1, rejected=False).best
    assert again.estimate.step_time_s == pytest.approx(full[0].step_time_s, rel=1e-12)
    # on the GPUs alone (with the optimizer offloaded it fits: tests/test_offload.py)
    code, _, err = run(capsys, "--model", "llama70b", "--cluster", "h100x32", "--recompute",
                       "none", "--tp", "8", "--pp", "4", "--micro-batch", "4", "--seq-len",
                       "8192", "--global-batch", "64", "--zero", "0",
                       "--offload-optimizer", "none")
    assert code == 3
    assert f"--recompute full ({describe_candidate(full[0].best.candidate)})" in err


@pytest.mark.parametrize("name,cluster_name", [("llama70b", "h100x64"),
                                               ("gpt-oss-20b", "h100x16")])
def test_rejected_layouts_as_if_every_candidate_were_memory_tested(name, cluster_name):
    """The search screens and memory-tests only the candidates of the layouts it may show (a
    candidate whose time floor is past the plan's step founds none); the layouts, their ideal
    steps and least overflows are those of every enumerated candidate that cannot fit (each
    one's coefficients built and tested on every placement of its layers, the search's
    memory rule), ordered by a bound each (torchtitan: no TP-overlap twins to add)."""
    from planner.search import (SharedCoefficients, default_global_batch, default_seq_len,
                                enumerate_candidates, rejected_layouts)
    from planner.search.bounds import max_layers
    m, c = get_model(name), get_cluster(cluster_name)
    engine = get_engine("torchtitan")
    report = search(m, c, engine=engine)
    assert report.rejected_layouts and report.best is not None
    s = default_seq_len(m)
    cands = enumerate_candidates(m, c, Fixed(), s, default_global_batch(s, c.num_gpus), engine)
    cap, L = capacity_bytes(c, engine), m.num_layers
    out = []
    for x in cands:
        rules = rules_for(engine, x, Fixed())
        caps = max_layers(stage_coefficients(m, c, x, engine), cap, x.vpp, rules, x)
        if sum(min(n, L) for n in caps) < L or rules.short_of_layers(caps, x.vpp):
            out.append((x, "out of memory"))
    # the search found some of them out of memory, not all (393 and 31 left unscreened)
    assert {x for x, _ in report.rejected} < {x for x, _ in out}
    shared = SharedCoefficients(m, c, engine)
    every = rejected_layouts(m, c, engine, None, Fixed(), out, shared.quick_bound,
                             shared.quick_bound, report.best.estimate.step_time_s)
    def row(r):
        x = r.candidate
        return (x.tp, x.cp, x.pp, x.dp), round(r.ideal_step_s, 9), round(r.overflow_gib, 9)

    assert [row(r) for r in report.rejected_layouts] == [row(r) for r in every]
