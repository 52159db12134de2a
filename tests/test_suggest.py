"""planner.suggest's "would fit": the smallest GPU count in the cluster's node granularity,
checked against a brute force that searches every count; the memory bound it skips counts by
is sound (no count it skips fits)."""

import dataclasses
import itertools

import pytest

from planner.catalog import get_cluster, get_gpu, get_model
from planner.search import Fixed, search
from planner.specs import Cluster, Model
from planner import suggest as sg


# the GPUs alone: what would fit without offload (with it the search moves the optimizer
# states to the host where nothing fits on the GPUs: tests/test_offload.py)
GPUS_ALONE = dict(offload_optimizer="none", offload_params="none")


def tiny(layers=8, hidden=1024):
    return Model("tiny", num_layers=layers, hidden=hidden, ffn_hidden=4 * hidden, num_heads=8,
                 num_kv_heads=8, vocab_size=32000, max_seq_len=4096)


def cluster(gib, n, gpn):
    return Cluster(f"h100x{n}", dataclasses.replace(get_gpu("h100"), memory_gib=gib), n, gpn)


def brute_force_fewest(model, c, fixed, seq, gbs, limit):
    """Search every count of the node granularity above the cluster's, up to `limit`."""
    for n in range(c.num_gpus + 1, limit + 1):
        if n % c.gpus_per_node:
            continue
        big = sg._more_gpus(c, n)
        g = max(gbs, n // 8) if gbs % (n // min(n, 8)) else gbs
        try:
            r = search(model, big, fixed, seq, g, top=1, rejected=False)
        except Exception:                 # noqa: BLE001  (no configuration: does not fit)
            continue
        if sg._hopeless(model, big, None, None, fixed):   # the suggestion skips it unsearched
            assert r.best is None, n
        if r.best is not None:
            return n, r.best.estimate.step_time_s
    return None, None


@pytest.mark.parametrize("gib,n,gpn,seq,gbs", [
    (3.0, 1, 1, 2048, 16), (2.6, 2, 2, 2048, 16), (3.2, 3, 3, 1024, 24), (2.8, 4, 4, 2048, 32),
    (4.0, 2, 2, 4096, 8)])
def test_fewest_gpus_match_a_brute_force_over_counts(gib, n, gpn, seq, gbs):
    model, c = tiny(), cluster(gib, n, gpn)
    assert search(model, c, Fixed(**GPUS_ALONE), seq, gbs, top=1, rejected=False).best is None
    tips = sg.suggestions(model, c, Fixed(**GPUS_ALONE), seq, gbs)
    want_n, want_step = brute_force_fewest(model, c, Fixed(**GPUS_ALONE), seq, gbs, limit=64)
    assert want_n is not None
    assert [t.change for t in tips] == ["gpus"]
    assert tips[0].num_gpus == want_n and tips[0].minimal
    assert tips[0].step_time_s == pytest.approx(want_step, rel=1e-9)


@pytest.mark.parametrize("layers,hidden,gib,gbs", [(8, 1024, 2.5, 64), (12, 2048, 2.8, 64)])
def test_past_the_budget_the_doubled_hosts_that_fit_are_not_skipped(layers, hidden, gib, gbs):
    """More counts than MAX_COUNTS_SEARCHED lie between the memory bound and the fewest that
    fits, so the suggestion goes on at doublings. Doublings of the last count searched (30:
    60, 120, ...; 44: 88, 176) found no configuration of the power-of-two global batch on most
    and answered 960 GPUs with the batch raised to 120 where 32 fit, 176 where 128 did; the
    doublings of a host (64, 128, ...) are what it tries now. Against a brute force over every
    count: the answer is at least the fewest that fits, at most the fewest doubled host that
    does, at the user's global batch."""
    model, c = tiny(layers, hidden), cluster(gib, 2, 2)
    fixed = Fixed(**GPUS_ALONE)
    assert search(model, c, fixed, 1024, gbs, top=1, rejected=False).best is None
    first = next(n for n in sg.gpu_counts(c) if not sg._hopeless(model, sg._more_gpus(c, n),
                                                                  None, None, fixed))
    fewest, _ = brute_force_fewest(model, c, fixed, 1024, gbs, limit=256)
    assert (fewest - first) // c.gpus_per_node >= sg.MAX_COUNTS_SEARCHED   # past the budget
    doubled = next(n for n in (c.gpus_per_node * 2 ** k for k in range(1, 8))
                   if n >= fewest and search(model, sg._more_gpus(c, n), fixed, 1024, gbs,
                                             top=1, rejected=False).best is not None)
    tips = sg.suggestions(model, c, fixed, 1024, gbs)
    assert [t.change for t in tips] == ["gpus"]
    assert fewest <= tips[0].num_gpus <= doubled
    assert tips[0].global_batch == gbs and not tips[0].minimal


def test_the_memory_bound_never_skips_a_count_that_fits():
    model = tiny()
    for gib, n in itertools.product((2.4, 3.0, 4.0), range(1, 13)):
        c = cluster(gib, n, 1)
        if sg._hopeless(model, c, None, None, Fixed(**GPUS_ALONE)):
            assert search(model, c, Fixed(**GPUS_ALONE), 1024, 12, top=1, rejected=False).best is None


def test_counts_are_whole_hosts_and_nvl72_trays_then_racks():
    take = lambda name, k=6: list(itertools.islice(sg.gpu_counts(get_cluster(name)), k))  # noqa
    assert take("h100x16") == [24, 32, 40, 48, 56, 64]
    assert take("h100x7") == [14, 21, 28, 35, 42, 49]
    assert take("gb200x64", 4) == [68, 72, 144, 216]
    assert take("gb200x144", 2) == [216, 288]


def test_llama70b_on_16_and_7_h100s_would_fit_on_24_and_21():
    # 24 = 3 hosts of 8 (tp 8 pp 3; 20 GPUs at tp 4 pp 5 would leave half a host idle)
    model = get_model("llama70b")
    for name, want in (("h100x16", 24), ("h100x7", 21)):
        c = get_cluster(name)
        r = search(model, c, Fixed(**GPUS_ALONE), 8192, 512, top=1, rejected=False)
        assert r.best is None
        tips = sg.suggestions(model, c, Fixed(**GPUS_ALONE), 8192, 512)
        assert tips[0].change == "gpus" and tips[0].num_gpus == want and tips[0].minimal
        # and the count below it, in whole hosts, fits nowhere
        below = sg._more_gpus(c, want - c.gpus_per_node) if want - c.gpus_per_node > c.num_gpus \
            else c
        assert search(model, below, Fixed(**GPUS_ALONE), 8192, 512, top=1, rejected=False).best is None


def test_a_change_on_the_given_gpus_comes_before_more_gpus():
    model, c = get_model("llama70b"), get_cluster("h100x32")
    tips = sg.suggestions(model, c, Fixed(recompute="none", tp=8, pp=4, mbs=4, zero=0, **GPUS_ALONE), 8192, 64)
    assert tips and all(t.num_gpus == 32 for t in tips)
    assert [t.change for t in tips][0] == "recompute"
