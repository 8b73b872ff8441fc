"""PyTorch backends of HSTU attention: the tiled jagged op (the CPU path) and the padded reference.

Same parameters and math as every backend (docs/design.md section 2): per sequence of real length n,
``A = SiLU(Q K^T + rab[bucket(i - j)]) / n`` causal, ``Y = A V``, bucket = clamp(i - j, 0, R - 1).
A rab of R = 0 buckets, shape (H, 0), is no bias: ``A = SiLU(Q K^T) / n`` (MLPerf DLRMv4's HSTU).

* ``gembench::hstu_jagged_attention``: sequences are sorted by length and cut into tiles of
  similar lengths; each tile is padded only to its own longest sequence and computed with batched
  matmuls, the way GPU jagged kernels work in tiles. It plans its tiles on the host (it reads the
  offsets), which suits a CPU; the GPU runs the Triton kernels (``ops/triton``). Its FLOPs are
  registered with ``FlopCounterMode`` as *model* FLOPs (real lengths, causal half).
* :func:`hstu_padded_attention`: the naive baseline and reference, the whole batch padded to
  ``max_len`` (fbgemm jagged_to_padded_dense), dense (B, H, N, N) attention, back to jagged.
"""

from __future__ import annotations

import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)
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


# --------------------------------------------------------------------------------------------
# Tiling plan
# --------------------------------------------------------------------------------------------


def _tile_plan(lengths: list[int]) -> list[tuple[list[int], int]]:
    """Cuts sequences (sorted by length, longest first) into tiles: [(sequence ids, tile len)]."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    tiles: list[tuple[list[int], int]] = []
    cur: list[int] = []
    cur_len = 0
    real = 0
    for i in order:
        n = lengths[i]
        if n == 0:  # empty sequences hold no tokens and no work
            continue
        if cur:
            grown_padded = cur_len * cur_len * (len(cur) + 1)
            over = grown_padded > (1.0 + TILE_WASTE) * (real + n * n)
            full = len(cur) >= TILE_MAX or (len(cur) + 1) * cur_len * cur_len > TILE_SCORES
            if full or (len(cur) >= TILE_MIN and over):
                tiles.append((cur, cur_len))
                cur, cur_len, real = [], 0, 0
        if not cur:
            cur_len = n
        cur.append(i)
        real += n * n
    if cur:
        tiles.append((cur, cur_len))
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
    executed = sum(len(ids) * L * L for ids, L in _tile_plan(lengths))
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


def _tiles(offsets: torch.Tensor):
    """Per tile of similar-length sequences yields (rows, dest, row_w, m, L).

    rows (m * L,): the token row each (sequence, position) slot reads, padded slots reading their
    sequence's first token (harmless: a padded query's weight is 0, and a real query i < n sees
    only keys j <= i, which are real too); dest (m * L,): the row each slot writes, padded slots
    the spare row T past the end, so that every real row is written once and nothing needs
    zeroing first; row_w (m, L, 1): 1/n on a real token of a sequence of length n, 0 on padding.
    """
    offsets_cpu = offsets.detach().to("cpu", torch.int64)
    lengths = (offsets_cpu[1:] - offsets_cpu[:-1]).tolist()
    T = int(offsets_cpu[-1])
    device = offsets.device
    pos_all = torch.arange(max(lengths, default=0))
    for ids, L in _tile_plan(lengths):
        ids_t = torch.tensor(ids, dtype=torch.int64)
        start = offsets_cpu[ids_t][:, None]
        n = offsets_cpu[ids_t + 1][:, None] - start
        pos = pos_all[:L]
        valid = pos[None, :] < n
        rows = torch.where(valid, start + pos[None, :], start).reshape(-1)
        dest = torch.where(valid.reshape(-1), rows, T)
        row_w = (valid.to(torch.float32) / n.to(torch.float32))[..., None]
        yield rows.to(device), dest.to(device), row_w.to(device), len(ids), L


def _gather(t: torch.Tensor, rows: torch.Tensor, m: int, L: int) -> torch.Tensor:
    """(T, H, D) gathered at a tile's rows -> (m, L, H, D); a head's slice [:, :, h] is a batch of
    m strided (L, D) matrices that the batched matmuls read in place."""
    return t.index_select(0, rows).view(m, L, t.shape[1], t.shape[2])


def _scatter(out: torch.Tensor, dest: torch.Tensor, heads: list[torch.Tensor]) -> None:
    """Writes a tile's per-head results [(m, L, D)] into out (T + 1, H, D) at dest, whole rows."""
    out.index_copy_(0, dest, torch.stack(heads, 2).view(dest.numel(), out.shape[1], out.shape[2]))


