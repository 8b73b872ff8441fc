"""Start-up: what a process pays before its first timed step, by phase.

A run's start-up reaches from the moment its process began (the kernel's record of it, so the
interpreter and the imports count) to the moment it is ready for its first timed step: warm-up
done, before any wait for a turn (`gembench continuous` pairs processes). A rank that gembench's
launcher started also names the launch: from the launcher's start to the rank's.

The runners name their phases where they do them (``with startup.phase("plan"):``); time between
named phases is left unnamed, so the coverage says how much of the start-up the names explain.
A run begun by a library caller in a longer-lived process (a test, ablate's later variants)
starts its clock at ``Startup()``, without imports.
"""

from __future__ import annotations

import contextlib
import os
import time

# The phases in the order a run meets them; what each covers, for tables and docs.
PHASES = {
    "launch": "gembench's launcher and torchrun, before this rank's process began",
    "imports": "the interpreter, imports and the command line",
    "process_group": "joining the process group (rendezvous) and the watchdog",
    "config": "the workload made and checked against memory",
    "peak": "the peak FLOP/s and memory bandwidth (calibrated, or read from their cache)",
    "data": "the batches prepared",
    "flops": "the model's FLOPs counted (gembench's own cost, not a training job's)",
    "build": "the model built and initialized, the stack applied on one process",
    "restore": "--resume: the saved training state loaded (torch.distributed.checkpoint)",
    "staging": "--checkpoint-every: the host buffers every save copies the state into, made once",
    "plan": "TorchRec's sharding plan",
    "shard": "DistributedModelParallel over the plan, the unsharded weights loaded into it",
    "wrap": "FSDP2 over the dense part, torch.compile's wrapper",
    "load_count": "the lookup load counted on a few batches (gembench's own cost)",
    "compile": "the first warm-up step: torch.compile compiles there, caches warm",
    "warmup": "the remaining warm-up steps",
}
LAUNCHED_AT_ENV = "GEMBENCH_LAUNCHED_AT"  # the launcher's start, seconds since the epoch


def process_started() -> float | None:
    """When this process began, in seconds since the epoch (Linux's /proc; None elsewhere)."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rpartition(")")[2].split()  # the command name may hold spaces
        ticks = int(fields[19])  # starttime, field 22: clock ticks after boot
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        return time.time() - (since_boot - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class Startup:
    """One run's start-up clock. ``from_process_start``: the run is its process's purpose (`gembench
    run`, a rank), so its clock starts with the process and names the imports."""

    def __init__(self, from_process_start: bool = False):
        now = time.time()
        self.began = now
        self.phases: dict[str, float] = {}
        self.ready_at: float | None = None
        started = process_started() if from_process_start else None
        if started is not None and started <= now:
            self.began = started
            self.phases["imports"] = now - started
            launched = os.environ.get(LAUNCHED_AT_ENV)
            if launched is not None and float(launched) <= started:
                self.phases["launch"] = started - float(launched)
                self.began = float(launched)

    @property
    def open(self) -> bool:
        return self.ready_at is None

    @contextlib.contextmanager
    def phase(self, name: str):
        """Time ``name`` (one of PHASES), added to what it already has; nothing once ready."""
        if name not in PHASES:
            raise ValueError(f"unknown start-up phase {name!r}")
        start = time.time()
        try:
            yield
        finally:
            if self.open:
                self.phases[name] = self.phases.get(name, 0.0) + time.time() - start

    def ready(self) -> None:
        """The run is ready for its first timed step: the start-up ends here (the first call)."""
        if self.open:
            self.ready_at = time.time()

    def record(self) -> dict | None:
        """{"phases": {name: s} in PHASES' order, "to_first_step_s", "covered" (the phases' share of
        it), "from": "process" or "run"}; None before ready."""
        if self.ready_at is None:
            return None
        total = self.ready_at - self.began
        phases = {name: self.phases[name] for name in PHASES if name in self.phases}
        return {
            "phases": phases,
            "to_first_step_s": total,
            "covered": sum(phases.values()) / total if total > 0 else 1.0,
            "from": "process" if "imports" in phases else "run",
        }


def slowest(records: list[dict | None]) -> dict | None:
    """The job's start-up: the rank that was ready last (ranks start together, so the job waits
    for it), with every rank's time to first step."""
    known = [(r, i) for i, r in enumerate(records) if r is not None]
    if not known:
        return None
    last, rank = max(known, key=lambda ri: ri[0]["to_first_step_s"])
    if len(records) == 1:
        return last
    return last | {"rank": rank, "ranks_to_first_step_s": [r and r["to_first_step_s"] for r in records]}


def metrics(record: dict) -> dict[str, float]:
    """The flat figures of a start-up record: ``startup_s`` (time to first step, judged like the
    step time) and ``startup_<phase>_s`` for each phase (shown beside it)."""
    return {"startup_s": record["to_first_step_s"]} | {
        f"startup_{name}_s": seconds for name, seconds in record["phases"].items()
    }
