"""One benchmark run on one process: config -> model + data -> staged steps -> result document.

This is the library entry point the CLI, the asv suite and the tests share. ``run_ab`` runs
the baseline and optimized stacks interleaved in one process, so that their MFU ratio holds
on a machine whose speed drifts.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from gembench.errors import UsageError
from gembench.harness.device.env import fingerprint
from gembench.harness.device.hardware import (
    Peak,
    memory_available,
    peak_basis,
    recheck_peak,
    reference_peak,
    resolve_device,
)
from gembench.harness.metrics import counters as C
from gembench.harness.metrics import trace as TR
from gembench.harness.metrics.mfu import per_step_mfu, summarize, train_flops
from gembench.harness.regression.stats import paired_ratio_interval
from gembench.harness.store.document import result_document
from gembench.harness.train import nvtx
from gembench.harness.train.memory import (
    FIT_SHARE,
    SavedForBackward,
    check_fits,
    fit_hint,
    memory_fields,
    peak_memory_bytes,
    reset_peak_memory,
    run_memory_bytes,
)
from gembench.harness.train.parallelize import recomputed_forward_flops
from gembench.harness.train.runconfig import check_counts
from gembench.harness.train.stack import STACKS, StackOptions, build_train_state, model_config
from gembench.harness.train.step import (
    NoClock,
    StepSamples,
    divergence,
    finite_or_none,
    out_of_memory,
    run_steps,
    train_step,
)
from gembench.models.config import ModelConfig, for_device, load_config, with_global_batch
from gembench.models.data import SyntheticData
from gembench.models.flops import batch_forward_flops, embedding_bytes, memory_estimate, parameter_counts

MAX_DISTINCT_BATCHES = 32  # batches are prepared up front and cycled, like a prefetching loader


@dataclass
class Setup:
    """Everything a run needs besides the stack: config, device, peak, prepared batches."""

    cfg: ModelConfig
    device: torch.device
    peak: Peak
    seed: int
    batches: list
    estimate: dict
    counts: dict | None = None  # parameter_counts(cfg), kept for per-stack estimates
    available: float = 0.0  # free device memory when the run was prepared


def prepare(
    config: str | ModelConfig,
    steps: int,
    warmup: int,
    device: str = "auto",
    seed: int = 0,
    peak_tflops: float | None = None,
    copies: int = 1,
    stacks: list[StackOptions] | None = None,
    batch: int | None = None,
) -> Setup:
    """Validate the request and prepare batches; every usage error surfaces here, before work.

    ``stacks``: every stack the process will hold (for the memory check); ``batch`` overrides
    the config's global batch (--batch).
    """
    check_counts(steps, warmup)
    cfg = config if isinstance(config, ModelConfig) else load_config(config)
    dev = resolve_device(device)
    cfg = for_device(with_global_batch(cfg, batch), dev.type)
    counts = parameter_counts(cfg)
    estimate = check_fits(cfg, cfg.data.global_batch, dev, copies, stacks, counts)
    peak = reference_peak(dev, peak_tflops)
    data = SyntheticData(cfg, seed=seed, batch_size=cfg.data.global_batch)
    batches = [data.batch(i) for i in range(min(steps + warmup, MAX_DISTINCT_BATCHES))]
    return Setup(cfg, dev, peak, seed, batches, estimate, counts, float(memory_available(dev)))


def step_flops(setup: Setup, first: int, count: int, options: StackOptions) -> list[dict[str, float]]:
    """Forward FLOPs per block of the batches that steps first..first+count-1 used, of the model
    ``options`` run (stack.model_config: without content under content=off)."""
    cfg = model_config(setup.cfg, options)
    n = len(setup.batches)
    cache = {}
    out = []
    for i in range(first, first + count):
        if i % n not in cache:
            cache[i % n] = batch_forward_flops(cfg, setup.batches[i % n])
        out.append(cache[i % n])
    return out


@dataclass
class Measured:
    """One stack's measured steps, before they are summarized against the peak."""

    name: str
    options: StackOptions
    samples: StepSamples
    memory: tuple  # (peak bytes, its source, the run's rise, its source), right after the timed steps
    counters: dict | None = None  # step_costs: on extra steps after the timed ones
    profile: dict | None = None
    activation_bytes: int | None = None  # saved for backward in the counted step (memory.SavedForBackward)


