"""Jagged weighted sum dispatcher: per segment ``weights_s^T values_s``, the backend by device.

    CUDA       -> fbgemm's jagged_jagged_bmm (jagged kernels, no padding)
    elsewhere  -> padded batched matmul (ops/pytorch/jagged_pool.py): fbgemm's CPU kernel is a
                  row loop far from the GEMM peak

Both compute the same function and count the same model FLOPs (real rows).
"""

from __future__ import annotations

import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)
import torch

from gembench.models.ops.flops import register_fbgemm_pool_flops
from gembench.models.ops.pytorch.jagged_pool import jagged_pool as padded_jagged_pool

register_fbgemm_pool_flops()


def jagged_pool(weights: torch.Tensor, values: torch.Tensor, offsets: torch.Tensor, max_len: int) -> torch.Tensor:
    """(N, k) and (N, d) jagged over ``offsets`` (S + 1,) -> (S, k, d); ``max_len`` bounds the
    segments' lengths (a Python int)."""
    if weights.device.type == "cuda":
        return torch.ops.fbgemm.jagged_jagged_bmm(weights, values, offsets, max_len)
    return padded_jagged_pool(weights, values, offsets, max_len)
