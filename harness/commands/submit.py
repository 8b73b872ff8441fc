"""Submit `gembench run` to a Slurm cluster: one sbatch job, one torchrun per node, one merged result.

The job's ranks run the same `gembench run` a `--nproc` run does, meeting in torchrun's c10d
rendezvous on the first node (nccl between GPUs, gloo between CPU ranks); rank 0 writes one
result with every rank's stages, imbalance and communication, and a `scheduler` section: the
job id, its nodes and their count. The run arguments after `--` are checked here, as `gembench
run` checks them, before anything is submitted. The script and the job's log go to --log-dir;
`--dry-run` prints the script and submits nothing. docs/cluster.md: clusters, the local Slurm.

examples:
  gembench submit --nodes 4 --gpus-per-node 8 --partition gpu --time 1:00:00 --dry-run -- run --config medium
  gembench submit --nodes 2 --gpus-per-node 8 --wait -- run --config medium --set dense_parallel=hsdp
  gembench submit --nodes 1 --ranks-per-node 2 --wait -- run --config tiny --steps 3 --warmup 1
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import shutil
import sys
from pathlib import Path

from gembench.errors import UsageError
from gembench.harness.store.results import RESULTS_DIR, RUNS_DIR

LOG_DIR = RESULTS_DIR / "slurm"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scheduler", choices=("slurm",), default="slurm", help="the cluster's scheduler (default: slurm)")
    p.add_argument("--nodes", type=int, default=1, metavar="N", help="nodes, taken whole (default: 1)")
    p.add_argument(
        "--gpus-per-node", type=int, default=0, metavar="G", help="GPU nodes: G GPUs each, one rank per GPU (nccl)"
    )
    p.add_argument(
        "--ranks-per-node",
        type=int,
        default=None,
        metavar="R",
        help="ranks on each node (default: --gpus-per-node on GPU nodes, 1 on CPU nodes, which use gloo)",
    )
    p.add_argument("--partition", metavar="P", help="Slurm partition (default: the cluster's default one)")
    p.add_argument("--time", metavar="T", help="time limit: minutes, H:MM:SS or D-HH:MM:SS (default: the partition's)")
    p.add_argument("--account", metavar="A", help="Slurm account to charge")
    p.add_argument(
        "--log-dir",
        type=Path,
        default=LOG_DIR,
        metavar="DIR",
        help=f"where the job script and the job's log go (default: {LOG_DIR}/)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the sbatch script; submit nothing")
    p.add_argument(
        "--wait", action="store_true", help="follow the job to its end (Ctrl-C cancels it); exit with the run's status"
    )
    p.add_argument("run_args", nargs=argparse.REMAINDER, metavar="-- run ARGS", help="the `gembench run` to submit")


class _RunParser(argparse.ArgumentParser):
    """`gembench run`'s own parser, its errors one UsageError line instead of usage and exit."""

    def error(self, message):
        raise UsageError(f"run arguments: {message}")


def run_config(argv: list[str], world: int, nnodes: int):
    """The RunConfig of the `run ARGS` to submit, checked as `gembench run` and its ranks would."""
    from gembench.harness.commands.run import configure as configure_run
    from gembench.harness.commands.run import run_config_from
    from gembench.harness.train.distributed.launch import check_job

    if not argv or argv[0] != "run":
        got = f"got {' '.join(argv[:3])!r}" if argv else "got none"
        raise UsageError(f"give the run to submit after --, e.g. -- run --config tiny ({got})")
    parser = _RunParser(prog="gembench run", add_help=False)
    configure_run(parser)
    ns = parser.parse_args(argv[1:])
    if ns.nproc is not None:
        raise UsageError("run arguments: drop --nproc; the ranks are --nodes x --ranks-per-node (or --gpus-per-node)")
    try:
        run = run_config_from(ns).check(distributed=True)
    except UsageError as err:
        raise UsageError(f"run arguments: {err}") from None
    run = dataclasses.replace(run, nproc=world)
    try:
        workload = check_job(run, nnodes)
    except UsageError as err:
        raise UsageError(f"run arguments, at {world} ranks on {nnodes} node(s): {err}") from None
    return run, workload


def _without_out(argv: list[str]) -> tuple[str, ...]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--out":
            skip = True
        elif not a.startswith("--out="):
            out.append(a)
    return tuple(out)


