"""`gembench project --check` on every 2-rank setup here: how far the cost model is from measured runs.

For each config (tiny, small, dcnv2) it measures this host's links alone (`project --calibrate`),
1-rank references at the per-rank batch (one thread; with --twin, the default, beside a second
copy of itself, so that its compute shares the host as each of two ranks does; one under the
planner's plan, one with the pooled tables data-parallel, whose dense-kernel lookups, table-sized
gradients and Adam are what the data_parallel run's stages hold), a 2-rank run
under the planner's plan and under each forced sharding (table_wise, row_wise, column_wise;
table_row_wise and data_parallel on the pooled tables, the sequence tables row_wise, as `run`
refuses them for an EmbeddingCollection), and the links as the planner's-plan run saw them
(`project --calibrate --trace`). Then `--check` of every run, with the isolated and the in-run
links, and the goals beside them: the step within 15%, each stage above 5% of the step within
25%. Printed, not asserted: a shared machine moves every figure.

usage:
  python benchmarks/projection_check.py                        # ~6 minutes on 2 cores, nothing else running
  python benchmarks/projection_check.py --configs tiny --no-twin
  python benchmarks/projection_check.py --keep checks/ --json checks.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLANS = ("auto", "table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel")
POOLED_ONLY = ("table_row_wise", "data_parallel")  # an EmbeddingCollection takes neither


def gembench(*args: str, env: dict | None = None) -> None:
    proc = subprocess.run([sys.executable, "-m", "gembench", *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"projection_check: gembench {' '.join(args)} failed: {proc.stderr.strip()[-2000:]}")


def sharding(config: str, plan: str) -> str:
    """The --sharding spec of ``plan`` for ``config``: its sequence tables row-wise where the plan
    is one an EmbeddingCollection cannot take."""
    from torchrec import EmbeddingBagConfig

    from gembench.harness.train.model import workload_of

    if plan not in POOLED_ONLY:
        return plan
    sequences = [t.name for t in workload_of(config).tables() if not isinstance(t, EmbeddingBagConfig)]
    return ",".join([f"default={plan}", *(f"{t}=row_wise" for t in sequences)])


def reference(config: str, batch: int, out: Path, common: list[str], twin: bool) -> None:
    """The 1-rank result: --nproc 1, one thread; with ``twin`` a second copy runs beside it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "gembench", "run", "--config", config, "--nproc", "1", "--batch", str(batch)]
    copies = [out] + ([out.with_name(out.stem + "-twin.json")] if twin else [])
    procs = [
        subprocess.Popen([*cmd, *common, "--out", str(o)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for o in copies
    ]
    for p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"projection_check: the 1-rank reference of {config} failed: {err.decode()[-2000:]}")


def checked(run: Path, one: Path, cluster: Path) -> dict:
    from gembench.harness.projection.check import check
    from gembench.harness.projection.cluster import load_cluster
    from gembench.harness.store.results import load_result

    return check(load_result(run), load_result(one), load_cluster(str(cluster)), str(run))


def cell(c: dict) -> str:
    st = c["step"]
    out = [s["stage"] for s in c["stages"] if s["held"] and not s["ok"]]
    text = f"{1e3 * st['projected_s']:,.1f} / {1e3 * st['measured_s']:,.1f} ms, {100 * st['error']:+.1f}%"
    return text + (f" (stages outside 25%: {', '.join(out)})" if out else "")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default="tiny,small,dcnv2")
    # 20 timed steps: at 5, the same setup's step moved by about 10% from one try to the next
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--no-twin", dest="twin", action="store_false", help="the 1-rank reference alone on the host")
    p.add_argument("--keep", type=Path, default=None, help="keep the results, traces and cluster files here")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    from gembench.harness.train.model import workload_of

    configs = [c for c in args.configs.split(",") if c]
    common = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--set", "compile=off", "--quiet"]
    began, load = time.time(), os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="gembench-check-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        isolated = root / "here.toml"
        if not isolated.exists():
            gembench("project", "--calibrate", "--out", str(isolated), "--quiet")
        for config in configs:
            batch = workload_of(config).global_batch
            for old in root.glob(f"{config}-*.json"):  # results are never overwritten: a rerun starts clean
                old.unlink()
            shutil.rmtree(root / f"{config}-trace", ignore_errors=True)
            # the 1-rank reference runs the checked plan's kernels: on one rank every sharding but
            # data_parallel is one table-wise lookup, data_parallel TorchRec's dense kernel
            ones = {}
            for kind in ("auto", "data_parallel"):
                ones[kind] = root / f"{config}-one-{kind}.json"
                spec = [] if kind == "auto" else ["--sharding", sharding(config, kind)]
                reference(config, batch // 2, ones[kind], [*spec, *common], args.twin)
            runs = {}
            for plan in PLANS:
                runs[plan] = root / f"{config}-{plan}.json"
                extra = ["--trace", str(root / f"{config}-trace")] if plan == "auto" else []
                spec = [] if plan == "auto" else ["--sharding", sharding(config, plan)]
                gembench("run", "--config", config, "--nproc", "2", *spec, *common, *extra, "--out", str(runs[plan]))
            in_run = root / f"{config}-run.toml"
            in_run.unlink(missing_ok=True)  # fitted again on this run's trace
            trace = str(root / f"{config}-trace")
            gembench("project", "--calibrate", "--trace", trace, "--cluster", str(isolated), "--out", str(in_run))
            for plan, run in runs.items():
                one = ones["data_parallel" if plan == "data_parallel" else "auto"]
                a, b = checked(run, one, isolated), checked(run, one, in_run)
                rows.append({"config": config, "plan": plan, "isolated": a, "in_run": b})
                label = "planner's" if plan == "auto" else plan
                print(f"| {config} | {label} | {cell(a)} | {cell(b)} |", flush=True)
    minutes = (time.time() - began) / 60
    ok = {k: sum(r[k]["step"]["ok"] for r in rows) for k in ("isolated", "in_run")}
    print(
        f"\nstep within 15%: {ok['isolated']}/{len(rows)} with isolated links, {ok['in_run']}/{len(rows)} with "
        f"in-run links (goal: every setup); 1-rank reference {'beside a twin' if args.twin else 'alone'}; "
        f"{minutes:.1f} min; load {load[0]:.1f} -> {os.getloadavg()[0]:.1f}"
    )
    if args.json:
        slim = [
            {
                "config": r["config"],
                "plan": r["plan"],
                **{k: {"step": r[k]["step"], "stages": r[k]["stages"]} for k in ("isolated", "in_run")},
            }
            for r in rows
        ]
        args.json.write_text(json.dumps({"twin": args.twin, "minutes": minutes, "rows": slim}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
