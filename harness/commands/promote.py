"""Make one or more runs the baseline for their config on their hardware class.

All RESULTs must be replicates of one config on one hardware class and package stack; together
they become results/baselines/<hardware_class>/<config>.json (schema gembench.baseline/1). The
baseline they replace moves to results/baselines/<hardware_class>/archive/ and stays in git
history, so a promotion is never a silent loss. Commit the baseline with a message saying why.

examples:
  gembench promote results/runs/20260101-tiny.json
  gembench promote 'results/runs/main-tiny-*.json'          # several replicates: better gates
  gembench promote r.json --baselines /tmp/baselines        # somewhere else (tests, experiments)
  git add results/baselines && git commit -m "tiny baseline: fused HSTU kernel landed"
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
from pathlib import Path

from gembench.errors import UsageError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "results", nargs="+", metavar="RESULT", help="result file(s) to promote (replicates of one commit)"
    )
    parser.add_argument("--baselines", default="results/baselines", help="baselines folder (default %(default)s)")
    parser.add_argument(
        "--allow-dirty", action="store_true", help="promote runs made from a work tree with uncommitted changes"
    )


def promote(runs: list[dict], root: str | os.PathLike, allow_dirty: bool = False) -> tuple[Path, Path | None]:
    """Write the baseline for ``runs``; returns (baseline path, archived old baseline or None)."""
    from gembench.harness.store.results import (
        BASELINE_SCHEMA,
        COMPARABLE_KEYS,
        RUN_KEYS,
        baseline_for,
        differences,
        field,
        write_result,
    )

    first = runs[0]
    for other in runs[1:]:
        diff = differences(first, other, COMPARABLE_KEYS + RUN_KEYS)
        if diff:
            raise UsageError(f"runs {first.get('id')} and {other.get('id')} are not replicates: {'; '.join(diff)}")
    dirty = [r.get("id") for r in runs if field(r, "env.git_dirty")]
    if dirty and not allow_dirty:
        raise UsageError(
            f"run(s) {', '.join(map(str, dirty))} came from a dirty work tree; commit first or pass --allow-dirty"
        )
    target = baseline_for(first, root)
    now = dt.datetime.now(dt.timezone.utc)
    bundle = {
        "schema": BASELINE_SCHEMA,
        "promoted": now.isoformat(timespec="seconds"),
        "hardware_class": field(first, "env.hardware_class"),
        "config": field(first, "config.name"),
        "git_commit": field(first, "env.git_commit"),
        "runs": runs,
    }
    from gembench.harness.store.reservation import Reservation, reason

    with Reservation.take(target, overwrite=True):  # a concurrent promote of this baseline stops here
        archived = None
        try:
            if target.exists():
                archive = target.parent / "archive"
                archive.mkdir(parents=True, exist_ok=True)
                stem = f"{target.stem}.{now.strftime('%Y%m%dT%H%M%SZ')}"
                archived = archive / f"{stem}.json"
                i = 1
                while archived.exists():
                    archived, i = archive / f"{stem}.{i}.json", i + 1
                os.link(target, archived)  # keep the old one before the new one replaces it
            write_result(target, bundle, overwrite=True)
        except BaseException as err:  # incl. Ctrl-C: the old baseline stays, with no stray archive copy
            if archived is not None and archived.exists() and os.path.samefile(target, archived):
                archived.unlink()
            if isinstance(err, OSError):
                raise UsageError(
                    f"could not write baseline {target}: {reason(err)}; the previous baseline is unchanged"
                ) from None
            raise
    return target, archived


def main(args: argparse.Namespace) -> int:
    from gembench.harness.commands.compare import load_side

    runs = [r for text in args.results for r in load_side(text)]
    target, archived = promote(runs, args.baselines, args.allow_dirty)
    print(f"baseline {target}: {len(runs)} run(s) of {runs[0]['config']['name']} on {runs[0]['env']['hardware_class']}")
    if archived:
        print(f"previous baseline kept at {archived}")
    print(f'commit it: git add {target.parent} && git commit -m "baseline {runs[0]["config"]["name"]}: <why>"')
    return 0
