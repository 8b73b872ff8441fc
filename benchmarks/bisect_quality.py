"""How quickly does `gembench bisect` find a planted 5% slowdown among 8 commits? Printed, not asserted.

It clones this checkout's HEAD into a throwaway repository and commits 7 more on top: notes that
change nothing that runs, and at --planted-at (default the 4th) a busy-wait of 5% of every
training step (the plant of harness_quality.py --paired, in harness/train/step.py). Then it runs
`gembench bisect FIRST LAST --repo CLONE` as a fresh command with bisect's defaults (tiny, the
measuring flags of `gembench continuous`), --trials times, and prints per trial whether it named
the planted commit, the comparisons it used (BAD against GOOD, then one per bisect step), the
pairs they took, and the minutes; then the goal beside them: the planted commit found in at most 4
comparisons and 25 minutes on a 2-core machine. The load average before and after is printed with
them: on a machine shared with other jobs the pairs a verdict needs grow with the noise.

usage:
  python benchmarks/bisect_quality.py                    # one trial: ~15-25 minutes on 2 cores
  python benchmarks/bisect_quality.py --trials 3 --json bisect.json
  python benchmarks/bisect_quality.py --dry-run          # make the repository, print its commits
  python benchmarks/bisect_quality.py -- --stack baseline --steps 240   # flags passed to bisect
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    from benchmarks.harness_quality import PLANT_AT, PLANT_CODE, _git
except ImportError:  # run as a script: its folder is on the path
    from harness_quality import PLANT_AT, PLANT_CODE, _git

GOAL_COMPARISONS, GOAL_MINUTES = 4, 25


def history(root: Path, commits: int, planted_at: int, fraction: float) -> list[str]:
    """A clone of this checkout's HEAD in ``root`` and ``commits - 1`` commits on it, the one at
    ``planted_at`` the slowdown: every sha, oldest first."""
    here = Path(__file__).resolve().parents[1]
    _git(root.parent, "clone", "--quiet", "--no-local", str(here), str(root))
    shas = [_git(root, "rev-parse", "HEAD")]
    for k in range(1, commits):
        if k == planted_at:
            step = root / "harness" / "train" / "step.py"
            text = step.read_text()
            if PLANT_AT not in text:
                raise SystemExit(f"bisect_quality: cannot plant: {step} no longer has {PLANT_AT.strip()!r}")
            step.write_text(text.replace(PLANT_AT, PLANT_AT + PLANT_CODE.format(fraction=fraction), 1))
            message = f"plant a {100 * fraction:g}% slowdown in every step (bisect_quality)"
        else:
            (root / "docs" / f"bisect-quality-{k}.md").write_text(f"commit {k}: changes nothing that runs\n")
            message = f"commit {k}: a note that changes nothing that runs"
        _git(root, "add", "-A")
        _git(root, "commit", "--quiet", "-m", message)
        shas.append(_git(root, "rev-parse", "HEAD"))
    return shas


def trial(root: Path, shas: list[str], planted: str, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "gembench", "bisect", shas[0], shas[-1], "--repo", str(root), "--format", "json"]
    t0 = time.perf_counter()
    proc = subprocess.run([*cmd, *extra], stdout=subprocess.PIPE, text=True)  # progress on stderr, as it comes
    minutes = (time.perf_counter() - t0) / 60
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        report = {"steps": [], "outcome": proc.stdout.strip()[-300:]}
    steps = report.get("steps", [])
    culprit = (report.get("culprit") or {}).get("sha")
    return {
        "exit_status": proc.returncode,
        "found": culprit == planted,
        "culprit": culprit,
        "comparisons": 1 + len(steps),
        "pairs": report.get("pairs", 0) + sum(s.get("pairs", 0) for s in steps),
        "steps": [(s["sha"][:10], s["verdict"], s.get("ratio"), s.get("pairs")) for s in steps],
        "bad_over_good": report.get("ratio"),
        "minutes": minutes,
        "outcome": report.get("outcome"),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--commits", type=int, default=8, help="commits in the range, GOOD included (default 8)")
    p.add_argument("--planted-at", type=int, default=4, help="which of them plants the slowdown (default 4)")
    p.add_argument("--fraction", type=float, default=0.05, help="the planted slowdown (default 0.05)")
    p.add_argument("--trials", type=int, default=1, help="bisects to run (default 1)")
    p.add_argument("--json", type=Path, default=None, help="write the figures here (rewritten after each trial)")
    p.add_argument("--dry-run", action="store_true", help="make the repository and print its commits only")
    p.add_argument("bisect_args", nargs="*", help="after --: flags passed to `gembench bisect`")
    args = p.parse_args()
    if not 0 < args.planted_at < args.commits:
        raise SystemExit(f"bisect_quality: --planted-at must be between 1 and {args.commits - 1}")
    with tempfile.TemporaryDirectory(prefix="gembench-bisect-quality-") as tmp:
        root = Path(tmp) / "clone"
        shas = history(root, args.commits, args.planted_at, args.fraction)
        planted = shas[args.planted_at]
        print(f"{args.commits} commits {shas[0][:10]}..{shas[-1][:10]}, planted {100 * args.fraction:g}% at {planted}")
        if args.dry_run:
            print(_git(root, "log", "--oneline", f"-{args.commits}"))
            return 0
        figures = {"commits": args.commits, "planted": planted, "fraction": args.fraction, "trials": []}
        for t in range(args.trials):
            load = os.getloadavg()[0]
            result = trial(root, shas, planted, args.bisect_args)
            result.update(load_before=load, load_after=os.getloadavg()[0])
            figures["trials"].append(result)
            said = "found the planted commit" if result["found"] else f"MISSED: {result['outcome']}"
            print(
                f"trial {t + 1}: {said}"
                f" (exit {result['exit_status']}); {result['comparisons']} comparisons, {result['pairs']} pairs, "
                f"{result['minutes']:.1f} min; BAD/GOOD {result['bad_over_good']}; load {load:.1f} -> "
                f"{result['load_after']:.1f}; steps {result['steps']}",
                flush=True,
            )
            if args.json:
                args.json.write_text(json.dumps(figures, indent=1))
    done = figures["trials"]
    found = sum(r["found"] for r in done)
    print(
        f"found {found}/{len(done)}; comparisons max {max(r['comparisons'] for r in done)} "
        f"(goal <= {GOAL_COMPARISONS}); minutes max {max(r['minutes'] for r in done):.1f} (goal <= {GOAL_MINUTES} "
        f"on 2 cores); {os.cpu_count()} CPUs"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
