"""Where does a run's start-up go, and do its named phases explain it? Cold and warm compile caches.

Runs `gembench run` on each config (default tiny and small), on one process and on 2 gloo ranks,
twice: first into an empty torch.compile cache (TORCHINDUCTOR_CACHE_DIR of its own: cold), then
again into the cache the first run filled (warm). Prints each run's start-up by phase (the
slowest rank's on ranks; metrics/startup.py), the time to the first timed step, end-to-end MFU
beside the steady state's, and the goal: the phases cover >= 95% of the time to the first step.
About 10 minutes on 2 cores for tiny and small.

  python benchmarks/startup_phases.py
  python benchmarks/startup_phases.py --configs tiny --nprocs 1
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tabulate import tabulate

GOAL = 0.95


def run(config: str, nproc: int, cache: Path, out: Path) -> dict | str:
    """One `gembench run` into ``cache``: its result, or the last line of what it said failing."""
    cmd = [sys.executable, "-m", "gembench", "run", "--config", config, "--steps", "4", "--warmup", "2"]
    cmd += ["--nproc", str(nproc)] if nproc > 1 else []
    env = os.environ | {"TORCHINDUCTOR_CACHE_DIR": str(cache)}
    proc = subprocess.run([*cmd, "--quiet", "--out", str(out)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return "failed: " + (proc.stderr.strip().splitlines() or [""])[-1][:80]
    return json.loads(out.read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="+", default=["tiny", "small"])
    p.add_argument("--nprocs", nargs="+", type=int, default=[1, 2])
    args = p.parse_args()
    load = os.getloadavg()
    columns: dict[str, dict | str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for config in args.configs:
            for nproc in args.nprocs:
                cache = Path(tmp) / f"cache-{config}-{nproc}"
                for warmth in ("cold", "warm"):
                    name = f"{config}, {'1 process' if nproc == 1 else f'{nproc} ranks'}, {warmth}"
                    print(f"{name} ...", file=sys.stderr, flush=True)
                    columns[name] = run(config, nproc, cache, Path(tmp) / f"{len(columns)}.json")
    from gembench.harness.metrics.startup import PHASES

    results = {name: r for name, r in columns.items() if isinstance(r, dict)}
    rows = []
    for phase in PHASES:
        if any(phase in r["startup"]["phases"] for r in results.values()):
            rows.append([phase, *(_s(r, lambda st: st["phases"].get(phase)) for r in results.values())])
    rows += [
        [
            "(unnamed)",
            *(_s(r, lambda st: st["to_first_step_s"] - sum(st["phases"].values())) for r in results.values()),
        ],
        ["to first step", *(_s(r, lambda st: st["to_first_step_s"]) for r in results.values())],
        ["covered", *(f"{100 * r['startup']['covered']:.1f}%" for r in results.values())],
        ["step p50", *(f"{1e3 * r['summary']['step_time_s']['p50']:.1f} ms" for r in results.values())],
        ["MFU, steady", *(f"{100 * r['summary']['mfu']:.2f}%" for r in results.values())],
        ["MFU, end to end", *(f"{100 * r['startup']['end_to_end_mfu']:.3f}%" for r in results.values())],
    ]
    print(f"start-up by phase, seconds (4 timed steps after 2 warm-up); load average at the start {load[0]:.2f}")
    print(tabulate(rows, headers=["phase", *results], disable_numparse=True))
    for name, r in columns.items():
        if not isinstance(r, dict):
            print(f"{name}: {r}")
    met = sum(r["startup"]["covered"] >= GOAL for r in results.values())
    print(f"goal: the phases cover >= {100 * GOAL:g}% of the time to the first step: {met} of {len(columns)}")


def _s(result: dict, pick) -> str:
    value = pick(result["startup"])
    return "-" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    main()
