"""Measures, with torch's FSDPMemTracker on CPU over a fake 8-rank process group, what FSDP2
holds unsharded while a layer's backward runs (the layers' activations held), for a small
Llama grouped as torchtitan groups it: "root" (before 83e694105: every block its own group,
the last not resharded after forward, the embedding, norm and output in the root group) and
"split" (since then: the embedding its own group, [norm, output] one group kept from its
forward to its backward). Prints one JSON object: per (wrap, vocabulary), the largest
unsharded bytes over a layer's or the head's backward (the layers' activations held), over
every module's backward (the root's and the embedding's at its end too), and the parameter
counts. Run by
tests/test_fsdp_wrap_memory.py in its own process (the fake process group is global)."""
import dataclasses
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp._fully_shard import _fsdp_collectives as collectives
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore

from planner.catalog.models import MODELS
from runtime.model import Transformer

WORLD = 8
# the categories of FSDPMemTracker that are FSDP2's own unsharded state: gathered weights, the
# all-gather output of the prefetched group, unsharded gradients, reduce-scatter inputs
UNSHARDED = ("Unsharded Param", "All Gather", "Unsharded Grad", "Reduce Scatter")
# every module's backward, up to the reduce-scatters of the root's post-backward at its end
MOMENTS = ("Peak Backward", "Before Post-Backward", "After Post-Backward")


# the shape measured by default: (layers, hidden, ffn_hidden, heads, kv heads, tokens)
SHAPE = (4, 256, 896, 8, 2, 512)


def build(wrap: str, vocab: int, mesh, shape=SHAPE):
    layers, hidden, ffn, heads, kv, _ = shape
    spec = dataclasses.replace(MODELS["llama3-8b"], num_layers=layers, hidden=hidden,
                               ffn_hidden=ffn, num_heads=heads, num_kv_heads=kv,
                               vocab_size=vocab, tied_embeddings=False)
    torch.manual_seed(0)
    model = Transformer(spec)
    cfg = dict(mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                         reduce_dtype=torch.float32))
    last = len(model.layers) - 1
    if wrap == "split":
        fully_shard(model.tok_embeddings, **cfg, reshard_after_forward=True)
    for i, block in model.layers.items():
        fully_shard(block, **cfg, reshard_after_forward=wrap == "split" or int(i) < last)
    if wrap == "split":
        fully_shard([model.norm, model.output], **cfg, reshard_after_forward=False)
    fully_shard(model, **cfg)
    return spec, model


def measure(wrap: str, vocab: int, mesh, shape=SHAPE) -> dict:
    spec, model = build(wrap, vocab, mesh, shape)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    x = torch.randint(0, vocab, (1, shape[-1]))
    y = torch.randint(0, vocab, (1, shape[-1]))
    held = []     # the output weight's unsharded gradient at each block's backward

    def head_grad(module, grad_output):
        g = model.output.weight.grad
        held.append(0 if g is None or isinstance(g, DTensor) else g.numel() * g.element_size())

    for block in model.layers.values():
        block.register_full_backward_pre_hook(head_grad)

    def step():
        out = model(x)
        loss = torch.nn.functional.cross_entropy(out.flatten(0, 1).float(), y.flatten())
        del out
        loss.backward()
        opt.step()
        opt.zero_grad()

    step()                              # the optimizer's state exists from here on
    tracker = FSDPMemTracker(model, opt)
    # inside FSDP2's reduce (foreach_reduce), between the copy of a group's unsharded gradients
    # into its reduce-scatter input and their release, a moment no module snapshot falls on:
    # both, plus what the tracker holds unsharded of the other groups then
    copy_in = collectives.foreach_reduce_scatter_copy_in
    during_copy = []

    def copy_in_measured(unsharded_grads, reduce_scatter_input, world_size):
        copy_in(unsharded_grads, reduce_scatter_input, world_size)
        others = tracker.get_tracker_snapshot()[torch.device("cpu")]
        during_copy.append(
            sum(g.numel() * g.element_size() for g in unsharded_grads)
            + reduce_scatter_input.numel() * reduce_scatter_input.element_size()
            + sum(v for k, v in others.items()
                  if getattr(k, "value", k) in ("Unsharded Param", "All Gather",
                                                "Reduce Scatter")))

    collectives.foreach_reduce_scatter_copy_in = copy_in_measured
    with tracker:
        held.clear()
        step()
    collectives.foreach_reduce_scatter_copy_in = copy_in
    dev = torch.device("cpu")
    during_layers = everywhere = 0
    for state in tracker.memory_tracking.values():
        name = state.mod_fqn.split(".", 1)[-1] if "." in state.mod_fqn else ""
        for moment, snaps in state.snapshots.items():
            if moment.value in MOMENTS:
                snap = snaps[-1][dev]
                b = sum(v for k, v in snap.items() if getattr(k, "value", k) in UNSHARDED)
                everywhere = max(everywhere, b)
                if name.startswith("layers.") or name in ("norm", "output"):
                    during_layers = max(during_layers, b)
    layer = sum(p.numel() for p in model.layers["0"].parameters())
    return {"unsharded_bytes": during_layers + max(held),
            "unsharded_bytes_any_moment": max(everywhere, during_layers + max(held),
                                              max(during_copy)),
            "reduce_copy_in_bytes": max(during_copy),
            "held_head_grad_bytes": max(held),
            "layer_params": layer,
            "emb_params": spec.vocab_size * spec.hidden,
            "head_params": spec.vocab_size * spec.hidden + spec.hidden}


def main():
    """argv[1], where given: a JSON list of [layers, hidden, ffn_hidden, heads, kv heads,
    tokens, vocabulary] shapes, each measured under both groupings (keys "wrap i"); else the
    default shape at vocabularies 8192 and 1024 (keys "wrap vocabulary")."""
    dist.init_process_group("fake", rank=0, world_size=WORLD, store=FakeStore())
    mesh = init_device_mesh("cpu", (WORLD,))
    if len(sys.argv) > 1:
        shapes = json.loads(sys.argv[1])
        out = {f"{w} {i}": measure(w, s[-1], mesh, tuple(s[:-1]))
               for w in ("root", "split") for i, s in enumerate(shapes)}
    else:
        out = {f"{w} {v}": measure(w, v, mesh) for w in ("root", "split") for v in (8192, 1024)}
    dist.destroy_process_group()
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
