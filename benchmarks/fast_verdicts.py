"""Does `gembench continuous` reach its verdict in time on a fast model? Unchanged code and a 2%
slowdown, each N times, on the DIN-style workload (benchmarks/workloads/din.py, 15 ms steps here).

Builds a throwaway git repository with three commits of the model: the model, a comment-only
change (unchanged code), and a planted slowdown of about 2% of a step: a pure-Python loop in the
forward (about 0.3 ms), which changes no op count and no FLOP, so only the step time can catch
it. Runs `gembench
continuous` on each pair of commits ``--repeats`` times with ``--budget`` seconds (default 300:
the goal is a verdict within 5 minutes) and prints, per try, the verdict, the pairs and the
minutes it took. The goal: "unchanged" and "regressed" respectively, every try within 5 minutes.

  python benchmarks/fast_verdicts.py --repeats 5     # about 20 minutes on 2 cores
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tabulate import tabulate

HERE = Path(__file__).resolve().parent
GOAL_MINUTES = 5.0
WASTE = """    def forward(self, batch: Batch) -> torch.Tensor:
        sum(range(16_000))  # planted: ~0.3 ms of Python, ~2% of a 15 ms step
"""


def repository(folder: Path) -> Path:
    repo = folder / "din"
    repo.mkdir()
    shutil.copy(HERE / "workloads" / "din.py", repo / "din.py")
    git = ["git", "-C", str(repo), "-c", "user.email=bench@gembench", "-c", "user.name=bench"]
    subprocess.run([*git, "init", "-q"], check=True)
    model = (repo / "din.py").read_text()
    for message, text in (
        ("the model", model),
        ("a comment", model + "# a comment-only change\n"),
        ("a 2% slowdown", model.replace("    def forward(self, batch: Batch) -> torch.Tensor:\n", WASTE, 1)),
    ):
        (repo / "din.py").write_text(text)
        subprocess.run([*git, "add", "din.py"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", message], check=True)
    return repo


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--budget", type=float, default=300.0)
    p.add_argument("--batch", type=int, default=32)
    args = p.parse_args()
    load = os.getloadavg()
    rows, met = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        repo = repository(Path(tmp))
        for case, (base, head, want) in {
            "unchanged": ("HEAD~2", "HEAD~1", "unchanged"),
            "2% slower": ("HEAD~1", "HEAD", "regressed"),
        }.items():
            for i in range(args.repeats):
                out = Path(tmp) / f"{case}-{i}.json"
                print(f"{case}, try {i + 1} ...", file=sys.stderr, flush=True)
                cmd = [sys.executable, "-m", "gembench", "continuous", base, head, "--repo", str(repo)]
                cmd += ["--model", "din.py:din", "--model-arg", f"batch={args.batch}", "--budget", str(args.budget)]
                subprocess.run([*cmd, "--quiet", "--json-out", str(out)], capture_output=True, text=True)
                doc = json.loads(out.read_text()) if out.exists() else {}
                row = next((r for r in doc.get("rows", []) if r["metric"] == "step_time_s"), {})
                ok = row.get("verdict") == want and doc.get("minutes", 99) <= GOAL_MINUTES
                met += ok
                rows.append(
                    [
                        case,
                        i + 1,
                        row.get("verdict", "failed"),
                        f"{row.get('ratio') or 0:.4f}",
                        doc.get("pairs"),
                        f"{doc.get('minutes', 0):.1f}",
                        "yes" if ok else "no",
                    ]
                )
    print(
        f"DIN-style workload, batch {args.batch}, --budget {args.budget:g} s; load average at the start {load[0]:.2f}"
    )
    print(
        tabulate(
            rows, headers=["case", "try", "verdict", "HEAD/BASE", "pairs", "minutes", "goal met"], disable_numparse=True
        )
    )
    print(f"goal: the right verdict within {GOAL_MINUTES:g} minutes: {met} of {len(rows)}")


if __name__ == "__main__":
    main()
