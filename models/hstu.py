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

from gembench.models.heads import SwishMLP, mlp_flops
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


def hstu_layer_flops(lengths: Lengths, dim: int, heads: int, output: str = "gated") -> float:
    """Forward FLOPs of one :class:`HSTULayer`: ``sum_i (10 n_i d^2 + 2 d n_i^2)``.

    8 n d^2 for the fused U, V, Q, K projection (dim -> 4 dim), 2 n d^2 for the output projection
    (6 n d^2 with ``output="concat"``: it reads [U, A V, LN(A V) * U], 3 dim wide), plus
    :func:`hstu_attention_flops`. ``heads`` does not change the count (d_qk = d_v = dim/heads); nor
    do rab, alpha and dropout (elementwise).
    """
    del heads
    ls = _lengths_list(lengths)
    out = 6 if output == "concat" else 2
    return float((8 + out) * sum(ls) * dim * dim) + hstu_attention_flops(ls, dim)


def sequence_input_flops(tokens: int, dim: int, followers: int, mlp: Sequence[int]) -> float:
    """Forward FLOPs of :class:`SequenceInput` over ``tokens`` tokens: with an MLP, one over each
    token's own embedding (dim -> mlp -> dim) and one over its followers' (followers x dim -> mlp
    -> dim); without, none (embeddings summed, position and time embeddings added: no FLOPs)."""
    if not mlp:
        return 0.0
    widths = [*mlp, dim]
    side = mlp_flops(followers * dim, widths) if followers else 0.0
    return tokens * (mlp_flops(dim, widths) + side)


# --------------------------------------------------------------------------------------------
# Modules
# --------------------------------------------------------------------------------------------


