"""2D sparse parallelism against the 1-D plan on N ranks: what averaging the replicas costs a step,
and how far training moves when they are averaged only every k steps.

Runs `gembench run --nproc N` with the tables sharded over every rank (1-D), then with
`--set sparse_parallel=2d --set replica_sync_every=k --set replica_merge=m` for each k of --every
and m of --merge (the replicas averaged, TorchRec's way, or their updates added up), the same seed
and batches, as a user would; compile off (the tables' layout is under test, not the compiler). Prints,
per layout: the median step, the replica sync's time a step and bytes a rank, the measured
embedding imbalance, and the loss level's drift from 1-D's (the ranks' mean loss, by
harness/regression/numerics.py's level_drift): the evidence a sync interval rests on, at this
model's scale. Exit 1 where a drift is past the tolerance.

  python benchmarks/sparse2d_sync.py                 # tiny, 4 ranks, 200 steps, k = 1, 10, 100, both merges
  python benchmarks/sparse2d_sync.py --config small --steps 100 --every 1,10
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from gembench.harness.regression.numerics import LEVEL_TAIL, LEVEL_TOLERANCE, level_drift


def run(args, switches: list[str], out: Path) -> dict:
    cmd = [sys.executable, "-m", "gembench", "run", "--config", args.config, "--nproc", str(args.nproc)]
    cmd += ["--steps", str(args.steps), "--warmup", "2", "--set", "compile=off", "--quiet", "--out", str(out)]
    cmd += [a for s in switches for a in ("--set", s)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"sparse2d_sync: {' '.join(cmd[2:])} failed:\n{proc.stderr[-2000:]}")
    return json.loads(out.read_text())


def ranks_loss(result: dict) -> list[float]:
    """The job's loss a step: the ranks' mean (each trains its own share of the global batch)."""
    return list(np.mean([r["samples"]["loss"] for r in result["ranks"]], axis=0))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="tiny")
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--every", default="1,10,100", help="the sync intervals to run 2D at")
    p.add_argument("--merge", default="average,updates", help="how the replicas are merged (replica_merge)")
    args = p.parse_args()
    every = [int(k) for k in args.every.split(",")]
    merges = args.merge.split(",")
    if args.steps < 2 * LEVEL_TAIL:
        raise SystemExit(f"sparse2d_sync: --steps must be at least {2 * LEVEL_TAIL}")
    layouts = [("1-D", [])] + [
        (f"2D, {merge} every {k}", ["sparse_parallel=2d", f"replica_sync_every={k}", f"replica_merge={merge}"])
        for merge in merges
        for k in every
    ]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, switches) in enumerate(layouts):
            print(
                f"run {i + 1}/{len(layouts)}: {args.config} on {args.nproc} ranks, {label}, {args.steps} steps",
                flush=True,
            )
            results[label] = run(args, switches, Path(tmp) / f"{i}.json")
    one = results["1-D"]
    reference = ranks_loss(one)
    print(
        f"\n{args.config} on {args.nproc} ranks, {one['run']['dtype']} on {one['env']['device_name']}, commit "
        f"{one['env']['git_commit'][:10]}; {args.steps} steps a run, compile off"
    )
    rows, ok = [], True
    for label, r in results.items():
        sync = r["comm"]["by_kind"].get("embedding_replica_sync")
        stages = r["samples"]["stages"]
        drift = level_drift(reference, ranks_loss(r))
        ok &= drift <= LEVEL_TOLERANCE
        rows.append(
            [
                label,
                f"{1e3 * r['summary']['step_time_s']['p50']:.1f}",
                f"{1e3 * np.mean(stages['replica_sync']):.2f}" if "replica_sync" in stages else "-",
                f"{sync['bytes'] / 2**20:.2f}" if sync else "-",
                f"{r['metrics']['imbalance_max_mean']:.3f}",
                "-" if r is one else f"{drift:.2%}",
            ]
        )
    from tabulate import tabulate

    headers = ["layout", "step ms", "sync ms/step", "sync MiB/rank", "imbalance", "loss level drift"]
    print(tabulate(rows, headers=headers, colalign=("left",) + ("right",) * 5))
    print(
        f"(sync ms/step: the replica_sync stage's mean over every step, syncing or not; the profiled step's "
        f"bytes; loss level drift: the last {LEVEL_TAIL} steps' mean loss against 1-D's, as a share of 1-D's "
        f"first {LEVEL_TAIL} steps'; tolerance {LEVEL_TOLERANCE:.0%}: {'met' if ok else 'NOT met'})"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
