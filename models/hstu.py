"""HSTU sequence blocks (Zhai et al., "Actions Speak Louder than Words", arXiv 2402.17152).

Sequences are jagged: ``x`` of shape (T, d) holds all tokens of B sequences back to back and
``offsets`` (B + 1,) marks where each one starts (offsets[0] = 0, offsets[-1] = T).

The attention itself is an op with several backends behind one dispatcher
(:mod:`gembench.models.ops.hstu_attention`): ``"jagged"`` runs the Triton kernels on CUDA and the
tiled PyTorch op on CPU; ``"padded"`` pads the whole batch (the naive baseline). This module keeps
the blocks and their FLOP formulas and calls the dispatcher only; a backend is imported from its
own module (``gembench.models.ops.pytorch.hstu_attention``, ``...ops.triton.hstu_attention``).
"""

from __future__ import annotations

from typing import Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from gembench.models.ops.hstu_attention import ATTENTIONS, hstu_attention

Lengths = Union[Sequence[int], torch.Tensor]


# --------------------------------------------------------------------------------------------
# Analytic FLOPs (forward, multiply-add = 2 FLOPs)
# --------------------------------------------------------------------------------------------


def _lengths_list(lengths: Lengths) -> list[int]:
    if isinstance(lengths, torch.Tensor):
        return [int(n) for n in lengths.reshape(-1).tolist()]
    return [int(n) for n in lengths]


def hstu_attention_flops(lengths: Lengths, dim: int) -> float:
    """Forward FLOPs of HSTU attention over real jagged lengths: ``2 * dim * sum_i n_i^2``.

    docs/design.md section 2 / arXiv 2402.17152: H (d_qk + d_v) n^2 per sequence (Q K^T and A V, each
    2 H d n^2 for the full square, halved by the causal mask); with d_qk = d_v = dim / H this is
    2 dim n^2. Padding is never counted.
    """
    return float(2 * dim * sum(n * n for n in _lengths_list(lengths)))


def hstu_layer_flops(lengths: Lengths, dim: int, heads: int) -> float:
    """Forward FLOPs of one :class:`HSTULayer`: ``sum_i (10 n_i d^2 + 2 d n_i^2)``.

    8 n d^2 for the fused U, V, Q, K projection (dim -> 4 dim), 2 n d^2 for the output projection,
    plus :func:`hstu_attention_flops`. ``heads`` does not change the count (d_qk = d_v = dim/heads).
    """
    del heads
    ls = _lengths_list(lengths)
    return float(10 * sum(ls) * dim * dim) + hstu_attention_flops(ls, dim)


# --------------------------------------------------------------------------------------------
# Modules
# --------------------------------------------------------------------------------------------


class HSTULayer(nn.Module):
    """One HSTU layer over jagged sequences (arXiv 2402.17152, eq. 1-3).

    ``U, V, Q, K = split(SiLU(W1 LN(x)))``; per sequence of real length n,
    ``A = SiLU(Q K^T + rab) / n`` (causal); ``y = x + W2 (LN(A V) * U)``.
    Head dims are d_qk = d_v = dim / heads.

    Args:
        dim (int): token width d.
        heads (int): attention heads H (divides dim).
        max_len (int): number of relative-position buckets; distances >= max_len - 1 share one.
        attention (str): "jagged" (Triton kernels on CUDA, tiled custom op on CPU) or "padded"
            (whole batch padded); see :mod:`gembench.models.ops.hstu_attention`.

    Example::

        layer = HSTULayer(dim=64, heads=2, max_len=256)
        y = layer(x, offsets, max_len=256)  # x: (T, 64), offsets: (B + 1,) -> y: (T, 64)
    """

    def __init__(self, dim: int, heads: int, max_len: int, attention: str = "jagged") -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not divisible by heads {heads}")
        if attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {', '.join(ATTENTIONS)}, got {attention!r}")
        self.dim, self.heads, self.max_len, self.attention = dim, heads, max_len, attention
        self.in_norm = nn.LayerNorm(dim)
        self.uvqk = nn.Linear(dim, 4 * dim)
        self.rab = nn.Parameter(torch.zeros(heads, max_len))
        self.out_norm = nn.LayerNorm(dim)
        self.out_proj = nn.Linear(dim, dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Small bias so that SiLU(QK^T + rab) starts dominated by content, yet rab gets gradients.
        nn.init.normal_(self.rab, std=0.02)

    def forward(self, x: torch.Tensor, offsets: torch.Tensor, max_len: int) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): (T, dim) jagged values.
            offsets (torch.Tensor): (B + 1,) int64 boundaries, offsets[-1] = T.
            max_len (int): upper bound of the sequence lengths (pad length of the padded path).

        Returns:
            torch.Tensor: (T, dim).
        """
        T = x.shape[0]
        h = F.silu(self.uvqk(self.in_norm(x)))
        u, v, q, k = h.split(self.dim, dim=-1)
        shape = (T, self.heads, self.dim // self.heads)
        q, k, v = q.reshape(shape), k.reshape(shape), v.reshape(shape)
        a = hstu_attention(q, k, v, self.rab, offsets, max_len, attention=self.attention)
        return x + self.out_proj(self.out_norm(a.reshape(T, self.dim)) * u)


class SequenceArch(nn.Module):
    """A stack of :class:`HSTULayer` over jagged sequences.

    Args:
        num_layers (int): number of layers.
        dim, heads, max_len, attention: as in :class:`HSTULayer`.

    Example::

        arch = SequenceArch(num_layers=2, dim=64, heads=2, max_len=256)
        y = arch(x, offsets, max_len=256)  # (T, 64) -> (T, 64)
    """

    def __init__(self, num_layers: int, dim: int, heads: int, max_len: int, attention: str = "jagged") -> None:
        super().__init__()
        self.layers = nn.ModuleList(HSTULayer(dim, heads, max_len, attention) for _ in range(num_layers))

    def forward(self, x: torch.Tensor, offsets: torch.Tensor, max_len: int) -> torch.Tensor:
        """(T, dim) jagged values, (B + 1,) offsets -> (T, dim)."""
        for layer in self.layers:
            x = layer(x, offsets, max_len)
        return x


def sequence_arch_flops(lengths: Lengths, num_layers: int, dim: int, heads: int) -> float:
    """Forward FLOPs of :class:`SequenceArch`: ``num_layers * hstu_layer_flops``."""
    return num_layers * hstu_layer_flops(lengths, dim, heads)


__all__ = [
    "HSTULayer",
    "SequenceArch",
    "hstu_attention",
    "hstu_attention_flops",
    "hstu_layer_flops",
    "sequence_arch_flops",
]
