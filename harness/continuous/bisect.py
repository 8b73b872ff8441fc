"""`gembench bisect GOOD BAD`: the first commit that got slower, by `git bisect run` on paired pairs.

BAD is first measured against GOOD as `gembench continuous` measures two revisions (run_pairs:
pairs of processes taking turns, one log ratio HEAD/BASE per pair, the paired t-test at alpha with
--min-effect). Not slower: said, nothing to bisect. Slower by BAD/GOOD = r: `git bisect run` in a
temporary worktree, with this module (run as ``python -m``) as the predicate. It pairs GOOD with
the candidate the bisect checked out and places the candidate's (1 - 2 alpha) interval of
CANDIDATE/GOOD against the midpoint sqrt(r), halfway between GOOD's ratio (1) and BAD's on the
log scale:

    bad        the interval wholly above the midpoint: nearer BAD's slowdown        (exit 1)
    good       wholly below it: nearer GOOD's                                       (exit 0)
    skip       the candidate does not run: its --setup fails, its model does not import (exit 125)
    undecided  the interval still holds the midpoint after --max-pairs: the bisect stops there
               (exit 128 aborts `git bisect run`) and says so, rather than guess

"Unchanged" (the interval inside +-margin) is not asked of a good commit: on a noisy host that can
stay out of reach while the slowdown is plain. Each look adds one batch of pairs (--parallel),
from --pairs up to --max-pairs, and stops as soon as the verdict is clear. Every step appends a
JSON line to a log in the temporary folder, which the command prints at the end.

The user's repository is left as found: the bisect runs in a worktree of its own (a worktree's
bisect state is its own), `git bisect reset` ends it, the predicate's process group is ended on
an interrupt, and worktrees.temporary_checkouts removes both worktrees on any exit, Ctrl-C and
SIGTERM included.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import sys
from pathlib import Path

from gembench.errors import UsageError
from gembench.harness.continuous.config import BisectConfig, Measuring

GOOD, BAD, SKIP, UNDECIDED = "good", "bad", "skip", "undecided"
STEP_EXIT = {GOOD: 0, BAD: 1, SKIP: 125, UNDECIDED: 128}  # git bisect run: 125 skips, >= 128 aborts
METRIC = "step_time_s"
PROGRESS = "bisect: "  # the predicate's lines among git's: forwarded to the user


def timing(rounds: list, m: Measuring):
    """The paired judgement of step_time_s over ``rounds`` (None where a pair lacks it)."""
    from gembench.harness.regression import paired

    judged = paired.judge_rounds(rounds, [METRIC], m.alpha, m.min_effect, None, m.statistic, m.margin)
    return next((j for j in judged if j.metric == METRIC), None)


def measure(config: BisectConfig, co: dict, say, decided) -> tuple[list, object]:
    """Pairs of ``co``'s BASE and HEAD: --pairs first, then a batch more at a time until
    ``decided(judgement)`` or --max-pairs. (rounds, the step_time_s judgement)."""
    from gembench.harness.continuous.pairs import run_pairs

    m = config.measuring
    last: dict = {}

    def enough(rounds, elapsed, per_batch):  # run_pairs asks after every batch
        if len(rounds) < m.pairs:
            return False
        last["j"] = timing(rounds, m)
        if last["j"] is None:
            raise UsageError(f"the results carry no {METRIC}: nothing to bisect on")
        return decided(last["j"])

    rounds, _ = run_pairs(dataclasses.replace(m, pairs=config.max_pairs), co, say, enough)
    return rounds, last["j"]


def classify(ratios: list[float], midpoint: float, alpha: float) -> tuple[str, float, float]:
    """(good | bad | undecided, the interval's ends) of a candidate's ratios against GOOD."""
    from gembench.harness.regression import stats

    _, lo, hi = stats.paired_ratio_interval(ratios, 1 - 2 * alpha)
    if lo > midpoint:  # NaN (one pair) compares False: undecided
        return BAD, lo, hi
    if hi < midpoint:
        return GOOD, lo, hi
    return UNDECIDED, lo, hi


def step_line(s: dict) -> str:
    if s["verdict"] == SKIP:
        return f"step {s['step']}: {s['sha'][:10]} {s['subject']!r}: skip ({s['why']})"
    return (
        f"step {s['step']}: {s['sha'][:10]} {s['subject']!r}: CANDIDATE/GOOD {s['ratio']:.4f} "
        f"[{s['lo']:.4f}, {s['hi']:.4f}] ({s['level']:g}%) over {s['pairs']} pairs, midpoint {s['midpoint']:.4f}: "
        f"{s['verdict']}"
    )


# -- the predicate: one step of `git bisect run` ---------------------------------------------------


def _checkout(d: dict):
    from gembench.harness.continuous.worktrees import Checkout

    paths = {k: Path(d[k]) if d.get(k) else None for k in ("path", "pythonpath", "overlay")}
    return Checkout(d["label"], d["revision"], d["sha"], **paths)


def predicate(state_file: Path) -> int:
    """Judge the commit checked out in the bisect's worktree against GOOD; the exit status for git."""
    import os

    from gembench.harness.continuous import worktrees
    from gembench.harness.continuous.setup import run_setup
    from gembench.harness.device.env import without_repository

    # `git bisect run` in a worktree exports GIT_DIR, the candidate's: every git call and process
    # from here (GOOD's runs too) would read the candidate's commit instead of their own folder's
    kept = without_repository(os.environ)
    os.environ.clear()
    os.environ.update(kept)
    state = json.loads(state_file.read_text())
    config = BisectConfig.from_json(state["config"])
    m = config.measuring
    log = Path(state["log"])
    worktree = Path(state["worktree"])
    sha = worktrees.git(worktree, "rev-parse", "HEAD")
    subject = worktrees.git(worktree, "log", "-1", "--format=%s", "HEAD")
    n = 1 + (len(log.read_text().splitlines()) if log.exists() else 0)
    candidate = worktrees.Checkout("HEAD", "candidate", sha, worktree, Path(state["pythonpath"]))
    co = {"BASE": _checkout(state["good"]), "HEAD": candidate}
    say = (lambda msg: None) if m.quiet else (lambda msg: print(f"{PROGRESS}{msg}", file=sys.stderr, flush=True))
    if m.keep_results:
        m = dataclasses.replace(m, keep_results=m.keep_results / f"step{n:02d}-{sha[:10]}")
        m.keep_results.mkdir(parents=True, exist_ok=True)
        config = dataclasses.replace(config, measuring=m)
    midpoint = state["midpoint"]
    record = {"step": n, "sha": sha, "subject": subject, "midpoint": midpoint}
    try:
        with worktrees.signals_as_interrupt():
            if m.setup:
                run_setup(m.setup, candidate, m.timeout, say)
            rounds, j = measure(
                config, co, say, lambda j: classify(j.extra["round_ratios"], midpoint, m.alpha)[0] != UNDECIDED
            )
    except UsageError as err:
        record.update(verdict=SKIP, why=str(err))
    except KeyboardInterrupt:
        return 130  # >= 128: git bisect run stops
    else:
        verdict, lo, hi = classify(j.extra["round_ratios"], midpoint, m.alpha)
        record.update(verdict=verdict, ratio=j.extra["ratio"], lo=lo, hi=hi, level=100 * (1 - 2 * m.alpha))
        record.update(pairs=len(rounds))
    with log.open("a") as f:
        f.write(json.dumps(record) + "\n")
    print(f"{PROGRESS}{step_line(record)}", file=sys.stderr, flush=True)  # a step's verdict, even with --quiet
    return STEP_EXIT[record["verdict"]]


# -- the command -----------------------------------------------------------------------------------


def _bisect_run(worktree: Path, state_file: Path, say) -> list[str]:
    """`git bisect run` this module in ``worktree`` (bisect already started); git's output lines.

    git and the predicate run in a session of their own, ended as a group on an interrupt; the
    predicate's lines are passed on as they come, git's are kept for the outcome.
    """
    from gembench.harness.continuous.interleave import end_group
    from gembench.harness.continuous.worktrees import deferred_interrupts

    safe = ["-P"] if sys.version_info >= (3, 11) else []  # the worktree, git's cwd, must not shadow gembench
    cmd = ["git", "-C", str(worktree), "bisect", "run", sys.executable, *safe]
    cmd += ["-m", "gembench.harness.continuous.bisect", str(state_file)]
    proc = None
    lines: list[str] = []
    try:
        with deferred_interrupts():
            proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
            )
        for line in proc.stdout:
            line = line.rstrip("\n")
            if line.startswith(PROGRESS):
                print(line, file=sys.stderr, flush=True)
            else:
                lines.append(line)
                if line.startswith("Bisecting:"):
                    say(line)
        proc.wait()
    finally:
        if proc is not None and proc.poll() is None:
            end_group(proc)
    return lines


