"""Imbalance formulas on hand-computed cases (TorchRec planner stats definitions, docs/design.md section 4)."""

import math

import numpy as np
import pytest

from gembench.harness.metrics.imbalance import critical_path, hot_share, imbalance, stall_cost


def test_balanced_load_is_one_and_zero_divergence():
    m = imbalance([5.0, 5.0, 5.0, 5.0])
    assert m["max_mean"] == 1.0 and m["min_max"] == 1.0
    assert m["total_variation"] == m["total_distance"] == m["chi"] == m["kl"] == 0.0


def test_three_to_one_by_hand():
    m = imbalance([3.0, 1.0])  # p = (0.75, 0.25), k = 2
    assert m["max_mean"] == pytest.approx(1.5)
    assert m["min_max"] == pytest.approx(1 / 3)
    assert m["total_variation"] == pytest.approx(0.25)
    assert m["total_distance"] == pytest.approx(0.5)
    # chi: sum k (p - 1/k)^2 = 2 (0.0625 + 0.0625) = 0.25, over its maximum (1/2)^2 2 + 1/2 = 1
    assert m["chi"] == pytest.approx(0.25)
    # KL: (0.75 ln 1.5 + 0.25 ln 0.5) / ln 2
    assert m["kl"] == pytest.approx((0.75 * math.log(1.5) + 0.25 * math.log(0.5)) / math.log(2))


def test_everything_on_one_rank_hits_the_bounds():
    m = imbalance([8.0, 0.0])
    assert m["max_mean"] == 2.0 and m["min_max"] == 0.0
    assert m["total_variation"] == pytest.approx(0.5)
    assert m["chi"] == pytest.approx(1.0) and m["kl"] == pytest.approx(1.0)


def test_no_load_and_one_rank_are_balanced():
    assert imbalance([0.0, 0.0])["max_mean"] == 1.0
    one = imbalance([3.0])
    assert one["max_mean"] == 1.0 and one["chi"] == 0.0 and one["kl"] == 0.0


def test_critical_path_and_stall_cost():
    ranks = [{"a": 1.0, "b": 3.0}, {"a": 3.0, "b": 1.0}]
    assert critical_path(ranks) == {"a": 3.0, "b": 3.0}
    # each stage: max 3 - mean 2 = 1 wasted; 2 s of a 5 s step
    assert stall_cost(ranks, 5.0) == pytest.approx(0.4)
    assert stall_cost([{"a": 2.0}, {"a": 2.0}], 5.0) == 0.0


def test_hot_share_counts_lookups_on_the_hottest_rows():
    ids = np.array([7, 7, 7, 1, 2, 3])
    assert hot_share(ids, rows=100) == pytest.approx(0.5)  # 1% of 100 rows = row 7: 3 of 6
    assert hot_share(ids, rows=200) == pytest.approx(4 / 6)  # 2 rows: 7 and one of the singles
    assert hot_share(np.array([], dtype=np.int64), rows=10) == 0.0
