"""Statistics behind every regression verdict: independent units, one-sided tests, Holm.

What counts as one independent measurement
-------------------------------------------
Per-step samples of one run are autocorrelated (a neighbour's compile job, frequency scaling and
cache state last many steps), so a t-test over raw steps claims far more certainty than the data
holds. gembench uses, in this order:

1. **replicates**: when both sides have at least two runs, each run's headline metric is one
   independent value. This is the only unit that also captures run-to-run drift (another engineer
   starting a job between runs), so it is the one the stated false-alarm rate is measured for
   (benchmarks/harness_quality.py).
2. **batch medians**: when a side has a single run, its per-step samples are cut into ``BATCHES``
   contiguous blocks and each block's median is one value (the batch-means estimator for
   autocorrelated series, with medians because a shared machine injects multi-second stalls that
   would swamp a mean; it also matches the p50 headline step time). It sees within-run noise
   only; use replicates for decisions that matter.
3. **paired**: ``gembench continuous`` runs the two commits in pairs of processes that take
   turns; each pair (one process of each, side by side in time) gives one log ratio, and the test
   is a one-sample t on those (paired_change). Drift shared by the pair cancels.
4. **exact**: metrics that do not vary between runs of the same commit (peak memory) are compared
   directly against the minimum effect.

The test
--------
For each metric the relative change ``B/A - 1`` is tested on logarithms when all values are
positive (ratio of geometric means; timing noise is multiplicative and skewed), else as a ratio of
means with a delta-method standard error; Welch-Satterthwaite degrees of freedom either way. Two
one-sided p-values follow, "B is worse"
and "B is better", each in the metric's own direction. Holm's step-down correction is applied to
each family across all metrics judged together, so the family-wise false-alarm rate is ``alpha``.

Verdict, with ``min_effect`` the smallest relative change worth acting on:
- regressed: corrected p(worse) <= alpha and the estimated worsening >= min_effect;
- improved: corrected p(better) <= alpha and the estimated gain >= min_effect;
- unchanged: the (1 - 2 alpha) interval of the change lies inside +-min_effect (equivalence, TOST;
  `gembench continuous` widens this margin, see judge);
- inconclusive: anything else (too few or too noisy measurements to decide).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Default decision parameters; results/thresholds.toml and the command lines override them.
ALPHA = 0.01
MIN_EFFECT = 0.03
BATCHES = 10
MIN_PER_BATCH = 3

REGRESSED, IMPROVED, UNCHANGED, INCONCLUSIVE = "regressed", "improved", "unchanged", "inconclusive"


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def variance(values: list[float]) -> float:
    """Unbiased sample variance (n - 1 in the denominator)."""
    m = mean(values)
    return sum((v - m) ** 2 for v in values) / (len(values) - 1)


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def batches_of(samples: list[float], batches: int = BATCHES, min_per_batch: int = MIN_PER_BATCH) -> list[list[float]]:
    """Up to ``batches`` contiguous equal blocks of ``samples``; [] if fewer than two fit.

    The remainder is dropped from the start of the series, where the run is closest to warm-up.
    """
    k = min(batches, len(samples) // min_per_batch)
    if k < 2:
        return []
    size = len(samples) // k
    start = len(samples) - k * size
    return [samples[start + i * size : start + (i + 1) * size] for i in range(k)]


def batch_means(samples: list[float], batches: int = BATCHES, min_per_batch: int = MIN_PER_BATCH) -> list[float]:
    """Mean of each block (see batches_of)."""
    return [mean(b) for b in batches_of(samples, batches, min_per_batch)]


def batch_medians(samples: list[float], batches: int = BATCHES, min_per_batch: int = MIN_PER_BATCH) -> list[float]:
    """Median of each block (see batches_of): what compare uses for a single run per side."""
    return [median(b) for b in batches_of(samples, batches, min_per_batch)]


@dataclass
class Change:
    """Relative change of B against A with its standard error and degrees of freedom."""

    mean_a: float
    mean_b: float
    change: float  # mean_b / mean_a - 1
    se: float  # of ``center``; 0.0 when both sides are exact
    df: float
    center: float = 0.0  # the tested quantity: the relative change, or the log ratio
    log: bool = False  # tested on logs (geometric means): timing noise is multiplicative, skewed


def relative_change(a: list[float], b: list[float], log: bool | None = None) -> Change:
    """Relative change of B against A with a standard error, for independent samples a and b.

    With all values positive (``log`` None: automatic) the test runs on logarithms: the change is
    the ratio of geometric means minus one, Welch on log values. Timing noise on a shared machine
    is multiplicative and right-skewed (a stalled run is 3x slower, never 3x faster), and a t-test on
    raw skewed values with few replicates raises more false alarms than it states. Otherwise the
    delta method gives the standard error of mean(b)/mean(a) - 1.
    """
    if not a or not b:
        raise ValueError("both sides need at least one value")
    if log is None:
        log = all(v > 0 for v in a) and all(v > 0 for v in b)
    if log:
        la, lb = [math.log(v) for v in a], [math.log(v) for v in b]
        va = variance(la) / len(la) if len(la) > 1 else 0.0
        vb = variance(lb) / len(lb) if len(lb) > 1 else 0.0
        denom = (va**2 / (len(a) - 1) if len(a) > 1 else 0.0) + (vb**2 / (len(b) - 1) if len(b) > 1 else 0.0)
        d = mean(lb) - mean(la)
        return Change(
            math.exp(mean(la)),
            math.exp(mean(lb)),
            math.expm1(d),
            math.sqrt(va + vb),
            (va + vb) ** 2 / denom if denom > 0 else math.inf,
            d,
            True,
        )
    ma, mb = mean(a), mean(b)
    if ma == 0:
        raise ValueError("reference mean is zero; a relative change is undefined")
    va = variance(a) / len(a) if len(a) > 1 else 0.0
    vb = variance(b) / len(b) if len(b) > 1 else 0.0
    # Var(mb/ma) ~ vb/ma^2 + mb^2 va / ma^4; each part carries its own side's degrees of freedom.
    part_a = mb * mb * va / ma**4
    part_b = vb / (ma * ma)
    se = math.sqrt(part_a + part_b)
    denom = (part_a**2 / (len(a) - 1) if len(a) > 1 else 0.0) + (part_b**2 / (len(b) - 1) if len(b) > 1 else 0.0)
    df = (part_a + part_b) ** 2 / denom if denom > 0 else math.inf
    return Change(ma, mb, mb / ma - 1.0, se, df, mb / ma - 1.0, False)


def paired_change(a: list[float], b: list[float]) -> Change:
    """Relative change of B against A from paired values (a[i] and b[i] ran side by side).

    The unit is one pair: its log ratio ``log(b[i] / a[i])``. Drift that both members of a pair
    share (another job starting, frequency scaling, a neighbour's compile) cancels in the ratio, so
    the spread left is the pair-to-pair spread of the ratio, usually far below the run-to-run
    spread of either side. One-sample t on the log ratios, ``len - 1`` degrees of freedom; the
    change is the geometric mean ratio minus one (the same quantity paired_ratio_interval gives).
    """
    if len(a) != len(b) or not a:
        raise ValueError(f"paired values need equal, non-zero lengths, got {len(a)} and {len(b)}")
    if not all(v > 0 for v in a + b):
        raise ValueError("paired ratios need positive values")
    logs = [math.log(y / x) for x, y in zip(a, b)]
    d = mean(logs)
    se = math.sqrt(variance(logs) / len(logs)) if len(logs) > 1 else math.inf
    return Change(
        math.exp(mean([math.log(v) for v in a])),
        math.exp(mean([math.log(v) for v in b])),
        math.expm1(d),
        se,
        float(len(logs) - 1) if len(logs) > 1 else math.inf,
        d,
        True,
    )


def one_sided_p(change: Change, lower_is_better: bool) -> tuple[float, float]:
    """(p_worse, p_better): one-sided p-values for "B is worse" and "B is better" than A."""
    from scipy.special import stdtr  # Student t CDF; far lighter to import than scipy.stats

    worse = change.center if lower_is_better else -change.center
    if change.se == 0:
        return (0.0 if worse > 0 else 1.0, 0.0 if worse < 0 else 1.0)
    stat = worse / change.se
    return float(stdtr(change.df, -stat)), float(stdtr(change.df, stat))


def interval(change: Change, alpha: float) -> tuple[float, float]:
    """Two-sided (1 - 2 alpha) interval of the relative change: the dual of two alpha-level one-sided tests."""
    from scipy.special import stdtrit  # Student t quantile

    if change.se == 0:
        return (change.change, change.change)
    half = float(stdtrit(change.df, 1 - alpha)) * change.se
    if change.log:
        return (math.expm1(change.center - half), math.expm1(change.center + half))
    return (change.center - half, change.center + half)


def paired_ratio_interval(ratios: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Geometric mean of paired ratios (e.g. per pair of processes) and its t-interval.

    Pairing cancels the drift both sides of a round share, so this is the interval to use when
    the two sides ran interleaved in one process (``gembench run --ab``).
    """
    from scipy.special import stdtrit

    logs = [math.log(r) for r in ratios]
    center = math.exp(mean(logs))
    if len(logs) < 2:
        return center, math.nan, math.nan
    half = float(stdtrit(len(logs) - 1, 0.5 + confidence / 2)) * math.sqrt(variance(logs) / len(logs))
    return center, math.exp(mean(logs) - half), math.exp(mean(logs) + half)


def holm(pvalues: list[float]) -> list[float]:
    """Holm step-down adjusted p-values (valid under any dependence between the tests)."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


@dataclass
class Judgement:
    """One metric's verdict, with everything needed to print or audit it."""

    metric: str
    lower_is_better: bool
    method: str  # replicates | batch-medians | paired | exact | single | count
    n_a: int
    n_b: int
    mean_a: float
    mean_b: float
    change: float | None
    ci: tuple[float, float] | None
    p_worse: float | None = None
    p_better: float | None = None
    verdict: str = INCONCLUSIVE
    note: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def testable(self) -> bool:
        return self.method != "single"


def judge(
    series: dict[str, tuple[list[float], list[float], str, bool]],
    alpha: float = ALPHA,
    min_effect: float = MIN_EFFECT,
    margin: float | None = None,
) -> list[Judgement]:
    """Judge several metrics at once; Holm-corrects across them.

    ``series`` maps metric -> (values A, values B, method, lower_is_better), where method says
    what one value is (see the module docstring). ``margin`` is the equivalence margin of
    "unchanged" (default ``min_effect``): a wider one lets a comparison precise enough to catch a
    small regression (min_effect 1%) still call unchanged code unchanged. Returns one Judgement
    per metric, in order.
    """
    margin = min_effect if margin is None else margin
    if margin < min_effect:
        raise ValueError(f"the margin of 'unchanged' ({margin}) must be >= min_effect ({min_effect})")
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha}")
    if min_effect < 0:
        raise ValueError(f"min_effect must be >= 0, got {min_effect}")
    out: list[Judgement] = []
    for metric, (a, b, method, lower) in series.items():
        if method == "single" or len(a) == 0 or len(b) == 0:
            ma = mean(a) if a else math.nan
            mb = mean(b) if b else math.nan
            ch = (mb / ma - 1.0) if a and b and ma else None
            j = Judgement(metric, lower, "single", len(a), len(b), ma, mb, ch, None)
            j.verdict = UNCHANGED if ch == 0.0 else INCONCLUSIVE
            j.note = "one value each side and no per-step samples: give replicate runs to decide"
            out.append(j)
            continue
        c = paired_change(a, b) if method == "paired" else relative_change(a, b)
        pw, pb = one_sided_p(c, lower)
        out.append(
            Judgement(metric, lower, method, len(a), len(b), c.mean_a, c.mean_b, c.change, interval(c, alpha), pw, pb)
        )
    tested = [j for j in out if j.testable]
    for family in ("p_worse", "p_better"):
        adjusted = holm([getattr(j, family) for j in tested])
        for j, p in zip(tested, adjusted):
            j.extra[family + "_holm"] = p
    for j in tested:
        worse = j.change if j.lower_is_better else -j.change
        lo, hi = j.ci
        if j.extra["p_worse_holm"] <= alpha and worse >= min_effect:
            j.verdict = REGRESSED
        elif j.extra["p_better_holm"] <= alpha and -worse >= min_effect:
            j.verdict = IMPROVED
        elif -margin < lo and hi < margin or (j.method == "exact" and abs(j.change) < min_effect):
            j.verdict = UNCHANGED
        else:
            j.verdict = INCONCLUSIVE
    return out
