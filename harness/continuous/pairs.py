"""The pairs of `gembench continuous`: one process per revision, taking turns or one after the other.

Every process is a `gembench run` of its revision's worktree (the command line from
RunConfig.to_argv, PYTHONPATH the worktree alone), in a session of its own so that an interrupt
ends its whole group. Pairs run side by side, one per CPU (interleave.py takes their turns), or
one fresh process after another (--sequential, --nproc, the instruction counts). Each process's
result is checked to come from its revision's commit.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from gembench.errors import UsageError
from gembench.harness.continuous.config import Measuring
from gembench.harness.device.calibration import PROBED_ENV

LABELS = ("BASE", "HEAD")


def run_pairs(m: Measuring, co: dict, say, enough=None) -> tuple[list[tuple[dict, dict]], bool]:
    """Up to ``m.pairs`` pairs, ``m.parallel`` at a time, progress through ``say``:
    ([(BASE result, HEAD result)] per pair, whether they took turns). ``enough(rounds, elapsed,
    per_batch)``, asked after each batch, ends the run early when it says so."""
    from gembench.harness.regression import paired

    rounds: list[tuple[dict, dict]] = []
    interleaved = not m.sequential
    results_dir = co["BASE"].path.parent / "results"
    shutil.rmtree(results_dir, ignore_errors=True)  # no earlier comparison's file may pass for a new one's
    results_dir.mkdir()
    durations: list[float] = []  # per pair: its batch's time over the pairs in it
    began = time.perf_counter()
    if "startup_s" in m.metrics:
        say("warming each revision's compile cache: one short untimed process each (start-up is judged)")
        warm_caches(m, co, results_dir)
    else:
        m = dataclasses.replace(m, peaks_probed=probe_peaks(m))
    for start in range(0, m.pairs, m.parallel):
        t0 = time.perf_counter()
        batch = []
        for r in range(start, min(start + m.parallel, m.pairs)):
            outs = {label: results_dir / f"pair{r + 1:02d}-{label.lower()}.json" for label in LABELS}
            order = LABELS if r % 2 == 0 else LABELS[::-1]  # ABBA: who goes first alternates by pair
            batch.append((r, outs, order, pair_cpu(r, m.parallel)))
        if interleaved:
            interleaved = interleaved_pairs(m, co, batch, results_dir)
            if not interleaved:
                say(
                    "a revision's `gembench run` predates --pace: every pair runs its two processes one "
                    "after the other instead (as --sequential)"
                )
        if not interleaved:
            for _, outs, order, _ in batch:
                sequential_pair(m, co, outs, order)
        seconds = time.perf_counter() - t0
        for r, outs, order, cpu in batch:
            pair = {label: checked_result(co[label], label, outs[label]) for label in LABELS}
            if m.keep_results is not None:
                for out in outs.values():
                    shutil.copy(out, m.keep_results / out.name)
            rounds.append((pair["BASE"], pair["HEAD"]))
            durations.append(seconds / len(batch))
            eta = sum(durations) / len(durations) * (m.pairs - len(durations))
            steps = {label: paired.process_value(pair[label], "step_time_s", m.statistic) for label in LABELS}
            step_text = "".join(f"{label} {1e3 * v:.2f} ms, " for label, v in steps.items() if v)
            where = f" on cpu {cpu}" if interleaved and cpu is not None else ""
            beside = f" ({len(batch)} pairs at once)" if len(batch) > 1 else ""
            say(
                f"pair {r + 1}/{m.pairs} ({order[0]} first): {m.statistic} step {step_text}"
                f"{seconds:.0f} s{where}{beside}, ~{eta / 60:.1f} min left{' at most' if enough else ''}"
            )
        if m.halve_steps and interleaved:
            m = halved(m, rounds, seconds, say)
        if enough is not None and enough(rounds, time.perf_counter() - began, seconds):
            break
    return rounds, interleaved


def halved(m: Measuring, rounds: list[tuple[dict, dict]], pair_s: float, say) -> Measuring:
    """``m`` with half its steps (in turns of as many steps) from the next batch on, where the pairs
    so far say that pairs half as long pay (paired.halving); else ``m``. Judged from the first
    look's pairs on, once: the halved pairs would need pairs of their own to judge again, and a
    process is not halved below FEWEST_HALVED_STEPS."""
    from gembench.harness.continuous.config import FEWEST_HALVED_STEPS
    from gembench.harness.regression.paired import halving
    from gembench.harness.regression.sequential import FIRST_LOOK

    steps = m.steps // 2
    if len(rounds) < FIRST_LOOK or "step_time_s" not in m.metrics or steps < FEWEST_HALVED_STEPS:
        return m
    h = halving(rounds, "step_time_s", m.statistic, pair_s)
    if h is None or not h.pays:
        return m
    say(
        f"pairs of {steps} steps pay here: a half process's ratio varies {h.variance_ratio:.2f}x as much as a "
        f"whole one's, for {100 / h.cost_ratio:.0f}% of a pair's {pair_s:.0f} s (its noise is the process's "
        f"more than its steps'); the next pairs take {steps} steps"
    )
    return dataclasses.replace(m, steps=steps, bursts=-(-steps // m.burst_steps), halve_steps=False)


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


def warm_caches(m: Measuring, co: dict, folder: Path) -> None:
    """One short process per revision, untimed, so that every judged start-up compiles from a
    warm cache of its revision's own. Without it the first batch's side-by-side pairs race to fill
    their revision's empty cache, one process compiling cold and the other not: pair ratios of
    0.27 and 2.96 beside 1.09-1.26 for all the others (a planted 1 s delay, 18 pairs), which no
    paired test narrows within the budget."""
    short = dataclasses.replace(m, steps=1, warmup=1)
    for label in LABELS:
        c = co[label]
        out = folder / f"warm-{label.lower()}.json"
        cmd = run_command(short, out, c.path, interpreter(m, label))
        code, err = run_process(cmd, revision_env(m, c), c.path, m.timeout)
        if code != 0:
            raise failure(c, label, code, err)


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


def revision_env(m: Measuring, c) -> dict:
    """The process environment of revision ``c``. With --model the repository is the model's, not
    gembench's: the worktree goes on the path (its pkg.mod:factory imports from there, a file path
    is relative to it) before this gembench, and the result's commit is the worktree's."""
    first = f"{c.overlay}{os.pathsep}" if getattr(c, "overlay", None) else ""  # what --setup installed
    if m.model is None:
        env = child_env(Path(f"{first}{c.pythonpath}"), m.threads)
    else:
        import gembench

        here = Path(gembench.__file__).parent.parent  # the folder holding this gembench (a symlink kept)
        env = child_env(Path(f"{first}{c.path}{os.pathsep}{here}"), m.threads)
        env["GEMBENCH_COMMIT"] = c.sha
    # Where start-up is judged each revision compiles into a cache of its own, beside its worktree:
    # with one shared cache the first process to compile would warm the other revision's startup_s.
    # Elsewhere both use the cache every `gembench run` uses (the compiled code is the same either
    # way): graphs compiled before, by either revision or an earlier run, need no cold first batch.
    if "startup_s" in m.metrics:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(c.path.parent / f"compile-cache-{c.label.lower()}")
    elif m.peaks_probed:  # probed once here: each process would spend ~1 s re-probing them
        env[PROBED_ENV] = m.peaks_probed
    return env


def probe_peaks(m: Measuring) -> str | None:
    """Probes the settled CPU peaks and bandwidth the processes will serve, once, in this process:
    what revision_env tells them (a child of the same torch serves them unprobed). None on a GPU."""
    from gembench.harness.device.hardware import probe_cpu_calibrations, resolve_device

    if m.benchmark != "run" or resolve_device(m.device).type != "cpu":
        return None
    return probe_cpu_calibrations(m.threads)


def child_env(pythonpath: Path, threads: int | None = None) -> dict:
    from gembench.harness.device.env import without_repository

    env = without_repository(os.environ)  # git finds each revision's repository from its worktree
    if threads is not None:  # torch takes its intra-op thread count from these at start-up
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    env["PYTHONPATH"] = str(pythonpath)  # only the revision: an inherited path could shadow it
    env.pop(PROBED_ENV, None)  # only what this process probed (revision_env)
    # One string-hash seed for every process: randomised hashing changes dict and set layouts from
    # process to process, and with them tiny's Python-bound step time (measured: spread of the best
    # step across 8 fresh processes 3.1% with random seeds, 1.6% with one seed).
    env.setdefault("PYTHONHASHSEED", "0")
    for var in ("GEMBENCH_COMMIT", "ASV_COMMIT"):  # the result's commit must be the worktree's own
        env.pop(var, None)
    return env


def interpreter(m: Measuring, label: str) -> str:
    """The Python that runs revision ``label``'s processes: its --python, else this one."""
    return m.pythons[LABELS.index(label)] if m.pythons else sys.executable


