"""One benchmark run on one process: config -> model + data -> staged steps -> result document.

This is the library entry point the CLI, the asv suite and the tests share. ``run_ab`` runs
the baseline and optimized stacks interleaved in one process, so that their MFU ratio holds
on a machine whose speed drifts.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from gembench.errors import UsageError
from gembench.harness.device.hardware import (
    Bandwidth,
    Peak,
    keep_freed_memory,
    memory_available,
    reference_bandwidth,
    reference_peak,
    resolve_device,
)
from gembench.harness.metrics import counters, trace
from gembench.harness.metrics.startup import Startup
from gembench.harness.regression.stats import paired_ratio_interval
from gembench.harness.store.results import writable_folder
from gembench.harness.train import checkpoint, nvtx
from gembench.harness.train.measure import Measurement, RunMemory, World, measure
from gembench.harness.train.memory import (
    FIT_SHARE,
    activations_estimated,
    check_fits,
    fit_hint,
    memory_estimate,
    parameter_shapes,
    peak_memory_bytes,
    reset_peak_memory,
)
from gembench.harness.train.parallelize import dense_state_bytes, sparse_modules
from gembench.harness.train.result import ProcessRecord, build_result, process_record, recheck
from gembench.harness.train.runconfig import RunConfig
from gembench.harness.train.stack import STACKS, StackOptions, autocast_for, build_train_state
from gembench.harness.train.step import ProcessEngine, StepSamples, out_of_memory
from gembench.harness.train.work import Work, described, stack_flops, variant_work
from gembench.harness.train.workloads import Identity, applied_switches, identity, prepared, section, workload_of
from gembench.workload import Workload

MAX_DISTINCT_BATCHES = 32  # batches are prepared up front and cycled, like a prefetching loader


@dataclass
class Setup:
    """Everything a run needs besides the stack: the request, the workload (as it runs on this
    device), the device, peak, batches and their FLOPs, the memory estimate it was checked by."""

    run: RunConfig
    workload: Workload
    ident: Identity
    device: torch.device
    peak: Peak
    batches: list
    work: Work  # the FLOPs of the workload as given (for_stack may differ: work_of)
    estimate: dict
    counts: dict  # parameter_shapes
    sparse: int  # TorchRec modules in the model
    available: float = 0.0  # free device memory when the run was prepared
    bandwidth: Bandwidth | None = None  # the op table's memory roofline
    startup: Startup = field(default_factory=Startup)  # the run's start-up clock, until its first timed step
    saves: dict | None = None  # saves_of: the checkpoint manifest, the save resumed, its step
    _variants: dict = field(default_factory=dict)  # StackOptions -> the Work of its variant (work_of)

    def variant(self, options: StackOptions) -> Workload:
        """The workload as ``options`` runs it (for_stack: the zoo's attention kernel, content)."""
        return self.workload.for_stack(options)

    def work_of(self, options: StackOptions) -> Work:
        """The FLOPs of what ``options`` runs (variant_work: its formula, what it executes beyond
        it), once per variant."""
        variant = self.variant(options)
        if variant is self.workload or self.work.basis != "formula":
            return self.work
        if options not in self._variants:
            autocast = autocast_for(options, self.device)
            self._variants[options] = variant_work(
                self.work, variant, self.batches, autocast, self.device, self.run.seed
            )
        return self._variants[options]

    def compiles(self, stacks) -> bool:
        """Whether any of ``stacks`` compiles something of this workload (its compiled() names it)."""
        return any(o.compile and bool(self.variant(o).compiled()) for o in stacks)

    def identity(self, variant: Workload) -> Identity:
        return self.ident if variant is self.workload else identity(variant, self.run.seed)


def prepare(run: RunConfig, stacks: list[StackOptions], startup: Startup | None = None) -> Setup:
    """Validate the request and prepare batches; every usage error surfaces here, before work.

    ``stacks``: every stack the process will hold (for the memory check). ``run.config`` is a
    config name, a .toml path or (library callers) a ModelConfig; ``run.model`` a workload's spec.
    The model is built once here, on the run's device, for its FLOPs count (then dropped).
    ``startup``: the run's start-up clock, told the phases.
    """
    startup = startup or Startup()
    with startup.phase("config"):
        run.check(distributed=False)
        dev = resolve_device(run.device)
        keep_freed_memory()
        workload = workload_of(run.config, run.model, run.model_args, run.batch).on_device(dev.type)
        for options in stacks:  # a switch the model cannot take is refused before anything is built
            applied_switches(workload.for_stack(options), options)
        meta = workload.build(torch.device("meta"))
        counts, sparse = parameter_shapes(workload, meta), len(sparse_modules(meta))
        estimate = check_fits(workload, counts, workload.global_batch, dev, stacks)
        available = float(memory_available(dev))
    with startup.phase("peak"):
        peak = reference_peak(dev, run.peak_tflops)
        bandwidth = reference_bandwidth(dev, run.bandwidth_gbs)
    with startup.phase("data"):
        count = min(run.steps + run.warmup, MAX_DISTINCT_BATCHES)
        if checkpoint.wanted(run):
            count = MAX_DISTINCT_BATCHES  # step i trains on batch i of one cycle, however long the run
        batches, ident = prepared(workload, run.seed, count=count, meta=meta)
        del meta
    with startup.phase("flops"):
        counting = next((o for o in stacks if o.bf16), stacks[0])  # a model may need its stack's precision
        work = stack_flops(workload, workload, batches, autocast_for(counting, dev), dev, run.seed)
    setup = Setup(
        run, workload, ident, dev, peak, batches, work, estimate, counts, sparse, available, bandwidth, startup=startup
    )
    setup.saves = saves_of(setup, stacks)
    return setup


def saves_of(setup: Setup, stacks: list[StackOptions]) -> dict | None:
    """--checkpoint-every and --resume, checked before any work (checkpoint.plan)."""
    run = setup.run
    if not checkpoint.wanted(run):
        return None
    return checkpoint.plan(run, checkpoint.manifest_of(setup.ident, 1, stacks[0].to_dict(), run.seed))


def build_state(setup: Setup, options: StackOptions):
    """The stack applied to the run's model, as the stack runs it."""
    return build_train_state(setup.variant(options), options, setup.device, seed=setup.run.seed)


@dataclass
class Measured:
    """One stack's measurement on this process, before it is summarized against the peak."""

    name: str
    options: StackOptions
    measurement: Measurement
    dense_state: dict  # parallelize.dense_state_bytes of the dense part
    profile: dict | None = None  # --trace: the kept trace and its top ops, for the report


def dense_state(state) -> dict:
    """The dense weights, gradients and optimizer state of a one-process model (its last
    optimizer is the dense one: stack.build_train_state)."""
    return dense_state_bytes(state.dense_params, state.optimizers[-1])


def trace_path(trace_dir) -> Path | None:
    return None if trace_dir is None else Path(trace_dir) / "trace.json"


def profile_of(setup: Setup, measurement: Measurement, trace_dir) -> dict | None:
    """--trace DIR: where the profiled step's trace is kept and its top ops (the report's table)."""
    if trace_dir is None:
        return None
    ranked, rows = trace.top_rows(measurement.events, setup.device)
    return {"trace": str(trace_path(trace_dir)), "ranked": ranked, "top": rows}


def measure_stack(setup: Setup, options: StackOptions, name: str, progress=None, pace=None, trace=None) -> Measured:
    """A stack built and measured on this process (measure.measure, a world of one): `gembench
    run` and `gembench ablate` (one variant each) go through here; --ab takes turns between two
    stacks (run_ab) and then follows the same summary."""
    run = setup.run
    nvtx.enable_from_env(setup.device)  # gembench run --nsys: ranges for Nsight Systems
    start = reset_peak_memory(setup.device)
    since = counters.fresh_compile_state()  # this stack's compile counts are its own
    with out_of_memory_guard(setup, [options]):
        with setup.startup.phase("build"):
            state = build_state(setup, options)
        saves, saver = setup.saves, None
        first = saves["first"] if saves is not None else 0
        if saves is not None and saves["resume"] is not None:
            with setup.startup.phase("restore"):
                checkpoint.restore(checkpoint.of_process(state), saves["resume"], first)
        if run.checkpoint_every is not None:
            writable_folder(run.checkpoint_dir, "--checkpoint-dir")
            saver = checkpoint.Saver(
                checkpoint.of_process(state),
                run.checkpoint_every,
                run.checkpoint_dir,
                saves["manifest"],
                first,
                saves["due"],
                startup=setup.startup,
            )
        measured = measure(
            ProcessEngine(state, setup.batches),
            World(),
            run.warmup,
            run.steps,
            start_bytes=start,
            compile_since=since if options.compile else None,
            trace_path=trace_path(trace),
            progress=progress,
            pace=pace,
            startup=setup.startup,
            first=first,
            after_step=saver,
        )
        if saves is not None:
            measured.checkpoint = {
                **(saver.record() if saver is not None else {}),
                **({"resumed_from": str(saves["resume"]), "resumed_at": first} if saves["resume"] else {}),
            }
    return Measured(name, options, measured, dense_state(state), profile_of(setup, measured, trace))


def record_of(setup: Setup, m: Measured, estimate: dict | None = None) -> ProcessRecord:
    """The process record (train/result.py) of one measured stack. ``estimate``: the memory
    estimate to hold the run against (default: this stack's own)."""
    run, variant = setup.run, setup.variant(m.options)
    steps = len(m.measurement.samples.step_s)
    shape = described(variant, setup.work_of(m.options), setup.batches, run.warmup, steps, m.options)
    estimate = estimate or memory_estimate(variant, setup.counts, variant.global_batch, m.options, setup.device.type)
    host_peak = setup.peak if setup.peak.calibration else None  # one process: the host's own peak
    return process_record(
        setup.device, World(), m.measurement, setup.peak, host_peak, shape, estimate, m.dense_state, setup.bandwidth
    )


def summarized(setup: Setup, measured: list[Measured], estimate: dict | None = None) -> list[dict]:
    """The result of each measured stack, after one check of the peak against all of them: a
    calibrated peak they beat is re-measured (hardware.recheck_peak) and every figure is then
    taken against the new one, so the stacks of one run share one peak."""
    records = [record_of(setup, m, estimate) for m in measured]
    labels = [""] if len(measured) == 1 else [f" of {m.name}" for m in measured]
    new = recheck(setup.peak, records, labels)
    if new is not None:
        setup.peak = new
    results = []
    for m, r in zip(measured, records):
        variant = setup.variant(m.options)
        ident = setup.identity(variant)
        result = build_result(ident, setup.run, [r], m.options, stack=m.name)
        if m.profile is not None:
            result["profile"] = m.profile
        result["workload"] = section(variant, ident, setup.work.basis, m.options, setup.batches[0], setup.sparse)
        results.append(result)
    return results


@contextlib.contextmanager
def out_of_memory_guard(setup: Setup, stacks: list[StackOptions]):
    """Turn a device out-of-memory error anywhere in the run into one line: the stage (the step
    names it; otherwise the stack was being built), the peak reached, and the largest --batch the
    estimate says fits, corrected by how far this run's real peak outgrew it. Nothing is written."""
    try:
        yield
    except RuntimeError as err:  # torch.OutOfMemoryError is one, as are compile errors wrapping it
        if out_of_memory(err) is None:
            raise
        stage = getattr(err, "stage", "build (model, embeddings and optimizers)")
        peak, source = peak_memory_bytes(setup.device)
        batch = setup.workload.global_batch
        capacity = FIT_SHARE * setup.available * min(1.0, setup.estimate["total"] / max(peak, 1))
        if activations_estimated(setup.workload):
            hint = fit_hint(setup.workload, setup.counts, stacks, setup.device.type, capacity, max(batch - 1, 1))
        else:
            hint = "try a smaller --batch (the workload's activations are not estimated)"
        gib = 2**30
        raise UsageError(
            f"{setup.device} ran out of memory in stage {stage} ({setup.workload.name!r}, batch {batch}): "
            f"peak {peak / gib:,.2f} GiB ({source}) of {setup.available / gib:,.1f} GiB free at the start, "
            f"estimate {setup.estimate['total'] / gib:,.2f} GiB; {hint}; no result was written"
        ) from None


def run_benchmark(run: RunConfig, progress=None, on_prepared=None, pace=None, startup: Startup | None = None) -> dict:
    """Train ``run.config`` under ``run.options`` for ``run.warmup`` + ``run.steps`` steps on one
    process; return the result document.

    ``on_prepared(compiles)`` is called once the request is validated and fits, before any work
    (``compiles``: whether the first warm-up step compiles anything). Two more
    steps after the timed ones measure the cost counters (and with ``run.trace``, a directory,
    keep the profiled one as trace/trace.json). ``pace`` takes turns with another process
    (continuous/interleave.py's Pacer, `gembench run --pace`). ``startup``: the run's start-up
    clock (metrics/startup.py; by default it starts here).
    """
    setup = prepare(run, [run.options], startup)
    if on_prepared is not None:
        on_prepared(setup.compiles([run.options]))
    m = measure_stack(setup, run.options, run.stack, progress=progress, pace=pace, trace=run.trace)
    (result,) = summarized(setup, [m], setup.estimate)  # the estimate prepare() checked, not a second one
    return result


def ab_stacks(run: RunConfig) -> dict[str, StackOptions]:
    """--ab's two sides: the baseline stack, and the stack --stack, --dtype and --set describe."""
    return {"baseline": STACKS["baseline"], "optimized": run.options}


def run_ab(run: RunConfig, progress=None, on_prepared=None) -> dict:
    """The baseline stack and ``run``'s stack interleaved in one process, ABBA order, same weights.

    Each of ``run.rounds`` rounds times steps/rounds steps of each stack over the same batches; the
    ratio of their MFU per round is paired, so slow phases of a shared machine hit both stacks
    alike. The headline ``ab_mfu_ratio`` is the geometric mean over rounds with a 95% t-interval.
    Cost counters: extra steps of each stack after the rounds (the result's are the measured
    stack's, the baseline's are in ab.baseline.counters).
    """
    run = replace(run, steps=run.rounds * (run.steps // run.rounds), ab=True)
    opts = ab_stacks(run)
    setup = prepare(run, list(opts.values()))
    if on_prepared is not None:
        on_prepared(setup.compiles(opts.values()))
    start = reset_peak_memory(setup.device)
    since = counters.fresh_compile_state()
    with out_of_memory_guard(setup, list(opts.values())):
        return _run_ab(setup, opts, progress, start, since)


def _run_ab(setup: Setup, opts: dict[str, StackOptions], progress, start, since) -> dict:
    run = setup.run
    names, steps_per_round = list(opts), run.steps // run.rounds
    engines = {n: ProcessEngine(build_state(setup, opts[n]), setup.batches) for n in names}
    collected = {n: StepSamples() for n in names}
    per_round = {n: [] for n in names}
    for n in names:  # warm-up (and compilation) outside the measurement
        measure(engines[n], World(), run.warmup, 0, costs=False)
    done, total = 0, 2 * run.steps
    for r in range(run.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for n in order:
            first = run.warmup + r * steps_per_round
            s = measure(engines[n], World(), 0, steps_per_round, costs=False, first=first).samples
            per_round[n].append(float(np.median(s.step_s)))
            collected[n].extend(s)
            done += steps_per_round
            if progress is not None:
                progress(done, total, s.step_s[-1])
    # Same batches for both stacks in each round, so per-round FLOPs are equal: the MFU
    # ratio is the inverse step-time ratio.
    ratios = [b / o for b, o in zip(per_round["baseline"], per_round["optimized"])]
    center, lo, hi = paired_ratio_interval(ratios)
    # One process held both stacks: its peak is theirs together, against their combined estimate.
    memory = RunMemory.now(setup.device, start)
    measured = []
    for n in names:  # only the measured stack may compile, so the run's compile counts are its own
        trace_dir = run.trace if n == "optimized" else None
        costs = measure(
            engines[n],
            World(),
            0,
            0,
            compile_since=since if opts[n].compile else None,
            trace_path=trace_path(trace_dir),
            first=run.warmup + run.steps,
        )
        costs = replace(costs, samples=collected[n], memory=memory)
        state = engines[n].state
        measured.append(Measured(n, opts[n], costs, dense_state(state), profile_of(setup, costs, trace_dir)))
    base, doc = summarized(setup, measured, setup.estimate)
    doc["ab"] = {
        "rounds": run.rounds,
        "steps_per_round": steps_per_round,
        "order": "ABBA",
        "round_step_s": per_round,
        "round_ratios": ratios,
        "mfu_ratio": center,
        "mfu_ratio_ci95": [lo, hi],
        "baseline": {
            "options": base["run"]["options"],
            **{k: base[k] for k in ("flops", "samples", "summary", "counters")},
        },
    }
    doc["run"]["stack"] = "ab"
    doc["metrics"]["ab_mfu_ratio"] = center
    doc["metrics"]["baseline_mfu"] = base["summary"]["mfu"]
    base_diverged = base.get("diverged")
    if base_diverged and (not doc.get("diverged") or base_diverged["step"] < doc["diverged"]["step"]):
        doc["diverged"] = {**base_diverged, "stack": "baseline"}
    elif doc.get("diverged"):
        doc["diverged"]["stack"] = "optimized"
    return doc
