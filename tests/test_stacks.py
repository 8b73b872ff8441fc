"""The two stacks train the same model: no speed may come from broken training."""

import json
from dataclasses import replace

import pytest
import torch
from synthetic import gembench_cli

from gembench.harness.train.runconfig import RunConfig
from gembench.harness.train.runner import run_ab
from gembench.harness.train.stack import STACKS, build_train_state
from gembench.harness.train.step import run_steps
from gembench.models.config import load_config
from gembench.models.data import SyntheticData

STEPS = 6
# bf16 autocast rounds activations to 8 mantissa bits (relative error ~4e-3 per op); after a few
# optimizer steps the mean BCE of both stacks must still agree to 2% (measured on tiny: < 0.2%).
BF16_LOSS_RTOL = 0.02


def losses(cfg, options):
    state = build_train_state(cfg, options, torch.device("cpu"), seed=0)
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


def test_optimized_stack_tracks_baseline(tiny, baseline_losses):
    optimized = losses(tiny, STACKS["optimized"])  # bf16 + torch.compile included
    assert optimized == pytest.approx(baseline_losses, rel=BF16_LOSS_RTOL)


def test_broken_optimizer_is_caught(tiny, baseline_losses):
    # the parity check can fail: a stack that skips the embedding update drifts away
    state = build_train_state(tiny, STACKS["baseline"], torch.device("cpu"), seed=0)
    state.optimizers = state.optimizers[1:]  # drop the embedding Adagrad
    data = SyntheticData(tiny, seed=0)
    broken = run_steps(state, [data.batch(i) for i in range(STEPS)], STEPS, 0, timed=False).loss
    assert broken != pytest.approx(baseline_losses, rel=BF16_LOSS_RTOL)


def test_ab_ratio_and_gate(tmp_path):
    result = run_ab(RunConfig("tiny", rounds=2, steps=4, warmup=2, ab=True))
    ab = result["ab"]
    assert len(ab["round_ratios"]) == 2 and ab["mfu_ratio"] > 0
    assert result["metrics"]["ab_mfu_ratio"] == ab["mfu_ratio"]
    assert result["summary"]["mfu"] / ab["baseline"]["summary"]["mfu"] > 0
    path = tmp_path / "ab.json"
    path.write_text(json.dumps(result))
    measured = ab["mfu_ratio"]

    def gate(min_ratio):
        limits = tmp_path / f"limits-{min_ratio}.toml"
        limits.write_text(f"[defaults]\nmin_ab_mfu_ratio = {min_ratio}\n")
        return gembench_cli("gate", str(path), "--no-baseline", "--thresholds", str(limits), library_warnings=True)

    low = gate(round(measured * 0.5, 4))
    assert low.returncode == 0, low.stdout + low.stderr
    high = gate(round(measured * 2 + 1, 4))  # raised above what was measured
    assert high.returncode == 1 and "ab_mfu_ratio" in high.stdout
