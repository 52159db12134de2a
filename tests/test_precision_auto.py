"""`plan --precision auto`: the fastest format the engine and GPU run, chosen and said so; each
format's figure the same as planning with it fixed."""
import json

import pytest

from tests.cli_helpers import one_line, run

BASE = ("--model", "llama70b", "--cluster", "h100x64", "--engine", "megatron")


def _json(capsys, *args):
    code, out, err = run(capsys, *args, "--json", limit_s=60)
    assert code == 0, err
    return json.loads(out)


def test_megatron_h100_chooses_fp8_and_says_so(capsys):
    auto = _json(capsys, *BASE, "--precision", "auto")
    assert auto["precision"] == "fp8"
    choice = auto["search"]["precision_choice"]
    assert choice["chosen"] == "fp8" and choice["recipe"] == auto["recipe"]
    by = {(a["precision"], a["recipe"]): a for a in choice["alternatives"]}
    assert ("bf16", None) in by and ("nvfp4", "nvfp4") not in by   # no FP4 on Hopper
    # every format's figure is that of planning with it fixed
    for (prec, recipe), alt in by.items():
        fixed = _json(capsys, *BASE, "--precision", prec, *(("--recipe", recipe) if recipe else ()))
        # (the record rounds to the microsecond)
        assert fixed["estimate"]["step_time_s"] == pytest.approx(alt["step_time_s"], abs=1e-6)
    assert auto["estimate"]["step_time_s"] == pytest.approx(
        min(a["step_time_s"] for a in by.values()), abs=1e-6)
    code, out, err = run(capsys, *BASE, "--precision", "auto", limit_s=60)
    assert code == 0, err
    assert "chosen by --precision auto" in out


def test_default_stays_bf16(capsys):
    plan = _json(capsys, *BASE)
    assert plan["precision"] == "bf16" and "precision_choice" not in plan["search"]


def test_bf16_only_engine_chooses_bf16(capsys):
    plan = _json(capsys, "--model", "llama8b", "--cluster", "h100x8", "--engine", "runtime",
                 "--precision", "auto")
    assert plan["precision"] == "bf16"
    assert [a["precision"] for a in plan["search"]["precision_choice"]["alternatives"]] == ["bf16"]


def test_recipe_with_auto_refused(capsys):
    code, _, err = run(capsys, *BASE, "--precision", "auto", "--recipe", "tensorwise")
    one_line(code, err, 2, "--precision auto")
