"""Progress of a run's steps on stderr, fitted to where stderr goes.

On a terminal: one line, rewritten at most once a second. On a pipe or a log file, where a
carriage return does not rewrite anything and every update would pile up on one line: a plain
line at each quarter of the run, so a CI log shows that the run moves without a line per step.
"""

from __future__ import annotations

import sys
import time

LOG_LINES = 4  # plain lines per run when stderr is not a terminal


class Progress:
    """``progress(done, total, step_s)`` after each step; silent when not ``enabled``."""

    def __init__(self, enabled: bool, label: str, stream=None):
        self.enabled, self.label = enabled, label
        self.stream = stream or sys.stderr
        self.terminal = bool(getattr(self.stream, "isatty", lambda: False)())
        self.started = time.perf_counter()
        self.last = 0.0
        self.quarter = 0  # the last quarter printed, off a terminal

    def __call__(self, done: int, total: int, step_s: float) -> None:
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
