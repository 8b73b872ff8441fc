"""Checkpoints: a run resumed from a save goes on bit for bit; torn, foreign and overwriting saves
are refused in one line; a failing save ends the saving, not the run."""

import errno
import json
import shutil

import pytest
from synthetic import gembench_cli

from gembench.harness.store.schema import validate
from gembench.harness.train import checkpoint

TINY = ["run", "--config", "tiny", "--warmup", "1", "--quiet"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """tiny, 1 warm-up and 6 timed steps, saved after steps 3 and 6: (result, its folder)."""
    d = tmp_path_factory.mktemp("saved")
    proc = gembench_cli(
        *TINY, "--steps", "6", "--checkpoint-every", "3", "--checkpoint-dir", str(d / "ck"), "--out", str(d / "a.json")
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((d / "a.json").read_text()), d


def test_saves_are_whole_and_recorded(saved):
    result, d = saved
    ck = result["checkpoint"]
    assert [s["step"] for s in ck["saves"]] == [3, 6] and ck["async"]
    for s in ck["saves"]:
        folder = checkpoint.step_folder(d / "ck", s["step"])
        assert checkpoint.complete(folder) and s["bytes"] == checkpoint.folder_bytes(folder) > 0
        assert json.loads((folder / checkpoint.MANIFEST).read_text())["step"] == s["step"]
    assert result["metrics"]["checkpoint_blocked_s"] == ck["blocked_s"] > 0
    st = result["startup"]
    assert st["job_s"] == pytest.approx(st["to_first_step_s"] + sum(result["samples"]["step_s"]) + ck["blocked_s"])
    validate(result, "the saving run")


def test_a_resumed_run_goes_on_bit_for_bit(saved, tmp_path):
    result, d = saved
    out = tmp_path / "b.json"
    proc = gembench_cli(*TINY, "--steps", "3", "--resume", str(d / "ck" / "step-00000003"), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    resumed = json.loads(out.read_text())
    # the saving run's timed steps are steps 1..6; the resumed one's warm-up is step 3, its timed 4..6
    assert resumed["samples"]["loss"] == result["samples"]["loss"][3:6]
    assert resumed["checkpoint"]["resumed_at"] == 3 and "restore" in resumed["startup"]["phases"]


def test_a_folder_of_saves_resumes_from_its_latest_complete_one(saved, tmp_path):
    _, d = saved
    ck = tmp_path / "ck"
    shutil.copytree(d / "ck", ck)
    (ck / "step-00000006" / checkpoint.METADATA).unlink()  # a save cut short
    assert checkpoint.resolve(ck) == ck / "step-00000003"


def refused(args, tmp_path) -> str:
    out = tmp_path / "r.json"
    proc = gembench_cli(*args, "--out", str(out))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert not out.exists() and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_a_torn_save_is_never_loaded(saved, tmp_path):
    _, d = saved
    torn = tmp_path / "step-00000003"
    shutil.copytree(d / "ck" / "step-00000003", torn)
    (torn / checkpoint.METADATA).unlink()
    line = refused([*TINY, "--steps", "2", "--resume", str(torn)], tmp_path)
    assert "incomplete" in line and ".metadata" in line


def test_a_save_of_another_run_is_refused(saved, tmp_path):
    _, d = saved
    line = refused([*TINY, "--steps", "2", "--batch", "32", "--resume", str(d / "ck")], tmp_path)
    assert "saved with another model or config" in line  # the batch is in the identity


def test_saves_are_never_overwritten(saved, tmp_path):
    _, d = saved
    args = [*TINY, "--steps", "6", "--checkpoint-every", "3", "--checkpoint-dir", str(d / "ck")]
    assert "already holds step-00000003" in refused(args, tmp_path)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--checkpoint-every", "3"], "go together"),
        (["--checkpoint-every", "0", "--checkpoint-dir", "x"], "at least 1"),
        (["--nproc", "2", "--resume", "x"], "one process for now"),
    ],
)
def test_bad_checkpoint_flags_are_one_line(tmp_path, args, message):
    assert message in refused([*TINY, "--steps", "2", *args], tmp_path)


def test_a_failing_save_ends_the_saving_not_the_run(monkeypatch, tmp_path, capsys):
    import torch.distributed.checkpoint as dcp

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(dcp, "async_save", full)
    monkeypatch.setattr(checkpoint, "app_state", lambda state, step: {})
    saver = checkpoint.Saver(object(), 2, tmp_path, {}, due=frozenset(checkpoint.due_steps(0, 10, 2)))
    for i in range(10):
        saver(i)
    record = saver.record()
    assert record["saves"] == [] and "No space left on device" in record["error"] and "step 2" in record["error"]
    assert capsys.readouterr().out.count("warning") == 1


def test_a_checkpoint_dir_that_cannot_be_made_is_refused_before_any_step(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    args = [*TINY, "--steps", "2", "--checkpoint-every", "1", "--checkpoint-dir", str(blocker / "ck")]
    assert "--checkpoint-dir" in refused(args, tmp_path) and not (blocker / "ck").exists()
