"""InterFormer-style cross summaries (Zeng et al., "InterFormer: Towards Effective Heterogeneous
Interaction Learning for Click-Through Rate Prediction", arXiv 2411.09852, section 4).

* :class:`NonSeqSummary` compresses the non-sequence tokens into one CLS token that
  :func:`prepend_cls` puts in front of each behaviour sequence, so the sequence model sees them.
* :class:`SequenceSummary` summarises each (HSTU-processed) sequence as
  gating([CLS | PMA tokens | the most recent tokens]), with a jagged PMA (no padded work).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)
import torch
from torch import nn

from gembench.models.ops.jagged_pool import jagged_pool

Lengths = Union[Sequence[int], torch.Tensor]


# --------------------------------------------------------------------------------------------
# Analytic FLOPs (forward, multiply-add = 2 FLOPs)
# --------------------------------------------------------------------------------------------


def nonseq_summary_flops(n_tokens: int, dim_in: int, dim_seq: int, batch: int = 1) -> float:
    """Forward FLOPs of :class:`NonSeqSummary` for a batch of ``batch`` examples (per example by
    default): one Linear over the flattened tokens, ``2 B n_tokens dim_in dim_seq``."""
    return float(2 * batch * n_tokens * dim_in * dim_seq)


def summary_flops(lengths: Lengths, dim_seq: int, dim_out: int, pma_seeds: int, recent: int, heads: int) -> float:
    """Forward FLOPs of :class:`SequenceSummary` for a batch.

    ``lengths`` are the sequence lengths the summary sees, CLS included. Per sequence of n tokens,
    d = dim_seq, d_qk = d_v = d / H, k_p = pma_seeds (docs/design.md section 2, PMA):
    ``2 n d H (d_qk + d_v)`` (K, V projections) ``+ 2 k_p H (d_qk + d_v) n`` (scores, weighted
    sum) ``+ 2 k_p H d_v d`` (PMA output projection); plus, over the S = 1 + k_p + recent summary
    tokens, the gate ``2 S d^2`` and the projection ``2 S d dim_out``. The seeds' queries are
    parameters (no per-batch projection).
    """
    ls = lengths.reshape(-1).tolist() if isinstance(lengths, torch.Tensor) else list(lengths)
    T, B, d = int(sum(ls)), len(ls), dim_seq
    del heads  # H (d_qk + d_v) = 2 d whatever the head count
    S = 1 + pma_seeds + recent
    pma = 2 * T * d * 2 * d + 2 * pma_seeds * 2 * d * T + 2 * B * pma_seeds * d * d
    return float(pma + 2 * B * S * d * d + 2 * B * S * d * dim_out)


# --------------------------------------------------------------------------------------------
# Modules
# --------------------------------------------------------------------------------------------


class NonSeqSummary(nn.Module):
    """Non-sequence summary: (B, n_tokens, dim_in) -> CLS token (B, dim_seq).

    A Linear over the *flattened* tokens (not their mean): each feature keeps its own weights, so
    the CLS can tell which feature carried what, at n_tokens x the cost of a mean.

    Args:
        n_tokens (int): non-sequence tokens per example.
        dim_in (int): their width.
        dim_seq (int): width of the sequence tokens the CLS joins.

    Example::

        cls = NonSeqSummary(8, 16, 32)(torch.randn(4, 8, 16))  # (4, 32)
    """

    def __init__(self, n_tokens: int, dim_in: int, dim_seq: int) -> None:
        super().__init__()
        self.proj = nn.Linear(n_tokens * dim_in, dim_seq)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, n_tokens, dim_in) -> (B, dim_seq)."""
        return self.proj(x.reshape(x.shape[0], -1))


