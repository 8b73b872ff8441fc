"""External programs a benchmark may need, found or not (no torch import: usage checks stay fast)."""

from __future__ import annotations

import shutil
import subprocess


def valgrind_version() -> str | None:
    """valgrind's version, or None where it is not installed (callgrind cannot run)."""
    if shutil.which("valgrind") is None:
        return None
    try:
        return subprocess.run(["valgrind", "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
