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
import dataclasses
import json
import sys
import time
from pathlib import Path

from gembench.errors import UsageError
from gembench.harness.continuous.config import (
    DEFAULT_BUDGET,
    DEFAULT_STEPS,
    MARGIN,
    MAX_PAIRS,
    MIN_EFFECT,
    TURN_STEPS,
    ContinuousConfig,
    Measuring,
)


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
        help="fail: losses that differ make the exit status 5 unless it is 1 (default); "
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
        default=None,
        help=f"timed steps per process (default {DEFAULT_STEPS}, halved once the pairs measured say that pairs "
        "half as long narrow the interval faster for the time: where a process carries its noise for its "
        "life, fewer steps only save time; given, the steps stay as given)",
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
        "examples_per_s are its reciprocals at equal FLOPs, so testing them too only costs power; startup_s, "
        "the time to the first timed step, one value per process, each revision compiling into its own cache)",
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


def continuous_config(args: argparse.Namespace) -> ContinuousConfig:
    """continuous's own flags (the revisions, --python, the design), then the measuring flags: checked."""
    from gembench.harness.continuous.environments import probe_both

    if args.base is None and not args.python:
        raise UsageError("give BASE and HEAD revisions (or two --python to run one revision under two environments)")
    base = args.base or "HEAD"
    looking = args.pairs is None and args.benchmark == "run"  # the sequential design
    pairs = args.pairs
    if pairs is None:
        pairs = 1 if args.benchmark == "instructions" else args.max_pairs  # exact counts: one decides
    if looking and (args.max_pairs < 2 or args.budget <= 0):
        raise UsageError(f"--max-pairs must be >= 2 and --budget > 0, got {args.max_pairs} and {args.budget:g}")
    if args.loss_tolerance is not None and not 0 <= args.loss_tolerance < 1:
        raise UsageError(f"--loss-tolerance is a relative difference (1e-3 = 0.1%), got {args.loss_tolerance}")
    measuring = measuring_config(args, pairs)
    environments = probe_both(args.python)  # before any worktree: a bad --python costs nothing
    if environments:
        pythons = (environments["BASE"].python, environments["HEAD"].python)
        measuring = dataclasses.replace(measuring, pythons=pythons)
    return ContinuousConfig(
        base, args.head or base, measuring, looking, args.budget, args.numerics, args.loss_tolerance, environments
    )


