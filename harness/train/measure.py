"""The one measurement of a training engine, on one process or on each rank of a job.

An engine runs step ``i`` of a run and returns its detached loss and stage times: the one-process
stack (step.ProcessEngine), a rank's staged step or TorchRec's pipelined step
(distributed/engines.py). A world says which process this is and gathers the records (a world of
one for one process). ``measure`` does the same for all of them, in one step loop:

    warm-up | timed steps | counted step | op step | profiled steps
                          ^ the run's memory is read here, before the extra steps add theirs

The counted step runs under the cost counters (metrics/counters.py: aten ops, host syncs) and the
activation count (memory.SavedForBackward); the op step under the op recorder alone
(metrics/ops.py: each op's time, FLOPs and bytes, told the stages by the step's clock); the
profiled steps under torch.profiler (device counts, and on ranks the communication analysis). Not
one step: the counting dispatch mode re-dispatches every op, which the profiler would record twice,
and its bookkeeping would be in the ops' clock. None touches the timed steps.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch
import torch.distributed as dist

from gembench.harness.metrics import comm, counters, ops, trace
from gembench.harness.metrics.startup import Startup
from gembench.harness.train.memory import SavedForBackward, peak_memory_bytes, run_memory_bytes
from gembench.harness.train.step import ProcessEngine, StageClock, StepSamples, TrainState, timed_steps

COUNTED_STEPS = 1
OP_STEPS = 1
# profiled steps: one on one process (its counters and --trace); two on ranks, whose
# communication analysis reads the steps' windows between their spans
PROFILED_STEPS = {False: 1, True: 2}


class Engine(Protocol):
    """What ``measure`` drives: the step, its stage names, and what the counted step watches."""

    stages: tuple[str, ...]
    device: torch.device
    optimizers: list  # their host-resident step counters are not host syncs (counters.StepCounter)

    def parameters(self): ...  # not activations (memory.SavedForBackward)

    def step(self, i: int) -> tuple[torch.Tensor, dict[str, float]]: ...


@dataclass(frozen=True)
class World:
    """Which process this is, and how records meet: a world of one for one process; on ranks
    torchrun's environment and a watchdog told where the rank is."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    watchdog: object | None = None  # distributed.watchdog.Watchdog on ranks

    @property
    def distributed(self) -> bool:
        return self.watchdog is not None

    def at(self, stage: str, step: int | None = None) -> None:
        if self.watchdog is not None:
            self.watchdog.at(stage, step)

    def gather(self, record):
        """Every process's record on rank 0 (None on the others)."""
        if not self.distributed:
            return [record]
        self.at("gather")
        records = [None] * self.size if self.rank == 0 else None
        dist.gather_object(record, records, dst=0)
        return records


@dataclass(frozen=True)
class RunMemory:
    """The memory of the run as timed: the process's peak, and its rise over where it began."""

    peak_bytes: int
    peak_source: str
    run_bytes: int
    run_source: str

    @classmethod
    def now(cls, device: torch.device, start_bytes: int) -> "RunMemory":
        return cls(*peak_memory_bytes(device), *run_memory_bytes(device, start_bytes))


@dataclass
class Measurement:
    """What one engine's measured steps gave, before the record is built from it."""

    samples: StepSamples
    memory: RunMemory | None = None
    counters: dict | None = None
    activation_bytes: int = 0  # saved for backward in the counted step
    events: list = field(default_factory=list)  # the profiled steps' trace events
    op_calls: list = field(default_factory=list)  # the op step's ops (metrics/ops.OpRecorder)
    op_step_s: float = 0.0  # the op step's wall time, less the recorder's own: what the ops' times cover
    startup: dict | None = None  # metrics/startup.py's record: what the run paid before its first timed step
    checkpoint: dict | None = None  # train/checkpoint.py's saves and the save resumed from


def step_indices(warmup: int, steps: int, distributed: bool) -> dict[str, range]:
    """Which step of the loop does what."""
    counted = warmup + steps
    op = counted + COUNTED_STEPS
    profiled = op + OP_STEPS
    return {
        "warmup": range(0, warmup),
        "timed": range(warmup, counted),
        "counted": range(counted, op),
        "ops": range(op, profiled),
        "profiled": range(profiled, profiled + PROFILED_STEPS[distributed]),
    }


