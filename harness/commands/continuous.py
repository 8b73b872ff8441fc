"""Compare two commits by running them side by side: pairs of processes taking turns.

BASE and HEAD are checked out into temporary git worktrees. A pair is one `gembench run` process
per revision, started together, pinned to one CPU and, once warm, taking turns of a few steps
(ABBA, `gembench run --pace`), so that the machine's drift hits both alike; pairs run side by
side, one per CPU (--parallel). Each process gives one value per timing metric (--statistic), each
pair the ratio HEAD/BASE, and a paired one-sided t-test over the pairs decides: regressed needs
p <= --alpha and a slowdown >= --min-effect; unchanged needs the 98% interval inside +-margin; else
inconclusive. Cost counters are compared exactly (results/thresholds.toml; default: no increase).
--sequential runs a pair's processes one after the other: for --nproc, --benchmark instructions
and revisions older than --pace. The defaults catch a 2% slowdown on a shared 2-core machine; the
measurements behind them are in docs/continuous.md.

exit status (as `gembench gate`):
  0  no regression (every metric unchanged or improved)
  1  a metric regressed (a counter beyond its threshold, or a significant slowdown)
  4  too noisy to tell: rerun with more --pairs (on a busy runner, treat it as a warning)
  2  an error: unknown revision, a revision that fails to run (named, with its error), bad flag

examples:
  gembench continuous origin/main HEAD --format markdown >> $GITHUB_STEP_SUMMARY
  gembench continuous HEAD~1 HEAD --benchmark instructions --kernel wukong_fm   # callgrind counts
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from gembench.errors import UsageError

DEFAULT_PAIRS = 10
DEFAULT_STEPS = 480
TURN_STEPS = 5  # steps per turn unless --bursts says otherwise: the noise is faster than a turn
MIN_EFFECT = 0.01  # a 2% slowdown must be caught: the regression threshold sits below it
MARGIN = 0.02  # "unchanged" needs the interval inside +-2%: precise enough for 1%, not for 0.2%
LABELS = ("BASE", "HEAD")


def configure(p: argparse.ArgumentParser) -> None:
    from gembench.harness.regression.paired import STATISTICS

    p.add_argument("base", metavar="BASE", help="reference revision (a commit, branch, tag, HEAD~1)")
    p.add_argument("head", metavar="HEAD", help="revision under test")
    p.add_argument(
        "--pairs",
        "--rounds",
        dest="pairs",
        type=int,
        default=DEFAULT_PAIRS,
        help=f"process pairs, one process per revision each, alive together and taking turns; the "
        f"unit of the test (default {DEFAULT_PAIRS}: catches a 2%% slowdown on a 2-core machine, see "
        "above; --rounds is its old name)",
    )
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
    p.add_argument("--config", default="tiny", help="config name or .toml path (default: tiny)")
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


def run_process(cmd: list[str], env: dict, cwd: Path, timeout: float) -> tuple[int, str]:
    """Run one benchmark process in its own session; (exit status, stderr). Killed on any interrupt.

    Its own session, so that on Ctrl-C or SIGTERM the whole group (torchrun ranks, compile workers)
    is ended here, and none outlives the command.
    """
    from gembench.harness.continuous.interleave import end_group
    from gembench.harness.continuous.worktrees import deferred_interrupts

    proc = None
    try:
        with deferred_interrupts():  # an interrupt now would orphan the half-started child
            proc = subprocess.Popen(
                cmd,
                env=env,
                cwd=cwd,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        _, err = proc.communicate(timeout=timeout)
        return proc.returncode, err
    except subprocess.TimeoutExpired:
        end_group(proc)
        return 124, f"timed out after {timeout:g} s (--timeout)"
    finally:
        if proc is not None and proc.poll() is None:
            end_group(proc)


def error_line(stderr: str) -> str:
    """The one line of a failed run that says why: its `error:` line, else the last line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if (
            "error:" in ln.lower()
            or ln.startswith(("Traceback", "ModuleNotFoundError", "ImportError"))
            or "Error" in ln.split(":")[0]
        ):
            return ln
    return lines[-1] if lines else "no output"


