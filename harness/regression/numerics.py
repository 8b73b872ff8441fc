"""Numerics of two revisions: do their training losses agree, step by step?

Both revisions of `gembench continuous` train from the same seed on the same batches, so the same
arithmetic gives the same losses. Per timed step, the trained loss and each task's loss of every
BASE process are compared with every HEAD process's, and the processes of one revision with each
other (they must agree too, or the revision is not reproducible). A difference is relative,
|head - base| / max(|base|, |head|); a non-finite loss (null in the result) only equals another.

The tolerance is per dtype (the results' run.dtype; the looser one where they differ):
TOLERANCE. On the CPU the same code repeats bit for bit: fresh processes of one commit, paced in
turns or not, compiled (bf16) or eager (fp32), give identical losses at one thread count
(docs/continuous.md), so any difference there is the code's. The tolerance leaves room for the
same arithmetic in another order (another thread count, a GPU's atomics) over the first steps
and stays below what small changes of the model do at the first timed step (another initial
scale of one weight: 1.4e-4; the model in fp32 instead of bf16: 1.9e-3). Differences grow as
training goes on, from whatever start, so the first step past the tolerance is what a verdict
names; same-code differences cross it too, late in a long run (measured: fp32 on 1 against 2
threads, 1.7e-7 at step 10, 4.9e-5 by step 50).

verdicts: "unchanged"; "changed" (BASE and HEAD differ beyond the tolerance); "unreproducible"
(the processes of one revision differ among themselves); "not compared" (a side recorded no
losses, or they ran different seeds or batches).
"""

from __future__ import annotations

import math

UNCHANGED, CHANGED, UNREPRODUCIBLE, NOT_COMPARED = "unchanged", "changed", "unreproducible", "not compared"
TOLERANCE = {"fp32": 1e-5, "bf16": 1e-4}
DEFAULT_TOLERANCE = 1e-4  # a dtype not in TOLERANCE: the loosest
SAME_RUN = ("run.seed", "run.warmup", "config.hash", "workload.hash", "run.global_batch")


def tolerance(dtypes) -> float:
    """The relative tolerance for losses computed in ``dtypes`` (the loosest of them)."""
    return max(TOLERANCE.get(str(d), DEFAULT_TOLERANCE) for d in dtypes)


def series(result: dict) -> dict[str, list[float | None]]:
    """The per-step losses of one result by name: "loss" (the trained one) and "task<k> loss"."""
    samples = result.get("samples") or {}
    out = {}
    if isinstance(samples.get("loss"), list):
        out["loss"] = samples["loss"]
    per_step = samples.get("task_loss") or []
    for k in range(max((len(t) for t in per_step), default=0)):
        out[f"task{k} loss"] = [t[k] if k < len(t) else None for t in per_step]
    return out


def rel_diff(a: float | None, b: float | None) -> float:
    """|b - a| relative to the larger of the two; 0 for equal values, inf where one is not finite."""
    fa = a is not None and math.isfinite(a)
    fb = b is not None and math.isfinite(b)
    if not (fa and fb):
        return 0.0 if fa == fb else math.inf  # both non-finite (nulls in a result) count as equal
    if a == b:
        return 0.0
    return abs(b - a) / max(abs(a), abs(b))


def first_difference(a: dict, b: dict, tol: float) -> tuple[float, dict | None]:
    """Two results' losses: (the largest relative difference, the first step beyond ``tol`` as
    {timed_step, series, a, b, rel_diff}, or None). Steps both ran are compared."""
    sa, sb = series(a), series(b)
    worst, first = 0.0, None
    for name in [n for n in sa if n in sb]:
        for i, (x, y) in enumerate(zip(sa[name], sb[name])):
            d = rel_diff(x, y)
            worst = max(worst, d)
            if d > tol and (first is None or i < first["timed_step"]):
                first = {"timed_step": i, "series": name, "a": x, "b": y, "rel_diff": d}
    return worst, first


