"""The staged training step: one step cut into named stages, each timed on a synchronised device.

Stages follow the data through one step: data (host batch to device), sparse_forward
(embedding lookups, and on several ranks their all-to-alls), dense_forward, loss, backward,
optimizer. On CUDA each boundary records an event and the step synchronises once at its end,
so timing adds no stall inside the step; on CPU ops are synchronous and a clock read is enough.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from gembench.models.heads import multitask_loss

STAGES = ("data", "sparse_forward", "dense_forward", "loss", "backward", "optimizer")


class StageClock:
    """Boundary timestamps of one step; ``durations()`` gives seconds per stage."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, object]] = []

    def mark(self, name: str) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append((name, event))
        else:
            self.marks.append((name, time.perf_counter()))

    def durations(self) -> dict[str, float]:
        if self.cuda:
            self.marks[-1][1].synchronize()
            gap = lambda a, b: a.elapsed_time(b) / 1e3  # noqa: E731  (ms -> s)
        else:
            gap = lambda a, b: b - a  # noqa: E731
        return {
            name: gap(self.marks[i - 1][1], t)
            for i, (name, t) in enumerate(self.marks)
            if i > 0
        }


class NoClock:
    """Same interface, measures nothing: the untimed reference loop for timing overhead."""

    def mark(self, name: str) -> None:
        pass

    def durations(self) -> dict[str, float]:
        return {}


@dataclass
class TrainState:
    """What a stack hands the step: a model split in two halves, an optimizer, a precision."""

    model: torch.nn.Module  # has embed(batch) and dense(batch, embedded)
    optimizers: list
    autocast: object  # a context manager factory: () -> context
    device: torch.device

    def zero_grad(self) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)


def train_step(state: TrainState, batch, clock) -> torch.Tensor:
    """One training step, marking each stage's end on ``clock``. Returns the loss (detached)."""
    clock.mark("start")
    batch = batch.to(state.device, non_blocking=True)
    clock.mark("data")
    with state.autocast():
        embedded = state.model.embed(batch)
        clock.mark("sparse_forward")
        logits = state.model.dense(batch, embedded)
        clock.mark("dense_forward")
        loss = multitask_loss(logits, batch.labels)
    clock.mark("loss")
    loss.backward()
    clock.mark("backward")
    for opt in state.optimizers:
        opt.step()
    state.zero_grad()
    clock.mark("optimizer")
    return loss.detach()


@dataclass
class StepSamples:
    """Every timed step's wall time, stage times and loss; warm-up steps are not kept."""

    step_s: list[float] = field(default_factory=list)
    stages: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in STAGES})
    loss: list[float] = field(default_factory=list)


def run_steps(state: TrainState, batches, steps: int, warmup: int, timed: bool = True,
              progress=None) -> StepSamples:
    """Run ``warmup`` discarded steps then ``steps`` measured ones over ``batches`` (cycled).

    ``batches`` is a list of host batches prepared beforehand, as a prefetching loader would
    hand them over; the data stage is the copy to the device.
    """
    samples = StepSamples()
    sync = torch.cuda.synchronize if state.device.type == "cuda" else (lambda: None)
    losses = []  # detached loss tensors, read after the loop: a read in it syncs every step
    for i in range(warmup + steps):
        clock = StageClock(state.device) if timed else NoClock()
        sync()
        start = time.perf_counter()
        loss = train_step(state, batches[i % len(batches)], clock)
        durations = clock.durations()
        sync()
        elapsed = time.perf_counter() - start
        if i >= warmup:
            samples.step_s.append(elapsed)
            losses.append(loss.detach())
            for stage, seconds in durations.items():
                samples.stages[stage].append(seconds)
        if progress is not None:
            progress(i + 1, warmup + steps, elapsed)
    samples.loss = [float(x) for x in losses]
    return samples