def measuring_config(args: argparse.Namespace, pairs: int) -> Measuring:
    """The measuring flags, which `gembench bisect` shares, checked for runs of ``pairs`` pairs,
    with the defaults that follow from other flags resolved."""
    from gembench.harness.commands.compare import check_decision_args
    from gembench.harness.regression.directions import METRICS

    if pairs < (1 if args.benchmark == "instructions" else 2):
        raise UsageError(f"--pairs must be at least 2 for an interval, got {pairs}")
    if args.benchmark == "instructions":
        from gembench.harness.device.tools import valgrind_version

        if valgrind_version() is None:
            raise UsageError(
                "--benchmark instructions needs valgrind (apt-get install -y valgrind, or scripts/setup.sh as root)"
            )
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads must be >= 1, got {args.threads}")
    halve_steps = args.steps is None and args.bursts is None
    args.steps = DEFAULT_STEPS if args.steps is None else args.steps
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
    bursts = -(-args.steps // TURN_STEPS) if args.bursts is None else args.bursts
    if bursts < 1 or bursts > args.steps:
        raise UsageError(f"--bursts must be between 1 and --steps ({args.steps}), got {bursts}")
    burst_steps = -(-args.steps // bursts)  # the worker's turn; the last one may be shorter
    bursts = -(-args.steps // burst_steps)  # turns the worker will take, so both sides agree
    # nothing to interleave: exact counts; torchrun ranks are not paced
    sequential = args.sequential or args.benchmark == "instructions" or args.nproc is not None
    if args.parallel is not None and args.parallel < 1:
        raise UsageError(f"--parallel must be >= 1, got {args.parallel}")
    parallel = args.parallel
    if sequential:
        parallel = 1  # one fresh process after another: nothing to run beside it
    elif parallel is None:
        from gembench.harness.continuous.pairs import default_parallel

        parallel = default_parallel(args.device)
    if args.json_out is not None and not args.json_out.parent.is_dir():
        raise UsageError(f"--json-out {args.json_out}: no folder {args.json_out.parent}; make it first")
    if args.keep_results is not None:
        args.keep_results.mkdir(parents=True, exist_ok=True)
    same = {f.name: getattr(args, f.name) for f in dataclasses.fields(Measuring) if hasattr(args, f.name)}
    return Measuring(
        **same
        | {
            "pairs": pairs,
            "parallel": min(parallel, pairs),
            "sequential": sequential,
            "halve_steps": halve_steps and not sequential,
            "bursts": bursts,
            "burst_steps": burst_steps,
            "kernels": tuple(args.kernel or ()),
            "config": (args.config or "tiny") if args.model is None else args.config,
            "model_args": tuple(args.model_args or ()),
            "metrics": tuple(args.metric or ["step_time_s"]),
        }
    )


def main(args: argparse.Namespace) -> int:
    from gembench.harness.continuous import environments, worktrees
    from gembench.harness.continuous.verdict import document, header_lines, measured_pairs, verdict_line
    from gembench.harness.regression import numerics, opdiff, paired
    from gembench.harness.report.verdicts import render_changes, render_paired
    from gembench.harness.store.results import differences

    cfg = continuous_config(args)
    m = cfg.measuring
    repo = worktrees.repo_root(m.repo, "--repo" if m.repo != "." else None)
    started = time.perf_counter()
    say = (lambda msg: None) if m.quiet else (lambda msg: print(f"continuous: {msg}", file=sys.stderr, flush=True))
    with worktrees.temporary_checkouts(repo, {"BASE": cfg.base, "HEAD": cfg.head}) as co:
        say(_starting(cfg, co))
        if m.setup:
            from gembench.harness.continuous.setup import run_setup

            for c in co.values():
                run_setup(m.setup, c, m.timeout, say)
        rounds, interleaved, design, plan = measured_pairs(cfg, co, say)
    environments.check_results(cfg.environments, rounds)

    # the verdict is the last look's, at its alpha
    alpha = design.last["alpha"] if design is not None and design.last else plan.alpha
    judgements = plan.judge(m, rounds, alpha)
    losses, ops = numerics.judge(rounds, cfg.loss_tolerance), opdiff.section(rounds)
    code = numerics.exit_status(paired.exit_status(judgements), losses, cfg.numerics == "fail")
    minutes = (time.perf_counter() - started) / 60
    notes = differences(rounds[0][0], rounds[0][1], ("config.hash", "run.global_batch", "run.dtype"))
    doc = document(cfg, co, rounds, interleaved, design, plan, alpha, judgements, losses, ops, code)
    doc.update(notes=notes, minutes=minutes)
    if m.json_out is not None:  # CI: the table for the job summary, the JSON kept as an artifact
        m.json_out.write_text(json.dumps(doc, indent=1) + "\n")
    if m.format == "json":
        print(json.dumps(doc, indent=1))
        return code
    print(render_paired(judgements, header_lines(cfg, doc, design, plan, judgements), m.format))
    print(render_changes(losses, ops, m.format))
    print(verdict_line(cfg, code))
    return code


def _starting(cfg: ContinuousConfig, co: dict) -> str:
    m = cfg.measuring
    what = (
        "benchmarks/instructions.py"
        if m.benchmark == "instructions"
        else f"gembench run {'--model ' + m.model if m.model else '--config ' + m.config} "
        f"--steps {m.steps} --stack {m.stack}"
    )
    how = (
        f"both processes started at once, then taking turns of {m.burst_steps} step(s), {m.bursts} each"
        + (f"; {m.parallel} pairs at once, each on a CPU of its own" if m.parallel > 1 else "")
        if not m.sequential
        else "one process each, one after the other"
    )
    return (
        f"BASE {cfg.base} = {co['BASE'].sha[:10]}, HEAD {cfg.head} = {co['HEAD'].sha[:10]}: {m.pairs} pairs "
        f"of processes (ABBA) running `{what}`, {how}"
    )
