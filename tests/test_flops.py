"""Analytic FLOPs against torch's FlopCounterMode, on whole models and real jagged batches."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from gembench.models.config import load_config
from gembench.models.data import SyntheticData
from gembench.models.flops import batch_forward_flops, embedding_bytes, forward_flops_per_example
from gembench.models.gem import build_model
from gembench.models.heads import multitask_loss


def counted(cfg, train: bool) -> tuple[float, float]:
    torch.manual_seed(0)
    model = build_model(cfg)
    batch = SyntheticData(cfg, seed=0).batch(0)
    with FlopCounterMode(display=False) as counter:
        logits = model(batch)
        if train:
            multitask_loss(logits, batch.labels).backward()
    return counter.get_total_flops(), sum(batch_forward_flops(cfg, batch).values())


@pytest.mark.parametrize("name", ["tiny", "small", "dcnv2"])
def test_forward_flops_match_counter(name):
    got, analytic = counted(load_config(name), train=False)
    assert got == pytest.approx(analytic, rel=0.02)


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_training_flops_are_three_forwards(name):
    got, analytic = counted(load_config(name), train=True)
    # the first layer needs no input gradient, so training is a hair under 3x forward
    assert got == pytest.approx(3 * analytic, rel=0.02)


def test_flops_follow_real_lengths_not_padding():
    cfg = load_config("tiny")
    batch = SyntheticData(cfg, seed=0).batch(0)
    flops = batch_forward_flops(cfg, batch)
    longer = {"clicks": batch.seq.lengths().numpy() * 0 + cfg.sequences[0].max_len}
    from gembench.models.flops import forward_flops

    padded = forward_flops(cfg, batch.size, longer)
    assert padded["sequence_arch"] > 1.5 * flops["sequence_arch"]
    assert padded["dense_arch"] == flops["dense_arch"]


def test_embeddings_are_bytes_not_flops():
    cfg = load_config("tiny")
    batch = SyntheticData(cfg, seed=0).batch(0)
    moved = embedding_bytes(cfg, batch)
    lookups = batch.sparse.values().numel() + batch.seq.values().numel()
    assert moved["lookups"] == lookups
    assert moved["read"] == (batch.sparse.values().numel() * 16 + batch.seq.values().numel() * 32) * 4
    assert "sparse_arch" not in batch_forward_flops(cfg, batch)


def test_tiers_grow():
    per_example = [
        sum(forward_flops_per_example(load_config(n)).values()) for n in ("tiny", "small", "medium", "large", "xl")
    ]
    assert per_example == sorted(per_example)
    assert 1e5 < per_example[0] < 1e7 and per_example[-1] > 1e11


# -- independent checks of the blocks whose FLOPs come from formulas gembench registers ---------
# (harness/metrics/flopcheck.py). On equal lengths the same math runs as plain aten matmuls,
# which FlopCounterMode counts with torch's own formulas: no gembench formula is involved.


def shapes(name):
    cfg = load_config(name)
    return cfg, cfg.sequences[0].max_len


@pytest.mark.parametrize("name", ["tiny", "small"])
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "training"])
def test_hstu_attention_full_square_is_twice_the_causal_count(name, backward):
    from gembench.models.flopcheck import hstu_attention_check

    cfg, n = shapes(name)
    r = hstu_attention_check(batch=3, length=n, dim=cfg.hstu.dim, heads=cfg.hstu.heads, backward=backward)
    assert set(r["padded_ops"]) == {"aten.bmm"}  # Q K^T and A V (and their gradients), nothing else
    # the padded path computes every N x N square; the model count is the causal half
    assert r["padded"] == 2 * r["analytic"]
    assert r["jagged"] == r["analytic"]


@pytest.mark.parametrize("name", ["tiny", "small"])
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "training"])
def test_pma_summary_dense_count_equals_the_analytic(name, backward):
    from gembench.models.flopcheck import summary_check

    cfg, n = shapes(name)
    x = cfg.cross
    r = summary_check(
        batch=3,
        length=n + 1,
        dim_seq=cfg.hstu.dim,
        dim_out=cfg.sparse.dim,
        pma_seeds=x.pma_seeds,
        recent=x.recent,
        heads=cfg.hstu.heads,
        backward=backward,
    )
    assert r["max_abs_diff"] < 1e-5  # the dense reference computes what the jagged block does
    assert set(r["dense_ops"]) <= {"aten.addmm", "aten.mm", "aten.bmm"}
    assert r["dense"] == r["analytic"]
    assert r["jagged"] == r["analytic"]


def test_a_count_through_a_registered_formula_is_refused_as_independent():
    import torch

    from gembench.models.flopcheck import count, equal_lengths, independent
    from gembench.models.ops.pytorch.hstu_attention import hstu_jagged_attention

    q = k = v = torch.randn(8, 2, 4)
    counted = count(lambda: hstu_jagged_attention(q, k, v, torch.zeros(2, 4), equal_lengths(2, 4)))
    assert counted.flops > 0
    with pytest.raises(AssertionError, match="hstu_jagged_attention"):
        independent(counted)