def build_job(args):
    """The checked Job (harness/train/distributed/slurm.py): the flags, then the run arguments."""
    from gembench.harness.store.results import check_writable, safe_name, writable_folder
    from gembench.harness.train.distributed import slurm

    if args.nodes < 1:
        raise UsageError(f"--nodes must be at least 1, got {args.nodes}")
    if args.gpus_per_node < 0:
        raise UsageError(f"--gpus-per-node must be 0 (CPU nodes) or more, got {args.gpus_per_node}")
    ranks = args.ranks_per_node if args.ranks_per_node is not None else (args.gpus_per_node or 1)
    if ranks < 1:
        raise UsageError(f"--ranks-per-node must be at least 1, got {ranks}")
    if args.gpus_per_node and ranks != args.gpus_per_node:
        raise UsageError(
            f"--ranks-per-node {ranks} with --gpus-per-node {args.gpus_per_node}: GPU nodes run one rank "
            "per GPU; drop --ranks-per-node"
        )
    if args.time is not None:
        slurm.check_time(args.time)
    argv = args.run_args[1:] if args.run_args[:1] == ["--"] else args.run_args
    run, workload = run_config(argv, args.nodes * ranks, args.nodes)
    device = "cuda" if args.gpus_per_node else "cpu"
    if run.device != "auto" and run.device.split(":")[0] != device:
        hint = "add --gpus-per-node G for GPU nodes" if run.device.startswith("cuda") else "drop --gpus-per-node"
        raise UsageError(f"run arguments: --device {run.device} on {device.upper()} nodes: {hint}, or drop --device")
    run_args = _without_out(argv[1:]) + (("--device", device) if run.device == "auto" else ())
    name = f"gembench-{safe_name(workload.name)}"
    out = run.out if run.out is not None else RUNS_DIR / f"{name}-{slurm.JOB_ID}.json"
    if not args.dry_run:  # where the job writes, checked (and made) only for a job that will
        if run.out is not None:
            check_writable(out)
        else:
            writable_folder(RUNS_DIR)
        writable_folder(args.log_dir, "--log-dir")
    job = slurm.Job(
        name=name,
        nodes=args.nodes,
        ranks_per_node=ranks,
        gpus_per_node=args.gpus_per_node,
        run_args=run_args,
        out=str(out),
        log=str(args.log_dir.resolve() / f"{name}-%j.log"),
        workdir=os.getcwd(),
        partition=args.partition,
        time=args.time,
        account=args.account,
    )
    return job


def check_partition(job) -> None:
    """The partition exists, has the nodes, and has GPUs if GPUs are asked for (sinfo)."""
    from gembench.harness.train.distributed import slurm

    found = slurm.partitions()
    name = job.partition or next((p.name for p in found.values() if p.default), None)
    if name is None:
        raise UsageError(f"this cluster has no default partition: pick one with --partition ({', '.join(found)})")
    if name not in found:
        raise UsageError(f"--partition {name}: no such partition; sinfo lists {', '.join(found) or 'none'}")
    part = found[name]
    if job.gpus_per_node and part.gpus_per_node == 0:
        raise UsageError(
            f"--gpus-per-node {job.gpus_per_node}: partition {name} has no GPUs (no gpu GRES in sinfo): "
            "give --ranks-per-node R for CPU ranks, or pick a GPU partition with --partition"
        )
    if job.gpus_per_node > part.gpus_per_node:
        raise UsageError(
            f"--gpus-per-node {job.gpus_per_node}: partition {name}'s nodes have at most {part.gpus_per_node} GPUs"
        )
    if job.nodes > part.nodes:
        raise UsageError(f"--nodes {job.nodes}: partition {name} has {part.nodes} node(s)")


def main(args: argparse.Namespace) -> int:
    from gembench.harness.store.results import atomic_write
    from gembench.harness.train.distributed import slurm

    if args.dry_run and args.wait:
        raise UsageError("--wait follows a submitted job and --dry-run submits none: drop one")
    job = build_job(args)
    script = slurm.render(job)
    if args.dry_run:
        print(script, end="")
        return 0
    if shutil.which("sbatch") is None:
        raise UsageError("sbatch is not on PATH: submit from a Slurm login node, or print the script with --dry-run")
    check_partition(job)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    path = atomic_write(Path(job.log).parent / f"{job.name}-{stamp}.sbatch", script)
    job_id = slurm.submit(path)
    path = path.rename(path.with_name(f"{job.name}-{job_id}.sbatch"))
    log = Path(job.log.replace("%j", job_id))
    out = Path(job.out.replace(slurm.JOB_ID, job_id))
    print(f"submitted job {job_id}: {job.nodes} node(s) x {job.ranks_per_node} rank(s)", flush=True)
    print(f"script: {path}\nlog:    {log}\nresult: {out}", flush=True)
    if not args.wait:
        return 0
    try:
        state = slurm.follow(job_id, log)
    except KeyboardInterrupt:
        gone = slurm.cancel(job_id)
        print(
            f"gembench submit: cancelled job {job_id} (scancel)"
            + ("; squeue shows nothing of it" if gone else "; squeue still lists it: see squeue --jobs " + job_id),
            file=sys.stderr,
            flush=True,
        )
        return 130
    if state.state == "COMPLETED" and state.exit_code == 0:
        print(f"gembench submit: job {job_id} completed; result: {out}", file=sys.stderr, flush=True)
        return 0
    said = slurm.error_line(log) or f"see its log {log}"
    status = f"exit status {state.exit_code}" if not state.signal else f"signal {state.signal}"
    print(f"gembench submit: job {job_id} {state.state.lower()} ({status}): {said}", file=sys.stderr, flush=True)
    # the run's own status (1: failed, 2: refused); srun reports a rank it stopped as 128 + signal
    return state.exit_code if 0 < state.exit_code < 128 else 1
