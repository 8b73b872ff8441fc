"""Independent checks of the analytic FLOPs of the blocks that run custom ops.

FlopCounterMode counts the jagged HSTU attention op and fbgemm's jagged bmm through formulas that
gembench registers (models/hstu.py, models/cross.py): the same formulas as the analytic side, so
for those blocks a counted/analytic ratio of 1 is circular. Here the same math runs, on batches
of equal lengths (where padding changes nothing), as plain aten matmuls that FlopCounterMode
counts with torch's own formulas, and every op that ran is checked: the only ops with a FLOP
formula may be torch's matmul family (NATIVE_GEMMS), none registered by gembench.

* HSTU attention: the padded path computes every (N x N) square, so it counts the full square,
  exactly 2 x the causal model count that the jagged op reports (forward, and training = 3 x).
* PMA of SequenceSummary: a dense PMA from torch.matmul and softmax (dense_summary, checked to
  give the jagged block's output) counts exactly the analytic summary_flops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, flop_registry

aten = torch.ops.aten
NATIVE_GEMMS = {aten.mm, aten.bmm, aten.addmm, aten.baddbmm}


class _SeenOps(TorchDispatchMode):
    """Records every op that reaches the dispatcher."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.add(func.overloadpacket)
        return func(*args, **(kwargs or {}))


@dataclass
class Counted:
    flops: int
    by_op: dict  # op name -> FLOPs
    formula_ops: set  # ops that ran and have any FLOP formula


def count(fn, *args, backward: bool = False) -> Counted:
    """FLOPs FlopCounterMode counts for ``fn(*args)`` (and its backward from a sum of the output)."""
    ops = _SeenOps()
    with FlopCounterMode(display=False) as counter, ops:
        out = fn(*args)
        if backward:
            out.float().sum().backward()
    by_op = {str(op): n for op, n in counter.get_flop_counts().get("Global", {}).items()}
    return Counted(counter.get_total_flops(), by_op, {op for op in ops.seen if op in flop_registry})


def independent(counted: Counted) -> Counted:
    """``counted``, after checking that only torch's own matmul formulas counted anything."""
    foreign = counted.formula_ops - NATIVE_GEMMS
    if foreign:
        raise AssertionError(f"not an independent count: ops with other FLOP formulas ran: {sorted(map(str, foreign))}")
    return counted


def equal_lengths(batch: int, length: int) -> torch.Tensor:
    return torch.arange(batch + 1, dtype=torch.int64) * length


def hstu_attention_check(
    batch: int, length: int, dim: int, heads: int, backward: bool = False, seed: int = 0, rab: bool = True
) -> dict:
    """Jagged op (registered formula) vs padded path (native matmuls) on equal lengths.

    Returns analytic (causal model FLOPs, x3 with backward), jagged (what the op's registered
    formula reports) and padded (torch's count of the padded path's plain matmuls). ``rab=False``:
    no relative bias (a bias of shape (H, 0), as MLPerf DLRMv4 runs HSTU).
    """
    from gembench.models.hstu import hstu_attention_flops
    from gembench.models.ops.pytorch.hstu_attention import hstu_jagged_attention, hstu_padded_attention

    g = torch.Generator().manual_seed(seed)
    T, dh = batch * length, dim // heads
    offsets = equal_lengths(batch, length)

    def inputs():
        q, k, v = (torch.randn(T, heads, dh, generator=g) for _ in range(3))
        bias = torch.randn(heads, length if rab else 0, generator=g)
        return [t.requires_grad_(backward) for t in (q, k, v, bias)]

    q, k, v, bias = inputs()
    jagged = count(lambda: hstu_jagged_attention(q, k, v, bias, offsets), backward=backward)
    q, k, v, bias = inputs()
    padded = independent(count(lambda: hstu_padded_attention(q, k, v, bias, offsets, length), backward=backward))
    analytic = hstu_attention_flops([length] * batch, dim) * (3 if backward else 1)
    return {"analytic": analytic, "jagged": jagged.flops, "padded": padded.flops, "padded_ops": padded.by_op}


def dense_summary(summary, values: torch.Tensor, batch: int, length: int) -> torch.Tensor:
    """:class:`SequenceSummary` on ``batch`` sequences of ``length`` tokens each (CLS first), with
    plain torch ops only: the same result as the jagged block, (B, 1 + k_p + recent, dim_out)."""
    d, H, kp = summary.dim_seq, summary.heads, summary.pma_seeds
    dh = d // H
    x = values.view(batch, length, d)
    parts = [x[:, :1]]
    if kp:
        k, v = summary.kv(values).split(d, dim=-1)
        kh = k.reshape(batch, length, H, dh).transpose(1, 2)  # (B, H, n, d_qk)
        vh = v.reshape(batch, length, H, dh).transpose(1, 2)
        q = summary.seed_q.to(values.dtype) / math.sqrt(dh)  # (H, d_qk, k_p)
        probs = torch.softmax(torch.matmul(kh, q), dim=2)  # (B, H, n, k_p), over the tokens
        pooled = torch.matmul(probs.transpose(-1, -2), vh)  # (B, H, k_p, d_v)
        parts.append(summary.pma_out(pooled.transpose(1, 2).reshape(batch, kp, d)))
    if summary.recent:
        parts.append(x[:, length - summary.recent :])  # real tokens only when length > recent
    tokens = torch.cat(parts, dim=1)
    return summary.proj(torch.sigmoid(summary.gate(tokens)) * tokens)


def summary_check(
    batch: int,
    length: int,
    dim_seq: int,
    dim_out: int,
    pma_seeds: int,
    recent: int,
    heads: int,
    backward: bool = False,
    seed: int = 0,
) -> dict:
    """Jagged SequenceSummary (registered fbgemm formulas) vs dense_summary (native matmuls).

    ``length`` counts the CLS and must exceed ``recent``. Returns analytic, jagged, dense FLOPs and
    the largest difference between the two outputs.
    """
    from gembench.models.cross import SequenceSummary, summary_flops

    if length <= recent:
        raise ValueError(f"length {length} must exceed recent {recent}: shorter ones are zero-filled")
    torch.manual_seed(seed)
    block = SequenceSummary(dim_seq, dim_out, pma_seeds, recent, heads)
    values = torch.randn(batch * length, dim_seq).requires_grad_(backward)
    offsets = equal_lengths(batch, length)
    jagged = count(lambda: block(values, offsets, length), backward=backward)
    dense = independent(count(lambda: dense_summary(block, values, batch, length), backward=backward))
    with torch.no_grad():
        diff = float((block(values, offsets, length) - dense_summary(block, values, batch, length)).abs().max())
    analytic = summary_flops([length] * batch, dim_seq, dim_out, pma_seeds, recent, heads)
    return {
        "analytic": analytic * (3 if backward else 1),
        "jagged": jagged.flops,
        "dense": dense.flops,
        "dense_ops": dense.by_op,
        "max_abs_diff": diff,
    }
