"""Runtime: model, data, checkpoint bookkeeping and refusals (single process, fast)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from planner.catalog import get_gpu  # noqa: E402
from planner.plan import Batch, Parallelism, Plan, make_stages  # noqa: E402
from planner.specs import Cluster, Model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

LLAMA = Model("tiny", num_layers=4, hidden=64, ffn_hidden=128, num_heads=4, num_kv_heads=2,
              vocab_size=128, max_seq_len=32)
GPT = LLAMA.scaled(name="tiny-gpt", gated_mlp=False, activation="gelu", norm="layernorm",
                   position="learned", tied_embeddings=True, attn_bias=True, linear_bias=True)


def make_plan(path, model=LLAMA, tp=1, pp=1, dp=1, validate=True, **par):
    plan = Plan(model=model, cluster=Cluster("cpux8", get_gpu("cpu"), 8, 8),
                parallelism=Parallelism(tp=tp, pp=pp, dp=dp, **par),
                batch=Batch(seq_len=16, global_batch_size=8, micro_batch_size=1,
                            num_microbatches=8 // dp), stages=make_stages(4, pp),
                engine="runtime")
    if validate:
        plan.validate()
    plan.save(path)
    return path


def run_runtime(*args, env_extra=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT"):
        env.pop(k, None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "runtime", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


# ---- model ---------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", [
    LLAMA, GPT,
    LLAMA.scaled(activation="relu2", gated_mlp=False, parallel_residual=True, attn_bias=True,
                 linear_bias=True, norm="layernorm"),
])
def test_decoder_layer_standalone(spec):
    from runtime.model import DecoderLayer
    layer = DecoderLayer(spec)
    x = torch.randn(2, 8, spec.hidden, requires_grad=True)
    y = layer(x)
    assert y.shape == x.shape
    y.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    n = sum(p.numel() for p in layer.parameters())
    assert n == spec.layer_params()       # the planner's count is the runtime's


@pytest.mark.parametrize("spec", [LLAMA, GPT])
def test_transformer_param_count_matches_planner(spec):
    from runtime.model import Transformer
    with torch.device("meta"):
        m = Transformer(spec)
    assert sum(p.numel() for p in m.parameters()) == spec.num_params()


def test_attention_is_causal():
    from runtime.model import Transformer, init_full_tensor
    m = Transformer(LLAMA)
    with torch.no_grad():
        for n, p in m.named_parameters():
            p.copy_(init_full_tensor(n, tuple(p.shape), LLAMA, 0))
    x = torch.randint(0, 128, (1, 12))
    y = x.clone()
    y[0, 8:] = (y[0, 8:] + 1) % 128
    a, b = m(x), m(y)
    assert torch.allclose(a[0, :8], b[0, :8], atol=1e-6)
    assert not torch.allclose(a[0, 8:], b[0, 8:], atol=1e-3)


def test_alibi_refused():
    from runtime.model import DecoderLayer, UnsupportedModel
    with pytest.raises(UnsupportedModel, match="ALiBi"):
        DecoderLayer(LLAMA.scaled(position="alibi"))


def test_init_is_keyed_by_seed_and_name():
    from runtime.model import canonical_name, init_full_tensor
    a = init_full_tensor("layers.0.attention.wq.weight", (64, 64), LLAMA, 0)
    assert torch.equal(a, init_full_tensor("layers.0.attention.wq.weight", (64, 64), LLAMA, 0))
    assert not torch.equal(a, init_full_tensor("layers.1.attention.wq.weight", (64, 64), LLAMA, 0))
    assert not torch.equal(a, init_full_tensor("layers.0.attention.wq.weight", (64, 64), LLAMA, 1))
    assert torch.equal(init_full_tensor("layers.0.ffn_norm.weight", (64,), LLAMA, 0),
                       torch.ones(64))
    assert canonical_name("layers.0._checkpoint_wrapped_module.attention.wq.weight",
                          LLAMA) == "layers.0.attention.wq.weight"
    assert canonical_name("output.weight", GPT) == "tok_embeddings.weight"
    assert canonical_name("output.weight", LLAMA) == "output.weight"


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_recompute_wraps_exactly_the_planned_layers(mode):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    from runtime.model import Transformer, clean_name
    from runtime.activation_checkpoint import apply_ac
    from runtime.pipeline import split_model
    plan = _plan(pp=2, recompute=mode)
    plan.stages[1].recompute_layers = 1
    with torch.device("meta"):
        whole = Transformer(LLAMA)
    (st, part), = split_model(whole, plan, 1)
    names = [n for n, _ in part.named_parameters()]
    assert apply_ac(part, st, mode) == [2]
    wrapped = {k: isinstance(l, CheckpointWrapper) for k, l in part.layers.items()}
    core = {k: isinstance(part.layers[k].attention.core if not wrapped[k] else
                          part.layers[k]._checkpoint_wrapped_module.attention.core,
                          CheckpointWrapper) for k in part.layers}
    if mode == "full":
        assert wrapped == {"2": True, "3": False} and core == {"2": False, "3": False}
    else:
        assert wrapped == {"2": False, "3": False} and core == {"2": True, "3": False}
    # parameter names (checkpoint keys, init seeds) do not change
    assert [clean_name(n) for n, _ in part.named_parameters()] == names
    assert part.tok_embeddings is None and part.output is not None
    assert set(part.layers) == {"2", "3"}


# ---- data ----------------------------------------------------------------------------------

def test_synthetic_batches_split_the_same_global_batch():
    from runtime.data import SyntheticTokens, local_batch
    src = SyntheticTokens(128, 16, seed=3)
    x1, y1 = local_batch(src, 5, 8, 1, 0)
    parts = [local_batch(src, 5, 8, 4, r) for r in range(4)]
    assert torch.equal(torch.cat([p[0] for p in parts]), x1)
    assert torch.equal(torch.cat([p[1] for p in parts]), y1)
    assert torch.equal(x1[:, 1:], y1[:, :-1])
    assert x1.shape == (8, 16) and int(x1.max()) < 128
    x2, _ = local_batch(src, 6, 8, 1, 0)
    assert not torch.equal(x1, x2)
    assert torch.equal(local_batch(SyntheticTokens(128, 16, seed=3), 5, 8, 1, 0)[0], x1)


@pytest.mark.parametrize("suffix,dtype", [(".npy", np.int32), (".bin", np.uint16),
                                          (".i32", np.int32)])
def test_file_tokens(tmp_path, suffix, dtype):
    from runtime.data import FileTokens
    toks = (np.arange(100) % 50).astype(dtype)
    f = tmp_path / f"toks{suffix}"
    if suffix == ".npy":
        np.save(f, toks)
    else:
        toks.astype("<i4" if dtype == np.int32 else "<u2").tofile(f)
    src = FileTokens(str(f), vocab_size=64, seq_len=16)
    assert src.num_samples == 6
    assert src.sample(1).tolist() == list(range(16, 33))
    assert torch.equal(src.sample(7), src.sample(1))      # wraps around


def test_file_tokens_outside_vocab(tmp_path):
    from runtime.data import DataError, FileTokens
    f = tmp_path / "t.npy"
    np.save(f, np.arange(100))
    with pytest.raises(DataError, match="outside"):
        FileTokens(str(f), vocab_size=64, seq_len=16)


# ---- checkpoint bookkeeping ----------------------------------------------------------------

def test_latest_ignores_incomplete(tmp_path):
    from runtime.checkpoint import latest
    assert latest(str(tmp_path / "none")) is None
    for name, complete in [("step-00000002", True), ("step-00000004", False),
                           ("step-00000006.tmp", True), ("junk", True)]:
        d = tmp_path / name
        d.mkdir()
        (d / "meta.json").write_text("{}")
        if complete:
            (d / "COMPLETE").write_text("ok\n")
    assert latest(str(tmp_path)) == (2, tmp_path / "step-00000002")


def test_tied_checkpoint_keys():
    from runtime.checkpoint import _to_ckpt_key
    assert _to_ckpt_key("output.weight", True) == "tok_embeddings.weight"
    assert _to_ckpt_key("state.output.weight.exp_avg", True) == "state.tok_embeddings.weight.exp_avg"
    assert _to_ckpt_key("param_groups.output.weight.lr", True) == \
        "param_groups.tok_embeddings.weight.lr"
    assert _to_ckpt_key("output.weight", False) == "output.weight"
    assert _to_ckpt_key("layers.0.output.weightx", True) == "layers.0.output.weightx"


# ---- one-process runs and refusals ---------------------------------------------------------

def _metrics(path):
    return [json.loads(l) for l in Path(path).read_text().splitlines()]


def test_single_process_run_learns(tmp_path):
    plan = make_plan(tmp_path / "p.json")
    d = json.loads(Path(plan).read_text())
    d["estimate"] = {"fits": True, "step_time_s": 0.5, "tokens_per_s": 256.0,
                     "tflops_per_gpu": 0.01, "mfu": 0.1, "peak_memory_gib": 0.5}
    Path(plan).write_text(json.dumps(d))
    r = run_runtime("--plan", plan, "--steps", 30, "--lr", "3e-3", "--metrics", tmp_path / "m")
    assert r.returncode == 0, r.stderr
    lines = _metrics(tmp_path / "m")
    steps = [l for l in lines if "step" in l]
    assert [s["step"] for s in steps] == list(range(1, 31))
    for s in steps:
        assert set(s) >= {"step", "loss", "step_time_s", "tokens_per_s", "peak_memory_gib"}
        assert s["step_time_s"] > 0 and s["peak_memory_gib"] > 0
    first = sum(s["loss"] for s in steps[:3]) / 3
    last = sum(s["loss"] for s in steps[-3:]) / 3
    assert last < first - 0.3, (first, last)
    summary = lines[-1]["summary"]
    assert summary["steps"] == 30 and summary["predicted_step_time_s"] == 0.5
    assert summary["measured_over_predicted"] == pytest.approx(
        summary["measured_step_time_s"] / 0.5)
    assert "step     1" in r.stdout and "summary" in r.stdout
    # tokens/s and MFU beside the plan's 256 tok/s and 10%: 6 x the matmul parameters per
    # token plus 12 s^2 h per layer and sample (Narayanan et al. 2021), one CPU's peak
    m = LLAMA
    per_token = 4 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128) + 128 * 64   # wq wo, wk wv
    flops = 6 * per_token * 8 * 16 + 4 * 12 * 8 * 16 * 16 * m.num_heads * m.head_dim
    t = summary["measured_step_time_s"]
    assert summary["tokens_per_s"] == pytest.approx(8 * 16 / t)
    assert summary["mfu"] == pytest.approx(flops / t / (get_gpu("cpu").peak_tflops * 1e12))
    assert (summary["predicted_tokens_per_s"], summary["predicted_mfu"]) == (256.0, 0.1)
    assert "tok/s (plan 256)" in r.stdout and "(plan 10.00%)" in r.stdout
    assert " ep=1 " in r.stdout.splitlines()[0]


def _refused(r, match):
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert match in lines[0], lines[0]


def in_process(capsys, *args):
    """`python -m runtime ARGS` as its own main() in this process, for refusals that come
    after torch is imported (a new process would spend seconds importing it first); the
    subprocess runs (run_runtime) keep the exit status and stderr of the real entry point."""
    from types import SimpleNamespace

    from runtime.train import main
    capsys.readouterr()
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=out, stderr=err)


def test_refuses_world_mismatch(tmp_path):
    plan = make_plan(tmp_path / "p.json", tp=2, pp=2, dp=2)
    r = run_runtime("--plan", plan, "--steps", 2, "--metrics", tmp_path / "m")
    _refused(r, "needs tp*pp*dp = 2*2*2 = 8 processes, launched with 1")
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("args,match", [
    (["--steps", "0"], "--steps must be at least 1, got 0"),
    (["--steps", "x"], "invalid int"),
    (["--lr", "-1"], "--lr must be greater than 0, got -1.0"),
    (["--lr", "nan"], "--lr must be a finite number, got nan"),
    (["--lr", "inf"], "--lr must be a finite number, got inf"),
    (["--weight-decay", "-0.1"], "--weight-decay must be at least 0, got -0.1"),
    (["--weight-decay", "nan"], "--weight-decay must be a finite number, got nan"),
    (["--warmup-steps", "-1"], "--warmup-steps must be at least 0, got -1"),
    (["--lr-decay", "cosin"], '--lr-decay must be one of "cosine", "linear", "constant"'),
    (["--min-lr-ratio", "2"], "--min-lr-ratio must be at most 1, got 2.0"),
    (["--max-grad-norm", "-1"], "--max-grad-norm must be at least 0, got -1.0"),
    (["--timeout", "0"], "--timeout must be a positive number of seconds"),
    (["--timeout", "inf"], "--timeout must be a positive number of seconds"),
    (["--resume"], "--checkpoint-dir"),
    (["--overwrite-checkpoints"], "--checkpoint-dir"),
    (["--resume", "--overwrite-checkpoints", "--checkpoint-dir", "x"], "give one of them"),
    (["--bogus"], "unrecognized"),
    (["--data", "/nonexistent/tokens.bin"], "no such file"),
])
def test_refuses_bad_cli(tmp_path, args, match):
    plan = make_plan(tmp_path / "p.json")
    _refused(run_runtime("--plan", plan, *args), match)


def test_refuses_bad_plans(tmp_path, capsys, monkeypatch):
    _refused(run_runtime("--plan", tmp_path / "missing.json"), "no such file")
    bad = tmp_path / "bad.json"
    bad.write_text("{\"schema_version\": 1}")
    _refused(run_runtime("--plan", bad), "not a valid plan")
    alibi = make_plan(tmp_path / "a.json", model=LLAMA.scaled(position="alibi"))
    _refused(in_process(capsys, "--plan", alibi), "ALiBi")
    # a layout the runtime cannot run is refused before any work: learned positions are a
    # table of max_seq_len rows (RoPE has no such limit since the rules layer's mend)
    long = make_plan(tmp_path / "g.json", model=LLAMA.scaled(max_seq_len=8, position="learned"),
                     tp=2, pp=2,
                     validate=False)
    monkeypatch.setenv("WORLD_SIZE", "4")
    _refused(in_process(capsys, "--plan", long), "max_seq_len")


def test_file_data_and_resume_refuses_other_model(tmp_path, capsys):
    plan = make_plan(tmp_path / "p.json")
    ck = tmp_path / "ck"
    np.save(tmp_path / "toks.npy", (np.arange(1000) * 7 % 128).astype(np.int32))
    r = run_runtime("--plan", plan, "--steps", 1, "--checkpoint-dir", ck, "--data",
                    tmp_path / "toks.npy", "--metrics", tmp_path / "m")
    assert r.returncode == 0, r.stderr
    assert _metrics(tmp_path / "m")[0]["loss"] > 0
    assert (ck / "step-00000001" / "COMPLETE").is_file()
    other = make_plan(tmp_path / "o.json", model=LLAMA.scaled(hidden=128, ffn_hidden=256))
    _refused(in_process(capsys, "--plan", other, "--steps", 2, "--checkpoint-dir", ck,
                        "--resume", "--data", tmp_path / "toks.npy"),
             "written by another run (model hidden 64 vs 128; model ffn_hidden 128 vs 256;")


# ---- layout checks -------------------------------------------------------------------------

def _plan(model=LLAMA, tp=1, pp=1, dp=1, vpp=1, nmb=None, seq=16, **par):
    nmb = nmb or 8 // dp
    return Plan(model=model, cluster=Cluster("c", get_gpu("cpu"), 64, 8),
                parallelism=Parallelism(tp=tp, pp=pp, dp=dp, vpp=vpp, **par),
                batch=Batch(seq_len=seq, global_batch_size=nmb * dp, micro_batch_size=1,
                            num_microbatches=nmb), stages=make_stages(model.num_layers, pp, vpp),
                engine="runtime")


@pytest.mark.parametrize("kw,match", [
    (dict(model=LLAMA.scaled(num_kv_heads=4, ffn_hidden=130), tp=4), r"FFN \(130\)"),
    (dict(tp=2, sequence_parallel=True, seq=15), "seq_len"),
    (dict(model=LLAMA.scaled(position="learned"), seq=64), "max_seq_len"),
    (dict(model=LLAMA.scaled(num_layers=8), pp=2, vpp=2, schedule="interleaved", nmb=5),
     "interleaved"),
])
def test_check_layout_refuses(kw, match):
    """The runtime's layout rules are planner.rules's: Plan.validate (so every plan file
    loaded) refuses the same plans with the same line."""
    from planner.errors import BadInput
    from runtime.parallelize import LayoutError, check_layout
    plan = _plan(**kw)
    with pytest.raises(LayoutError, match=match):
        check_layout(plan)
    with pytest.raises(BadInput, match=match):
        plan.validate()


@pytest.mark.parametrize("kw", [dict(tp=2, pp=2, dp=2, sequence_parallel=True),
                                dict(tp=4, sequence_parallel=True),   # 2 kv heads, replicated
                                dict(pp=4, nmb=4), dict(pp=2, nmb=3, schedule="gpipe"),
                                dict(pp=4, nmb=2, schedule="1f1b"),   # run as GPipe
                                dict(model=LLAMA.scaled(num_layers=8), pp=2, vpp=2,
                                     schedule="interleaved", nmb=6)])
def test_check_layout_accepts(kw):
    from runtime.parallelize import check_layout
    plan = _plan(**kw)
    plan.validate()
    check_layout(plan)


def test_buckets():
    from runtime.buckets import bucket_runs as _buckets
    ts = [torch.zeros(10), torch.zeros(10), torch.zeros(30), torch.zeros(5, dtype=torch.float64),
          torch.zeros(1)]
    runs = list(_buckets(ts, cap=100))
    assert [len(r) for r in runs] == [2, 1, 1, 1]
    assert sum(len(r) for r in runs) == len(ts)


def test_check_world(monkeypatch):
    from runtime.train import Refused, check_world
    plan = _plan(tp=2, pp=2, dp=2)
    check_world(plan, 8, 8, on_gpu=False)
    check_world(plan, 8, 1, on_gpu=False)       # CPU: processes per node do not matter
    with pytest.raises(Refused, match="launched with 4"):
        check_world(plan, 4, 4, on_gpu=False)
    with pytest.raises(Refused, match="8 GPUs per node, launched 16 processes per node"):
        check_world(plan, 8, 16, on_gpu=True)
    plan4 = _plan(tp=4, pp=1, dp=2)
    with pytest.raises(Refused, match="tp 4 groups would span nodes of 2 processes"):
        check_world(plan4, 8, 2, on_gpu=True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(Refused, match="4 processes per node but only 2 GPUs visible"):
        check_world(plan4, 8, 4, on_gpu=True)


def test_help_is_not_refused():
    r = run_runtime("--help")
    assert r.returncode == 0 and "--checkpoint-every" in r.stdout


def _vocab_parallel_worker(rank, world, port, out):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    import torch.nn.functional as F

    from runtime.pipeline import loss_fn
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    full = torch.randn(2, 5, 12, generator=g) * 3
    targets = torch.randint(0, 12, (2, 5), generator=g)
    ref_x = full.clone().requires_grad_(True)
    ref = F.cross_entropy(ref_x.flatten(0, 1), targets.flatten(0, 1))
    ref.backward()
    x = distribute_tensor(full.clone(), mesh, [Shard(2)], src_data_rank=None)
    x.requires_grad_(True)
    loss = loss_fn(x, targets)
    loss.backward()
    ok = (abs(float(loss) - float(ref)) < 1e-5
          and torch.allclose(x.grad.full_tensor(), ref_x.grad, atol=1e-6)
          and not isinstance(loss, type(x)))
    if rank == 0:
        Path(out).write_text("ok" if ok else f"{float(loss)} vs {float(ref)}")
    # no rank tears its gloo connections down while another still talks on them (once, under
    # load, a rank aborted at exit: "terminate called without an active exception")
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_vocab_parallel_cross_entropy(tmp_path):
    """Logits split over the vocabulary on 3 ranks: the loss and its gradient equal the
    whole-vocabulary cross entropy's."""
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "r"
    mp.start_processes(_vocab_parallel_worker, args=(3, port, str(out)), nprocs=3,
                       start_method="spawn", join=True)
    assert out.read_text() == "ok"


