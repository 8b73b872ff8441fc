"""PyTorch backends of HSTU attention: the tiled jagged op (the CPU path) and the padded reference.

Same parameters and math as every backend (docs/design.md section 2): per sequence of real length n,
``A = SiLU(Q K^T + rab[bucket(i - j)]) / n`` causal, ``Y = A V``, bucket = clamp(i - j, 0, R - 1).
A rab of R = 0 buckets, shape (H, 0), is no bias: ``A = SiLU(Q K^T) / n`` (MLPerf DLRMv4's HSTU).

* ``gembench::hstu_jagged_attention``: sequences are sorted by length and cut into tiles of
  similar lengths; each tile is padded only to its own longest sequence and computed with batched
  matmuls, the way GPU jagged kernels work in tiles. One gather puts the whole batch in tile order,
  heads apart, so that every matmul of a tile covers all its heads and reads contiguous matrices;
  one more gather puts the results back. It plans its tiles on the host (it reads the
  offsets), which suits a CPU; the GPU runs the Triton kernels (``ops/triton``). Its FLOPs are
  registered with ``FlopCounterMode`` as *model* FLOPs (real lengths, causal half).
* :func:`hstu_padded_attention`: the naive baseline and reference, the whole batch padded to
  ``max_len`` (fbgemm jagged_to_padded_dense), dense (B, H, N, N) attention, back to jagged.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)
import numpy as np
import torch
import torch.nn.functional as F

from gembench.models.ops.flops import register_attention_flops

# Tiling of the jagged attention: at most TILE_MAX sequences per tile; a tile grows past
# TILE_MIN sequences only while its padded square work stays within (1 + TILE_WASTE) of the real,
# and never past TILE_SCORES scores per head (m L^2), which bounds the op's transient memory at long
# sequences (4 of MLPerf DLRMv4's 4,095-token sequences; 63 at 1,025 tokens).
TILE_MAX = 64
TILE_MIN = 8
TILE_WASTE = 0.25
TILE_SCORES = 2**26
# A tile's shape comes from a few: its length is a multiple of TILE_LEN, its sequences a multiple of
# TILE_ROWS (empty ones complete the last tile). oneDNN builds (JIT-compiles) a matmul for every new
# shape, about a millisecond each on a CPU; tiles of any shape gave every batch new ones.
TILE_LEN = 8
TILE_ROWS = 16


# --------------------------------------------------------------------------------------------
# Tiling plan
# --------------------------------------------------------------------------------------------


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _tile_plan(lengths: list[int]) -> list[tuple[list[int], int, int]]:
    """Cuts sequences (sorted by length, longest first) into tiles: [(sequence ids, tile len,
    sequence slots)], slots >= len(ids) (the rest empty). Sequences join a tile TILE_ROWS at a
    time, where TILE_ROWS of its length fit in TILE_SCORES (one at a time past that)."""
    order = [i for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]) if lengths[i] > 0]
    tiles: list[tuple[list[int], int, int]] = []
    first = 0
    while first < len(order):
        L = _round_up(lengths[order[first]], TILE_LEN)
        rows = TILE_ROWS if TILE_ROWS * L * L <= TILE_SCORES else 1
        m = real = 0
        while first + m < len(order) and m + rows <= max(TILE_MAX, rows):
            block = order[first + m : first + m + rows]
            work = sum(lengths[i] ** 2 for i in block)
            grown = (m + rows) * L * L
            if m and (grown > TILE_SCORES or (m >= TILE_MIN and grown > (1.0 + TILE_WASTE) * (real + work))):
                break
            m, real = m + len(block), real + work
        tiles.append((order[first : first + m], L, _round_up(m, rows)))
        first += m
    return tiles


def padding_waste(offsets: torch.Tensor) -> float:
    """Padding overhead of the jagged tiling: executed / model square work - 1 (0 = no padding).

    Both sides count full (L x L) squares, so this is padding only; the dense tile matmuls also
    compute the masked upper triangle (a further constant 2x that causal GPU kernels skip).
    """
    lengths = [int(n) for n in (offsets[1:] - offsets[:-1]).tolist()]
    real = sum(n * n for n in lengths)
    if real == 0:
        return 0.0
    executed = sum(slots * L * L for _, L, slots in _tile_plan(lengths))
    return executed / real - 1.0


# --------------------------------------------------------------------------------------------
# Jagged attention custom op
# --------------------------------------------------------------------------------------------


def _rel_index(L: int, num_buckets: int, device: torch.device) -> torch.Tensor:
    """(L, L) relative-position bucket clamp(i - j, 0, num_buckets - 1)."""
    pos = torch.arange(L, device=device)
    return (pos[:, None] - pos[None, :]).clamp(0, num_buckets - 1)


def _masked_bias(rab: torch.Tensor, L: int) -> torch.Tensor:
    """(H, L, L) in rab's dtype: the relative bias below the diagonal, a large negative above it.

    Added to the scores, it applies causality in the same pass as the bias: SiLU of a large
    negative is exactly -0 and so is its derivative, so no mask multiply is needed later."""
    H, R = rab.shape
    pos = torch.arange(L, device=rab.device)
    future = pos[None, :] > pos[:, None]
    bias = rab[:, _rel_index(L, R, rab.device)] if R else rab.new_zeros(H, L, L)
    return bias.masked_fill(future[None], torch.finfo(rab.dtype).min / 4)


@dataclass(frozen=True)
class _Layout:
    """Where every (token, head) row of a (T, H, D) tensor sits in the tile-major buffer.

    The buffer holds the tiles back to back; a tile of m sequences padded to L is H * m * L rows
    ordered (head, sequence, position), so ``buffer[first:first + H*m*L].view(H*m, L, D)`` is
    one batch of matrices for all heads. Padded slots read their sequence's first token, an empty
    sequence's slots row 0 (harmless: a padded query's weight is 0, and a real query i < n sees only
    keys j <= i, which are real).
    """

    gather: torch.Tensor  # (P,): the row of the (T * H, D) view each buffer slot reads
    inverse: torch.Tensor  # (T * H,): the buffer slot holding each real (token, head) row
    tiles: tuple[tuple[int, int, int, torch.Tensor], ...]  # (first slot, m, L, row weight (m, L))
    slots: int  # P

    @property
    def longest(self) -> int:
        """The longest sequence: the first tile's length (tiles go longest first)."""
        return self.tiles[0][2] if self.tiles else 0


