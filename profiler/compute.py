"""Compute and memory measurements of the runtime's own modules at the planner's shapes.

A tensor-parallel rank of degree t runs the layer with its q/k/v, gate/up projections
column-sharded (output / t) and its out/down projections row-sharded (input / t): the local
shapes `runtime.parallelize.apply_tp` gives each rank. `shard_layer` builds the runtime's
`DecoderLayer` and swaps in linears of those local shapes, so the forward that is timed is the
runtime's code (attention reshapes with -1 heads). The tensor-parallel collectives themselves are
timed separately (`profiler.links`) and added by the planner.
"""
from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import nn

from planner.limits import divisors  # noqa: F401  (profiler.run reads it from here)
from planner.cost.compute import attention_width
from planner.specs import Model
from planner.rules import tp_ok
from profiler.timing import Timer, summarize, time_fn

RECOMPUTE_MODES = ("selective", "full")


class _Part(nn.Module):
    """The smallest container `runtime.parallelize.apply_ac` accepts: `.layers`."""

    def __init__(self, layer):
        super().__init__()
        self.layers = nn.ModuleDict({"0": layer})


class _OneLayerStage:
    layers = (0, 1)
    recompute_layers = 1


def autocast_for(device):
    """What the runtime trains under: bf16 autocast on GPUs (ZeRO < 2), fp32 on the CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


def _linear(n_in, n_out, bias):
    return nn.Linear(n_in, n_out, bias=bias)


def shard_layer(spec: Model, tp: int, device, recompute: str = "none") -> nn.Module:
    """The runtime's DecoderLayer with tensor-parallel rank-local shapes, on `device`."""
    from runtime.model import DecoderLayer
    from runtime.activation_checkpoint import apply_ac
    h, f, kv = spec.hidden, spec.ffn_hidden, spec.kv_dim
    with torch.device("meta"):
        layer = DecoderLayer(spec)
        if tp > 1:
            a, m = layer.attention, layer.feed_forward
            if spec.is_mla:   # down projections whole (Megatron MLASelfAttention), ups by heads
                n, qk = spec.num_heads, spec.qk_nope_head_dim + spec.qk_rope_head_dim
                if a.wq is not None:
                    a.wq = _linear(h, n * qk // tp, spec.attn_bias)
                else:
                    a.wq_b = _linear(spec.q_lora_rank, n * qk // tp, False)
                a.wkv_b = _linear(spec.kv_lora_rank,
                                  n * (spec.qk_nope_head_dim + spec.v_head_dim) // tp, False)
            else:
                a.wq = _linear(h, spec.q_dim // tp, spec.attn_bias)
                a.wk = _linear(h, kv // tp, spec.attn_bias)
                a.wv = _linear(h, kv // tp, spec.attn_bias)
            a.wo = _linear(spec.attn_out_dim // tp, h, spec.linear_bias)
            if a.sinks is not None:
                a.sinks = nn.Parameter(torch.empty(spec.num_heads // tp))
            m.w1 = _linear(h, f // tp, spec.linear_bias)
            m.w2 = _linear(f // tp, h, spec.linear_bias)
            if m.w3 is not None:
                m.w3 = _linear(h, f // tp, spec.linear_bias)
    layer = layer.to_empty(device=device)
    _init(layer)
    part = _Part(layer)
    if recompute != "none":
        apply_ac(part, _OneLayerStage, recompute)
    return part.layers["0"]


@torch.no_grad()
def _init(module: nn.Module):
    for name, p in module.named_parameters():
        if name.endswith("bias"):
            p.zero_()
        elif p.dim() == 1:
            p.fill_(1.0)
        else:
            p.normal_(0.0, 0.02)


def param_bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _storage_key(t):
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


def saved_bytes(module: nn.Module, run) -> int:
    """Bytes of distinct storages autograd saves while `run()` executes (parameters excluded).

    Works on every device (torch.autograd.graph.saved_tensors_hooks). Non-reentrant
    checkpointing saves its inputs through the same hooks, so recompute modes count too."""
    params = {_storage_key(p) for p in module.parameters()}
    seen, total = set(), [0]

    def pack(t):
        k = _storage_key(t)
        if k is not None and k not in params and k not in seen:
            seen.add(k)
            total[0] += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()
    del out
    return total[0]


def allocator_bytes(device, run) -> int | None:
    """On a GPU: bytes the caching allocator still holds after `run()` (its output excluded)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(device)
    out = run()
    torch.cuda.synchronize()
    after = torch.cuda.memory_allocated(device)
    held = after - before - out.numel() * out.element_size()
    del out
    return int(held)


def time_fwd_bwd(module, make_input, device, warmup, repeats, budget_s, loss=None):
    """(forward summary, backward summary) of module(make_input()), fresh graph each repeat."""
    timer = Timer(device)
    fwd, bwd, spent = [], [], 0.0
    ac = autocast_for(device)
    for i in range(warmup + repeats):
        x = make_input()
        timer.sync()
        timer.start()
        with ac:
            y = module(*x) if isinstance(x, tuple) else module(x)
            if loss is not None:
                y = loss(y)
        tf = timer.stop()
        g = torch.ones_like(y) if y.dim() == 0 else torch.randn_like(y)
        timer.start()
        y.backward(g)
        tb = timer.stop()
        del y, g, x
        if i >= warmup:
            fwd.append(tf)
            bwd.append(tb)
            spent += tf + tb
            if budget_s is not None and spent > budget_s and len(fwd) >= 3:
                break
    return summarize(fwd), summarize(bwd)


def stack_depth(spec: Model, device) -> int:
    """Layers timed together: a stack's forward then backward sees what a model's does (the
    saved activations of earlier layers evicted from caches by later ones); per-layer figures
    are the stack's / depth."""
    return min(spec.num_layers, 2 if device.type == "cuda" else 4)


def _per_layer(summary: dict, n: int) -> dict:
    return summarize([x / n for x in summary["samples"]])


def layer_point(spec, tp, mbs, seq, device, warmup, repeats, budget_s):
    """Per-layer times and saved bytes of layer shards at (tp, micro-batch, seq), from a stack
    of `stack_depth` layers run forward then backward."""
    depth = stack_depth(spec, device)
    layers = nn.Sequential(*[shard_layer(spec, tp, device) for _ in range(depth)])
    h = spec.hidden

    def inp():
        return torch.randn(mbs, seq, h, device=device, dtype=torch.float32, requires_grad=True)

    fwd, bwd = time_fwd_bwd(layers, inp, device, warmup, repeats, budget_s)
    x = inp()
    seen = {}
    hook = layers[0].attention.wo.register_forward_hook(
        lambda mod, i, o: seen.setdefault("elem", o.element_size()))
    with autocast_for(device):
        saved = saved_bytes(layers, lambda: layers(x)) / depth
        alloc = allocator_bytes(device, lambda: layers(x))
    hook.remove()
    return {"tp": tp, "mbs": mbs, "seq_len": seq, "tokens": mbs * seq, "stack": depth,
            "fwd_s": _per_layer(fwd, depth), "bwd_s": _per_layer(bwd, depth),
            "comm_elem_bytes": seen.get("elem"), "saved_bytes": saved,
            "allocator_bytes": alloc / depth if alloc is not None else None,
            "param_bytes": param_bytes(layers[0]),
            "params": sum(p.numel() for p in layers[0].parameters())}


def recompute_point(spec, tp, mbs, seq, device, warmup, repeats, budget_s, mode):
    """Extra backward seconds and saved bytes of a layer under `mode` recompute (the runtime's
    apply_ac). The plain layer and the recomputed one run in alternation and the extra time is
    the median of the paired differences, which keeps it apart from load drifting by."""
    base = shard_layer(spec, tp, device)
    layer = shard_layer(spec, tp, device, recompute=mode)

    def inp():
        return torch.randn(mbs, seq, spec.hidden, device=device, requires_grad=True)

    diffs, bwds = [], []
    for i in range(warmup + max(repeats, 5)):
        _, b0 = time_fwd_bwd(base, inp, device, 0, 1, None)
        _, b1 = time_fwd_bwd(layer, inp, device, 0, 1, None)
        if i >= warmup:
            diffs.append(b1["median"] - b0["median"])
            bwds.append(b1["median"])
    x = inp()
    with autocast_for(device):
        saved = saved_bytes(layer, lambda: layer(x))
        alloc = allocator_bytes(device, lambda: layer(x))
    return {"mode": mode, "tp": tp, "mbs": mbs, "bwd_s": summarize(bwds),
            "extra_bwd_paired_s": summarize(diffs), "saved_bytes": saved,
            "allocator_bytes": alloc}


def attention_core_point(spec, tp, mbs, seq, device, warmup, repeats, budget_s):
    """Forward time of the attention core alone (what selective recompute redoes)."""
    from runtime.model import AttentionCore
    core = AttentionCore()
    hq, hkv, d = spec.num_heads // tp, max(1, spec.num_kv_heads // tp), spec.head_dim
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    q = torch.randn(mbs, hq, seq, d, device=device, dtype=dt)
    k = torch.randn(mbs, hkv, seq, d, device=device, dtype=dt)
    v = torch.randn(mbs, hkv, seq, d, device=device, dtype=dt)
    with torch.no_grad():
        t = time_fn(lambda: core(q, k, v), device, warmup, repeats, budget_s)
    flops = 0.5 * 4.0 * mbs * seq * seq * hq * d        # causal QK^T and PV, as the planner counts
    return {"tp": tp, "mbs": mbs, "fwd_s": t, "flops": flops}


def embedding_point(spec, tp, mbs, seq, device, warmup, repeats, budget_s):
    """The vocabulary-sharded token embedding (RowwiseParallel keeps V/t rows per rank)."""
    emb = nn.Embedding(spec.vocab_size // tp, spec.hidden).to(device)
    _init(emb)
    v = spec.vocab_size // tp

    def inp():
        return torch.randint(0, v, (mbs, seq), device=device)

    fwd, bwd = time_fwd_bwd(emb, inp, device, warmup, repeats, budget_s)
    return {"tp": tp, "mbs": mbs, "fwd_s": fwd, "bwd_s": bwd}


class _Head(nn.Module):
    def __init__(self, spec, tp):
        super().__init__()
        from runtime.model import make_norm
        self.norm = make_norm(spec)
        self.output = nn.Linear(spec.hidden, spec.vocab_size // tp, bias=False)

    def forward(self, x, targets):
        from runtime.pipeline import loss_fn
        return loss_fn(self.output(self.norm(x)), targets)


def head_point(spec, tp, mbs, seq, device, warmup, repeats, budget_s):
    """Final norm, LM head (vocabulary shard) and the runtime's loss: times and saved bytes."""
    head = _Head(spec, tp).to(device)
    _init(head)
    v = spec.vocab_size // tp

    def inp():
        return (torch.randn(mbs, seq, spec.hidden, device=device, requires_grad=True),
                torch.randint(0, v, (mbs, seq), device=device))

    fwd, bwd = time_fwd_bwd(head, inp, device, warmup, repeats, budget_s)
    x, y = inp()
    with autocast_for(device):
        saved = saved_bytes(head, lambda: head(x, y))
    return {"tp": tp, "mbs": mbs, "fwd_s": fwd, "bwd_s": bwd, "saved_bytes": saved}


def optimizer_point(spec, device, warmup, repeats, budget_s):
    """The runtime's optimizer step (AdamW foreach, its gradient-norm pass, zero_grad) per
    parameter, on one layer's parameters; and the optimizer-state bytes per parameter."""
    from runtime.optimizer import grad_norm_sq_local
    layer = shard_layer(spec, 1, device)
    params = list(layer.parameters())
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0, betas=(0.9, 0.95), eps=1e-8,
                            foreach=True)
    n = sum(p.numel() for p in params)

    def step():
        grad_norm_sq_local(params, 1)
        opt.step()

    t = time_fn(step, device, warmup, repeats, budget_s)
    state = sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
                if torch.is_tensor(v) and v.dim() > 0)
    return {"params": n, "step_s": t, "s_per_param": t["median"] / n,
            "state_bytes_per_param": state / n,
            "weight_bytes_per_param": params[0].element_size(),
            "grad_bytes_per_param": params[0].grad.element_size()}


def gemm_point(spec, tokens, device, warmup, repeats, budget_s):
    """A large GEMM of the model's MLP shape: achieved FLOP/s."""
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(tokens, spec.hidden, device=device, dtype=dt)
    b = torch.randn(spec.hidden, spec.ffn_hidden, device=device, dtype=dt)
    t = time_fn(lambda: a @ b, device, warmup, repeats, budget_s)
    flops = 2.0 * tokens * spec.hidden * spec.ffn_hidden
    return {"m": tokens, "n": spec.ffn_hidden, "k": spec.hidden, "dtype": str(dt).split(".")[-1],
            "time_s": t, "tflops": flops / t["median"] / 1e12}


def bandwidth_point(device, nbytes, warmup, repeats, budget_s):
    """Device memory bandwidth from a copy (read + write)."""
    n = nbytes // 4
    a = torch.empty(n, device=device)
    a.normal_()
    b = torch.empty_like(a)
    t = time_fn(lambda: b.copy_(a), device, warmup, repeats, budget_s)
    return {"bytes": 2 * n * 4, "time_s": t, "gbps": 2 * n * 4 / t["median"] / 1e9}


def shrunk_attention(spec: Model, k: int) -> dict:
    """The attention widths of `spec` / k, kept consistent with a hidden size / k: an explicit
    head_dim (head_dim_override) shrinks like hidden / num_heads would, and so do MLA's ranks and
    head widths (the rope part stays even); the head counts stay. {} when nothing is explicit."""
    if k == 1:
        return {}
    if spec.is_mla:
        return dict(q_lora_rank=max(1, spec.q_lora_rank // k) if spec.q_lora_rank else 0,
                    kv_lora_rank=max(1, spec.kv_lora_rank // k),
                    qk_rope_head_dim=max(2, spec.qk_rope_head_dim // k // 2 * 2),
                    qk_nope_head_dim=max(1, spec.qk_nope_head_dim // k),
                    v_head_dim=max(1, spec.v_head_dim // k))
    if spec.head_dim_override:
        return dict(head_dim_override=max(2, spec.head_dim_override // k // 2 * 2))
    return {}


def scaled_spec(spec: Model, device, seq: int, max_tp: int):
    """A model small enough to time here, or the model itself. Returns (spec, seq, note).

    On the CPU a layer is kept under ~30 M parameters and ~4 GFLOP forward at micro-batch 1:
    hidden and FFN width and the vocabulary shrink by a power of two k, the head count stays (so
    every tensor-parallel degree still divides it; head_dim shrinks), the sequence is capped at
    512. The planner then uses the measured / modelled ratio at these shapes (calibration),
    not the raw times. On GPUs the true shapes are timed (a layer at a time)."""
    if device.type == "cuda":
        return spec, seq, None
    s = min(seq, 512)

    explicit = spec.is_mla or bool(spec.head_dim_override)

    def cost(k):
        h, f = spec.hidden // k, spec.ffn_hidden // k
        if explicit:    # the shrunk widths (shrunk_attention) need no hidden % num_heads
            m = spec.scaled(hidden=h, ffn_hidden=f, **shrunk_attention(spec, k))
            params = m.attn_matmul_params() + m.mlp_matmul_params()
            return params, 2.0 * params * s + 2.0 * s * s * attention_width(m), m.head_dim
        kv = spec.kv_dim // k
        params = h * (h + 2 * kv) + h * h + (3 if spec.gated_mlp else 2) * h * f
        return params, 2.0 * params * s + 2.0 * s * s * h, spec.head_dim // k

    k = 1
    while True:
        params, flops, hd = cost(k)
        if (params <= 30e6 and flops <= 4e9) or hd <= 8:
            break
        k *= 2
    if k == 1 and s == seq:
        return spec, seq, None
    vocab = max(64 * max_tp, (spec.vocab_size // k) // (64 * max_tp) * (64 * max_tp))
    small = spec.scaled(name=f"{spec.name}/{k}", hidden=spec.hidden // k,
                        ffn_hidden=max(max_tp, spec.ffn_hidden // k // max_tp * max_tp),
                        vocab_size=vocab, max_seq_len=max(s, min(spec.max_seq_len, s)),
                        **shrunk_attention(spec, k))
    note = (f"CPU: {spec.name} is too large to time here; timed a version with hidden, FFN and "
            f"vocabulary / {k} (head_dim {spec.head_dim} -> {small.head_dim}, same heads) at "
            f"seq_len {s}; the planner scales its model by the measured / modelled ratio")
    return small, s, note


def ms(x):
    return round(x * 1e3, 3)


def default_mbs(quick: bool, device) -> tuple:
    if device.type == "cuda":
        return (1, 2) if quick else (1, 2, 4)
    return (1, 2, 4) if quick else (1, 2, 4, 8)


def is_valid_tp(spec: Model, tp: int) -> bool:
    """A tp the search may choose (planner.rules.tp_ok) that also splits the hidden size."""
    return tp_ok(spec, tp) and spec.hidden % tp == 0


# ---- the runtime's own tensor parallelism (DTensor), collectives included ----------------------

def runtime_part(spec: Model, tp: int, kind: str, device, tp_mesh, sp: bool = False):
    """A one-piece `runtime.model.Transformer` holding only the embedding, one layer, or the
    final norm + LM head, laid out by `runtime.parallelize.apply_tp` over `tp_mesh` (tp > 1) and
    initialised by the runtime: what a tensor-parallel rank really runs, collectives included."""
    from runtime.model import Transformer
    from runtime.parallelize import apply_tp, materialize_and_init
    depth = stack_depth(spec, device) if kind == "layer" else 1
    one = spec.scaled(num_layers=depth, mtp_layers=0)   # parts of the trunk: no MTP modules
    with torch.device("meta"):
        part = Transformer(one)
    if kind != "layer":
        del part.layers["0"]
    if kind != "embedding":
        part.tok_embeddings = part.pos_embeddings = part.emb_dropout = None
    if kind != "head":
        part.norm = part.output = None
    if tp > 1:
        import inspect
        extra = (one,) if "spec" in inspect.signature(apply_tp).parameters else ()
        apply_tp(part, tp_mesh, sp, *extra)
    materialize_and_init(part, one, 0, device)
    return part


def runtime_point(spec, tp, kind, mbs, seq, device, tp_mesh, warmup, repeats, budget_s,
                  sp=False):
    """Forward/backward seconds (and saved bytes for the head) of a runtime part at tp; with
    `sp` (sequence parallel) a layer takes and returns this rank's 1/tp of the sequence."""
    from runtime.pipeline import loss_fn
    part = runtime_part(spec, tp, kind, device, tp_mesh, sp)
    h, v = spec.hidden, spec.vocab_size
    s_in = seq // tp if sp and tp > 1 else seq
    targets = torch.randint(0, v, (mbs, seq), device=device)
    if kind == "embedding":
        def inp():
            return torch.randint(0, v, (mbs, seq), device=device)
    else:
        def inp():
            return torch.randn(mbs, s_in, h, device=device, requires_grad=True)
    loss = (lambda y: loss_fn(y, targets)) if kind == "head" else None
    fwd, bwd = time_fwd_bwd(part, inp, device, warmup, repeats, budget_s, loss=loss)
    depth = len(part.layers) if kind == "layer" else 1
    out = {"tp": tp, "mbs": mbs, "kind": kind, "sp": sp, "stack": depth,
           "fwd_s": _per_layer(fwd, depth), "bwd_s": _per_layer(bwd, depth)}
    if kind == "head":
        x = inp()
        with autocast_for(device):
            out["saved_bytes"] = saved_bytes(part, lambda: loss_fn(part(x), targets))
    return out
