"""Statistics: batch means, Holm, verdicts in each metric's direction, false-alarm rate."""

import random

import pytest

from gembench.harness.regression import stats


def test_batch_means_drops_the_oldest_remainder():
    assert stats.batch_means(list(range(23)), batches=10, min_per_batch=2) == [
        3.5,
        5.5,
        7.5,
        9.5,
        11.5,
        13.5,
        15.5,
        17.5,
        19.5,
        21.5,
    ]
    assert stats.batch_means([1.0, 2.0, 3.0], batches=10, min_per_batch=3) == []


def test_holm_matches_hand_computation():
    adjusted = stats.holm([0.01, 0.04, 0.03])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06])


def _noisy(mean, sd, n, seed):
    rng = random.Random(seed)
    return [rng.gauss(mean, sd) for _ in range(n)]


@pytest.mark.parametrize(
    "lower_is_better, factor, verdict",
    [
        (True, 1.10, stats.REGRESSED),  # step time up 10%
        (True, 0.90, stats.IMPROVED),
        (False, 0.90, stats.REGRESSED),  # MFU down 10%
        (False, 1.10, stats.IMPROVED),
        (True, 1.00, stats.UNCHANGED),
    ],
)
def test_verdict_follows_direction(lower_is_better, factor, verdict):
    a = _noisy(1.0, 0.005, 10, 1)
    b = _noisy(factor, 0.005, 10, 2)
    (j,) = stats.judge({"m": (a, b, "replicates", lower_is_better)}, alpha=0.01, min_effect=0.03)
    assert j.verdict == verdict
    assert j.ci[0] <= factor - 1 <= j.ci[1] or verdict == stats.UNCHANGED


def test_significant_but_small_change_is_not_a_regression():
    a = _noisy(1.0, 0.001, 20, 1)
    b = _noisy(1.01, 0.001, 20, 2)  # clearly 1% slower, below the 3% minimum effect
    (j,) = stats.judge({"m": (a, b, "replicates", True)}, min_effect=0.03)
    assert j.extra["p_worse_holm"] < 0.001
    assert j.verdict == stats.UNCHANGED


def test_too_noisy_is_inconclusive():
    a = _noisy(1.0, 0.2, 3, 1)
    b = _noisy(1.05, 0.2, 3, 2)
    (j,) = stats.judge({"m": (a, b, "replicates", True)})
    assert j.verdict == stats.INCONCLUSIVE


def test_holm_correction_weakens_each_test_when_many_are_judged():
    a = _noisy(1.0, 0.02, 6, 3)
    b = _noisy(1.05, 0.02, 6, 4)
    (alone,) = stats.judge({"m": (a, b, "replicates", True)})
    many = stats.judge({f"m{i}": (a, b, "replicates", True) for i in range(5)})
    assert many[0].extra["p_worse_holm"] == pytest.approx(min(1.0, 5 * alone.extra["p_worse_holm"]))


def test_exact_and_single_values():
    (same,) = stats.judge({"mem": ([100.0], [100.0], "exact", True)})
    (grew,) = stats.judge({"mem": ([100.0], [120.0], "exact", True)})
    (single,) = stats.judge({"imb": ([1.1], [1.2], "single", True)})
    assert (same.verdict, grew.verdict, single.verdict) == (stats.UNCHANGED, stats.REGRESSED, stats.INCONCLUSIVE)
    assert not single.testable


def test_false_alarm_rate_on_simulated_noise_is_near_alpha():
    # Same distribution on both sides: the share of "regressed" must stay near alpha (0.01).
    rng = random.Random(7)
    trials, alarms = 400, 0
    for _ in range(trials):
        a = [rng.lognormvariate(0, 0.03) for _ in range(5)]
        b = [rng.lognormvariate(0, 0.03) for _ in range(5)]
        (j,) = stats.judge({"m": (a, b, "replicates", True)}, alpha=0.01, min_effect=0.0)
        alarms += j.verdict == stats.REGRESSED
    assert alarms / trials <= 0.03


def test_bad_parameters_raise():
    with pytest.raises(ValueError):
        stats.judge({}, alpha=0.7)
    with pytest.raises(ValueError):
        stats.relative_change([0.0, 0.0], [1.0])


def test_batch_medians_shrug_off_stalls():
    samples = [0.1] * 27 + [0.1, 4.0, 0.1]  # one multi-second stall, as a busy shared machine makes
    assert max(stats.batch_medians(samples)) == 0.1
    assert max(stats.batch_means(samples)) > 1.0


def test_paired_ratio_interval_by_hand():
    from gembench.harness.regression.stats import paired_ratio_interval

    # ratios 2 and 8: geometric mean 4; log sd = ln4/sqrt2, se = ln2; t(1 df, 0.975) = 12.7062
    center, lo, hi = paired_ratio_interval([2.0, 8.0])
    assert center == pytest.approx(4.0)
    assert lo == pytest.approx(4.0 * 2.0**-12.7062, rel=1e-4)
    assert hi == pytest.approx(4.0 * 2.0**12.7062, rel=1e-4)
    same = paired_ratio_interval([3.0, 3.0, 3.0])
    assert same == pytest.approx((3.0, 3.0, 3.0))


def test_margin_of_unchanged_is_wider_than_the_regression_threshold():
    """A comparison precise to ~0.4% (8 pairs, 1% spread): 1% is the smallest regression, and a
    zero change is "unchanged" only because the margin (2%) is wider than its interval (~1.2%)."""
    same = [1.0 + 0.016 * x for x in (0.3, -0.5, 0.8, -1.1, 0.2, 0.6, -0.4, 0.1)]  # mean ~0, SD ~1%
    tight = stats.judge({"s": ([1.0] * 8, same, "paired", True)}, 0.01, 0.01)[0]
    wide = stats.judge({"s": ([1.0] * 8, same, "paired", True)}, 0.01, 0.01, margin=0.02)[0]
    assert tight.verdict == stats.INCONCLUSIVE and wide.verdict == stats.UNCHANGED
    slower = [1.02 * v for v in same]
    assert (
        stats.judge({"s": ([1.0] * 8, slower, "paired", True)}, 0.01, 0.01, margin=0.02)[0].verdict == stats.REGRESSED
    )
    with pytest.raises(ValueError, match="must be >= min_effect"):
        stats.judge({"s": ([1.0] * 8, same, "paired", True)}, 0.01, 0.02, margin=0.01)
