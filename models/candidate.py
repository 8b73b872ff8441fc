"""Target-aware ranking blocks (a config's [candidate] section; MLPerf DLRMv4, HSTU's target-aware
formulation, arXiv 2402.17152 section 2.2).

The candidate is the last event of the behaviour sequence, so causal attention lets it attend to
the whole history and nothing attends to it; the pooled features enter as contextual tokens in
front of the history:

    pooled (B, F, D) ─ ContextualArch ─► (B, F, d) ─┐ prepended (cross.prepend_tokens)
    sequence (T, d) ─ SequenceInput ────────────────┴─► SequenceArch ─► user = output at the candidate
    the candidate's embeddings [own | followers'] ─ ItemArch (SwishMLP) ─► item (B, d)
    heads.UserItemHead(user, item) ─► logits (B, tasks)
"""

from __future__ import annotations

import math

import torch
from torch import nn


class ContextualArch(nn.Module):
    """Pooled features -> contextual tokens, each feature through its own Linear (one batched
    matmul): (B, F, dim_in) -> (B, F, dim_out).

    Example::

        tokens = ContextualArch(8, 16, 32)(torch.randn(4, 8, 16))  # (4, 8, 32)
    """

    def __init__(self, features: int, dim_in: int, dim_out: int) -> None:
        super().__init__()
        std = math.sqrt(2.0 / (dim_in + dim_out))
        self.weight = nn.Parameter(torch.randn(features, dim_in, dim_out) * std)
        self.bias = nn.Parameter(torch.zeros(features, 1, dim_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias, x.transpose(0, 1), self.weight).transpose(0, 1)


def contextual_arch_flops(batch: int, features: int, dim_in: int, dim_out: int) -> float:
    """Forward FLOPs of :class:`ContextualArch` for ``batch`` examples: ``2 B F dim_in dim_out``."""
    return float(2 * batch * features * dim_in * dim_out)


def last_rows(offsets: torch.Tensor) -> torch.Tensor:
    """(B,) the row of each sequence's last token (the candidate) in its jagged values."""
    return offsets[1:] - 1


__all__ = ["ContextualArch", "contextual_arch_flops", "last_rows"]
