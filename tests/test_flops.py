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
    per_example = [sum(forward_flops_per_example(load_config(n)).values())
                   for n in ("tiny", "small", "medium", "large", "xl")]
    assert per_example == sorted(per_example)
    assert 1e5 < per_example[0] < 1e7 and per_example[-1] > 1e11