def memory_now(setup: Setup, start_bytes: int) -> tuple:
    """The run's memory figures now (taken before the counted and profiled steps add theirs)."""
    return (*peak_memory_bytes(setup.device), *run_memory_bytes(setup.device, start_bytes))


def measure_stack(
    setup: Setup, options: StackOptions, name: str, steps: int, warmup: int, progress=None, pace=None, trace=None
) -> Measured:
    """The one way a stack is measured on one process: build it, warm up, time ``steps`` steps,
    take the memory, then count the step's costs (and with ``trace``, keep the profiled one).
    `gembench run` and `gembench ablate` (one variant each) go through here; --ab takes turns
    between two stacks (run_ab) and then follows the same summary, peak check and counters."""
    nvtx.enable_from_env(setup.device)  # gembench run --nsys: ranges for Nsight Systems
    start = reset_peak_memory(setup.device)
    since = C.fresh_compile_state()  # this stack's compile counts are its own
    with out_of_memory_guard(setup, [options]):
        state = build_train_state(setup.cfg, options, setup.device, seed=setup.seed)
        samples = run_steps(state, setup.batches, steps, warmup, progress=progress, pace=pace)
    memory = memory_now(setup, start)
    with out_of_memory_guard(setup, [options]):
        counts, profile, saved = step_costs(setup, state, warmup + steps, since, options.compile, trace)
    return Measured(name, options, samples, memory, counts, profile, saved)


def summarized(setup: Setup, measured: list[Measured], warmup: int, estimate: dict | None = None) -> list[dict]:
    """stack_result of each measured stack, after one check of the peak against all of them: a
    calibrated peak they beat is re-measured (hardware.recheck_peak) and every figure is then
    taken against the new one, so the stacks of one run share one peak."""
    results = [stack_result(setup, m, warmup, estimate) for m in measured]
    new = recheck_peak(
        setup.peak,
        {"": results[0]["summary"]}
        if len(results) == 1
        else {f" of {m.name}": r["summary"] for m, r in zip(measured, results)},
    )
    if new is not None:
        setup.peak = new
        results = [stack_result(setup, m, warmup, estimate) for m in measured]
    return results


def stack_result(setup: Setup, m: Measured, warmup: int, estimate: dict | None = None) -> dict:
    """Summary, samples and headline metrics of one stack's measured steps."""
    samples, options = m.samples, m.options
    steps = len(samples.step_s)
    per_block = step_flops(setup, warmup, steps, options)
    forward = [sum(b.values()) for b in per_block]
    peak = setup.peak.tflops_per_device
    recomputed = [recomputed_forward_flops(b, options.activation_checkpointing) for b in per_block]
    summary = summarize(
        samples.step_s, samples.stages, forward, setup.cfg.data.global_batch, peak, recomputed_flops=recomputed
    )
    memory, memory_source, run_bytes, run_source = m.memory
    summary["peak_memory_bytes"] = memory
    summary["peak_memory_source"] = memory_source
    ran = model_config(setup.cfg, options)
    estimate = estimate or memory_estimate(
        ran, ran.data.global_batch, setup.counts if ran is setup.cfg else None, options, setup.device.type
    )
    summary.update(memory_fields(estimate, run_bytes, run_source))
    if m.activation_bytes is not None:
        summary["activation_bytes"] = m.activation_bytes
    summary["embedding_bytes_per_step"] = embedding_bytes(setup.cfg, setup.batches[warmup % len(setup.batches)])
    # what one step's batch moves to the device (counted as h2d_bytes on CUDA), content included
    summary["input_bytes_per_step"] = float(
        np.mean([setup.batches[i % len(setup.batches)].input_bytes for i in range(warmup, warmup + steps)])
    )
    diverged = divergence(samples.loss, samples.task_loss, first_step=warmup)
    return {
        "diverged": diverged,
        "stack": m.name,
        "options": options.to_dict(),
        "flops": {
            "forward_per_step": float(np.mean(forward)),
            "model_per_step": train_flops(float(np.mean(forward))),
            "recomputed_per_step": float(np.mean(recomputed)),
            "per_block": {k: float(np.mean([b[k] for b in per_block])) for k in per_block[0]},
        },
        "samples": {
            "step_s": samples.step_s,
            "mfu": per_step_mfu(forward, samples.step_s, peak),
            "loss": finite_or_none(samples.loss),
            "task_loss": finite_or_none(samples.task_loss),
            "stages": samples.stages,
        },
        "summary": summary,
        "counters": m.counters,
    }


