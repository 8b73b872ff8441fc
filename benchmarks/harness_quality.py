"""How good is gembench's regression detection on this machine? Two figures, from real timings.

1. false-alarm rate: the same code compared against itself must not be called "regressed"
   (goal: at most 1%);
2. detection rate: a planted 5% slowdown must be called "regressed" (goal: at least 95%);
and the time each took (measuring, and deciding).

How it measures. A real workload is timed in rounds; each round makes one run of the code as is
(A) and one with a planted slowdown (B), in alternating order (ABBA), so that drift from other
jobs on the machine hits both alike. Each run is a result dict like `gembench run` writes
(samples.step_s, metrics step_time_s = median step, mfu, examples_per_s). Then many comparisons are
drawn from these pools and judged by the very code `gembench compare` and `gembench gate` use
(gembench.harness.regression.compare), for all three metrics at once, so Holm's correction is in play:
- replicates: N runs against N other runs (the unit the stated false-alarm rate is for);
- single runs: one run against one other run, judged on batch medians of per-step samples.

Workloads (--workload):
- mlp: a small MLP forward+backward+SGD step in torch (always available).
- tiny: `gembench.harness.train.runner.run_benchmark("tiny")`, the real training step.
Planting (--plant): "scale" (default) makes B runs real, separately timed runs whose step times are
multiplied by 1.05, so the effect is exactly 5% and the noise is this machine's; "spin" (mlp only)
makes each B step really spin 5% of the median step longer; torch's worker threads compete with
the spin on two cores, so the realised effect comes out larger than 5% (printed as measured).
  (Hook: WORKLOADS below; a new workload is a function returning one run's step times.)

Paired commits (--paired): the end-to-end check of `gembench continuous`. It clones the current
commit into a throwaway repository, commits beside it planted slowdowns in harness/train/step.py (every
training step busy-waits 2%, and on another branch 5%, of its own measured duration before its
clock stops: real CPU work, hit by contention like the step itself; --plants), and runs `gembench
continuous BASE PLANTED` for each plant and `gembench continuous BASE BASE` (an unchanged pair)
--comparisons times each, as fresh commands with the defaults a CI job would use. A planted
comparison counts as detected when step_time_s is "regressed" (exit 1); an unchanged one is a false
alarm when anything regresses (exit 1) and passes when it exits 0. It prints, per kind, the exits
and ratios, the minutes per comparison and the machine, then rates two ways:
- resampled: many comparisons of as many pairs drawn from the measured pairs of each kind and
  judged by continuous's own rule (valid as far as pairs are independent; small pools understate
  the spread);
- bounded: the spread of one pair's log ratio, pooled over every comparison around its own mean,
  with its 95% upper bound (chi-square), and the rule's rates at the spread and at the bound for
  normal log ratios: the figures that say how many comparisons were "enough". Pairs that ran at
  once (continuous --parallel) are checked for alikeness: the correlation of batch-mates' log
  ratios and its upper bound go into those rates, since the t-test takes every pair as independent.
Then (--one-op) it compares BASE against a commit with one extra multiply in the training step:
the cost counters must call that a regression every time.

Each comparison takes ~4-5 minutes on an idle 2-core machine with the defaults: choose --comparisons
for the time you have (--json is rewritten after every comparison, so a stopped run keeps them).

usage:
  python benchmarks/harness_quality.py                     # mlp, about a minute on 2 cores
  python benchmarks/harness_quality.py --paired --comparisons 5   # 2%, 5%, unchanged: ~55 min on 2 cores
  python benchmarks/harness_quality.py --paired --comparisons 1 --paired-pairs 4 --stack baseline  # quicker
  python -m benchmarks.harness_quality --workload tiny --rounds 20
  python benchmarks/harness_quality.py --json quality.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import sys
import time

PLANTED = 0.05
GOALS = {"false_alarm_rate": ("<=", 0.01), "detection_rate": (">=", 0.95)}


# ----------------------------------------------------------------------------- workloads


def mlp_workload(steps: int, warmup: int, seed: int = 0):
    """A small MLP training step; returns run(slow_s) -> list of step times (slow_s spun per step)."""
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1)
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(256, 256), torch.randn(256, 1)

    def run(slow_s: float = 0.0) -> list[float]:
        out = []
        for i in range(warmup + steps):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            if slow_s:
                end = time.perf_counter() + slow_s
                while time.perf_counter() < end:  # real CPU time, hit by contention like the step
                    pass
            if i >= warmup:
                out.append(time.perf_counter() - t0)
        return out

    return run


def tiny_workload(steps: int, warmup: int, seed: int = 0):
    """The real tiny training step through the harness API (one fresh run per call)."""
    from gembench.harness.train.runconfig import RunConfig
    from gembench.harness.train.runner import run_benchmark

    def run(slow_s: float = 0.0) -> list[float]:
        return list(run_benchmark(RunConfig("tiny", steps=steps, warmup=warmup, seed=seed))["samples"]["step_s"])

    return run


WORKLOADS = {"mlp": mlp_workload, "tiny": tiny_workload}


def as_result(rid: str, step_s: list[float]) -> dict:
    """A minimal gembench.result/1 document around one run's step times."""
    mfu = [0.01 * statistics.median(step_s) / s for s in step_s]  # MFU is proportional to 1/step time
    env = {"hardware_class": "this-machine", "torch": "x", "torchrec": "x", "fbgemm_gpu": "x"}
    return {
        "schema": "gembench.result/1",
        "id": rid,
        "config": {"name": "quality", "hash": "q"},
        "run": {"global_batch": 256},
        "env": env,
        "samples": {"step_s": step_s, "mfu": mfu},
        "metrics": {
            "step_time_s": statistics.median(step_s),
            "mfu": statistics.mean(mfu),
            "examples_per_s": 256 / statistics.mean(step_s),
        },
    }