def outcome(lines: list[str]) -> tuple[str | None, list[str]]:
    """(the first bad commit's sha, or None; the candidates when skips left several)."""
    for line in lines:
        m = re.match(r"^([0-9a-f]{40}) is the first bad commit", line)
        if m:
            return m.group(1), []
    if any("could be any of" in line for line in lines):
        return None, [line.strip() for line in lines if re.fullmatch(r"[0-9a-f]{40}", line.strip())]
    return None, []


def bisect(config: BisectConfig, say) -> int:
    """Measure BAD against GOOD, then bisect; prints the steps and the culprit. The exit status."""
    from gembench.harness.continuous import worktrees
    from gembench.harness.continuous.setup import run_setup
    from gembench.harness.regression import stats

    m = config.measuring
    good, bad = config.good, config.bad
    repo = worktrees.repo_root(m.repo, "--repo" if m.repo != "." else None)
    good_sha = worktrees.resolve(repo, good, "GOOD")
    bad_sha = worktrees.resolve(repo, bad, "BAD")
    if good_sha == bad_sha:
        raise UsageError(f"GOOD {good} and BAD {bad} are one commit ({good_sha[:10]}): nothing between")
    ancestor = subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", good_sha, bad_sha])
    if ancestor.returncode != 0:
        raise UsageError(f"GOOD {good} is not an ancestor of BAD {bad}: bisect needs GOOD earlier on BAD's history")
    report: dict = {"schema": "gembench.bisect/1", "good": good_sha, "bad": bad_sha, "steps": []}
    with worktrees.temporary_checkouts(repo, {"BASE": good, "HEAD": bad}, "gembench-bisect-") as co:
        if m.setup:
            for c in co.values():
                run_setup(m.setup, c, m.timeout, say)
        say(f"BAD {bad} = {bad_sha[:10]} against GOOD {good} = {good_sha[:10]}, {m.pairs} pairs first")
        rounds, j = measure(config, co, say, lambda j: j.verdict != stats.INCONCLUSIVE)
        ratio, (lo, hi) = j.extra["ratio"], j.extra["ratio_ci95"]
        report.update(ratio=ratio, ratio_ci95=[lo, hi], pairs=len(rounds), verdict=j.verdict)
        headline = (
            f"BAD {bad} ({bad_sha[:10]}) against GOOD {good} ({good_sha[:10]}): BAD/GOOD {ratio:.4f} "
            f"[{lo:.4f}, {hi:.4f}] (95%) over {len(rounds)} pairs: {j.verdict}"
        )
        if m.format != "json":
            print(headline, flush=True)
        if j.verdict == stats.INCONCLUSIVE:
            return _done(m, report, 4, f"could not tell whether BAD is slower within --max-pairs {config.max_pairs}")
        if j.verdict != stats.REGRESSED:
            return _done(m, report, 0, f"no regression: BAD is not slower than GOOD ({j.verdict}); nothing to bisect")
        root = co["BASE"].path.parent
        state_file, log = root / "bisect-state.json", root / "bisect-steps.jsonl"
        head = co["HEAD"]
        good_checkout = {k: str(v) if isinstance(v, Path) else v for k, v in vars(co["BASE"]).items()}
        state = {
            "config": config.as_json(),
            "good": good_checkout,
            "worktree": str(head.path),
            "pythonpath": str(head.pythonpath),
            "log": str(log),
            "midpoint": math.sqrt(ratio),
        }
        state_file.write_text(json.dumps(state))
        started = worktrees.git(head.path, "bisect", "start", bad_sha, good_sha)
        say(started.splitlines()[0] if started else "bisect started")  # "Bisecting: N revisions left ..."
        try:
            lines = _bisect_run(head.path, state_file, say)
        finally:
            worktrees.git(head.path, "bisect", "reset", "--quiet", check=False)
        steps = [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []
        report["steps"] = steps
        culprit, several = outcome(lines)
        if culprit is not None:
            subject = worktrees.git(repo, "log", "-1", "--format=%s", culprit)
            report["culprit"] = {"sha": culprit, "subject": subject}
            return _done(m, report, 0, f"culprit: {culprit} {subject}")
        if steps and steps[-1]["verdict"] == UNDECIDED:
            s = steps[-1]
            why = (
                f"could not decide: {s['sha'][:10]} {s['subject']!r} stayed undecided within --max-pairs "
                f"{config.max_pairs} (its interval [{s['lo']:.4f}, {s['hi']:.4f}] holds the midpoint "
                f"{s['midpoint']:.4f}); more --max-pairs or a quieter machine"
            )
        elif several:
            why = f"could not decide: the first bad commit is one of {', '.join(c[:10] for c in several)} (skipped)"
        else:
            why = f"could not decide: git bisect run ended without a culprit: {(lines or ['no output'])[-1]}"
        return _done(m, report, 4, why)


def _done(m: Measuring, report: dict, code: int, why: str) -> int:
    report.update(exit_status=code, outcome=why)
    if m.format == "json":
        print(json.dumps(report, indent=1))
    else:
        for s in report["steps"]:
            print(step_line(s))
        print(f"bisect: {why}")
    return code


if __name__ == "__main__":  # the predicate, as `git bisect run` calls it
    sys.exit(predicate(Path(sys.argv[1])))