def _layout(offsets: torch.Tensor, heads: int) -> _Layout:
    """The tile layout of a batch, planned once for all the layers and passes that share offsets
    (each layer's forward and backward sees the same batch)."""
    offsets_cpu = offsets.detach().to("cpu", torch.int64).contiguous()
    return _layout_cached(offsets_cpu.numpy().tobytes(), heads, str(offsets.device))


@functools.lru_cache(maxsize=8)
def _layout_cached(key: bytes, H: int, device: str) -> _Layout:
    # numpy, not torch: a batch has a few dozen tiles, and per-tile torch calls cost milliseconds
    offsets = np.frombuffer(key, dtype=np.int64)
    lengths = offsets[1:] - offsets[:-1]
    B, T = len(lengths), int(offsets[-1])
    heads = np.arange(H)
    plan = _tile_plan(lengths.tolist())
    pos_all = np.arange(max((L for _, L, _ in plan), default=0))
    seq_slot = np.zeros(B, dtype=np.int64)  # slot of a sequence's first token, head 0
    head_stride = np.zeros(B, dtype=np.int64)  # slots between one head's rows and the next's
    gathers, tiles, first = [], [], 0
    for ids, L, m in plan:
        empty = m - len(ids)  # empty sequences: every slot reads row 0, weight 0
        start = np.concatenate([offsets[ids], np.zeros(empty, dtype=np.int64)])[:, None]
        n = np.concatenate([lengths[ids], np.zeros(empty, dtype=np.int64)])[:, None]
        valid = pos_all[None, :L] < n  # (m, L)
        rows = np.where(valid, start + pos_all[None, :L], start)
        gathers.append((rows[None] * H + heads[:, None, None]).reshape(-1))
        seq_slot[ids] = first + np.arange(len(ids)) * L
        head_stride[ids] = m * L
        weight = valid / np.maximum(n, 1).astype(np.float32)  # float32: 1/n on real tokens, 0 on padding
        tiles.append((first, m, L, torch.from_numpy(weight).to(device)))
        first += H * m * L
    seq = np.repeat(np.arange(B), lengths)
    token_slot = seq_slot[seq] + np.arange(T) - offsets[seq]
    inverse = token_slot[:, None] + head_stride[seq][:, None] * heads  # (T, H)
    gather = np.concatenate(gathers) if gathers else np.zeros(0, dtype=np.int64)
    return _Layout(_index(gather, device), _index(inverse.reshape(-1), device), tuple(tiles), first)


