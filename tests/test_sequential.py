"""The sequential design of `gembench continuous`: alpha spent over the looks, and the run stopping
at the first clear one. The pairs here are synthetic results (no benchmark process runs)."""

from __future__ import annotations

import json
import math
import random
import subprocess

import pytest
from synthetic import make_result, run_cli

from gembench.harness.continuous import pairs as pairs_module
from gembench.harness.regression import stats
from gembench.harness.regression.sequential import FIRST_LOOK, Looks, SequentialDesign, look_of, spend
from gembench.harness.store.results import write_result


def test_alpha_is_spent_early_and_in_full_by_the_last_look():
    assert spend(0) == 0 and spend(1) == pytest.approx(1)
    looks = Looks(alpha=0.01, max_pairs=24)
    steps = [looks.alpha_at(n) for n in range(FIRST_LOOK, 25, 2)]
    assert sum(steps) == pytest.approx(0.01) and all(s > 0 for s in steps)
    assert steps[0] > 0.2 * 0.01  # the first look already has a quarter of alpha: a plain change stops there


def _false_alarm_rate(alpha_of, trials=1500, max_pairs=24, seed=3) -> float:
    """How often unchanged code (log ratios N(0, 1%)) is called regressed at any look."""
    rng = random.Random(seed)
    alarms = 0
    for _ in range(trials):
        ratios = [math.exp(rng.gauss(0, 0.01)) for _ in range(max_pairs)]
        looks = Looks(0.05, max_pairs)
        for n in range(FIRST_LOOK, max_pairs + 1, 2):
            series = {"t": ([1.0] * n, ratios[:n], "paired", True)}
            verdict = stats.judge(series, alpha_of(looks, n), min_effect=0.0, margin=0.02)[0].verdict
            if verdict == stats.REGRESSED:
                alarms += 1
                break
    return alarms / trials


def test_repeated_looks_keep_the_false_alarm_rate_within_alpha():
    spent = _false_alarm_rate(lambda looks, n: looks.alpha_at(n))
    naive = _false_alarm_rate(lambda looks, n: 0.05)  # every look at the full alpha
    assert spent <= 0.05
    assert naive > 0.08  # what the spending is for: eleven looks at alpha each alarm far more often


def _budgeted_false_alarm_rate(trials=1500, seed=5) -> tuple[float, list[float]]:
    """Null comparisons (log ratios N(0, 1%)) under a budget that ends the looks at 12 of 48 pairs:
    how often any look says regressed, and the alphas of one comparison that looked to the end."""
    rng = random.Random(seed)
    alarms, spent = 0, []
    for _ in range(trials):
        design, ratios, n = SequentialDesign(0.05, 48, budget=300.0), [], 0
        while True:
            n += 2
            ratios += [math.exp(rng.gauss(0, 0.01)) for _ in range(2)]
            series = {"t": ([1.0] * n, list(ratios), "paired", True)}

            def judge(alpha):
                return look_of(stats.judge(series, alpha, min_effect=0.0, margin=0.02))

            if design.after_batch(n, 50.0 * n / 2, 50.0, judge):  # 50 s a batch: the 6th fills 300 s
                break
        alarms += design.last["verdicts"]["t"] == stats.REGRESSED
        if n == 12:  # looked to the budget's end
            spent = [look["alpha"] for look in design.looks.history]
    return alarms / trials, spent


def test_a_budget_that_ends_the_looks_early_still_spends_all_of_alpha_and_no_more():
    rate, alphas = _budgeted_false_alarm_rate()
    assert sum(alphas) == pytest.approx(0.05)  # by pairs alone, 12 of 48 would have spent 0.35 of it
    assert rate <= 0.05


@pytest.fixture
def repo(tmp_path):
    r = tmp_path / "repo"
    r.mkdir()
    git = ["git", "-C", str(r), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    for n in (1, 2):
        (r / "f.txt").write_text(str(n))
        subprocess.run([*git, "add", "."], check=True)
        subprocess.run([*git, "commit", "-qm", f"c{n}"], check=True)
    return r


def _fake_pairs(monkeypatch, slowdown: float, noise: float, seconds: float = 0.0):
    """Pairs that write synthetic results at once: HEAD `slowdown` slower, each process's steps
    N(step, noise); ``seconds`` is added to the clock per batch, so that a budget can run out."""
    clock = {"t": 0.0}
    made = {"n": 0}

    def fake(args, co, batch, folder):
        for r, outs, _, _ in batch:
            for label in ("BASE", "HEAD"):
                made["n"] += 1
                step = 0.1 * (1 + slowdown if label == "HEAD" else 1)
                result = make_result(f"{label}{r}", step_s=step, noise=noise, seed=made["n"], git_commit=co[label].sha)
                write_result(outs[label], result)
        clock["t"] += seconds
        return True

    real = pairs_module.time.perf_counter
    monkeypatch.setattr(pairs_module, "interleaved_pairs", fake)
    monkeypatch.setattr(pairs_module.time, "perf_counter", lambda: real() + clock["t"])


def _continuous(repo, capsys, *flags):
    argv = ["continuous", "HEAD~1", "HEAD", "--repo", str(repo), "--format", "json", "--parallel", "2", *flags]
    code, out, err = run_cli(argv, capsys)
    return code, json.loads(out), err


def test_a_plain_slowdown_stops_at_the_first_look(repo, monkeypatch, capsys):
    _fake_pairs(monkeypatch, slowdown=0.05, noise=0.005)
    code, doc, err = _continuous(repo, capsys)
    assert code == 1 and doc["pairs"] == FIRST_LOOK
    design = doc["design"]
    assert design["kind"] == "sequential" and [look["pairs"] for look in design["looks"]] == [FIRST_LOOK]
    assert doc["alpha"] == design["looks"][0]["alpha"] < design["alpha_total"]
    assert "look at 4 pairs" in err and "regressed" in err


def test_a_noisy_comparison_adds_pairs_until_its_budget_and_says_inconclusive(repo, monkeypatch, capsys):
    _fake_pairs(monkeypatch, slowdown=0.01, noise=0.2, seconds=100.0)  # 100 s a batch, 350 s budget
    code, doc, err = _continuous(repo, capsys, "--budget", "350")
    assert code == 4 and doc["pairs"] == 6  # batches of 2: looks at 4 and 6, an 8th pair would overrun
    assert [look["pairs"] for look in doc["design"]["looks"]] == [4, 6]
    assert "would overrun --budget 350 s" in err


def test_fixed_pairs_are_judged_once_at_the_full_alpha(repo, monkeypatch, capsys):
    _fake_pairs(monkeypatch, slowdown=0.05, noise=0.005)
    code, doc, err = _continuous(repo, capsys, "--pairs", "6")
    assert code == 1 and doc["pairs"] == 6 and doc["design"] == {"kind": "fixed", "pairs": 6}
    assert doc["alpha"] == pytest.approx(0.01) and "look at" not in err
