"""Compare runs metric by metric: both values, the change, its interval and a verdict.

Each SIDE is one set of replicate runs of one commit: a result file, a baseline file (which may
hold several runs), several files joined by commas, a quoted glob, or a folder (all *.json in it).
The first SIDE is the reference A; every further SIDE is compared against it. Verdicts know each
metric's direction (mfu higher is better, step_time_s lower, ...). Timing metrics: improved or
regressed need a one-sided test at --alpha (Holm across metrics) AND a change of at least
--min-effect; unchanged needs the interval inside +-min-effect; else inconclusive. Replicate runs
are the independent unit; with one run per side, batch medians of its steps stand in (within-run
noise only). Cost counters and instruction counts are exact: any increase beyond --thresholds'
allowance regresses (docs/continuous.md).

exit status: 0 compared, 2 usage error, 3 not comparable (other hardware class, package stack or
config hash; --force compares anyway). compare never fails on a regression: use `gembench gate`.

examples:
  gembench compare results/runs/a.json results/runs/b.json
  gembench compare 'results/runs/main-*.json' 'results/runs/pr-*.json'      # replicates
  gembench compare results/baselines/cpu/tiny.json r1.json,r2.json,r3.json --format markdown
  gembench compare base.json pr.json --format html --out compare.html     # CI artifact, opens offline
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gembench.errors import UsageError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "sides", nargs="+", metavar="SIDE", help="result file(s) of one side: file, a,b,c, 'glob*', or folder"
    )
    parser.add_argument(
        "--format",
        choices=("table", "markdown", "json", "html"),
        default="table",
        help="output format (default table; html: one self-contained page, the report's look)",
    )
    parser.add_argument(
        "--out", default=None, metavar="FILE", help="write the output to FILE (replaced if it exists) instead of stdout"
    )
    parser.add_argument("--alpha", type=float, default=None, help="false-alarm rate per family of tests (default 0.01)")
    parser.add_argument(
        "--min-effect",
        type=float,
        default=None,
        help="smallest relative change that counts, e.g. 0.03 = 3%% (default 0.03)",
    )
    parser.add_argument("--metric", action="append", default=None, help="judge only this metric (repeatable)")
    parser.add_argument(
        "--force", action="store_true", help="compare even when hardware class, package stack or config hash differ"
    )
    parser.add_argument(
        "--thresholds",
        default=None,
        help="thresholds TOML for the exact counters' allowed increase (default results/thresholds.toml "
        "where it exists, else 0 for counters and 1%% for instruction counts)",
    )


def expand_side(text: str) -> list[Path]:
    """Files named by one SIDE argument (comma-separated files, globs, folders), in a stable
    order; a glob or a folder that names no result file is refused, naming it."""
    from gembench.harness.store.results import expand_paths

    paths: list[Path] = []
    for part in [p for p in text.split(",") if p]:
        found = expand_paths([part])
        if not found:
            raise UsageError(
                f"no files match {part!r}"
                if any(ch in part for ch in "*?[")
                else f"folder {part} holds no *.json result files"
            )
        paths += found
    if not paths:
        raise UsageError(f"empty SIDE {text!r}")
    return paths


def load_side(text: str) -> list[dict]:
    from gembench.harness.store.results import load_runs

    return [run for path in expand_side(text) for run in load_runs(path)]


def check_decision_args(alpha: float | None, min_effect: float | None) -> None:
    if alpha is not None and not 0 < alpha < 0.5:
        raise UsageError(f"--alpha must be between 0 and 0.5, got {alpha}")
    if min_effect is not None and not 0 <= min_effect < 1:
        raise UsageError(f"--min-effect is a fraction (0.03 = 3%), got {min_effect}")


def write_output(path: Path, text: str) -> None:
    """``text`` to ``path`` atomically (a CI artifact: replaced when it exists, never half-written)."""
    from gembench.harness.store.results import atomic_write

    if path.is_dir():
        raise UsageError(f"--out {path} is a folder; name a file, e.g. {path}/compare.html")
    if not path.parent.is_dir():
        raise UsageError(f"--out {path}: folder {path.parent} does not exist")
    atomic_write(path, text)


def counter_limits(path: str | None, reference: dict):
    """thresholds.Limits for the reference's config and hardware class; None when no file applies."""
    from gembench.harness.regression import thresholds
    from gembench.harness.store.results import field

    if path is None:
        if not thresholds.DEFAULT_PATH.exists():
            return None
        path = str(thresholds.DEFAULT_PATH)
    return thresholds.load(path, str(field(reference, "config.name")), str(field(reference, "env.hardware_class")))


def main(args: argparse.Namespace) -> int:
    from gembench.harness.regression import compare, stats
    from gembench.harness.regression.directions import METRICS
    from gembench.harness.report.verdicts import render_table

    if len(args.sides) < 2:
        raise UsageError("give at least two SIDEs: the reference A and one to compare with it")
    check_decision_args(args.alpha, args.min_effect)
    for m in args.metric or []:
        if m not in METRICS:
            raise UsageError(f"--metric {m!r} is unknown; known: {', '.join(METRICS)}")
    alpha = stats.ALPHA if args.alpha is None else args.alpha
    min_effect = stats.MIN_EFFECT if args.min_effect is None else args.min_effect
    reference = load_side(args.sides[0])
    limits = counter_limits(args.thresholds, reference[0])
    results = [
        compare.compare(reference, load_side(side), alpha, min_effect, args.force, only=args.metric, limits=limits)
        for side in args.sides[1:]
    ]
    if args.format == "json":
        text = json.dumps(
            {"schema": "gembench.compare/1", "comparisons": [compare.to_json(c) for c in results]}, indent=1
        )
    elif args.format == "html":
        from gembench.harness.report.html.build import render_compare

        text = render_compare(results)
    else:
        text = "\n\n".join(render_table(c, args.format) for c in results)
    if args.out:
        write_output(Path(args.out), text + "\n")
        print(f"compare: {args.out}", file=sys.stderr)
    else:
        print(text)
    return 3 if any(not c.comparable and not c.forced for c in results) else 0
