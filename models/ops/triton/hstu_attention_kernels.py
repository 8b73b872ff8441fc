"""Triton kernels of jagged causal HSTU attention: one forward kernel, one backward kernel.

Math (docs/design.md section 2), per sequence b of real length n starting at token offsets[b], head h,
queries i and keys j of that sequence (0 <= j <= i < n), R = rab.shape[1] buckets:

    S_ij = q_i . k_j + rab[h, min(i - j, R - 1)]          A_ij = SiLU(S_ij) / n       Y_i = sum_j A_ij v_j

    dA_ij = dY_i . v_j      dS_ij = dA_ij SiLU'(S_ij) / n,  SiLU'(s) = sig(s) (1 + s (1 - sig(s)))
    dV_j = sum_i A_ij dY_i   dQ_i = sum_j dS_ij k_j   dK_j = sum_i dS_ij q_i
    drab[h, r] = sum over (i, j) in bucket r of dS_ij

There is no softmax, so nothing but the inputs is kept between forward and backward. With R = 0
(rab of shape (H, 0): no relative bias, as MLPerf DLRMv4 runs HSTU) the kernels are compiled
without the bias (HAS_RAB false): S_ij = q_i . k_j, no bias loads, no drab reduction or atomics.

Layout: q, k (T, H, D_QK), v (T, H, D_V), any strides with unit last stride; offsets (B + 1,).
Sequences are read in place through offsets (no padding to the batch maximum): a program owns a
block of rows of one (sequence, head) and exits at once when the block starts past the sequence's
end. The grid is sized from ``max_len`` (a Python int from the caller), never from the offsets'
values, so nothing waits for the device; programs step through their sequence by the grid width,
so the result stays exact even if a sequence is longer than ``max_len`` (only slower).

Launches per attention call: forward 1 kernel; backward 1 zero fill (fp32 rab-gradient buffer for
the atomics) + 1 kernel (+ 1 cast when rab is not fp32). All dots accumulate in fp32; fp32 inputs
use IEEE dots unless torch allows TF32 for matmuls.

This module holds only kernels and their launchers; the custom op that calls them is
:mod:`gembench.models.ops.triton.hstu_attention`.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


def _interpreting() -> bool:
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


INTERPRET = _interpreting()

# Autotune spaces for sm_90 (H200/H100), small enough to tune in seconds on first use. The
# forward keeps a query block in registers and streams key blocks; the backward uses square
# tiles (one program: dK/dV of a key block, then dQ of the query block with the same index), so
# its d_rab diagonal reduction stays two masked sums. Backward tiles of 128 are left out: ptxas
# spills kilobytes per thread there at d_head 64 (benchmarks/attention_sm90_compile.py prints
# registers and spills of every config). Under the interpreter, one small config.
_FWD_SHAPES = [  # BLOCK_M, BLOCK_N, num_warps, num_stages
    (64, 32, 4, 3),
    (64, 64, 4, 2),
    (64, 64, 4, 3),
    (128, 32, 4, 3),
    (128, 64, 4, 3),
    (128, 64, 8, 3),
    (128, 128, 8, 2),
    (64, 128, 4, 2),
]
_BWD_SHAPES = [  # BLOCK, num_warps, num_stages
    (32, 4, 2),
    (32, 4, 3),
    (64, 4, 2),
    (64, 4, 3),
    (64, 8, 2),
    (64, 8, 3),
]
INTERPRET_FWD = {"BLOCK_M": 16, "BLOCK_N": 16}
INTERPRET_BWD = {"BLOCK": 16}


def _fwd_configs() -> list:
    if INTERPRET:
        return [triton.Config(dict(INTERPRET_FWD), num_warps=4, num_stages=1)]
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in _FWD_SHAPES]


def _bwd_configs() -> list:
    if INTERPRET:
        return [triton.Config(dict(INTERPRET_BWD), num_warps=4, num_stages=1)]
    return [triton.Config({"BLOCK": b}, num_warps=w, num_stages=s) for b, w, s in _BWD_SHAPES]


def _prune(configs, named_args, **kwargs):
    """Drops tiles larger than the longest sequence (rounded up to a power of two)."""
    cap = max(16, {**named_args, **kwargs}["max_len_key"])
    keep = [c for c in configs if max(v for k, v in c.kwargs.items() if k.startswith("BLOCK")) <= cap]
    return keep or configs[:1]


# --------------------------------------------------------------------------------------------
# Device helpers
# --------------------------------------------------------------------------------------------


@triton.jit
def _sequence(OFFSETS, b):
    """Sequence b's first token (int64), length n and 1/n (1 for an empty sequence)."""
    start = tl.load(OFFSETS + b).to(tl.int64)
    n = (tl.load(OFFSETS + b + 1) - start).to(tl.int32)
    return start, n, 1.0 / tl.maximum(n, 1).to(tl.float32)


