"""The harness-quality benchmark's evaluation, on synthetic pools (the timing part is the benchmark's)."""

import random

from benchmarks.harness_quality import evaluate, report


def _pools(effect, runs=12, steps=30, seed=0):
    rng = random.Random(seed)
    draw = lambda f: [[rng.lognormvariate(0, 0.05) * 0.005 * f for _ in range(steps)] for _ in range(runs)]  # noqa: E731
    return {"a": draw(1.0), "b": draw(1.0 + effect), "seconds": 1.0, "run_s": 0.15, "base_step_s": 0.005}


def test_evaluate_reports_both_modes_with_sane_rates():
    figures = evaluate(_pools(0.20), replicates=4, trials=60)
    for mode in ("replicates", "single_run_batch_medians"):
        assert figures[mode]["false_alarm_rate"] <= 0.05
        assert figures[mode]["detection_rate"] >= 0.9  # a 20% slowdown under 5% step noise
    text = report(figures, "synthetic")
    assert "false alarms (goal <=1%)" in text and "replicates (n=4/side)" in text


def test_no_effect_is_not_detected():
    figures = evaluate(_pools(0.0, seed=3), replicates=4, trials=60)
    assert figures["replicates"]["detection_rate"] <= 0.05
