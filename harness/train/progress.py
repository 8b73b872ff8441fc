"""Progress of a run's steps on stderr, fitted to where stderr goes.

On a terminal: one line, rewritten at most once a second. On a pipe or a log file, where a
carriage return does not rewrite anything and every update would pile up on one line: a plain
line at each quarter of the run, so a CI log shows that the run moves without a line per step.
A long first step (torch.compile's first compile) ticks while it runs, against the time the
first step took the last time on this machine (first_step_seconds, kept in the gembench cache).
"""

from __future__ import annotations

import json
import sys
import threading
import time

LOG_LINES = 4  # plain lines per run when stderr is not a terminal
TICK_S = {True: 1.0, False: 15.0}  # first-step ticks: on a terminal, in a log
FIRST_STEPS = "first-steps.json"  # {key: seconds of the first step}, in the gembench cache


def first_step_seconds(key: str) -> float | None:
    """How long the first step of ``key`` (a config, stack and machine) took here last time."""
    from gembench.harness.device.calibration import cache_dir

    try:
        return float(json.loads((cache_dir() / FIRST_STEPS).read_text())[key])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remember_first_step(key: str, seconds: float) -> None:
    """Keep the first step's time for the next run's estimate (best effort: a cache, not a result)."""
    from gembench.harness.device.calibration import cache_dir
    from gembench.harness.store.results import atomic_write

    path = cache_dir() / FIRST_STEPS
    try:
        known = json.loads(path.read_text()) if path.exists() else {}
        known[key] = round(seconds, 1)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(known, indent=1, sort_keys=True) + "\n", durable=False)
    except (OSError, ValueError):
        pass


class Progress:
    """``progress(done, total, step_s)`` after each step; silent when not ``enabled``."""

    def __init__(self, enabled: bool, label: str, stream=None):
        self.enabled, self.label = enabled, label
        self.stream = stream or sys.stderr
        self.terminal = bool(getattr(self.stream, "isatty", lambda: False)())
        self.started = time.perf_counter()
        self.last = 0.0
        self.quarter = 0  # the last quarter printed, off a terminal
        self.first_step_s: float | None = None
        self._first_done = threading.Event()

    def during_first_step(self, what: str, expected_s: float | None) -> None:
        """Until the first step ends: '<label>: <what>, 35 s of ~90 s' every tick."""
        if not self.enabled:
            return
        start = time.perf_counter()
        of = f" of ~{expected_s:.0f} s" if expected_s else ""

        def tick() -> None:
            while not self._first_done.wait(TICK_S[self.terminal]):
                print(
                    f"{self.label}: {what}, {time.perf_counter() - start:.0f} s{of}",
                    end="\r" if self.terminal else "\n",
                    file=self.stream,
                    flush=True,
                )

        threading.Thread(target=tick, daemon=True).start()

    def __call__(self, done: int, total: int, step_s: float) -> None:
        if done == 1:
            self.first_step_s = step_s
            self._first_done.set()
        if not self.enabled or done < 1:
            return
        now = time.perf_counter()
        if self.terminal:
            if now - self.last < 1.0 and done < total:
                return
            end = "\n" if done == total else "\r"
        else:
            quarter = done * LOG_LINES // total
            if quarter <= self.quarter:
                return
            self.quarter, end = quarter, "\n"
        self.last = now
        eta = (now - self.started) / done * (total - done)
        print(
            f"{self.label}: step {done}/{total}, last {step_s * 1e3:.0f} ms, ~{eta:.0f} s left",
            end=end,
            file=self.stream,
            flush=True,
        )
