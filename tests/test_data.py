"""Synthetic data: reproducible, shaped as configured, Zipf-skewed."""

import numpy as np
import pytest
import torch

from gembench.harness.metrics.imbalance import zipf_share
from gembench.models.config import load_config
from gembench.models.data import SyntheticData, id_exponents, truncated_lognormal, zipf_ids


def test_same_seed_same_batches_in_any_order():
    cfg = load_config("tiny")
    a, b = SyntheticData(cfg, seed=7), SyntheticData(cfg, seed=7)
    first = a.batch(3)
    b.batch(0)
    again = b.batch(3)
    assert torch.equal(first.sparse.values(), again.sparse.values())
    assert torch.equal(first.seq.lengths(), again.seq.lengths())
    assert torch.equal(first.dense, again.dense)
    other = SyntheticData(cfg, seed=8).batch(3)
    assert not torch.equal(first.sparse.values(), other.sparse.values())


def test_known_values_pin_the_generator():
    # A fixed fingerprint of batch 0: if numpy's generator or our recipe changes, results
    # from different machines or versions would silently stop being comparable.
    batch = SyntheticData(load_config("tiny"), seed=0).batch(0)
    assert batch.sparse.values()[:5].tolist() == _FIRST_IDS
    assert int(batch.seq.lengths().sum()) == _SEQ_TOKENS


def test_shapes_and_ranges():
    cfg = load_config("small")
    batch = SyntheticData(cfg, seed=0).batch(0)
    b = cfg.data.global_batch
    assert batch.dense.shape == (b, cfg.data.dense_features)
    assert batch.labels.shape == (b, cfg.over.tasks)
    # fixed multi-hot pooling: exactly the MLPerf sizes
    lengths = batch.sparse.lengths().view(len(cfg.sparse.rows), b)
    assert lengths.sum(1).tolist() == [p * b for p in cfg.sparse.pooling]
    for t, rows in enumerate(cfg.sparse.rows):
        ids = batch.sparse["t%d" % t].values()
        assert ids.min() >= 0 and ids.max() < rows
    seq_lengths = batch.seq.lengths().view(len(cfg.sequences), b)
    for i, s in enumerate(cfg.sequences):
        assert seq_lengths[i].min() >= 1 and seq_lengths[i].max() <= s.max_len
        assert abs(seq_lengths[i].float().mean() - s.mean_len) < 0.15 * s.mean_len


def test_zipf_is_skewed_and_flat_at_zero():
    rng = np.random.default_rng(0)
    hot = np.bincount(zipf_ids(rng, 10_000, 1.2, 200_000), minlength=10_000)
    flat = np.bincount(zipf_ids(rng, 10_000, 0.0, 200_000), minlength=10_000)
    top1 = lambda c: np.sort(c)[-100:].sum() / c.sum()  # noqa: E731 share of the hottest 1%
    assert top1(hot) > 0.5
    assert top1(flat) < 0.03


def test_truncated_lognormal_bounds():
    x = truncated_lognormal(np.random.default_rng(0), 96, 0.6, 10_000, 1, 256)
    assert x.min() >= 1 and x.max() <= 256 and 85 < x.mean() < 100


_FIRST_IDS = [7298, 5406, 4015, 1669, 3378]  # since each table's permutation has its offset
_SEQ_TOKENS = 1040


def test_sorted_ids_put_the_head_first_and_zipf_share_is_their_law():
    rng = np.random.default_rng(0)
    rows, alpha, n = 10_000, 1.2, 400_000
    ids = zipf_ids(rng, rows, alpha, n, hashed=False)
    counts = np.bincount(ids, minlength=rows)
    assert counts.argmax() == 0 and counts[:100].sum() > counts[-5000:].sum()
    for lo, hi in [(0, 2500), (2500, 5000), (5000, 10_000), (0, 1)]:
        measured = ((ids >= lo) & (ids < hi)).mean()
        assert measured == pytest.approx(zipf_share(lo, hi, rows, alpha), abs=0.01)
    assert zipf_share(0, rows, rows, alpha) == pytest.approx(1.0)
    hashed = np.bincount(zipf_ids(np.random.default_rng(0), rows, alpha, n, salt="t1"), minlength=rows)
    # hashing scatters the head, the hottest ID included (the table's offset moves it off row 0,
    # where a multiplicative permutation alone would keep it)
    assert hashed[:100].sum() < counts[:100].sum() / 10 and hashed.argmax() != 0
    assert hashed.max() == counts.max()  # a permutation: the same loads, other rows


def test_per_table_exponents_and_pooling_kinds_drive_the_batches():
    import dataclasses

    cfg = load_config("tiny")
    n = len(cfg.sparse.rows)
    data = dataclasses.replace(
        cfg.data, zipf=tuple([0.0] + [2.0] * (n - 1)), pooling_kinds=tuple(["fixed"] * n), id_layout="sorted"
    )
    custom = dataclasses.replace(cfg, data=data)
    assert id_exponents(custom)["table_t0"] == 0.0 and id_exponents(custom)["table_t1"] == 2.0
    batch = SyntheticData(custom, seed=0).batch(0)
    lengths = batch.sparse.lengths().view(n, -1)
    assert all((lengths[t] == cfg.sparse.pooling[t]).all() for t in range(n))  # fixed: exactly the listed IDs
    values = batch.sparse.values()
    offsets = np.concatenate([[0], np.cumsum(lengths.sum(1).numpy())])
    t1 = values[offsets[1] : offsets[2]].numpy()
    # exponent 2, sorted: row 0 takes about half the lookups (its law's share, from zipf_share)
    assert (t1 == 0).mean() == pytest.approx(zipf_share(0, 1, cfg.sparse.rows[1], 2.0), abs=0.2)
