"""Whether two sides did the same work: MFU compares two runs only at equal model FLOPs.

A commit that adds FLOPs raises MFU whether or not the FLOPs are needed, so where the model
FLOPs per step differ, MFU is no measure of the change: compare, gate and continuous then judge
step time, say that the work changed (by how much, in which block), and hold the gate's MFU
threshold at the baseline's FLOPs (``held_mfu``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# metrics whose value moves with the model FLOPs a step is credited with
WORK_METRICS = ("mfu", "mfu_host", "baseline_mfu")
TOLERANCE = 1e-6  # relative: the same seed and batches give the same FLOPs to the last digit


def model_flops(result: dict) -> float | None:
    return (result.get("flops") or {}).get("model_per_step")


@dataclass(frozen=True)
class WorkChange:
    """The two sides' model FLOPs per step (their first results'), and the blocks whose forward
    FLOPs differ: {block: (A, B)}."""

    a: float
    b: float
    blocks: dict[str, tuple[float, float]]

    @property
    def change(self) -> float:
        return self.b / self.a - 1 if self.a else math.inf

    def what(self, b_name: str = "B", a_name: str = "A") -> str:
        """``the candidate does 35.0% more model FLOPs per step than the baseline (...)``."""
        more = "more" if self.b > self.a else "fewer"
        moved = sorted(self.blocks.items(), key=lambda kv: -abs(kv[1][1] - kv[1][0]))
        blocks = ", ".join(f"{name} {_gflop(b - a, sign=True)}" for name, (a, b) in moved[:3])
        return (
            f"{b_name} does {abs(self.change):.1%} {more} model FLOPs per step than {a_name} "
            f"({_gflop(self.a)} -> {_gflop(self.b)}{'; ' + blocks if blocks else ''})"
        )

    def line(self, b_name: str = "B", a_name: str = "A") -> str:
        return self.what(b_name, a_name) + ": MFU is not comparable, judged on step time"


def _gflop(x: float, sign: bool = False) -> str:
    return f"{x / 1e9:{'+' if sign else ''}.4g} GFLOP"


def work_change(a: list[dict], b: list[dict]) -> WorkChange | None:
    """How the model FLOPs of side B's first result differ from side A's; None when equal, or when
    either lacks them (results of other kinds)."""
    fa, fb = model_flops(a[0]), model_flops(b[0])
    if not fa or not fb or abs(fb - fa) <= TOLERANCE * max(fa, fb):
        return None
    pa, pb = (r.get("flops", {}).get("per_block") or {} for r in (a[0], b[0]))
    blocks = {
        k: (pa.get(k, 0.0), pb.get(k, 0.0))
        for k in dict.fromkeys([*pa, *pb])
        if abs(pb.get(k, 0.0) - pa.get(k, 0.0)) > TOLERANCE * max(fa, fb)
    }
    return WorkChange(fa, fb, blocks)


def executed_beyond(result: dict) -> dict[str, float]:
    """The FLOPs a step executes beyond its model FLOPs, by block: work that reaches no loss and
    the padding a kernel computes past the formula ("padding"); what HFU counts and MFU does not."""
    flops = result.get("flops") or {}
    beyond = dict(flops.get("untrained_per_block") or {})
    if flops.get("beyond_formula_per_step"):
        beyond["padding"] = flops["beyond_formula_per_step"]
    return beyond


def side_by_side(
    fa: float | None,
    fb: float | None,
    a_name: str = "A",
    b_name: str = "B",
    beyond: tuple[dict, dict] = ({}, {}),
) -> str | None:
    """``model FLOPs per step: A 1.2 GFLOP, B 1.2 GFLOP (the same work)``, where work_change found
    none, and what B executes beyond them where that moved (``beyond``: each side's
    executed_beyond); None without them. (A change of work is WorkChange.line's to say.)"""
    if not fa or not fb:
        return None
    line = f"model FLOPs per step: {a_name} {_gflop(fa)}, {b_name} {_gflop(fb)} (the same work)"
    ea, eb = beyond
    moved = {k: eb.get(k, 0.0) - ea.get(k, 0.0) for k in dict.fromkeys([*ea, *eb])}
    moved = {k: d for k, d in moved.items() if abs(d) > TOLERANCE * max(fa, fb)}
    if moved:
        total = sum(moved.values())
        blocks = ", ".join(f"{k} {_gflop(d, sign=True)}" for k, d in sorted(moved.items(), key=lambda kv: -abs(kv[1])))
        line += (
            f"; {b_name} executes {_gflop(abs(total))} {'more' if total > 0 else 'less'} beyond them "
            f"({blocks}): HFU counts it, MFU does not"
        )
    return line


def held_mfu(result: dict, baseline: dict) -> float:
    """The result's MFU at the baseline's model FLOPs per step: its speed, credited with the work
    the baseline does (what a threshold set on the baseline means)."""
    mfu = result["metrics"]["mfu"]
    run, base = model_flops(result), model_flops(baseline)
    return mfu * base / run if run and base else mfu
