"""Find the commit between GOOD and BAD that made training slower: `git bisect run`, with a paired
comparison of GOOD and each candidate as the predicate.

First BAD is measured against GOOD as `gembench continuous` measures two revisions (pairs of
processes taking turns, the same flags). Not slower: it says so and stops. Slower: the bisect runs
in a temporary worktree; each candidate is paired with GOOD and called bad when its (1 - 2 alpha)
interval of CANDIDATE/GOOD lies wholly above the midpoint between GOOD and BAD (sqrt(BAD/GOOD)),
good when wholly below, skipped when it does not run (its --setup fails, its model does not
import), and undecided when neither holds after --max-pairs: then the bisect stops and says so.
Each look adds one batch of pairs. Each step's verdict and ratio is printed, then the culprit's sha
and subject line. The repository is left as found: bisect reset, no worktree left, also on Ctrl-C.
With --model, --repo is your model's repository (as for continuous). It bisects step_time_s:
alpha, --min-effect and --margin come from the flags (--thresholds is not read), counters are not
bisected, --format is table or json. Reasons: docs/continuous.md.

exit status:
  0  the culprit found (printed), or BAD is not slower than GOOD (said: nothing to bisect)
  2  an error: unknown revision, GOOD not an ancestor of BAD, GOOD or BAD fails to run, bad flag
  4  undecided: BAD against GOOD too noisy to tell, a candidate undecided within --max-pairs, or
     skipped commits leave several candidates (named)
  130  interrupted (the repository left as found)

examples:
  gembench bisect v1.2 HEAD                                   # gembench's own commits, tiny
  gembench bisect GOOD BAD --repo ../team-model --model model.py:factory --setup 'make build'
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from gembench.errors import UsageError
from gembench.harness.continuous.config import MARGIN, MIN_EFFECT, BisectConfig

DEFAULT_PAIRS = 4  # the first look: a slowdown that is worth bisecting is usually plain by then
DEFAULT_MAX_PAIRS = 12


def configure(p: argparse.ArgumentParser) -> None:
    from gembench.harness.commands.continuous import add_measuring_flags

    p.add_argument("good", metavar="GOOD", help="a revision that is not slower (the reference)")
    p.add_argument("bad", metavar="BAD", help="a later revision that is slower")
    p.add_argument(
        "--pairs",
        type=int,
        default=DEFAULT_PAIRS,
        help=f"process pairs of each comparison's first look (default {DEFAULT_PAIRS}); one batch "
        "(--parallel) more per look while its verdict is not clear",
    )
    p.add_argument(
        "--max-pairs",
        type=int,
        default=DEFAULT_MAX_PAIRS,
        metavar="N",
        help=f"budget of one comparison: undecided after N pairs is said, not guessed (default {DEFAULT_MAX_PAIRS})",
    )
    add_measuring_flags(p)


def bisect_config(args: argparse.Namespace) -> BisectConfig:
    """The flags, checked: the measuring flags as continuous takes them, the decision's defaults set."""
    from gembench.harness.commands.continuous import measuring_config
    from gembench.harness.regression import stats

    if args.benchmark != "run":
        raise UsageError(
            "--benchmark instructions: bisect times steps; bisect exact counts with `git bisect run` itself"
        )
    if args.format == "markdown":
        raise UsageError("--format markdown: bisect prints a table (the default) or json")
    if args.metric not in (None, ["step_time_s"]):
        raise UsageError("--metric: bisect times step_time_s (the others are its reciprocals at equal FLOPs)")
    measuring = measuring_config(args, args.pairs)
    if args.max_pairs < args.pairs:
        raise UsageError(f"--max-pairs ({args.max_pairs}) must be at least --pairs ({args.pairs})")
    min_effect = MIN_EFFECT if args.min_effect is None else args.min_effect
    measuring = dataclasses.replace(
        measuring,
        alpha=stats.ALPHA if args.alpha is None else args.alpha,
        min_effect=min_effect,
        margin=max(MARGIN, min_effect) if args.margin is None else args.margin,
    )
    return BisectConfig(args.good, args.bad, args.max_pairs, measuring)


def main(args: argparse.Namespace) -> int:
    from gembench.harness.continuous.bisect import bisect

    config = bisect_config(args)
    quiet = config.measuring.quiet
    say = (lambda msg: None) if quiet else (lambda msg: print(f"bisect: {msg}", file=sys.stderr, flush=True))
    return bisect(config, say)