def child_env(pythonpath: Path, threads: int | None = None) -> dict:
    env = dict(os.environ)
    if threads is not None:  # torch takes its intra-op thread count from these at start-up
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    env["PYTHONPATH"] = str(pythonpath)  # only the revision: an inherited path could shadow it
    # One string-hash seed for every process: randomised hashing changes dict and set layouts from
    # process to process, and with them tiny's Python-bound step time (measured: spread of the best
    # step across 8 fresh processes 3.1% with random seeds, 1.6% with one seed).
    env.setdefault("PYTHONHASHSEED", "0")
    for var in ("GEMBENCH_COMMIT", "ASV_COMMIT"):  # the result's commit must be the worktree's own
        env.pop(var, None)
    return env


def run_command(args: argparse.Namespace, out: Path, worktree: Path) -> list[str]:
    if args.benchmark == "instructions":
        kernels = [a for k in (args.kernel or []) for a in ("--kernel", k)]
        return [sys.executable, str(worktree / "benchmarks" / "instructions.py"), "--out", str(out), *kernels]
    config = args.config
    if config.endswith(".toml") or Path(config).exists():
        config = str(Path(config).resolve())  # the process runs in the worktree
    cmd = [
        sys.executable,
        "-m",
        "gembench",
        "run",
        "--config",
        config,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--stack",
        args.stack,
        "--seed",
        str(args.seed),
        "--device",
        args.device,
        "--out",
        str(out),
        "--quiet",
    ]
    if args.nproc is not None:
        cmd += ["--nproc", str(args.nproc)]
    return cmd


def check_args(args: argparse.Namespace) -> None:
    from gembench.harness.commands.compare import check_decision_args
    from gembench.harness.regression.directions import METRICS

    if args.benchmark == "instructions" and args.pairs == DEFAULT_PAIRS:
        args.pairs = 1  # exact counts: one process per revision decides
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
        args.parallel = default_parallel(args.device)
    args.parallel = min(args.parallel, args.pairs)
    if args.keep_results is not None:
        args.keep_results.mkdir(parents=True, exist_ok=True)


def failure(c, label: str, code: int, stderr: str) -> UsageError:
    return UsageError(f"{label} {c.revision} ({c.sha[:10]}) failed to run (exit {code}): {error_line(stderr)}")


def sequential_pair(args: argparse.Namespace, co: dict, outs: dict[str, Path], order: tuple[str, str]) -> None:
    """One fresh process per revision, one after the other, in ``order``."""
    for label in order:
        c = co[label]
        code, err = run_process(
            run_command(args, outs[label], c.path), child_env(c.pythonpath, args.threads), c.path, args.timeout
        )
        if code != 0 or not outs[label].exists():
            raise failure(c, label, code, err)


def interleaved_pairs(
    args: argparse.Namespace,
    co: dict,
    batch: list[tuple[int, dict[str, Path], tuple[str, str], int | None]],
    folder: Path,
) -> bool:
    """Pairs side by side: per (index, outs, order, cpu) both revisions' processes at once, taking
    turns a burst at a time on the pair's ``cpu``; False if a revision predates --pace.

    Alone (one pair), a pair's two start-ups run on two CPUs and it is pinned once warm; side by
    side, each pair is pinned from its start, so its start-ups, turns and counters stay on its CPU.
    """
    from gembench.harness.continuous import interleave
    from gembench.harness.continuous.worktrees import deferred_interrupts

    workers, pairs = [], []
    try:
        for r, outs, order, cpu in batch:
            sub = folder / f"pair{r + 1:02d}"  # each pair's stderr files apart
            sub.mkdir(exist_ok=True)
            pair = []
            for label in order:  # who goes first also starts first: which core, which pid
                c = co[label]
                cmd, env = run_command(args, outs[label], c.path), child_env(c.pythonpath, args.threads)
                with deferred_interrupts():  # held until the worker is in `workers`, where close() finds it
                    worker = interleave.start(label, cmd, env, c.path, sub, args.burst_steps)
                    workers.append(worker)
                if len(batch) > 1:
                    interleave.pin([worker], cpu)
                pair.append(worker)
            pairs.append((pair, cpu))
        interleave.take_turns_side_by_side(pairs, args.bursts, args.timeout)
        interleave.finish(workers, args.timeout)
    except interleave.WorkerFailed as err:
        if err.predates_pacing:
            return False
        raise failure(co[err.worker.label], err.worker.label, err.code, err.stderr) from None
    finally:
        interleave.close(workers)
    return True


