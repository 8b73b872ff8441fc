"""NVTX ranges for Nsight Systems, checked on CPU through a recording stand-in."""

from __future__ import annotations

import shutil

import pytest
import torch
from synthetic import run_cli

from gembench.harness.train import nvtx
from gembench.harness.train.stack import build_train_state, stack_options
from gembench.harness.train.step import STAGES, run_steps
from gembench.models.blocks import dense_blocks
from gembench.models.config import load_config
from gembench.models.data import SyntheticData


def tree_lines(nodes, depth: int = 0) -> list[str]:
    out = []
    for name, children in nodes:
        out.append("  " * depth + name)
        out += tree_lines(children, depth + 1)
    return out


@pytest.mark.parametrize("checkpointing", ["none", "hstu"])
def test_one_step_is_a_tree_of_stages_and_blocks(checkpointing):
    recorder = nvtx.Recorder()
    nvtx.enable(recorder)
    try:
        cfg = load_config("tiny")
        options = stack_options("optimized", "fp32", ("compile=off", f"activation_checkpointing={checkpointing}"))
        state = build_train_state(cfg, options, torch.device("cpu"))
        data = SyntheticData(cfg, seed=0, batch_size=cfg.data.global_batch)
        run_steps(state, [data.batch(0)], steps=1, warmup=0)
    finally:
        nvtx.disable()
    print("\n".join(tree_lines(recorder.root)))
    assert recorder.depth == 0  # every range closed
    [(step, stages)] = recorder.root
    assert step == "step" and [name for name, _ in stages] == list(STAGES)
    by_stage = dict(stages)
    blocks = [path for path, _ in dense_blocks(state.model)]
    # each block once in the forward, in the model's order, and once in the backward
    assert [name for name, _ in by_stage["dense_forward"]] == blocks
    assert sorted(name for name, _ in by_stage["backward"]) == sorted(blocks)
    assert all(not children for name, children in by_stage["dense_forward"])
    assert by_stage["data"] == [] and by_stage["optimizer"] == []


def test_ranges_cost_nothing_when_off():
    assert not nvtx.enabled()
    model = build_train_state(
        load_config("tiny"), stack_options("optimized", "fp32", ("compile=off",)), torch.device("cpu")
    ).model
    assert nvtx.apply_block_ranges(model) == 0
    assert not any(m._forward_pre_hooks for m in model.modules())


def test_nsys_says_what_to_install_or_that_it_needs_cuda(capsys, monkeypatch):
    code, _, err = run_cli(["run", "--config", "tiny", "--device", "cpu", "--nsys", "prof"], capsys)
    assert code == 2 and "--nsys profiles CUDA work" in err and len(err.strip().splitlines()) == 1
    if shutil.which("nsys") is None:
        monkeypatch.setattr("gembench.harness.commands.run.cuda_available", lambda: True)
        code, _, err = run_cli(["run", "--config", "tiny", "--nsys", "prof"], capsys)
        assert code == 2 and "nsys (NVIDIA Nsight Systems) is not on PATH" in err
        assert len(err.strip().splitlines()) == 1
