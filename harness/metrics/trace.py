"""torch.profiler for gembench: one way to profile steps, export them and read the time back.

Shared by single-process runs (``gembench run --trace DIR``: DIR/trace.json) and the ranks of a
distributed run (DIR/rank<R>.json). Traces are Chrome/Perfetto JSON (open in ui.perfetto.dev
or chrome://tracing); the pure functions below read their ``traceEvents``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

# Chrome trace categories of host-side work: aten ops, and record_function spans (gembench's
# step and stages, inductor's "## Call CompiledFxGraph ##", TorchRec's annotations).
HOST_CATEGORIES = ("cpu_op", "user_annotation")
STEP_SPAN = "gembench/step"  # the record_function span around each profiled step


# libkineto (torch 2.13) writes "USDT: ... profiler_start" / "profiler_stop" (and at some log
# levels "STAGE: ...") to stderr whenever a profile starts and stops; no log level hides them
# without hiding its errors too, so those lines alone are dropped.
KINETO_MARK = re.compile(r"^(USDT|STAGE):.*ActivityProfiler")


@contextlib.contextmanager
def kineto_marks_dropped():
    """Run the body with fd 2 captured; pass on every line but libkineto's start/stop marks."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [
                line
                for line in tmp.read().decode(errors="replace").splitlines(keepends=True)
                if not KINETO_MARK.match(line)
            ]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def profiler(device: torch.device, shapes: bool = True):
    """A torch.profiler of the host and, on CUDA, the device; shapes recorded (comm bytes)."""
    from torch.profiler import ProfilerActivity, profile

    class QuietProfile(profile):
        def start(self):
            with kineto_marks_dropped():
                super().start()

        def stop(self):
            with kineto_marks_dropped():
                super().stop()

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    return QuietProfile(activities=activities, record_shapes=shapes)


def trace_events(prof, path: Path | str | None = None) -> list[dict]:
    """Export ``prof`` as a Chrome trace (kept at ``path`` when given) and read its events back."""
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
        return json.loads(path.read_text())["traceEvents"]
    fd, tmp = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(tmp)
        return json.loads(Path(tmp).read_text())["traceEvents"]
    finally:
        os.unlink(tmp)


def self_times(events: Sequence[dict], categories: Sequence[str]) -> dict[str, dict]:
    """Per event name: calls, total and self time (us) of the complete events of ``categories``.

    Self time is the event's duration minus that of the events of those categories directly
    nested in it on the same thread. Device kernels never nest, so their self time is their time.
    """
    by_thread: dict = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in categories:
            by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    out: dict[str, dict] = {}
    for evs in by_thread.values():
        evs.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
        stack: list[list] = []  # [end, event, children's time]
        for e in evs:
            start, dur = e["ts"], e.get("dur", 0)
            while stack and stack[-1][0] <= start:
                _close(stack.pop(), out)
            if stack:
                stack[-1][2] += dur
            stack.append([start + dur, e, 0.0])
        while stack:
            _close(stack.pop(), out)
    return out


def _close(frame: list, out: dict) -> None:
    _, e, children = frame
    row = out.setdefault(e["name"], {"calls": 0, "total_us": 0.0, "self_us": 0.0})
    row["calls"] += 1
    row["total_us"] += e.get("dur", 0)
    row["self_us"] += max(e.get("dur", 0) - children, 0.0)


def top_rows(events: Sequence[dict], device: torch.device, n: int = 10) -> tuple[str, list[dict]]:
    """The ``n`` CUDA kernels (on CUDA) or host ops (on CPU) with the most self time.

    Returns (what was ranked, rows of {name, calls, self_us, share}); share is of the ranked
    events' total self time.
    """
    cuda = torch.device(device).type == "cuda"
    what = "CUDA kernels" if cuda else "CPU ops"
    times = self_times(events, ("kernel",) if cuda else HOST_CATEGORIES)
    total = sum(r["self_us"] for r in times.values()) or 1.0
    ranked = sorted(times.items(), key=lambda kv: -kv[1]["self_us"])[:n]
    return what, [
        {"name": k, "calls": r["calls"], "self_us": r["self_us"], "share": r["self_us"] / total} for k, r in ranked
    ]
