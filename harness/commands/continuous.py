"""Compare two commits by running them side by side: pairs of processes taking turns.

BASE and HEAD are checked out into temporary git worktrees. A pair is one `gembench run` process
per revision, started together, pinned to one CPU and, once warm, taking turns of a few steps
(ABBA, `gembench run --pace`), so that the machine's drift hits both alike; pairs run side by
side, one per CPU (--parallel). Each process gives one value per timing metric (--statistic), each
pair the ratio HEAD/BASE, and a paired one-sided t-test over the pairs decides: regressed needs
p <= alpha and a slowdown >= --min-effect; unchanged needs the (1 - 2 alpha) interval inside
+-margin; else inconclusive. The pairs are as many as the verdict needs: it is judged after each
batch from the fourth pair on, --alpha spent over the looks (regression/sequential.py), until it
is clear, --max-pairs or --budget; `--pairs N` is a fixed design judged once. Cost counters are
compared exactly (results/thresholds.toml; default: no increase), and the aten ops that changed
are named. Both train the same seed on the same batches: their per-step losses must agree within
the dtype's tolerance (regression/numerics.py), or the numerics changed. --sequential runs a pair's
processes one after the other: for --nproc, --benchmark instructions and revisions older than
--pace. The measurements behind the defaults are in docs/continuous.md.

exit status (0, 1, 2, 4 as `gembench gate`):
  0  no regression (every metric unchanged or improved)
  1  a metric regressed (a counter beyond its threshold, or a significant slowdown)
  5  numerics changed: BASE's and HEAD's per-step losses differ beyond the dtype's tolerance, or
     one revision's own processes disagree (--numerics report keeps 0 or 4)
  4  too noisy to tell within --budget (or --pairs): on a busy runner, treat it as a warning
  2  an error: unknown revision, a revision that fails to run (named, with its error), bad flag

examples:
  gembench continuous origin/main HEAD --format markdown >> $GITHUB_STEP_SUMMARY
  gembench continuous HEAD~1 HEAD --benchmark instructions --kernel wukong_fm   # callgrind counts
  gembench continuous --python .venv/bin/python --python /tmp/venv-new/bin/python   # an upgrade, same code
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from gembench.errors import UsageError

# The sequential design's cap and budget, from its simulated rates (benchmarks/harness_quality.py
# --sequential; docs/continuous.md): enough for a noisy host's 2% pair spread at a minute a batch.
MAX_PAIRS = 48
DEFAULT_BUDGET = 1200.0  # s
DEFAULT_STEPS = 480
TURN_STEPS = 5  # steps per turn unless --bursts says otherwise: the noise is faster than a turn
MIN_EFFECT = 0.01  # a 2% slowdown must be caught: the regression threshold sits below it
MARGIN = 0.02  # "unchanged" needs the interval inside +-2%: precise enough for 1%, not for 0.2%


def configure(p: argparse.ArgumentParser) -> None:
    from gembench.harness.regression.numerics import TOLERANCE

    p.add_argument(
        "base",
        metavar="BASE",
        nargs="?",
        help="reference revision (a commit, branch, tag, HEAD~1; with --python, default HEAD)",
    )
    p.add_argument("head", metavar="HEAD", nargs="?", help="revision under test (with --python, default BASE)")
    p.add_argument(
        "--python",
        action="append",
        default=None,
        metavar="PY",
        help="twice: BASE's interpreter, then HEAD's (virtualenvs, for a dependency upgrade; the revisions may "
        "be the same commit); the result names both environments' versions and what differs. "
        "scripts/env_variant.sh makes a variant of .venv that differs in one package",
    )
    p.add_argument(
        "--pairs",
        "--rounds",
        dest="pairs",
        type=int,
        default=None,
        help="a fixed number of process pairs, one process per revision each, alive together and "
        "taking turns, judged once (--rounds is its old name). Default: as many as the verdict needs, "
        "judged after each batch (see --max-pairs, --budget)",
    )
    p.add_argument(
        "--max-pairs",
        type=int,
        default=MAX_PAIRS,
        metavar="N",
        help=f"the sequential design's most pairs (default {MAX_PAIRS}); alpha is spent over the looks",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=DEFAULT_BUDGET,
        metavar="S",
        help=f"seconds the pairs may take before the verdict is what it is then (default {DEFAULT_BUDGET:g}; "
        "a batch that would overrun it is not started)",
    )
    p.add_argument(
        "--numerics",
        choices=("fail", "report"),
        default="fail",
        help="fail: losses that differ make the exit status 3 unless it is 1 (default); "
        "report: say so, and exit as the times and counters say",
    )
    p.add_argument(
        "--loss-tolerance",
        type=float,
        default=None,
        metavar="REL",
        help="largest relative difference of a step's loss that counts as the same numerics (default per "
        f"dtype: {', '.join(f'{d} {t:g}' for d, t in TOLERANCE.items())})",
    )
    add_measuring_flags(p)


def add_measuring_flags(p: argparse.ArgumentParser) -> None:
    """What to run and how to measure it: continuous's flags, which `gembench bisect` shares."""
    from gembench.harness.regression.paired import STATISTICS

    p.add_argument(
        "--benchmark",
        choices=("run", "instructions"),
        default="run",
        help="run: `gembench run` timings and counters (default); instructions: each revision's "
        "benchmarks/instructions.py callgrind counts, exact, so --pairs 1 suffices",
    )
    p.add_argument(
        "--kernel",
        action="append",
        default=None,
        help="with --benchmark instructions: kernel to count (repeatable; default all)",
    )
    p.add_argument(
        "--bursts",
        type=int,
        default=None,
        metavar="N",
        help=f"turns each process of a pair takes: the pair's two processes take turns, --steps/N steps "
        f"at a time, ABBA (default: turns of {TURN_STEPS} steps; at most --steps)",
    )
    p.add_argument(
        "--sequential",
        action="store_true",
        help="run each pair's two processes one after the other instead of taking turns (the only "
        "way for --nproc and --benchmark instructions, and for a revision older than --pace; "
        "pass it on a GPU that cannot hold two copies of the config)",
    )
    p.add_argument(
        "--parallel",
        type=int,
        default=None,
        metavar="N",
        help="pairs run at once, each pinned to a CPU of its own (default: one per CPU this process may "
        "use on a CPU device, 1 on a GPU, which two pairs would share)",
    )
    from gembench.harness.commands.run import add_model_flags

    add_model_flags(
        p,
        "config name or .toml path (default: tiny). With --model SPEC instead, --repo is your model's "
        "repository: SPEC is imported from each revision's worktree, gembench is this one",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        help=f"timed steps per process (default {DEFAULT_STEPS}: a pair's spread shrinks with its steps, "
        "and they cost far less than another pair's start-up)",
    )
    p.add_argument("--warmup", type=int, default=3, help="discarded warm-up steps per process (default 3)")
    p.add_argument(
        "--stack", choices=("optimized", "baseline"), default="optimized", help="training stack (default optimized)"
    )
    p.add_argument(
        "--nproc", type=int, default=None, metavar="N", help="torchrun ranks per process (default: one process)"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        metavar="N",
        help="torch intra-op threads of every process (OMP_NUM_THREADS; default 1). "
        "On a machine shared with other jobs, 1 thread makes steps far steadier: a parallel op "
        "waits for its slowest thread, and a descheduled one costs a whole scheduler tick",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of weights and data, the same for both (default 0)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda[:N] (default auto)")
    p.add_argument(
        "--metric",
        action="append",
        default=None,
        help="timing metric to test (repeatable; default step_time_s, per process its --statistic step; mfu and "
        "examples_per_s are its reciprocals at equal FLOPs, so testing them too only costs power)",
    )
    p.add_argument(
        "--statistic",
        choices=STATISTICS,
        default="fast-half",
        help="one value per process from its steps: fast-half, the mean of its faster half (default: "
        "the disturbed tail left out, the steadiest measured); p10, the 10th-best step; min, the "
        "best; or median",
    )
    p.add_argument("--format", choices=("table", "markdown", "json"), default="table", help="output (default table)")
    p.add_argument(
        "--json-out",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write the JSON result to FILE, whatever --format prints (CI: the Markdown table to the job "
        "summary, the JSON kept as an artifact)",
    )
    p.add_argument(
        "--thresholds",
        default="results/thresholds.toml",
        help="thresholds TOML: alpha and counter allowances (default %(default)s; "
        "built-in defaults where it does not exist)",
    )
    p.add_argument("--alpha", type=float, default=None, help="false-alarm rate (default from thresholds, else 0.01)")
    p.add_argument(
        "--min-effect",
        type=float,
        default=None,
        help=f"smallest slowdown that counts as a regression (default {MIN_EFFECT:g}; not the thresholds "
        "file's min_effect, which is for `gembench gate` against a baseline from another session)",
    )
    p.add_argument(
        "--margin",
        type=float,
        default=None,
        help=f"unchanged needs the (1 - 2 alpha) interval of HEAD/BASE, 98%% at the default alpha, inside "
        f"+-margin (default {MARGIN:g}; at least --min-effect)",
    )
    p.add_argument("--repo", default=".", help="git repository holding both revisions (default: the current one)")
    p.add_argument(
        "--setup",
        default=None,
        metavar="CMD",
        help="shell command run in each revision's worktree before its processes start (a build step); "
        "what it installs into $GEMBENCH_OVERLAY comes first on that revision's path, e.g. "
        "'python -m pip install -q --no-deps --no-build-isolation --target \"$GEMBENCH_OVERLAY\" .'",
    )
    p.add_argument(
        "--keep-results",
        type=Path,
        default=None,
        metavar="DIR",
        help="copy every process's result JSON into DIR (named pairNN-revision)",
    )
    p.add_argument(
        "--timeout", type=float, default=1800, metavar="S", help="longest one process may run (default 1800 s)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def check_continuous_args(args: argparse.Namespace) -> None:
    """continuous's own flags (the revisions, --python, the design), then the measuring flags."""
    from gembench.harness.continuous.environments import probe_both

    if args.base is None and not args.python:
        raise UsageError("give BASE and HEAD revisions (or two --python to run one revision under two environments)")
    args.base = args.base or "HEAD"
    args.head = args.head or args.base
    args.looking = args.pairs is None and args.benchmark == "run"  # the sequential design
    if args.pairs is None:
        args.pairs = 1 if args.benchmark == "instructions" else args.max_pairs  # exact counts: one decides
    if args.looking and (args.max_pairs < 2 or args.budget <= 0):
        raise UsageError(f"--max-pairs must be >= 2 and --budget > 0, got {args.max_pairs} and {args.budget:g}")
    if args.loss_tolerance is not None and not 0 <= args.loss_tolerance < 1:
        raise UsageError(f"--loss-tolerance is a relative difference (1e-3 = 0.1%), got {args.loss_tolerance}")
    check_args(args)
    args.environments = probe_both(args.python)  # before any worktree: a bad --python costs nothing


def check_args(args: argparse.Namespace) -> None:
    """The measuring flags, which `gembench bisect` shares."""
    from gembench.harness.commands.compare import check_decision_args
    from gembench.harness.regression.directions import METRICS

    if args.pairs < (1 if args.benchmark == "instructions" else 2):
        raise UsageError(f"--pairs must be at least 2 for an interval, got {args.pairs}")
    if args.benchmark == "instructions":
        from gembench.harness.device.tools import valgrind_version

        if valgrind_version() is None:
            raise UsageError(
                "--benchmark instructions needs valgrind (apt-get install -y valgrind, or scripts/setup.sh as root)"
            )
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads must be >= 1, got {args.threads}")
    if args.steps < 1 or args.warmup < 0:
        raise UsageError(f"--steps must be >= 1 and --warmup >= 0, got {args.steps} and {args.warmup}")
    check_decision_args(args.alpha, args.min_effect)
    if args.margin is not None and not 0 < args.margin < 1:
        raise UsageError(f"--margin is a fraction (0.02 = 2%), got {args.margin}")
    if args.margin is not None and args.margin < (args.min_effect if args.min_effect is not None else MIN_EFFECT):
        raise UsageError(
            f"--margin ({args.margin:g}) must be at least --min-effect: a change that counts as a "
            "regression cannot also be within the margin of 'unchanged'"
        )
    for m in args.metric or []:
        if m not in METRICS or METRICS[m].counter:
            timing = [n for n, i in METRICS.items() if not i.counter]
            raise UsageError(
                f"--metric {m!r} is not a timing metric; known: {', '.join(timing)} (counters are always compared)"
            )
    if args.bursts is None:
        args.bursts = -(-args.steps // TURN_STEPS)
    if args.bursts < 1 or args.bursts > args.steps:
        raise UsageError(f"--bursts must be between 1 and --steps ({args.steps}), got {args.bursts}")
    args.burst_steps = -(-args.steps // args.bursts)  # the worker's turn; the last one may be shorter
    args.bursts = -(-args.steps // args.burst_steps)  # turns the worker will take, so both sides agree
    if args.benchmark == "instructions" or args.nproc is not None:
        args.sequential = True  # nothing to interleave: exact counts; torchrun ranks are not paced
    if args.parallel is not None and args.parallel < 1:
        raise UsageError(f"--parallel must be >= 1, got {args.parallel}")
    if args.sequential:
        args.parallel = 1  # one fresh process after another: nothing to run beside it
    elif args.parallel is None:
        from gembench.harness.continuous.pairs import default_parallel

        args.parallel = default_parallel(args.device)
    args.parallel = min(args.parallel, args.pairs)
    if args.json_out is not None and not args.json_out.parent.is_dir():
        raise UsageError(f"--json-out {args.json_out}: no folder {args.json_out.parent}; make it first")
    if args.keep_results is not None:
        args.keep_results.mkdir(parents=True, exist_ok=True)


def _plan(args: argparse.Namespace, first: dict) -> dict:
    """How the pairs are judged, from the thresholds for the first result's config and hardware:
    alpha, the metrics, and judge_rounds' arguments after alpha."""
    from gembench.harness.regression import stats, thresholds
    from gembench.harness.store.results import field

    limits = None
    if Path(args.thresholds).exists():
        limits = thresholds.load(
            args.thresholds, str(field(first, "config.name")), str(field(first, "env.hardware_class"))
        )
    elif args.thresholds != "results/thresholds.toml":
        raise UsageError(f"no thresholds file {args.thresholds}")
    alpha = args.alpha if args.alpha is not None else ((limits and limits.alpha) or stats.ALPHA)
    min_effect = MIN_EFFECT if args.min_effect is None else args.min_effect
    margin = max(MARGIN, min_effect) if args.margin is None else args.margin
    return {
        "alpha": alpha,
        "metrics": args.metric or ["step_time_s"],
        "judging": (min_effect, limits, args.statistic, margin),
    }


def _design(args: argparse.Namespace, looks) -> dict:
    if looks is None:
        return {"kind": "fixed", "pairs": args.pairs}
    return {
        "kind": "sequential",
        "max_pairs": args.pairs,
        "budget_s": args.budget,
        "alpha_total": looks.alpha,
        "spending": "pocock",
        "looks": looks.history,
    }


def main(args: argparse.Namespace) -> int:
    from gembench.harness.continuous import environments, worktrees
    from gembench.harness.continuous.pairs import run_pairs
    from gembench.harness.regression import numerics, opdiff, paired, stats
    from gembench.harness.regression.sequential import Looks, decided, worth_another_batch
    from gembench.harness.report.verdicts import render_changes, render_paired
    from gembench.harness.store.results import differences, field

    check_continuous_args(args)
    if args.model is None:
        args.config = args.config or "tiny"
    elif args.model_args is None:
        args.model_args = []
    repo = worktrees.repo_root(args.repo, "--repo" if args.repo != "." else None)
    started = time.perf_counter()
    say = (lambda msg: None) if args.quiet else (lambda msg: print(f"continuous: {msg}", file=sys.stderr, flush=True))
    with worktrees.temporary_checkouts(repo, {"BASE": args.base, "HEAD": args.head}) as co:
        interleaved = not args.sequential
        what = (
            "benchmarks/instructions.py"
            if args.benchmark == "instructions"
            else f"gembench run {'--model ' + args.model if args.model else '--config ' + args.config} "
            f"--steps {args.steps} --stack {args.stack}"
        )
        how = (
            f"both processes started at once, then taking turns of {args.burst_steps} step(s), {args.bursts} each"
            + (f"; {args.parallel} pairs at once, each on a CPU of its own" if args.parallel > 1 else "")
            if interleaved
            else "one process each, one after the other"
        )
        say(
            f"BASE {args.base} = {co['BASE'].sha[:10]}, HEAD {args.head} = {co['HEAD'].sha[:10]}: {args.pairs} pairs "
            f"of processes (ABBA) running `{what}`, {how}"
        )
        if args.setup:
            from gembench.harness.continuous.setup import run_setup

            for c in co.values():
                run_setup(args.setup, c, args.timeout, say)
        looks, plan = None, None

        def enough(rounds, elapsed, per_batch):  # the sequential design's look after a batch
            nonlocal looks, plan
            plan = plan or _plan(args, rounds[0][0])  # the thresholds file is read once
            looks = looks or Looks(plan["alpha"], args.pairs)
            if not looks.due(len(rounds)):
                return False
            alpha = looks.alpha_at(len(rounds))
            found = paired.judge_rounds(rounds, plan["metrics"], alpha, *plan["judging"])
            timing = {j.metric: j.verdict for j in found if j.method == "paired"}
            ratio = next((j.extra.get("ratio") for j in found if j.method == "paired"), None)
            looks.record(len(rounds), alpha, timing, ratio, elapsed)
            say(
                f"look at {len(rounds)} pairs (alpha {alpha:.2g} of {plan['alpha']:g}): "
                + ", ".join(f"{m} {v}" for m, v in timing.items())
                + (f", HEAD/BASE {ratio:.4f}" if ratio else "")
            )
            stop = decided(timing, any(j.verdict == stats.REGRESSED for j in found if j.method != "paired"))
            if not stop and not worth_another_batch(elapsed, per_batch, args.budget):
                say(f"the next batch would overrun --budget {args.budget:g} s: the verdict is this look's")
                stop = True
            return stop

        rounds, interleaved = run_pairs(args, co, say, enough if args.looking else None)
    environments.check_results(args.environments, rounds)

    first = rounds[0][0]
    config, hw = field(first, "config.name"), field(first, "env.hardware_class")
    plan = plan or _plan(args, first)
    alpha, (min_effect, _, _, margin) = plan["alpha"], plan["judging"]
    metrics = plan["metrics"]
    if looks is not None and looks.history:  # the verdict is the last look's, at its alpha
        alpha = looks.history[-1]["alpha"]
    judgements = paired.judge_rounds(rounds, metrics, alpha, *plan["judging"])
    losses, ops = numerics.judge(rounds, args.loss_tolerance), opdiff.section(rounds)
    code = numerics.exit_status(paired.exit_status(judgements), losses, args.numerics == "fail")
    minutes = (time.perf_counter() - started) / 60
    notes = differences(rounds[0][0], rounds[0][1], ("config.hash", "run.global_batch", "run.dtype"))
    verdict = {
        0: "continuous: pass",
        1: "continuous: REGRESSION",
        numerics.NUMERICS_EXIT: "continuous: NUMERICS CHANGED",
        4: "continuous: INCONCLUSIVE (too noisy: a larger --budget or --max-pairs, or a quieter machine)"
        if args.looking
        else "continuous: INCONCLUSIVE (too noisy: more --pairs)",
    }[code]
    document = {
        "schema": "gembench.continuous/1",
        "base": {"revision": args.base, "sha": co["BASE"].sha},
        "head": {"revision": args.head, "sha": co["HEAD"].sha},
        "config": config,
        "hardware_class": hw,
        "stack": args.stack,
        "steps": args.steps,
        "warmup": args.warmup,
        "seed": args.seed,
        "pairs": len(rounds),
        "rounds": len(rounds),
        "design": _design(args, looks),
        "order": "ABBA",
        "statistic": args.statistic,
        "interleaved": bool(interleaved),
        "bursts": args.bursts if interleaved else None,
        "parallel": args.parallel if interleaved else 1,
        "threads": args.threads,
        "alpha": alpha,
        "min_effect": min_effect,
        "margin": margin,
        "notes": notes,
        "minutes": minutes,
        "rows": paired.rows(judgements),
        "numerics": losses,
        "op_changes": ops,
        "exit_status": code,
    } | (environments.document(args.environments) if args.environments else {})
    if args.json_out is not None:  # CI: the table for the job summary, the JSON kept as an artifact
        args.json_out.write_text(json.dumps(document, indent=1) + "\n")
    if args.format == "json":
        print(json.dumps(document, indent=1))
        return code
    header = [
        f"BASE {args.base} = {co['BASE'].sha[:10]}   HEAD {args.head} = {co['HEAD'].sha[:10]}",
        f"{config} on {hw}, stack {args.stack}, seed {args.seed}: {len(rounds)} process pairs ABBA "
        f"x {args.steps} steps "
        f"(+{args.warmup} warm-up) per process, "
        f"{f'taking turns, {args.bursts} turns each' if interleaved else 'one process after the other'}"
        f"{f', {args.parallel} pairs at once on CPUs of their own' if interleaved and args.parallel > 1 else ''}, "
        f"{args.threads} thread(s); one value per process = its {args.statistic} step; {minutes:.1f} min",
        f"paired one-sided t-tests on log(HEAD/BASE) per pair at alpha={alpha:g} (Holm across "
        f"{sum(j.method == 'paired' for j in judgements)}), regression >= {100 * min_effect:g}%, unchanged within "
        f"+-{100 * margin:g}%; counters exact",
    ]
    if looks is not None and looks.history:
        header.append(
            f"sequential: {len(looks.history)} look(s) at "
            + ", ".join(str(h["pairs"]) for h in looks.history)
            + f" pairs (at most {args.pairs}, --budget {args.budget:g} s), alpha {plan['alpha']:g} spent over them "
            f"(Pocock-type); the verdict is the last look's, at alpha {alpha:.2g}"
        )
    header += [f"note: BASE and HEAD differ in {d}" for d in notes]
    if args.benchmark == "instructions":
        header[1] = (
            f"kernel instruction counts (benchmarks/instructions.py, callgrind) on {hw}: "
            f"{args.pairs} pair(s), {minutes:.1f} min"
        )
    if args.environments:
        header[1:1] = environments.header_lines(args.environments)
    print(render_paired(judgements, header, args.format))
    print(render_changes(losses, ops, args.format))
    print(verdict)
    return code
