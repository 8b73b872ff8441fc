"""A group-sequential design for `gembench continuous`: look after each batch of pairs, stop once clear.

A fixed number of pairs is either too many (a plain 5% slowdown is clear after four) or too few (on a
noisy host a 2% one needs twenty). So the pairs are judged at looks: after the first ``FIRST_LOOK``
pairs, then after every batch. Repeated looks would inflate the false-alarm rate if each used the
full alpha, so alpha is spent across them (Lan and DeMets' alpha-spending: a look at information
fraction t may have spent ``alpha * spend(t)`` in all) with the Pocock-type function
spend(t) = ln(1 + (e - 1) t), which spends early and so stops early on a plain change. The fraction
is the larger of pairs / max_pairs and the budget's share used (a budget that ends the looks long
before max_pairs would otherwise leave most of alpha unspent), and the look after which no further
batch fits spends what is left: the fractions follow the clock and the pair count, never the
pairs' values. Each look tests at the increment of the spent alpha; by the union bound over the
looks the chance of any false alarm stays at most alpha, and so does the chance that "unchanged"
(the look's (1 - 2 alpha_k) interval inside the margin) is said of a change beyond the margin. The
bound is conservative: the looks' statistics are correlated, so the true rates are lower.

The run stops at the first look where every timing metric is decided (regressed, improved or
unchanged) or a counter regressed; at ``max_pairs`` or when the time budget would be overrun
before the next look it stops and says what it has: inconclusive if still undecided.

SequentialDesign is the one rule: `gembench continuous` asks it after each batch of pairs, and
benchmarks/harness_quality.py runs it on drawn pairs to rate it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

FIRST_LOOK = 4  # fewer pairs give a t-test with under 3 degrees of freedom: no look is worth it


def spend(t: float) -> float:
    """The share of alpha spent by information fraction ``t`` (Pocock-type, Lan-DeMets)."""
    t = min(max(t, 0.0), 1.0)
    return math.log(1 + (math.e - 1) * t)


@dataclass
class Looks:
    """The looks of one comparison: at which pairs, at what alpha, and what each said."""

    alpha: float
    max_pairs: int
    spent: float = 0.0
    history: list[dict] = field(default_factory=list)

    def due(self, pairs: int) -> bool:
        """A look is due after this many pairs: the first at FIRST_LOOK, then at every batch."""
        return pairs >= min(FIRST_LOOK, self.max_pairs)

    def alpha_at(self, pairs: int, fraction: float = 0.0) -> float:
        """The alpha of a look after ``pairs`` pairs (the increment of the spent alpha) at the
        information fraction max(pairs / max_pairs, ``fraction``); spends it."""
        total = self.alpha * spend(max(pairs / self.max_pairs, fraction))
        step = max(total - self.spent, 0.0)
        self.spent = max(total, self.spent)
        return step

    def record(self, pairs: int, alpha: float, verdicts: dict[str, str], ratio: float | None, seconds: float) -> None:
        self.history.append(
            {"pairs": pairs, "alpha": alpha, "verdicts": verdicts, "ratio": ratio, "seconds": round(seconds, 1)}
        )


def decided(verdicts: dict[str, str], counters_regressed: bool) -> bool:
    """Stop looking: a counter regressed (exact, no more pairs change it), or every timing metric has a verdict."""
    from gembench.harness.regression.stats import INCONCLUSIVE

    return counters_regressed or (bool(verdicts) and INCONCLUSIVE not in verdicts.values())


def worth_another_batch(elapsed: float, per_batch: float, budget: float | None) -> bool:
    """Whether a batch of the measured duration still fits in the budget (None: no budget)."""
    return budget is None or elapsed + per_batch <= budget


class Look(NamedTuple):
    """What one look found: each timing metric's verdict, whether a counter regressed, HEAD/BASE."""

    verdicts: dict[str, str]
    counters_regressed: bool = False
    ratio: float | None = None


def look_of(judgements) -> Look:
    """A look from paired.judge_rounds' judgements: the paired ones are the timing metrics."""
    from gembench.harness.regression.stats import REGRESSED

    timing = [j for j in judgements if j.method == "paired"]
    return Look(
        {j.metric: j.verdict for j in timing},
        any(j.verdict == REGRESSED for j in judgements if j.method != "paired"),
        next((j.extra.get("ratio") for j in timing), None),
    )


@dataclass
class SequentialDesign:
    """The looks of one comparison with up to ``max_pairs`` pairs and a time budget (None: none)."""

    alpha: float
    max_pairs: int
    budget: float | None = None
    looks: Looks = field(init=False)

    def __post_init__(self) -> None:
        self.looks = Looks(self.alpha, self.max_pairs)

    def after_batch(
        self, pairs: int, elapsed: float, per_batch: float, judge: Callable[[float], Look], say=None
    ) -> bool:
        """Whether to stop after a batch that brought the pairs to ``pairs``, ``elapsed`` s in, the
        batch ``per_batch`` s: where a look is due, ``judge(alpha)`` judges the pairs at its alpha."""
        say = say or (lambda msg: None)
        if not self.looks.due(pairs):
            return False
        last = not worth_another_batch(elapsed, per_batch, self.budget)
        used = 1.0 if last else (elapsed / self.budget if self.budget else 0.0)
        alpha = self.looks.alpha_at(pairs, used)
        look = judge(alpha)
        self.looks.record(pairs, alpha, look.verdicts, look.ratio, elapsed)
        say(
            f"look at {pairs} pairs (alpha {alpha:.2g} of {self.alpha:g}): "
            + ", ".join(f"{m} {v}" for m, v in look.verdicts.items())
            + (f", HEAD/BASE {look.ratio:.4f}" if look.ratio else "")
        )
        if decided(look.verdicts, look.counters_regressed):
            return True
        if last:
            say(f"the next batch would overrun --budget {self.budget:g} s: the verdict is this look's")
            return True
        return False

    @property
    def last(self) -> dict | None:
        """The last look's record (its pairs, alpha, verdicts, ratio, seconds), None before any."""
        return self.looks.history[-1] if self.looks.history else None

    def document(self) -> dict:
        """What a result says of the design."""
        return {
            "kind": "sequential",
            "max_pairs": self.max_pairs,
            "budget_s": self.budget,
            "alpha_total": self.alpha,
            "spending": "pocock",
            "looks": self.looks.history,
        }
