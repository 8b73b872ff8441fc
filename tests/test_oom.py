"""A device out-of-memory error mid-run ends as one line: stage, peak, the --batch that fits.

Simulated on CPU: the dense half of the tiny model raises torch.OutOfMemoryError as CUDA's
allocator would. (The lead folds this into tests/test_faults.py.)
"""

from __future__ import annotations

import pytest
import torch

from tests.synthetic import run_cli


@pytest.mark.parametrize("args", [[], ["--ab", "--rounds", "2"]])
def test_out_of_memory_in_a_stage_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch, args):
    import gembench.harness.runner as runner

    real = runner.build_train_state

    def build_then_run_out(*a, **k):
        state = real(*a, **k)

        def dense(batch, embedded):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

        state.model.dense = dense
        return state

    monkeypatch.setattr(runner, "build_train_state", build_then_run_out)
    out = tmp_path / "r.json"
    code, stdout, stderr = run_cli(["run", "--config", "tiny", "--stack", "baseline", "--steps", "2",
                                    "--warmup", "0", "--quiet", "--out", str(out), *args], capsys)
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert "out of memory in stage dense_forward" in lines[0]
    assert "peak" in lines[0] and "--batch 63 or smaller" in lines[0] and "no result was written" in lines[0]
    assert not out.exists()


def test_out_of_memory_while_building_names_the_build(tmp_path, capsys, monkeypatch):
    import gembench.harness.runner as runner

    def no_room(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory.")

    monkeypatch.setattr(runner, "build_train_state", no_room)
    code, _, stderr = run_cli(["run", "--config", "tiny", "--stack", "baseline", "--quiet",
                               "--out", str(tmp_path / "r.json")], capsys)
    assert code == 2 and "out of memory in stage build" in stderr
    assert not (tmp_path / "r.json").exists()
