"""What the loss and the head keep, measured on the installed torch against the engines' facts
(planner.engines.spec LossMemory, planner.cost.memory.head_input_bytes).

torch's MemTracker (torch.distributed._tools.mem_tracker) follows every tensor storage a
dispatched op creates until it is freed, on CPU as on GPU: its peak is the most bytes live at
once. The loss runs over logits from a head matmul whose input and weight are tiny beside them
(8 x 4000 against 2048 x 4000), so bytes per logit are what the loss itself holds."""
import socket

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed._tools.mem_tracker import MemTracker

from planner.engines.spec import EAGER_LOSS, LOSS_PARALLEL_LOSS, RUNTIME_VOCAB_PARALLEL_LOSS

N, H, V = 2048, 8, 4000


@pytest.fixture(scope="module")
def mesh():
    """A one-rank gloo group: DTensor's loss_parallel and our vocabulary-parallel loss run
    their sharded code paths over a vocabulary split in one."""
    from torch.distributed.device_mesh import init_device_mesh
    assert not dist.is_initialized()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # the address in the init method, not in os.environ, which later tests' ranks inherit
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    yield init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    dist.destroy_process_group()


def _per_logit(kind, dtype, phase, mesh):
    """Bytes per logit of the head matmul and the loss: with `phase` "saved", what autograd
    saves in the forward (saved-tensor hooks); else the peak of live bytes, "forward" (the loss
    computed), "backward" (the backward's alone, the logits dropped before it), "dropped"
    (forward and backward with the logits dropped between them, as torchtitan's train step and
    our runtime do) or "kept" (backward with them held, as a pipeline stage holds its
    output)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import loss_parallel

    from runtime.pipeline import loss_fn
    g = torch.Generator().manual_seed(0)
    h = torch.randn(1, N, H, dtype=dtype, generator=g, requires_grad=True)
    w = torch.randn(V, H, dtype=dtype, generator=g, requires_grad=True)
    t = torch.randint(0, V, (1, N), generator=g)
    parallel = loss_parallel() if kind == "loss_parallel" else torch.enable_grad()
    saved = {}

    def pack(x):
        local = x.to_local() if isinstance(x, DTensor) else x
        saved[local.untyped_storage().data_ptr()] = local.untyped_storage().nbytes()
        return x
    tracker = MemTracker()
    with tracker, parallel, torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        if kind == "eager":
            logits = h @ w.T
            loss = F.cross_entropy(logits.flatten(0, 1).float(), t.flatten(0, 1))
        else:   # the vocabulary split over the (one-rank) tp mesh, as ColwiseParallel leaves it
            logits = (DTensor.from_local(h, mesh, [Replicate()])
                      @ DTensor.from_local(w, mesh, [Shard(0)]).T)
            assert logits.placements[0].is_shard()
            loss = (F.cross_entropy(logits.flatten(0, 1).float(), t.flatten(0, 1))
                    if kind == "loss_parallel" else loss_fn(logits, t))
        if phase in ("backward", "dropped", "kept"):
            if phase != "kept":
                del logits
            if phase == "backward":
                # the peak restarts from what is live now (MemTracker keeps it in _peak_mem,
                # torch 2.13; the next tracked allocation sets it again)
                tracker._peak_mem, tracker._peak_mem_snap = {}, {}
            loss.backward()
    if phase == "saved":
        return sum(saved.values()) / (N * V)
    assert phase == "forward" or h.grad is not None
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    return peak / (N * V)


@pytest.mark.parametrize("kind,facts", [("eager", EAGER_LOSS),
                                        ("loss_parallel", LOSS_PARALLEL_LOSS),
                                        ("runtime", RUNTIME_VOCAB_PARALLEL_LOSS)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_loss_holds_what_its_engine_facts_say(mesh, kind, facts, dtype):
    """What the loss saves, its forward and backward peaks, and the whole peak with the logits
    dropped before backward and kept through it, against LossMemory's saved, forward, backward
    and peak(): 30 measurements of 15 figures (the head's own input and weight add under 0.5%)."""
    width = torch.finfo(dtype).bits / 8
    forward, backward = ((facts.forward, facts.backward) if dtype == torch.bfloat16
                         else (facts.forward_fp32, facts.backward_fp32))
    assert _per_logit(kind, dtype, "saved", mesh) == pytest.approx(facts.saved, rel=0.01)
    assert _per_logit(kind, dtype, "forward", mesh) == pytest.approx(forward, rel=0.01)
    assert _per_logit(kind, dtype, "backward", mesh) == pytest.approx(backward, rel=0.01)
    for phase in ("dropped", "kept"):
        assert _per_logit(kind, dtype, phase, mesh) == pytest.approx(
            facts.peak(width, phase == "kept"), rel=0.01), phase


@pytest.mark.parametrize("tied", [False, True])
def test_final_norm_and_output_save_what_the_formula_counts(tied):
    """The runtime's final norm and output projection save their inputs for backward: the last
    layer's output and the norm's output, b*s*h each at tp 1
    (planner.cost.memory.head_input_bytes)."""
    from planner.catalog import get_model
    from planner.cost.memory import head_input_bytes
    from runtime.model import Transformer
    from tests.test_runtime import ROOT
    spec = get_model(str(ROOT / "examples/tiny-llama.json"))
    model = Transformer(spec)
    if tied:
        model.output.weight = model.tok_embeddings.weight
    b, s = 2, 64
    x = torch.randn(b, s, spec.hidden, requires_grad=True)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            saved[st.data_ptr()] = st.nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.output(model.norm(x))
    # the norm keeps one fp32 statistic per token beside its input
    assert sum(saved.values()) == pytest.approx(
        sum(head_input_bytes(spec, b, s, 1, False, True, 4.0)), rel=0.05)


def test_head_memory_takes_the_loss_of_its_layout():
    """torchtitan's head on Llama 3 8B: eager cross entropy at tp 1, loss_parallel under tp 8
    (its vocabulary split), the logits a pipeline stage keeps added to what is held under
    pp > 1, and sequence parallelism splitting the norm's input but not the projection's
    (DTensor keeps the all-gathered one): the figures of the table above, by hand."""
    from planner.catalog import get_gpu, get_model
    from planner.engines import get_engine
    from planner.cost.facts import facts_for
    m, facts = get_model("llama3-8b"), facts_for(get_engine("torchtitan"), get_gpu("h100"))
    b, s = 2, 4096
    tokens, logits = b * s * m.hidden * 2, b * s * m.vocab_size      # bf16 hidden states
    one = facts.head_memory(m, b, s, 1, False, 1)
    assert one.held == pytest.approx(2 * tokens + 4 * logits)
    assert one.working == pytest.approx((12 - 4) * logits)
    tp8 = facts.head_memory(m, b, s, 8, True, 1)
    assert tp8.norm_input == pytest.approx(tokens / 8)
    assert tp8.held == pytest.approx(tokens / 8 + tokens + 4 * logits / 8)
    assert tp8.working == pytest.approx((16 - 4) * logits / 8)
    piped = facts.head_memory(m, b, s, 8, True, 4)
    assert piped.held - tp8.held == pytest.approx(2 * logits / 8)
    assert piped.held + piped.working == pytest.approx(tp8.held + tp8.working + 2 * logits / 8)


def test_gpipe_holds_every_micro_batch_head_and_one_loss_peak():
    """Under GPipe the last stage holds the head's saved tensors of all m micro-batches (their
    backwards run after every forward) but the loss's peak beyond them once; under 1F1B one of
    each."""
    import dataclasses
    from planner.catalog import get_cluster, get_model
    from planner.cost.stage import Candidate, stage_coefficients
    from planner.engines import get_engine
    from planner.cost.facts import facts_for
    m, cl, eng = get_model("llama3-8b"), get_cluster("h100x8"), get_engine("torchtitan")
    c = Candidate(tp=1, pp=2, dp=4, zero=2, sp=False, mbs=1, seq_len=4096, global_batch=16,
                  schedule="1f1b")
    head = facts_for(eng, cl.gpu).head_memory(m, 1, 4096, 1, False, 2)
    f1 = stage_coefficients(m, cl, c, eng)[-1].mem_fixed
    fg = stage_coefficients(m, cl, dataclasses.replace(c, schedule="gpipe"), eng)[-1].mem_fixed
    assert c.m == 4
    assert fg["activations"] - f1["activations"] == pytest.approx(3 * head.held)
    assert fg["other"] == pytest.approx(f1["other"])
    assert head.working > 0


def test_compiled_loss_holds_what_its_engine_facts_say():
    """torchtitan's compiled loss (planner.engines.spec COMPILED_LOSS): what it saves, measured
    with saved-tensor hooks, and what Inductor's generated forward and backward allocate as
    large as the logits (a buffer of the N x V logits' shape, read from the code it runs), for
    bf16 and fp32 logits. (MemTracker cannot follow it: a dispatch mode turns dynamo off.)"""
    import re

    from torch._inductor.utils import run_and_get_code

    from planner.engines.spec import COMPILED_LOSS

    def ce(pred, labels):      # torchtitan/components/loss.py cross_entropy_loss
        return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))

    for dtype, width in ((torch.bfloat16, 2.0), (torch.float32, 4.0)):
        torch._dynamo.reset()
        compiled = torch.compile(ce)
        g = torch.Generator().manual_seed(0)
        h = torch.randn(1, N, H, dtype=dtype, generator=g, requires_grad=True)
        w = torch.randn(V, H, dtype=dtype, generator=g, requires_grad=True)
        t = torch.randint(0, V, (1, N), generator=g)
        saved = {}

        def pack(x):
            saved[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
            return x

        def step():
            logits = h @ w.T
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
                loss = compiled(logits, t)
            del logits
            loss.backward()
            return loss

        _, (forward_code, backward_code) = run_and_get_code(step)
        large = r"empty_strided_cpu\(\((?:1, )?%d, %d\)[^)]*\), torch\.(\w+)\)" % (N, V)
        nbytes = {"bfloat16": 2.0, "float32": 4.0}
        fwd = sum(nbytes[d] for d in re.findall(large, forward_code))
        bwd = sum(nbytes[d] for d in re.findall(large, backward_code))
        held = sum(saved.values()) / (N * V)     # the logits themselves: their width
        assert held == pytest.approx(width, rel=0.01)
        if dtype == torch.bfloat16:              # LossMemory.saved: of bf16 logits
            assert held == pytest.approx(COMPILED_LOSS.saved, rel=0.01)
        forward, backward = ((COMPILED_LOSS.forward, COMPILED_LOSS.backward) if width == 2.0
                             else (COMPILED_LOSS.forward_fp32, COMPILED_LOSS.backward_fp32))
        assert width + fwd == pytest.approx(forward)    # the logits, and what the forward adds
        assert held + bwd == pytest.approx(backward, rel=0.01)   # saved, and the gradient