def run_command(m: Measuring, out: Path, worktree: Path, python: str | None = None) -> list[str]:
    python = python or sys.executable
    if m.benchmark == "instructions":
        kernels = [a for k in m.kernels for a in ("--kernel", k)]
        return [python, str(worktree / "benchmarks" / "instructions.py"), "--out", str(out), *kernels]
    from gembench.harness.train.runconfig import RunConfig

    config = m.config
    if config is not None and (config.endswith(".toml") or Path(config).exists()):
        config = str(Path(config).resolve())  # the process runs in the worktree
    run = RunConfig(
        config=config,
        model=m.model,  # resolved in the worktree: each revision's own model
        model_args=m.model_args,
        steps=m.steps,
        warmup=m.warmup,
        stack=m.stack,
        seed=m.seed,
        device=m.device,
        out=out,
        quiet=True,
        nproc=m.nproc,
    )
    return [python, "-m", "gembench", "run", *run.to_argv()]


def failure(c, label: str, code: int, stderr: str) -> UsageError:
    return UsageError(f"{label} {c.revision} ({c.sha[:10]}) failed to run (exit {code}): {error_line(stderr)}")


def sequential_pair(m: Measuring, co: dict, outs: dict[str, Path], order: tuple[str, str]) -> None:
    """One fresh process per revision, one after the other, in ``order``."""
    for label in order:
        c = co[label]
        code, err = run_process(
            run_command(m, outs[label], c.path, interpreter(m, label)),
            revision_env(m, c),
            c.path,
            m.timeout,
        )
        if code != 0 or not outs[label].exists():
            raise failure(c, label, code, err)


