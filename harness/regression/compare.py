"""Compare two sets of runs metric by metric: values, change, interval, verdict; render them.

A "side" is a list of result dicts (replicate runs of one commit). The statistics are in
stats.py; this module picks, per metric, what one independent value is (see stats.py), and turns
the judgements into a table (terminal, Markdown for a PR comment) or JSON.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gembench.harness.regression import stats
from gembench.harness.regression.counters import judge_counter
from gembench.harness.regression.directions import METRICS, info, per_step
from gembench.harness.regression.opdiff import time_changes
from gembench.harness.regression.work import WORK_METRICS, WorkChange, executed_beyond, model_flops, work_change
from gembench.harness.store.results import COMPARABLE_KEYS, differences


@dataclass
class Comparison:
    a_ids: list[str]
    b_ids: list[str]
    reasons: list[str]  # why not comparable (empty: comparable)
    forced: bool
    alpha: float
    min_effect: float
    judgements: list[stats.Judgement] = field(default_factory=list)
    unjudged: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)
    work: WorkChange | None = None  # the model FLOPs differ: MFU unjudged, step time judged
    model_flops: tuple = (None, None)  # per step, each side's first result's
    beyond: tuple = ({}, {})  # what each side's first result executes beyond them, by block
    op_times: list | None = None  # opdiff.time_changes of the two sides' op tables (unpaired)

    @property
    def comparable(self) -> bool:
        return not self.reasons


def side_reasons(a: list[dict], b: list[dict], keys=COMPARABLE_KEYS) -> list[str]:
    """Why these two sides may not be compared: within-side mismatches first, then across."""
    reasons = []
    for label, side in (("A", a), ("B", b)):
        for other in side[1:]:
            reasons += [f"{label} replicates differ in {d}" for d in differences(side[0], other, keys)]
    reasons += differences(a[0], b[0], keys)
    return reasons


def _values(runs: list[dict], metric: str) -> list[float]:
    out = []
    for r in runs:
        v = (r.get("metrics") or {}).get(metric)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out.append(float(v))
    return out


def series_for(a: list[dict], b: list[dict], metric: str) -> tuple[list[float], list[float], str]:
    """The independent values of ``metric`` on each side and what they are (stats.py's methods)."""
    info = METRICS[metric]
    va, vb = _values(a, metric), _values(b, metric)
    if info.exact and va and vb:
        return va, vb, "exact"
    if len(va) >= 2 and len(vb) >= 2:
        return va, vb, "replicates"
    # Fewer than two runs on a side: fall back to batch medians of the per-step samples, run by run.
    ba = [m for r in a for m in stats.batch_medians(per_step(r, metric))]
    bb = [m for r in b for m in stats.batch_medians(per_step(r, metric))]
    if len(ba) >= 2 and len(bb) >= 2:
        return ba, bb, "batch-medians"
    return va, vb, "single"


def compare(
    a: list[dict],
    b: list[dict],
    alpha: float = stats.ALPHA,
    min_effect: float = stats.MIN_EFFECT,
    force: bool = False,
    keys=COMPARABLE_KEYS,
    only: list[str] | None = None,
    limits=None,
) -> Comparison:
    """Judge every known metric present on both sides; unknown metrics are listed, not judged.

    Cost counters and instruction counts are judged exactly against their allowed increase from
    ``limits`` (a thresholds.Limits; None: the defaults, 0 for counters, 1% for instructions).
    Where the two sides' model FLOPs differ (``work``), MFU is listed, not judged, and step time is.
    """
    if not a or not b:
        raise ValueError("each side needs at least one run")
    c = Comparison(
        [r.get("id", "?") for r in a], [r.get("id", "?") for r in b], side_reasons(a, b, keys), force, alpha, min_effect
    )
    if c.reasons and not force:
        return c
    names: list[str] = []
    for r in a + b:
        names += [n for n in (r.get("metrics") or {}) if n not in names]
    c.work, c.model_flops = work_change(a, b), (model_flops(a[0]), model_flops(b[0]))
    c.beyond = (executed_beyond(a[0]), executed_beyond(b[0]))
    c.op_times = time_changes(a, b, paired=False)
    if only:
        asked = [*only, "step_time_s"] if c.work and any(m in WORK_METRICS for m in only) else only
        names = [n for n in names if n in asked]
    series, counted = {}, []
    for name in names:
        va, vb = _values(a, name), _values(b, name)
        meta = info(name)
        if meta is None or not va or not vb or (c.work and name in WORK_METRICS):
            c.unjudged[name] = (stats.mean(va) if va else None, stats.mean(vb) if vb else None)
            continue
        if meta.counter:
            counted.append(judge_counter(name, va, vb, *counter_limit(limits, name)))
            continue
        sa, sb, method = series_for(a, b, name)
        series[name] = (sa, sb, method, meta.lower_is_better)
    c.judgements = stats.judge(series, alpha, min_effect) + counted
    return c


def counter_limit(limits, metric: str) -> tuple[float, str]:
    """(allowed increase, where it was set) for a counter, from thresholds.Limits or the defaults."""
    if limits is not None:
        return limits.counter_limit(metric)
    from gembench.harness.regression.thresholds import Limits

    return Limits().counter_limit(metric)


def rows(c: Comparison) -> list[dict]:
    """One plain dict per metric: what the JSON output holds and the tables show."""
    out = []
    for j in c.judgements:
        out.append(
            {
                "metric": j.metric,
                "better": "lower" if j.lower_is_better else "higher",
                "a": j.mean_a,
                "b": j.mean_b,
                "change": j.change,
                "ci": list(j.ci) if j.ci else None,
                "p_worse_holm": j.extra.get("p_worse_holm"),
                "p_better_holm": j.extra.get("p_better_holm"),
                "method": j.method,
                "n": [j.n_a, j.n_b],
                "verdict": j.verdict,
                "note": j.note,
            }
        )
    for name, (va, vb) in c.unjudged.items():
        out.append(
            {"metric": name, "better": None, "a": va, "b": vb, "change": None, "ci": None, "verdict": "not judged"}
        )
    return out


def to_json(c: Comparison) -> dict:
    return {
        "a": c.a_ids,
        "b": c.b_ids,
        "comparable": c.comparable,
        "reasons": c.reasons,
        "work_changed": None
        if c.work is None
        else {"a_model_flops": c.work.a, "b_model_flops": c.work.b, "change": c.work.change, "blocks": c.work.blocks},
        "forced": c.forced,
        "alpha": c.alpha,
        "min_effect": c.min_effect,
        "rows": rows(c) if (c.comparable or c.forced) else [],
        "op_times": c.op_times,
    }
