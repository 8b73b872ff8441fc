"""Gate a run for CI: thresholds first, then regressions against the committed baseline.

RESULT is one or more replicate result files of the commit under test (or quoted globs). Limits
come from --thresholds for the run's config and hardware class; the baseline is
results/baselines/<hardware_class>/<config>.json unless --baseline names another. One line per
check: PASS, FAIL, SKIP, INCONCLUSIVE or NOT-COMPARABLE. Cost counters in both the run and the
baseline are checked exactly (default: no increase). Thresholds: docs/continuous.md.

exit status (worst check wins, in this order):
  1  a threshold missed, a metric regressed against the baseline, or a run diverged (NaN/inf loss)
  3  the baseline is not comparable (other hardware class, torch/torchrec/fbgemm, config hash,
     stack, dtype, ranks or batch): promote a new baseline or pass a matching --baseline
  4  inconclusive: too noisy to decide; rerun with more replicates
  0  every check passed (a missing baseline is a SKIP unless --require-baseline)
  2  an error: missing or malformed file, bad threshold field (named in the message)

examples:
  gembench gate results/runs/r.json
  gembench gate 'results/runs/pr-*.json' --thresholds results/thresholds.toml --require-baseline
  gembench run --config tiny --steps 30 --out r.json && gembench gate r.json; echo "gate: $?"
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gembench.errors import UsageError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "results", nargs="+", metavar="RESULT", help="result file(s) of the commit under test (replicates)"
    )
    parser.add_argument(
        "--baseline", default=None, help="baseline file (default results/baselines/<hardware_class>/<config>.json)"
    )
    parser.add_argument("--thresholds", default="results/thresholds.toml", help="thresholds TOML (default %(default)s)")
    parser.add_argument(
        "--require-baseline", action="store_true", help="a missing baseline is NOT-COMPARABLE (exit 3), not a SKIP"
    )
    parser.add_argument("--no-baseline", action="store_true", help="check thresholds only")
    parser.add_argument(
        "--alpha", type=float, default=None, help="false-alarm rate (default from thresholds, else 0.01)"
    )
    parser.add_argument(
        "--min-effect",
        type=float,
        default=None,
        help="smallest relative change that counts (default from thresholds, else 0.03)",
    )


def main(args: argparse.Namespace) -> int:
    from gembench.harness.commands.compare import check_decision_args, load_side
    from gembench.harness.regression import gate, stats, thresholds
    from gembench.harness.store.results import COMPARABLE_KEYS, RUN_KEYS, baseline_for, differences, field, load_runs

    check_decision_args(args.alpha, args.min_effect)
    runs = [r for text in args.results for r in load_side(text)]
    first = runs[0]
    config, hw = field(first, "config.name"), field(first, "env.hardware_class")
    if not config or not hw:
        raise UsageError(f"result {first.get('id')!r} lacks config.name or env.hardware_class")
    limits = thresholds.load(args.thresholds, config, hw)
    alpha = args.alpha if args.alpha is not None else (limits.alpha or stats.ALPHA)
    min_effect = (
        args.min_effect
        if args.min_effect is not None
        else (limits.min_effect if limits.min_effect is not None else stats.MIN_EFFECT)
    )

    checks: list[gate.Check] = []
    for other in runs[1:]:
        for d in differences(first, other, COMPARABLE_KEYS + RUN_KEYS):
            checks.append(
                gate.Check(
                    gate.NOT_COMPARABLE, "replicates", f"{other.get('id')} differs from {first.get('id')} in {d}"
                )
            )
    checks += gate.diverged_checks(runs)
    baseline, path = None, None
    if not args.no_baseline:
        path = Path(args.baseline) if args.baseline else baseline_for(first)
        if path.exists() or args.baseline:
            baseline = load_runs(path)
    checks += gate.threshold_checks(runs, limits, baseline)  # MFU held at the baseline's FLOPs
    if baseline is not None:
        checks += gate.baseline_checks(runs, baseline, str(path), alpha, min_effect, limits)
    elif path is not None:
        status = gate.NOT_COMPARABLE if args.require_baseline else gate.SKIP
        checks.append(gate.Check(status, "baseline", f"none at {path} (create one: gembench promote RESULT)"))

    print(
        f"gate {config} on {hw}: {len(runs)} run(s), thresholds {args.thresholds}, alpha={alpha:g}, "
        f"min effect {100 * min_effect:g}%"
    )
    for c in checks:
        print(c.line())
    code = gate.exit_code(checks)
    print({0: "gate: pass", 1: "gate: FAIL", 3: "gate: NOT COMPARABLE", 4: "gate: INCONCLUSIVE"}[code])
    return code
