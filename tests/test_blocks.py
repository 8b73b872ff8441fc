"""Model blocks: shapes, dtypes, jagged == padded HSTU, isolation, causality, FLOP cross-checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from gembench.models.cross import (
    NonSeqSummary,
    SequenceSummary,
    nonseq_summary_flops,
    prepend_cls,
    summary_flops,
)
from gembench.models.hstu import (
    SequenceArch,
    hstu_attention_flops,
    hstu_layer_flops,
)
from gembench.models.ops.pytorch.hstu_attention import (
    TILE_LEN,
    TILE_ROWS,
    _layout,
    _rows,
    hstu_jagged_attention,
    padding_waste,
)
from gembench.models.wukong import InteractionArch, WukongLayer, interaction_arch_flops, wukong_layer_flops

DTYPES = [torch.float32, torch.bfloat16]
MAX_LEN = 48


def _lengths(batch: int, mean: float = 16, seed: int = 0, min_len: int = 1) -> list[int]:
    """Truncated lognormal lengths, like the data generator's."""
    rng = np.random.default_rng(seed)
    sigma = 0.7
    raw = rng.lognormal(math.log(mean) - sigma**2 / 2, sigma, batch)
    return np.clip(np.round(raw), min_len, MAX_LEN).astype(int).tolist()


def _offsets(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0)


def _flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def _close(counted: float, analytic: float) -> bool:
    return abs(counted - analytic) <= 0.01 * analytic


# ---------------------------------------------------------------------------------------- HSTU


def _hstu_pair(dim=16, heads=2, layers=2):
    torch.manual_seed(0)
    jag = SequenceArch(layers, dim, heads, MAX_LEN, attention="jagged")
    pad = SequenceArch(layers, dim, heads, MAX_LEN, attention="padded")
    pad.load_state_dict(jag.state_dict())
    return jag, pad


def test_hstu_shapes_and_empty_sequence():
    lengths = _lengths(20) + [0]  # an empty sequence holds no tokens and must not break tiling
    off = _offsets(lengths)
    jag, pad = _hstu_pair()
    x = torch.randn(int(off[-1]), 16)
    assert jag(x, off, MAX_LEN).shape == x.shape
    assert pad(x, off, MAX_LEN).shape == x.shape


