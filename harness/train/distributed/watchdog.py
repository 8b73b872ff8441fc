"""Faults in a distributed run: every rank says where it is, and no rank waits forever.

Each rank keeps its current step and stage in a ``Watchdog``. A thread checks that the rank makes
progress: when no stage boundary has passed for ``timeout`` seconds, the rank posts its position
to the job's c10d store, reads the others', names the rank that is furthest behind (the one the
rest are waiting for), prints one line and exits with status 124. torchrun then stops every other
rank, so a hang ends the whole run within about ``timeout`` seconds. An exception in a rank is
reported the same way, naming rank, step and stage (``report_failure``).

Fault injection for tests: ``GEMBENCH_FAULT=RANK:STEP:MODE[:STAGE]`` makes rank RANK, at timed
step STEP (0 = first warm-up step), in stage STAGE (default embedding_lookup), either ``exit``
(the process dies at once, as a crash would), ``raise`` (a Python exception) or ``hang``
(sleeps forever).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass

EXIT_HUNG = 124
EXIT_CRASHED = 17


@dataclass(frozen=True)
class Fault:
    rank: int
    step: int
    mode: str  # exit | raise | hang
    stage: str = "embedding_lookup"

    @staticmethod
    def from_env(env=os.environ) -> "Fault | None":
        spec = env.get("GEMBENCH_FAULT")
        if not spec:
            return None
        parts = spec.split(":")
        if len(parts) not in (3, 4) or parts[2] not in ("exit", "raise", "hang"):
            raise ValueError(f"GEMBENCH_FAULT={spec!r}: expected RANK:STEP:exit|raise|hang[:STAGE]")
        return Fault(int(parts[0]), int(parts[1]), parts[2], *(parts[3:] or []))

    def trigger(self, rank: int, step: int, stage: str) -> None:
        if (rank, step, stage) != (self.rank, self.step, self.stage):
            return
        print(
            f"gembench run: rank {rank}: injected fault ({self.mode}) at step {step}, stage {stage}",
            file=sys.stderr,
            flush=True,
        )
        if self.mode == "exit":
            os._exit(EXIT_CRASHED)
        if self.mode == "raise":
            raise RuntimeError("injected fault")
        while True:
            time.sleep(3600)


STAGE_ORDER: dict[str, int] = {}  # filled by the step module: stage -> position in the step


class Watchdog:
    """A rank's position (step, stage) and the thread that ends the rank if it stops moving."""

    def __init__(self, rank: int, world_size: int, timeout: float, store=None):
        self.rank, self.world_size, self.timeout, self.store = rank, world_size, timeout, store
        self.step, self.stage = -1, "setup"
        self.last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="gembench-watchdog", daemon=True)
        self._thread.start()

    def at(self, stage: str, step: int | None = None) -> None:
        """Mark a boundary: the rank is now in ``stage`` (of ``step``, if given)."""
        if step is not None:
            self.step = step
        self.stage = stage
        self.last = time.monotonic()

    def where(self) -> str:
        return f"stage {self.stage}" + (f" of step {self.step}" if self.step >= 0 else "")

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        poll = min(1.0, self.timeout / 10)
        while not self._stop.wait(poll):
            idle = time.monotonic() - self.last
            if idle > self.timeout:
                self._fire(idle)

    def _fire(self, idle: float) -> None:
        # Every stalled rank prints the same verdict: whichever exits first, torchrun then stops
        # the rest, so the line must not depend on one particular rank surviving to print it.
        positions = self._exchange()
        culprit = behind(positions)
        others = ", ".join(f"rank {r} in {_fmt(p)}" for r, p in sorted(positions.items()) if r != culprit)
        print(
            f"gembench run: rank {culprit} hung in {_fmt(positions[culprit])}: no progress for "
            f"{idle:.0f} s (--timeout {self.timeout:g})"
            + (f"; waiting for it: {others}" if others else "")
            + f" [seen by rank {self.rank}]; "
            "no result written",
            file=sys.stderr,
            flush=True,
        )
        os._exit(EXIT_HUNG)

    def _exchange(self) -> dict[int, tuple[int, str]]:
        """Post this rank's position and collect the others' for a few seconds."""
        if self.store is None:
            return {self.rank: (self.step, self.stage)}
        positions = {self.rank: (self.step, self.stage)}
        try:
            self.store.set(f"gembench/stalled/{self.rank}", f"{self.step}:{self.stage}")
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline and len(positions) < self.world_size:
                for r in range(self.world_size):
                    key = f"gembench/stalled/{r}"
                    if r not in positions and self.store.check([key]):
                        step, stage = self.store.get(key).decode().split(":", 1)
                        positions[r] = (int(step), stage)
                time.sleep(0.1)
        except Exception:  # noqa: BLE001  a dead store only costs the culprit's name
            pass
        return positions


def _fmt(position: tuple[int, str]) -> str:
    step, stage = position
    return f"stage {stage}" + (f" of step {step}" if step >= 0 else "")


def behind(positions: dict[int, tuple[int, str]]) -> int:
    """The rank furthest behind: lowest step, then earliest stage; the others wait for it."""
    return min(positions, key=lambda r: (positions[r][0], STAGE_ORDER.get(positions[r][1], -1), r))


def report_failure(rank: int, watchdog: Watchdog | None, err: BaseException) -> None:
    """One line naming rank, step and stage; the traceback too with GEMBENCH_DEBUG=1."""
    if os.environ.get("GEMBENCH_DEBUG"):
        import traceback

        traceback.print_exception(err)
    where = watchdog.where() if watchdog else "setup"
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    hint = ""
    if "closed by peer" in text or "Connection reset" in text or "timed out" in text.lower():
        hint = " (another rank probably crashed or hung: see its message)"
    print(
        f"gembench run: rank {rank} failed in {where}: {type(err).__name__}: {text[:300]}{hint}; no result written",
        file=sys.stderr,
        flush=True,
    )
