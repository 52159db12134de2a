"""The element-wise byte counts (planner.engines.eager, planner.cost.compute.ElementwiseKernels)
against what the code dispatches: every aten op an op's forward runs, counted as it reads its
inputs and writes its outputs (views move nothing), on CPU tensors of the shapes it trains on.

Measured: our runtime's own RMSNorm, RoPE and gated activation (runtime/model.py), and the
expressions of torchtitan's Llama as its 2024-12 commit wrote them (9dec370:
torchtitan/models/norms.py RMSNorm, torchtitan/models/llama/model.py apply_rotary_emb and
FeedForward), which the published eager rows ran.
"""
import dataclasses

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from planner.cost.compute import (FUSED_GATED_ACT_BYTES, FUSED_OP_BYTES,  # noqa: E402
                                  ElementwiseKernels, elementwise_bytes)
from planner.engines.eager import (RELU2_EAGER_BYTES, RMSNORM_COMPOSITE_BYTES,  # noqa: E402
                                   ROPE_EAGER_BYTES, ROPE_RUNTIME_BYTES, SWIGLU_EAGER_BYTES)
from planner.specs import Model  # noqa: E402

B, S, HEADS, HEAD_DIM = 2, 256, 16, 64
HIDDEN = HEADS * HEAD_DIM


