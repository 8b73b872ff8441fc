"""Interleaved bursts: two live benchmark processes take turns, a burst of steps each, ABBA.

Why: on a shared 2-core machine the load drifts over seconds, and two fresh processes run one
after the other (12 s each on tiny) see different loads. Started together and warmed up together,
then made to take turns a few steps at a time (tens of milliseconds with tiny), BASE and HEAD see
the same drift: it cancels in the ratio of their step times. The two live for hundreds of steps,
so each pays its start-up (imports, torch.compile from its cache) once for many turns.

The protocol is one byte at a time over two pipes per worker (``gembench run --pace R,W``):

    worker                       controller
    warm-up steps ...
    "r" (ready)          ->      (waits for both workers' first "r": their start-ups overlap)
                         <-      "g" (go): run one burst of timed steps
    burst, then "r"      ->      ... the other worker's turn ...
    last burst, then "d" ->      (done: the worker measures its counters and writes its result)

While one worker runs its burst, the other is blocked in a read, using no CPU. The worker side is
:class:`Pacer` (called by the step loop, step.timed_steps, before each timed step); the controller
side is :func:`take_turns`.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

READY, GO, DONE = b"r", b"g", b"d"
PACE_FLAG = "--pace"


class Pacer:
    """Worker side: before every ``burst``-th timed step, say ready and wait to be told to go."""

    def __init__(self, fds: str, burst: int):
        try:
            read_fd, write_fd = (int(x) for x in fds.split(","))
        except ValueError:
            raise ValueError(f"--pace takes two file descriptors R,W, got {fds!r}") from None
        self.burst = burst
        self.go = os.fdopen(read_fd, "rb", buffering=0)
        self.ready = os.fdopen(write_fd, "wb", buffering=0)

    def __call__(self, timed_step: int) -> None:
        if timed_step % self.burst:
            return
        self.ready.write(READY)
        if self.go.read(1) != GO:  # EOF: the controller is gone, or an unknown byte
            raise RuntimeError("--pace: the controlling process stopped sending 'go'")

    def done(self) -> None:
        self.ready.write(DONE)
        self.ready.close()
        self.go.close()


@dataclass
class Worker:
    """Controller side of one worker process."""

    label: str
    proc: subprocess.Popen
    ready: int  # read end: the worker's "r" / "d"
    go: int  # write end: our "g"
    stderr: Path

    def error_text(self) -> str:
        try:
            return self.stderr.read_text(errors="replace")
        except OSError:
            return ""


class WorkerFailed(Exception):
    """A worker ended or hung before its turn was over: its label, exit status and stderr."""

    def __init__(self, worker: Worker, code: int, stderr: str):
        super().__init__(f"{worker.label} exited {code}")
        self.worker, self.code, self.stderr = worker, code, stderr

    @property
    def predates_pacing(self) -> bool:
        """The revision's `gembench run` has no --pace: it predates interleaving."""
        return self.code == 2 and f"unrecognized arguments: {PACE_FLAG}" in self.stderr


def start(label: str, cmd: list[str], env: dict, cwd: Path, folder: Path, burst: int) -> Worker:
    """Start ``cmd`` (a `gembench run`) paced through a fresh pipe pair, in its own session.

    Call it under worktrees.deferred_interrupts() together with keeping the Worker it returns: an
    interrupt between the fork and that would leave a running process nobody can end.
    """
    go_r, go_w = os.pipe()
    ready_r, ready_w = os.pipe()
    stderr = folder / f"{label.lower()}-stderr.txt"
    try:
        with open(stderr, "wb") as err:
            proc = subprocess.Popen(
                [*cmd, PACE_FLAG, f"{go_r},{ready_w}", "--burst", str(burst)],
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                pass_fds=(go_r, ready_w),
                start_new_session=True,
            )
    except BaseException:
        for fd in (go_r, go_w, ready_r, ready_w):
            os.close(fd)
        raise
    os.close(go_r)
    os.close(ready_w)
    return Worker(label, proc, ready_r, go_w, stderr)


