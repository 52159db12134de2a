"""Measures, with torch's MemTracker on CPU over a fake process group, the peak of one
torch.distributed.pipelining stage of a small Llama through its first 1F1B step (when the
stage allocates its communication buffers): every tensor the step allocates, the schedule's
own included. The fake group's receives carry nothing, which changes no byte. Prints one JSON
object per case: {"peak_bytes", "after_step_bytes" (what the step leaves allocated: the
gradients and the stage's buffers), "fed_bytes" (the batch or targets given to step()),
"boundary_bytes" (the stage input, one micro-batch's hidden state)}.
Run by tests/test_pipeline_buffers.py in its own process (the fake process group is global).
"""
import dataclasses
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from torch.testing._internal.distributed.fake_pg import FakeStore

from planner.catalog.models import MODELS
from runtime.model import Transformer

HIDDEN, FFN, HEADS, KV, VOCAB = 256, 896, 8, 2, 1024


def measure(pp: int, index: int, nmb: int, mbs: int, seq: int, layers: int,
            return_outputs: bool = True) -> dict:
    dist.init_process_group("fake", rank=index, world_size=pp, store=FakeStore())
    spec = dataclasses.replace(MODELS["llama3-8b"], num_layers=layers, hidden=HIDDEN,
                               ffn_hidden=FFN, num_heads=HEADS, num_kv_heads=KV,
                               vocab_size=VOCAB, tied_embeddings=False)
    torch.manual_seed(0)
    model = Transformer(spec)          # this stage's layers only: no embedding, no head
    model.tok_embeddings = model.norm = model.output = None
    hidden = torch.empty(mbs, seq, HIDDEN, device="meta")
    stage = PipelineStage(model, index, pp, torch.device("cpu"),
                          input_args=(hidden.requires_grad_(),),
                          output_args=(torch.empty_like(hidden).requires_grad_(),),
                          output_grads=(torch.empty_like(hidden),))
    # the warm-up vote travels through receives, which carry nothing here: every stage was
    # given its shapes, so each would vote for static metadata
    stage._warmup_backward_result = lambda received_result=None: torch.ones(1, dtype=torch.int32)
    # a loss makes the schedule run backward (only the last stage computes it)
    schedule = Schedule1F1B(stage, nmb, loss_fn=lambda out, target: out.float().mean())
    tracker = MemTracker()
    # the step's peak, not each module's: a stage's modules run once per micro-batch
    tracker._pre_fw_hook = tracker._post_fw_hook = lambda *a, **k: None
    tracker._pre_bw_hook = tracker._post_bw_hook = lambda *a, **k: None
    tracker.track_external(model)
    x = torch.randn(nmb * mbs, seq, HIDDEN)
    target = torch.zeros(nmb * mbs, seq, HIDDEN)
    with tracker:
        if index == 0:
            schedule.step(x, return_outputs=return_outputs)
        elif index == pp - 1:
            schedule.step(target=target, return_outputs=return_outputs)
        else:
            schedule.step(return_outputs=return_outputs)
        after = tracker.get_tracker_snapshot()[torch.device("cpu")]
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    dist.destroy_process_group()
    def total(snapshot):
        return next(v for k, v in snapshot.items() if str(k) == "Total")
    # the batch fed to the first stage or the targets to the last: the schedule's micro-batches
    # are views of it, which the tracker counts at the whole tensor's size
    fed = x if index == 0 else target if index == pp - 1 else None
    return {"peak_bytes": total(peak), "after_step_bytes": total(after),
            "fed_bytes": 0 if fed is None else fed.numel() * fed.element_size(),
            "boundary_bytes": mbs * seq * HIDDEN * 4}


if __name__ == "__main__":
    # argv[1]: a JSON list of [pp, stage index, micro-batches, micro-batch size, tokens, layers
    # per stage, return_outputs] cases, measured one after another
    json.dump([measure(*case) for case in json.loads(sys.argv[1])], sys.stdout)
