"""The CPU backend of the jagged weighted sum: segments padded to the longest, one batched matmul.

``gembench::jagged_pool(weights, values, offsets, max_len)`` is fbgemm's ``jagged_jagged_bmm``
(per segment s, ``weights_s^T values_s``: (n_s, k) x (n_s, d) -> (k, d)), the PMA pooling of
models/cross.py. fbgemm's CPU kernel loops over rows, far from the GEMM peak; padded, the same sums
are one bmm each way, and the padding (segments shorter than ``max_len``) costs zeros in memory.
Its FLOPs are registered as the jagged op's (real rows only), so the padding never counts as
model work.
"""

from __future__ import annotations

import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)
import torch

from gembench.models.ops.flops import register_pool_flops


def _padded(t: torch.Tensor, offsets: torch.Tensor, max_len: int) -> torch.Tensor:
    """(N, c) jagged -> (S, max_len, c), zeros past each segment's end."""
    return torch.ops.fbgemm.jagged_to_padded_dense(t, [offsets], [max_len], 0.0)


def _jagged(t: torch.Tensor, offsets: torch.Tensor, rows: int) -> torch.Tensor:
    """(S, max_len, c) -> (rows, c), each segment's first n_s rows (rows given: no host read)."""
    return torch.ops.fbgemm.dense_to_jagged(t, [offsets], rows)[0]


@torch.library.custom_op("gembench::jagged_pool", mutates_args=())
def jagged_pool(weights: torch.Tensor, values: torch.Tensor, offsets: torch.Tensor, max_len: int) -> torch.Tensor:
    """Per segment ``weights_s^T values_s``.

    Args:
        weights: (N, k) jagged; values: (N, d) jagged, the same segments; offsets: (S + 1,) int64;
        max_len: a bound on the segments' lengths.

    Returns:
        (S, k, d).
    """
    w, v = _padded(weights, offsets, max_len), _padded(values, offsets, max_len)
    return torch.bmm(w.transpose(1, 2), v)


@jagged_pool.register_fake
def _(weights, values, offsets, max_len):
    return weights.new_empty(offsets.shape[0] - 1, weights.shape[1], values.shape[1])


@torch.library.custom_op("gembench::jagged_pool_bwd", mutates_args=())
def jagged_pool_bwd(
    grad_out: torch.Tensor, weights: torch.Tensor, values: torch.Tensor, offsets: torch.Tensor, max_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_weights (N, k), grad_values (N, d)) of :func:`jagged_pool` for ``grad_out`` (S, k, d)."""
    w, v = _padded(weights, offsets, max_len), _padded(values, offsets, max_len)
    grad_w = torch.bmm(v, grad_out.transpose(1, 2))  # (S, L, k)
    grad_v = torch.bmm(w, grad_out)  # (S, L, d)
    rows = weights.shape[0]
    return _jagged(grad_w, offsets, rows), _jagged(grad_v, offsets, rows)


@jagged_pool_bwd.register_fake
def _(grad_out, weights, values, offsets, max_len):
    return torch.empty_like(weights), torch.empty_like(values)


def _setup_context(ctx, inputs, output):
    weights, values, offsets, max_len = inputs
    ctx.save_for_backward(weights, values, offsets)
    ctx.max_len = max_len


def _backward(ctx, grad_out):
    weights, values, offsets = ctx.saved_tensors
    grad_w, grad_v = jagged_pool_bwd(grad_out.contiguous(), weights, values, offsets, ctx.max_len)
    return grad_w, grad_v, None, None


jagged_pool.register_autograd(_backward, setup_context=_setup_context)
register_pool_flops(torch.ops.gembench.jagged_pool, torch.ops.gembench.jagged_pool_bwd)
