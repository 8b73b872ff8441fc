"""Judge pairs of processes of two commits (``gembench continuous``): one log ratio per pair.

A pair is two processes, one per commit, alive together and taking turns a few steps at a time
(ABBA order over pairs); each writes a full result. Per process, one robust number per timing
metric from its many steps: the mean of its faster half (``statistic="fast-half"``, the default:
contention only ever adds time, so the faster steps are the least disturbed, and averaging half of
them is steadier than any one order statistic), the 10th-best (``"p10"``), the best (``"min"``)
or the median. Per pair the HEAD/BASE ratio of
those numbers is one independent value: whatever a process carries of its own (layout, pages,
CPU) is in it. The paired t-test on the log ratios (stats.paired_change) is judged by stats.judge
like any other comparison (one-sided tests at alpha, Holm across the timing metrics, min effect,
the margin of "unchanged"). The two processes of a pair share the machine's drift, which cancels
in the ratio, and ABBA ordering also cancels a linear trend within each two pairs.

Cost counters are judged exactly (counters.judge_counter): every pair of a side must agree, and any
increase beyond the allowed fraction is a regression.

Rows carry, per metric: the geometric-mean value of each side, the ratio HEAD/BASE with its 95%
t-interval (stats.paired_ratio_interval), the Holm-adjusted p, the verdict, and the pairs' ratios
(``round_ratios``, the name results already carry).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from gembench.harness.regression import stats
from gembench.harness.regression.compare import counter_limit
from gembench.harness.regression.counters import judge_counter
from gembench.harness.regression.directions import info, per_step

STATISTICS = ("fast-half", "min", "p10", "median")


def process_value(result: dict, metric: str, statistic: str = "median") -> float | None:
    """One number for ``metric`` from one process's result: median (or best) of its per-step samples.

    Falls back to the headline value in result["metrics"] where the run kept no per-step samples.
    """
    samples = [v for v in per_step(result, metric) if v > 0]
    if samples:
        return of_samples(samples, metric, statistic)
    value = (result.get("metrics") or {}).get(metric)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def of_samples(samples: list[float], metric: str, statistic: str) -> float:
    """One number from a process's per-step values of ``metric`` (process_value's rule)."""
    meta = info(metric)
    lower = meta is None or meta.lower_is_better
    if statistic == "min":
        return min(samples) if lower else max(samples)
    ordered = sorted(samples, reverse=not lower)
    if statistic == "p10":  # the 10th-best step: nearly as undisturbed as the best, less of a lucky outlier
        return ordered[len(ordered) // 10]
    if statistic == "fast-half":  # the mean of the better half: the disturbed tail left out, half the steps used
        return stats.mean(ordered[: max(1, len(ordered) // 2)])
    return stats.median(samples)


class Halving(NamedTuple):
    """Whether pairs of processes half as long would give a narrower interval for the time."""

    pays: bool
    variance_ratio: float  # a half-process log ratio's variance over a whole one's, on the same pairs
    cost_ratio: float  # a whole pair's seconds over a half-length pair's


def halving(rounds: list[tuple[dict, dict]], metric: str, statistic: str, pair_s: float) -> Halving | None:
    """Would processes of half the steps pay? Measured on the pairs so far, with no model of the noise.

    Each pair's first and second halves are two pairs of half the steps run at no extra cost, so the
    variance of their log ratios against the whole pairs' says what halving the steps costs in
    noise: about 2 where a pair's spread is its steps' (halving loses), about 1 where the processes
    carry it for their life (their layout, their CPU's state: halving only saves time). A pair costs
    ``pair_s`` (its two processes on one CPU), of which 2 x steps x the median step are the steps:
    halving pays when the variance grows by less than the seconds shrink. None under 4 pairs or
    without per-step samples.
    """
    whole, halves, steps, step_s = [], [], [], []
    for base, head in rounds:
        b, h = per_step(base, metric), per_step(head, metric)
        n = min(len(b), len(h))
        if n < 8 or min(b[:n] + h[:n]) <= 0:
            return None
        ratio = lambda part: math.log(of_samples(h[part], metric, statistic) / of_samples(b[part], metric, statistic))  # noqa: E731
        whole.append(ratio(slice(0, n)))
        halves += [ratio(slice(0, n // 2)), ratio(slice(n // 2, n))]
        steps.append(n)
        step_s += [stats.median(b[:n]), stats.median(h[:n])]
    if len(whole) < 4 or stats.variance(whole) <= 0:
        return None
    variance_ratio = stats.variance(halves) / stats.variance(whole)
    overhead = pair_s - 2 * stats.mean(steps) * stats.mean(step_s)
    cost_ratio = pair_s / (overhead + (pair_s - overhead) / 2) if overhead > 0 else 1.0
    return Halving(variance_ratio < cost_ratio, variance_ratio, cost_ratio)


def judge_rounds(
    rounds: list[tuple[dict, dict]],
    metrics: list[str],
    alpha: float,
    min_effect: float,
    limits=None,
    statistic: str = "fast-half",
    margin: float | None = None,
) -> list[stats.Judgement]:
    """Judgements for pairs of processes [(base result, head result), ...].

    ``metrics`` are judged statistically (paired, Holm across them); every cost counter present in
    all results of both sides is judged exactly. A metric missing in some pair is left out.
    """
    series = {}
    for metric in metrics:
        pairs = [(process_value(b, metric, statistic), process_value(h, metric, statistic)) for b, h in rounds]
        if not pairs or any(x is None or y is None or x <= 0 or y <= 0 for x, y in pairs):
            continue
        series[metric] = ([x for x, _ in pairs], [y for _, y in pairs], "paired", info(metric).lower_is_better)
    out = stats.judge(series, alpha, min_effect, margin)
    for j in out:
        a, b, _, _ = series[j.metric]
        center, lo, hi = stats.paired_ratio_interval([y / x for x, y in zip(a, b)])
        j.extra.update(ratio=center, ratio_ci95=[lo, hi], rounds=len(a), round_ratios=[y / x for x, y in zip(a, b)])
        # the (1 - 2 alpha) interval the verdict is read from, as a ratio: the one a reader is shown
        j.extra.update(ratio_ci=[1 + j.ci[0], 1 + j.ci[1]], ci_level=1 - 2 * alpha)
    names: list[str] = []
    for base, head in rounds:
        for r in (base, head):
            names += [n for n in (r.get("metrics") or {}) if n not in names and (info(n) and info(n).counter)]
    for name in names:
        a = [(base.get("metrics") or {}).get(name) for base, _ in rounds]
        b = [(head.get("metrics") or {}).get(name) for _, head in rounds]
        if all(isinstance(v, (int, float)) for v in a + b):
            j = judge_counter(name, [float(v) for v in a], [float(v) for v in b], *counter_limit(limits, name))
            j.extra.update(ratio=(j.mean_b / j.mean_a) if j.mean_a else None)
            out.append(j)
    return out


def exit_status(judgements: list[stats.Judgement]) -> int:
    """As `gembench gate`: 1 any regression, 4 any timing metric too noisy to tell, else 0."""
    verdicts = {j.verdict for j in judgements}
    if stats.REGRESSED in verdicts:
        return 1
    if stats.INCONCLUSIVE in verdicts:
        return 4
    return 0


def rows(judgements: list[stats.Judgement]) -> list[dict]:
    out = []
    for j in judgements:
        out.append(
            {
                "metric": j.metric,
                "better": "lower" if j.lower_is_better else "higher",
                "base": j.mean_a,
                "head": j.mean_b,
                "ratio": j.extra.get("ratio"),
                "ratio_ci95": j.extra.get("ratio_ci95"),
                "ratio_ci": j.extra.get("ratio_ci"),  # the (1 - 2 alpha) interval that decides
                "ci_level": j.extra.get("ci_level"),
                "p_worse_holm": j.extra.get("p_worse_holm"),
                "p_better_holm": j.extra.get("p_better_holm"),
                "method": j.method,
                "rounds": j.extra.get("rounds", j.n_a),
                "round_ratios": j.extra.get("round_ratios"),
                "verdict": j.verdict,
                "note": j.note,
            }
        )
    return out
