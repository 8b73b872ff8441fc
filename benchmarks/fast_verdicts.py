"""Does `gembench continuous` reach its verdict in time on a fast model? Unchanged code and a 2%
slowdown, each N times, on the DIN-style workload (benchmarks/workloads/din.py, 10-50 ms steps).

Builds a throwaway git repository with four commits of the model: the model, a comment-only
change (unchanged code), a planted slowdown of 2% of a step (a pure-Python loop in the forward,
which changes no op count and no FLOP, so only the step time can catch it) and, instead of it, a
planted start-up delay (a 1 s sleep in the model's factory, judged on startup_s: --cases). The
loop's length is sized on this machine: one `gembench run` of the model gives its step time, and the
loop is timed here. Runs `gembench continuous` on each pair of commits ``--repeats`` times with
``--budget`` seconds (default 300: the goal is a verdict within 5 minutes) and prints, per try,
the verdict, the pairs and the minutes it took. The model's batch is sized so that a step takes
10-50 ms here (the goal's fast models). The goal: "unchanged" and "regressed"
respectively (start-up: never "regressed" unchanged, "regressed" 1 s later), every try within 5
minutes.

  python benchmarks/fast_verdicts.py --repeats 5     # at most 50 minutes on 2 cores
  python benchmarks/fast_verdicts.py --cases "start-up unchanged" "start-up +1 s"
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path

from tabulate import tabulate

HERE = Path(__file__).resolve().parent
GOAL_MINUTES = 5.0
SLOWDOWN = 0.02
FORWARD = "    def forward(self, batch: Batch) -> torch.Tensor:\n"


def step_seconds(batch: int, folder: Path) -> float:
    """The model's median step time here, from a short `gembench run` on one thread."""
    out = folder / f"step-{batch}.json"
    cmd = [sys.executable, "-m", "gembench", "run", "--model", str(HERE / "workloads" / "din.py") + ":din"]
    cmd += ["--model-arg", f"batch={batch}", "--steps", "200", "--quiet", "--out", str(out)]
    subprocess.run(cmd, check=True, env=os.environ | {"OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())["metrics"]["step_time_s"]


FAST_STEPS = (0.010, 0.050)  # the goal's fast models: 10-50 ms a step


def sized(batch: int | None, folder: Path) -> tuple[int, float]:
    """(batch, its step seconds): ``batch``, else the first of 32, 64, ... whose step takes 10 ms here."""
    if batch is not None:
        return batch, step_seconds(batch, folder)
    batch = 32
    step = step_seconds(batch, folder)
    while step < FAST_STEPS[0] and batch < 8192:
        print(f"fast_verdicts: batch {batch} steps in {1e3 * step:.1f} ms, under 10: doubling", file=sys.stderr)
        batch *= 2
        step = step_seconds(batch, folder)
    return batch, step


def loop_length(seconds: float) -> int:
    """How many numbers `sum(range(n))` adds in ``seconds`` here (best of 20 timings)."""
    n = 100_000
    per = min(timeit.repeat(lambda: sum(range(n)), number=1, repeat=20)) / n
    return max(1, round(seconds / per))


FACTORY = "def din("


def repository(folder: Path, waste: int) -> Path:
    repo = folder / "din"
    repo.mkdir()
    shutil.copy(HERE / "workloads" / "din.py", repo / "din.py")
    git = ["git", "-C", str(repo), "-c", "user.email=bench@gembench", "-c", "user.name=bench"]
    subprocess.run([*git, "init", "-q"], check=True)
    model = (repo / "din.py").read_text()
    for where in (FORWARD, FACTORY):
        if where not in model:
            raise SystemExit(f"fast_verdicts: no {where.strip()!r} in workloads/din.py to plant a change in")
    commented = model + "# a comment-only change\n"
    delay = "import time as _time\n\n\n" + FACTORY  # the factory runs before the run's first step
    for message, text in (
        ("the model", model),
        ("a comment", commented),
        ("a 2% slowdown", commented.replace(FORWARD, f"{FORWARD}        sum(range({waste}))  # planted slowdown\n", 1)),
        (
            "a 1 s start-up delay",
            commented.replace(FACTORY, delay, 1).replace(") -> DIN:\n", ") -> DIN:\n    _time.sleep(1.0)\n", 1),
        ),
    ):
        (repo / "din.py").write_text(text)
        subprocess.run([*git, "add", "din.py"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", message], check=True)
    return repo


# case -> (BASE, HEAD, the metric judged, the verdicts that meet the goal)
CASES = {
    "unchanged": ("HEAD~3", "HEAD~2", "step_time_s", ("unchanged",)),
    "2% slower": ("HEAD~2", "HEAD~1", "step_time_s", ("regressed",)),
    "start-up unchanged": ("HEAD~3", "HEAD~2", "startup_s", ("unchanged", "inconclusive")),  # never regressed
    "start-up +1 s": ("HEAD~2", "HEAD", "startup_s", ("regressed",)),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--budget", type=float, default=300.0)
    p.add_argument(
        "--batch",
        type=int,
        default=None,
        help="the model's batch (default: sized here, doubled from 32 until a step takes 10 ms: the goal's models)",
    )
    p.add_argument(
        "--cases", nargs="+", choices=list(CASES), default=list(CASES)[:2], help="which pairs (default: the step's two)"
    )
    p.add_argument("--keep", type=Path, default=None, help="a folder to keep each try's `continuous --json-out` in")
    args = p.parse_args()
    load = os.getloadavg()
    rows, met = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        args.batch, step = sized(args.batch, Path(tmp))
        waste = loop_length(SLOWDOWN * step)
        repo = repository(Path(tmp), waste)
        for case in args.cases:
            base, head, metric, wanted = CASES[case]
            for i in range(args.repeats):
                out = Path(tmp) / f"{case}-{i}.json"
                print(f"{case}, try {i + 1} ...", file=sys.stderr, flush=True)
                cmd = [sys.executable, "-m", "gembench", "continuous", base, head, "--repo", str(repo)]
                cmd += ["--model", "din.py:din", "--model-arg", f"batch={args.batch}", "--budget", str(args.budget)]
                cmd += ["--metric", metric]
                subprocess.run([*cmd, "--quiet", "--json-out", str(out)], capture_output=True, text=True)
                doc = json.loads(out.read_text()) if out.exists() else {}
                if args.keep is not None and out.exists():
                    args.keep.mkdir(parents=True, exist_ok=True)
                    shutil.copy(out, args.keep / out.name)
                row = next((r for r in doc.get("rows", []) if r["metric"] == metric), {})
                ok = row.get("verdict") in wanted and doc.get("minutes", 99) <= GOAL_MINUTES
                met += ok
                rows.append(
                    [
                        case,
                        metric,
                        i + 1,
                        row.get("verdict", "failed"),
                        f"{row.get('ratio') or 0:.4f}",
                        doc.get("pairs"),
                        f"{doc.get('minutes', 0):.1f}",
                        "yes" if ok else "no",
                    ]
                )
    print(
        f"DIN-style workload, batch {args.batch}, step {1e3 * step:.2f} ms here, planted slowdown "
        f"sum(range({waste:,})) = {100 * SLOWDOWN:g}% of it; --budget {args.budget:g} s; "
        f"load average at the start {load[0]:.2f}"
    )
    print(
        tabulate(
            rows,
            headers=["case", "metric", "try", "verdict", "HEAD/BASE", "pairs", "minutes", "goal met"],
            disable_numparse=True,
        )
    )
    print(f"goal: the right verdict within {GOAL_MINUTES:g} minutes: {met} of {len(rows)}")


if __name__ == "__main__":
    main()