def one_process_result(setup: Setup, steps: int, warmup: int, main: dict, extra: dict | None = None) -> dict:
    """The result document of a one-process run (store/document.py builds it) around one stack's
    measurements."""
    dev, peak = setup.device, setup.peak
    cfg = model_config(setup.cfg, StackOptions(**main["options"]))  # the model that ran: its hash
    summary = main["summary"]
    peak_doc = peak_section(peak, dev)
    if peak_doc.get("host"):  # one process: the host basis is the same peak, recorded so --nproc runs compare
        summary["mfu_host"] = summary["mfu"] * peak.tflops_per_device / peak_doc["host"]["tflops"]
    run = {
        "steps": steps,
        "warmup": warmup,
        "dtype": "bf16" if main["options"]["bf16"] else "fp32",
        "device": str(dev),
        "seed": setup.seed,
        "stack": main["stack"],
        "options": main["options"],
        "nproc": 1,
        "global_batch": cfg.data.global_batch,
        "per_rank_batch": cfg.data.global_batch,
    }
    return result_document(
        cfg,
        main["stack"],
        run,
        fingerprint(dev),
        peak_doc,
        {**main["flops"], "memory_estimate_bytes": setup.estimate},
        main["samples"],
        summary,
        sections=extra,
        diverged=main.get("diverged"),
    )


def peak_section(peak: Peak, dev: torch.device) -> dict:
    """The result's peak: figure, provenance, whether provisional, and the MFU basis."""
    return {
        "tflops_per_device": peak.tflops_per_device,
        "devices": 1,
        "dtype": peak.dtype,
        "source": peak.source,
        "provisional": peak.provisional,
        "calibration": peak.calibration,
        **peak_basis(
            dev,
            1,
            torch.get_num_threads(),
            peak if peak.calibration else None,
            override=peak.source.startswith("override"),
        ),
    }


@contextlib.contextmanager
def out_of_memory_guard(setup: Setup, stacks: list[StackOptions]):
    """Turn a device out-of-memory error anywhere in the run into one line: the stage (run_steps
    names it; otherwise the stack was being built), the peak reached, and the largest --batch the
    estimate says fits, corrected by how far this run's real peak outgrew it. Nothing is written."""
    try:
        yield
    except RuntimeError as err:  # torch.OutOfMemoryError is one, as are compile errors wrapping it
        if out_of_memory(err) is None:
            raise
        stage = getattr(err, "stage", "build (model, embeddings and optimizers)")
        peak, source = peak_memory_bytes(setup.device)
        batch = setup.cfg.data.global_batch
        capacity = FIT_SHARE * setup.available * min(1.0, setup.estimate["total"] / max(peak, 1))
        hint = fit_hint(setup.cfg, stacks, setup.device.type, capacity, setup.counts, max(batch - 1, 1))
        gib = 2**30
        raise UsageError(
            f"{setup.device} ran out of memory in stage {stage} ({setup.cfg.name!r}, batch {batch}): "
            f"peak {peak / gib:,.2f} GiB ({source}) of {setup.available / gib:,.1f} GiB free at the start, "
            f"estimate {setup.estimate['total'] / gib:,.2f} GiB; {hint}; no result was written"
        ) from None