class _Traffic(TorchDispatchMode):
    """Bytes every non-view aten op reads (its tensor inputs) and writes (its outputs)."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            tensors = [a for a in torch.utils._pytree.tree_leaves((args, kwargs, out))
                       if isinstance(a, torch.Tensor)]
            self.bytes += sum(t.numel() * t.element_size() for t in tensors)
        return out


def _bytes_per_element(fn, *inputs, elements):
    with torch.no_grad(), _Traffic() as t:
        fn(*inputs)
    return t.bytes / elements


def _bf16(*shape):
    return torch.randn(*shape).to(torch.bfloat16)


def _torchtitan_rmsnorm(x, weight, eps=1e-6):
    # torchtitan 9dec370 torchtitan/models/norms.py RMSNorm.forward / _norm
    xf = x.float()
    out = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x)
    return out * weight


def _torchtitan_rope(xq, freqs_cis):
    # torchtitan 9dec370 torchtitan/models/llama/model.py apply_rotary_emb (one of xq, xk)
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    freqs = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    return torch.view_as_real(xq_ * freqs).flatten(3).type_as(xq)


def _swiglu(a, b):
    # torchtitan 9dec370 FeedForward: F.silu(w1(x)) * w3(x), after the two linears
    return torch.nn.functional.silu(a) * b


def test_rmsnorm_as_tensor_expressions():
    from runtime.model import _RMSNormFn
    x, w = _bf16(B, S, HIDDEN), torch.ones(HIDDEN)
    n = x.numel()
    titan = _bytes_per_element(_torchtitan_rmsnorm, x, w.to(torch.bfloat16), elements=n)
    ours = _bytes_per_element(lambda a, b: _RMSNormFn.apply(a, b, 1e-6), x, w, elements=n)
    for got in (titan, ours):
        assert got == pytest.approx(RMSNORM_COMPOSITE_BYTES, rel=0.05), got
    # a fused kernel reads and writes the tensor once
    fused = _bytes_per_element(torch.nn.functional.layer_norm, x, (HIDDEN,), elements=n)
    assert fused == pytest.approx(FUSED_OP_BYTES, rel=0.05)


def test_rope_eager():
    from runtime.model import apply_rope, rope_cos_sin
    x = _bf16(B, S, HEADS, HEAD_DIM)
    n = x.numel()
    freqs = torch.polar(torch.ones(S, HEAD_DIM // 2), torch.rand(S, HEAD_DIM // 2))
    titan = _bytes_per_element(_torchtitan_rope, x, freqs, elements=n)
    assert titan == pytest.approx(ROPE_EAGER_BYTES, rel=0.05), titan
    cos, sin = rope_cos_sin(S, HEAD_DIM, 10000.0, "cpu")
    ours = _bytes_per_element(apply_rope, x, cos, sin, elements=n)
    assert ours == pytest.approx(ROPE_RUNTIME_BYTES, rel=0.05), ours


def test_gated_activation_eager():
    from runtime.model import _GatedActFn
    a, b = _bf16(B, S, 4 * HIDDEN), _bf16(B, S, 4 * HIDDEN)
    n = a.numel()
    silu = torch.nn.functional.silu
    for fn in (_swiglu, lambda p, q: _GatedActFn.apply(p, q, silu)):
        got = _bytes_per_element(fn, a, b, elements=n)
        assert got == pytest.approx(SWIGLU_EAGER_BYTES, rel=0.05), got
    assert SWIGLU_EAGER_BYTES > FUSED_GATED_ACT_BYTES


def test_squared_relu_eager():
    """Squared ReLU as the runtime, HF transformers and Megatron-Core write it runs two kernels;
    the engines that run it so price it at what they dispatch, GELU stays one kernel."""
    from planner.cost.compute import activation_bytes_per_element
    from planner.engines import get_engine
    from runtime.model import _activation
    x = _bf16(B, S, 4 * HIDDEN)
    n = x.numel()
    relu = torch.nn.functional.relu
    for fn in (_activation("relu2"),                       # runtime/model.py
               lambda t: torch.square(relu(t)),             # HF ReLUSquaredActivation
               lambda t: torch.pow(relu(t), 2)):            # megatron/core/activations.py
        got = _bytes_per_element(fn, x, elements=n)
        assert got == pytest.approx(RELU2_EAGER_BYTES, rel=0.05), got
    gelu = _bytes_per_element(_activation("gelu"), x, elements=n)
    assert gelu == pytest.approx(FUSED_OP_BYTES, rel=0.05), gelu
    relu2 = Model(name="r2", num_layers=2, hidden=HIDDEN, ffn_hidden=4 * HIDDEN, num_heads=HEADS,
                  num_kv_heads=HEADS, vocab_size=1024, max_seq_len=S, activation="relu2",
                  gated_mlp=False)
    for name in ("megatron", "runtime", "fsdp"):
        kernels = get_engine(name).elementwise_kernels
        assert activation_bytes_per_element(relu2, kernels) == RELU2_EAGER_BYTES, name
    gelu_model = dataclasses.replace(relu2, activation="gelu")
    assert activation_bytes_per_element(gelu_model, get_engine("megatron").elementwise_kernels) \
        == FUSED_OP_BYTES


def test_layer_bytes_are_what_the_eager_layer_dispatches():
    """A Llama layer's element-wise ops as torchtitan's 2024 eager code ran them (two RMSNorms,
    RoPE on the queries and keys, SwiGLU, two residual adds), measured together, against the
    layer's modelled element-wise bytes with those kernels; a LayerNorm/GELU model is priced
    the same by every engine."""
    kv_heads = 4
    llama = Model(name="l", hidden=HIDDEN, num_layers=1, num_heads=HEADS, num_kv_heads=kv_heads,
                  max_seq_len=S, ffn_hidden=4 * HIDDEN, vocab_size=1000)
    eager = ElementwiseKernels(rmsnorm=RMSNORM_COMPOSITE_BYTES, rope=ROPE_EAGER_BYTES,
                               gated_act=SWIGLU_EAGER_BYTES)
    x, w = _bf16(B, S, HIDDEN), torch.ones(HIDDEN, dtype=torch.bfloat16)
    q, k = _bf16(B, S, HEADS, HEAD_DIM), _bf16(B, S, kv_heads, HEAD_DIM)
    freqs = torch.polar(torch.ones(S, HEAD_DIM // 2), torch.rand(S, HEAD_DIM // 2))
    a, b = _bf16(B, S, 4 * HIDDEN), _bf16(B, S, 4 * HIDDEN)

    def layer():
        _torchtitan_rmsnorm(x, w)
        _torchtitan_rope(q, freqs)
        _torchtitan_rope(k, freqs)
        x + x                                   # the attention's residual add
        _torchtitan_rmsnorm(x, w)
        _swiglu(a, b)
        x + x                                   # the MLP's
    measured = _bytes_per_element(layer, elements=1)
    modelled = elementwise_bytes(llama, B * S, 1, False, kernels=eager)
    assert measured == pytest.approx(modelled, rel=0.03), (measured, modelled)
    assert measured > 2 * elementwise_bytes(llama, B * S, 1, False)     # fused: far less
    gpt = Model(name="g", hidden=HIDDEN, num_layers=1, num_heads=HEADS, num_kv_heads=HEADS,
                max_seq_len=S, ffn_hidden=4 * HIDDEN, vocab_size=1000, norm="layernorm",
                position="learned", gated_mlp=False)
    assert elementwise_bytes(gpt, B * S, 2, True, kernels=eager) == elementwise_bytes(
        gpt, B * S, 2, True)
