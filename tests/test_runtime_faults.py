"""Runtime: nothing is lost (single process, fast).

A fresh run never touches another run's checkpoints; `--resume` continues only the run that
wrote the checkpoint; a damaged newest checkpoint falls back to the previous intact one and the
resumed curve equals the uninterrupted run's; an interrupted save keeps the previous copy;
unwritable outputs are refused before any work.
"""
import json
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from test_runtime import LLAMA, _refused, make_plan, run_runtime  # noqa: E402


def refused_here(capsys, *args, match, lines=1):
    """`python -m runtime ARGS` in this process (a refusal comes before torch.distributed):
    exit 2 and, as its last of `lines` stderr lines, one containing `match`."""
    from runtime.train import main
    capsys.readouterr()
    rc = main([str(a) for a in args])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, err
    assert len(err) == lines and "Traceback" not in "\n".join(err), err
    assert match in err[-1], err[-1]
    return err


def _steps(path):
    return {d["step"]: d for d in map(json.loads, Path(path).read_text().splitlines())
            if "step" in d}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted 3-step run checkpointing every step: (plan, metrics, checkpoint dir)."""
    d = tmp_path_factory.mktemp("ref")
    plan = make_plan(d / "p.json")
    r = run_runtime("--plan", plan, "--steps", 3, "--metrics", d / "m.jsonl",
                    "--checkpoint-dir", d / "ck", "--checkpoint-every", 1)
    assert r.returncode == 0, r.stderr
    m = _steps(d / "m.jsonl")
    assert sorted(m) == [1, 2, 3] and len({v["loss"] for v in m.values()}) == 3
    return plan, m, d / "ck"


def _copy_ckpts(src, dst):
    import shutil
    shutil.copytree(src, dst)
    return dst


def _shard(step_dir):
    shards = sorted(step_dir.glob("*.distcp"))
    assert shards, list(step_dir.iterdir())
    return shards[0]


def test_meta_lists_checksums_of_every_file(reference):
    from runtime.checkpoint import _hash_file, read_meta, verify
    _, _, ck = reference
    d = ck / "step-00000003"
    files = read_meta(d)["files"]
    on_disk = sorted(str(f.relative_to(d)) for f in d.rglob("*") if f.is_file()
                     and f.name not in ("meta.json", "COMPLETE"))
    assert sorted(files) == on_disk and ".metadata" in files and "rng/rank0.pt" in files
    for rel, want in files.items():
        assert want["sha256"] == _hash_file(d / rel)
    assert verify(d) is None


def test_fresh_run_refuses_a_used_checkpoint_dir(reference, tmp_path, capsys):
    plan, _, ck_ref = reference
    ck = _copy_ckpts(ck_ref, tmp_path / "ck")
    before = sorted(p.name for p in ck.iterdir())
    refused_here(capsys, "--plan", plan, "--steps", 1, "--checkpoint-dir", ck, "--seed", 5,
                 match=f"--checkpoint-dir {ck} already holds checkpoints (step-00000003 newest)")
    assert sorted(p.name for p in ck.iterdir()) == before
    # with the flag the old run's checkpoints go and only the new run's remain
    r = run_runtime("--plan", plan, "--steps", 1, "--checkpoint-dir", ck, "--seed", 5,
                    "--overwrite-checkpoints")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in ck.iterdir()) == ["step-00000001"]
    assert json.loads((ck / "step-00000001" / "meta.json").read_text())["seed"] == 5


@pytest.mark.parametrize("extra,match", [
    (["--seed", "1"], "seed 0 vs 1"),
    (["--data", "DATA"], "data 'synthetic' vs 't.npy (1128 bytes)'"),
])
def test_resume_checks_the_run_identity(reference, tmp_path, capsys, extra, match):
    """(Another layout of the same run resumes: tests/test_runtime_dist.py reshards.)"""
    import numpy as np
    plan, want, ck_ref = reference
    ck = _copy_ckpts(ck_ref, tmp_path / "ck")
    np.save(tmp_path / "t.npy", (np.arange(250) % 128).astype(np.int32))
    extra = [str(tmp_path / "t.npy") if a == "DATA" else a for a in extra]
    refused_here(capsys, "--plan", plan, "--steps", 4, "--checkpoint-dir", ck, "--resume",
                 *extra, match=f"cannot resume {ck / 'step-00000003'}: it was written by another "
                               f"run ({match}; checkpoint's vs this run's)")


def test_resume_refuses_another_global_batch(reference, tmp_path, capsys):
    from planner.plan import Batch
    plan, _, ck_ref = reference
    ck = _copy_ckpts(ck_ref, tmp_path / "ck")
    from planner.plan import Plan
    p = Plan.load(plan)
    p.batch = Batch(seq_len=16, global_batch_size=16, micro_batch_size=1, num_microbatches=16)
    p.validate()
    p.save(tmp_path / "p16.json")
    refused_here(capsys, "--plan", tmp_path / "p16.json", "--steps", 4, "--checkpoint-dir", ck,
                 "--resume", match="written by another run (global_batch_size 8 vs 16; "
                                   "checkpoint's vs this run's)")


def _damage(newest, damage):
    f = _shard(newest)
    data = bytearray(f.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
        f.write_bytes(bytes(data))
    elif damage == "truncate":
        f.write_bytes(bytes(data[:-7]))
    elif damage == "drop_rng":
        (newest / "rng" / "rank0.pt").unlink()
    else:
        (newest / "meta.json").write_text("{\"step\": 3")


@pytest.mark.parametrize("damage,why", [("flip", "fails its sha256 checksum"),
                                        ("truncate", "bytes, meta.json says"),
                                        ("drop_rng", "rng/rank0.pt is missing"),
                                        ("meta", "meta.json is missing or unreadable")])
def test_damage_is_detected(reference, tmp_path, damage, why):
    from runtime.checkpoint import choose
    _, _, ck_ref = reference
    ck = _copy_ckpts(ck_ref, tmp_path / "ck")
    _damage(ck / "step-00000003", damage)
    warned = []
    assert choose(ck, warn=warned.append) == (2, ck / "step-00000002")
    assert len(warned) == 1 and why in warned[0], warned


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_damaged_newest_checkpoint_falls_back(reference, tmp_path, damage):
    """The newest checkpoint is damaged: one warning line, resume from the one before, and
    the re-run step's loss equals the uninterrupted run's."""
    plan, want, ck_ref = reference
    ck = _copy_ckpts(ck_ref, tmp_path / "ck")
    newest = ck / "step-00000003"
    _damage(newest, damage)
    r = run_runtime("--plan", plan, "--steps", 3, "--checkpoint-dir", ck, "--resume",
                    "--metrics", tmp_path / "m.jsonl")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith(f"runtime: warning: checkpoint {newest} is damaged ("), lines[0]
    assert lines[0].endswith("falling back to an older one"), lines[0]
    assert f"resumed from {ck / 'step-00000002'} (step 2)" in r.stdout
    got = _steps(tmp_path / "m.jsonl")
    assert sorted(got) == [3]
    assert got[3]["loss"] == pytest.approx(want[3]["loss"], rel=1e-6)
    assert got[3]["grad_norm"] == pytest.approx(want[3]["grad_norm"], rel=1e-6)
    # the damaged copy was moved aside and step 3 written again, intact
    from runtime.checkpoint import verify
    assert (ck / "step-00000003.damaged").is_dir() and verify(ck / "step-00000003") is None


def test_all_checkpoints_damaged_is_refused(reference, tmp_path, capsys):
    plan, _, ck_ref = reference
    ck = _copy_ckpts(ck_ref, tmp_path / "ck")
    for d in ck.iterdir():
        f = _shard(d)
        b = bytearray(f.read_bytes())
        b[100] ^= 0x01
        f.write_bytes(bytes(b))
    lines = refused_here(capsys, "--plan", plan, "--steps", 4, "--checkpoint-dir", ck,
                         "--resume", lines=4,      # 3 warnings + the refusal
                         match=f"runtime: no intact checkpoint in {ck}: all 3 fail their checks")
    assert all(" is damaged (" in l for l in lines[:3]), lines


def test_interrupted_replacement_keeps_the_previous_copy(tmp_path, monkeypatch):
    """A save of a step that already exists is killed after moving the old copy aside and
    before renaming the new one in: the old copy is still found, intact, and loads."""
    import torch.distributed as dist

    from runtime import checkpoint as ckpt
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        opt = torch.optim.AdamW(model.parameters())
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        # the metadata a run writes (runtime.train: run identity + parallelism)
        meta = {"model": LLAMA.to_dict(), "seed": 0, "data": "synthetic",
                "parallelism": {"tp": 1, "pp": 1, "dp": 1}}
        ckpt.save(tmp_path, 1, ckpt.TrainState([model], [opt], False), meta)
        saved = {k: v.clone() for k, v in model.state_dict().items()}
        with torch.no_grad():
            model.weight.add_(1.0)
        real = os.rename

        def rename(src, dst):
            if Path(src).name == "step-00000001.tmp":      # the new copy, renamed in
                raise KeyboardInterrupt("killed")
            real(src, dst)
        monkeypatch.setattr(ckpt.os, "rename", rename)
        with pytest.raises(KeyboardInterrupt):
            ckpt.save(tmp_path, 1, ckpt.TrainState([model], [opt], False), meta)
        monkeypatch.setattr(ckpt.os, "rename", real)
        assert not (tmp_path / "step-00000001").exists()
        step, path = ckpt.choose(tmp_path)
        assert (step, path.name) == (1, "step-00000001.old")
        fresh = torch.nn.Linear(4, 3)
        ckpt.TrainState([fresh], [torch.optim.AdamW(fresh.parameters())], False).load_from(
            str(path))
        for k, v in fresh.state_dict().items():
            assert torch.equal(v, saved[k]), k
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("which", ["ckpt_under_file", "metrics_under_file", "metrics_is_dir"])
def test_unwritable_outputs_are_refused_before_work(tmp_path, capsys, which):
    plan = make_plan(tmp_path / "p.json")
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    (tmp_path / "a-dir").mkdir()
    args = {"ckpt_under_file": ["--checkpoint-dir", blocker / "ck"],
            "metrics_under_file": ["--metrics", blocker / "m.jsonl"],
            "metrics_is_dir": ["--metrics", tmp_path / "a-dir"]}[which]
    match = {"ckpt_under_file": f"--checkpoint-dir {blocker / 'ck'} is not writable",
             "metrics_under_file": f"the directory of --metrics {blocker} is not writable",
             "metrics_is_dir": f"--metrics {tmp_path / 'a-dir'} is a directory"}[which]
    refused_here(capsys, "--plan", plan, "--steps", 1000, *args, match=match)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_read_only_checkpoint_dir_refused(tmp_path):
    plan = make_plan(tmp_path / "p.json")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        _refused(run_runtime("--plan", plan, "--checkpoint-dir", ro), "is not writable")
    finally:
        ro.chmod(0o700)


# ---- the checkpoint's meta.json: the runtime's own schema (runtime.checkpoint.meta_schema) ----

def test_checkpoint_meta_is_checked_by_the_runtime(tmp_path):
    """A well-formed meta.json reads back; a wrong type, an unknown key or an oversized file is
    one BadInput line naming the file. The planner's filecheck module no longer knows the format."""
    from planner import filecheck
    from planner.catalog import get_model
    from planner.errors import BadInput
    from runtime.checkpoint import META_MAX_BYTES, read_meta
    meta = {"model": get_model("llama8b").to_dict(),
            "parallelism": {"tp": 1, "pp": 1, "dp": 2, "zero_stage": 0,
                            "sequence_parallel": False, "vpp": 1, "schedule": "1f1b",
                            "recompute": "none", "cp": 1, "rank_order": ["pp", "dp", "tp"]},
            "seed": 0, "data": None, "step": 5, "world_size": 2}
    f = tmp_path / "meta.json"
    f.write_text(json.dumps(meta))
    assert read_meta(tmp_path)["step"] == 5
    assert read_meta(f)["world_size"] == 2
    for bad, match in (({**meta, "step": "5"}, "step must be an integer"),
                       ({**meta, "stepp": 5}, 'unknown key "stepp"'),
                       ({k: v for k, v in meta.items() if k != "world_size"},
                        "missing field 'world_size'")):
        f.write_text(json.dumps(bad))
        with pytest.raises(BadInput, match=match) as e:
            read_meta(tmp_path)
        assert str(f) in str(e.value) and "\n" not in str(e.value)
    f.write_text(" " * (META_MAX_BYTES + 1))
    with pytest.raises(BadInput, match="checkpoint metadata"):
        read_meta(tmp_path)
    assert not hasattr(filecheck, "read_checkpoint_meta")
    assert "meta.json" not in Path(filecheck.__file__).read_text()


