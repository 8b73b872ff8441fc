"""An output path held from before the first step until its result is written, and a write that
loses nothing measured.

``Reservation.take(out)`` runs before any work: the folder must be writable and the name free,
and a lock file ``<out>.lock`` is created exclusively (O_CREAT | O_EXCL, atomic on local file
systems), holding "pid host". A second run given the same --out finds the lock and stops at
once, before training, naming the run that holds it. The lock goes when the result is written,
and on any failure or Ctrl-C (``release``); a lock left by a run that was killed (its pid gone
on this host) is taken over.

Why a lock beside the name rather than an empty placeholder at the name: readers glob
``results/runs/*.json``, and an empty ``r.json`` (mid-run, or left by a killed run) would be a
"result" that is not one. The result itself is still written atomically and never over an
existing file (results.write_result: temp file, then a hard link to the final name).

``write_or_fallback`` writes a result; when that fails (full disk, folder gone, permissions),
it keeps the JSON in ``$TMPDIR/gembench-<run id>.json`` and raises one UsageError saying which
path failed, why, and where the figures are.
"""

from __future__ import annotations

import datetime as dt
import errno
import os
import socket
import tempfile
from pathlib import Path

from gembench.errors import UsageError

LOCK_SUFFIX = ".lock"
# Set by `gembench run --nproc N` for its ranks: the --out its own reservation holds.
HELD_ENV = "GEMBENCH_OUT_RESERVED"
# ... and the file where rank 0 says "write-failed" (it then exits 0 so torchrun ends cleanly)
OUTCOME_ENV = "GEMBENCH_OUTCOME_FILE"


def lock_path(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path.with_name(path.name + LOCK_SUFFIX)


def _holder(lock: Path) -> str:
    try:
        return lock.read_text().strip()
    except OSError:
        return ""


def _gone(holder: str) -> bool:
    """True when the lock's process is known to be dead (it ran on this host and is gone)."""
    try:
        pid, host = holder.split()
        pid = int(pid)
    except ValueError:
        return False
    if host != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, someone else's
    return False


class Reservation:
    """``path`` is ours to write until ``release()``; use as a context manager."""

    def __init__(self, path: Path, lock: Path, token: str):
        self.path, self.lock, self.token = path, lock, token

    @classmethod
    def take(cls, path: str | os.PathLike, overwrite: bool = False) -> "Reservation":
        from gembench.harness.store.results import check_writable, writable_folder

        path = check_writable(path, overwrite)
        writable_folder(path.parent)  # the run is going ahead: its folder holds the lock
        lock = lock_path(path)
        token = f"{os.getpid()} {socket.gethostname()}"
        for attempt in (0, 1):
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = _holder(lock)
                if attempt == 0 and _gone(holder):
                    lock.unlink(missing_ok=True)  # left by a killed run: take it over
                    continue
                who = f"pid {holder.replace(' ', ' on ')}" if holder else "another run"
                raise UsageError(
                    f"{path} is being written by another run ({who}, lock {lock}): pass another "
                    "--out, or delete the lock if no run is writing it"
                ) from None
            except OSError as err:
                raise UsageError(f"cannot reserve {path}: creating {lock} failed: {err.strerror}") from None
            try:
                os.write(fd, (token + "\n").encode())
            except OSError:
                pass  # an empty lock still reserves the name; the holder is just not named
            finally:
                os.close(fd)
            break
        held = cls(path, lock, token)
        if path.exists() and not overwrite:  # written by a run that finished between check and lock
            held.release()
            raise UsageError(f"{path} already exists; results are never overwritten: pass another --out")
        return held

    def release(self) -> None:
        """Drop the lock if it is still ours (idempotent)."""
        if _holder(self.lock) in (self.token, ""):
            self.lock.unlink(missing_ok=True)

    def __enter__(self) -> "Reservation":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def fallback_path(result: dict) -> Path:
    from gembench.harness.store.results import safe_name

    name = (
        result.get("id")
        or f"{result.get('schema', 'result').replace('/', '-')}-{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%SZ}"
    )
    return Path(tempfile.gettempdir()) / f"gembench-{safe_name(name)}.json"


def reason(err: BaseException) -> str:
    if isinstance(err, OSError) and err.errno is not None:
        return f"{err.strerror} ({errno.errorcode.get(err.errno, err.errno)})"
    return str(err)


def write_or_fallback(path: str | os.PathLike, result: dict) -> Path:
    """Write ``result`` to ``path``; if that fails keep it in the fallback file and raise one line."""
    from gembench.harness.store.results import write_result

    try:
        return write_result(path, result)
    except (OSError, UsageError) as err:
        failed = reason(err)
    fallback = fallback_path(result)
    try:
        write_result(fallback, result)
        kept = f"the result is kept in {fallback}: move it where it belongs"
    except (OSError, UsageError) as err:
        kept = f"the fallback {fallback} failed too ({reason(err)}): the table above is all that is left"
    raise UsageError(f"could not write the result to {path}: {failed}; {kept}")