# ----------------------------------------------------------------------------- measurement


def collect(workload: str, rounds: int, steps: int, warmup: int, plant: str = "scale") -> dict:
    """Timed pools of A runs and B (planted 5% slower) runs, interleaved ABBA."""
    make = WORKLOADS[workload]
    run = make(steps, warmup)
    run()  # first run: allocator, caches, lazy init
    base = statistics.median(run())
    pool_a, pool_b = [], []
    t0 = time.perf_counter()
    for r in range(rounds):
        for kind in "AB" if r % 2 == 0 else "BA":
            if kind == "A":
                pool_a.append(run())
            elif plant == "spin":
                pool_b.append(run(PLANTED * base))
            else:
                pool_b.append([s * (1 + PLANTED) for s in run()])
    seconds = time.perf_counter() - t0
    return {"a": pool_a, "b": pool_b, "seconds": seconds, "run_s": seconds / (2 * rounds), "base_step_s": base}


def evaluate(
    pools: dict, replicates: int = 5, trials: int = 1000, alpha: float = 0.01, min_effect: float = 0.03, seed: int = 0
) -> dict:
    """False-alarm and detection rates from resampled comparisons of the measured pools."""
    from gembench.harness.regression.compare import compare

    rng = random.Random(seed)
    a = [as_result(f"a{i}", s) for i, s in enumerate(pools["a"])]
    b = [as_result(f"b{i}", s) for i, s in enumerate(pools["b"])]

    def regressed(x, y) -> tuple[bool, bool]:
        c = compare(x, y, alpha, min_effect)
        verdicts = {j.metric: j.verdict for j in c.judgements}
        return any(v == "regressed" for v in verdicts.values()), verdicts["step_time_s"] == "regressed"

    out = {}
    # Replicates: disjoint draws of N runs for each side.
    n = min(replicates, len(a) // 2)
    t0 = time.perf_counter()
    false = sum(regressed(*(lambda s: (s[:n], s[n : 2 * n]))(rng.sample(a, 2 * n)))[0] for _ in range(trials))
    hits = sum(regressed(rng.sample(a, n), rng.sample(b, n))[1] for _ in range(trials))
    decide_s = (time.perf_counter() - t0) / (2 * trials)
    out["replicates"] = {
        "n_per_side": n,
        "trials": trials,
        "false_alarm_rate": false / trials,
        "detection_rate": hits / trials,
        "decide_s": decide_s,
        "time_to_decision_s": 2 * n * pools["run_s"] + decide_s,
    }
    # Single runs: every pair of distinct A runs, every A x B pair; batch medians of step samples.
    pairs_aa = list(itertools.combinations(range(len(a)), 2))
    pairs_ab = list(itertools.product(range(len(a)), range(len(b))))
    t0 = time.perf_counter()
    false = sum(regressed([a[i]], [a[j]])[0] for i, j in pairs_aa)
    hits = sum(regressed([a[i]], [b[j]])[1] for i, j in pairs_ab)
    decide_s = (time.perf_counter() - t0) / (len(pairs_aa) + len(pairs_ab))
    out["single_run_batch_medians"] = {
        "n_per_side": 1,
        "trials": [len(pairs_aa), len(pairs_ab)],
        "false_alarm_rate": false / len(pairs_aa),
        "detection_rate": hits / len(pairs_ab),
        "decide_s": decide_s,
        "time_to_decision_s": 2 * pools["run_s"] + decide_s,
    }
    med_a = statistics.mean(statistics.median(s) for s in pools["a"])
    med_b = statistics.mean(statistics.median(s) for s in pools["b"])
    runs = [statistics.median(s) for s in pools["a"]]
    out["noise"] = {
        "runs_per_pool": len(a),
        "steps_per_run": len(pools["a"][0]),
        "base_step_s": pools["base_step_s"],
        "run_to_run_cv": statistics.stdev(runs) / statistics.mean(runs),
        "within_run_cv": statistics.mean(statistics.stdev(s) / statistics.mean(s) for s in pools["a"]),
        "measured_planted_effect": med_b / med_a - 1,
        "collect_s": pools["seconds"],
    }
    out["alpha"], out["min_effect"] = alpha, min_effect
    return out


def report(figures: dict, workload: str) -> str:
    from tabulate import tabulate

    noise = figures["noise"]
    lines = [
        f"harness quality on this machine, workload {workload}: {noise['runs_per_pool']} runs per pool x "
        f"{noise['steps_per_run']} steps, base step {1e3 * noise['base_step_s']:.2f} ms, "
        f"run-to-run CV {100 * noise['run_to_run_cv']:.2f}%, within-run CV {100 * noise['within_run_cv']:.2f}%, "
        f"planted slowdown measured {100 * noise['measured_planted_effect']:+.2f}% (target +5%), "
        f"measuring took {noise['collect_s']:.1f} s",
        f"decision rule: alpha={figures['alpha']:g} (Holm over mfu, step_time_s, examples_per_s), "
        f"min effect {100 * figures['min_effect']:g}%",
        "",
    ]
    rows = []
    for mode in ("replicates", "single_run_batch_medians"):
        f = figures[mode]
        ok_fa = f["false_alarm_rate"] <= GOALS["false_alarm_rate"][1]
        ok_det = f["detection_rate"] >= GOALS["detection_rate"][1]
        rows.append(
            [
                f"{mode} (n={f['n_per_side']}/side)",
                f"{100 * f['false_alarm_rate']:.2f}% {'ok' if ok_fa else 'MISSED'}",
                f"{100 * f['detection_rate']:.1f}% {'ok' if ok_det else 'MISSED'}",
                f"{f['time_to_decision_s']:.2f} s",
                f"{1e3 * f['decide_s']:.2f} ms",
                str(f["trials"]),
            ]
        )
    lines.append(
        tabulate(
            rows, ["mode", "false alarms (goal <=1%)", "detects 5% (goal >=95%)", "measure+decide", "decide", "trials"]
        )
    )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- paired commits

PLANT_AT = "        loss, durations = one_step(i)\n"  # in step.timed_steps, inside the step clock
PLANT_CODE = (
    "        # planted by benchmarks/harness_quality.py --paired: busy-wait {fraction} of this step\n"
    "        _spin_end = time.perf_counter() + {fraction} * (time.perf_counter() - start)\n"
    "        while time.perf_counter() < _spin_end:\n"
    "            pass\n"
)


def _git(repo, *args: str) -> str:
    import subprocess

    proc = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=harness-quality", "-c", "user.email=hq@localhost", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        raise SystemExit(f"harness_quality: git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def planted_repository(root, fraction: float = PLANTED) -> tuple[str, str]:
    """Clone this checkout's HEAD into ``root`` and commit a ``fraction`` slowdown on top: (base, planted) shas."""
    from pathlib import Path

    here = Path(__file__).resolve().parents[1]
    _git(root.parent, "clone", "--quiet", "--no-local", str(here), str(root))
    base = _git(root, "rev-parse", "HEAD")
    return base, plant_commit(root, base, fraction)


def plant_commit(root, base: str, fraction: float) -> str:
    """Commit, on a branch of its own from ``base`` in the throwaway ``root``, a ``fraction``
    busy-wait in every step."""
    return _commit_beside(
        root,
        base,
        f"planted-{fraction:g}",
        PLANT_AT,
        PLANT_CODE.format(fraction=fraction),
        "the slowdown",
        f"plant a {100 * fraction:g}% slowdown in every step (harness_quality --paired)",
    )


def _commit_beside(root, base: str, branch: str, anchor: str, code: str, what: str, message: str) -> str:
    """Commit ``code`` after ``anchor`` in harness/train/step.py on ``branch`` from ``base``; the sha.
    The clone is left at ``base``."""
    step = root / "harness" / "train" / "step.py"
    _git(root, "checkout", "--quiet", "-B", branch, base)
    text = step.read_text()
    if anchor not in text:
        raise SystemExit(f"harness_quality: cannot plant {what}: {step} no longer has {anchor.strip()!r}")
    step.write_text(text.replace(anchor, anchor + code, 1))
    _git(root, "commit", "--quiet", "-am", message)
    sha = _git(root, "rev-parse", "HEAD")
    _git(root, "checkout", "--quiet", base)
    return sha


ONE_OP_AT = "        loss, per_task = losses(workload, output, batch)\n"  # in step.train_step, the counted step
ONE_OP_CODE = (
    "        loss = loss * 1.0  # planted by benchmarks/harness_quality.py --paired: one more op in the step\n"
)


def one_op_commit(root, base: str) -> str:
    """Commit, on top of ``base`` in the throwaway ``root``, one extra multiply in the training step."""
    return _commit_beside(
        root,
        base,
        "one-op",
        ONE_OP_AT,
        ONE_OP_CODE,
        "the extra op",
        "plant one extra op in every step (harness_quality --paired)",
    )


def continuous(repo, base: str, head: str, extra: list[str]) -> tuple[int, dict]:
    """One `gembench continuous` command, as CI would run it: (exit status, its JSON report)."""
    import subprocess

    cmd = [
        sys.executable,
        "-m",
        "gembench",
        "continuous",
        base,
        head,
        "--repo",
        str(repo),
        "--format",
        "json",
        "--quiet",
        *extra,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=repo)
    if proc.returncode not in (0, 1, 4):
        raise SystemExit(
            f"harness_quality: {' '.join(cmd[2:])} failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}"
        )
    return proc.returncode, json.loads(proc.stdout)


def verdict(ratios: list[float], alpha: float, min_effect: float, margin: float) -> str:
    """continuous's verdict on pairs with these HEAD/BASE ratios (stats.judge, paired)."""
    from gembench.harness.regression import stats

    return stats.judge({"step_time_s": ([1.0] * len(ratios), ratios, "paired", True)}, alpha, min_effect, margin)[
        0
    ].verdict


def resample_rounds(outcomes: dict, trials: int, seed: int = 0) -> dict | None:
    """Finer rates than a few real comparisons give: draw comparisons of as many pairs from the
    measured pairs of each kind (each planted size for detection, unchanged ones for false alarms)
    and judge them with continuous's own rule (stats.judge on paired ratios, its alpha, min effect
    and margin). Valid as far as pairs are independent (each is two fresh processes).
    """
    from gembench.harness.regression import stats

    pools = {k: [r for o in v for r in (o["round_ratios"] or [])] for k, v in outcomes.items()}
    rounds = min((o["rounds"] for v in outcomes.values() for o in v), default=0)
    if rounds < 2 or "unchanged" not in pools or any(len(p) < rounds for p in pools.values()):
        return None
    rng = random.Random(seed)
    first = outcomes["unchanged"][0]
    alpha, min_effect = first.get("alpha", stats.ALPHA), first.get("min_effect", stats.MIN_EFFECT)
    margin = first.get("margin") or min_effect

    def verdicts(pool) -> list[str]:
        return [verdict(rng.choices(pool, k=rounds), alpha, min_effect, margin) for _ in range(trials)]

    out = {"rounds": rounds, "trials": trials, "pool": {k: len(p) for k, p in pools.items()}, "detection_rate": {}}
    for kind, pool in pools.items():
        v = verdicts(pool)
        if kind == "unchanged":
            out["false_alarm_rate"] = v.count(stats.REGRESSED) / trials
            out["unchanged_pass_rate"] = v.count(stats.UNCHANGED) / trials
        else:
            out["detection_rate"][kind] = v.count(stats.REGRESSED) / trials
    return out


def sequential_design(outcomes: dict) -> tuple[int, float, float, int]:
    """(max pairs, budget s, seconds a batch, pairs a batch) of the comparisons measured: the
    design's limits as continuous defines them, each batch's time as the pairs took it."""
    from gembench.harness.continuous.config import DEFAULT_BUDGET, MAX_PAIRS

    runs = [o for v in outcomes.values() for o in v]
    at_once = max(1, min(o.get("parallel") or 1 for o in runs))
    batch_s = statistics.mean(60 * o["minutes"] / max(1, o["rounds"] / at_once) for o in runs)
    return MAX_PAIRS, DEFAULT_BUDGET, batch_s, at_once


def resample_sequential(outcomes: dict, trials: int, seed: int = 0) -> dict | None:
    """The sequential design run again on pairs drawn from each kind's measured pairs (as
    resample_rounds does for a fixed number of pairs): its detection and false-alarm rates."""
    from gembench.harness.regression import stats

    pools = {k: [r for o in v for r in (o["round_ratios"] or [])] for k, v in outcomes.items()}
    if "unchanged" not in pools or any(len(p) < 4 for p in pools.values()):
        return None
    rng = random.Random(seed)
    first = outcomes["unchanged"][0]
    alpha, min_effect = first.get("alpha", stats.ALPHA), first.get("min_effect", stats.MIN_EFFECT)
    max_pairs, budget, batch_s, at_once = sequential_design(outcomes)
    design = (max_pairs, alpha, min_effect, first.get("margin") or min_effect, budget)
    out = {"rounds": max_pairs, "trials": trials, "pool": {k: len(p) for k, p in pools.items()}, "detection_rate": {}}
    out["mean_pairs"] = {}
    for kind, pool in pools.items():
        tally = sequential_tally(lambda n, pool=pool: rng.choices(pool, k=n), trials, design, batch_s, at_once)
        out["mean_pairs"][kind] = round(tally["mean_pairs"], 1)
        if kind == "unchanged":
            out["false_alarm_rate"], out["unchanged_pass_rate"] = tally["regressed"], tally["unchanged"]
        else:
            out["detection_rate"][kind] = tally["regressed"]
    return out


def goals(outcomes: dict, upper: dict, plants: list[float]) -> None:
    """The end-to-end goals beside what was measured: unchanged code "unchanged" >= 95%, a 2% (the
    smallest plant) slowdown caught >= 95%, false alarms <= 1%, each at the upper bounds of the
    spread and correlation; and the minutes a verdict took (at most 5 on a quiet host)."""
    smallest = min(plants)
    slowest = max(o["minutes"] for v in outcomes.values() for o in v)
    mean = statistics.mean(o["minutes"] for v in outcomes.values() for o in v)
    checks = [
        ("unchanged code unchanged", upper[0.0]["unchanged"], ">=", 0.95),
        (f"{100 * smallest:g}% caught", upper[smallest]["regressed"], ">=", 0.95),
        ("false alarms", upper[0.0]["regressed"], "<=", 0.01),
    ]
    for what, got, op, goal in checks:
        met = got >= goal if op == ">=" else got <= goal
        verdict_ = "met" if met else "NOT met"
        print(f"goal: {what} {100 * got:.2f}% (goal {op} {100 * goal:g}%, at the upper bounds): {verdict_}")
    verdict_ = "met" if slowest <= 5 else "NOT met"
    print(
        f"goal: minutes a verdict took: mean {mean:.1f}, at most {slowest:.1f} (goal <= 5 on a quiet host): {verdict_}"
    )


def spread_bound(outcomes: dict, confidence: float = 0.95) -> dict | None:
    """The spread (SD) of one pair's log(HEAD/BASE), pooled over every measured pair with each
    comparison's own mean taken out, and its one-sided upper confidence bound (chi-square): the
    rates below hold with that confidence as far as pairs are independent and close to log-normal."""
    import math

    from scipy.stats import chi2

    ss, dof = 0.0, 0
    for v in outcomes.values():
        for o in v:
            logs = [math.log(r) for r in (o["round_ratios"] or [])]
            if len(logs) > 1:
                m = statistics.mean(logs)
                ss += sum((x - m) ** 2 for x in logs)
                dof += len(logs) - 1
    if dof < 2:
        return None
    sd = math.sqrt(ss / dof)
    return {"sd": sd, "sd_upper": math.sqrt(ss / chi2.ppf(1 - confidence, dof)), "dof": dof, "confidence": confidence}


def batch_mates(outcomes: dict, confidence: float = 0.95) -> dict | None:
    """How alike the log ratios of pairs run at once are (continuous --parallel): the correlation
    of batch-mates' deviations from their comparison's mean, with its one-sided upper bound
    (Fisher's z). A positive one shrinks what side-by-side pairs are worth; rates_at takes it in.
    Batches of two only (2 CPUs): comparisons with other widths are left out."""
    import math

    from scipy.stats import norm

    xs, ys = [], []
    for v in outcomes.values():
        for o in v:
            logs = [math.log(r) for r in (o["round_ratios"] or [])]
            at_once = o.get("parallel") or 1
            if at_once != 2 or len(logs) < 2:  # pairs one at a time have no batch-mates
                continue
            m = statistics.mean(logs)
            xs += [logs[i] - m for i in range(0, len(logs) - 1, 2)]
            ys += [logs[i + 1] - m for i in range(0, len(logs) - 1, 2)]
    if len(xs) < 5:
        return None
    r = statistics.correlation(xs, ys)
    upper = math.tanh(math.atanh(r) + norm.ppf(confidence) / math.sqrt(len(xs) - 3))
    return {"r": r, "r_upper": upper, "batches": len(xs), "confidence": confidence}


def rates_at(
    sd: float,
    effects: list[float],
    rounds: int,
    alpha: float,
    min_effect: float,
    margin: float,
    trials: int = 20000,
    seed: int = 0,
    r: float = 0.0,
    at_once: int = 2,
) -> dict:
    """Rates of continuous's rule for ``rounds`` pairs whose log ratios are normal with spread
    ``sd``, pairs run ``at_once`` sharing a correlation ``r`` (a negative one taken as none)."""
    import math

    from gembench.harness.regression import stats

    rng = random.Random(seed)
    shared, own = math.sqrt(max(r, 0.0)), math.sqrt(1 - max(r, 0.0))
    out = {}
    for effect in effects:
        counts = {stats.REGRESSED: 0, stats.UNCHANGED: 0}
        for _ in range(trials):
            batch = [rng.gauss(0, 1) for _ in range(-(-rounds // at_once))]
            ratios = [
                math.exp(math.log1p(effect) + sd * (shared * batch[i // at_once] + own * rng.gauss(0, 1)))
                for i in range(rounds)
            ]
            v = verdict(ratios, alpha, min_effect, margin)
            counts[v] = counts.get(v, 0) + 1
        out[effect] = {"regressed": counts[stats.REGRESSED] / trials, "unchanged": counts[stats.UNCHANGED] / trials}
    return out


def sequential_comparison(
    ratios: list[float], alpha: float, min_effect: float, margin: float, batch_s: float, budget_s: float, at_once: int
) -> tuple[str, int]:
    """One comparison by continuous's sequential design (gembench.harness.regression.sequential's
    SequentialDesign, the rule itself) over pairs with these HEAD/BASE ratios, in order, ``at_once``
    a batch as run_pairs batches them, at most len(ratios): (the verdict, the pairs it took)."""
    from gembench.harness.regression import stats
    from gembench.harness.regression.sequential import Look, SequentialDesign

    design, n = SequentialDesign(alpha, len(ratios), budget_s), 0
    while n < len(ratios):
        n = min(n + at_once, len(ratios))
        look = lambda level: Look({"step_time_s": verdict(ratios[:n], level, min_effect, margin)})  # noqa: E731
        if design.after_batch(n, n / at_once * batch_s, batch_s, look):  # asks ``look`` where a look is due
            break
    return (design.last["verdicts"]["step_time_s"] if design.last else stats.INCONCLUSIVE), n


def sequential_tally(draw, trials: int, design: tuple, batch_s: float, at_once: int) -> dict:
    """How often the sequential design says regressed and unchanged over ``trials`` comparisons of
    pairs from ``draw(n)`` (n ratios), with the mean pairs and minutes a verdict took. ``design``:
    (max pairs, alpha, min effect, margin, budget in s)."""
    from gembench.harness.regression import stats

    max_pairs, alpha, min_effect, margin, budget_s = design
    counts, pairs_used = {stats.REGRESSED: 0, stats.UNCHANGED: 0, stats.INCONCLUSIVE: 0}, 0
    for _ in range(trials):
        v, n = sequential_comparison(draw(max_pairs), alpha, min_effect, margin, batch_s, budget_s, at_once)
        counts[v] = counts.get(v, 0) + 1
        pairs_used += n
    mean_pairs = pairs_used / trials
    return {
        "regressed": counts[stats.REGRESSED] / trials,
        "unchanged": counts[stats.UNCHANGED] / trials,
        "mean_pairs": mean_pairs,
        "mean_minutes": mean_pairs / at_once * batch_s / 60,
    }


def sequential_rates(
    sd: float,
    effects: list[float],
    max_pairs: int,
    alpha: float,
    min_effect: float,
    margin: float,
    batch_s: float,
    budget_s: float,
    at_once: int = 2,
    trials: int = 4000,
    seed: int = 0,
    r: float = 0.0,
) -> dict:
    """Rates of continuous's sequential design for pairs whose log ratios are normal with spread
    ``sd``, ``at_once`` pairs a batch taking ``batch_s`` and sharing a correlation ``r`` (a negative
    one taken as none): per effect, how often regressed and unchanged, and the mean pairs and
    minutes a verdict took."""
    import math

    rng = random.Random(seed)
    shared = math.sqrt(max(r, 0.0))
    own = math.sqrt(1.0 - shared**2)

    def normal(effect):
        def draw(n):
            out = []
            while len(out) < n:
                common = rng.gauss(0, 1)
                out += [
                    math.exp(math.log1p(effect) + sd * (shared * common + own * rng.gauss(0, 1)))
                    for _ in range(at_once)
                ]
            return out[:n]

        return draw

    design = (max_pairs, alpha, min_effect, margin, budget_s)
    return {effect: sequential_tally(normal(effect), trials, design, batch_s, at_once) for effect in effects}


def sequential_main(args) -> int:
    """The sequential design's rates at given spreads of one pair (no benchmark is run)."""
    from gembench.harness.continuous.config import DEFAULT_BUDGET, MARGIN, MAX_PAIRS, MIN_EFFECT
    from gembench.harness.regression import stats

    effects = [0.0, 0.02, 0.05]
    max_pairs, budget = args.max_pairs or MAX_PAIRS, args.budget or DEFAULT_BUDGET
    print(
        f"continuous's sequential design: at most {max_pairs} pairs, {args.sequential_parallel} a batch of "
        f"{args.batch_seconds:g} s, budget {budget:g} s, alpha {stats.ALPHA:g}, regression >= "
        f"{100 * MIN_EFFECT:g}%, unchanged within +-{100 * MARGIN:g}%; {args.trials} simulated comparisons a cell"
    )
    rows = []
    for sd in args.spreads:
        r = sequential_rates(
            sd,
            effects,
            max_pairs,
            stats.ALPHA,
            MIN_EFFECT,
            MARGIN,
            args.batch_seconds,
            budget,
            args.sequential_parallel,
            args.trials,
        )
        rows.append(
            [
                f"{100 * sd:.2f}%",
                f"{100 * r[0.0]['unchanged']:.1f}%",
                f"{100 * r[0.0]['regressed']:.2f}%",
                f"{100 * r[0.02]['regressed']:.1f}%",
                f"{100 * r[0.05]['regressed']:.1f}%",
                " / ".join(f"{r[e]['mean_pairs']:.1f} ({r[e]['mean_minutes']:.1f} min)" for e in effects),
            ]
        )
    from tabulate import tabulate

    print(
        tabulate(
            rows,
            ["pair spread", "unchanged passes", "false alarms", "2% caught", "5% caught", "pairs (min): 0 / 2% / 5%"],
        )
    )
    print("goals: unchanged >= 95%, 2% caught >= 95%, false alarms <= 1%")
    return 0


def paired_main(args) -> int:
    import tempfile
    from pathlib import Path

    extra = ["--config", args.config, "--stack", args.stack]
    for flag, value in (
        ("--pairs", args.paired_rounds),
        ("--steps", args.paired_steps),
        ("--bursts", args.paired_bursts),
        ("--statistic", args.statistic),
        ("--threads", args.threads),
        ("--parallel", args.paired_parallel),
    ):
        if value is not None:
            extra += [flag, str(value)]
    t0 = time.perf_counter()
    machine = "?"
    with tempfile.TemporaryDirectory(prefix="gembench-quality-") as tmp:
        repo = Path(tmp) / "repo"
        base, first = planted_repository(repo, args.plants[0])
        heads = {f"planted {100 * args.plants[0]:g}%": first}
        heads.update({f"planted {100 * f:g}%": plant_commit(repo, base, f) for f in args.plants[1:]})
        heads["unchanged"] = base
        outcomes = {kind: [] for kind in heads}
        print(
            f"paired: throwaway repository {repo}: BASE {base[:10]}, "
            + ", ".join(f"{k.upper()} {sha[:10]}" for k, sha in heads.items() if k != "unchanged")
            + f" (busy-wait per step); gembench continuous {' '.join(extra)}",
            flush=True,
        )
        for i in range(args.comparisons):
            for kind, head in heads.items():
                started = time.perf_counter()
                keep = (
                    [
                        "--keep-results",
                        str(Path(args.keep) / f"comparison{i + 1}-{kind.replace(' ', '-').replace('%', '')}"),
                    ]
                    if args.keep
                    else []
                )
                code, report_ = continuous(repo, base, head, extra + keep)
                machine = report_.get("hardware_class", machine)
                row = next((r for r in report_["rows"] if r["metric"] == "step_time_s"), None)
                ratio, ci = (row["ratio"], row["ratio_ci95"]) if row else (None, None)
                outcomes[kind].append(
                    {
                        "exit": code,
                        "verdict": row and row["verdict"],
                        "ratio": ratio,
                        "ci95": ci,
                        "minutes": (time.perf_counter() - started) / 60,
                        "rounds": report_["rounds"],
                        "alpha": report_["alpha"],
                        "min_effect": report_["min_effect"],
                        "margin": report_.get("margin"),
                        "parallel": report_.get("parallel"),
                        "round_ratios": row and row["round_ratios"],
                    }
                )
                ci_text = f"[{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "-"
                print(
                    f"paired: comparison {i + 1}/{args.comparisons} {kind:<12} exit {code}, step_time_s HEAD/BASE "
                    f"{ratio if ratio is None else f'{ratio:.4f}'} 95% CI {ci_text} {row and row['verdict']}, "
                    f"{(time.perf_counter() - started) / 60:.1f} min",
                    flush=True,
                )
                if args.json:  # after every comparison: a long run stopped early keeps what it measured
                    with open(args.json, "w") as fh:
                        json.dump(
                            {"comparisons": i + 1, "machine": machine, "extra": extra, "outcomes": outcomes},
                            fh,
                            indent=1,
                        )
        caught = []
        if args.one_op:
            one_op = one_op_commit(repo, base)
        for i in range(args.one_op):  # counters are exact: two short pairs decide
            code, report_ = continuous(
                repo, base, one_op, ["--config", args.config, "--stack", args.stack, "--pairs", "2", "--steps", "10"]
            )
            counts = {
                r["metric"]: (r["base"], r["head"])
                for r in report_["rows"]
                if r["method"] == "count" and r["verdict"] == "regressed"
            }
            caught.append(code == 1 and bool(counts))
            print(
                f"paired: one-op change {i + 1}/{args.one_op}: exit {code}, counters regressed: "
                f"{', '.join(f'{k} {a:g} -> {b:g}' for k, (a, b) in counts.items()) or 'none'}",
                flush=True,
            )
    if args.comparisons:
        paired_summary(args, outcomes, machine, extra, (time.perf_counter() - t0) / 60, caught)
    elif caught:
        print(f"paired: a one-op change caught by the counters in {sum(caught)} of {len(caught)} comparisons")
    return 0


def paired_summary(args, outcomes: dict, machine: str, extra: list, minutes: float, caught: list) -> None:
    """The rates of --paired from its comparisons' ``outcomes`` (kind -> one dict per comparison):
    printed, and with --json written whole (--summarize prints them again from that file)."""
    n = len(next(iter(outcomes.values())))
    per = statistics.mean(o["minutes"] for v in outcomes.values() for o in v)
    print(
        f"paired on {machine}: {n} comparison(s) of each kind, {per:.1f} min per comparison, {minutes:.0f} min in all"
    )
    for kind, v in outcomes.items():
        exits = [o["exit"] for o in v]
        what = (
            f"unchanged (exit 0) {exits.count(0)}/{n}, false alarms (exit 1) {exits.count(1)}/{n}"
            if kind == "unchanged"
            else f"detected (exit 1) {exits.count(1)}/{n}"
        )
        print(
            f"paired: {kind:<12} {what}, inconclusive (exit 4) {exits.count(4)}/{n}; "
            f"HEAD/BASE {', '.join(format(o['ratio'], '.4f') for o in v if o['ratio'])}"
        )
    fixed = "--pairs" in extra  # continuous --pairs N: the fixed design; else the sequential one
    resampled = resample_rounds(outcomes, args.trials) if fixed else resample_sequential(outcomes, args.trials)
    if resampled:
        design = f"{resampled['rounds']} pairs" if fixed else "the sequential design (continuous's defaults)"
        print(
            f"paired, resampled: {resampled['trials']} comparisons of {design}, pairs "
            "drawn from the measured "
            f"pairs ({', '.join(f'{k} {p}' for k, p in resampled['pool'].items())}): "
            + "".join(f"detected {100 * r:.1f}% of {k}, " for k, r in resampled["detection_rate"].items())
            + f"false alarms {100 * resampled['false_alarm_rate']:.1f}%, unchanged code passes "
            f"{100 * resampled['unchanged_pass_rate']:.1f}% (assumes pairs independent)"
            + (f"; mean pairs a verdict: {resampled['mean_pairs']}" if not fixed else "")
        )
    bound = spread_bound(outcomes)
    mates = batch_mates(outcomes)
    if mates:
        print(
            f"paired: pairs run two at once: their log ratios correlate r = {mates['r']:.2f} over {mates['batches']} "
            f"batches ({100 * mates['confidence']:g}% upper bound {mates['r_upper']:.2f}); the rates below take it in"
        )
    bounded = None
    if bound and resampled:
        first = outcomes["unchanged"][0]
        effects = [0.0] + list(args.plants)
        margin = first.get("margin") or first["min_effect"]
        at = {
            "measured": (bound["sd"], mates["r"] if mates else 0.0),
            "upper": (bound["sd_upper"], mates["r_upper"] if mates else 0.0),
        }
        if fixed:
            bounded = {
                label: rates_at(sd, effects, resampled["rounds"], first["alpha"], first["min_effect"], margin, r=corr)
                for label, (sd, corr) in at.items()
            }
        else:
            max_pairs, budget, batch_s, at_once = sequential_design(outcomes)
            bounded = {
                label: sequential_rates(
                    sd,
                    effects,
                    max_pairs,
                    first["alpha"],
                    first["min_effect"],
                    margin,
                    batch_s,
                    budget,
                    at_once,
                    r=corr,
                )
                for label, (sd, corr) in at.items()
            }
        for label, (sd, r_mates) in at.items():
            r = bounded[label]
            which = "measured" if label == "measured" else f"{100 * bound['confidence']:g}% upper bounds of the"
            pairs = (
                f"{resampled['rounds']} pairs" if fixed else f"sequential, {r[0.0]['mean_pairs']:.1f} pairs unchanged"
            )
            print(
                f"paired, at the {which} "
                f"spread of one pair, {100 * sd:.2f}% ({bound['dof']} degrees of freedom)"
                f"{f' and correlation {r_mates:.2f}' if mates else ''}: "
                + "".join(f"detects {100 * f:g}% {100 * r[f]['regressed']:.1f}%, " for f in args.plants)
                + f"false alarms {100 * r[0.0]['regressed']:.2f}%, unchanged passes {100 * r[0.0]['unchanged']:.1f}% "
                f"({pairs}, normal log ratios)"
            )
        goals(outcomes, bounded["upper"], args.plants)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "comparisons": n,
                    "machine": machine,
                    "minutes": minutes,
                    "extra": extra,
                    "outcomes": outcomes,
                    "resampled": resampled,
                    "spread": bound,
                    "batch_mates": mates,
                    "bounded": bounded and {k: {str(e): r for e, r in v.items()} for k, v in bounded.items()},
                    "one_op_caught": caught,
                },
                fh,
                indent=1,
            )
    if caught:
        print(f"paired: a one-op change caught by the counters in {sum(caught)} of {len(caught)} comparisons")


def main(argv: list[str] | None = None) -> int:
    from gembench.harness.regression.paired import STATISTICS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--paired",
        action="store_true",
        help="end to end: plant a 5%% slowdown in a throwaway commit and run `gembench continuous` on it "
        "and on an unchanged pair, --pairs times",
    )
    p.add_argument(
        "--comparisons",
        "--pairs",
        dest="comparisons",
        type=int,
        default=2,
        help="with --paired: `gembench continuous` commands of each kind (each plant, unchanged; default 2)",
    )
    p.add_argument(
        "--plants",
        default="0.02,0.05",
        metavar="F,F",
        help="with --paired: planted slowdowns, fractions of each step's time (default 0.02,0.05)",
    )
    p.add_argument(
        "--one-op",
        type=int,
        default=2,
        metavar="N",
        help="with --paired: also compare against a commit with one extra op in the step N times "
        "(2 short rounds each: the counters must catch it; default 2)",
    )
    p.add_argument("--config", default="tiny", help="with --paired: config (default tiny)")
    p.add_argument(
        "--stack",
        choices=("optimized", "baseline"),
        default="optimized",
        help="with --paired: stack (default optimized)",
    )
    p.add_argument(
        "--paired-rounds",
        "--paired-pairs",
        dest="paired_rounds",
        type=int,
        default=None,
        help="with --paired: continuous's --pairs (default: continuous's)",
    )
    p.add_argument(
        "--paired-bursts", type=int, default=None, help="with --paired: continuous's --bursts (default: continuous's)"
    )
    p.add_argument(
        "--paired-steps", type=int, default=None, help="with --paired: --steps per process (default: continuous's)"
    )
    p.add_argument(
        "--statistic",
        choices=STATISTICS,
        default=None,
        help="with --paired: continuous's --statistic (default: continuous's)",
    )
    p.add_argument(
        "--paired-parallel",
        type=int,
        default=None,
        help="with --paired: continuous's --parallel, pairs at once (default: continuous's, one per CPU)",
    )
    p.add_argument("--threads", type=int, default=None, help="with --paired: continuous's --threads")
    p.add_argument(
        "--keep", default=None, metavar="DIR", help="with --paired: keep every process's result under DIR/pairI-KIND/"
    )
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="mlp")
    p.add_argument("--rounds", type=int, default=30, help="ABBA rounds: runs per pool (default 30)")
    p.add_argument("--steps", type=int, default=30, help="timed steps per run (default 30)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--replicates", type=int, default=5, help="runs per side in replicate mode (default 5)")
    p.add_argument("--trials", type=int, default=1000, help="resampled comparisons per figure (default 1000)")
    p.add_argument("--alpha", type=float, default=0.01)
    p.add_argument("--min-effect", type=float, default=0.03)
    p.add_argument(
        "--plant",
        choices=("scale", "spin"),
        default="scale",
        help="scale: B runs are real runs with step times x1.05 (exact effect, default); "
        "spin: B steps really spin 5%% longer (mlp only; contention makes the effect inexact)",
    )
    p.add_argument(
        "--sequential",
        default=None,
        metavar="SD,SD",
        help="the sequential design's rates, simulated, at these spreads of one pair's log ratio "
        "(e.g. 0.0098,0.02: the quiet and the noisy EPYC VM); runs no benchmark",
    )
    p.add_argument(
        "--batch-seconds", type=float, default=40.0, help="with --sequential: one batch of pairs (default 40)"
    )
    p.add_argument("--sequential-parallel", type=int, default=2, help="with --sequential: pairs a batch (default 2)")
    p.add_argument("--max-pairs", type=int, default=None, help="with --sequential: continuous's --max-pairs")
    p.add_argument("--budget", type=float, default=None, help="with --sequential: continuous's --budget, s")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    p.add_argument(
        "--summarize",
        default=None,
        metavar="JSON",
        help="--paired's rates again from the JSON a --paired run wrote (after every comparison: a stopped "
        "run keeps them), without measuring",
    )
    args = p.parse_args(argv)
    if args.summarize:
        with open(args.summarize) as fh:
            saved = json.load(fh)
        args.plants = [float(k.split()[1].rstrip("%")) / 100 for k in saved["outcomes"] if k != "unchanged"]
        args.json = None
        paired_summary(args, saved["outcomes"], saved["machine"], saved["extra"], saved.get("minutes", 0.0), [])
        return 0
    if args.sequential:
        try:
            args.spreads = [float(x) for x in args.sequential.split(",")]
        except ValueError:
            p.error(f"--sequential takes spreads like 0.0098,0.02, got {args.sequential!r}")
        return sequential_main(args)
    if args.paired:
        if args.comparisons < 0 or args.comparisons + args.one_op < 1:
            p.error("--comparisons must be >= 1 (or 0 with --one-op N: the counters' check alone)")
        try:
            args.plants = [float(f) for f in args.plants.split(",")]
        except ValueError:
            p.error(f"--plants takes fractions like 0.02,0.05, got {args.plants!r}")
        if not args.plants or not all(0 < f < 1 for f in args.plants):
            p.error(f"--plants: each slowdown is a fraction in (0, 1), got {args.plants}")
        return paired_main(args)
    pools = collect(args.workload, args.rounds, args.steps, args.warmup, args.plant)
    figures = evaluate(pools, args.replicates, args.trials, args.alpha, args.min_effect)
    figures["workload"] = args.workload
    print(report(figures, args.workload))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(figures, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