def test_gqa_attention_core_matches_reference_and_saves_no_repeated_kv():
    """Grouped-query attention through SDPA's enable_gqa: the explicit softmax(q k^T/sqrt d) v
    with each kv head serving its query heads, and only q, k, v, the output and the row
    log-sum-exp saved for backward (no repeated k/v)."""
    import math

    from runtime.memory import StepMemory
    from runtime.model import AttentionCore
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 12, 16, generator=g, requires_grad=True)
    k = torch.randn(2, 2, 12, 16, generator=g, requires_grad=True)
    v = torch.randn(2, 2, 12, 16, generator=g, requires_grad=True)
    mem = StepMemory([], [], on_gpu=False)
    with mem.hooks():
        out = AttentionCore()(q, k, v)
    kr, vr = k.detach().repeat_interleave(4, 1), v.detach().repeat_interleave(4, 1)
    scores = q.detach() @ kr.transpose(-1, -2) / math.sqrt(16)
    scores = scores.masked_fill(torch.ones(12, 12, dtype=torch.bool).triu(1), float("-inf"))
    ref = scores.softmax(-1) @ vr
    assert torch.allclose(out, ref, atol=1e-5)
    nbytes = lambda *ts: sum(t.numel() * t.element_size() for t in ts)
    lse = 2 * 8 * 12 * 4
    assert mem.act_peak <= nbytes(q, k, v, out) + lse, (mem.act_peak, nbytes(q, k, v, out))
    out.sum().backward()
    assert k.grad.shape == k.shape


