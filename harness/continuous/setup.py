"""``--setup CMD``: a build step run in a revision's worktree before its processes start.

CMD runs in a shell (``sh -c``), in the worktree, with ``GEMBENCH_OVERLAY`` naming an empty folder
of that revision's own and this interpreter's folder first on PATH (``python`` and ``pip`` are the
ones running gembench). The overlay goes first on the revision's PYTHONPATH (pairs.revision_env),
so what CMD installs there is what the revision's processes import, e.g. a package of the team's
repository built from each commit:

    python -m pip install -q --no-deps --no-build-isolation --target "$GEMBENCH_OVERLAY" .

(``--no-deps``: torch and torchrec are the environment's, not each revision's.) A CMD that fails
is one line naming the revision and CMD's last line on stderr, exit 2.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from gembench.errors import UsageError


def run_setup(cmd: str, c, timeout: float, say=lambda msg: None) -> None:
    """Run ``cmd`` in checkout ``c``'s worktree into a fresh overlay, which ``c`` then carries."""
    from gembench.harness.continuous.pairs import run_process

    overlay = c.pythonpath.parent / f"overlay-{c.label.lower()}"
    shutil.rmtree(overlay, ignore_errors=True)  # a bisect step reuses its worktree: nothing from the last commit
    overlay.mkdir(parents=True)
    env = dict(os.environ)
    env["GEMBENCH_OVERLAY"] = str(overlay)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    say(f"--setup in {c.label} {c.revision} ({c.sha[:10]}): {cmd}")
    code, err = run_process(["/bin/sh", "-c", cmd], env, c.path, timeout)
    if code != 0:
        lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
        raise UsageError(
            f"--setup failed in {c.label} {c.revision} ({c.sha[:10]}), exit {code}: "
            f"{lines[-1] if lines else 'nothing on stderr'} (the command: {cmd})"
        )
    c.overlay = overlay
