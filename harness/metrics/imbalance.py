"""Embedding imbalance: pure functions from per-rank loads to numbers.

A *load* is one number per rank (IDs looked up, bytes read, seconds, or the planner's estimate);
every rank waits for the most loaded one, so the primary figure is max / mean (TorchRec's planner
prints the same as "max is X% greater than the mean"). Also min / max (AutoShard) and TorchRec's
divergences of the load shares p_i = x_i / sum(x) from the uniform 1/k over k ranks:

    total variation  max_i |p_i - 1/k|                     0 when balanced
    total distance   sum_i |p_i - 1/k|
    chi              sum_i k (p_i - 1/k)^2 / (((k-1)/k)^2 k + (k-1)/k)   normalised to [0, 1]
    KL               sum_i p_i ln(k p_i) / ln k                           normalised to [0, 1]

Where a load comes from: ``zipf_share`` is the share of a table's lookups a row range serves when
its IDs follow a power law, hottest rows first (the workload's row_skew()): what the run's planner
and the projection price a row-split shard at.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

# deterministic and proportional to memory-bound lookup work: rows read plus outputs written, as
# TorchRec's planner prices a lookup (distributed/loads.py)
PRIMARY_LOAD = "bytes_moved"


def imbalance(loads: Sequence[float]) -> dict:
    """All imbalance figures of one per-rank load vector (any unit; only ratios matter)."""
    x = [float(v) for v in loads]
    k = len(x)
    if k == 0:
        raise ValueError("imbalance of an empty load vector")
    total = sum(x)
    mean = total / k
    if total <= 0:  # no load anywhere is perfectly balanced, not undefined
        return {
            "max_mean": 1.0,
            "min_max": 1.0,
            "total_variation": 0.0,
            "total_distance": 0.0,
            "chi": 0.0,
            "kl": 0.0,
            "max": 0.0,
            "mean": 0.0,
            "min": 0.0,
        }
    p = [v / total for v in x]
    chi_max = ((k - 1) / k) ** 2 * k + (k - 1) / k
    kl_max = math.log(k)
    return {
        "max_mean": max(x) / mean,
        "min_max": min(x) / max(x),
        "total_variation": max(abs(pi - 1 / k) for pi in p),
        "total_distance": sum(abs(pi - 1 / k) for pi in p),
        "chi": sum(k * (pi - 1 / k) ** 2 for pi in p) / chi_max if chi_max > 0 else 0.0,
        "kl": sum(pi * math.log(k * pi) for pi in p if pi > 0) / kl_max if kl_max > 0 else 0.0,
        "max": max(x),
        "mean": mean,
        "min": min(x),
    }


def critical_path(stage_means: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per stage, the slowest rank's mean time: what the job waits for at every stage boundary.

    ``stage_means[r][stage]`` is rank r's mean seconds in ``stage``.
    """
    stages = list(stage_means[0])
    return {s: max(rank[s] for rank in stage_means) for s in stages}


def stall_cost(stage_means: Sequence[Mapping[str, float]], step_s: float) -> float:
    """Share of the step the average rank spends waiting for the slowest, stage by stage.

    (sum over stages of max_r - mean_r) / step time. 0 when every rank takes equally long in
    every stage; the time a perfect balance of the same work would save.
    """
    if step_s <= 0:
        return 0.0
    stages = list(stage_means[0])
    waste = sum(max(r[s] for r in stage_means) - sum(r[s] for r in stage_means) / len(stage_means) for s in stages)
    return waste / step_s


def hot_share(ids: np.ndarray, rows: int, top: float = 0.01) -> float:
    """Share of the lookups ``ids`` (IDs into a table of ``rows`` rows) that hit its hottest
    ``top`` fraction of rows (at least one row), hotness taken from ``ids`` themselves."""
    ids = np.asarray(ids)
    if ids.size == 0:
        return 0.0
    counts = np.bincount(ids, minlength=rows)
    n_hot = max(1, int(math.ceil(top * rows)))
    hottest = np.partition(counts, len(counts) - n_hot)[-n_hot:] if n_hot < len(counts) else counts
    return float(hottest.sum() / ids.size)


def job_imbalance(loads: list[dict], hot: list[dict], planned: dict, stage_means: list[dict], step_s: float) -> dict:
    """A sharded job's imbalance: of each load measured on the ranks (``loads``: per rank, {load:
    value}) and of the planner's estimates (``planned``: {load: per-rank values}), the critical
    path and stall cost of the ranks' stage means, and the share of lookups that hit each table's
    hottest 1% of rows (``hot``: per rank, lookups and hits)."""
    measured = {k: [r[k] for r in loads] for k in loads[0]}
    lookups = sum(h["lookups"] for h in hot)
    return {
        "primary": PRIMARY_LOAD,
        "measured": {"loads": measured, "metrics": {k: imbalance(v) for k, v in measured.items()}},
        "planned": {"loads": planned, "metrics": {k: imbalance(v) for k, v in planned.items()}},
        "critical_path_s": critical_path(stage_means),
        "stall_cost": stall_cost(stage_means, step_s),
        "hot_1pct_share": sum(h["hot_1pct"] for h in hot) / lookups if lookups else 0.0,
    }


def zipf_share(lo: float, hi: float, rows: int, alpha: float) -> float:
    """What row_skew()'s exponents mean: the share of lookups of a table of ``rows`` rows whose IDs
    follow the bounded power law p(x) ~ x^-alpha (row 0 hottest) that land in rows [lo, hi).
    The law's CDF, F(x) = ((x + 1)^(1 - alpha) - 1) / ((rows + 1)^(1 - alpha) - 1), at hi minus at lo."""

    def cdf(x: float) -> float:
        if alpha == 0:
            return x / rows
        if abs(alpha - 1.0) < 1e-9:
            return math.log(x + 1) / math.log(rows + 1)
        e = 1.0 - alpha
        return ((x + 1) ** e - 1) / ((rows + 1) ** e - 1)

    return cdf(min(hi, rows)) - cdf(max(lo, 0))
