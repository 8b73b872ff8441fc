"""NVTX ranges for Nsight Systems, checked on CPU through a recording stand-in."""

from __future__ import annotations

import shutil

import pytest
import torch
from synthetic import run_cli, zoo_state

from gembench.harness.train import nvtx
from gembench.harness.train.measure import run_steps
from gembench.harness.train.stack import stack_options
from gembench.models.config import load_config
from gembench.models.data import SyntheticData
from gembench.models.zoo import ZooWorkload


class Recorder:
    """A stand-in for torch.cuda.nvtx that keeps the ranges as a tree: [(name, children)]."""

    def __init__(self):
        self.root: list = []
        self._stack = [self.root]

    def range_push(self, name: str) -> None:
        node = (name, [])
        self._stack[-1].append(node)
        self._stack.append(node[1])

    def range_pop(self) -> None:
        if len(self._stack) == 1:
            raise AssertionError("range_pop without a range open")
        self._stack.pop()

    @property
    def depth(self) -> int:
        return len(self._stack) - 1


def tree_lines(nodes, depth: int = 0) -> list[str]:
    out = []
    for name, children in nodes:
        out.append("  " * depth + name)
        out += tree_lines(children, depth + 1)
    return out


@pytest.mark.parametrize("checkpointing", ["none", "hstu"])
def test_one_step_is_a_tree_of_stages_and_blocks(checkpointing):
    recorder = Recorder()
    nvtx.enable(recorder)
    try:
        cfg = load_config("tiny")
        options = stack_options("optimized", "fp32", ("compile=off", f"activation_checkpointing={checkpointing}"))
        state = zoo_state(cfg, options, torch.device("cpu"))
        data = SyntheticData(cfg, seed=0, batch_size=cfg.data.global_batch)
        run_steps(state, [data.batch(0)], steps=1, warmup=0)
    finally:
        nvtx.disable()
    print("\n".join(tree_lines(recorder.root)))
    assert recorder.depth == 0  # every range closed
    [(step, stages)] = recorder.root
    # the forward is one call of the workload's: one range, its sparse share a range inside it
    assert step == "step" and [name for name, _ in stages] == ["data", "forward", "loss", "backward", "optimizer"]
    by_stage = dict(stages)
    blocks = list(ZooWorkload(cfg).blocks())
    # the lookups first, then each block once in the forward, in the model's order, and once in the backward
    assert [name for name, _ in by_stage["forward"]] == ["sparse_forward", *blocks]
    assert sorted(name for name, _ in by_stage["backward"]) == sorted(blocks)
    assert all(not children for name, children in by_stage["forward"])
    assert by_stage["data"] == [] and by_stage["optimizer"] == []


def test_ranges_cost_nothing_when_off():
    assert not nvtx.enabled()
    model = zoo_state(load_config("tiny"), stack_options("optimized", "fp32", ("compile=off",))).model
    blocks = ZooWorkload(load_config("tiny")).blocks()
    assert nvtx.apply_block_ranges(model, blocks) == 0
    hooked = [m for p in blocks for m in model.get_submodule(p).modules() if m._forward_pre_hooks]
    assert not hooked  # (the sparse timer's hooks are on the sparse arch, never on a dense block)


def test_nsys_says_what_to_install_or_that_it_needs_cuda(capsys, monkeypatch):
    code, _, err = run_cli(["run", "--config", "tiny", "--device", "cpu", "--nsys", "prof"], capsys)
    assert code == 2 and "--nsys profiles CUDA work" in err and len(err.strip().splitlines()) == 1
    if shutil.which("nsys") is None:
        monkeypatch.setattr("gembench.harness.commands.run.cuda_available", lambda: True)
        code, _, err = run_cli(["run", "--config", "tiny", "--nsys", "prof"], capsys)
        assert code == 2 and "nsys (NVIDIA Nsight Systems) is not on PATH" in err
        assert len(err.strip().splitlines()) == 1
