"""Wukong interaction blocks (Zhang et al., "Wukong: Towards a Scaling Law for Large-Scale
Recommendation", arXiv 2403.02545, section 3).

A layer maps n_in embedding tokens (B, n_in, d) to n_fm + n_lcb tokens:
``X' = LN(concat(FMB(X), LCB(X)) + residual(X))`` with
``FMB = reshape(MLP(LN(flatten(X (X^T Y)))))`` (the paper's optimized FM with a learned
projection Y of rank k) and ``LCB = W_L X`` (a linear recombination of tokens).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn


def wukong_layer_flops(n_in: int, dim: int, n_fm: int, n_lcb: int, rank: int, mlp: Sequence[int]) -> float:
    """Forward FLOPs per example of one :class:`WukongLayer` (multiply-add = 2 FLOPs).

    docs/design.md section 2 / arXiv 2403.02545:
    ``4 n_in d k`` (X^T Y, then X (X^T Y))
    ``+ 2 (n_in k h_1 + sum_i h_i h_{i+1} + h_last n_fm d)`` (FMB MLP and its output Linear)
    ``+ 2 n_lcb n_in d`` (LCB), ``+ 2 n_in (n_fm + n_lcb) d`` when the residual is projected.
    LayerNorms, activations and bias adds are not counted (nor by FlopCounterMode).
    """
    widths = [n_in * rank, *mlp, n_fm * dim]
    flops = 4 * n_in * dim * rank
    flops += 2 * sum(a * b for a, b in zip(widths[:-1], widths[1:]))
    flops += 2 * n_lcb * n_in * dim
    if n_in != n_fm + n_lcb:
        flops += 2 * n_in * (n_fm + n_lcb) * dim
    return float(flops)


def interaction_arch_flops(
    num_layers: int, n_in: int, dim: int, n_fm: int, n_lcb: int, rank: int, mlp: Sequence[int]
) -> float:
    """Forward FLOPs per example of :class:`InteractionArch`: the first layer sees n_in tokens,
    every later one n_fm + n_lcb."""
    total = 0.0
    for i in range(num_layers):
        total += wukong_layer_flops(n_in if i == 0 else n_fm + n_lcb, dim, n_fm, n_lcb, rank, mlp)
    return total


class WukongLayer(nn.Module):
    """One Wukong layer: Factorization Machine Block + Linear Compression Block, residual, LN.

    Args:
        n_in (int): input tokens n.
        dim (int): token width d.
        n_fm (int): tokens produced by the FMB (n_F).
        n_lcb (int): tokens produced by the LCB (n_L).
        rank (int): rank k of the optimized FM's learned projection Y (n_in x k).
        mlp (Sequence[int]): hidden widths of the FMB MLP (ReLU after each); a final Linear maps
            to n_fm * dim.

    Example::

        layer = WukongLayer(n_in=8, dim=16, n_fm=4, n_lcb=4, rank=4, mlp=[64])
        y = layer(torch.randn(32, 8, 16))  # (32, 8, 16)
    """

    def __init__(self, n_in: int, dim: int, n_fm: int, n_lcb: int, rank: int, mlp: Sequence[int]) -> None:
        super().__init__()
        self.n_in, self.dim, self.n_fm, self.n_lcb, self.rank = n_in, dim, n_fm, n_lcb, rank
        self.n_out = n_fm + n_lcb
        # Learned FM projection Y: X^T Y compresses the n_in tokens to k, so the FM costs
        # O(n k d) instead of the O(n^2 d) of the full X X^T.
        self.fm_proj = nn.Parameter(torch.empty(n_in, rank))
        self.fm_norm = nn.LayerNorm(n_in * rank)
        layers: list[nn.Module] = []
        width = n_in * rank
        for h in mlp:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, n_fm * dim))
        self.fm_mlp = nn.Sequential(*layers)
        # LCB and the residual projection act over the token axis, not the width: no bias, so
        # they are pure recombinations of tokens.
        self.lcb = nn.Linear(n_in, n_lcb, bias=False)
        self.residual = None if n_in == self.n_out else nn.Linear(n_in, self.n_out, bias=False)
        self.out_norm = nn.LayerNorm(dim)
        nn.init.xavier_uniform_(self.fm_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): (B, n_in, dim) tokens.

        Returns:
            torch.Tensor: (B, n_fm + n_lcb, dim).
        """
        B = x.shape[0]
        xt = x.transpose(1, 2)  # (B, d, n_in): token-axis Linears act on the last dim
        fm = torch.matmul(x, torch.matmul(xt, self.fm_proj.to(x.dtype)))  # (B, n_in, k)
        fmb = self.fm_mlp(self.fm_norm(fm.reshape(B, -1))).view(B, self.n_fm, self.dim)
        lcb = self.lcb(xt).transpose(1, 2)  # (B, n_lcb, d)
        res = x if self.residual is None else self.residual(xt).transpose(1, 2)
        return self.out_norm(torch.cat([fmb, lcb], dim=1) + res)


class InteractionArch(nn.Module):
    """A stack of :class:`WukongLayer`; the first takes n_in tokens, the rest n_fm + n_lcb.

    Args:
        num_layers (int): number of layers.
        n_in, dim, n_fm, n_lcb, rank, mlp: as in :class:`WukongLayer`.

    Attributes:
        n_out (int): output tokens, n_fm + n_lcb (n_in when num_layers == 0).

    Example::

        arch = InteractionArch(2, n_in=10, dim=16, n_fm=4, n_lcb=4, rank=4, mlp=[64])
        y = arch(torch.randn(32, 10, 16))  # (32, 8, 16)
    """

    def __init__(
        self,
        num_layers: int,
        n_in: int,
        dim: int,
        n_fm: int,
        n_lcb: int,
        rank: int,
        mlp: Sequence[int],
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            WukongLayer(n_in if i == 0 else n_fm + n_lcb, dim, n_fm, n_lcb, rank, mlp) for i in range(num_layers)
        )
        self.n_out = n_fm + n_lcb if num_layers else n_in

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, n_in, dim) -> (B, n_out, dim)."""
        for layer in self.layers:
            x = layer(x)
        return x


__all__ = ["InteractionArch", "WukongLayer", "interaction_arch_flops", "wukong_layer_flops"]