def judge(rounds: list[tuple[dict, dict]], tol: float | None = None) -> dict:
    """The ``numerics`` section of `continuous` from its pairs [(base result, head result), ...]:
    {verdict, tolerance, dtype, max_rel_diff, steps, first (where they first differ: step,
    timed_step, series, base, head, rel_diff, pair), reason}."""
    from gembench.harness.store.results import field

    bases, heads = [b for b, _ in rounds], [h for _, h in rounds]
    dtypes = sorted({str(field(r, "run.dtype")) for r in bases + heads})
    tol = tolerance(dtypes) if tol is None else tol
    out = {"verdict": NOT_COMPARED, "tolerance": tol, "dtype": "/".join(dtypes), "max_rel_diff": None}
    out.update(steps=None, first=None, reason=None)
    lacking = [label for label, side in (("BASE", bases), ("HEAD", heads)) if not all(series(r) for r in side)]
    if lacking:
        out["reason"] = f"{' and '.join(lacking)} recorded no per-step losses"
        return out
    other = [k for k in SAME_RUN if field(bases[0], k) != field(heads[0], k)]
    if other:
        out["reason"] = f"BASE and HEAD ran different {', '.join(other)}: their losses are not comparable"
        return out
    out["steps"] = min(len(series(r)["loss"]) for r in bases + heads if "loss" in series(r)) if bases else 0
    warmup = field(bases[0], "run.warmup") or 0
    # within each revision first: a revision whose own processes disagree cannot be compared
    for label, side in (("BASE", bases), ("HEAD", heads)):
        for k, r in enumerate(side[1:], start=2):
            _, first = first_difference(side[0], r, tol)
            if first is not None:
                out.update(verdict=UNREPRODUCIBLE, first=_where(first, warmup, pair=k, label=label))
                out["reason"] = f"{label}'s processes differ among themselves (pair 1 against pair {k})"
                return out
    worst, found = 0.0, None
    for k, (b, h) in enumerate(rounds, start=1):
        d, first = first_difference(b, h, tol)
        worst = max(worst, d)
        if first is not None and (found is None or first["timed_step"] < found["timed_step"]):
            found = _where(first, warmup, pair=k)
    out.update(verdict=CHANGED if found else UNCHANGED, max_rel_diff=worst, first=found)
    return out


def _where(first: dict, warmup: int, pair: int, label: str | None = None) -> dict:
    """A first difference as the section states it: its step counted from the first warm-up step
    (as result["diverged"] counts), the timed step, and which pair."""
    return {
        "step": warmup + first["timed_step"],
        "timed_step": first["timed_step"],
        "series": first["series"],
        "base": first["a"],
        "head": first["b"],
        "rel_diff": first["rel_diff"],
        "pair": pair,
        **({"within": label} if label else {}),
    }


NUMERICS_EXIT = 5  # not 3: that is `gate`'s and `compare`'s "not comparable"


def exit_status(code: int, numerics: dict, fail: bool = True) -> int:
    """`continuous`'s exit status with the numerics: a regression (1) or an error (2) stands; else,
    with ``fail``, losses that changed or are not reproducible make it NUMERICS_EXIT."""
    if fail and code in (0, 4) and numerics["verdict"] in (CHANGED, UNREPRODUCIBLE):
        return NUMERICS_EXIT
    return code


# A technique that changes the arithmetic on purpose (FP8 activations; 2D's replicas averaged only
# every N steps) is judged by where training goes rather than step by step: how far the last TAIL
# steps' mean loss moved from the reference's, as a share of the reference's first TAIL steps'
# (the curve's level against the loss it started from: a model that learns its batches by heart
# ends near 0, where relative differences mean nothing). benchmarks/fp8_activations.py and
# benchmarks/sparse2d_sync.py gate it.
LEVEL_TAIL = 20
LEVEL_TOLERANCE = 0.02


def level_drift(reference: list[float], other: list[float], tail: int = LEVEL_TAIL) -> float:
    """|mean(other[-tail:]) - mean(reference[-tail:])| / mean(reference[:tail])."""
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return abs(mean(other[-tail:]) - mean(reference[-tail:])) / mean(reference[:tail])
