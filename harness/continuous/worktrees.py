"""Temporary checkouts of git revisions, importable as ``gembench``, removed on any exit.

Each revision is checked out with ``git worktree add --detach`` into one temporary folder. The
repository root IS the package ``gembench`` (pyproject's package-dir mapping), so a revision is
imported by putting a folder on PYTHONPATH that holds one symlink, ``gembench`` -> the worktree;
PYTHONPATH comes before site-packages, so it wins over the venv's editable install.

Cleanup runs on normal exit, on an exception, on Ctrl-C (KeyboardInterrupt) and on SIGTERM/SIGHUP
(turned into KeyboardInterrupt while the checkouts exist), and removes the worktrees with
``git worktree remove --force`` and ``git worktree prune`` so that ``git worktree list`` is left
as it was found.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from gembench.errors import UsageError


@dataclass
class Checkout:
    label: str  # what the user called it: BASE, HEAD
    revision: str  # as given (HEAD~1, a branch, a sha)
    sha: str
    path: Path  # the worktree
    pythonpath: Path  # holds the symlink gembench -> path
    overlay: Path | None = None  # what --setup installed: first on the revision's path (setup.py)


def git(repo: Path, *args: str, check: bool = True) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise UsageError(
            f"git {' '.join(args)} failed in {repo}: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}"
        )
    return proc.stdout.strip()


def repo_root(path: str | os.PathLike = ".", flag: str | None = None) -> Path:
    """The top of the git repository holding ``path``; ``flag`` names the option it came from."""
    proc = subprocess.run(["git", "-C", str(path), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if proc.returncode != 0:
        if flag is not None:
            raise UsageError(f"{flag} {path}: not a git repository (give the folder of a clone: `git -C PATH log`)")
        raise UsageError(
            f"{Path(path).resolve()} is not inside a git repository; run from a gembench clone or pass --repo"
        )
    return Path(proc.stdout.strip())


def resolve(repo: Path, revision: str, label: str) -> str:
    """The commit sha ``revision`` names, or a UsageError naming it."""
    proc = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        raise UsageError(f"{label} revision {revision!r} is not a commit in {repo} (try `git log --oneline`)")
    return proc.stdout.strip()


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _handling(sigs: tuple, handler):
    """``handler`` for ``sigs`` meanwhile, the previous handlers restored after. Off the main thread
    (where Python cannot set handlers) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {s: signal.signal(s, handler) for s in sigs}
    try:
        yield
    finally:
        for s, previous in saved.items():
            signal.signal(s, previous)


def signals_as_interrupt():
    """SIGTERM and SIGHUP raise KeyboardInterrupt meanwhile (Ctrl-C already does): finally blocks run."""
    return _handling((signal.SIGTERM, signal.SIGHUP), _interrupt)


@contextlib.contextmanager
def temporary_checkouts(repo: Path, revisions: dict[str, str], prefix: str = "gembench-continuous-"):
    """Yield {label: Checkout} for each (label -> revision); everything is removed on exit."""
    shas = {label: resolve(repo, rev, label) for label, rev in revisions.items()}
    root = Path(tempfile.mkdtemp(prefix=prefix))
    made: list[Path] = []
    try:
        with signals_as_interrupt():
            out = {}
            for label, rev in revisions.items():
                path = root / label.lower()
                made.append(path)
                git(repo, "worktree", "add", "--detach", "--quiet", str(path), shas[label])
                pythonpath = root / f"path-{label.lower()}"
                pythonpath.mkdir()
                (pythonpath / "gembench").symlink_to(path, target_is_directory=True)
                out[label] = Checkout(label, rev, shas[label], path, pythonpath)
            yield out
    finally:
        # Signals stay ignored while cleaning up: a second Ctrl-C must not leave half a worktree.
        with _ignoring_interrupts():
            for path in made:
                git(repo, "worktree", "remove", "--force", str(path), check=False)
            shutil.rmtree(root, ignore_errors=True)
            git(repo, "worktree", "prune", check=False)


@contextlib.contextmanager
def deferred_interrupts():
    """Hold Ctrl-C, SIGTERM and SIGHUP meanwhile; raise KeyboardInterrupt at the end if one came.

    For starting a child process: an interrupt raised inside subprocess.Popen (after the fork,
    while it waits for the exec) would leave a running child nobody holds a handle to.
    """
    came: list[int] = []
    with _handling(INTERRUPTS, lambda signum, frame: came.append(signum)):
        yield
    if came:
        raise KeyboardInterrupt(f"signal {signal.Signals(came[0]).name}")


def _ignoring_interrupts():
    return _handling(INTERRUPTS, signal.SIG_IGN)
