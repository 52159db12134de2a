"""Memory of one training step, measured from the tensors (the first step's `measured_memory_gib`).

Categories, each the largest value seen at the sampling points (at the start of the forward of
every FSDP2-wrapped module, once FSDP has gathered its parameters; after every micro-batch's
backward; after the optimizer step), counted by storage (a storage shared by several tensors,
e.g. a tied weight, counts once; a storage FSDP has freed counts zero):

* `params`: the local parameter shards plus, under FSDP2 (ZeRO 2/3), the unsharded parameters it
  holds at that moment;
* `grads`: the local gradients plus FSDP2's unsharded (accumulated) gradients;
* `optimizer`: the AdamW state tensors;
* `activations`: the peak bytes of tensors saved for backward (through
  `torch.autograd.graph.saved_tensors_hooks`, live until autograd frees them), parameters
  excluded; recomputed layers save only what activation checkpointing keeps; and the outputs
  a `torch.distributed.pipelining` stage keeps for its backward (`fwd_cache`, from a
  micro-batch's forward to its backward: the last stage's logits, another stage's hidden
  states), which no saved-tensor hook sees;
* `peak`: the process's allocator peak (`torch.cuda.max_memory_allocated` on GPUs, the max RSS of
  the process on CPU, which includes the libraries).
"""
from __future__ import annotations

import contextlib
import resource
import weakref

import torch
from torch.distributed.tensor import DTensor

GIB = 2 ** 30


def _storage(t):
    """(key, bytes) of the memory behind `t`: its storage, or for a wrapper tensor without one
    (a DTensor's local part may be such a wrapper, e.g. an async collective's result) the
    wrapped tensor's."""
    if isinstance(t, DTensor):
        t = t.to_local()
    inner = getattr(t, "elem", None)          # funcol's AsyncCollectiveTensor
    if isinstance(inner, torch.Tensor):
        t = inner
    try:
        s = t.untyped_storage()
        return s.data_ptr(), s.nbytes()
    except (RuntimeError, NotImplementedError):
        return ("tensor", id(t)), t.numel() * t.element_size()


def _sum(tensors) -> int:
    seen = {}
    for t in tensors:
        if t is None:
            continue
        ptr, n = _storage(t)
        if n and ptr:
            seen[ptr] = n
    return sum(seen.values())


def _fsdp_params(parts):
    out = []
    for part in parts:
        for m in part.modules():
            state = getattr(m, "_get_fsdp_state", None)
            if state is None:
                continue
            group = state()._fsdp_param_group
            if group is not None:
                out += group.fsdp_params
    return out


class _Saved:
    __slots__ = ("t", "__weakref__")

    def __init__(self, t):
        self.t = t


class StepMemory:
    """Samples a rank's memory during one step; `hooks()` is the saved-tensor context."""

    def __init__(self, parts, optims, on_gpu: bool):
        self.parts, self.optims, self.on_gpu = parts, optims, on_gpu
        self.fsdp = _fsdp_params(parts)
        self.peak = {"params": 0, "grads": 0, "optimizer": 0}
        self.live = {}              # storage ptr -> [count, bytes]
        self.live_bytes = 0
        self.act_peak = 0
        self.param_ptrs = set()
        self.stages = ()            # pipeline stages whose kept outputs count (train.py)

    def _params(self):
        ts = [p for part in self.parts for p in part.parameters()]
        for fp in self.fsdp:
            ts.append(fp.sharded_param)
            u = getattr(fp, "_unsharded_param", None)
            if u is not None:
                ts.append(u)
        return ts

    def _grads(self):
        ts = [p.grad for part in self.parts for p in part.parameters()]
        for fp in self.fsdp:
            ts.append(fp.sharded_param.grad)
            u = getattr(fp, "_unsharded_param", None)
            if u is not None:
                ts.append(u.grad)
            ts.append(getattr(fp, "unsharded_accumulated_grad", None))
        return ts

    def sample(self):
        self.act_peak = max(self.act_peak, self.live_bytes + self._kept_outputs())
        now = {"params": _sum(self._params()), "grads": _sum(self._grads()),
               "optimizer": _sum(t for opt in self.optims if opt is not None
                                 for st in opt.state.values() for t in st.values()
                                 if isinstance(t, torch.Tensor) and t.dim() > 0)}
        for k, v in now.items():
            self.peak[k] = max(self.peak[k], v)

    # -- saved activations ---------------------------------------------------------------
    def _pack(self, t):
        if isinstance(t, torch.nn.Parameter) or isinstance(t._base, torch.nn.Parameter):
            return t
        try:
            ptr, n = _storage(t)
        except RuntimeError:
            # no accessible storage (seen: DTensor views of the tied output weight while
            # torch.distributed.pipelining infers shapes before the first step): not counted
            return t
        if ptr in self.param_ptrs or not n:
            return t
        entry = self.live.setdefault(ptr, [0, n])
        if entry[0] == 0:
            self.live_bytes += n
            self.act_peak = max(self.act_peak, self.live_bytes + self._kept_outputs())
        entry[0] += 1
        # keep a detached alias (same storage and version counter, no grad_fn): holding `t`
        # itself would tie a saved output to its own autograd node in a cycle that only a
        # backward breaks, so a graph never backpropagated (torch.distributed.pipelining's
        # first-step shape inference) would stay alive and be counted
        holder = _Saved(t.detach())
        weakref.finalize(holder, self._release, ptr)
        return holder

    def _kept_outputs(self) -> int:
        """Bytes of the stage outputs the pipeline keeps for backward that no saved tensor
        already holds (torch.distributed.pipelining stage.fwd_cache: (outputs, inputs) per
        micro-batch from its forward to its backward)."""
        seen = {}
        for st in self.stages:
            for outputs, _ in getattr(st, "fwd_cache", {}).values():
                for t in outputs:
                    if isinstance(t, torch.Tensor):
                        ptr, n = _storage(t)
                        if n and ptr and ptr not in self.live and ptr not in self.param_ptrs:
                            seen[ptr] = n
        return sum(seen.values())

    def _release(self, ptr):
        entry = self.live.get(ptr)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.live_bytes -= entry[1]
            del self.live[ptr]

    @staticmethod
    def _unpack(x):
        return x.t if isinstance(x, _Saved) else x

    @contextlib.contextmanager
    def hooks(self):
        """Saved-tensor hooks, and a sample as each FSDP2 module's forward starts (its
        parameters gathered), for the duration of the step."""
        self.param_ptrs = {_storage(t)[0] for t in self._params()}
        handles = [m.register_forward_pre_hook(lambda *_: self.sample())
                   for part in self.parts for m in part.modules()
                   if hasattr(m, "_get_fsdp_state")]
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                yield self
        finally:
            for h in handles:
                h.remove()

    def result(self, pp_rank: int) -> dict:
        if self.on_gpu:
            peak = torch.cuda.max_memory_allocated()
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return {"pp_rank": pp_rank, **{k: v / GIB for k, v in self.peak.items()},
                "activations": self.act_peak / GIB, "peak": peak / GIB}