def end_group(proc: subprocess.Popen) -> None:
    """End ``proc``'s whole process group (torchrun ranks, compile workers): SIGTERM, then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _failed(worker: Worker, why: str | None = None) -> WorkerFailed:
    if why is not None:
        end_group(worker.proc)
    try:
        code = worker.proc.wait(30)
    except subprocess.TimeoutExpired:
        end_group(worker.proc)
        code = worker.proc.wait()
    return WorkerFailed(worker, 124 if why else code, why or worker.error_text())


def _readable(waiting: dict[int, Worker], deadline: float) -> list[int]:
    """The fds of ``waiting`` (read end -> worker) with a byte to read; none by ``deadline`` raises
    WorkerFailed for one of them."""
    ready, _, _ = select.select(list(waiting), [], [], max(0.0, deadline - time.monotonic()))
    if not ready:
        raise _failed(next(iter(waiting.values())), "timed out (--timeout)")
    return ready


def wait_ready(workers: list[Worker], deadline: float) -> None:
    """Wait for every worker's first "ready" (its start-up over); one that ends or passes
    ``deadline`` first raises WorkerFailed."""
    waiting = {w.ready: w for w in workers}
    while waiting:
        for fd in _readable(waiting, deadline):
            w = waiting.pop(fd)
            if os.read(fd, 1) != READY:
                raise _failed(w)


def pin(workers: list[Worker], cpu: int | None) -> None:
    """Put every thread of ``workers`` on one CPU (Linux; elsewhere, or for ``cpu`` None, nothing).

    Left to the scheduler, each of two processes that take turns keeps waking on the CPU it last
    ran on (seen on the 2-core VM: BASE on cpu0 and HEAD on cpu1 for their whole lives), so their
    ratio would also carry the difference between two vCPUs that the host loads differently.
    Pinned together, both run on the same one. A pair alone is pinned after its start-ups, which
    then use every CPU; pairs side by side are pinned from their start, a CPU each.
    """
    if cpu is None or not hasattr(os, "sched_setaffinity"):
        return
    for w in workers:
        try:
            threads = [int(t) for t in os.listdir(f"/proc/{w.proc.pid}/task")]
        except OSError:
            threads = [w.proc.pid]
        for tid in threads:
            try:
                os.sched_setaffinity(tid, {cpu})
            except OSError:  # a thread that just ended, or a CPU this process may not use
                pass


def take_turns(workers: list[Worker], bursts: int, timeout: float, cpu: int | None = None) -> None:
    """Drive started ``workers`` (two) through ``bursts`` bursts each, alternating ABBA over bursts.

    ``workers[0]`` takes the first turn (the caller alternates the order across pairs, so neither
    revision always goes first); once both are warm they are pinned to ``cpu`` (see pin). Returns
    when both have sent "done"; raises WorkerFailed.
    """
    take_turns_side_by_side([(workers, cpu)], bursts, timeout)


class _Turns:
    """One pair's turns in order, ABBA over bursts, each with what its worker sends at its end."""

    def __init__(self, workers: list[Worker], bursts: int):
        self.turns = [
            (w, DONE if b == bursts - 1 else READY)  # "done" after a worker's last burst
            for b in range(bursts)
            for w in (workers if b % 2 == 0 else workers[::-1])
        ]
        self.next = 0

    @property
    def worker(self) -> Worker:
        """Whose turn it is."""
        return self.turns[self.next][0]

    def go(self) -> bool:
        """Start the next turn; False when every turn is over."""
        if self.next == len(self.turns):
            return False
        os.write(self.worker.go, GO)
        return True

    def ended(self, got: bytes) -> None:
        """The current turn's worker sent ``got``: check it, and move on."""
        if got != self.turns[self.next][1]:
            raise _failed(self.worker)
        self.next += 1


def take_turns_side_by_side(
    pairs: list[tuple[list[Worker], int | None]], bursts: int, timeout: float, warm: list[Worker] = ()
) -> None:
    """Drive several started pairs at once, each pair taking its own turns on its own CPU.

    ``pairs`` holds (workers, cpu) per pair. First every worker of every pair finishes its
    start-up (a pair does not begin timing while another still imports and compiles beside it:
    measuring runs alongside measuring); then each pair is pinned to its CPU and goes through
    its turns as take_turns describes, independently of the others. Returns when every worker
    has sent "done"; a worker that fails or passes ``timeout`` raises WorkerFailed. ``warm``:
    workers whose first "ready" the caller has read already.
    """
    deadline = time.monotonic() + timeout
    # start-ups overlap, untimed
    wait_ready([w for workers, _ in pairs for w in workers if w not in warm], deadline)
    active: dict[int, _Turns] = {}  # the read end of whoever's turn it is -> that pair's turns
    for workers, cpu in pairs:
        pin(workers, cpu)
        turns = _Turns(workers, bursts)
        turns.go()
        active[turns.worker.ready] = turns
    while active:  # each pair's turns, independently: whoever's turn ended gives the next one
        for fd in _readable({fd: t.worker for fd, t in active.items()}, deadline):
            turns = active.pop(fd)
            turns.ended(os.read(fd, 1))
            if turns.go():
                active[turns.worker.ready] = turns


def finish(workers: list[Worker], timeout: float) -> None:
    """Wait for every worker to exit 0 (after "done" each measures counters and writes its result)."""
    deadline = time.monotonic() + timeout
    for w in workers:
        try:
            code = w.proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise _failed(w, "timed out (--timeout) writing its result") from None
        if code != 0:
            raise WorkerFailed(w, code, w.error_text())


def close(workers: list[Worker]) -> None:
    """End whatever still runs and close our pipe ends (also after an error or an interrupt)."""
    for w in workers:
        if w.proc.poll() is None:
            end_group(w.proc)
        for fd in (w.ready, w.go):
            try:
                os.close(fd)
            except OSError:
                pass
