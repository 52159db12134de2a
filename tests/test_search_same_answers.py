"""The search gives the same answers as the code it replaced: on a fixed set of small but real
instances (dense and MoE, several engines, searched and fixed knobs) the ranked plans --
every knob of each candidate, its layers and recompute per pipeline rank -- and their step
times equal those recorded in tests/data/search_answers_main.json.

That file is not a hand-written expectation: it is the output of the search at main 7dc38b0,
before the search was made faster (issue 21), written by

    python tests/test_search_same_answers.py --write

so this test proves that speed-ups and refactors of the search change none of its answers.
It is rewritten only where the cost model changes on purpose, after checking that the search
under the old figures still gives the recorded answers: the MoE host-stall refit of issue 22
(MOE_LAYER_OVERHEAD_S 4.33 -> 4.78 ms, MOE_EXPERT_OVERHEAD_S 0.213 -> 0.200 ms) was checked so
(all 11 instances equal with the old two figures on the merged search), then rewritten.
Rewritten again for one memory-model change of issue 22 (planner/cost/stage.py: on the last
stage, with no layer recomputed, the loss's peak and a layer's working set are counted as the
larger of the two, not both): with that change reverted all 11 instances equal the previous
record; with it only deepseek-v3_h100x2048_tp8pp1 moves, at ranks 3-4 (a no-recompute
candidate at 2.959 s now fits and enters at rank 3); ranks 0-2 are unchanged.
Rewritten for the canonical placement of issue 21 item 6 (planner/search/placement.py:
solve_cpsat's optimal solves now return the first solution of the cutoff-free model at the
optimal objective, so that the placement no longer depends on the cutoff the search passes):
only deepseek-v3_h100x256_fixed moves, at ranks 0, 2 and 4, each from a placement with one
layer shifted between non-bottleneck ranks ([5, 4, 4, 4, 4, 3, ...], [..., 4, 3, 4, 4, 1] and
[..., 4, 4, 3, 4, 1]) to the even split [4] * 15 + [1] (recompute likewise); knobs, order,
fits and every step time are unchanged (the same floats, relative difference 0), and the old
placements re-priced by planner.cost.price give exactly the recorded step times (checked
with a script comparing each rank's knobs and re-pricing every changed placement); all other
ranks of all 11 instances are identical. Only these three placement lists were edited, the
rest of the file is as written before.
Rewritten for the pipelined TP overlap of issue 22 (planner/cost/stage.py: the overlap runs t
chunks, one chunk's GEMM hiding nothing, so what sticks out is measured against (t - 1) / t of
the GEMMs): with that term reverted all 11 instances equal the previous record; with it only
gpt-oss_h100x32_pp1 moves (its tp 4 plans, whose TP collectives now stick out by a GEMM chunk,
fall below tp 2 ones: rank 0 is tp 2 dp 16 at 28.33 s against tp 4 dp 8 at 28.15 s before).
Only that instance's entry was replaced, by the search's output without the later knobs.
Step times rewritten for the element-wise kernels of issue 22 (planner.cost.compute
ElementwiseKernels: the runtime engine's RMSNorm, RoPE and SwiGLU priced as the eager kernels
runtime/model.py runs): only the two tiny-moe instances (runtime engine, a Llama-style layer)
move, each rank's knobs, layers, recompute and verdict unchanged and its step time 3.3% longer;
only their `step_time_s` values were replaced. Then for two fixes the review of that change
found (the experts' and shared experts' activation priced with the engine's kernels; MLA's
RoPE element-wise bytes over its rotated width, qk_rope_head_dim per head and the shared
key, not the whole q and k width): the tiny-moe step times move 0.15%, deepseek-v3_h100x256
_fixed's -0.9% (its closest too), deepseek-v3_h100x2048_tp8pp1's -0.2..-0.6% with ranks 0-3
unchanged in knobs and rank 4 now a selective-recompute (moe_act, layernorm, mla_up_proj)
ZeRO-2 ep 256 plan at 2.957 s in place of a full-recompute ZeRO-3 ep 128 one at 2.966 s;
those step times and that entry (without the later knobs) were replaced, nothing else.
Step times rewritten for a collective's latency counted as NCCL's model counts it (planner/
cost/comm.py: a ring's hops inside a node at the NVLink latency) and the two figures refitted
after it (EAGER_LAYER_OVERHEAD_S 3.51 -> 3.58 ms, MOE_LAYER_OVERHEAD_S 4.78 -> 4.80 ms): the
record held at the commit before (its suite passed); mixtral_h100x64_s4096's step times move
-1.3..-1.7% and its ranks 3-4 are now ep 1 with selective recompute (moe_act, layernorm) of all
32 layers in place of ep 8 with 3 layers fully recomputed; every other instance keeps its
knobs, layers and order, its step times +0.04..+0.15% (the MoE stall) or +0.7% (tiny-moe, the
runtime engine's host overhead). Only those values were replaced, without the later knobs.
Rewritten for the MoE layer's GPU work priced as Megatron-Core runs it (issue 22, planner/cost/
moe.py: the flex dispatcher's one copy per GPU, the permutations per dispatcher, the experts'
own casts, gpt-oss's expert bias, scaled RoPE and clamp; the stall refitted to 4.61 ms /
0.1803 ms): the record held at the commit before (its suite passed); the six instances that
move were replaced whole by the search's output, without the later knobs: mixtral_h100x64_s4096
ranks 3-4 -0.15% (ranks 0-2 -0.06%, inside the tolerance), deepseek-v3_h100x256_fixed -1.8..-2.2%, qwen3_h100x64_tp4 -3.6..-6.5%,
qwen3_h100x256_tp4pp8 -2.8%, each with its knobs, layers and order unchanged;
deepseek-v3_h100x2048_tp8pp1 -0.4..-1.0% with ranks 3 and 4 swapped (the selective-recompute
ZeRO-2 ep 256 plan now ahead of the ZeRO-3 ep 128 one); gpt-oss_h100x32_pp1 +7.9..+8.0% (its
element-wise terms), its near-equal plans reordered among tp 2 / 4, cp 1 / 2 / 4 and mbs 2-8.
Step times rewritten for the MoE stall refitted after Blackwell's attention was priced as measured
(issue 22: MOE_LAYER_OVERHEAD_S 4.61 -> 4.52 ms, MOE_EXPERT_OVERHEAD_S 0.1803 -> 0.2039 ms,
then 0.2031 ms once the attention fit took the planner's FLOP count, which moves these step times
0.05% at most, inside the tolerance, so they were left; every instance here is on H100, whose
attention did not change): with the two old figures all 11
instances equal the previous record; with the new ones six move, each keeping its knobs, layers,
recompute, verdicts and order: mixtral_h100x64_s4096 -0.19%, deepseek-v3_h100x256_fixed
-0.53..-0.62% (its closest -0.57%), deepseek-v3_h100x2048_tp8pp1 -0.18..-0.37%,
qwen3_h100x64_tp4 -0.31..-0.34%, qwen3_h100x256_tp4pp8 -0.69..-0.70%, gpt-oss_h100x32_pp1
-0.62..-0.64%. Only those step times were replaced, and qwen3_h100x64_tp4's `closest`, which the
search now fills (a tp 4 pp 8 dp 2 ep 8 mbs 8 full-recompute candidate that does not fit, priced
on the way; it is None with the old figures), written without the later knobs.
Rewritten for the EP overlap's memory without pipelining (issue 22, planner.cost.schedule
in_flight: Megatron-Core's combined 1F1B pairs a micro-batch's forward layers with the previous
one's backward layers first-with-last, combined_1f1b.py and model_chunk_schedule_plan.py, so one
micro-batch's activations are held, not two): with that change reverted all 11 instances equal the
previous record; with it three pp-1 instances move, each now led by plans with the overlap that
fit where they did not: mixtral_h100x64_s4096 (rank 0 tp 1 dp 64 ZeRO-2 ep 8 with the overlap at
2.771 s, was tp 2 ZeRO-3 ep 1 at 2.981 s), deepseek-v3_h100x2048_tp8pp1 (rank 0 ZeRO-1 ep 256
mbs 1 without recompute at 2.732 s, was ZeRO-2 ep 64 mbs 2 at 2.778 s, now rank 2) and
gpt-oss_h100x32_pp1 (rank 0 tp 8 dp 4 selective recompute with the overlap at 24.31 s, was tp 4
full recompute at 30.43 s, now rank 1). Those three entries were replaced whole by the search's
output, without the later knobs.
Rewritten for the MoE stall refitted after Blackwell's GEMMs were priced as measured (issue 22:
planner.catalog.gpus BLACKWELL_GEMM; MOE_LAYER_OVERHEAD_S 4.52 -> 4.39 ms, MOE_EXPERT_OVERHEAD_S
0.2031 -> 0.1076 ms; every instance here is on H100, whose GEMMs did not change): with the two old
figures all 11 instances equal the previous record; with the new ones six move, replaced whole by
the search's output without the later knobs: mixtral_h100x64_s4096 -0.30%,
deepseek-v3_h100x256_fixed -0.77..-0.89%, deepseek-v3_h100x2048_tp8pp1 -0.27..-0.56%,
qwen3_h100x256_tp4pp8 -1.0%, each keeping its knobs, layers, recompute, verdicts and order;
qwen3_h100x64_tp4 -0.45..-0.49% with its ranks unchanged and `closest` now None (the
non-fitting tp 4 pp 8 candidate is no longer priced on the way); gpt-oss_h100x32_pp1 rank 0
unchanged (-1.2%), its near-equal full-recompute ranks 1-4 (30.43 s, tied within 0.001 s before)
reordered to tp 2 first at 30.150 s, tp 4 at 30.157 s.
Rewritten for activation offload (issue 22: recompute "offload", Megatron-Core's
--cpu-offloading-num-layers at pp 1, priced on Transformer Engine's offload schedule,
planner.cost.offload) and the FP8 weight copies of MoE layers: with the offload removed from the
Megatron engine's granularities all 11 instances equal the previous record (the FP8 copies move
none: every instance is bf16); with it five pp-1 instances move, their offload plans entering
or leading, replaced whole by the search's output without the later knobs: llama3-8b_h100x8
(rank 0 tp 1 cp 2 offloading 9 of 32 layers at 49.20 s, was tp 2 recomputing none at 49.97 s),
llama70b_h100x32 (rank 0 unchanged; ranks 1-3 tp 4 pp 1 ZeRO-3 offloading 55 of 80 layers at
106.71-106.96 s ahead of tp 8 pp 2 at 107.33 s; a `closest` now), mixtral_h100x64_s4096 (rank 4
an offload plan at 2.766 s), deepseek-v3_h100x2048_tp8pp1 (ranks 1 and 4 ZeRO-2 ep 64 / ZeRO-1
ep 128 offload plans) and gpt-oss_h100x32_pp1 (every rank an offload plan, 20.81 s against
24.01 s with selective recompute and the EP overlap).
Rewritten for the review of the activation offload (an MoE layer's expert-side activations kept
on the GPU under it, as Transformer Engine's first offload handler leaves them; an offload of no
layer priced and ranked as the plan without recompute; the pinned host memory rounded per tensor
width): llama3-8b_h100x8 and llama70b_h100x32 keep their knobs, layers and times; the three MoE
pp-1 instances' offload plans grow dearer: mixtral_h100x64_s4096 rank 4 is tp 2 selective
recompute at 2.775 s again, deepseek-v3_h100x2048_tp8pp1 offloads 36 (rank 1) and 19 (rank 4,
ZeRO-2) layers at unchanged times, gpt-oss_h100x32_pp1 is led by tp 8 selective recompute with
the EP overlap at 24.01 s again, its offload plans at 26.3-27.8 s behind; replaced whole by the
search's output without the later knobs.
Rewritten for MLA's down projections held whole on every tensor-parallel rank (planner.specs
Model.tp_replicated_attn_params; Megatron-Core builds them duplicated): only the two DeepSeek-V3
instances move, replaced whole by the search's output without the later knobs:
deepseek-v3_h100x256_fixed (tp 2) +0.002..+0.05%, its ZeRO-0 and full-recompute ranks now
placing [5, 3, 4, ...] where [4, 4, 4, ...] was; deepseek-v3_h100x2048_tp8pp1 (tp 8, every rank
holding 13.2M parameters a layer more) +2.8..+3.2%, rank 0 unchanged, its offload plans ahead of
the ZeRO-1 selective one.
Rewritten for Transformer Engine's TP-overlap userbuffers (issue 22: planner.cost.memory
userbuffer_bytes, 12 buffers of the gathered input shape outside PyTorch's allocator, on every
Megatron plan with --tp-comm-overlap) and the plans without the overlap that the search now
offers beside each (planner.search.enumeration _with_tp_overlap_off): at the commit before, all
11 instances equal the previous record (its suite passed); with both, six move, each replaced
whole by the search's output without the later knobs: llama3-8b_h100x8 and
deepseek-v3_h100x2048_tp8pp1 keep their knobs and times, their tp > 1 offload plans offloading
a layer or five more; llama70b_h100x32 rank 0 unchanged, its ZeRO-3 offload plans behind tp 8
pp 2 ones now (107.56-107.74 s); deepseek-v3_h100x256_fixed ranks 0-1 unchanged, ranks 2-4 now
rank 0's p2p plan without the overlap (17.81 s, ahead of the a2a ones at 18.16 s);
qwen3_h100x64_tp4 and gpt-oss_h100x32_pp1 led by plans without the overlap, whose buffers no
longer fit beside them (+5.0% and +2.5..+3.8%).
Then the plans without the overlap tried only where a candidate with it has no plan or one
recomputing or offloading layers, at its bound (planner.search.enumeration
without_tp_overlap; enumerating every candidate twice made the search ~15% slower): a first
version, trying them only where no plan fit, moved deepseek-v3_h100x256_fixed's ranks 2-4
(and lost llama3-8b on h100x2's plan without the overlap, 300.6 s, to one with it at 483.0 s,
offloading a layer more); this one gives every instance's recorded answer, and the six
entries rewritten after the userbuffers are replaced by the search's output again: their
ranked plans and `closest` as recorded then, their candidate counts those enumerated (the
twins no longer are: llama70b_h100x32 4950 -> 3610).
Step times rewritten for the MoE stall refitted once the fit rows' heads were priced with the
cross entropy their recipes ran (issue 22: Transformer Engine's fused one on Megatron-Bridge's
rows, benchmarks/fidelity.py te_fused_cross_entropy; MOE_LAYER_OVERHEAD_S 4.39 -> 4.74 ms,
MOE_EXPERT_OVERHEAD_S 0.0864 -> 0.171 ms; the planner's own plans keep the unfused cross entropy
Megatron runs by default): the record held at the commit before (its suite passed), and nothing
else the searches price moved; six instances move, replaced whole by the search's output
without the later knobs: mixtral_h100x64_s4096 +0.8%, deepseek-v3_h100x256_fixed +2.1%,
qwen3_h100x256_tp4pp8 +2.7%, gpt-oss_h100x32_pp1 +2.8..+3.2%, each keeping its knobs, layers,
recompute, verdicts and order; deepseek-v3_h100x2048_tp8pp1 +0.7..+1.3% with ranks 0 / 1 and
3 / 4 swapped (ZeRO-2 ep 128 mbs 2 ahead of ZeRO-1 ep 256 mbs 1 with the EP overlap, whose
more numerous local-expert issue the larger per-expert figure prices dearer) and `closest` now
None; qwen3_h100x64_tp4 rank 0 unchanged (+1.1%), ranks 1-4 other pp 16 and pp 8 plans, most
now 1F1B without the TP overlap (43.8-44.3 s where 42.6-43.7 s were), `closest` now None.
Rewritten for the fit decided on what a plan needs, not on what the allocator reserves (issue
22, planner/cost/stage.py MemoryBudget: the caching allocator's 5% reserve on the activations
and working buffers only, the model state as allocated; torch.cuda.max_memory_reserved counts
cached blocks the allocator frees before it fails): the record held at the commit before (its
suite passed); with it six instances move, replaced whole by the search's output without the
later knobs, every step time the same plan's or a plan that no longer fitted: llama3-8b_h100x8
keeps its knobs and times, offloading 4 layers where 9 were (2 where 4); llama70b_h100x32 rank 0
unchanged, its ZeRO-3 offload plans (56 layers where 58) ahead of tp 8 pp 2 at 106.71 s, `closest`
now without the TP overlap; deepseek-v3_h100x256_fixed ranks 0, 2 and 4 unchanged, its ZeRO-0
ranks on the even split (-0.04%), `closest` now mbs 2; deepseek-v3_h100x2048_tp8pp1 keeps its
knobs and times, offloading two layers fewer; qwen3_h100x64_tp4 led by interleaved plans (vp 3
or 4, 38.54-40.75 s where 40.67-44.26 s were), `closest` now priced; gpt-oss_h100x32_pp1 led by
tp 2 selective-recompute plans with both overlaps at 22.89 s (was tp 8 at 25.73 s), then tp 4
without recompute at 22.94 s.
Rewritten for a candidate and its twin without the TP overlap ranked as one, at the faster of
their plans (planner.search TopTimes keyed by the pair): the record held at the commit before
(its suite passed); two instances move, their `ranked` lists replaced by the search's output
without the later knobs, every remaining plan and time as recorded, the slower of a pair
dropped and the next plans moving up: deepseek-v3_h100x256_fixed loses ranks 2-3 (the twins
without the overlap of ranks 0-1, 18.19 and 18.21 s against 17.84 and 17.86 s), its rank 4
(18.53 s) now 2, then 18.56 s and 19.91 s; qwen3_h100x64_tp4 loses rank 1 (vp 4 with the
overlap at 38.75 s, the candidate whose twin without it is rank 0 at 38.54 s), ranks 2-4 move
up, then vp 3 tp 4 pp 8 at 40.91 s.
Where the old search's correctness is in question, the brute-force checks
(tests/test_search.py, tests/test_moe_planner.py, benchmarks/search_speed.py's exhaustive
check) are the independent reference; this one only pins behaviour.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from planner.catalog import get_cluster, get_model  # noqa: E402
from planner.search import Fixed, search  # noqa: E402

FIXTURE = pathlib.Path(__file__).parent / "data" / "search_answers_main.json"
STEP_REL_TOL = 1e-3     # "step within 0.1%" (issue 21): the estimate's own rounding is ~1e-6

# (name, model, cluster, fixed knobs, seq_len, global batch, engine)
CASES = [
    ("llama3-8b_h100x8", "llama3-8b", "h100x8", {}, None, None, "megatron"),
    ("llama70b_h100x32", "llama70b", "h100x32", {}, None, None, "megatron"),
    ("llama70b_h100x16_deepspeed", "llama70b", "h100x16", {}, None, None, "deepspeed"),
    ("mixtral_h100x64_s4096", "mixtral-8x7b", "h100x64", {}, 4096, 256, "megatron"),
    ("tiny-moe_cpux4", "examples/tiny-moe.json", "cpux4", {}, 32, 16, "runtime"),
    ("tiny-moe_cpux4_pp2", "examples/tiny-moe.json", "cpux4", {"pp": 2}, 32, 16, "runtime"),
    ("deepseek-v3_h100x256_fixed", "deepseek-v3", "h100x256",
     {"tp": 2, "pp": 16, "ep": 16, "cp": 4}, None, None, "megatron"),
    ("deepseek-v3_h100x2048_tp8pp1", "deepseek-v3", "h100x2048", {"tp": 8, "pp": 1},
     None, None, "megatron"),
    ("qwen3_h100x64_tp4", "qwen3-235b-a22b", "h100x64", {"tp": 4}, 4096, None, "megatron"),
    ("qwen3_h100x256_tp4pp8", "qwen3-235b-a22b", "h100x256", {"tp": 4, "pp": 8}, None, None,
     "megatron"),
    ("gpt-oss_h100x32_pp1", "gpt-oss-120b", "h100x32", {"pp": 1}, 4096, None, "megatron"),
]


def _plan(r) -> dict:
    return {"candidate": dataclasses.asdict(r.candidate), "layers": list(r.layers),
            "recompute": list(r.recompute), "step_time_s": r.estimate.step_time_s,
            "fits": r.estimate.fits}


# the knobs added after the recording (issue 23: offload, hybrid sharding, ZeRO++), held at
# what the recorded search ran -- everything on the GPUs, ZeRO over all of dp x cp, no
# ZeRO++ -- so the searched space is the recorded one; their candidate fields must stay at
# these defaults
LATER_KNOBS = dict(offload_optimizer="none", offload_params="none", dp_shard=0, zeropp=False)


def answers(case) -> dict:
    _, model, cluster, fixed, seq, gbs, engine = case
    rep = search(get_model(model), get_cluster(cluster), Fixed(**fixed, **LATER_KNOBS), seq,
                 gbs, engine=engine, rejected=False)
    return {"candidates": rep.candidates, "ranked": [_plan(r) for r in rep.ranked],
            "closest": _plan(rep.closest) if rep.closest is not None else None}


def _json_safe(x):
    return json.loads(json.dumps(x))   # tuples as lists, as the fixture holds them


def _same_plan(got: dict, want: dict, where: str) -> None:
    later = {k: got["candidate"].pop(k) for k in LATER_KNOBS if k not in want["candidate"]}
    assert later == {k: LATER_KNOBS[k] for k in later}, where
    assert got["candidate"] == want["candidate"], where
    assert got["layers"] == want["layers"], where
    assert got["recompute"] == want["recompute"], where
    assert got["fits"] == want["fits"], where
    assert got["step_time_s"] == pytest.approx(want["step_time_s"], rel=STEP_REL_TOL), where


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_same_ranked_plans(case):
    want = json.loads(FIXTURE.read_text())[case[0]]
    got = _json_safe(answers(case))
    assert len(got["ranked"]) == len(want["ranked"])
    for i, (g, w) in enumerate(zip(got["ranked"], want["ranked"])):
        _same_plan(g, w, f"{case[0]} rank {i}")
    assert (got["closest"] is None) == (want["closest"] is None)
    if want["closest"] is not None:
        _same_plan(got["closest"], want["closest"], f"{case[0]} closest")


if __name__ == "__main__" and "--write" in sys.argv:
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text(json.dumps({c[0]: answers(c) for c in CASES}, indent=1) + "\n")
    print(f"wrote {FIXTURE}")
