"""NVTX ranges for NVIDIA Nsight Systems: each step, each stage and each dense block, by name.

Off unless turned on (`gembench run --nsys OUT` sets GEMBENCH_NVTX=1 in the process it profiles),
so an ordinary run pays nothing. On, every step is a range "step", inside it one range per stage
named as in the stage table (data, sparse_forward, dense_forward, ...; on ranks input_dist,
embedding_lookup, ...), and every dense block (the workload's blocks()) a range named by its path in
the model, in its forward and again in its backward. The timed steps are bracketed by
torch.cuda.profiler.start() / stop(), so `nsys profile --capture-range=cudaProfilerApi` records
exactly them.

Ranges go to ``torch.cuda.nvtx`` on CUDA; tests hand in a recording stand-in with the same
range_push / range_pop.
"""

from __future__ import annotations

import contextlib
import os
import warnings

import torch
from torch import nn

ENV = "GEMBENCH_NVTX"
_sink = None  # where ranges go while on: torch.cuda.nvtx, or a test's stand-in


def enabled() -> bool:
    return _sink is not None


def enable(sink=None) -> None:
    """Turn ranges on: into ``sink`` (anything with range_push / range_pop), else torch.cuda.nvtx."""
    global _sink
    _sink = sink if sink is not None else torch.cuda.nvtx


def disable() -> None:
    global _sink
    _sink = None


def enable_from_env(device: torch.device) -> None:
    """On when GEMBENCH_NVTX=1 and the device is CUDA (NVTX means nothing to a CPU run)."""
    if os.environ.get(ENV) == "1" and device.type == "cuda":
        enable()


def push(name: str) -> None:
    if _sink is not None:
        _sink.range_push(name)


def pop() -> None:
    if _sink is not None:
        _sink.range_pop()


@contextlib.contextmanager
def span(name: str):
    push(name)
    try:
        yield
    finally:
        pop()


@contextlib.contextmanager
def captured():
    """Around the timed steps: the cudaProfilerApi capture range nsys records, when ranges are on."""
    on = enabled() and torch.cuda.is_available()
    if on:
        torch.cuda.profiler.start()
    try:
        yield
    finally:
        if on:
            torch.cuda.profiler.stop()


class StageRanges:
    """A stage clock's ranges: ``mark("start")`` opens the step and its first stage; the mark that
    ends a stage closes it and opens the next of ``stages``; the last one closes the step too.
    ``ranges`` names a stage's range where it is not the stage's own name: consecutive stages of
    one range name share one range (a one-call forward, whose sparse share the sparse timer's own
    ranges mark inside it)."""

    def __init__(self, stages, ranges: dict | None = None):
        self.stages = tuple(stages)
        self.names = [(ranges or {}).get(s, s) for s in self.stages]
        self.open = None

    def mark(self, name: str) -> None:
        if not enabled():
            return
        if name == "start":
            push("step")
            self.open = 0
            push(self.names[0])
            return
        if self.open is None:
            return
        self.open += 1
        if self.open == len(self.stages):
            self.open = None
            pop()
            pop()
        elif self.names[self.open] != self.names[self.open - 1]:
            pop()
            push(self.names[self.open])


def apply_block_ranges(model: nn.Module, paths) -> int:
    """Hooks on every dense block (``paths``: the workload's blocks()): a range named by its path
    around its forward and its backward. Only when ranges are on (the hooks cost a call per block,
    and torch.compile breaks its graph at each one: profile with --set compile=off for block ranges
    inside a compiled dense arch)."""
    if not enabled():
        return 0
    # the first block reads the dense features, which need no gradient: its backward range then
    # spans the gradient of its output, as torch warns; that is the range wanted
    warnings.filterwarnings(
        "ignore", message="Full backward hook is firing when gradients are computed with respect to module outputs"
    )
    blocks = [(path, model.get_submodule(path)) for path in paths]
    for path, block in blocks:
        block.register_forward_pre_hook(lambda m, args, _p=path: push(_p))
        block.register_forward_hook(lambda m, args, out: pop())
        block.register_full_backward_pre_hook(lambda m, grad, _p=path: push(_p))
        block.register_full_backward_hook(lambda m, gin, gout: pop())
    return len(blocks)