def test_norm_and_gated_mlp_save_only_their_inputs_and_differentiate_exactly():
    """RMSNorm and the gated MLP's act(a) * b save only their inputs (the cost model's terms)
    and their hand-written backwards equal autograd's numerical derivative."""
    import torch.nn.functional as F
    from runtime.model import _GatedActFn, _RMSNormFn
    x = torch.randn(2, 3, 8, dtype=torch.double, requires_grad=True)
    w = torch.randn(8, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: _RMSNormFn.apply(x, w, 1e-5), (x, w))
    a = torch.randn(3, 5, dtype=torch.double, requires_grad=True)
    b = torch.randn(3, 5, dtype=torch.double, requires_grad=True)
    for act in (F.silu, lambda t: F.gelu(t, approximate="tanh")):
        assert torch.autograd.gradcheck(lambda a, b: _GatedActFn.apply(a, b, act), (a, b))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        _RMSNormFn.apply(x, w, 1e-5)
        _GatedActFn.apply(a, b, F.silu)
    assert [t.shape for t in saved] == [x.shape, w.shape, a.shape, b.shape]


def test_autocast_keeps_the_residual_stream_and_activations_bf16():
    """Under bf16 autocast with fp32 parameters (the runtime's ZeRO 0/1 on CUDA; CPU autocast
    here), the model saves the bytes the cost model counts for bf16 activations, beside the bf16
    copies autocast makes of the linear weights (2 bytes per weight; before the embedding output
    was cast, the fp32 residual stream made it 1.7x per layer)."""
    from planner.catalog import get_model
    from planner.cost.memory import activation_bytes, head_input_bytes, logits_bytes
    from runtime.model import Transformer
    spec = get_model(str(ROOT / "examples/tiny-llama.json"))
    b, s = 2, 128
    model = Transformer(spec)
    saved = {}

    def pack(t):
        if not (isinstance(t, torch.nn.Parameter) or isinstance(t._base, torch.nn.Parameter)):
            st = t.untyped_storage()
            saved[st.data_ptr()] = st.nbytes()
        return t
    tokens = torch.randint(0, spec.vocab_size, (b, s))
    with torch.autocast("cpu", dtype=torch.bfloat16), \
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(tokens)
        torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens.flatten())
    weight_copies = 2 * sum(m.weight.numel() for m in model.modules()
                            if isinstance(m, torch.nn.Linear))
    # the head: the final norm's and output projection's inputs (bf16 under autocast) and the
    # loss's saved fp32 log-softmax
    planned = (spec.num_layers * activation_bytes(spec, b, s, 1, False, "none", True)
               + sum(head_input_bytes(spec, b, s, 1, False, True, 2.0))
               + logits_bytes(spec, b, s, 1))
    assert abs(sum(saved.values()) - weight_copies - planned) <= 0.10 * planned