def default_parallel(device: str) -> int:
    """Pairs at once by default: one per CPU this process may use, but one on a GPU (which they would share)."""
    if device != "cpu":
        from gembench.harness.device.hardware import resolve_device

        if resolve_device(device).type != "cpu":
            return 1
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1


def pair_cpu(index: int, parallel: int = 1) -> int | None:
    """The CPU a pair's two processes share: the allowed CPUs in turn, pair by pair, so every CPU
    is sampled and each pair's two processes run on the same one (interleave.pin). Side by side,
    each batch shifts by one, so the pair that starts with BASE is not always on the same CPU."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    shift = index // parallel if parallel > 1 else 0
    return cpus[(index + shift) % len(cpus)]


def checked_result(c, label: str, out: Path) -> dict:
    """The result a revision's process wrote, checked to come from that revision's commit."""
    from gembench.harness.store.results import field, load_result

    result = load_result(out)
    ran = field(result, "env.git_commit")
    if ran not in (c.sha, "unknown"):
        raise UsageError(
            f"{label} {c.revision}: the process ran commit {str(ran)[:10]}, not {c.sha[:10]}; "
            "PYTHONPATH did not win over the installed gembench"
        )
    return result


def main(args: argparse.Namespace) -> int:
    from gembench.harness.regression import paired, stats, thresholds, worktrees
    from gembench.harness.store.results import differences, field

    check_args(args)
    repo = worktrees.repo_root(args.repo)
    started = time.perf_counter()
    say = (lambda msg: None) if args.quiet else (lambda msg: print(f"continuous: {msg}", file=sys.stderr, flush=True))
    rounds: list[tuple[dict, dict]] = []
    with worktrees.temporary_checkouts(repo, {"BASE": args.base, "HEAD": args.head}) as co:
        interleaved = not args.sequential
        what = (
            "benchmarks/instructions.py"
            if args.benchmark == "instructions"
            else f"gembench run --config {args.config} --steps {args.steps} --stack {args.stack}"
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
        results_dir = co["BASE"].path.parent / "results"
        results_dir.mkdir()
        durations: list[float] = []  # per pair: its batch's time over the pairs in it
        for start in range(0, args.pairs, args.parallel):
            t0 = time.perf_counter()
            batch = []
            for r in range(start, min(start + args.parallel, args.pairs)):
                outs = {label: results_dir / f"pair{r + 1:02d}-{label.lower()}.json" for label in LABELS}
                order = LABELS if r % 2 == 0 else LABELS[::-1]  # ABBA: who goes first alternates by pair
                batch.append((r, outs, order, pair_cpu(r, args.parallel)))
            if interleaved:
                interleaved = interleaved_pairs(args, co, batch, results_dir)
                if not interleaved:
                    say(
                        "a revision's `gembench run` predates --pace: every pair runs its two processes one "
                        "after the other instead (as --sequential)"
                    )
            if not interleaved:
                for _, outs, order, _ in batch:
                    sequential_pair(args, co, outs, order)
            seconds = time.perf_counter() - t0
            for r, outs, order, cpu in batch:
                pair = {label: checked_result(co[label], label, outs[label]) for label in LABELS}
                if args.keep_results is not None:
                    for out in outs.values():
                        shutil.copy(out, args.keep_results / out.name)
                rounds.append((pair["BASE"], pair["HEAD"]))
                durations.append(seconds / len(batch))
                eta = sum(durations) / len(durations) * (args.pairs - len(durations))
                steps = {label: paired.process_value(pair[label], "step_time_s", args.statistic) for label in LABELS}
                step_text = "".join(f"{label} {1e3 * v:.2f} ms, " for label, v in steps.items() if v)
                where = f" on cpu {cpu}" if interleaved and cpu is not None else ""
                beside = f" ({len(batch)} pairs at once)" if len(batch) > 1 else ""
                say(
                    f"pair {r + 1}/{args.pairs} ({order[0]} first): {args.statistic} step {step_text}"
                    f"{seconds:.0f} s{where}{beside}, ~{eta / 60:.1f} min left"
                )

    first = rounds[0][0]
    config, hw = field(first, "config.name"), field(first, "env.hardware_class")
    limits = None
    if Path(args.thresholds).exists():
        limits = thresholds.load(args.thresholds, str(config), str(hw))
    elif args.thresholds != "results/thresholds.toml":
        raise UsageError(f"no thresholds file {args.thresholds}")
    alpha = args.alpha if args.alpha is not None else ((limits and limits.alpha) or stats.ALPHA)
    min_effect = MIN_EFFECT if args.min_effect is None else args.min_effect
    margin = max(MARGIN, min_effect) if args.margin is None else args.margin
    metrics = args.metric or ["step_time_s"]
    judgements = paired.judge_rounds(rounds, metrics, alpha, min_effect, limits, args.statistic, margin)
    code = paired.exit_status(judgements)
    minutes = (time.perf_counter() - started) / 60
    notes = differences(rounds[0][0], rounds[0][1], ("config.hash", "run.global_batch", "run.dtype"))
    verdict = {
        0: "continuous: pass",
        1: "continuous: REGRESSION",
        4: "continuous: INCONCLUSIVE (too noisy: more --pairs)",
    }[code]
    if args.format == "json":
        print(
            json.dumps(
                {
                    "schema": "gembench.continuous/1",
                    "base": {"revision": args.base, "sha": co["BASE"].sha},
                    "head": {"revision": args.head, "sha": co["HEAD"].sha},
                    "config": config,
                    "hardware_class": hw,
                    "stack": args.stack,
                    "steps": args.steps,
                    "warmup": args.warmup,
                    "seed": args.seed,
                    "pairs": args.pairs,
                    "rounds": args.pairs,
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
                    "exit_status": code,
                },
                indent=1,
            )
        )
        return code
    header = [
        f"BASE {args.base} = {co['BASE'].sha[:10]}   HEAD {args.head} = {co['HEAD'].sha[:10]}",
        f"{config} on {hw}, stack {args.stack}, seed {args.seed}: {args.pairs} process pairs ABBA x {args.steps} steps "
        f"(+{args.warmup} warm-up) per process, "
        f"{f'taking turns, {args.bursts} turns each' if interleaved else 'one process after the other'}"
        f"{f', {args.parallel} pairs at once on CPUs of their own' if interleaved and args.parallel > 1 else ''}, "
        f"{args.threads} thread(s); one value per process = its {args.statistic} step; {minutes:.1f} min",
        f"paired one-sided t-tests on log(HEAD/BASE) per pair at alpha={alpha:g} (Holm across "
        f"{sum(j.method == 'paired' for j in judgements)}), regression >= {100 * min_effect:g}%, unchanged within "
        f"+-{100 * margin:g}%; counters exact",
    ] + [f"note: BASE and HEAD differ in {d}" for d in notes]
    if args.benchmark == "instructions":
        header[1] = (
            f"kernel instruction counts (benchmarks/instructions.py, callgrind) on {hw}: "
            f"{args.pairs} pair(s), {minutes:.1f} min"
        )
    print(paired.render(judgements, header, args.format))
    print(verdict)
    return code