def _spare_row(like: torch.Tensor) -> torch.Tensor:
    """``like`` (T, H, D) with a spare row T, uninitialised: every real row is written by a tile,
    row T takes the padding."""
    return like.new_empty(like.shape[0] + 1, *like.shape[1:])


def _scores(qt: torch.Tensor, kt: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """(m, L, L) one head's Q K^T plus its masked bias (L, L): the one pass writing the scores."""
    return torch.matmul(qt, kt.transpose(-1, -2)).add_(bias)


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
    T, H = v.shape[:2]
    if T == 0:
        return torch.zeros_like(v)
    out = _spare_row(v)
    bias = _masked_bias(rab, int((offsets[1:] - offsets[:-1]).max()))
    for rows, dest, row_w, m, L in _tiles(offsets):
        qt, kt, vt = _gather(q, rows, m, L), _gather(k, rows, m, L), _gather(v, rows, m, L)
        w = row_w.to(v.dtype)
        ys = []
        for h in range(H):
            a = F.silu(_scores(qt[:, :, h], kt[:, :, h], bias[h, :L, :L]), inplace=True)
            ys.append(torch.matmul(a, vt[:, :, h]).mul_(w))
        _scatter(out, dest, ys)
    return out[:T]


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
    T, H = q.shape[:2]
    R = rab.shape[1]
    if T == 0:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), torch.zeros_like(rab)
    gq, gk, gv = _spare_row(q), _spare_row(k), _spare_row(v)
    Lmax = int((offsets[1:] - offsets[:-1]).max())
    bias = _masked_bias(rab, Lmax)
    # Bias gradient summed over sequences in fp32, folded into buckets once at the end.
    gbias = torch.zeros(H, Lmax, Lmax, dtype=torch.float32, device=q.device) if R else None
    for rows, dest, row_w, m, L in _tiles(offsets):
        qt, kt, vt = _gather(q, rows, m, L), _gather(k, rows, m, L), _gather(v, rows, m, L)
        got = _gather(grad_out, rows, m, L).mul_(row_w[..., None].to(q.dtype))  # 1/n; 0 on padded queries
        dq, dk, dv = [], [], []
        for h in range(H):
            qh, kh, vh, goh = qt[:, :, h], kt[:, :, h], vt[:, :, h], got[:, :, h]
            s = _scores(qh, kh, bias[h, :L, :L])
            dv.append(torch.matmul(F.silu(s).transpose(-1, -2), goh))
            gp = torch.matmul(goh, vh.transpose(-1, -2))
            gs = torch.ops.aten.silu_backward.grad_input(gp, s, grad_input=gp)  # in place: one pass
            dq.append(torch.matmul(gs, kh))
            dk.append(torch.matmul(gs.transpose(-1, -2), qh))
            if R:
                gbias[h, :L, :L] += gs.sum(0, dtype=torch.float32)
        _scatter(gq, dest, dq)
        _scatter(gk, dest, dk)
        _scatter(gv, dest, dv)
    grab = torch.zeros(H, R, dtype=torch.float32, device=q.device)
    if R:
        grab.index_add_(1, _rel_index(Lmax, R, q.device).reshape(-1), gbias.reshape(H, -1))
    return gq[:T], gk[:T], gv[:T], grab.to(rab.dtype)


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