# ---- the learning-rate schedule and clipping -----------------------------------------------

def test_lr_factor_warms_up_then_decays_to_the_minimum():
    """Linear warm-up over 4 of 20 steps, then cosine from the peak down toward 10%: the
    values of the closed form (torchtitan's linear_warmup_stable_decay, whose one stable step
    after the warm-up keeps the last step above the minimum)."""
    from runtime.optimizer import lr_factor
    f = [lr_factor(s, 20, 4, "cosine", 0.1) for s in range(20)]
    assert f[:5] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert f[12] == pytest.approx(0.1 + 0.9 * 0.5)      # half way through the 16 decay steps
    assert f[19] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * 15 / 16)))
    assert all(a > b for a, b in zip(f[4:], f[5:])) and f[19] > 0.1
    lin = [lr_factor(s, 20, 4, "linear", 0.0) for s in range(20)]
    assert lin[12] == pytest.approx(0.5) and lin[19] == pytest.approx(1 / 16)
    assert [lr_factor(s, 20, 4, "constant", 0.1) for s in (3, 10, 19)] == [1.0] * 3
    assert lr_factor(0, 20, 0, "cosine", 0.1) == 1.0     # no warm-up
    assert lr_factor(25, 20, 4, "cosine", 0.1) == pytest.approx(0.1)   # past the schedule