@triton.jit
def _load_rows(base, rows, n, stride_t, D: tl.constexpr, BLOCK_D: tl.constexpr, ROW_MASK: tl.constexpr):
    """(len(rows), BLOCK_D) tile of a sequence's rows; rows >= n and columns >= D read as 0."""
    cols = tl.arange(0, BLOCK_D)
    ptrs = base + rows[:, None] * stride_t + cols[None, :]
    if ROW_MASK:
        if BLOCK_D == D:
            x = tl.load(ptrs, mask=rows[:, None] < n, other=0.0)
        else:
            x = tl.load(ptrs, mask=(rows[:, None] < n) & (cols[None, :] < D), other=0.0)
    else:
        if BLOCK_D == D:
            x = tl.load(ptrs)
        else:
            x = tl.load(ptrs, mask=cols[None, :] < D, other=0.0)
    return x


@triton.jit
def _store_rows(base, x, rows, n, stride_t, D: tl.constexpr, BLOCK_D: tl.constexpr):
    cols = tl.arange(0, BLOCK_D)
    ptrs = base + rows[:, None] * stride_t + cols[None, :]
    if BLOCK_D == D:
        tl.store(ptrs, x.to(base.dtype.element_ty), mask=rows[:, None] < n)
    else:
        tl.store(ptrs, x.to(base.dtype.element_ty), mask=(rows[:, None] < n) & (cols[None, :] < D))


