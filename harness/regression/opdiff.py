"""Which ops two revisions' steps run differently: in count, and in time.

Every result's counters carry ``aten_op_counts`` (metrics/counters.py: the ops of one counted
step by name and overload, ``aten.mm.default``), so a change of the ``aten_ops`` total can be
said in ops. Per side, an op's count is its median over that side's results (as judge_counter
takes a counter's); the list is ordered by the size of the change, then by name.

Every result also carries its op table (metrics/ops.py: one row per stage, block and op of the op
step, with its time), so a change of the step time can be said in ops as well: ``time_changes``
sets the two sides' tables side by side, the ops whose time changed most first, with a t-interval
of the change where the results come in pairs that ran side by side (`continuous`).
"""

from __future__ import annotations

from gembench.harness.regression import stats

TOP = 10  # ops a verdict lists; the JSON carries them all


def side_counts(results: list[dict]) -> dict[str, float] | None:
    """Per op, its median count over ``results``; None when one of them does not record them."""
    per = [(r.get("counters") or {}).get("aten_op_counts") for r in results]
    if not per or any(not isinstance(c, dict) for c in per):
        return None
    ops = sorted({op for c in per for op in c})
    return {op: stats.median([float(c.get(op, 0)) for c in per]) for op in ops}


def op_changes(base: dict[str, float], head: dict[str, float]) -> list[dict]:
    """The ops whose count differs, biggest change first: {op, base, head, delta, kind}, where
    kind is "added" (absent in BASE), "removed" (absent in HEAD) or "changed"."""
    out = []
    for op in sorted(set(base) | set(head)):
        a, b = base.get(op, 0), head.get(op, 0)
        if a != b:
            kind = "added" if not a else "removed" if not b else "changed"
            out.append({"op": op, "base": a, "head": b, "delta": b - a, "kind": kind})
    return sorted(out, key=lambda c: (-abs(c["delta"]), c["op"]))


def side_times(results: list[dict]) -> list[dict[tuple, float]] | None:
    """Per result, {(stage, block, op): seconds in its op step}; None when one of them has no op table."""
    tables = [(r.get("ops") or {}).get("rows") for r in results]
    if not tables or any(t is None for t in tables):
        return None
    return [{(row["stage"], row["block"], row["op"]): row["time_s"] for row in t} for t in tables]


def time_changes(base: list[dict], head: list[dict], paired: bool, confidence: float = 0.95) -> list[dict] | None:
    """The two sides' op tables side by side: per (stage, block, op), each side's median time, the
    change (HEAD - BASE, seconds) and, ``paired`` (base[i] and head[i] ran side by side) over two
    pairs or more, the ``confidence`` t-interval of the mean paired difference; kind "added" (no
    time in BASE), "removed" (none in HEAD) or "changed". The biggest change first; None where a
    side's results carry no op table."""
    a, b = side_times(base), side_times(head)
    if a is None or b is None:
        return None
    out = []
    for key in sorted({k for t in a + b for k in t}):
        ta, tb = [t.get(key, 0.0) for t in a], [t.get(key, 0.0) for t in b]
        ma, mb = stats.median(ta), stats.median(tb)
        ci = None
        if paired and len(ta) == len(tb) >= 2:
            from scipy.special import stdtrit

            d = [y - x for x, y in zip(ta, tb)]
            half = float(stdtrit(len(d) - 1, 0.5 + confidence / 2)) * (stats.variance(d) / len(d)) ** 0.5
            ci = [stats.mean(d) - half, stats.mean(d) + half]
        kind = "added" if not any(ta) else "removed" if not any(tb) else "changed"
        stage, block, op = key
        out.append(
            {"stage": stage, "block": block, "op": op, "base_s": ma, "head_s": mb, "delta_s": mb - ma, "ci_s": ci}
            | {"kind": kind}
        )
    return sorted(out, key=lambda c: -abs(c["delta_s"]))


def section(rounds: list[tuple[dict, dict]]) -> dict:
    """The ``op_changes`` section of `continuous`'s JSON from its pairs [(base, head), ...]:
    {recorded, base_total, head_total, changes (all of them), times (time_changes, paired)};
    recorded False where a side's results carry no per-op counts (a revision from before they
    were kept), times None where they carry no op table."""
    bases, heads = [b for b, _ in rounds], [h for _, h in rounds]
    base, head = side_counts(bases), side_counts(heads)
    times = time_changes(bases, heads, paired=True)
    if base is None or head is None:
        return {"recorded": False, "base_total": None, "head_total": None, "changes": [], "times": times}
    return {
        "recorded": True,
        "base_total": sum(base.values()),
        "head_total": sum(head.values()),
        "changes": op_changes(base, head),
        "times": times,
    }