def _index(a: np.ndarray, device: str) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(device)


def _rows(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows ``index`` of ``t`` seen as (-1, D). Two-byte rows move as 4-byte words: index_select
    copies those about twice as fast."""
    D = t.shape[-1]
    flat = t.reshape(-1, D).contiguous()
    if flat.element_size() == 2 and D % 2 == 0:
        return flat.view(torch.int32).index_select(0, index).view(t.dtype)
    return flat.index_select(0, index)


def _scores(qt: torch.Tensor, kt: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """(H * m, L, L) a tile's Q K^T for all heads plus the masked bias (H, 1, L, L)."""
    s = torch.bmm(qt, kt.transpose(1, 2))
    s.view(bias.shape[0], -1, *s.shape[1:]).add_(bias)
    return s


@torch.library.custom_op("gembench::hstu_jagged_attention", mutates_args=())
def hstu_jagged_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rab: torch.Tensor, offsets: torch.Tensor
) -> torch.Tensor:
    """HSTU pointwise causal attention over jagged sequences.

    Args:
        q, k, v: (T, H, D) jagged values (all sequences back to back).
        rab: (H, R) relative-position bias, bucket clamp(i - j, 0, R - 1); (H, 0): no bias.
        offsets: (B + 1,) int64 sequence boundaries.

    Returns:
        (T, H, D): per sequence of real length n, ``(SiLU(Q K^T + rab) / n, causal) @ V``.
    """
    T, H, D = v.shape
    if T == 0:
        return torch.zeros_like(v)
    lay = _layout(offsets, H)
    bias = _masked_bias(rab, lay.longest)
    Q, K, V = (_rows(t, lay.gather) for t in (q, k, v))
    Y = V.new_empty(lay.slots, D)
    for first, m, L, weight in lay.tiles:
        tile = slice(first, first + H * m * L)
        qt, kt, vt, yt = (X[tile].view(H * m, L, D) for X in (Q, K, V, Y))
        a = F.silu(_scores(qt, kt, bias[:, None, :L, :L]), inplace=True)
        torch.bmm(a, vt, out=yt).view(H, m, L, D).mul_(weight.to(v.dtype)[None, :, :, None])
    return _rows(Y, lay.inverse).view(T, H, D)


@hstu_jagged_attention.register_fake
def _(q, k, v, rab, offsets):
    return torch.empty_like(v, memory_format=torch.contiguous_format)


