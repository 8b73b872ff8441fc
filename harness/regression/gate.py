"""The CI gate's checks: thresholds on the run itself, then regressions against the baseline.

Each check is one line; the exit status is the worst outcome, in this order of precedence:
1 a threshold missed or a metric regressed (a definite failure beats everything), 3 the baseline is
not comparable, 4 a comparison too noisy to decide, 0 all passed. 2 (an error) never reaches here:
errors are raised as UsageError before any check runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from gembench.harness.regression import stats
from gembench.harness.regression.compare import compare
from gembench.harness.regression.thresholds import Limits
from gembench.harness.regression.work import held_mfu, side_by_side, work_change
from gembench.harness.store.results import COMPARABLE_KEYS, RUN_KEYS

PASS, FAIL, SKIP, INCONCLUSIVE, NOT_COMPARABLE = "PASS", "FAIL", "SKIP", "INCONCLUSIVE", "NOT-COMPARABLE"
EXIT = {PASS: 0, SKIP: 0, FAIL: 1, NOT_COMPARABLE: 3, INCONCLUSIVE: 4}
PRECEDENCE = (FAIL, NOT_COMPARABLE, INCONCLUSIVE)

# threshold field -> (metric, "min" or "max")
THRESHOLD_METRICS = {
    "min_mfu": ("mfu", "min"),
    "min_ab_mfu_ratio": ("ab_mfu_ratio", "min"),
    "max_imbalance": ("imbalance_max_mean", "max"),
    "max_exposed_comm": ("exposed_comm_fraction", "max"),
    "max_startup_s": ("startup_s", "max"),
}


@dataclass
class Check:
    status: str
    name: str
    detail: str

    def line(self) -> str:
        return f"{self.status:<14} {self.name}: {self.detail}"


def exit_code(checks: list[Check]) -> int:
    statuses = {c.status for c in checks}
    for status in PRECEDENCE:
        if status in statuses:
            return EXIT[status]
    return 0


def diverged_checks(runs: list[dict]) -> list[Check]:
    """A run whose loss turned non-finite timed broken training: FAIL, whatever its MFU."""
    checks = []
    for r in runs:
        d = r.get("diverged")
        if d:
            task = f" (task {d['task']})" if d.get("task") else ""
            checks.append(
                Check(
                    FAIL,
                    "diverged",
                    f"run {r.get('id')} diverged: loss {d['loss']} at step "
                    f"{d['step']}{task}; its figures do not measure training",
                )
            )
    return checks


def threshold_checks(runs: list[dict], limits: Limits, baseline: list[dict] | None = None) -> list[Check]:
    """Compare the mean over the given replicate runs with each configured limit. Where the runs
    do other model FLOPs than the ``baseline`` the limits were set on, MFU is held at the
    baseline's FLOPs (work.held_mfu): a commit cannot pass by doing more work."""
    checks = []
    changed = work_change(baseline, runs) if baseline else None
    for field, (metric, kind) in THRESHOLD_METRICS.items():
        limit = getattr(limits, field)
        if limit is None:
            continue
        where = (limits.sources or {}).get(field, "?")
        have = [r for r in runs if isinstance((r.get("metrics") or {}).get(metric), (int, float))]
        values, held = [r["metrics"][metric] for r in have], ""
        if changed is not None and metric == "mfu" and have:
            values = [held_mfu(r, baseline[0]) for r in have]
            held = f", held at the baseline's model FLOPs: {changed.what('the run', 'the baseline')}"
        if not values:
            checks.append(Check(SKIP, field, f"the result has no {metric} (limit {limit:g} from {where})"))
            continue
        value = stats.mean(values)
        ok = value >= limit if kind == "min" else value <= limit
        sign = (">=" if ok else "<") if kind == "min" else ("<=" if ok else ">")
        n = f" (mean of {len(values)} runs)" if len(values) > 1 else ""
        checks.append(Check(PASS if ok else FAIL, field, f"{metric} {value:.4g}{n} {sign} {limit:g} ({where}){held}"))
    return checks


def counter_check(j: stats.Judgement, prefix: str = "") -> Check:
    """A cost counter's exact judgement (counters.judge_counter) as one check line."""
    change = "" if j.change is None else f" ({100 * j.change:+.2f}%)"
    status = FAIL if j.verdict == stats.REGRESSED else PASS
    return Check(
        status, f"{prefix}{j.metric}", f"{j.verdict}: {j.mean_a:.10g} -> {j.mean_b:.10g}{change}, exact count, {j.note}"
    )


def baseline_checks(
    runs: list[dict],
    baseline: list[dict],
    baseline_name: str,
    alpha: float,
    min_effect: float,
    limits: Limits | None = None,
) -> list[Check]:
    """One check per metric judged against the baseline, or one NOT-COMPARABLE line."""
    c = compare(baseline, runs, alpha, min_effect, keys=COMPARABLE_KEYS + RUN_KEYS, limits=limits)
    if not c.comparable:
        return [Check(NOT_COMPARABLE, "baseline", f"{baseline_name}: " + "; ".join(c.reasons))]
    checks = []
    if c.work is not None:
        checks.append(Check(SKIP, "vs baseline mfu", "work changed: " + c.work.line("the run", "the baseline")))
    elif (same := side_by_side(*c.model_flops, "baseline", "run", c.beyond)) is not None:
        checks.append(Check(PASS, "vs baseline work", same))
    for j in c.judgements:
        name = f"vs baseline {j.metric}"
        if j.method == "count":
            checks.append(counter_check(j, "vs baseline "))
            continue
        if not j.testable:
            checks.append(Check(SKIP, name, f"{j.mean_a:.4g} -> {j.mean_b:.4g}: {j.note}"))
            continue
        lo, hi = j.ci
        detail = (
            f"{j.mean_a:.4g} -> {j.mean_b:.4g} ({100 * j.change:+.2f}%, {100 * (1 - 2 * alpha):g}% CI "
            f"[{100 * lo:+.2f}%, {100 * hi:+.2f}%], {j.method} n={j.n_a}/{j.n_b}, "
            f"{'lower' if j.lower_is_better else 'higher'} is better)"
        )
        status = {stats.REGRESSED: FAIL, stats.INCONCLUSIVE: INCONCLUSIVE}.get(j.verdict, PASS)
        checks.append(Check(status, name, f"{j.verdict}: {detail}"))
    return checks
