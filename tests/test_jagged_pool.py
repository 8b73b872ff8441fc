"""The jagged weighted sum's CPU backend (padded bmm) against fbgemm's jagged_jagged_bmm, the
reference: values, gradients, FLOPs and compile."""

import fbgemm_gpu  # noqa: F401
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from gembench.models.ops.jagged_pool import jagged_pool
from gembench.models.ops.pytorch.jagged_pool import jagged_pool as padded

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _batch(lengths, k, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64)
    n = int(offsets[-1])
    w = torch.randn(n, k, generator=g).to(dtype).requires_grad_()
    v = torch.randn(n, d, generator=g).to(dtype).requires_grad_()
    return w, v, offsets, max(lengths)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lengths", [[5, 0, 17, 1, 9], [33]])
def test_the_padded_pool_is_fbgemms_jagged_bmm_forward_and_backward(dtype, lengths):
    w, v, offsets, max_len = _batch(lengths, 2, 16, dtype)
    want = torch.ops.fbgemm.jagged_jagged_bmm(w, v, offsets, max_len)
    got = jagged_pool(w, v, offsets, max_len)
    assert got.shape == want.shape == (len(lengths), 2, 16) and got.dtype == dtype
    grad = torch.randn_like(want)
    want_grads = torch.autograd.grad(want, (w, v), grad)
    got_grads = torch.autograd.grad(got, (w, v), grad)
    scale = float(want.detach().abs().max())
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype] * scale, rtol=TOL[dtype])
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a.float(), b.float(), atol=TOL[dtype] * float(b.abs().max()), rtol=TOL[dtype])
    assert all(got[i].abs().sum() == 0 for i, n in enumerate(lengths) if n == 0)  # an empty segment sums to 0


def test_the_op_passes_torchs_custom_op_checks():
    w, v, offsets, max_len = _batch([3, 0, 8], 2, 4, torch.float32)
    torch.library.opcheck(torch.ops.gembench.jagged_pool.default, (w, v, offsets, max_len))


def test_its_flops_are_the_real_rows_not_the_padded_ones():
    w, v, offsets, max_len = _batch([2, 40], 3, 8, torch.float32)  # padded: 80 rows for 42 real ones
    with FlopCounterMode(display=False) as counter:
        padded(w, v, offsets, max_len).sum().backward()
    assert counter.get_total_flops() == 3 * 2 * 42 * 3 * 8  # forward + backward (2x), real rows
    with FlopCounterMode(display=False) as counter:  # fbgemm's op, the CUDA backend, counts the same
        torch.ops.fbgemm.jagged_jagged_bmm(w, v, offsets, max_len).sum().backward()
    assert counter.get_total_flops() == 3 * 2 * 42 * 3 * 8


def test_it_compiles_without_a_graph_break():
    w, v, offsets, max_len = _batch([4, 7, 1], 2, 8, torch.float32)
    f = torch.compile(lambda w, v: jagged_pool(w, v, offsets, max_len).square().sum(), fullgraph=True)
    torch.testing.assert_close(f(w, v), jagged_pool(w, v, offsets, max_len).square().sum())