@torch.library.custom_op("gembench::hstu_jagged_attention_bwd", mutates_args=())
def hstu_jagged_attention_bwd(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rab: torch.Tensor,
    offsets: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward of :func:`hstu_jagged_attention`, recomputing the scores per tile.

    Two elementwise passes over a tile's scores besides their matmul: SiLU, and SiLU's backward
    fused with its incoming gradient (aten's silu_backward). The 1/n and the padding live in the
    incoming gradient's rows, which are L times fewer than the scores.

    Returns (grad_q, grad_k, grad_v) of shape (T, H, D) and grad_rab (H, R).
    """
    T, H, D = q.shape
    R = rab.shape[1]
    if T == 0:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), torch.zeros_like(rab)
    lay = _layout(offsets, H)
    Lmax = lay.longest
    bias = _masked_bias(rab, Lmax)
    Q, K, V, G = (_rows(t, lay.gather) for t in (q, k, v, grad_out))
    GQ, GK, GV = (Q.new_empty(lay.slots, D) for _ in range(3))
    # Bias gradient summed over sequences in fp32, folded into buckets once at the end.
    gbias = torch.zeros(H, Lmax, Lmax, dtype=torch.float32, device=q.device) if R else None
    for first, m, L, weight in lay.tiles:
        tile = slice(first, first + H * m * L)
        qt, kt, vt, gt, gqt, gkt, gvt = (X[tile].view(H * m, L, D) for X in (Q, K, V, G, GQ, GK, GV))
        gt.view(H, m, L, D).mul_(weight.to(q.dtype)[None, :, :, None])  # 1/n; 0 on padded queries
        s = _scores(qt, kt, bias[:, None, :L, :L])
        torch.bmm(F.silu(s).transpose(1, 2), gt, out=gvt)
        gp = torch.bmm(gt, vt.transpose(1, 2))
        gs = torch.ops.aten.silu_backward.grad_input(gp, s, grad_input=gp)  # in place: one pass
        torch.bmm(gs, kt, out=gqt)
        torch.bmm(gs.transpose(1, 2), qt, out=gkt)
        if R:
            gbias[:, :L, :L] += gs.view(H, m, L, L).sum(1, dtype=torch.float32)
    grab = torch.zeros(H, R, dtype=torch.float32, device=q.device)
    if R:
        grab.index_add_(1, _rel_index(Lmax, R, q.device).reshape(-1), gbias.reshape(H, -1))
    grads = (_rows(X, lay.inverse).view(T, H, D) for X in (GQ, GK, GV))
    return (*grads, grab.to(rab.dtype))


@hstu_jagged_attention_bwd.register_fake
def _(grad_out, q, k, v, rab, offsets):
    c = torch.contiguous_format
    return (
        torch.empty_like(q, memory_format=c),
        torch.empty_like(k, memory_format=c),
        torch.empty_like(v, memory_format=c),
        torch.empty_like(rab),
    )


def _setup_context(ctx, inputs, output):
    q, k, v, rab, offsets = inputs
    ctx.save_for_backward(q, k, v, rab, offsets)


def _backward(ctx, grad_out):
    q, k, v, rab, offsets = ctx.saved_tensors
    gq, gk, gv, grab = hstu_jagged_attention_bwd(grad_out.contiguous(), q, k, v, rab, offsets)
    return gq, gk, gv, grab, None


hstu_jagged_attention.register_autograd(_backward, setup_context=_setup_context)


register_attention_flops(torch.ops.gembench.hstu_jagged_attention, torch.ops.gembench.hstu_jagged_attention_bwd)


# --------------------------------------------------------------------------------------------
# Padded reference path
# --------------------------------------------------------------------------------------------


def hstu_padded_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rab: torch.Tensor,
    offsets: torch.Tensor,
    max_len: int,
) -> torch.Tensor:
    """Same math as :func:`hstu_jagged_attention`, the whole batch padded to ``max_len``.

    Args:
        q, k, v: (T, H, D); rab: (H, R), (H, 0) for none; offsets: (B + 1,); max_len: pad length >= every n_i.

    Returns:
        (T, H, D).
    """
    T, H, D = q.shape
    B = offsets.numel() - 1

    def pad(t: torch.Tensor) -> torch.Tensor:  # (T, H, D) -> (B, H, N, D)
        dense = torch.ops.fbgemm.jagged_to_padded_dense(t.reshape(T, H * D), [offsets], [max_len], 0.0)
        return dense.view(B, max_len, H, D).transpose(1, 2)

    qd, kd, vd = pad(q), pad(k), pad(v)
    n = (offsets[1:] - offsets[:-1]).to(q.device)
    pos = torch.arange(max_len, device=q.device)
    mask = (pos[None, :] <= pos[:, None])[None] & (pos[None, :] < n[:, None])[:, :, None]  # (B, N, N)
    s = torch.matmul(qd, kd.transpose(-1, -2))
    if rab.shape[1]:
        s = s + rab[:, _rel_index(max_len, rab.shape[1], q.device)][None]
    a = F.silu(s).masked_fill(~mask[:, None], 0.0) / n.clamp(min=1).to(s.dtype)[:, None, None, None]
    out = torch.matmul(a, vd).transpose(1, 2).reshape(B, max_len, H * D)
    # total_L given: fbgemm would otherwise read offsets[-1] on the host (a device sync)
    return torch.ops.fbgemm.dense_to_jagged(out, [offsets], T)[0].view(T, H, D)
