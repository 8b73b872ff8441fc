"""Slurm for `gembench submit`: the sbatch script, and the sbatch, sinfo, scontrol, sacct, scancel calls.

One job, one step: `srun` starts one torchrun per node, torchrun starts the node's ranks, and
they meet in a c10d rendezvous on the allocation's first node (the way torchtitan's
multinode_trainer.slurm launches), at a port derived from the job id so that two jobs on one head
node do not collide. The ranks run `gembench run` as under any torchrun (rank.py): nccl between
GPUs, gloo between CPU ranks, rank 0 writes the one merged result, with a ``scheduler`` section
(``job_section``) naming the job, its nodes and their count. Nodes are taken whole
(``--exclusive``): a benchmark shares its nodes with no other job.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from gembench.errors import UsageError

JOB_ID = "{job}"  # stands for the job id in Job.out; the script reads it from $SLURM_JOB_ID
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "STAGE_OUT"}
TIME = re.compile(
    r"(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2}|UNLIMITED|INFINITE)"
)
ERROR_LINE = re.compile(r"^gembench [a-z_]+: error: .*")


@dataclass(frozen=True)
class Job:
    """What one submission asks for; ``out`` holds JOB_ID where the job id goes."""

    name: str
    nodes: int
    ranks_per_node: int
    gpus_per_node: int  # 0: CPU nodes
    run_args: tuple[str, ...]  # `gembench run`'s arguments, --out excepted
    out: str
    log: str  # Slurm's --output, %j the job id
    workdir: str
    python: str = sys.executable
    partition: str | None = None
    time: str | None = None
    account: str | None = None

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node


def check_time(text: str) -> str:
    if not TIME.fullmatch(text):
        raise UsageError(
            f"--time {text!r} is not a Slurm time limit: give minutes, H:MM:SS or D-HH:MM:SS "
            "(e.g. 30, 2:00:00, 1-00:00:00)"
        )
    return text


def _with_job_id(path: str) -> str:
    """``path`` quoted for the shell, JOB_ID replaced by "$SLURM_JOB_ID"."""
    return '"$SLURM_JOB_ID"'.join(shlex.quote(part) if part else "" for part in path.split(JOB_ID))


def render(job: Job) -> str:
    """The sbatch script: readable, every choice commented, resubmittable as it is."""
    gpus = job.gpus_per_node
    what = f"{job.ranks_per_node} GPU(s)" if gpus else f"{job.ranks_per_node} CPU rank(s)"
    backend = "nccl between the GPUs" if gpus else "gloo between the CPU ranks"
    directives = [
        f"--job-name={job.name}",
        f"--nodes={job.nodes}",
        "--ntasks-per-node=1",  # one torchrun per node, which starts the node's ranks
        *([f"--gpus-per-node={gpus}"] if gpus else []),
        "--exclusive",
        *([f"--partition={job.partition}"] if job.partition else []),
        *([f"--time={job.time}"] if job.time else []),
        *([f"--account={job.account}"] if job.account else []),
        f"--output={job.log}",
        f"--chdir={job.workdir}",
    ]
    run = " ".join(shlex.quote(a) for a in job.run_args)
    lines = [
        "#!/bin/bash",
        f"# gembench submit: {job.nodes} node(s) x {what} = {job.world} ranks, {backend};",
        "# nodes taken whole (a benchmark shares them with no other job). Resubmit with `sbatch <this file>`.",
        *(f"#SBATCH {d}" for d in directives),
        "set -euo pipefail",
        "",
        "# torchrun's c10d rendezvous on the allocation's first node, at a port of this job's own",
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "head_addr=$(scontrol show node \"$head_node\" | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')",
        "head_addr=${head_addr:-$head_node}",
        "port=$((20000 + SLURM_JOB_ID % 10000))",
        "# a node's CPUs split over its ranks, as `gembench run --nproc` splits this host's",
        f"export OMP_NUM_THREADS=$((SLURM_CPUS_ON_NODE / {job.ranks_per_node} > 0 ? "
        f"SLURM_CPUS_ON_NODE / {job.ranks_per_node} : 1))",
        'echo "gembench submit: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST ($SLURM_JOB_NUM_NODES node(s)),'
        ' rendezvous $head_addr:$port"',
        "",
        'srun --ntasks-per-node=1 --cpus-per-task="$SLURM_CPUS_ON_NODE"'
        + (f" --gpus-per-node={gpus}" if gpus else "")
        + " --kill-on-bad-exit=1 \\",
        f"    {shlex.quote(job.python)} -m torch.distributed.run \\",
        f"    --nnodes={job.nodes} --nproc-per-node={job.ranks_per_node} --max-restarts=0 \\",
        '    --rdzv-backend=c10d --rdzv-endpoint="$head_addr:$port" --rdzv-id="$SLURM_JOB_ID" \\',
        f"    -m gembench run {run} \\",
        f"    --out {_with_job_id(job.out)}",
    ]
    return "\n".join(lines) + "\n"


# --- the Slurm commands -----------------------------------------------------------------------


def tool(name: str, *args: str, timeout: float = 60) -> str:
    """Run a Slurm command; its stdout, or one line naming the command and what it said."""
    try:
        proc = subprocess.run([name, *args], capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise UsageError(
            f"{name} is not on PATH: run on a Slurm login node (or print the script with --dry-run)"
        ) from None
    except subprocess.TimeoutExpired:
        raise UsageError(f"{name} {' '.join(args)} did not answer in {timeout:.0f} s: is slurmctld up?") from None
    if proc.returncode != 0:
        said = (proc.stderr.strip() or proc.stdout.strip() or f"exit status {proc.returncode}").splitlines()[-1]
        raise UsageError(f"{name} {' '.join(args)}: {said}")
    return proc.stdout


@dataclass(frozen=True)
class Partition:
    name: str
    default: bool
    nodes: int
    gpus_per_node: int  # the most any of its nodes has


def partitions() -> dict[str, Partition]:
    """Every partition sinfo lists: its node count and the GPUs (gpu GRES) of its largest node."""
    found: dict[str, Partition] = {}
    for line in tool("sinfo", "--noheader", "--format=%P %D %G").splitlines():
        name, count, gres = line.split(maxsplit=2)
        default, name = name.endswith("*"), name.rstrip("*")
        gpus = sum(_count(item) for item in gres.split(",") if item.startswith("gpu:"))
        old = found.get(name)
        found[name] = Partition(
            name,
            default or (old is not None and old.default),
            int(count) + (old.nodes if old else 0),
            max(gpus, old.gpus_per_node if old else 0),
        )
    return found


def _count(gres: str) -> int:
    """GPUs in one GRES item: gpu:8, gpu:h100:8, gpu:h100:8(S:0-1)."""
    last = gres.split("(")[0].rsplit(":", 1)[-1]
    return int(last) if last.isdigit() else 0


def submit(script: Path) -> str:
    """sbatch the script; the job id."""
    return tool("sbatch", "--parsable", str(script)).strip().split(";")[0]


@dataclass(frozen=True)
class JobState:
    state: str  # Slurm's JobState: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ...
    exit_code: int  # the batch script's exit status (Slurm's ExitCode=code:signal)
    signal: int
    reason: str = ""
    nodes: str = ""

    @property
    def active(self) -> bool:
        return self.state in ACTIVE


def job_state(job_id: str) -> JobState:
    """From scontrol while the controller remembers the job (MinJobAge), else from sacct."""
    proc = subprocess.run(["scontrol", "show", "job", "--oneliner", job_id], capture_output=True, text=True, timeout=60)
    if proc.returncode == 0 and "JobState=" in proc.stdout:
        get = lambda key: (re.search(rf"\b{key}=(\S+)", proc.stdout) or [None, ""])[1]  # noqa: E731
        code, signal = (get("ExitCode") or "0:0").split(":")
        nodes = get("NodeList")
        return JobState(get("JobState"), int(code), int(signal), get("Reason"), "" if nodes == "(null)" else nodes)
    text = tool(
        "sacct", "--jobs", job_id, "--allocations", "--noheader", "--parsable2", "--format=State,ExitCode,NodeList"
    )
    if not text.strip():
        raise UsageError(f"job {job_id}: neither scontrol nor sacct knows it any more")
    state, exit_code, nodes = text.splitlines()[0].split("|")
    code, signal = exit_code.split(":")
    return JobState(state.split()[0], int(code), int(signal), "", nodes)


def cancel(job_id: str, wait_s: float = 90) -> bool:
    """scancel the job and wait until squeue shows nothing of it; whether it is gone."""
    tool("scancel", job_id)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        proc = subprocess.run(["squeue", "--noheader", "--jobs", job_id], capture_output=True, text=True, timeout=60)
        if proc.returncode != 0 or not proc.stdout.strip():  # an unknown job id: purged already
            return True
        time.sleep(0.5)
    return False


def follow(job_id: str, log: Path, out=sys.stdout, err=sys.stderr) -> JobState:
    """Follow the job to its end: its state changes on ``err``, its log as it grows on ``out``."""
    shown, offset, poll, next_poll = None, 0, 1.0, 0.0
    while True:
        now = time.monotonic()
        if now >= next_poll:
            state = job_state(job_id)
            seen = (state.state, state.reason if state.state == "PENDING" else "")
            if seen != shown and state.active:  # the end is the caller's to tell
                where = f" on {state.nodes}" if state.state == "RUNNING" and state.nodes else ""
                why = f" ({state.reason})" if state.state == "PENDING" and state.reason not in ("", "None") else ""
                print(f"gembench submit: job {job_id} {state.state.lower()}{why}{where}", file=err, flush=True)
                shown = seen
            poll, next_poll = min(poll * 1.5, 5.0), now + poll
            if not state.active:
                _tail(log, offset, out)
                return state
        offset = _tail(log, offset, out)
        time.sleep(0.5)


def _tail(log: Path, offset: int, out) -> int:
    try:
        with open(log, "rb") as fh:
            fh.seek(offset)
            chunk = fh.read()
    except FileNotFoundError:  # not started yet
        return offset
    if chunk:
        out.write(chunk.decode(errors="replace"))
        out.flush()
    return offset + len(chunk)


def error_line(log: Path) -> str | None:
    """The job's own error: the first `gembench ...: error:` line of its log, else its last line
    that says error (Slurm's own, e.g. a time limit), else None."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return None
    ours = [line for line in lines if ERROR_LINE.match(line)]
    if ours:
        return ours[0]
    said = [line for line in lines if "error" in line.lower()]
    return said[-1] if said else None


# --- inside the job ---------------------------------------------------------------------------


def scheduler_section() -> dict:
    """The result's sections for a job run under a scheduler: {"scheduler": job_section()}, or none."""
    job = job_section()
    return {"scheduler": job} if job else {}


def job_section(environ=os.environ) -> dict | None:
    """The result's ``scheduler`` section from the SLURM_* variables a rank sees; None outside Slurm."""
    job_id = environ.get("SLURM_JOB_ID")
    if not job_id:
        return None
    nodelist = environ.get("SLURM_JOB_NODELIST", "")
    section = {
        "name": "slurm",
        "job_id": job_id,
        "job_name": environ.get("SLURM_JOB_NAME"),
        "cluster": environ.get("SLURM_CLUSTER_NAME"),
        "partition": environ.get("SLURM_JOB_PARTITION"),
        "nodelist": nodelist,
        "nodes": _hostnames(nodelist),
        "nnodes": int(environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES") or 1),
    }
    return {k: v for k, v in section.items() if v is not None}


def _hostnames(nodelist: str) -> list[str]:
    """Slurm's compressed node list (node[01-04]) expanded by scontrol; as given where scontrol is missing."""
    if not nodelist:
        return []
    try:
        proc = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
        if proc.returncode == 0 and proc.stdout.strip():
            return proc.stdout.split()
    except (OSError, subprocess.SubprocessError):
        pass
    return [nodelist]
