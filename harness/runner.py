"""One benchmark run on one process: config -> model + data -> staged steps -> result document.

This is the library entry point the CLI, the asv suite and the tests share. ``run_ab`` runs
the baseline and optimized stacks interleaved in one process, so that their MFU ratio holds
on a machine whose speed drifts.
"""

from __future__ import annotations

import datetime as dt
import resource
import secrets
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from gembench.harness.env import fingerprint
from gembench.harness.errors import UsageError
from gembench.harness.hardware import Peak, memory_available, reference_peak, resolve_device
from gembench.harness.metrics import counters as C
from gembench.harness.metrics import trace as TR
from gembench.harness.metrics.mfu import summarize
from gembench.harness.regression.results import SCHEMA
from gembench.harness.stack import STACKS, StackOptions, build_train_state
from gembench.harness.regression.stats import paired_ratio_interval
from gembench.harness.step import NoClock, StepSamples, run_steps, train_step
from gembench.models.config import ModelConfig, load_config
from gembench.models.data import SyntheticData
from gembench.models.flops import batch_forward_flops, embedding_bytes, memory_estimate

MAX_DISTINCT_BATCHES = 32  # batches are prepared up front and cycled, like a prefetching loader


def check_fits(cfg: ModelConfig, batch_size: int, device: torch.device, copies: int = 1) -> dict:
    """Refuse, before allocating anything, a config whose estimated memory exceeds the device's."""
    estimate = memory_estimate(cfg, batch_size)
    available = memory_available(device)
    if copies * estimate["total"] > 0.9 * available:
        gib = 2**30
        raise UsageError(
            f"config {cfg.name!r} needs about {copies * estimate['total'] / gib:,.1f} GiB "
            f"(embeddings {estimate['embeddings'] / gib:,.1f}, dense {estimate['dense'] / gib:,.1f}, "
            f"activations {estimate['activations'] / gib:,.1f}{', x2 for two stacks' if copies > 1 else ''}) "
            f"but {device.type} has {available / gib:,.1f} GiB free; pick a smaller config "
            "(see `gembench describe`)"
        )
    return estimate


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak: several runs in one process (asv, --ab, ablate) must not inherit one."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:  # Linux: writing 5 to clear_refs resets the process's peak RSS (VmHWM)
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def peak_memory_bytes(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "torch.cuda.max_memory_allocated"
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024, "peak RSS of the process since the run began"
    except OSError:
        pass
    # ru_maxrss (KiB on Linux) never resets: the peak of the whole process's life.
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "peak RSS of the process"


@dataclass
class Setup:
    """Everything a run needs besides the stack: config, device, peak, prepared batches."""

    cfg: ModelConfig
    device: torch.device
    peak: Peak
    seed: int
    batches: list
    estimate: dict


def prepare(config: str | ModelConfig, steps: int, warmup: int, device: str = "auto", seed: int = 0,
            peak_tflops: float | None = None, copies: int = 1) -> Setup:
    """Validate the request and prepare batches; every usage error surfaces here, before work."""
    if steps < 1:
        raise UsageError(f"--steps must be at least 1, got {steps}")
    if warmup < 0:
        raise UsageError(f"--warmup must be 0 or more, got {warmup}")
    cfg = config if isinstance(config, ModelConfig) else load_config(config)
    dev = resolve_device(device)
    estimate = check_fits(cfg, cfg.data.global_batch, dev, copies)
    peak = reference_peak(dev, peak_tflops)
    data = SyntheticData(cfg, seed=seed, batch_size=cfg.data.global_batch)
    batches = [data.batch(i) for i in range(min(steps + warmup, MAX_DISTINCT_BATCHES))]
    return Setup(cfg, dev, peak, seed, batches, estimate)


def step_flops(setup: Setup, first: int, count: int) -> list[dict[str, float]]:
    """Forward FLOPs per block of the batches that steps first..first+count-1 used."""
    n = len(setup.batches)
    cache = {}
    out = []
    for i in range(first, first + count):
        if i % n not in cache:
            cache[i % n] = batch_forward_flops(setup.cfg, setup.batches[i % n])
        out.append(cache[i % n])
    return out


def stack_result(setup: Setup, options: StackOptions, samples: StepSamples, warmup: int,
                 stack_name: str) -> dict:
    """Summary, samples and headline metrics of one stack's measured steps."""
    steps = len(samples.step_s)
    per_block = step_flops(setup, warmup, steps)
    forward = [sum(b.values()) for b in per_block]
    peak = setup.peak.tflops_per_device
    summary = summarize(samples.step_s, samples.stages, forward, setup.cfg.data.global_batch, peak)
    memory, memory_source = peak_memory_bytes(setup.device)
    summary["peak_memory_bytes"] = memory
    summary["peak_memory_source"] = memory_source
    summary["embedding_bytes_per_step"] = embedding_bytes(setup.cfg, setup.batches[warmup % len(setup.batches)])
    return {
        "stack": stack_name,
        "options": options.to_dict(),
        "flops": {
            "forward_per_step": float(np.mean(forward)),
            "model_per_step": 3.0 * float(np.mean(forward)),
            "per_block": {k: float(np.mean([b[k] for b in per_block])) for k in per_block[0]},
        },
        "samples": {
            "step_s": samples.step_s,
            "mfu": [3.0 * f / t / (peak * 1e12) for f, t in zip(forward, samples.step_s)],
            "loss": samples.loss,
            "stages": samples.stages,
        },
        "summary": summary,
    }


def document(setup: Setup, steps: int, warmup: int, main: dict, extra: dict | None = None) -> dict:
    """The result document (schema in regression/results.py) around one stack's measurements."""
    cfg, dev, peak = setup.cfg, setup.device, setup.peak
    created = dt.datetime.now(dt.timezone.utc)
    summary = main["summary"]
    result = {
        "schema": SCHEMA,
        "id": f"{created:%Y%m%dT%H%M%SZ}-{cfg.name}-{main['stack']}-{secrets.token_hex(3)}",
        "created": created.isoformat(timespec="seconds"),
        "config": {"name": cfg.name, "hash": cfg.hash, "path": cfg.source, "kind": cfg.kind},
        "run": {
            "steps": steps, "warmup": warmup,
            "dtype": "bf16" if main["options"]["bf16"] else "fp32",
            "device": str(dev), "seed": setup.seed, "stack": main["stack"], "options": main["options"],
            "nproc": 1, "global_batch": cfg.data.global_batch, "per_rank_batch": cfg.data.global_batch,
        },
        "env": fingerprint(dev),
        "peak": {"tflops_per_device": peak.tflops_per_device, "devices": 1, "dtype": peak.dtype,
                 "source": peak.source},
        "flops": {**main["flops"], "memory_estimate_bytes": setup.estimate},
        "samples": main["samples"],
        "summary": summary,
        "metrics": {
            "mfu": summary["mfu"],
            "step_time_s": summary["step_time_s"]["p50"],
            "examples_per_s": summary["examples_per_s"],
            "peak_memory_bytes": summary["peak_memory_bytes"],
        },
    }
    if extra:
        result.update(extra)
    return result


def step_costs(setup: Setup, state, index: int, compiled_since: dict, compiles: bool = True,
               trace_dir=None) -> tuple[dict, dict | None]:
    """Cost counters (metrics/counters.py) of two extra steps on batch ``index``, after the
    timed ones: the first counted (ops, host syncs), the second under torch.profiler (kernels,
    host-to-device bytes; with ``trace_dir`` its trace is kept as trace_dir/trace.json). Not one
    step: the counting dispatch mode re-dispatches every op, which the profiler records twice.

    Returns (counters, profile): profile = {trace, ranked, top} for the report, or None.
    ``compiles``: whether this stack uses torch.compile (its compile counts are the run's).
    """
    batch = setup.batches[index % len(setup.batches)]
    with C.StepCounter(setup.device, state.optimizers) as counted:
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
    return counts, profile


def with_costs(result: dict, counts: dict, profile: dict | None = None) -> dict:
    """Put the counters (and the profile's top ops) into a result document."""
    result["counters"] = counts
    result["metrics"].update(C.flat_metrics(counts))
    if profile is not None:
        result["profile"] = profile
    return result


def run_benchmark(config: str | ModelConfig, steps: int = 20, warmup: int = 3,
                  options: StackOptions = STACKS["optimized"], device: str = "auto", seed: int = 0,
                  peak_tflops: float | None = None, progress=None, stack_name: str = "optimized",
                  trace=None) -> dict:
    """Train ``config`` under one stack for ``warmup`` + ``steps`` steps; return the result.

    Two more steps after the timed ones measure the cost counters (and with ``trace``, a
    directory, keep the profiled one as trace/trace.json).
    """
    setup = prepare(config, steps, warmup, device, seed, peak_tflops)
    reset_peak_memory(setup.device)
    since = C.fresh_compile_state()
    state = build_train_state(setup.cfg, options, setup.device, seed=seed)
    samples = run_steps(state, setup.batches, steps, warmup, progress=progress)
    main = stack_result(setup, options, samples, warmup, stack_name)  # peak memory before profiling
    counts, profile = step_costs(setup, state, warmup + steps, since, options.compile, trace)
    return with_costs(document(setup, steps, warmup, main), counts, profile)


def run_ab(config: str | ModelConfig, rounds: int = 6, steps_per_round: int = 3, warmup: int = 3,
           device: str = "auto", seed: int = 0, peak_tflops: float | None = None, dtype: str | None = None,
           progress=None, trace=None) -> dict:
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
    setup = prepare(config, steps, warmup, device, seed, peak_tflops, copies=2)
    names = ("baseline", "optimized")
    opts = {n: STACKS[n] if dtype is None or n == "baseline" else replace(STACKS[n], bf16=dtype == "bf16")
            for n in names}
    reset_peak_memory(setup.device)
    since = C.fresh_compile_state()
    states = {n: build_train_state(setup.cfg, opts[n], setup.device, seed=seed) for n in names}
    collected = {n: StepSamples() for n in names}
    per_round = {n: [] for n in names}
    for n in names:  # warm-up (and compilation) outside the measurement
        run_steps(states[n], setup.batches, 0, warmup)
    done, total = 0, 2 * steps
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for n in order:
            batches = [setup.batches[(warmup + r * steps_per_round + i) % len(setup.batches)]
                       for i in range(steps_per_round)]
            s = run_steps(states[n], batches, steps_per_round, 0)
            per_round[n].append(float(np.median(s.step_s)))
            collected[n].step_s += s.step_s
            collected[n].loss += s.loss
            for stage, v in s.stages.items():
                collected[n].stages[stage] += v
            done += steps_per_round
            if progress is not None:
                progress(done, total, s.step_s[-1])
    # Same batches for both stacks in each round, so per-round FLOPs are equal: the MFU
    # ratio is the inverse step-time ratio.
    ratios = [b / o for b, o in zip(per_round["baseline"], per_round["optimized"])]
    center, lo, hi = paired_ratio_interval(ratios)
    results = {n: stack_result(setup, opts[n], collected[n], warmup, n) for n in names}
    # only the optimized stack compiles, so the run's compile counts are its own
    costs = {n: step_costs(setup, states[n], warmup + steps, since, opts[n].compile,
                           trace if n == "optimized" else None) for n in names}
    ab = {"rounds": rounds, "steps_per_round": steps_per_round, "order": "ABBA",
          "round_step_s": per_round, "round_ratios": ratios,
          "mfu_ratio": center, "mfu_ratio_ci95": [lo, hi],
          "baseline": {k: results["baseline"][k] for k in ("options", "flops", "samples", "summary")}}
    ab["baseline"]["counters"] = costs["baseline"][0]
    doc = with_costs(document(setup, steps, warmup, results["optimized"], {"ab": ab}), *costs["optimized"])
    doc["run"]["stack"] = "ab"
    doc["metrics"]["ab_mfu_ratio"] = center
    doc["metrics"]["baseline_mfu"] = results["baseline"]["summary"]["mfu"]
    return doc
