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


def test_paired_plants_a_committed_busy_wait_inside_the_timed_step(tmp_path):
    import subprocess

    from benchmarks.harness_quality import planted_repository

    repo = tmp_path / "repo"
    base, planted = planted_repository(repo, 0.05)
    assert base != planted
    diff = subprocess.run(["git", "-C", str(repo), "diff", base, planted], capture_output=True, text=True, check=True).stdout
    assert "+        _spin_end = time.perf_counter() + 0.05 * (time.perf_counter() - start)" in diff
    text = (repo / "harness" / "step.py").read_text()
    compile(text, "step.py", "exec")
    # inside the loop, after the step and before its clock stops: the spin is part of every timed step
    assert text.index("_spin_end") > text.index("loss = train_step(") and text.index("_spin_end") < text.index("elapsed = time.perf_counter() - start")
