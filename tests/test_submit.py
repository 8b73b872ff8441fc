"""`gembench submit`: the sbatch script, its refusals, and real jobs on the local Slurm.

The script and bad-input tests run everywhere in process (a fake sbatch on PATH records any
submission: none may happen). The jobs need the one-host Slurm of scripts/slurm_local.sh (.ci/run
starts it); where no node is idle they skip with one line.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from synthetic import make_result, run_cli

from gembench.errors import UsageError
from gembench.harness.store.schema import validate
from gembench.harness.train.distributed import slurm

REPO = Path(__file__).resolve().parents[1]
STEPS = ["--steps", "3", "--warmup", "1", "--quiet"]
TINY = ["run", "--config", "tiny", *STEPS]


def one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """sbatch and sinfo of a CPU-only cluster first on PATH; the file sbatch writes if it is called."""
    bin_dir, called = tmp_path / "bin", tmp_path / "sbatch-called"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\necho "$@" > {called}\necho 99\n')
    (bin_dir / "sinfo").write_text('#!/bin/sh\necho "debug* 2 (null)"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    return called


# -- the script ------------------------------------------------------------------------------


def test_dry_run_script_for_4_nodes_of_8_gpus(fake_slurm, capsys, tmp_path):
    argv = ["submit", "--nodes", "4", "--gpus-per-node", "8", "--partition", "gpu", "--time", "1:00:00"]
    code, out, err = run_cli([*argv, "--dry-run", "--", *TINY], capsys)
    assert code == 0, err
    for line in (
        "#SBATCH --nodes=4",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=1:00:00",
        f"#SBATCH --chdir={tmp_path}",
        f"#SBATCH --output={tmp_path}/results/slurm/gembench-tiny-%j.log",
    ):
        assert line in out.splitlines(), (line, out)
    assert "--nnodes=4 --nproc-per-node=8" in out and "nccl" in out
    assert '--rdzv-backend=c10d --rdzv-endpoint="$head_addr:$port" --rdzv-id="$SLURM_JOB_ID"' in out
    assert "-m gembench run --config tiny --steps 3 --warmup 1 --quiet --device cuda" in out
    assert '--out results/runs/gembench-tiny-"$SLURM_JOB_ID".json' in out
    assert subprocess.run(["bash", "-n"], input=out, text=True).returncode == 0  # bash parses it
    assert not fake_slurm.exists() and not (tmp_path / "results").exists()  # printed, nothing made


def test_dry_run_cpu_ranks_use_gloo_and_the_given_out(fake_slurm, capsys, tmp_path):
    code, out, err = run_cli(
        ["submit", "--ranks-per-node", "2", "--dry-run", "--", *TINY, "--out", "my dir/r.json"], capsys
    )
    assert code == 0, err
    assert "gloo" in out and "--gpus-per-node" not in out and "--device cpu" in out
    assert "--nnodes=1 --nproc-per-node=2" in out
    assert "OMP_NUM_THREADS=$((SLURM_CPUS_ON_NODE / 2" in out
    assert "--out 'my dir/r.json'" in out  # quoted for the shell, as given


# -- refusals: one line, exit 2, nothing submitted -------------------------------------------


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--nodes", "0"], "--nodes must be at least 1, got 0"),
        (["--gpus-per-node", "8", "--ranks-per-node", "2"], "GPU nodes run one rank per GPU"),
        (["--time", "an hour"], "--time 'an hour' is not a Slurm time limit"),
        (["--gpus-per-node", "2"], "--gpus-per-node 2: partition debug has no GPUs"),
        (["--partition", "gpu"], "--partition gpu: no such partition; sinfo lists debug"),
        (["--nodes", "4"], "--nodes 4: partition debug has 2 node(s)"),
        (["--dry-run", "--wait"], "--wait follows a submitted job and --dry-run submits none"),
    ],
)
def test_bad_submit_flags(fake_slurm, capsys, argv, words):
    code, out, err = run_cli(["submit", *argv, "--", *TINY], capsys)
    assert code == 2 and out == ""
    assert words in one_line(err)
    assert not fake_slurm.exists()


@pytest.mark.parametrize(
    "run_args, words",
    [
        ([], "give the run to submit after --, e.g. -- run --config tiny (got none)"),
        (["ablate", "--config", "tiny"], "give the run to submit after --"),
        (["run", "--config", "nope"], "unknown config 'nope'"),
        (["run", "--steps", "0"], "--steps must be at least 1"),
        (["run", "--frobnicate"], "run arguments: unrecognized arguments: --frobnicate"),
        (["run", "--ab"], "--ab compares stacks in one process"),
        (["run", "--nproc", "2"], "drop --nproc"),
        (["run", "--config", "tiny", "--batch", "63"], "at 2 ranks on 1 node(s): --batch 63 does not split evenly"),
        (["run", "--config", "tiny", "--sharding", "t9=row_wise"], "no table 't9'"),
        (["run", "--config", "tiny", "--set", "dense_parallel=hsdp"], "replicates across nodes"),
        (["run", "--config", "tiny", "--device", "cuda"], "--device cuda on CPU nodes: add --gpus-per-node"),
    ],
)
def test_run_arguments_gembench_run_refuses(fake_slurm, capsys, run_args, words):
    code, out, err = run_cli(["submit", "--ranks-per-node", "2", "--", *run_args], capsys)
    assert code == 2 and out == ""
    assert words in one_line(err)
    assert not fake_slurm.exists()


def test_hsdp_is_refused_on_one_node_only(fake_slurm, capsys):
    code, out, err = run_cli(
        ["submit", "--nodes", "2", "--dry-run", "--", *TINY, "--set", "dense_parallel=hsdp"], capsys
    )
    assert code == 0, err


def test_no_sbatch_on_path(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # python is already running; nothing else is found
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["submit", "--", *TINY], capsys)
    assert code == 2 and out == ""
    line = one_line(err)
    assert "sbatch is not on PATH" in line and "--dry-run" in line


def test_partitions_read_gpus_from_sinfo(tmp_path, monkeypatch):
    (tmp_path / "sinfo").write_text('#!/bin/sh\nprintf "cpu* 4 (null)\\ngpu 2 gpu:h100:8(S:0-1)\\ngpu 1 gpu:4\\n"\n')
    (tmp_path / "sinfo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    found = slurm.partitions()
    assert found["cpu"] == slurm.Partition("cpu", True, 4, 0)
    assert found["gpu"] == slurm.Partition("gpu", False, 3, 8)


# -- what the job records ----------------------------------------------------------------------


def test_scheduler_section_from_the_slurm_variables():
    assert slurm.job_section({}) is None
    env = {"SLURM_JOB_ID": "41", "SLURM_JOB_NODELIST": "gpu07", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NAME": "x"}
    section = slurm.job_section(env)
    assert section == {
        "name": "slurm",
        "job_id": "41",
        "job_name": "x",
        "nodelist": "gpu07",
        "nodes": ["gpu07"],
        "nnodes": 1,
    }
    doc = make_result()
    validate({**doc, "scheduler": section})  # the schema reads it
    with pytest.raises(UsageError, match="nnodes"):
        validate({**doc, "scheduler": {**section, "nnodes": 0}})
    validate(doc)  # and results without one still validate


def test_error_line_is_the_jobs_own(tmp_path):
    log = tmp_path / "j.log"
    log.write_text(
        "loading\ngembench run: error: rank 0: config file x.toml does not exist\nTraceback\nerror: torchrun\n"
    )
    assert slurm.error_line(log) == "gembench run: error: rank 0: config file x.toml does not exist"
    log.write_text("slurmstepd: error: *** JOB 7 ON local1 CANCELLED AT 2026 DUE TO TIME LIMIT ***\n")
    assert "DUE TO TIME LIMIT" in slurm.error_line(log)
    assert slurm.error_line(tmp_path / "none.log") is None


# -- on the local Slurm ----------------------------------------------------------------------


def idle_nodes() -> list[str]:
    if shutil.which("sinfo") is None:
        return []
    proc = subprocess.run(["sinfo", "-h", "-N", "-t", "idle", "-o", "%N"], capture_output=True, text=True, timeout=30)
    return proc.stdout.split() if proc.returncode == 0 else []


@pytest.fixture(scope="session")  # session: asked first, it skips before a shared run is made
def local_slurm():
    nodes = idle_nodes()
    if not nodes:
        pytest.skip("no local Slurm up: `scripts/slurm_local.sh start` (root, apt) starts one")
    return nodes


def submit(*args, cwd: Path, **popen):
    """`gembench submit ARGS` as a user starts it, SIGINT at its default (house rule)."""
    return subprocess.Popen(
        [sys.executable, "-m", "gembench", "submit", "--log-dir", str(cwd / "logs"), *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        **popen,
    )


def finish(proc, timeout=420) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def job_id(proc) -> str:
    line = proc.stdout.readline()
    assert line.startswith("submitted job "), line + proc.stderr.read()
    return line.split()[2].rstrip(":")


def squeue(job: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True, timeout=30).stdout.strip()


def key_paths(doc, prefix="", depth=3) -> set[str]:
    """Every key path of a result to ``depth`` levels, lists by their length: its shape."""
    if depth == 0:
        return {prefix}
    if isinstance(doc, dict):
        return {prefix} | {p for k, v in doc.items() for p in key_paths(v, f"{prefix}.{k}", depth - 1)}
    if isinstance(doc, list):
        return {f"{prefix}[{len(doc)}]"} | {p for v in doc for p in key_paths(v, f"{prefix}[]", depth - 1)}
    return {prefix}


def test_one_node_two_ranks_equals_nproc_2_in_shape(local_slurm, table_wise, skew_config, tmp_path):
    """The same run as the session's `run --nproc 2` (tests/conftest.py: table_wise), submitted."""
    _, ref, _ = table_wise
    run = ["run", "--config", str(skew_config), "--steps", "3", "--warmup", "1", "--sharding", "table_wise"]
    proc = submit("--ranks-per-node", "2", "--wait", "--", *run, "--quiet", cwd=tmp_path)  # --trace: no field
    job = job_id(proc)
    out, err = finish(proc)
    assert proc.returncode == 0, err[-3000:]
    assert f"job {job} running on " in err and "completed" in err
    result = json.loads((tmp_path / f"results/runs/gembench-skew-{job}.json").read_text())
    sched = result.pop("scheduler")
    assert sched["name"] == "slurm" and sched["job_id"] == job and sched["nnodes"] == 1
    assert len(sched["nodes"]) == 1 and sched["nodes"][0] in local_slurm
    # `run --nproc 2` names its own launcher's time before the ranks began; srun starts these ranks
    launched = {".startup.phases.launch", ".metrics.startup_launch_s"}
    assert key_paths(result) == key_paths(ref) - launched and "launch" in ref["startup"]["phases"]
    assert result["run"]["nproc"] == 2 and result["run"]["backend"] == "gloo"
    assert [r["rank"] for r in result["ranks"]] == [0, 1]
    assert result["plan"] == ref["plan"]  # table-wise: the same tables on the same ranks
    assert "rank 0" in out and "communication" in out  # the job's log, followed as it grew
    assert squeue(job) == ""


