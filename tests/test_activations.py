"""FP8 activations (activation_dtype=fp8): what the forward saves is held as float8 rows and
restored for the backward, parameters and small or integer tensors left as they are; on tiny in
fp32 without compile, in this process."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from synthetic import zoo_state

from gembench.harness.train.activations import Fp8Saves, Packed
from gembench.harness.train.memory import SavedForBackward
from gembench.harness.train.stack import stack_options
from gembench.harness.train.step import NoClock, train_step
from gembench.models.config import load_config
from gembench.models.data import SyntheticData

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(64, 128),
        lambda: torch.randn(8, 128, 16).permute(0, 2, 1),  # a view whose strides the backward asserts
        lambda: torch.randn(32, 256).to(torch.bfloat16),
    ],
)
def test_a_saved_tensor_comes_back_in_its_dtype_and_strides_within_fp8s_precision(make):
    t = make()
    packed = Fp8Saves().pack(t)
    assert isinstance(packed, Packed) and packed.q.dtype == torch.float8_e4m3fn and packed.q.numel() == t.numel()
    back = Fp8Saves.unpack(packed)
    assert back.dtype == t.dtype and back.shape == t.shape and back.stride() == t.stride()
    err = (back.float() - t.float()).norm() / t.float().norm()
    assert 0 < err < 0.05, err  # e4m3 keeps 3 mantissa bits: ~2-3% of a Gaussian's norm


def test_weights_views_small_narrow_and_integer_tensors_are_saved_as_they_are():
    hooks, w = Fp8Saves(), torch.nn.Parameter(torch.randn(128, 128))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = w.to(torch.bfloat16)  # what autocast hands a matmul: still a weight
    views = (torch.randn(64, 192)[:, 32:160], torch.randn(1, 128).expand(64, 128))  # across rows, repeated
    narrow = (torch.randn(25000, 1), torch.randn(4096, 8, 2).permute(2, 0, 1))  # rows of 1 and of 8 in memory
    for t in (w, cast, torch.randn(16, 16), torch.arange(8192), torch.randn(128, 128).to_sparse(), *views, *narrow):
        assert hooks.pack(t) is t
    activation = torch.randn(128, 128)
    first = hooks.pack(activation)
    assert hooks.pack(activation) is first  # saved twice, held once
    activation.mul_(2)  # changed in place: a new save
    assert hooks.pack(activation) is not first


def _run(switch: str, batches) -> tuple[list[float], int]:
    """Tiny in fp32 (no compile) from seed 0 over ``batches``: each step's loss, and the bytes the
    first step saved for the backward."""
    options = stack_options("optimized", "fp32", ("compile=off", f"activation_dtype={switch}"))
    state = zoo_state(load_config("tiny"), options, CPU)
    saved = SavedForBackward(list(state.model.parameters()))
    with saved:
        losses = [float(train_step(state, batches[0], NoClock()).mean())]
    losses += [float(train_step(state, b, NoClock()).mean()) for b in batches[1:]]
    return losses, saved.bytes


def test_fp8_saves_hold_less_and_train_like_the_computed_ones():
    cfg = load_config("tiny")
    data = SyntheticData(cfg, seed=0, batch_size=cfg.data.global_batch)
    batches = [data.batch(i) for i in range(6)]
    (loss, held), (loss8, held8) = _run("compute", batches), _run("fp8", batches)
    assert held8 < 0.6 * held, (held8, held)  # fp32 to float8 where the tensor is large enough
    assert loss8[0] == loss[0]  # the forward is unchanged: only what the backward reads is compressed
    assert loss8[1:] != loss[1:] and np.allclose(loss8, loss, rtol=2e-2, atol=0), (loss8, loss)
