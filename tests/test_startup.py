"""Start-up by phase: the clock itself, and what a one-process run and a 2-rank job record of it."""

import time

import pytest

from gembench.harness.metrics import startup
from gembench.harness.metrics.mfu import end_to_end


def test_the_clock_times_its_phases_until_ready_and_no_later():
    clock = startup.Startup()
    with clock.phase("build"):
        time.sleep(0.05)
    time.sleep(0.05)  # between phases: unnamed
    clock.ready()
    with clock.phase("compile"):  # after ready: not the start-up
        time.sleep(0.01)
    rec = clock.record()
    assert list(rec["phases"]) == ["build"] and rec["phases"]["build"] >= 0.05
    assert rec["to_first_step_s"] >= 0.1
    assert 0.3 < rec["covered"] < 0.7  # the unnamed half is not explained
    assert rec["from"] == "run"
    with pytest.raises(ValueError, match="unknown start-up phase"):
        with clock.phase("lunch"):
            pass


def test_a_process_clock_starts_with_the_process_and_names_its_imports(monkeypatch):
    started = startup.process_started()
    assert started is not None and started < time.time()
    monkeypatch.setenv(startup.LAUNCHED_AT_ENV, str(started - 2.0))
    clock = startup.Startup(from_process_start=True)
    clock.ready()
    rec = clock.record()
    assert rec["from"] == "process"
    assert rec["phases"]["launch"] == pytest.approx(2.0, abs=0.05)
    assert rec["to_first_step_s"] == pytest.approx(time.time() - started + 2.0, abs=0.5)


def test_end_to_end_mfu_is_the_steady_mfu_times_goodput_at_equal_steps():
    job = end_to_end(3.0, [1.0] * 3, [1e12] * 3, peak_tflops=1.0)
    assert job["job_s"] == 6.0 and job["goodput"] == 0.5
    assert job["end_to_end_mfu"] == pytest.approx(0.5 * 3.0)  # 3 TFLOP a step over 1 s against 1 TFLOP/s


def check_startup(result: dict, phases: set[str]) -> None:
    st = result["startup"]
    assert st["from"] == "process"
    assert phases <= set(st["phases"])
    assert st["covered"] >= 0.95, st
    assert result["metrics"]["startup_s"] == st["to_first_step_s"]
    for name, seconds in st["phases"].items():
        assert result["metrics"][f"startup_{name}_s"] == seconds
    assert 0 < st["goodput"] < 1
    assert 0 < st["end_to_end_mfu"] < result["summary"]["mfu"]


def test_a_run_records_its_start_up_by_phase(tiny_run):
    proc, result, _ = tiny_run
    check_startup(result, {"imports", "config", "peak", "data", "flops", "build", "compile", "warmup"})
    assert "to the first timed step" in proc.stdout and "end-to-end MFU" in proc.stdout


def test_every_rank_records_its_start_up_and_the_job_takes_the_slowest(table_wise):
    proc, result, _ = table_wise
    check_startup(result, {"launch", "imports", "process_group", "peak", "build", "plan", "shard", "compile"})
    st = result["startup"]
    ready = st["ranks_to_first_step_s"]
    assert len(ready) == 2 and st["to_first_step_s"] == max(ready) and ready[st["rank"]] == max(ready)
    assert "the slowest rank" in proc.stdout