class HSTULayer(nn.Module):
    """One HSTU layer over jagged sequences (arXiv 2402.17152, eq. 1-3).

    ``U, V, Q, K = split(SiLU(W1 LN(x)))``; per sequence of real length n,
    ``A = SiLU(alpha Q K^T + rab) / n`` (causal); ``y = x + W2 (LN(A V) * U)``, or with
    ``output="concat"`` (MLPerf DLRMv4) ``y = x + W2 [U, A V, LN(A V) * U]``, W2 3 dim -> dim.
    Head dims are d_qk = d_v = dim / heads.

    Args:
        dim (int): token width d.
        heads (int): attention heads H (divides dim).
        max_len (int): number of relative-position buckets; distances >= max_len - 1 share one.
        attention (str): "jagged" (Triton kernels on CUDA, tiled custom op on CPU) or "padded"
            (whole batch padded); see :mod:`gembench.models.ops.hstu_attention`.
        rab (bool): the relative attention bias (off: no bias parameter, the kernels without one).
        alpha (float): scale of Q K^T (0: none); dropout (float): on W2's input.

    Example::

        layer = HSTULayer(dim=64, heads=2, max_len=256)
        y = layer(x, offsets, max_len=256)  # x: (T, 64), offsets: (B + 1,) -> y: (T, 64)
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        max_len: int,
        attention: str = "jagged",
        rab: bool = True,
        alpha: float = 0.0,
        dropout: float = 0.0,
        output: str = "gated",
    ) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not divisible by heads {heads}")
        if attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {', '.join(ATTENTIONS)}, got {attention!r}")
        if output not in ("gated", "concat"):
            raise ValueError(f"output must be gated or concat, got {output!r}")
        self.dim, self.heads, self.max_len, self.attention = dim, heads, max_len, attention
        self.alpha, self.output = alpha, output
        self.in_norm = nn.LayerNorm(dim)
        self.uvqk = nn.Linear(dim, 4 * dim)
        self.rab = nn.Parameter(torch.zeros(heads, max_len)) if rab else None
        self.out_norm = nn.LayerNorm(dim)
        self.dropout = nn.Dropout(dropout) if dropout else None
        self.out_proj = nn.Linear(3 * dim if output == "concat" else dim, dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Small bias so that SiLU(QK^T + rab) starts dominated by content, yet rab gets gradients.
        if self.rab is not None:
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
        if self.alpha:
            q = q * self.alpha  # SiLU(alpha Q K^T) = SiLU((alpha Q) K^T): no kernel needs the scale
        rab = self.rab if self.rab is not None else q.new_zeros(self.heads, 0)  # R = 0: no bias
        a = hstu_attention(q, k, v, rab, offsets, max_len, attention=self.attention).reshape(T, self.dim)
        y = self.out_norm(a) * u
        if self.output == "concat":
            y = torch.cat([u, a, y.to(u.dtype)], dim=-1)
        if self.dropout is not None:
            y = self.dropout(y)
        return x + self.out_proj(y)


class SequenceArch(nn.Module):
    """A stack of :class:`HSTULayer` over jagged sequences.

    Args:
        num_layers (int): number of layers.
        dim, heads, max_len, attention: as in :class:`HSTULayer`; ``**options`` (rab, alpha,
            dropout, output) too, the same for every layer.

    Example::

        arch = SequenceArch(num_layers=2, dim=64, heads=2, max_len=256)
        y = arch(x, offsets, max_len=256)  # (T, 64) -> (T, 64)
    """

    def __init__(
        self, num_layers: int, dim: int, heads: int, max_len: int, attention: str = "jagged", **options
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(HSTULayer(dim, heads, max_len, attention, **options) for _ in range(num_layers))

    def forward(self, x: torch.Tensor, offsets: torch.Tensor, max_len: int) -> torch.Tensor:
        """(T, dim) jagged values, (B + 1,) offsets -> (T, dim)."""
        for layer in self.layers:
            x = layer(x, offsets, max_len)
        return x


def sequence_arch_flops(lengths: Lengths, num_layers: int, dim: int, heads: int, output: str = "gated") -> float:
    """Forward FLOPs of :class:`SequenceArch`: ``num_layers * hstu_layer_flops``."""
    return num_layers * hstu_layer_flops(lengths, dim, heads, output)


def positions_from_end(offsets: torch.Tensor, total: int) -> torch.Tensor:
    """(T,) each token's distance to its sequence's last token (the last is 0), without a host sync."""
    lengths = offsets[1:] - offsets[:-1]
    seq = torch.repeat_interleave(torch.arange(lengths.numel(), device=offsets.device), lengths, output_size=total)
    return offsets[1:][seq] - 1 - torch.arange(total, device=offsets.device)


class SequenceInput(nn.Module):
    """The tokens HSTU reads, from a sequence's embeddings (MLPerf DLRMv4's preprocessor).

    ``x = MLP(e) + MLP_f([f_1 | ... | f_k])`` over the sequence's own embedding e and its
    followers' f (no MLPs: ``e + sum f``); then ``x sqrt(dim) + P[min(end distance, P - 1)] +
    T[min(sqrt(minutes before the last event), T)]`` with learned position and time embeddings
    (each only if it has buckets), then input dropout. Position and time add no FLOPs.

    forward(own (T, dim), followers [(T, dim)], offsets (B + 1,), age_s (T,) or None) -> (T, dim)
    """

    def __init__(
        self,
        dim: int,
        followers: int = 0,
        mlp: Sequence[int] = (),
        position_buckets: int = 0,
        time_buckets: int = 0,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.dim, self.time_buckets = dim, time_buckets
        self.own = SwishMLP(dim, [*mlp, dim]) if mlp else None
        self.side = SwishMLP(followers * dim, [*mlp, dim]) if mlp and followers else None
        self.position = nn.Embedding(position_buckets, dim) if position_buckets else None
        self.time = nn.Embedding(time_buckets + 1, dim) if time_buckets else None
        self.dropout = nn.Dropout(dropout) if dropout else None
        for table, n in ((self.position, position_buckets), (self.time, time_buckets)):
            if table is not None:
                nn.init.uniform_(table.weight, -((1 / n) ** 0.5), (1 / n) ** 0.5)

    def forward(self, own, followers, offsets, age_s=None) -> torch.Tensor:
        x = own if self.own is None else self.own(own)
        if followers:
            x = x + (self.side(torch.cat(followers, dim=-1)) if self.side is not None else sum(followers))
        if self.position is not None or self.time is not None:
            x = x * self.dim**0.5
        if self.position is not None:
            pos = positions_from_end(offsets, x.shape[0]).clamp(max=self.position.num_embeddings - 1)
            x = x + self.position(pos).to(x.dtype)
        if self.time is not None:
            bucket = torch.sqrt(age_s.clamp(min=0) / 60.0).long().clamp(max=self.time_buckets)
            x = x + self.time(bucket).to(x.dtype)
        return x if self.dropout is None else self.dropout(x)


__all__ = [
    "HSTULayer",
    "SequenceArch",
    "SequenceInput",
    "hstu_attention",
    "hstu_attention_flops",
    "hstu_layer_flops",
    "sequence_arch_flops",
    "sequence_input_flops",
]