@pytest.mark.parametrize("attention", ["jagged", "padded"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_hstu_forward_backward_dtypes(attention, dtype):
    off = _offsets(_lengths(12))
    arch = SequenceArch(2, 16, 2, MAX_LEN, attention=attention).to(dtype)
    x = torch.randn(int(off[-1]), 16, dtype=dtype, requires_grad=True)
    y = arch(x, off, MAX_LEN)
    assert y.dtype == dtype and torch.isfinite(y).all()
    y.float().square().mean().backward()
    assert x.grad is not None and x.grad.dtype == dtype and torch.isfinite(x.grad).all()
    for p in arch.parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all()
    assert all(layer.rab.grad.abs().sum() > 0 for layer in arch.layers)


def test_hstu_jagged_matches_padded_outputs_and_grads():
    # 40 sequences of mixed lengths: several tiles, several tile lengths.
    lengths = _lengths(40, seed=1)
    off = _offsets(lengths)
    jag, pad = _hstu_pair()
    x = torch.randn(int(off[-1]), 16, requires_grad=True)
    g = torch.randn(int(off[-1]), 16)
    yj, yp = jag(x, off, MAX_LEN), pad(x, off, MAX_LEN)
    torch.testing.assert_close(yj, yp, rtol=1e-5, atol=1e-5)
    gj = torch.autograd.grad(yj, [x, *jag.parameters()], g)
    gp = torch.autograd.grad(yp, [x, *pad.parameters()], g)
    names = ["x", *(n for n, _ in jag.named_parameters())]
    for name, a, b in zip(names, gj, gp):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")


def test_hstu_jagged_attention_gradcheck():
    torch.manual_seed(0)
    off = _offsets([3, 1, 5, 2])
    T, H, D = int(off[-1]), 2, 3
    q, k, v = (torch.randn(T, H, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    rab = torch.randn(H, 4, dtype=torch.float64, requires_grad=True)  # distances >= 3 share a bucket
    assert torch.autograd.gradcheck(lambda *a: hstu_jagged_attention(*a, off), (q, k, v, rab))


def test_hstu_jagged_attention_matches_definition():
    # Direct per-sequence loop of the paper's formula, independent of both module paths.
    torch.manual_seed(0)
    lengths = [4, 1, 7]
    off = _offsets(lengths)
    T, H, D, R = int(off[-1]), 2, 4, 5
    q, k, v = (torch.randn(T, H, D) for _ in range(3))
    rab = torch.randn(H, R)
    out = hstu_jagged_attention(q, k, v, rab, off)
    for b, n in enumerate(lengths):
        sl = slice(int(off[b]), int(off[b + 1]))
        for h in range(H):
            for i in range(n):
                acc = torch.zeros(D)
                for j in range(i + 1):
                    s = q[sl][i, h] @ k[sl][j, h] + rab[h, min(i - j, R - 1)]
                    acc += torch.nn.functional.silu(s) / n * v[sl][j, h]
                torch.testing.assert_close(out[sl][i, h], acc, rtol=1e-5, atol=1e-6)


def test_hstu_sequences_isolated():
    lengths = _lengths(30, seed=2)
    off = _offsets(lengths)
    jag, _ = _hstu_pair()
    x = torch.randn(int(off[-1]), 16)
    y = jag(x, off, MAX_LEN)
    # Same sequences in another order, others' values replaced: each sequence's output is unchanged.
    perm = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(3)).tolist()
    seqs = [x[off[b] : off[b + 1]] for b in range(len(lengths))]
    keep = perm[0]
    new_seqs = [seqs[b] if b == keep else torch.randn_like(seqs[b]) for b in perm]
    new_off = _offsets([lengths[b] for b in perm])
    y2 = jag(torch.cat(new_seqs), new_off, MAX_LEN)
    torch.testing.assert_close(y2[: lengths[keep]], y[off[keep] : off[keep + 1]], rtol=1e-5, atol=1e-6)
    # Alone in a batch too.
    alone = jag(seqs[keep], _offsets([lengths[keep]]), MAX_LEN)
    torch.testing.assert_close(alone, y[off[keep] : off[keep + 1]], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("attention", ["jagged", "padded"])
def test_hstu_causal(attention):
    lengths = [10, 12, 7]
    off = _offsets(lengths)
    torch.manual_seed(0)
    arch = SequenceArch(2, 16, 2, MAX_LEN, attention=attention)
    x = torch.randn(int(off[-1]), 16)
    y = arch(x, off, MAX_LEN)
    x2 = x.clone()
    x2[int(off[1]) + 8] += 1.0  # token 8 of sequence 1
    y2 = arch(x2, off, MAX_LEN)
    changed = (y2 - y).abs().amax(-1) > 0
    expect = torch.zeros_like(changed)
    expect[int(off[1]) + 8 : int(off[2])] = True  # itself and later tokens of its own sequence
    assert torch.equal(changed, expect)


def test_hstu_flops_counted():
    lengths = _lengths(24, seed=4)
    off = _offsets(lengths)
    dim, heads, layers = 32, 4, 2
    arch = SequenceArch(layers, dim, heads, MAX_LEN)
    x = torch.randn(int(off[-1]), dim)
    analytic = layers * hstu_layer_flops(lengths, dim, heads)
    assert _close(_flops(lambda: arch(x, off, MAX_LEN)), analytic)
    assert hstu_attention_flops(torch.tensor(lengths), dim) == 2 * dim * sum(n * n for n in lengths)
    # Backward of the attention op counts 2x its forward.
    xg = x.clone().requires_grad_()
    with FlopCounterMode(display=False) as counter:
        arch(xg, off, MAX_LEN).sum().backward()
    by_op = {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}
    assert by_op["gembench.hstu_jagged_attention"] == layers * hstu_attention_flops(lengths, dim)
    assert by_op["gembench.hstu_jagged_attention_bwd"] == 2 * by_op["gembench.hstu_jagged_attention"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tile_order_round_trips_every_row(dtype):
    lengths = [0, *_lengths(150, seed=3), 0, 1]
    off = _offsets(lengths)
    T, H, D = int(off[-1]), 3, 6
    x = torch.randn(T, H, D).to(dtype)
    lay = _layout(off, H)
    tiled = _rows(x, lay.gather)
    assert tiled.shape == (lay.slots, D) and lay.slots >= T * H
    assert torch.equal(_rows(tiled, lay.inverse).view(T, H, D), x)
    real = 0
    for _, m, L, weight in lay.tiles:  # 1/n on a sequence's n real positions, 0 on its padding
        # a few shapes: lengths in steps of TILE_LEN, sequences in steps of TILE_ROWS (empty ones last)
        assert weight.shape == (m, L) and L % TILE_LEN == 0 and m % TILE_ROWS == 0
        sums = weight.sum(1)
        assert torch.allclose(sums[sums > 0], torch.ones(int((sums > 0).sum()))) and (sums[sums == 0] == 0).all()
        real += int((weight > 0).sum())
    assert real == T and lay.longest == -(-max(lengths) // TILE_LEN) * TILE_LEN
    assert _layout(off.clone(), H) is lay  # planned once for every layer and pass of a batch
    assert _layout(_offsets(lengths[:-1]), H) is not lay


def test_padding_waste():
    assert padding_waste(_offsets([16] * 64)) == 0.0  # tiles of whole TILE_ROWS and TILE_LEN: no padding
    assert padding_waste(_offsets([16] * 50)) == pytest.approx(14 / 50)  # the last tile's 14 empty slots
    w = padding_waste(_offsets(_lengths(200, seed=5)))
    assert 0.0 < w < 1.0  # tiling bounds the waste; whole-batch padding would be several x


# -------------------------------------------------------------------------------------- Wukong


@pytest.mark.parametrize("n_in", [8, 11])  # identity and projected residual
@pytest.mark.parametrize("dtype", DTYPES)
def test_wukong_shapes_dtypes(n_in, dtype):
    arch = InteractionArch(2, n_in, 16, 4, 4, 3, [32, 24]).to(dtype)
    assert arch.n_out == 8
    assert (arch.layers[0].residual is None) == (n_in == 8)
    x = torch.randn(5, n_in, 16, dtype=dtype, requires_grad=True)
    y = arch(x)
    assert y.shape == (5, 8, 16) and y.dtype == dtype
    y.float().square().mean().backward()
    assert torch.isfinite(x.grad).all()
    assert all(p.grad is not None for p in arch.parameters())


def test_wukong_fm_definition():
    torch.manual_seed(0)
    layer = WukongLayer(6, 8, 2, 3, 4, [16])
    x = torch.randn(3, 6, 8)
    captured = {}
    layer.fm_norm.register_forward_hook(lambda m, i, o: captured.setdefault("fm", i[0]))
    layer(x)
    fm = torch.stack([xb @ (xb.T @ layer.fm_proj) for xb in x]).reshape(3, -1)
    torch.testing.assert_close(captured["fm"], fm)


@pytest.mark.parametrize("n_in", [8, 11])
def test_wukong_flops_counted(n_in):
    batch, args = 7, (16, 4, 4, 3, [32, 24])
    arch = InteractionArch(3, n_in, *args)
    x = torch.randn(batch, n_in, 16)
    analytic = batch * interaction_arch_flops(3, n_in, *args)
    assert _close(_flops(lambda: arch(x)), analytic)
    assert analytic == batch * (wukong_layer_flops(n_in, *args) + 2 * wukong_layer_flops(8, *args))


# ---------------------------------------------------------------------------------------- cross


def test_prepend_cls():
    lengths = [3, 1, 5]
    off = _offsets(lengths)
    vals = torch.randn(int(off[-1]), 4, requires_grad=True)
    cls = torch.randn(3, 4, requires_grad=True)
    out, new_off = prepend_cls(vals, off, cls)
    assert new_off.tolist() == [0, 4, 6, 12]
    ref = torch.cat([torch.cat([cls[b : b + 1], vals[off[b] : off[b + 1]]]) for b in range(3)])
    torch.testing.assert_close(out, ref)
    g = torch.randn_like(out)
    out.backward(g)
    torch.testing.assert_close(cls.grad, g[new_off[:-1]])
    torch.testing.assert_close(vals.grad, torch.cat([g[new_off[b] + 1 : new_off[b + 1]] for b in range(3)]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_nonseq_summary(dtype):
    m = NonSeqSummary(5, 8, 16).to(dtype)
    x = torch.randn(4, 5, 8, dtype=dtype, requires_grad=True)
    y = m(x)
    assert y.shape == (4, 16) and y.dtype == dtype
    y.float().sum().backward()
    assert torch.isfinite(x.grad).all()
    assert _close(_flops(lambda: m(x)), nonseq_summary_flops(5, 8, 16, batch=4))


def _seq_batch(lengths, dim, dtype=torch.float32):
    """HSTU-like output with CLS first: lengths include the CLS (each >= 2)."""
    off = _offsets(lengths)
    return torch.randn(int(off[-1]), dim, dtype=dtype), off


def _summary_reference(m: SequenceSummary, values, off):
    """Per-sequence loop with plain softmax: independent of the jagged kernels."""
    d, H = m.dim_seq, m.heads
    dh = d // H
    out = []
    for b in range(off.numel() - 1):
        x = values[off[b] : off[b + 1]]
        k, v = m.kv(x).split(d, -1)
        p = torch.softmax(torch.einsum("nhd,hdk->hnk", k.view(-1, H, dh), m.seed_q) / math.sqrt(dh), 1)
        pma = m.pma_out(torch.einsum("hnk,nhd->khd", p, v.view(-1, H, dh)).reshape(m.pma_seeds, d))
        real = x[1:][-m.recent :]
        rec = torch.cat([torch.zeros(m.recent - real.shape[0], d), real])
        tok = torch.cat([x[:1], pma, rec])
        out.append(m.proj(torch.sigmoid(m.gate(tok)) * tok))
    return torch.stack(out)


def test_sequence_summary_matches_reference_and_isolated():
    torch.manual_seed(0)
    lengths = [2, 9, 4, 17, 3]  # some shorter than `recent` + 1: zero-padded slots
    values, off = _seq_batch(lengths, 16)
    m = SequenceSummary(16, 8, pma_seeds=3, recent=4, heads=2)
    y = m(values, off)
    assert y.shape == (5, 1 + 3 + 4, 8)
    torch.testing.assert_close(y, _summary_reference(m, values, off), rtol=1e-5, atol=1e-5)
    # Sequence 3 alone gives the same summary.
    alone = m(values[off[3] : off[4]], _offsets([lengths[3]]))
    torch.testing.assert_close(alone[0], y[3], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sequence_summary_dtypes_and_grads(dtype):
    torch.manual_seed(0)
    lengths = [n + 1 for n in _lengths(10, seed=6)]
    values, off = _seq_batch(lengths, 16, dtype)
    values.requires_grad_()
    m = SequenceSummary(16, 8, 2, 3, 2).to(dtype)
    y = m(values, off)
    assert y.dtype == dtype
    y.float().square().mean().backward()
    assert torch.isfinite(values.grad).all()
    for p in m.parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_sequence_summary_grads_match_reference():
    torch.manual_seed(0)
    values, off = _seq_batch([5, 2, 8], 8)
    m = SequenceSummary(8, 4, 2, 3, 2)
    g = torch.randn(3, 6, 4)
    a = torch.autograd.grad(m(values, off), list(m.parameters()), g)
    b = torch.autograd.grad(_summary_reference(m, values, off), list(m.parameters()), g)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)


def test_summary_flops_counted():
    lengths = [n + 1 for n in _lengths(20, seed=7)]
    values, off = _seq_batch(lengths, 32)
    m = SequenceSummary(32, 24, pma_seeds=4, recent=5, heads=4)
    assert _close(_flops(lambda: m(values, off)), summary_flops(lengths, 32, 24, 4, 5, 4))