def step_costs(
    setup: Setup, state, index: int, compiled_since: dict, compiles: bool = True, trace_dir=None
) -> tuple[dict, dict | None]:
    """Cost counters (metrics/counters.py) of two extra steps on batch ``index``, after the
    timed ones: the first counted (ops, host syncs), the second under torch.profiler (kernels,
    host-to-device bytes; with ``trace_dir`` its trace is kept as trace_dir/trace.json). Not one
    step: the counting dispatch mode re-dispatches every op, which the profiler records twice.

    Returns (counters, profile, activation bytes): profile = {trace, ranked, top} for the report,
    or None; the bytes the counted step saved for its backward (memory.SavedForBackward).
    ``compiles``: whether this stack uses torch.compile (its compile counts are the run's).
    """
    batch = setup.batches[index % len(setup.batches)]
    with C.StepCounter(setup.device, state.optimizers) as counted, SavedForBackward(state.model.parameters()) as saved:
        train_step(state, batch, NoClock())
    if setup.device.type == "cuda":
        torch.cuda.synchronize(setup.device)
    prof = TR.profiler(setup.device)
    with prof:
        with torch.autograd.profiler.record_function(TR.STEP_SPAN):
            train_step(state, batch, NoClock())
        if setup.device.type == "cuda":
            torch.cuda.synchronize(setup.device)  # the step's kernels end inside the profile
    path = None if trace_dir is None else Path(trace_dir) / "trace.json"
    events = TR.trace_events(prof, path)
    compiled = C.compile_counts(compiled_since) if compiles else {"graph_breaks": 0, "recompiles": 0}
    counts = C.counters(counted, events, compiled)
    profile = None
    if path is not None:
        what, rows = TR.top_rows(events, setup.device)
        profile = {"trace": str(path), "ranked": what, "top": rows}
    return counts, profile, saved.bytes


def with_costs(result: dict, counts: dict, profile: dict | None = None) -> dict:
    """Put the counters (and the profile's top ops) into a result document."""
    result["counters"] = counts
    result["metrics"].update(C.flat_metrics(counts))
    if profile is not None:
        result["profile"] = profile
    return result


def run_benchmark(
    config: str | ModelConfig,
    steps: int = 20,
    warmup: int = 3,
    options: StackOptions = STACKS["optimized"],
    device: str = "auto",
    seed: int = 0,
    peak_tflops: float | None = None,
    progress=None,
    stack_name: str = "optimized",
    batch: int | None = None,
    on_prepared=None,
    trace=None,
    pace=None,
) -> dict:
    """Train ``config`` under one stack for ``warmup`` + ``steps`` steps; return the result.

    ``batch`` overrides the config's global batch (recorded in run.global_batch and config.hash);
    ``on_prepared()`` is called once the request is validated and fits, before any work. Two more
    steps after the timed ones measure the cost counters (and with ``trace``, a directory, keep
    the profiled one as trace/trace.json). ``pace`` takes turns with another process
    (regression/interleave.py's Pacer, `gembench run --pace`).
    """
    setup = prepare(config, steps, warmup, device, seed, peak_tflops, stacks=[options], batch=batch)
    if on_prepared is not None:
        on_prepared()
    m = measure_stack(setup, options, stack_name, steps, warmup, progress=progress, pace=pace, trace=trace)
    (main,) = summarized(setup, [m], warmup, setup.estimate)  # the estimate prepare() checked, not a second one
    return with_costs(one_process_result(setup, steps, warmup, main), m.counters, m.profile)