def prepend_cls(values: torch.Tensor, offsets: torch.Tensor, cls: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Puts ``cls[b]`` in front of sequence b of a jagged batch; differentiable in both.

    Args:
        values (torch.Tensor): (T, d) jagged values.
        offsets (torch.Tensor): (B + 1,) int64 boundaries.
        cls (torch.Tensor): (B, d).

    Returns:
        tuple: values' (T + B, d) and offsets' (B + 1,), offsets'[b] = offsets[b] + b.
    """
    return prepend_tokens(values, offsets, cls.unsqueeze(1))


def prepend_tokens(
    values: torch.Tensor, offsets: torch.Tensor, tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Puts ``tokens[b]`` (k of them) in front of sequence b of a jagged batch; differentiable in both.

    Args:
        values (torch.Tensor): (T, d) jagged values.
        offsets (torch.Tensor): (B + 1,) int64 boundaries.
        tokens (torch.Tensor): (B, k, d).

    Returns:
        tuple: values' (T + k B, d) and offsets' (B + 1,), offsets'[b] = offsets[b] + k b.
    """
    T, (B, k) = values.shape[0], tokens.shape[:2]
    ar = torch.arange(B + 1, device=offsets.device, dtype=offsets.dtype)
    new_offsets = offsets + k * ar
    seg = torch.repeat_interleave(ar[:-1], offsets[1:] - offsets[:-1], output_size=T)
    # Row t of sequence b moves to t + k (b + 1); tokens[b] fill rows new_offsets[b].. . Each output
    # row is written once by a scatter, so both inputs' gradients are gathers of the output's: the
    # backward of a gather would be an accumulating scatter (atomic adds, a tenth of a small step).
    value_rows = torch.arange(T, device=offsets.device, dtype=offsets.dtype) + k * (seg + 1)
    token_rows = (new_offsets[:-1, None] + torch.arange(k, device=offsets.device, dtype=offsets.dtype)).reshape(-1)
    out = values.new_empty(T + k * B, values.shape[1])
    out.index_copy_(0, value_rows, values)
    out.index_copy_(0, token_rows, tokens.reshape(B * k, -1).to(values.dtype))
    return out, new_offsets


class SequenceSummary(nn.Module):
    """Sequence summary: gating([CLS | PMA(k_p seeds) | `recent` last tokens]) -> (B, S, dim_out).

    Each sequence's first token must be its CLS and every sequence must have at least one real
    token besides it. PMA (pooling by multi-head attention, Set Transformer) runs jagged: scores of
    all T tokens against the seeds' queries in one matmul, a per-sequence softmax
    (fbgemm jagged_softmax) and a per-sequence weighted sum (ops/jagged_pool.py), with heads
    folded into the segment axis so no cross-head work is done. PMA attends over all tokens of a
    sequence, CLS included; the recent tokens exclude the CLS and are zero where a sequence has
    fewer than ``recent`` real tokens (oldest slot first, newest last).

    Args:
        dim_seq (int): token width d.
        dim_out (int): output width.
        pma_seeds (int): learned seeds k_p.
        recent (int): most recent tokens kept.
        heads (int): PMA heads H (divides d); d_qk = d_v = d / H.

    Example::

        summ = SequenceSummary(dim_seq=32, dim_out=16, pma_seeds=2, recent=3, heads=2)
        out = summ(values, offsets)  # values (T, 32), offsets (B + 1,) -> (B, 6, 16)
    """

    def __init__(self, dim_seq: int, dim_out: int, pma_seeds: int, recent: int, heads: int) -> None:
        super().__init__()
        if dim_seq % heads:
            raise ValueError(f"dim_seq {dim_seq} is not divisible by heads {heads}")
        self.dim_seq, self.dim_out, self.heads = dim_seq, dim_out, heads
        self.pma_seeds, self.recent = pma_seeds, recent
        self.num_tokens = 1 + pma_seeds + recent
        head_dim = dim_seq // heads
        # Seeds are learned directly as queries (H, d_qk, k_p): a projection of a constant is
        # itself a constant, so it would add FLOPs and nothing else.
        self.seed_q = nn.Parameter(torch.randn(heads, head_dim, pma_seeds))
        self.kv = nn.Linear(dim_seq, 2 * dim_seq)
        self.pma_out = nn.Linear(dim_seq, dim_seq)
        self.gate = nn.Linear(dim_seq, dim_seq)
        self.proj = nn.Linear(dim_seq, dim_out)

    def _pma(self, values: torch.Tensor, offsets: torch.Tensor, max_len: int) -> torch.Tensor:
        """(T, d) jagged -> (B, k_p, d)."""
        T, d = values.shape
        H, dh, kp = self.heads, d // self.heads, self.pma_seeds
        B = offsets.numel() - 1
        k, v = self.kv(values).split(d, dim=-1)
        kh = k.reshape(T, H, dh).transpose(0, 1)  # (H, T, d_qk)
        vh = v.reshape(T, H, dh).transpose(0, 1).reshape(H * T, dh)
        q = self.seed_q.to(values.dtype) / math.sqrt(dh)
        scores = torch.bmm(kh, q).reshape(H * T, kp)  # (H * T, k_p): one matmul, no padding
        # Head h of sequence b is segment h * B + b of the (H * T) rows.
        shift = T * torch.arange(H, device=offsets.device, dtype=offsets.dtype)
        offsets_h = torch.cat([(offsets[:-1][None, :] + shift[:, None]).reshape(-1), offsets[-1:] * H])
        probs = torch.ops.fbgemm.jagged_softmax(scores, offsets_h, max_len)[0]
        pooled = jagged_pool(probs, vh, offsets_h, max_len)  # (H*B, k_p, d_v)
        pooled = pooled.view(H, B, kp, dh).permute(1, 2, 0, 3).reshape(B, kp, d)
        return self.pma_out(pooled)

    def forward(self, values: torch.Tensor, offsets: torch.Tensor, max_len: Optional[int] = None) -> torch.Tensor:
        """
        Args:
            values (torch.Tensor): (T, dim_seq) jagged values, CLS first in each sequence.
            offsets (torch.Tensor): (B + 1,) int64 boundaries.
            max_len (int, optional): bound on the lengths (CLS included); read from offsets
                (a device sync on GPU) when not given.

        Returns:
            torch.Tensor: (B, 1 + pma_seeds + recent, dim_out).
        """
        if max_len is None:
            max_len = int((offsets[1:] - offsets[:-1]).max())
        starts, ends = offsets[:-1], offsets[1:]
        parts = [values.index_select(0, starts)[:, None]]  # CLS outputs (B, 1, d)
        if self.pma_seeds:
            parts.append(self._pma(values, offsets, max_len))
        if self.recent:
            r = torch.arange(self.recent, device=offsets.device, dtype=offsets.dtype)
            pos = ends[:, None] - self.recent + r[None, :]  # (B, recent), newest last
            real = pos > starts[:, None]  # not the CLS, not another sequence
            idx = torch.where(real, pos, starts[:, None])
            rec = values.index_select(0, idx.reshape(-1)).view(*idx.shape, -1)
            parts.append(rec * real[..., None].to(values.dtype))
        tokens = torch.cat(parts, dim=1)  # (B, S, d)
        return self.proj(torch.sigmoid(self.gate(tokens)) * tokens)


__all__ = ["NonSeqSummary", "SequenceSummary", "nonseq_summary_flops", "prepend_cls", "summary_flops"]
