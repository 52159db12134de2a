"""`plan`'s "nothing fits" where the closest plan overflows by less than the margin it keeps free:
the message names the margin that accepts it, and that margin does (exit 0, "fits"); beyond the
margin, it names none. The GPU's memory is set so that the fixed configuration lands inside or
outside its default margin (planner.cost.stage DEFAULT_MARGIN_FRACTION)."""
import json
import re

import pytest

from planner.catalog import get_cluster, get_model
from planner.cli import main
from planner.engines import get_engine
from planner.search import Fixed, search
from planner.cost.stage import DEFAULT_MARGIN_FRACTION

ENGINE = "fsdp"
KNOBS = dict(tp=1, pp=1, dp=8, zero=3, mbs=2, recompute="none")
ARGS = ["--model", "llama8b", "--engine", ENGINE, "--tp", "1", "--pp", "1", "--dp", "8",
        "--zero", "3", "--micro-batch", "2", "--recompute", "none", "--seq-len", "4096",
        "--global-batch", "16"]


@pytest.fixture(scope="module")
def needed_gib():
    """What the fixed configuration takes: its needed peak plus the engine's context."""
    r = search(get_model("llama8b"), get_cluster("h100x8"), Fixed(**KNOBS), 4096, 16, top=1,
               engine=ENGINE, margin_gib=0.0, rejected=False)
    assert r.best is not None
    return r.best.estimate.peak_needed_gib + get_engine(ENGINE).context_gib


def cluster_file(tmp_path, memory_gib):
    p = tmp_path / "h100-custom.json"
    p.write_text(json.dumps({"base": "h100", "num_gpus": 8, "gpus_per_node": 8,
                             "memory_gib": round(memory_gib, 3)}))
    return str(p)


def test_an_overflow_inside_the_margin_names_the_margin_that_accepts_it(tmp_path, capsys,
                                                                      needed_gib):
    # half the default margin short: fits with no margin, not with the default one
    memory = needed_gib / (1 - DEFAULT_MARGIN_FRACTION / 2)
    path = cluster_file(tmp_path, memory)
    assert main([*ARGS, "--cluster", path]) == 3
    err = capsys.readouterr().err
    m = re.search(r"--memory-margin (\d+\.\d) accepts it", err)
    assert m, err
    assert float(m.group(1)) < DEFAULT_MARGIN_FRACTION * memory
    assert main([*ARGS, "--cluster", path, "--memory-margin", m.group(1)]) == 0
    out = capsys.readouterr().out
    assert "DOES NOT FIT" not in out and "peak needed" in out


def test_an_overflow_beyond_the_margin_names_none(tmp_path, capsys, needed_gib):
    path = cluster_file(tmp_path, needed_gib * 0.9)
    assert main([*ARGS, "--cluster", path]) == 3
    err = capsys.readouterr().err
    assert "overflows stage 0" in err and "accepts it" not in err


@pytest.mark.parametrize("over", [0.0, 1000.0, 1e308])
def test_a_margin_that_leaves_no_memory_is_bad_input(tmp_path, capsys, over):
    """A margin of the GPU's memory less the engine's context, or more, leaves the plan nothing:
    one line naming the most it may be and exit 2 (at 1e308 the search overflowed converting
    an infinite recompute count, a traceback; at 1000 GiB it reported a capacity of -922 GiB);
    just below that the search runs and answers whether anything fits (exit 3 here)."""
    gpu_gib, context = 80.0, get_engine(ENGINE).context_gib
    path = cluster_file(tmp_path, gpu_gib)
    most = gpu_gib - context
    assert main([*ARGS, "--cluster", path, "--memory-margin", repr(most + over)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "leaves no memory" in err, err
    assert f"below {most:.1f}" in err
    assert main([*ARGS, "--cluster", path, "--memory-margin", repr(most - 0.5)]) == 3
    assert "nothing fits" in capsys.readouterr().err
