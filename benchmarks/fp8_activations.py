"""FP8 activations against the same stack saving them as computed: memory, time and loss drift.

Runs `gembench run --set activation_dtype=compute` and `... =fp8` as a user would, the same seed and
batches, in alternating order (--rounds 2: compute, fp8, fp8, compute), and prints, beside the
goals: the activation memory one step saves for the backward, the median step time, and how far
fp8's training loss drifts from the computed one's over the run: the per-step relative difference
(the largest, and the last 20 steps' mean) and how far the last 20 steps' mean loss moved, as a
share of the first 20 steps' (the training curve's level, against the loss it started from: a
model that learns its batches by heart ends near 0, where relative differences mean nothing). The
drift tolerance gates that share: exit 1 beyond it.

  python benchmarks/fp8_activations.py                       # small, 200 steps
  python benchmarks/fp8_activations.py --config tiny --steps 200 --rounds 2
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from gembench.harness.commands.ablate_ranks import FP8_MEMORY_GOAL as MEMORY_GOAL
from gembench.harness.commands.ablate_ranks import FP8_TIME_GOAL as TIME_GOAL
from gembench.harness.regression.numerics import LEVEL_TAIL as TAIL
from gembench.harness.regression.numerics import LEVEL_TOLERANCE as DRIFT_TOLERANCE
from gembench.harness.regression.numerics import level_drift, rel_diff


def run(config: str, steps: int, warmup: int, switch: str, out: Path) -> dict:
    cmd = [sys.executable, "-m", "gembench", "run", "--config", config, "--steps", str(steps)]
    cmd += ["--warmup", str(warmup), "--set", f"activation_dtype={switch}", "--quiet", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
    if proc.returncode != 0:
        raise SystemExit(f"fp8_activations: {' '.join(cmd[2:])} failed:\n{proc.stderr[-2000:]}")
    return json.loads(out.read_text())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="small")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1, help="1: compute then fp8; 2: and fp8 then compute")
    args = p.parse_args()
    if args.steps < TAIL:
        raise SystemExit(f"fp8_activations: --steps must be at least {TAIL}")
    order = (["compute", "fp8", "fp8", "compute"] * args.rounds)[: 2 * args.rounds]
    results: dict[str, list[dict]] = {"compute": [], "fp8": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i, switch in enumerate(order):
            print(f"run {i + 1}/{len(order)}: {args.config} activation_dtype={switch}, {args.steps} steps", flush=True)
            results[switch].append(run(args.config, args.steps, args.warmup, switch, Path(tmp) / f"{i}.json"))

    def summary(switch: str) -> tuple[float, float, list[float]]:
        first = results[switch][0]
        act = first["summary"]["activation_bytes"]
        step = statistics.median(r["summary"]["step_time_s"]["p50"] for r in results[switch])
        return act, step, first["samples"]["loss"]

    (act, step, loss), (act8, step8, loss8) = summary("compute"), summary("fp8")
    first = results["compute"][0]
    per_step = [rel_diff(a, b) for a, b in zip(loss, loss8)]
    level, level8 = statistics.fmean(loss[-TAIL:]), statistics.fmean(loss8[-TAIL:])
    drift = level_drift(loss, loss8)
    less, slower = 1 - act8 / act, step8 / step - 1
    print(
        f"\n{args.config}, {first['run']['dtype']} on {first['env']['device_name']}, commit "
        f"{first['env']['git_commit'][:10]}; {args.steps} steps a run, {args.rounds} round(s)"
    )
    print(f"activation memory  {act / 2**20:,.1f} -> {act8 / 2**20:,.1f} MiB saved for backward in one step")
    print(f"step time p50      {1e3 * step:,.1f} -> {1e3 * step8:,.1f} ms")
    print(
        f"loss drift         per step: largest {max(per_step):.2e}, last {TAIL} steps' mean "
        f"{statistics.fmean(per_step[-TAIL:]):.2e}; last {TAIL} steps' mean loss {level:.5f} -> {level8:.5f} "
        f"(first {TAIL} steps' {statistics.fmean(loss[:TAIL]):.5f})"
    )
    ok = drift <= DRIFT_TOLERANCE
    goals = [
        (f"activation memory {less:.0%} lower", f"goal >= {MEMORY_GOAL:.0%}", less >= MEMORY_GOAL),
        (f"step time {slower:+.1%}", f"goal <= +{TIME_GOAL:.0%}", slower <= TIME_GOAL),
        (f"loss level moved {drift:.2%} of the first steps' loss", f"tolerance {DRIFT_TOLERANCE:.0%}", ok),
    ]
    print("\ngoals")
    for what, goal, met in goals:
        print(f"  {what:<50} {goal}: {'met' if met else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
