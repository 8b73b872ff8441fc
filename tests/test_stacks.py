"""The two stacks train the same model: no speed may come from broken training."""

import json
import math
import statistics
from dataclasses import replace

import pytest
import torch
from synthetic import BF16_LOSS_RTOL, run_cli, zoo_state

from gembench.harness.device.hardware import cpu_native_bf16
from gembench.harness.train.measure import run_steps
from gembench.harness.train.runconfig import RunConfig
from gembench.harness.train.runner import run_ab
from gembench.harness.train.stack import STACKS
from gembench.models.config import load_config
from gembench.models.data import SyntheticData

STEPS = 8  # the shared tiny run's warm-up and timed steps (tests/conftest.py)


def losses(cfg, options):
    state = zoo_state(cfg, options, torch.device("cpu"), seed=0)
    data = SyntheticData(cfg, seed=0)
    batches = [data.batch(i) for i in range(STEPS)]
    return run_steps(state, batches, STEPS, warmup=0, timed=False).loss


@pytest.fixture(scope="module")
def tiny():
    return load_config("tiny")


@pytest.fixture(scope="module")
def baseline_losses(tiny):
    return losses(tiny, STACKS["baseline"])


def test_baseline_trains(baseline_losses):
    # parity below is only meaningful if the loss actually moves
    assert baseline_losses[-1] < 0.9 * baseline_losses[0]


def test_fp32_kernels_match_exactly(tiny, baseline_losses):
    # fused TBE + exact Adagrad, jagged attention, fused Adam: the same arithmetic in fp32
    fp32 = replace(STACKS["optimized"], bf16=False, compile=False)
    assert losses(tiny, fp32) == pytest.approx(baseline_losses, rel=1e-4)


def test_optimized_stack_tracks_baseline(tiny_run, baseline_losses):
    """The optimized stack (bf16 where the CPU multiplies it, + torch.compile) as `gembench run
    --config tiny` ran it (the session's shared run, its own process) against the baseline here,
    batch for batch: seed 0, batch i at step i, the timed steps after the warm-up."""
    _, result, _ = tiny_run
    run = result["run"]
    here = RunConfig("tiny").options  # the optimized stack as this host runs it
    assert run["seed"] == 0 and run["warmup"] + run["steps"] == STEPS and run["options"] == here.to_dict()
    assert here.bf16 == cpu_native_bf16() and ("dtype_why" in run) != here.bf16
    assert result["samples"]["loss"] == pytest.approx(baseline_losses[run["warmup"] :], rel=BF16_LOSS_RTOL)


def test_broken_optimizer_is_caught(tiny, baseline_losses):
    # the parity check can fail: a stack that skips the embedding update drifts away
    state = zoo_state(tiny, STACKS["baseline"], torch.device("cpu"), seed=0)
    state.optimizers = state.optimizers[1:]  # drop the embedding Adagrad
    data = SyntheticData(tiny, seed=0)
    broken = run_steps(state, [data.batch(i) for i in range(STEPS)], STEPS, 0, timed=False).loss
    assert broken != pytest.approx(baseline_losses, rel=BF16_LOSS_RTOL)


def test_ab_ratio_and_gate(tmp_path, capsys):
    # fp32, compile off: the ratio's arithmetic and the gate are tested here, the compiled bf16 stack above
    run = RunConfig("tiny", rounds=2, steps=4, warmup=1, ab=True, dtype="fp32", switches=("compile=off",))
    result = run_ab(run)
    ab = result["ab"]
    assert len(ab["round_ratios"]) == 2 and ab["mfu_ratio"] > 0
    assert result["metrics"]["ab_mfu_ratio"] == ab["mfu_ratio"]
    assert result["summary"]["mfu"] / ab["baseline"]["summary"]["mfu"] > 0
    # each round's step time is the median of that round's steps, per stack, in the samples
    assert ab["rounds"] == 2 and ab["steps_per_round"] == 2 and ab["order"] == "ABBA"
    for side, samples in (("optimized", result["samples"]), ("baseline", ab["baseline"]["samples"])):
        steps = samples["step_s"]
        assert len(steps) == 4
        assert ab["round_step_s"][side] == [statistics.median(steps[r * 2 : r * 2 + 2]) for r in range(2)]
    # same batches in a round, same FLOPs: the MFU ratio is the inverse step-time ratio per round
    per_round = [b / o for b, o in zip(ab["round_step_s"]["baseline"], ab["round_step_s"]["optimized"])]
    assert ab["round_ratios"] == pytest.approx(per_round, rel=1e-12)
    assert ab["mfu_ratio"] == pytest.approx(math.sqrt(per_round[0] * per_round[1]), rel=1e-12)  # geometric mean
    lo, hi = ab["mfu_ratio_ci95"]
    assert lo <= min(per_round) <= ab["mfu_ratio"] <= max(per_round) <= hi  # 2 rounds: t(1) is wide
    assert ab["baseline"]["options"] == STACKS["baseline"].to_dict()
    assert (
        result["run"]["options"] == replace(STACKS["optimized"], compile=False, bf16=False).to_dict()
    )  # --set, --dtype
    assert result["metrics"]["baseline_mfu"] == ab["baseline"]["summary"]["mfu"]
    path = tmp_path / "ab.json"
    path.write_text(json.dumps(result))
    measured = ab["mfu_ratio"]

    def gate(min_ratio):  # in process: the command's exit status and table, without a second start-up
        limits = tmp_path / f"limits-{min_ratio}.toml"
        limits.write_text(f"[defaults]\nmin_ab_mfu_ratio = {min_ratio}\n")
        return run_cli(["gate", str(path), "--no-baseline", "--thresholds", str(limits)], capsys)

    code, out, err = gate(round(measured * 0.5, 4))
    assert code == 0, out + err
    code, out, err = gate(round(measured * 2 + 1, 4))  # raised above what was measured
    assert code == 1 and "ab_mfu_ratio" in out