def test_run_options_default_when_absent_and_are_checked(tmp_path):
    from planner.errors import BadInput
    from planner.plan import RunOptions
    d = json.loads(Path(make_plan(tmp_path / "p.json")).read_text())
    assert d["run"] == RunOptions().to_dict()
    del d["run"]
    assert Plan.from_dict(d).run == RunOptions()
    assert RunOptions().warmup == 4 and RunOptions(steps=30, warmup_steps=40).warmup == 30
    assert RunOptions(steps=5, lr_schedule_steps=50).warmup == 10     # a fifth of the span
    d["run"] = {"warmup_steps": 3, "max_grad_norm": 0}
    assert Plan.from_dict(d).run == RunOptions(warmup_steps=3, max_grad_norm=0.0)
    for bad, msg in (({"lr_decay": "step"}, "run.lr_decay must be one of"),
                     ({"lr": -1}, "run.lr must be greater than 0"),
                     ({"warmup": 3}, "unknown key \"warmup\" (did you mean 'warmup_steps'?)")):
        d["run"] = bad
        with pytest.raises(BadInput, match=re.escape(msg)):
            Plan.from_dict(d)


def test_one_process_trains_as_torch_adamw_with_lambdalr_and_clip_grad_norm(tmp_path):
    """The runtime's run (8 micro-batches, warm-up 2 of 6 steps, cosine to 10%, clipping at
    1.7) against plain torch on the whole batch: torch.optim.AdamW, LambdaLR with the schedule
    written out here, torch.nn.utils.clip_grad_norm_ (which returns the norm before clipping).
    Clipping must act on some steps and not on others."""
    from planner.plan import RunOptions
    from runtime.data import local_batch, make_source
    from runtime.model import Transformer
    from runtime.parallelize import materialize_and_init
    run = RunOptions(steps=6, lr=3e-3, weight_decay=0.1, warmup_steps=2, lr_decay="cosine",
                     min_lr_ratio=0.1, max_grad_norm=1.7)
    path = make_plan(tmp_path / "p.json")
    d = json.loads(Path(path).read_text())
    d["run"] = run.to_dict()
    Path(path).write_text(json.dumps(d))
    r = run_runtime("--plan", path, "--metrics", tmp_path / "m")
    assert r.returncode == 0, r.stderr
    got = [l for l in _metrics(tmp_path / "m") if "step" in l]
    assert len(got) == 6

    torch.manual_seed(0)
    model = Transformer(LLAMA)
    materialize_and_init(model, LLAMA, 0, torch.device("cpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1)

    def schedule(s):
        if s < 2:
            return (s + 1) / 2
        return 0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * (s - 2) / 4))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    source = make_source("synthetic", LLAMA.vocab_size, 16, 0)
    clipped = []
    for step, g in enumerate(got):
        x, y = local_batch(source, step, 8, 1, 0)
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        opt.zero_grad()
        loss.backward()
        norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.7))
        assert g["lr"] == pytest.approx(sched.get_last_lr()[0], rel=1e-12), step
        opt.step()
        sched.step()
        assert g["loss"] == pytest.approx(loss.item(), rel=1e-4), step
        assert g["grad_norm"] == pytest.approx(norm, rel=1e-4), step
        assert g["clipped"] == (norm > 1.7), step
        clipped.append(norm > 1.7)
    assert any(clipped) and not all(clipped), clipped