@triton.jit
def _rab_tile(rab_row, delta, num_buckets, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(BLOCK_M, BLOCK_N) bias of queries delta + di against keys dj: rab[min(max(i - j, 0), R - 1)]
    (a gather from the (R,) row of this head, which stays in L1/L2)."""
    rel = delta + tl.arange(0, BLOCK_M)[:, None] - tl.arange(0, BLOCK_N)[None, :]
    bucket = tl.minimum(tl.maximum(rel, 0), num_buckets - 1)
    return tl.load(rab_row + bucket).to(tl.float32)


@triton.jit
def _add_rab_grad(drab_row, vec, first, n, num_buckets, BLOCK: tl.constexpr):
    """drab[min(first + t, R - 1)] += vec[t], for the distances 0 <= first + t < n that occur."""
    rel = first + tl.arange(0, BLOCK)
    tl.atomic_add(drab_row + tl.minimum(rel, num_buckets - 1), vec, mask=(rel >= 0) & (rel < n), sem="relaxed")


# --------------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------------


@triton.jit
def _fwd_tile(
    acc,
    q,
    m0,
    n0,
    kside,
    D_QK: tl.constexpr,
    D_V: tl.constexpr,
    BLOCK_DQK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_RAB: tl.constexpr,
):
    """acc += (SiLU(q k^T + rab) / n) v for the key block at n0; only blocks that cross the
    diagonal (CAUSAL) need the mask: earlier key blocks are whole and all before the queries.
    ``kside``: the (sequence, head)'s key side, one tuple for the calls alike (constexprs stay apart:
    a tuple's members are values)."""
    k_base, v_base, rab_row, n, inv_n, stride_kt, stride_vt, num_buckets = kside
    cols = n0 + tl.arange(0, BLOCK_N)
    k = _load_rows(k_base, cols, n, stride_kt, D_QK, BLOCK_DQK, CAUSAL)
    v = _load_rows(v_base, cols, n, stride_vt, D_V, BLOCK_DV, CAUSAL)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    if HAS_RAB:
        s += _rab_tile(rab_row, m0 - n0, num_buckets, BLOCK_M, BLOCK_N)
    a = s * tl.sigmoid(s) * inv_n
    if CAUSAL:
        rows = m0 + tl.arange(0, BLOCK_M)
        a = tl.where(rows[:, None] >= cols[None, :], a, 0.0)
    # Keys past n were read as 0 (so v = 0): their nonzero SiLU(rab) adds nothing.
    return tl.dot(a.to(v.dtype), v, acc, input_precision=PRECISION)


@triton.autotune(
    configs=_fwd_configs(),
    key=["max_len_key", "D_QK", "D_V", "HAS_RAB"],
    prune_configs_by={"early_config_prune": _prune},
)
@triton.jit
def hstu_fwd_kernel(
    Q,
    K,
    V,
    RAB,
    OFFSETS,
    OUT,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_rh,
    num_buckets,
    max_len_key,
    D_QK: tl.constexpr,
    D_V: tl.constexpr,
    BLOCK_DQK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_RAB: tl.constexpr,
):
    """Grid (cdiv(max_len, BLOCK_M), B, H): query block x sequence x head."""
    b = tl.program_id(1)
    h = tl.program_id(2)
    start, n, inv_n = _sequence(OFFSETS, b)
    q_base = Q + start * stride_qt + h * stride_qh
    k_base = K + start * stride_kt + h * stride_kh
    v_base = V + start * stride_vt + h * stride_vh
    o_base = OUT + start * stride_ot + h * stride_oh
    rab_row = RAB + h * stride_rh
    kside = (k_base, v_base, rab_row, n, inv_n, stride_kt, stride_vt, num_buckets)
    for m0 in range(tl.program_id(0) * BLOCK_M, n, tl.num_programs(0) * BLOCK_M):
        rows = m0 + tl.arange(0, BLOCK_M)
        q = _load_rows(q_base, rows, n, stride_qt, D_QK, BLOCK_DQK, True)
        acc = tl.zeros((BLOCK_M, BLOCK_DV), dtype=tl.float32)
        diag = (m0 // BLOCK_N) * BLOCK_N  # first key block that reaches row m0
        for n0 in range(0, diag, BLOCK_N):
            acc = _fwd_tile(
                acc, q, m0, n0, kside, D_QK, D_V, BLOCK_DQK, BLOCK_DV, PRECISION, BLOCK_M, BLOCK_N, False, HAS_RAB
            )
        for n0 in range(diag, tl.minimum(m0 + BLOCK_M, n), BLOCK_N):
            acc = _fwd_tile(
                acc, q, m0, n0, kside, D_QK, D_V, BLOCK_DQK, BLOCK_DV, PRECISION, BLOCK_M, BLOCK_N, True, HAS_RAB
            )
        _store_rows(o_base, acc, rows, n, stride_ot, D_V, BLOCK_DV)


# --------------------------------------------------------------------------------------------
# Backward
# --------------------------------------------------------------------------------------------


@triton.jit
def _scores(
    q,
    k,
    rab_row,
    delta,
    inv_n,
    rows,
    cols,
    num_buckets,
    PRECISION: tl.constexpr,
    BLOCK: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_RAB: tl.constexpr,
):
    """Recomputed S of a (query, key) tile: returns (A, SiLU'(S) / n), both 0 above the diagonal."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    if HAS_RAB:
        s += _rab_tile(rab_row, delta, num_buckets, BLOCK, BLOCK)
    sig = tl.sigmoid(s)
    a = s * sig * inv_n
    dsilu = sig * (1.0 + s * (1.0 - sig)) * inv_n
    if CAUSAL:
        keep = rows[:, None] >= cols[None, :]
        a = tl.where(keep, a, 0.0)
        dsilu = tl.where(keep, dsilu, 0.0)
    return a, dsilu


@triton.jit
def _bwd_kv_tile(
    dk,
    dv,
    carry,
    kv,
    m0,
    p0,
    qside,
    D_QK: tl.constexpr,
    D_V: tl.constexpr,
    BLOCK_DQK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK: tl.constexpr,
    CAUSAL: tl.constexpr,
    ROW_MASK: tl.constexpr,
    HAS_RAB: tl.constexpr,
):
    """One query block m0 against the program's key block p0: dK, dV and the rab gradient.

    d_rab: the tile's dS summed along its diagonals. A gather rotates each row di left by di, so
    column t holds dS[di, (di - t) mod BLOCK]: distance t where di >= t ("lower"), t - BLOCK
    where di < t ("upper"). The upper half of this tile and the lower half of the previous one
    (distances m0 - p0 - BLOCK + t) are added and sent with one atomic vector; the last lower
    half is sent by the caller. So each (sequence, head, key block) sends one atomic add per
    BLOCK distances and query block, instead of one per score. ``kv``: the key block's (k, v);
    ``qside``: the (sequence, head)'s query side (q, dO, the bias row and its gradient's).
    """
    q_base, do_base, rab_row, drab_row, n, inv_n, stride_qt, stride_dot, num_buckets = qside
    k, v = kv
    rows = m0 + tl.arange(0, BLOCK)
    cols = p0 + tl.arange(0, BLOCK)
    q = _load_rows(q_base, rows, n, stride_qt, D_QK, BLOCK_DQK, ROW_MASK)
    do = _load_rows(do_base, rows, n, stride_dot, D_V, BLOCK_DV, ROW_MASK)
    a, dsilu = _scores(q, k, rab_row, m0 - p0, inv_n, rows, cols, num_buckets, PRECISION, BLOCK, CAUSAL, HAS_RAB)
    # Query rows past n were read as 0 (do = 0), so they add nothing to dV, dS, dK.
    dv = tl.dot(tl.trans(a.to(do.dtype)), do, dv, input_precision=PRECISION)
    ds = tl.dot(do, tl.trans(v), input_precision=PRECISION) * dsilu
    dk = tl.dot(tl.trans(ds.to(q.dtype)), q, dk, input_precision=PRECISION)
    if HAS_RAB:
        di = tl.arange(0, BLOCK)[:, None]
        t = tl.arange(0, BLOCK)[None, :]
        rotated = tl.gather(ds, (di - t + BLOCK) % BLOCK, axis=1)
        lower = tl.sum(tl.where(di >= t, rotated, 0.0), axis=0)
        upper = tl.sum(tl.where(di < t, rotated, 0.0), axis=0)
        _add_rab_grad(drab_row, carry + upper, m0 - p0 - BLOCK, n, num_buckets, BLOCK)
    else:
        lower = carry
    return dk, dv, lower


@triton.jit
def _bwd_q_tile(
    dq,
    q,
    do,
    m0,
    n0,
    kside,
    D_QK: tl.constexpr,
    D_V: tl.constexpr,
    BLOCK_DQK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_RAB: tl.constexpr,
):
    """One key block n0 against the program's query block m0: dQ (``kside`` as in _fwd_tile)."""
    k_base, v_base, rab_row, n, inv_n, stride_kt, stride_vt, num_buckets = kside
    rows = m0 + tl.arange(0, BLOCK)
    cols = n0 + tl.arange(0, BLOCK)
    k = _load_rows(k_base, cols, n, stride_kt, D_QK, BLOCK_DQK, CAUSAL)
    v = _load_rows(v_base, cols, n, stride_vt, D_V, BLOCK_DV, CAUSAL)
    _, dsilu = _scores(q, k, rab_row, m0 - n0, inv_n, rows, cols, num_buckets, PRECISION, BLOCK, CAUSAL, HAS_RAB)
    ds = tl.dot(do, tl.trans(v), input_precision=PRECISION) * dsilu
    return tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION)


