"""A group-sequential design for `gembench continuous`: look after each batch of pairs, stop once clear.

A fixed number of pairs is either too many (a plain 5% slowdown is clear after four) or too few (on a
noisy host a 2% one needs twenty). So the pairs are judged at looks: after the first ``FIRST_LOOK``
pairs, then after every batch. Repeated looks would inflate the false-alarm rate if each used the
full alpha, so alpha is spent across them (Lan and DeMets' alpha-spending: a look at information
fraction t = pairs / max_pairs may have spent ``alpha * spend(t)`` in all) with the Pocock-type
function spend(t) = ln(1 + (e - 1) t), which spends early and so stops early on a plain change.
Each look tests at the increment of the spent alpha; by the union bound over the looks the chance
of any false alarm stays at most alpha, and so does the chance that "unchanged" (the look's
(1 - 2 alpha_k) interval inside the margin) is said of a change beyond the margin. The bound is
conservative: the looks' statistics are correlated, so the true rates are lower.

The run stops at the first look where every timing metric is decided (regressed, improved or
unchanged) or a counter regressed; at ``max_pairs`` or when the time budget would be overrun
before the next look it stops and says what it has: inconclusive if still undecided.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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

    def alpha_at(self, pairs: int) -> float:
        """The alpha of a look after ``pairs`` pairs (the increment of the spent alpha); spends it."""
        total = self.alpha * spend(pairs / self.max_pairs)
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
