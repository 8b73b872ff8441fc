"""HSTU attention dispatcher: one call for the blocks, the backend picked from kernel and device.

    attention="jagged" on CUDA  -> Triton kernels           (ops/triton/hstu_attention.py)
    attention="jagged" elsewhere -> tiled PyTorch custom op (ops/pytorch/hstu_attention.py)
    attention="padded"          -> whole batch padded       (ops/pytorch/hstu_attention.py)

All backends compute the same function with the same parameters (docs/design.md section 2), so a
stack flips ``kernel`` (harness/train/stack.py: ``jagged``) without touching the weights.
"""

from __future__ import annotations

import warnings

import torch

from gembench.models.ops.pytorch.hstu_attention import hstu_jagged_attention, hstu_padded_attention
from gembench.models.ops.triton.hstu_attention import TRITON_AVAILABLE, triton_hstu_attention

ATTENTIONS = ("jagged", "padded")  # one name for the switch: attention=, and StackOptions.jagged
BACKENDS = ("triton", "tiled", "padded")


def select_backend(attention: str, device: torch.device | str, triton_available: bool = TRITON_AVAILABLE) -> str:
    """The backend ("triton", "tiled" or "padded") for ``attention`` on ``device``."""
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {', '.join(ATTENTIONS)}, got {attention!r}")
    if attention == "padded":
        return "padded"
    if torch.device(device).type == "cuda":
        if triton_available:
            return "triton"
        warnings.warn(
            "triton is not installed: jagged HSTU attention on CUDA falls back to the tiled "
            "PyTorch op (host-planned, far slower)",
            stacklevel=2,
        )
    return "tiled"


def hstu_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rab: torch.Tensor,
    offsets: torch.Tensor,
    max_len: int,
    attention: str = "jagged",
) -> torch.Tensor:
    """Jagged causal HSTU attention through the backend :func:`select_backend` picks.

    Args:
        q, k, v: (T, H, D) jagged values; rab: (H, R) bias (any float dtype: the PyTorch paths
            cast it to q's dtype, the Triton kernels read it as it is and return its gradient in
            its dtype); offsets: (B + 1,) int64; max_len: bound of the lengths (a Python int).
        attention: "jagged" or "padded" (the stack's ``jagged`` switch; ``build_model(attention=...)``).

    Returns:
        (T, H, D).
    """
    backend = select_backend(attention, q.device)
    if backend == "triton":
        return triton_hstu_attention(q, k, v, rab, offsets, max_len)
    if backend == "tiled":
        return hstu_jagged_attention(q, k, v, rab.to(q.dtype), offsets)
    return hstu_padded_attention(q, k, v, rab.to(q.dtype), offsets, max_len)