@triton.autotune(
    configs=_bwd_configs(),
    key=["max_len_key", "D_QK", "D_V", "HAS_RAB"],
    reset_to_zero=["DRAB"],
    prune_configs_by={"early_config_prune": _prune},
)
@triton.jit
def hstu_bwd_kernel(
    Q,
    K,
    V,
    RAB,
    OFFSETS,
    DO,
    DQ,
    DK,
    DV,
    DRAB,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_dot,
    stride_doh,
    stride_dqt,
    stride_dqh,
    stride_dkt,
    stride_dkh,
    stride_dvt,
    stride_dvh,
    stride_rh,
    num_buckets,
    max_len_key,
    D_QK: tl.constexpr,
    D_V: tl.constexpr,
    BLOCK_DQK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RAB: tl.constexpr,
):
    """Grid (cdiv(max_len, BLOCK), B, H). Program p: dK, dV of key block p (query blocks p..end),
    then dQ of query block p (key blocks 0..p): every program of a sequence does the same number
    of tiles, and nothing but the (H, R) fp32 rab gradient needs atomics. DRAB is zeroed by the
    caller."""
    b = tl.program_id(1)
    h = tl.program_id(2)
    start, n, inv_n = _sequence(OFFSETS, b)
    q_base = Q + start * stride_qt + h * stride_qh
    k_base = K + start * stride_kt + h * stride_kh
    v_base = V + start * stride_vt + h * stride_vh
    do_base = DO + start * stride_dot + h * stride_doh
    rab_row = RAB + h * stride_rh
    drab_row = DRAB + h * num_buckets
    qside = (q_base, do_base, rab_row, drab_row, n, inv_n, stride_qt, stride_dot, num_buckets)
    kside = (k_base, v_base, rab_row, n, inv_n, stride_kt, stride_vt, num_buckets)
    for p0 in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        rows = p0 + tl.arange(0, BLOCK)
        # dK, dV of keys p0.. against every query from p0 on.
        k = _load_rows(k_base, rows, n, stride_kt, D_QK, BLOCK_DQK, True)
        v = _load_rows(v_base, rows, n, stride_vt, D_V, BLOCK_DV, True)
        kv = (k, v)
        dk = tl.zeros((BLOCK, BLOCK_DQK), dtype=tl.float32)
        dv = tl.zeros((BLOCK, BLOCK_DV), dtype=tl.float32)
        carry = tl.zeros((BLOCK,), dtype=tl.float32)
        dk, dv, carry = _bwd_kv_tile(
            dk, dv, carry, kv, p0, p0, qside, D_QK, D_V, BLOCK_DQK, BLOCK_DV, PRECISION, BLOCK, True, True, HAS_RAB
        )
        # Whole query blocks load without row masks; the sequence's last, partial one with them.
        whole = p0 + ((n - p0) // BLOCK) * BLOCK
        for m0 in range(p0 + BLOCK, whole, BLOCK):
            dk, dv, carry = _bwd_kv_tile(
                dk,
                dv,
                carry,
                kv,
                m0,
                p0,
                qside,
                D_QK,
                D_V,
                BLOCK_DQK,
                BLOCK_DV,
                PRECISION,
                BLOCK,
                False,
                False,
                HAS_RAB,
            )
        for m0 in range(tl.maximum(whole, p0 + BLOCK), n, BLOCK):
            dk, dv, carry = _bwd_kv_tile(
                dk, dv, carry, kv, m0, p0, qside, D_QK, D_V, BLOCK_DQK, BLOCK_DV, PRECISION, BLOCK, False, True, HAS_RAB
            )
        if HAS_RAB:
            last = ((n - 1 - p0) // BLOCK) * BLOCK  # distance offset of the last query block
            _add_rab_grad(drab_row, carry, last, n, num_buckets, BLOCK)
        _store_rows(DK + start * stride_dkt + h * stride_dkh, dk, rows, n, stride_dkt, D_QK, BLOCK_DQK)
        _store_rows(DV + start * stride_dvt + h * stride_dvh, dv, rows, n, stride_dvt, D_V, BLOCK_DV)
        # dQ of queries p0.. against every key up to the diagonal.
        q = _load_rows(q_base, rows, n, stride_qt, D_QK, BLOCK_DQK, True)
        do = _load_rows(do_base, rows, n, stride_dot, D_V, BLOCK_DV, True)
        dq = tl.zeros((BLOCK, BLOCK_DQK), dtype=tl.float32)
        for n0 in range(0, p0, BLOCK):
            dq = _bwd_q_tile(dq, q, do, p0, n0, kside, D_QK, D_V, BLOCK_DQK, BLOCK_DV, PRECISION, BLOCK, False, HAS_RAB)
        dq = _bwd_q_tile(dq, q, do, p0, p0, kside, D_QK, D_V, BLOCK_DQK, BLOCK_DV, PRECISION, BLOCK, True, HAS_RAB)
        _store_rows(DQ + start * stride_dqt + h * stride_dqh, dq, rows, n, stride_dqt, D_QK, BLOCK_DQK)


# --------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------


def _block_d(d: int) -> int:
    return max(16, triton.next_power_of_2(d))  # tl.dot needs K >= 16


def _precision(dtype: torch.dtype) -> str:
    # Same contract as torch matmuls: fp32 stays IEEE unless the user allowed TF32.
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


def _sizes(q: torch.Tensor, v: torch.Tensor, rab: torch.Tensor) -> dict:
    """The kernels' constexprs for these heads: sizes, their blocks, dot precision, bias or none."""
    d_qk, d_v = q.shape[2], v.shape[2]
    return dict(
        D_QK=d_qk,
        D_V=d_v,
        BLOCK_DQK=_block_d(d_qk),
        BLOCK_DV=_block_d(d_v),
        PRECISION=_precision(q.dtype),
        HAS_RAB=rab.shape[1] > 0,
    )


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _row_block(meta: dict) -> int:
    return meta["BLOCK_M"] if "BLOCK_M" in meta else meta["BLOCK"]


def _launch(kernel, grid_rows: int, batch: int, heads: int, args: tuple, config: dict | None, **meta):
    """Autotuned launch on grid (cdiv(grid_rows, row block), batch, heads), or one fixed
    ``config`` through the raw kernel (tests run several tile shapes)."""
    if config is None:
        kernel[lambda m: (triton.cdiv(grid_rows, _row_block(m)), batch, heads)](*args, **meta)
    else:
        kernel.fn[(triton.cdiv(grid_rows, _row_block(config)), batch, heads)](*args, **meta, **config)


def forward(q, k, v, rab, offsets, max_len: int, config: dict | None = None) -> torch.Tensor:
    """(T, H, D_QK) q, k, (T, H, D_V) v, (H, R) rab (R = 0: no bias), (B + 1,) offsets -> (T, H, D_V)."""
    q, k, v, rab = _unit_last(q), _unit_last(k), _unit_last(v), _unit_last(rab)
    T, H = q.shape[:2]
    B = offsets.shape[0] - 1
    out = torch.empty((T, H, v.shape[2]), dtype=v.dtype, device=v.device)
    if T == 0 or B == 0 or max_len <= 0:
        return out
    args = (
        q,
        k,
        v,
        rab,
        offsets,
        out,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        out.stride(0),
        out.stride(1),
        rab.stride(0),
        rab.shape[1],
        triton.next_power_of_2(max_len),
    )
    _launch(hstu_fwd_kernel, max_len, B, H, args, config, **_sizes(q, v, rab))
    return out


def backward(grad_out, q, k, v, rab, offsets, max_len: int, config: dict | None = None):
    """Gradients (dq, dk, dv, drab) of :func:`forward`; drab in rab's dtype."""
    grad_out, q, k, v, rab = (_unit_last(t) for t in (grad_out, q, k, v, rab))
    T, H = q.shape[:2]
    B = offsets.shape[0] - 1
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    drab = torch.zeros(rab.shape, dtype=torch.float32, device=rab.device)  # atomics target
    if T > 0 and B > 0 and max_len > 0:
        args = (
            q,
            k,
            v,
            rab,
            offsets,
            grad_out,
            dq,
            dk,
            dv,
            drab,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            v.stride(0),
            v.stride(1),
            grad_out.stride(0),
            grad_out.stride(1),
            dq.stride(0),
            dq.stride(1),
            dk.stride(0),
            dk.stride(1),
            dv.stride(0),
            dv.stride(1),
            rab.stride(0),
            rab.shape[1],
            triton.next_power_of_2(max_len),
        )
        _launch(hstu_bwd_kernel, max_len, B, H, args, config, **_sizes(q, v, rab))
    return dq, dk, dv, drab.to(rab.dtype)
