"""The staged training step: one step cut into named stages, each timed on a synchronised device.

Stages follow the data through one step: data (host batch to device), sparse_forward (the time
inside the workload's sparse modules: embedding lookups, and on several ranks their all-to-alls),
dense_forward (the rest of the forward), loss, backward, optimizer. On CUDA each boundary records
an event and the step synchronises once at its end, so timing adds no stall inside the step; on
CPU ops are synchronous and a clock read is enough.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field

import torch

from gembench.harness.train import nvtx

STAGES = ("data", "sparse_forward", "dense_forward", "loss", "backward", "optimizer")
# NVTX: the forward is one call of the workload's, one range; the sparse timer's ranges mark its
# sparse share inside it (workloads.SparseTimer)
FORWARD_RANGE = {"sparse_forward": "forward", "dense_forward": "forward"}


class StageClock:
    """Boundary timestamps of one step; ``durations()`` gives seconds per stage. ``observer``, when
    set (the counted step's op recorder), is told each stage's end as it is marked."""

    observer = None

    def __init__(self, device: torch.device, stages=STAGES, ranges: dict | None = None):
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, object]] = []
        self.splits: list = []
        # NVTX ranges by stage, when on (harness/train/nvtx.py); the one-process stages' forward is one
        ranges = FORWARD_RANGE if ranges is None and tuple(stages) == STAGES else ranges
        self.ranges = nvtx.StageRanges(stages, ranges)

    def mark(self, name: str) -> None:
        self.ranges.mark(name)
        if StageClock.observer is not None:
            StageClock.observer(name)
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append((name, event))
        else:
            self.marks.append((name, time.perf_counter()))

    def split(self, first: str, second: str, seconds) -> None:
        """Of the time marked to ``first`` and ``second`` together, ``seconds()`` (read when the
        durations are, after the step's end) is ``first``'s and the rest ``second``'s: stages that
        interleave inside one call (the sparse and dense forward of a workload's forward)."""
        self.splits.append((first, second, seconds))

    def durations(self) -> dict[str, float]:
        if self.cuda:
            self.marks[-1][1].synchronize()
            gap = lambda a, b: a.elapsed_time(b) / 1e3  # noqa: E731  (ms -> s)
        else:
            gap = lambda a, b: b - a  # noqa: E731
        out = {name: gap(self.marks[i - 1][1], t) for i, (name, t) in enumerate(self.marks) if i > 0}
        for first, second, seconds in self.splits:
            both = out[first] + out[second]
            out[first] = min(seconds(), both)
            out[second] = both - out[first]
        return out


class NoClock:
    """Same interface, measures nothing: the untimed reference loop for timing overhead."""

    def mark(self, name: str) -> None:
        pass

    def durations(self) -> dict[str, float]:
        return {}


@dataclass
class TrainState:
    """What a stack hands the step: the workload and its model, the optimizers, a precision, and
    the timer of the model's sparse part."""

    model: torch.nn.Module  # the workload's model, the stack applied
    optimizers: list
    autocast: object  # a context manager factory: () -> context
    device: torch.device
    workload: object  # gembench.workload.Workload: its forward and loss
    timer: object  # workloads.SparseTimer over the model's sparse part
    dense_params: list  # every parameter but the tables'

    def zero_grad(self) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)


def losses(workload, output, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(the trained loss, the per-task losses (tasks,)): a workload's loss is a scalar or a vector
    of per-task losses whose mean is trained."""
    per_task = workload.loss(output, batch)
    if per_task.dim() == 0:
        return per_task, per_task.reshape(1)
    return per_task.mean(), per_task


def train_step(state: TrainState, batch, clock) -> torch.Tensor:
    """One training step, marking each stage's end on ``clock``: the forward is one call of the
    workload's, split by the sparse timer into sparse_forward and the rest (dense_forward).

    Returns the detached per-task losses, shape (tasks,); the trained loss is their mean.
    """
    workload, timer = state.workload, state.timer
    clock.mark("start")
    batch = batch.to(state.device, non_blocking=True)
    clock.mark("data")
    timer.take()
    with state.autocast():
        try:
            output = workload.forward(state.model, batch)
        except RuntimeError as err:  # which part of the one-call forward failed (an out-of-memory report)
            err.stage = "sparse_forward" if timer.inside() else "dense_forward"
            raise
        clock.mark("sparse_forward")
        clock.mark("dense_forward")  # the whole forward; its sparse share moved back below
        loss, per_task = losses(workload, output, batch)
    clock.mark("loss")
    split = getattr(clock, "split", None)
    if split is not None:
        split("sparse_forward", "dense_forward", timer.take)
    loss.backward()
    clock.mark("backward")
    for opt in state.optimizers:
        opt.step()
    state.zero_grad()
    clock.mark("optimizer")
    return per_task.detach()


def out_of_memory(err: BaseException) -> BaseException | None:
    """The torch.OutOfMemoryError in ``err``'s chain (torch.compile wraps errors it meets), if any."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, torch.OutOfMemoryError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def failing_stage(clock) -> str:
    """The stage a step was in when it raised: the one after the last marked boundary."""
    done = len(getattr(clock, "marks", ())) - 1  # marks: "start", then one per finished stage
    return STAGES[done] if 0 <= done < len(STAGES) else "step"


@dataclass
class StepSamples:
    """Every timed step's wall time, stage times and loss; warm-up steps are not kept."""

    step_s: list[float] = field(default_factory=list)
    stages: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in STAGES})
    loss: list[float] = field(default_factory=list)  # NaN / inf where training diverged
    task_loss: list[list[float]] = field(default_factory=list)  # per step: one loss per task

    def extend(self, more: "StepSamples") -> None:
        """``more``'s steps after these: one run measured in slices (--ab's rounds)."""
        self.step_s += more.step_s
        self.loss += more.loss
        self.task_loss += more.task_loss
        for stage, seconds in more.stages.items():
            self.stages.setdefault(stage, []).extend(seconds)


def divergence(loss: list[float], task_loss: list[list[float]], first_step: int = 0) -> dict | None:
    """The first step whose loss is not finite, as result["diverged"]; None when all are finite.

    ``{"step": first_step + index, "task": "task<k>" (the first non-finite task) or None,
    "loss": "nan" / "inf" / "-inf"}``: a diverged run still has step times, but they time
    arithmetic on NaNs (or a skipped optimizer), not training, so its MFU must not pass a gate.
    """
    for i, value in enumerate(loss):
        if not math.isfinite(value):
            tasks = task_loss[i] if i < len(task_loss) else []
            bad = next((k for k, v in enumerate(tasks) if not math.isfinite(v)), None)
            return {
                "step": first_step + i,
                "task": None if bad is None else f"task{bad}",
                "loss": str(tasks[bad] if bad is not None else value),
            }
    return None


def finite_or_none(values: list) -> list:
    """JSON has no NaN: non-finite losses are written as null (result["diverged"] says why)."""
    return [finite_or_none(v) if isinstance(v, list) else (v if math.isfinite(v) else None) for v in values]


def timed_steps(
    one_step, total: int, kept: range, device: torch.device, stages=STAGES, progress=None, pace=None, after=None
) -> StepSamples:
    """The one step loop of every runner, one process or a rank: runs steps 0..total-1.

    ``one_step(i)`` runs step i and returns (its detached loss, {stage: seconds}); the strategy
    (the single-process staged step, a rank's staged or pipelined engine) is all that differs.
    The device is synchronised around each step, so a step's wall time is its own. Steps in
    ``kept`` are recorded; warm-up and extra steps are not. ``pace(k)``, if given, is called
    before kept step k outside its clock (regression/interleave.py: wait for this worker's turn),
    and ``pace.done()`` after the loop; ``after(i)``, if given, after step i, outside its clock (a
    checkpoint's save). Losses are read on the host after the loop, not inside it
    (a read there would sync every step): per-task losses (tasks,) give task_loss and their mean.
    """
    samples = StepSamples(stages={s: [] for s in stages})
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    losses = []
    capture = contextlib.ExitStack()  # nsys's capture range: the kept steps (harness/train/nvtx.py)
    for i in range(total):
        if pace is not None and i in kept:
            pace(i - kept.start)
        sync()
        if kept and i == kept.start:
            capture.enter_context(nvtx.captured())
        start = time.perf_counter()
        loss, durations = one_step(i)
        sync()
        elapsed = time.perf_counter() - start
        if i == kept.stop - 1:
            capture.close()
        if i in kept:
            samples.step_s.append(elapsed)
            losses.append(loss)
            for stage, seconds in durations.items():
                samples.stages[stage].append(seconds)
        if after is not None:
            after(i)
        if progress is not None:
            progress(i + 1, total, elapsed)
    capture.close()
    if pace is not None:
        pace.done()
    if losses:
        stacked = torch.stack(losses).float().cpu()
        if stacked.dim() == 2:  # (steps, tasks)
            samples.task_loss = stacked.tolist()
            stacked = stacked.mean(dim=1)
        samples.loss = stacked.tolist()
    return samples


class ProcessEngine:
    """One process's staged step (train_step) as the measurement's engine: step i trains on
    ``batches[i % len(batches)]``, host batches prepared beforehand as a prefetching loader would
    hand them over (the data stage is the copy to the device). ``timed=False`` reads no stage
    clock (the untimed reference of benchmarks/stage_timing_overhead.py)."""

    stages = STAGES

    def __init__(self, state: TrainState, batches: list, timed: bool = True):
        self.state, self.batches, self.timed = state, batches, timed
        self.device, self.model = state.device, state.model
        self.optimizers = state.optimizers
        # the forward is one call: the op table files its ops under sparse_forward while inside
        # the sparse modules (the sparse timer's view), the rest under dense_forward
        self.op_split = ("sparse_forward", "dense_forward", state.timer.inside)

    def parameters(self):
        return self.state.model.parameters()

    def step(self, i: int):
        clock = StageClock(self.device) if self.timed else NoClock()
        try:
            loss = train_step(self.state, self.batches[i % len(self.batches)], clock)
        except RuntimeError as err:
            if out_of_memory(err) is not None and not hasattr(err, "stage"):
                err.stage = failing_stage(clock)  # the runner names it in its one-line report
            raise
        return loss, clock.durations()