# ---- a full disk: one line, exit 1, the last good checkpoint kept ----------------------------

def _one_line_failure(r, *needles):
    assert r.returncode == 1, (r.returncode, r.stderr[-3000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def test_full_disk_writing_metrics_is_one_line(tmp_path):
    """/dev/full refuses every write with ENOSPC: the run stops after its first step's line
    with one line on stderr naming the file."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    plan = make_plan(tmp_path / "p.json")
    r = run_runtime("--plan", plan, "--steps", 3, "--metrics", "/dev/full")
    _one_line_failure(r, "runtime: no space left on device writing --metrics /dev/full")
    assert "step     2" not in r.stdout


def _tmpfs_works():
    import shutil
    import subprocess
    if shutil.which("unshare") is None:
        return False
    r = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                        "d=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs $d"],
                       capture_output=True, timeout=30)
    return r.returncode == 0


def test_full_disk_while_checkpointing_keeps_the_last_good_one(reference, tmp_path):
    """A real full file system (a tmpfs with room for one checkpoint, in a user + mount
    namespace): the resumed run's next checkpoint cannot be written. One line on stderr, exit 1,
    no partial copy left; the step-1 checkpoint is intact and a later resume from it repeats
    the uninterrupted run's losses exactly."""
    import subprocess
    import sys
    from runtime.checkpoint import verify
    if not _tmpfs_works():
        pytest.skip("no unprivileged user/mount namespaces here (unshare)")
    plan, want, ck = reference
    one = ck / "step-00000001"
    size = sum(f.stat().st_size for f in one.rglob("*") if f.is_file())
    mnt, out = tmp_path / "disk", tmp_path / "out"
    mnt.mkdir()
    out.mkdir()
    root = Path(__file__).resolve().parents[1]
    script = (f"mount -t tmpfs -o size={size * 3 // 2 + 8192} tmpfs {mnt} && "
              f"mkdir {mnt}/ck && cp -r {one} {mnt}/ck/ && "
              f"{sys.executable} -m runtime --plan {plan} --steps 3 --checkpoint-dir {mnt}/ck "
              f"--checkpoint-every 1 --resume --metrics {out}/m.jsonl "
              f"> {out}/stdout 2> {out}/stderr; echo $? > {out}/rc; "
              f"cp -r {mnt}/ck {out}/ck")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT"):
        env.pop(k, None)
    r = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
                       cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    run = subprocess.CompletedProcess([], int((out / "rc").read_text()),
                                      (out / "stdout").read_text(), (out / "stderr").read_text())
    _one_line_failure(run, "runtime: no space left on device writing checkpoint "
                           f"{mnt}/ck/step-00000002",
                      f"the last good checkpoint, {mnt}/ck/step-00000001, is kept")
    assert "resumed from" in run.stdout and "step     2" in run.stdout
    assert sorted(p.name for p in (out / "ck").iterdir()) == ["step-00000001"]
    assert verify(out / "ck" / "step-00000001") is None
    r = run_runtime("--plan", plan, "--steps", 3, "--checkpoint-dir", out / "ck", "--resume",
                    "--metrics", tmp_path / "m.jsonl")
    assert r.returncode == 0, r.stderr
    assert f"resumed from {out / 'ck' / 'step-00000001'}" in r.stdout
    got = _steps(tmp_path / "m.jsonl")
    assert sorted(got) == [2, 3]
    for s in (2, 3):
        assert got[s]["loss"] == want[s]["loss"] and got[s]["grad_norm"] == want[s]["grad_norm"]


_FULL_ON_ONE_RANK = r"""
import errno, io, os, pathlib, sys
# the file system of rank FULL_RANK fills up while it writes checkpoint FULL_STEP: its
# torch.distributed.checkpoint shard files accept no byte (ENOSPC when the buffer is written
# out, as a real file system's write(2) fails); every other rank and checkpoint is untouched
real_open = pathlib.Path.open
class FullFile(io.FileIO):
    def write(self, b):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
def full_open(self, mode="r", *a, **kw):
    if (os.environ["RANK"] == os.environ["FULL_RANK"] and "w" in mode
            and f"step-{int(os.environ['FULL_STEP']):08d}.tmp" in str(self)):
        return io.BufferedWriter(FullFile(str(self), "w"))
    return real_open(self, mode, *a, **kw)
pathlib.Path.open = full_open
from runtime.train import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_full_disk_on_one_rank_stops_every_rank_in_one_line(reference, tmp_path):
    """dp 2 under torchrun; rank 1's disk fills while it writes the step-2 checkpoint: both
    ranks stop at the same point (no hang until --timeout), rank 0 prints one line naming the
    checkpoint and the kept one, no partial copy is left, and the step-1 checkpoint resumes."""
    import subprocess
    import sys
    from planner.plan import Plan
    from runtime.checkpoint import verify
    from test_runtime import ROOT
    _, want, _ = reference
    plan = make_plan(tmp_path / "p.json", dp=2, zero_stage=1)
    wrapper = tmp_path / "full_on_one_rank.py"
    wrapper.write_text(_FULL_ON_ONE_RANK)
    ck = tmp_path / "ck"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "FULL_RANK": "1",
           "FULL_STEP": "2"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "2"]
    r = subprocess.run(torchrun + [str(wrapper), "--plan", str(plan), "--steps", "3",
                                   "--checkpoint-dir", str(ck), "--checkpoint-every", "1",
                                   "--timeout", "60"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode != 0
    ours = [l for l in r.stderr.splitlines() if l.startswith("runtime:")]
    assert ours == ["runtime: no space left on device writing checkpoint "
                    f"{ck}/step-00000002; the last good checkpoint, {ck}/step-00000001, "
                    "is kept"], r.stderr[-3000:]
    assert "runtime/" not in r.stderr     # no traceback from our code (torchrun reports its
    #                                       children's exit status on its own)
    assert sorted(p.name for p in ck.iterdir()) == ["step-00000001"]
    assert verify(ck / "step-00000001") is None
    # a one-process plan of the same run resumes it (checkpoints reshard across layouts)
    one = make_plan(tmp_path / "p1.json")
    assert Plan.load(one).batch.global_batch_size == Plan.load(plan).batch.global_batch_size
    r = run_runtime("--plan", one, "--steps", 3, "--checkpoint-dir", ck, "--resume",
                    "--metrics", tmp_path / "m.jsonl")
    assert r.returncode == 0, r.stderr
    assert f"resumed from {ck / 'step-00000001'}" in r.stdout
    got = _steps(tmp_path / "m.jsonl")
    assert sorted(got) == [2, 3]
    for s in (2, 3):
        assert got[s]["loss"] == pytest.approx(want[s]["loss"], rel=1e-4)
