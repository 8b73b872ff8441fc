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
    diff = subprocess.run(
        ["git", "-C", str(repo), "diff", base, planted], capture_output=True, text=True, check=True
    ).stdout
    assert "+        _spin_end = time.perf_counter() + 0.05 * (time.perf_counter() - start)" in diff
    text = subprocess.run(
        ["git", "-C", str(repo), "show", f"{planted}:harness/train/step.py"], capture_output=True, text=True, check=True
    ).stdout
    compile(text, "step.py", "exec")
    # inside the one step loop (timed_steps), after the step and before its clock stops: the spin is
    # part of every timed step
    assert text.index("_spin_end") > text.index("loss, durations = one_step(i)") and text.index(
        "_spin_end"
    ) < text.index("elapsed = time.perf_counter() - start")


def _outcomes(effect, sd, comparisons=3, rounds=16, seed=0):
    rng = random.Random(seed)
    return [
        {
            "round_ratios": [rng.lognormvariate(0, sd) * (1 + effect) for _ in range(rounds)],
            "rounds": rounds,
            "alpha": 0.01,
            "min_effect": 0.03,
        }
        for _ in range(comparisons)
    ]


def test_resampled_rates_follow_the_round_spread():
    from benchmarks.harness_quality import resample_rounds

    quiet = resample_rounds({"planted": _outcomes(0.05, 0.02), "unchanged": _outcomes(0.0, 0.02, seed=1)}, 400)
    assert quiet["rounds"] == 16 and quiet["pool"] == {"planted": 48, "unchanged": 48}
    assert quiet["detection_rate"]["planted"] >= 0.95 and quiet["false_alarm_rate"] <= 0.01
    noisy = resample_rounds({"planted": _outcomes(0.05, 0.15), "unchanged": _outcomes(0.0, 0.15, seed=1)}, 400)
    assert noisy["detection_rate"]["planted"] < 0.5  # a 15% round spread hides 5% in 16 rounds
    assert resample_rounds({"planted": _outcomes(0.05, 0.02, rounds=1), "unchanged": []}, 10) is None


def test_one_op_commit_adds_one_multiply_to_the_step_on_top_of_base(tmp_path):
    import subprocess

    from benchmarks.harness_quality import one_op_commit, planted_repository

    repo = tmp_path / "repo"
    base, planted = planted_repository(repo, 0.05)
    one_op = one_op_commit(repo, base)
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], capture_output=True, text=True, check=True).stdout  # noqa: E731
    assert git("rev-parse", f"{one_op}~1").strip() == base  # beside the planted slowdown, not on top of it
    diff = [
        ln
        for ln in git("diff", base, one_op).splitlines()
        if ln.startswith(("+ ", "- ", "+\t", "-\t")) or ln.startswith(("+  ", "-  "))
    ]
    assert diff == [
        "+        loss = loss * 1.0  # planted by benchmarks/harness_quality.py --paired: one more op in the step"
    ]
    assert git("rev-parse", "HEAD").strip() == base  # the clone is left at BASE, as planting leaves it


def test_spread_bound_pools_pairs_around_each_comparison_and_bounds_it_above():
    from benchmarks.harness_quality import spread_bound

    outcomes = {
        "planted 2%": _outcomes(0.02, 0.01, comparisons=4, rounds=8, seed=4),
        "unchanged": _outcomes(0.0, 0.01, comparisons=4, rounds=8, seed=5),
    }
    b = spread_bound(outcomes)
    assert b["dof"] == 8 * 7 and 0.007 < b["sd"] < 0.013 and b["sd"] < b["sd_upper"] < 1.4 * b["sd"]
    assert spread_bound({"unchanged": _outcomes(0.0, 0.01, comparisons=1, rounds=2)}) is None


def test_rates_at_a_spread_follow_the_rule():
    from benchmarks.harness_quality import rates_at

    quiet = rates_at(0.01, [0.0, 0.02], rounds=8, alpha=0.01, min_effect=0.01, margin=0.02, trials=2000)
    assert quiet[0.02]["regressed"] > 0.9 and quiet[0.0]["regressed"] < 0.01 and quiet[0.0]["unchanged"] > 0.9
    noisy = rates_at(0.04, [0.0, 0.02], rounds=8, alpha=0.01, min_effect=0.01, margin=0.02, trials=2000)
    assert noisy[0.02]["regressed"] < 0.5 and noisy[0.0]["unchanged"] < 0.2


def test_batch_mates_finds_pairs_run_at_once_alike_and_rates_pay_for_it():
    import math

    from benchmarks.harness_quality import batch_mates, rates_at

    rng = random.Random(6)

    def comparison(shared):  # 8 batches of two pairs; ``shared`` of each pair's variance is its batch's
        out = []
        for _ in range(8):
            b = rng.gauss(0, 1)
            out += [
                math.exp(0.01 * (math.sqrt(shared) * b + math.sqrt(1 - shared) * rng.gauss(0, 1))) for _ in range(2)
            ]
        return {"round_ratios": out, "rounds": 16, "parallel": 2, "alpha": 0.01, "min_effect": 0.01}

    alike = batch_mates({"unchanged": [comparison(0.8) for _ in range(6)]})
    apart = batch_mates({"unchanged": [comparison(0.0) for _ in range(6)]})
    assert alike["batches"] == 48 and alike["r"] > 0.5 and alike["r_upper"] > alike["r"]
    assert abs(apart["r"]) < 0.35
    one_at_a_time = [{**comparison(0.8), "parallel": 1} for _ in range(6)]
    assert batch_mates({"unchanged": one_at_a_time}) is None  # no batch-mates to compare
    independent = rates_at(0.012, [0.0, 0.02], rounds=10, alpha=0.01, min_effect=0.01, margin=0.02, trials=2000)
    correlated = rates_at(0.012, [0.0, 0.02], rounds=10, alpha=0.01, min_effect=0.01, margin=0.02, trials=2000, r=0.6)
    assert correlated[0.0]["regressed"] > independent[0.0]["regressed"]  # the t-test takes them as independent
    assert correlated[0.0]["unchanged"] < independent[0.0]["unchanged"]
