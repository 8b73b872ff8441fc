"""One self-contained HTML page of results: MFU across commits, stages, ranks, communication.

RESULTS are result files, baseline files, quoted globs (** recurses) or folders (every *.json
below); by default results/runs/*.json and results/baselines/**/*.json. Writes DIR/index.html:
one file with every figure inline as SVG, no scripts, no network requests, so it opens from disk
and can be kept as a CI artifact. Runs are grouped by config, hardware class, stack, dtype, ranks
and batch (what one baseline applies to); in each group: MFU and step time per commit in git
order with the baseline, the gate's limits and the commits where a `gembench gate` check fails;
the latest run's stages; for --nproc runs per-rank stages, embedding load and communication; each
run's counters and environment. A corrupt or foreign JSON file is named in a warning and skipped.
index.html is replaced if it exists; result files are never touched (docs/report.md).

exit status: 0 written (perhaps with warnings), 2 nothing to report or a usage error.

examples:
  gembench report --out report/                         # results/runs + results/baselines
  gembench report 'ci/runs/*.json' results/baselines --out public/
  gembench report r1.json r2.json --out /tmp/r && xdg-open /tmp/r/index.html
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gembench.errors import UsageError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "results",
        nargs="*",
        metavar="RESULTS",
        help="result/baseline files, 'globs' or folders (default results/runs/*.json and results/baselines/**/*.json)",
    )
    parser.add_argument(
        "--out", required=True, metavar="DIR", help="folder to write index.html into (created if missing)"
    )
    parser.add_argument(
        "--thresholds",
        default="results/thresholds.toml",
        help="gate limits to draw and check (default %(default)s; missing: drawn without limits)",
    )


def write_page(out_dir: Path, text: str) -> Path:
    """DIR/index.html, atomically: a reader sees the old page or the new one, never half of one."""
    from gembench.harness.store.results import atomic_write, writable_folder

    return atomic_write(writable_folder(out_dir, "--out") / "index.html", text)


def main(args: argparse.Namespace) -> int:
    from gembench.harness.report.html import collect

    out_dir = Path(args.out)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir} is a file; name a folder (index.html is written into it)")
    inputs = args.results or list(collect.DEFAULT_INPUTS)
    loaded = collect.load(inputs)
    if not loaded.runs and not loaded.projections:
        where = ", ".join(inputs)
        extra = f" ({len(loaded.skipped)} file(s) skipped, see above)" if loaded.skipped else ""
        raise UsageError(
            f"no gembench results in {where}{extra}; make some with "
            "`gembench run --config tiny` (writes results/runs/*.json) or name result files"
        )
    thresholds = args.thresholds if Path(args.thresholds).is_file() else None
    if thresholds is None:
        print(
            f"gembench report: warning: no thresholds file {args.thresholds}; drawing without gate limits",
            file=sys.stderr,
        )
    known = collect.commit_order()
    groups = collect.group(loaded, known)
    for i, g in enumerate(groups, 1):
        print(f"gembench report: [{i}/{len(groups)}] {g.title}: {len(g.runs)} run(s)", file=sys.stderr)
        collect.gate_group(g, thresholds)
    from gembench.harness.report.html import build

    text = build.render(groups, loaded.skipped, inputs, loaded.files, collect.head(), thresholds, loaded.projections)
    path = write_page(out_dir, text)
    print(f"report: {path} ({len(text) / 1024:.0f} KiB, {sum(len(g.runs) for g in groups)} runs, {len(groups)} groups)")
    return 0
