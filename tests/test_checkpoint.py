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
        (["--nproc", "2", "--pipeline", "--resume", "x"], "drop --pipeline"),
    ],
)
def test_bad_checkpoint_flags_are_one_line(tmp_path, args, message):
    assert message in refused([*TINY, "--steps", "2", *args], tmp_path)


@pytest.fixture(scope="module")
def saved_on_ranks(tmp_path_factory):
    """tiny on 2 ranks, 1 warm-up and 6 timed steps, saved after steps 3 and 6: (result, its folder)."""
    d = tmp_path_factory.mktemp("ranks")
    args = [*TINY, "--nproc", "2", "--steps", "6", "--checkpoint-every", "3", "--checkpoint-dir", str(d / "ck")]
    proc = gembench_cli(*args, "--out", str(d / "a.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((d / "a.json").read_text()), d


def test_ranks_save_their_shards_into_one_save(saved_on_ranks):
    result, d = saved_on_ranks
    ck = result["checkpoint"]
    assert [s["step"] for s in ck["saves"]] == [3, 6] and len(ck["ranks_blocked_s"]) == 2
    assert ck["blocked_s"] >= max(ck["ranks_blocked_s"])  # each save blocks the job as its slowest rank
    assert sum(ck["ranks_bytes"]) < ck["bytes"] and min(ck["ranks_bytes"]) > 0  # each its shards; rank 0 the metadata
    folder = checkpoint.step_folder(d / "ck", 3)
    assert checkpoint.complete(folder) and sorted(p.name for p in folder.glob("*.distcp")) == [
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    assert json.loads((folder / checkpoint.MANIFEST).read_text())["world_size"] == 2
    validate(result, "the ranks' saving run")


def test_ranks_resume_bit_for_bit(saved_on_ranks, tmp_path):
    result, d = saved_on_ranks
    out = tmp_path / "b.json"
    args = [*TINY, "--nproc", "2", "--steps", "3", "--resume", str(d / "ck" / "step-00000003"), "--out", str(out)]
    proc = gembench_cli(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    resumed = json.loads(out.read_text())
    assert resumed["samples"]["loss"] == result["samples"]["loss"][3:6]
    assert resumed["checkpoint"]["resumed_at"] == 3 and "restore" in resumed["startup"]["phases"]


def test_fsdp2s_sharded_dense_state_resumes_bit_for_bit(tmp_path):
    """FSDP2 over the dense part: its parameters and Adam state are DTensors, saved and loaded by
    every rank as its shard."""
    fsdp = [*TINY, "--nproc", "2", "--set", "dense_parallel=fsdp"]
    saving = gembench_cli(
        *fsdp,
        "--steps",
        "4",
        "--checkpoint-every",
        "2",
        "--checkpoint-dir",
        str(tmp_path / "ck"),
        "--out",
        str(tmp_path / "a.json"),
    )
    assert saving.returncode == 0, saving.stderr[-3000:]
    resumed = gembench_cli(
        *fsdp, "--steps", "2", "--resume", str(tmp_path / "ck" / "step-00000002"), "--out", str(tmp_path / "b.json")
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("a.json", "b.json"))
    assert a["run"]["options"]["dense_parallel"] == "fsdp"
    # the saving run's timed steps are steps 1..4; the resumed one's warm-up is step 2, its timed 3..4
    assert b["samples"]["loss"] == a["samples"]["loss"][2:4]


def test_a_save_of_another_world_size_is_refused_before_any_rank_starts(saved_on_ranks, tmp_path):
    _, d = saved_on_ranks
    line = refused([*TINY, "--steps", "2", "--resume", str(d / "ck")], tmp_path)
    assert "saved with another world size (world_size 2, this run 1)" in line


def test_a_one_process_save_is_refused_by_ranks_in_one_line(saved, tmp_path):
    _, d = saved
    line = refused([*TINY, "--nproc", "2", "--steps", "2", "--resume", str(d / "ck")], tmp_path)
    assert "saved with another world size (world_size 1, this run 2)" in line


def test_a_failing_save_ends_the_saving_not_the_run(monkeypatch, tmp_path, capsys):
    import torch.distributed.checkpoint as dcp

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(dcp, "async_save", full)
    held = checkpoint.Held(snapshot=lambda step: {}, apply=None)
    saver = checkpoint.Saver(held, 2, tmp_path, {}, due=frozenset(checkpoint.due_steps(0, 10, 2)))
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
