"""Measures what torch.distributed.pipelining's stages of one pipeline rank keep after a
training step of a small Llama on CPU over a fake process group: the bytes of every tensor
reachable from the stages' receive infos (the receive buffers of the stage inputs and of the
output gradients, and any gradient left on an input buffer), each storage once. The fake
group's receives carry nothing, which changes no byte. Prints one JSON list, per case
{"kept_bytes", "boundary_bytes"} (one micro-batch's hidden state, the stage input). Run by
tests/test_pipeline_buffers.py in its own process (the fake process group is global).

argv[1]: a JSON list of [schedule, pp, rank, micro-batches] cases, the schedule one of the
planner's names (1f1b, interleaved, interleaved-zb, zbv, dualpipev), each rank holding one
stage (1f1b) or two (the others: rank r and r + pp looped, r and 2 pp - 1 - r V-shaped)."""
import dataclasses
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules as torch_schedules
from torch.testing._internal.distributed.fake_pg import FakeStore

from planner.catalog.models import MODELS
from runtime.model import Transformer

HIDDEN, FFN, HEADS, KV, VOCAB = 128, 384, 4, 2, 512
MBS, SEQ = 1, 64
CLASSES = {"1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B",
           "interleaved-zb": "ScheduleInterleavedZeroBubble", "zbv": "ScheduleZBVZeroBubble",
           "dualpipev": "ScheduleDualPipeV"}
V_SHAPED = ("zbv", "dualpipev")


def stage_indices(schedule: str, pp: int, rank: int) -> list:
    if schedule == "1f1b":
        return [rank]
    return [rank, 2 * pp - 1 - rank] if schedule in V_SHAPED else [rank, rank + pp]


def measure(schedule: str, pp: int, rank: int, nmb: int) -> dict:
    dist.init_process_group("fake", rank=rank, world_size=pp, store=FakeStore())
    spec = dataclasses.replace(MODELS["llama3-8b"], num_layers=1, hidden=HIDDEN, ffn_hidden=FFN,
                               num_heads=HEADS, num_kv_heads=KV, vocab_size=VOCAB,
                               tied_embeddings=False)
    indices = stage_indices(schedule, pp, rank)
    n_stages = pp * (1 if schedule == "1f1b" else 2)
    stages = []
    for i in indices:
        torch.manual_seed(i)
        model = Transformer(spec)      # one layer: no embedding, no head
        model.tok_embeddings = model.norm = model.output = None
        hidden = torch.empty(MBS, SEQ, HIDDEN, device="meta")
        stage = PipelineStage(model, i, n_stages, torch.device("cpu"),
                              input_args=(hidden.requires_grad_(),),
                              output_args=(torch.empty_like(hidden).requires_grad_(),),
                              output_grads=(torch.empty_like(hidden),))
        # the warm-up vote travels through receives, which carry nothing here: every stage
        # was given its shapes, so each would vote for static metadata
        stage._warmup_backward_result = (
            lambda received_result=None: torch.ones(1, dtype=torch.int32))
        stages.append(stage)
    cls = getattr(torch_schedules, CLASSES[schedule])
    # a loss makes the schedule run backward (only the last stage computes it)
    loss = lambda out, target: out.float().mean()                      # noqa: E731
    sched = cls(stages[0] if schedule == "1f1b" else stages, nmb, loss_fn=loss)
    kwargs = {"return_outputs": False}                # as our runtime and torchtitan step
    if any(s.is_last for s in stages):
        kwargs["target"] = torch.zeros(nmb * MBS, SEQ, HIDDEN)
    args = (torch.randn(nmb * MBS, SEQ, HIDDEN),) if any(s.is_first for s in stages) else ()
    sched.step(*args, **kwargs)
    kept = {}
    for stage in stages:
        for infos in [*stage.args_recv_info.values(), *stage.grad_recv_info.values()]:
            for info in infos:
                if getattr(info, "is_root_arg", False) or info.buffer is None:
                    continue
                for t in (info.buffer, info.buffer.grad):
                    if t is not None:
                        st = t.untyped_storage()
                        kept[st.data_ptr()] = st.nbytes()
    dist.destroy_process_group()
    return {"kept_bytes": sum(kept.values()), "boundary_bytes": MBS * SEQ * HIDDEN * 4}


if __name__ == "__main__":
    json.dump([measure(*case) for case in json.loads(sys.argv[1])], sys.stdout)
