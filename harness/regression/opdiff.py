"""Which aten ops two revisions' steps dispatch differently: added, removed, changed in count.

Every result's counters carry ``aten_op_counts`` (metrics/counters.py: the ops of one counted
step by name and overload, ``aten.mm.default``), so a change of the ``aten_ops`` total can be
said in ops. Per side, an op's count is its median over that side's results (as judge_counter
takes a counter's); the list is ordered by the size of the change, then by name.
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


def section(rounds: list[tuple[dict, dict]]) -> dict:
    """The ``op_changes`` section of `continuous`'s JSON from its pairs [(base, head), ...]:
    {recorded, base_total, head_total, changes (all of them)}; recorded False where a side's
    results carry no per-op counts (a revision from before they were kept)."""
    base = side_counts([b for b, _ in rounds])
    head = side_counts([h for _, h in rounds])
    if base is None or head is None:
        return {"recorded": False, "base_total": None, "head_total": None, "changes": []}
    return {
        "recorded": True,
        "base_total": sum(base.values()),
        "head_total": sum(head.values()),
        "changes": op_changes(base, head),
    }