def test_two_nodes(local_slurm, tmp_path):
    if len(local_slurm) < 2:
        pytest.skip(f"one idle node ({local_slurm[0]}): this Slurm runs one slurmd per host")
    proc = submit("--nodes", "2", "--wait", "--", *TINY, "--stack", "baseline", "--out", "r.json", cwd=tmp_path)
    job = job_id(proc)
    _, err = finish(proc)
    assert proc.returncode == 0, err[-3000:]
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["scheduler"]["nnodes"] == 2 and result["scheduler"]["job_id"] == job
    assert sorted(result["scheduler"]["nodes"]) == sorted(local_slurm[:2])
    assert result["run"]["nproc"] == 2 and len(result["ranks"]) == 2


def set_partition(state: str) -> None:
    subprocess.run(["scontrol", "update", "PartitionName=debug", f"State={state}"], check=True, timeout=30)


def test_failing_job_ends_wait_with_its_own_error(local_slurm, tmp_path):
    """A config good at submission and broken by the time the job starts: the job's own line."""
    config = tmp_path / "mine.toml"
    good = (REPO / "models/configs/tiny.toml").read_text().replace('name = "tiny"', 'name = "mine"')
    config.write_text(good)
    set_partition("DOWN")  # the job waits in the queue meanwhile (Reason=PartitionDown)
    try:
        proc = submit("--wait", "--", "run", "--config", str(config), *STEPS, cwd=tmp_path)
        job = job_id(proc)
        config.write_text(good.replace("heads = 2", "heads = 3"))
    finally:
        set_partition("UP")
    _, err = finish(proc)
    assert proc.returncode == 1, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"gembench submit: job {job} failed (exit status 1): gembench run: error:"), err
    assert f"{config}: field 'hstu.dim' must be divisible by hstu.heads (3)" in last
    assert f"job {job} pending (PartitionDown)" in err
    assert squeue(job) == ""


def test_ctrl_c_cancels_the_job(local_slurm, tmp_path):
    proc = submit("--wait", "--", "run", "--config", "tiny", "--steps", "100000", "--quiet", cwd=tmp_path)
    timer = threading.Timer(240, proc.kill)  # a job that never runs fails the test, not the suite
    timer.start()
    try:
        job = job_id(proc)
        for line in proc.stderr:
            if f"job {job} running" in line:
                break
        time.sleep(2)  # the ranks are starting
        proc.send_signal(signal.SIGINT)
        _, err = finish(proc, timeout=180)
    finally:
        timer.cancel()
    assert proc.returncode == 130, err
    assert f"gembench submit: cancelled job {job} (scancel); squeue shows nothing of it" in err
    assert squeue(job) == ""
    state = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=30).stdout
    assert "JobState=CANCELLED" in state
