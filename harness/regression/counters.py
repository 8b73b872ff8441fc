"""Exact judgement of cost counters and instruction counts: no statistics, a threshold.

A counter (aten ops dispatched, host syncs, host-to-device bytes, kernels, graph breaks,
recompiles, a kernel's instruction count) is deterministic for a seed, so one value per side
decides: B regresses when it exceeds A by more than the allowed fraction (results/thresholds.toml,
default 0: any increase), and improves when it is lower. Where a side's replicates disagree the
counter is not deterministic after all: each side's median is compared (one odd run does not
decide) and the judgement's note says so, naming the range, so the flaky counter gets fixed.
"""

from __future__ import annotations

from gembench.harness.regression import stats
from gembench.harness.regression.directions import info

METHOD = "count"


def judge_counter(
    metric: str, a: list[float], b: list[float], allowed: float, source: str = "default"
) -> stats.Judgement:
    """Judge one counter; ``allowed`` is the largest increase that passes, a fraction of A (0 = none).

    ``a`` and ``b`` are the counter's values on each side (one per run, or per round); both non-empty.
    """
    if not a or not b:
        raise ValueError("both sides need at least one value")
    meta = info(metric)
    lower = meta.lower_is_better if meta else True
    ref, new = stats.median(a), stats.median(b)
    notes = [f"allowed increase {100 * allowed:g}% ({source})"]
    for label, side in (("A", a), ("B", b)):
        if max(side) != min(side):
            notes.append(f"{label} varies between runs ({min(side):g}..{max(side):g}): not deterministic")
    change = (new / ref - 1.0) if ref else (0.0 if new == ref else None)
    worse = (new - ref) if lower else (ref - new)
    if worse > allowed * abs(ref):
        verdict = stats.REGRESSED
    elif worse < 0:
        verdict = stats.IMPROVED
    else:
        verdict = stats.UNCHANGED
    j = stats.Judgement(metric, lower, METHOD, len(a), len(b), float(ref), float(new), change, None)
    j.verdict = verdict
    j.note = "; ".join(notes)
    j.extra["allowed_increase"] = allowed
    return j