def interleaved_pairs(
    m: Measuring,
    co: dict,
    batch: list[tuple[int, dict[str, Path], tuple[str, str], int | None]],
    folder: Path,
) -> bool:
    """Pairs side by side: per (index, outs, order, cpu) both revisions' processes at once, taking
    turns a burst at a time on the pair's ``cpu``; False if a revision predates --pace.

    Alone (one pair), a pair's two start-ups run on two CPUs and it is pinned once warm; side by
    side, each pair is pinned from its start, so its start-ups, turns and counters stay on its CPU.
    Where start-up is judged (``startup_s`` among the metrics), a pair's second process starts once
    its first is warm: two start-ups sharing a CPU would each take the other's time into their own.
    """
    from gembench.harness.continuous import interleave
    from gembench.harness.continuous.worktrees import deferred_interrupts

    stagger = "startup_s" in m.metrics
    workers, pairs, warm = [], [([], cpu) for _, _, _, cpu in batch], []
    try:
        for k in (0, 1):  # who goes first also starts first: which core, which pid
            if k == 1 and stagger:
                warm = [pair[0] for pair, _ in pairs]
                interleave.wait_ready(warm, time.monotonic() + m.timeout)
            for (r, outs, order, cpu), (pair, _) in zip(batch, pairs):
                sub = folder / f"pair{r + 1:02d}"  # each pair's stderr files apart
                sub.mkdir(exist_ok=True)
                c = co[order[k]]
                cmd, env = run_command(m, outs[order[k]], c.path, interpreter(m, order[k])), revision_env(m, c)
                with deferred_interrupts():  # held until the worker is in `workers`, where close() finds it
                    worker = interleave.start(order[k], cmd, env, c.path, sub, m.burst_steps)
                    workers.append(worker)
                if len(batch) > 1:
                    interleave.pin([worker], cpu)
                pair.append(worker)
        interleave.take_turns_side_by_side(pairs, m.bursts, m.timeout, warm)
        interleave.finish(workers, m.timeout)
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
            f"{label} {c.revision}: the process ran commit {str(ran)[:10]}, not {c.sha[:10]}: another gembench "
            "than the worktree's was imported (PYTHONPATH did not win), or git read another repository"
        )
    return result