def run_ab(
    config: str | ModelConfig,
    rounds: int = 6,
    steps_per_round: int = 3,
    warmup: int = 3,
    device: str = "auto",
    seed: int = 0,
    peak_tflops: float | None = None,
    dtype: str | None = None,
    progress=None,
    batch: int | None = None,
    on_prepared=None,
    trace=None,
) -> dict:
    """Baseline and optimized stacks interleaved in one process, ABBA order, same weights.

    Each round times ``steps_per_round`` steps of each stack over the same batches; the ratio
    of their MFU per round is paired, so slow phases of a shared machine hit both stacks alike.
    The headline ``ab_mfu_ratio`` is the geometric mean over rounds with a 95% t-interval.
    Cost counters: extra steps of each stack after the rounds (the result's are the
    optimized stack's, the baseline's are in ab.baseline.counters).
    """
    if rounds < 2:
        raise UsageError(f"--rounds must be at least 2 for an interval, got {rounds}")
    steps = rounds * steps_per_round
    names = ("baseline", "optimized")
    opts = {
        n: STACKS[n] if dtype is None or n == "baseline" else replace(STACKS[n], bf16=dtype == "bf16") for n in names
    }
    stacks = [opts[n] for n in names]
    setup = prepare(config, steps, warmup, device, seed, peak_tflops, stacks=stacks, batch=batch)
    if on_prepared is not None:
        on_prepared()
    start = reset_peak_memory(setup.device)
    since = C.fresh_compile_state()
    with out_of_memory_guard(setup, stacks):
        return _run_ab(setup, names, opts, rounds, steps_per_round, warmup, seed, progress, start, since, trace)


def _run_ab(setup: Setup, names, opts, rounds, steps_per_round, warmup, seed, progress, start, since, trace) -> dict:
    steps = rounds * steps_per_round
    states = {n: build_train_state(setup.cfg, opts[n], setup.device, seed=seed) for n in names}
    collected = {n: StepSamples() for n in names}
    per_round = {n: [] for n in names}
    for n in names:  # warm-up (and compilation) outside the measurement
        run_steps(states[n], setup.batches, 0, warmup)
    done, total = 0, 2 * steps
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for n in order:
            batches = [
                setup.batches[(warmup + r * steps_per_round + i) % len(setup.batches)] for i in range(steps_per_round)
            ]
            s = run_steps(states[n], batches, steps_per_round, 0)
            per_round[n].append(float(np.median(s.step_s)))
            collected[n].step_s += s.step_s
            collected[n].loss += s.loss
            collected[n].task_loss += s.task_loss
            for stage, v in s.stages.items():
                collected[n].stages[stage] += v
            done += steps_per_round
            if progress is not None:
                progress(done, total, s.step_s[-1])
    # Same batches for both stacks in each round, so per-round FLOPs are equal: the MFU
    # ratio is the inverse step-time ratio.
    ratios = [b / o for b, o in zip(per_round["baseline"], per_round["optimized"])]
    center, lo, hi = paired_ratio_interval(ratios)
    # One process held both stacks: its peak is theirs together, against their combined estimate.
    memory = memory_now(setup, start)
    measured = []
    for n in names:  # only the optimized stack compiles, so the run's compile counts are its own
        counts, profile, saved = step_costs(
            setup, states[n], warmup + steps, since, opts[n].compile, trace if n == "optimized" else None
        )
        measured.append(Measured(n, opts[n], collected[n], memory, counts, profile, saved))
    results = dict(zip(names, summarized(setup, measured, warmup, setup.estimate)))
    optimized = measured[names.index("optimized")]
    ab = {
        "rounds": rounds,
        "steps_per_round": steps_per_round,
        "order": "ABBA",
        "round_step_s": per_round,
        "round_ratios": ratios,
        "mfu_ratio": center,
        "mfu_ratio_ci95": [lo, hi],
        "baseline": {k: results["baseline"][k] for k in ("options", "flops", "samples", "summary", "counters")},
    }
    doc = with_costs(
        one_process_result(setup, steps, warmup, results["optimized"], {"ab": ab}),
        optimized.counters,
        optimized.profile,
    )
    doc["run"]["stack"] = "ab"
    doc["metrics"]["ab_mfu_ratio"] = center
    doc["metrics"]["baseline_mfu"] = results["baseline"]["summary"]["mfu"]
    base_diverged = results["baseline"]["diverged"]
    if base_diverged and (not doc.get("diverged") or base_diverged["step"] < doc["diverged"]["step"]):
        doc["diverged"] = {**base_diverged, "stack": "baseline"}
    elif doc.get("diverged"):
        doc["diverged"]["stack"] = "optimized"
    return doc
