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


def _tiles(offsets: torch.Tensor):
    """Per tile of similar-length sequences yields (idx, valid, scale, L).

    idx (m, L): token rows of the tile's sequences, padded slots pointing at the sequence's first
    token (harmless: they are masked and never written back); valid (m, L): real tokens;
    scale (m, L, L): causal mask of real query rows divided by the sequence length n, so that one
    multiply applies causality, padding and the 1/n normalisation. (A real query i < n sees only
    keys j <= i, which are real too.)
    """
    offsets_cpu = offsets.detach().to("cpu", torch.int64)
    lengths = (offsets_cpu[1:] - offsets_cpu[:-1]).tolist()
    device = offsets.device
    pos_all = torch.arange(max(lengths, default=0))
    for ids, L in _tile_plan(lengths):
        ids_t = torch.tensor(ids, dtype=torch.int64)
        start = offsets_cpu[ids_t][:, None]
        n = offsets_cpu[ids_t + 1][:, None] - start
        pos = pos_all[:L]
        valid = pos[None, :] < n
        idx = torch.where(valid, start + pos[None, :], start)
        row_w = valid.to(torch.float32) / n.to(torch.float32)  # (m, L)
        scale = torch.ones(L, L).tril_()[None] * row_w[:, :, None]
        yield idx.to(device), valid.to(device), scale.to(device), L


def _gather(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """(H, T, D) gathered at idx (m, L) -> contiguous (H, m, L, D): heads lead, so the batched
    matmuls over (H * m) need no copies."""
    m, L = idx.shape
    return t.index_select(1, idx.reshape(-1)).view(t.shape[0], m, L, t.shape[2])


def _scatter(out: torch.Tensor, idx: torch.Tensor, valid: torch.Tensor, y: torch.Tensor) -> None:
    """Writes the real rows of y (H, m, L, D) into out (H, T, D) at idx."""
    out[:, idx[valid]] = y[:, valid].to(out.dtype)


def _heads_first(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(0, 1).contiguous()  # (T, H, D) -> (H, T, D)


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
    out = torch.zeros(H, T, D, dtype=v.dtype, device=v.device)
    if T == 0:
        return out.transpose(0, 1).contiguous()
    qh, kh, vh = _heads_first(q), _heads_first(k), _heads_first(v)
    Lmax = int((offsets[1:] - offsets[:-1]).max())
    bias_full = rab[:, _rel_index(Lmax, rab.shape[1], q.device)] if rab.shape[1] else None  # (H, Lmax, Lmax)
    for idx, valid, scale, L in _tiles(offsets):
        qt, kt, vt = _gather(qh, idx), _gather(kh, idx), _gather(vh, idx)
        # In place: these are plain tensors inside the op, autograd is handled by the bwd op.
        s = torch.matmul(qt, kt.transpose(-1, -2))
        if bias_full is not None:
            s.add_(bias_full[:, None, :L, :L])
        a = F.silu(s, inplace=True).mul_(scale.to(s.dtype))
        _scatter(out, idx, valid, torch.matmul(a, vt))
    return out.transpose(0, 1).contiguous()


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

    Returns (grad_q, grad_k, grad_v) of shape (T, H, D) and grad_rab (H, R).
    """
    T, H, D = q.shape
    R = rab.shape[1]
    gq, gk, gv = (torch.zeros(H, T, D, dtype=q.dtype, device=q.device) for _ in range(3))
    if T == 0:
        z = gq.transpose(0, 1).contiguous()
        return z, z.clone(), z.clone(), torch.zeros_like(rab)
    qh, kh, vh, goh = _heads_first(q), _heads_first(k), _heads_first(v), _heads_first(grad_out)
    Lmax = int((offsets[1:] - offsets[:-1]).max())
    rel = _rel_index(Lmax, R, q.device) if R else None
    bias_full = rab[:, rel] if R else None
    # Bias gradient summed over sequences in fp32, folded into buckets once at the end.
    gbias = torch.zeros(H, Lmax, Lmax, dtype=torch.float32, device=q.device) if R else None
    for idx, valid, scale, L in _tiles(offsets):
        qt, kt, vt, got = _gather(qh, idx), _gather(kh, idx), _gather(vh, idx), _gather(goh, idx)
        scale = scale.to(q.dtype)
        s = torch.matmul(qt, kt.transpose(-1, -2))
        if R:
            s.add_(bias_full[:, None, :L, :L])
        sig = torch.sigmoid(s)
        # d SiLU(s) / ds = sig (1 + s (1 - sig))
        dsilu = torch.sub(1.0, sig).mul_(s).add_(1.0).mul_(sig)
        a = s.mul_(sig).mul_(scale)  # s is not needed any more
        _scatter(gv, idx, valid, torch.matmul(a.transpose(-1, -2), got))
        gs = torch.matmul(got, vt.transpose(-1, -2)).mul_(dsilu).mul_(scale)
        _scatter(gq, idx, valid, torch.matmul(gs, kt))
        _scatter(gk, idx, valid, torch.matmul(gs.transpose(-1, -2), qt))
        if R:
            gbias[:, :L, :L] += gs.sum(1, dtype=torch.float32)
    grab = torch.zeros(H, R, dtype=torch.float32, device=q.device)
    if R:
        grab.index_add_(1, rel.reshape(-1), gbias.reshape(H, -1))
    return (
        gq.transpose(0, 1).contiguous(),
        gk.transpose(0, 1).contiguous(),
        gv.transpose(0, 1).contiguous(),
        grab.to(rab.dtype),
    )


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
