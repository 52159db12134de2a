"""Timing helpers: warm-up, repeats, median and spread; CUDA events on GPUs."""
from __future__ import annotations

import statistics
import time

import torch


class Timer:
    """Times a region on `device`: CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def start(self):
        if self.cuda:
            self._e0 = torch.cuda.Event(enable_timing=True)
            self._e1 = torch.cuda.Event(enable_timing=True)
            self._e0.record()
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> float:
        """Seconds since start()."""
        if self.cuda:
            self._e1.record()
            self._e1.synchronize()
            return self._e0.elapsed_time(self._e1) / 1e3
        return time.perf_counter() - self._t0


def summarize(samples: list) -> dict:
    """Median and spread of a list of seconds."""
    xs = sorted(samples)
    n = len(xs)

    def q(p):
        if n == 1:
            return xs[0]
        i = p * (n - 1)
        lo = int(i)
        hi = min(lo + 1, n - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (i - lo)

    return {"median": statistics.median(xs), "p10": q(0.1), "p90": q(0.9), "min": xs[0],
            "max": xs[-1], "n": n, "samples": [float(f"{x:.6g}") for x in samples]}


def merge(a: dict, b: dict) -> dict:
    """The summary of two summaries' samples together."""
    return summarize(a["samples"] + b["samples"])


def time_fn(fn, device, warmup: int, repeats: int, budget_s: float | None = None) -> dict:
    """Median and spread of `fn()`'s time; stops early after `budget_s` seconds of repeats
    (at least 3 kept)."""
    timer = Timer(device)
    for _ in range(warmup):
        fn()
    timer.sync()
    out, spent = [], 0.0
    for i in range(repeats):
        timer.start()
        fn()
        dt = timer.stop()
        out.append(dt)
        spent += dt
        if budget_s is not None and spent > budget_s and i >= 2:
            break
    return summarize(out)