def measure(
    engine: Engine,
    world: World,
    warmup: int,
    steps: int,
    start_bytes: int = 0,
    costs: bool = True,
    compile_since: dict | None = None,
    trace_path=None,
    first: int = 0,
    progress: Callable | None = None,
    pace=None,
    startup: Startup | None = None,
    after_step: Callable | None = None,
) -> Measurement:
    """Warm up, time ``steps`` steps, then (``costs``) read the memory, count one step and profile
    the last ones. Step ``i`` of the loop is the engine's step ``first + i``: --ab measures its
    rounds and its costs as slices of one run.

    ``start_bytes``: the memory floor the run's rise is taken from; ``compile_since``: the compile
    state the counts start from (counters.fresh_compile_state; None: no compile counted, a stack
    without torch.compile); ``trace_path``: where the profiled steps' trace is kept; ``startup``:
    the run's start-up clock, told its warm-up (the first step's compile apart) and stopped when
    the warm-up is done, before any wait for a turn (``pace``); ``after_step(i)``: called after
    loop step i, outside its clock (checkpoint.Saver).
    """
    at = step_indices(warmup, steps, world.distributed)
    total = at["profiled"].stop if costs else at["timed"].stop
    device = engine.device
    step_counter = counters.StepCounter(device, engine.optimizers)
    op_recorder = ops.OpRecorder(device, getattr(engine, "op_split", None), getattr(engine, "model", None))
    saved = SavedForBackward(engine.parameters())
    profiler = trace.profiler(device)
    out = Measurement(StepSamples())
    if startup is not None and not startup.open:
        startup = None  # an earlier measurement of this process ended its start-up (ablate's later variants)
    if startup is not None and not at["warmup"]:
        startup.ready()

    def one_step(i: int):
        if startup is None or i not in at["warmup"]:  # open until the last warm-up step ends
            return any_step(i)
        with startup.phase("compile" if i == 0 else "warmup"):
            done = any_step(i)
        if i == at["warmup"].stop - 1:
            startup.ready()
        return done

    def any_step(i: int):
        if i == at["counted"].start:
            out.memory = RunMemory.now(device, start_bytes)
        if i == at["profiled"].start:
            profiler.__enter__()  # left after the loop: the profiled steps are the last ones
        if i in at["ops"]:
            StageClock.observer = op_recorder.stage_ended
            start = time.perf_counter()
            try:
                with op_recorder:
                    return engine.step(first + i)
            finally:
                StageClock.observer = None
                out.op_step_s = time.perf_counter() - start - op_recorder.own_s
        watched = i in at["counted"]
        with (
            step_counter if watched else contextlib.nullcontext(),
            saved if watched else contextlib.nullcontext(),
            torch.autograd.profiler.record_function(trace.STEP_SPAN),
        ):
            return engine.step(first + i)

    out.samples = timed_steps(
        one_step, total, at["timed"], device, engine.stages, progress=progress, pace=pace, after=after_step
    )
    out.startup = startup.record() if startup is not None else None
    if not costs:
        return out
    profiler.__exit__(None, None, None)
    out.events = trace.trace_events(profiler, trace_path)
    # the device counts are the first profiled step's: the device events that start before the
    # second step does (kernels run after the host span that launched them)
    spans = sorted(start for start, _ in comm.windows(out.events, trace.STEP_SPAN))
    window = (spans[0], spans[1] if len(spans) > 1 else float("inf")) if spans else None
    compiled = counters.compile_counts(compile_since) if compile_since is not None else NOT_COMPILED
    out.counters = counters.counters(step_counter, out.events, compiled, window=window)
    out.activation_bytes = saved.bytes
    out.op_calls = op_recorder.calls
    return out


NOT_COMPILED = {"graph_breaks": 0, "recompiles": 0}


def run_steps(state: TrainState, batches: list, steps: int, warmup: int, timed: bool = True) -> StepSamples:
    """``measure`` of one process without its counted and profiled steps: for tests and benchmarks
    that time the step alone (``timed=False``: no stage clock either)."""
    return measure(ProcessEngine(state, batches, timed), World(), warmup, steps, costs=False).samples
