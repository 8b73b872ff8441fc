"""One rank of a distributed `gembench run`: set up, time the steps, profile, hand rank 0 the record.

Every rank builds the same workload's model from the same seed, shards it with the same plan
(TorchRec's planner, told the workload's pooling, its sharders and constraints where it gives
them; DMP; the unsharded weights written into the shards), and trains on its own slice of the
global batch (the workload's batch(i, rank, world, seed)). FSDP2, checkpointing and compile come
from parallelize.py as on one process; the step is one of engines.py's. After the timed steps it runs
one whose costs it counts (metrics/counters.py) and a few more under torch.profiler for the
communication figures (so counting and profiling cost the timed steps nothing), counts its real
lookup load, and sends one record to rank 0, which assembles
the job's single result (result.py) and writes it.
"""

from __future__ import annotations

import contextlib
import gc
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from gembench.errors import UsageError
from gembench.harness.device.hardware import cpu_peak, reference_peak, resolve_device
from gembench.harness.metrics import comm
from gembench.harness.metrics import counters as C
from gembench.harness.metrics import trace as TR
from gembench.harness.metrics.imbalance import hot_share
from gembench.harness.train import model as M
from gembench.harness.train import nvtx
from gembench.harness.train.distributed import engines as E
from gembench.harness.train.distributed import library_logs
from gembench.harness.train.distributed import loads as L
from gembench.harness.train.distributed import plan as P
from gembench.harness.train.distributed import process_group as PG
from gembench.harness.train.distributed import watchdog as W
from gembench.harness.train.memory import (
    SavedForBackward,
    memory_fields,
    peak_memory_bytes,
    reset_peak_memory,
    run_memory_bytes,
)
from gembench.harness.train.progress import Progress
from gembench.harness.train.result import Sharded, build_result, process_record, recheck, timed_batches
from gembench.harness.train.runconfig import RunConfig
from gembench.harness.train.runner import MAX_DISTINCT_BATCHES
from gembench.harness.train.step import StageClock, losses, timed_steps
from gembench.loader import kjt_fields, named
from gembench.workload import Workload

COUNTED_STEPS = 1  # an extra step after the timed ones, its cost counters taken (no profiler:
# the counting dispatch mode re-dispatches every op, which the profiler would record twice)
PROFILED_STEPS = 2  # extra steps under the profiler, after that
LOAD_BATCHES = 8  # batches whose real input dist is counted for the measured load
STEP_SPAN = TR.STEP_SPAN


def per_rank_batch(global_batch: int, world_size: int) -> int:
    if global_batch % world_size:
        raise UsageError(
            f"global batch {global_batch} does not split evenly over {world_size} ranks: "
            f"pick a rank count that divides it (each rank trains global / ranks examples)"
        )
    return global_batch // world_size


def main(args: RunConfig, env: dict) -> int:
    """Run this rank; rank 0 writes the result. Exit status: 0, 2 (usage), 1 (failure)."""
    from gembench.harness.store.reservation import HELD_ENV, OUTCOME_ENV, Reservation, write_or_fallback
    from gembench.harness.store.results import RUNS_DIR

    rank = env["rank"]
    watchdog = reservation = None
    finished = False  # every rank got through its job: they can part together
    try:
        held = os.environ.get(HELD_ENV)
        if rank == 0 and args.out is not None and held != str(Path(args.out).resolve()):
            reservation = Reservation.take(args.out)  # plain torchrun: rank 0 holds --out itself
        fault = W.Fault.from_env()
        dev = PG.rank_device(str(resolve_device(args.device)), env["local_rank"])
        PG.init_process_group(dev, args.timeout)
        store = getattr(dist.distributed_c10d, "_get_default_store", lambda: None)()
        watchdog = W.Watchdog(rank, env["world_size"], args.timeout, store)
        result = run(args, env, dev, watchdog, fault)
        if rank == 0:
            from gembench.harness.report.tables import distributed_report

            out = args.out or RUNS_DIR / f"{result['id']}.json"
            print(distributed_report(result), flush=True)  # the figures first: the write may fail
            try:
                write_or_fallback(out, result)
            except UsageError as err:
                print(f"gembench run: error: {err}", file=sys.stderr, flush=True)
                finished = True
                if os.environ.get(OUTCOME_ENV):  # our launcher turns this into exit 2
                    Path(os.environ[OUTCOME_ENV]).write_text("write-failed\n")
                    return 0
                return 2
            print(f"\nresult: {out}", flush=True)
            if library_logs.hidden_note(rank):
                print(library_logs.hidden_note(rank), file=sys.stderr, flush=True)
        finished = True
        return 0
    except UsageError as err:
        print(f"gembench run: error: rank {rank}: {err}", file=sys.stderr, flush=True)
        return 2
    except BaseException as err:  # noqa: BLE001  every failure names its rank and stage
        W.report_failure(rank, watchdog, err)
        return 1
    finally:
        if reservation is not None:
            reservation.release()
        if watchdog is not None:
            watchdog.stop()
        if dist.is_initialized():
            if finished:  # the other ranks wait for rank 0's writing: no rank tears gloo down under a live peer
                try:
                    dist.barrier()
                except Exception:  # noqa: BLE001  a peer already gone: parting is all that is left
                    pass
            dist.destroy_process_group()


def check(args: RunConfig, nproc: int) -> Workload:
    """What every rank of an ``nproc``-rank job would refuse, before launching (no device is
    looked at): the model, its batch split, the switches, the pipeline's fields, the sharding spec,
    --rebalance. The workload, as the ranks will load it."""
    from torchrec import EmbeddingBagConfig

    from gembench.harness.train.stack import on_ranks

    workload = M.workload_of(args.config, args.model, args.model_args, args.batch, nproc)
    per_rank_batch(workload.global_batch, nproc)
    options = on_ranks(args.options, args.pipeline)
    variant = workload.for_stack(options)
    M.applied_switches(variant, options)
    if args.pipeline:
        module_fields(variant, variant.build(torch.device("meta")), workload.batch(0, 0, nproc, args.seed), True)
    tables = variant.tables()
    forced = P.parse_sharding(args.sharding, [t.name for t in tables])
    # TorchRec's EmbeddingCollection (unpooled tables) shards table-, row- or column-wise only
    odd = sorted(
        t.name.removeprefix("table_")
        for t in tables
        if not isinstance(t, EmbeddingBagConfig) and forced.get(t.name) not in (None, *UNPOOLED_TYPES)
    )
    if odd:
        raise UsageError(
            f"--sharding: sequence table(s) {', '.join(odd)} can only be {', '.join(UNPOOLED_TYPES)} "
            f"in TorchRec; add e.g. {odd[0]}=row_wise to the spec"
        )
    if args.rebalance:
        from gembench.harness.train.distributed.rebalance import check as check_rebalance

        check_rebalance(args.sharding, forced, [t.name for t in tables], nproc, args.pipeline)
    return workload


def run(args: RunConfig, env: dict, dev: torch.device, watchdog: W.Watchdog, fault) -> dict:
    """This rank's whole job; the result on rank 0 ({} on the others).

    With --rebalance the job runs three times: on the planner's plan, then, after a re-plan from
    the load measured on it (rebalance.py), on the new plan with the trained state carried over
    (carry.py), then on the planner's plan again (rebalanced); the result is the second run's,
    the others' figures in its ``rebalance`` section.
    """
    from gembench.harness.train.distributed import rebalance as RB
    from gembench.harness.train.stack import on_ranks

    rank, world = env["rank"], env["world_size"]
    workload = check(args, world).on_device(dev.type)  # on CPU the zoo caps its tables
    local_batch = per_rank_batch(workload.global_batch, world)
    # the peaks first: calibrating one (large GEMMs) must not count as the run's memory
    watchdog.at("peak")
    peak, host_peak = _peaks(dev, args, env)
    # The stack from harness/train/stack.py, as on one process: kernels, precision, compile, optimizer
    # and learning rates; embeddings are always fbgemm's fused TBE under DMP, and overlap is the
    # --pipeline switch (stack.on_ranks).
    options = on_ranks(args.options, args.pipeline)
    variant = workload.for_stack(options)  # the model this stack runs (the zoo's content=off, attention)
    watchdog.at("data")
    total = args.warmup + args.steps + COUNTED_STEPS + PROFILED_STEPS
    batches = [workload.batch(i, rank, world, args.seed) for i in range(min(total, MAX_DISTINCT_BATCHES))]
    meta = variant.build(torch.device("meta"))  # its shapes, for the identity and the memory estimate
    ident = M.identity(variant, args.seed, meta)
    data = _Data(workload, variant, batches, [], "", M.parameter_shapes(variant, meta))
    del meta
    expected = declared_pooling(variant)
    pooling = None if args.sharding == UNTOLD else variant.pooling()
    me = _Rank(args, env, dev, options, local_batch, watchdog, fault, peak, host_peak)

    def result_of(records, job, batches, peak_check: bool = False):
        result = job_result(me, ident, records, job, batches, peak_check)
        if result is not None:
            result["workload"] = M.section(variant, ident, data.basis, options, batches[0], job.modules)
        return result

    def build(me, pooling, measured=None):
        return _build(me, data, pooling, measured)

    def measure(job, me):
        return _measure(job, me, data)

    job = build(me, pooling)
    record, batches = measure(job, me)
    records = _gather(record, rank, world, watchdog)
    if not args.rebalance:
        return result_of(records, job, batches, peak_check=True) or {}
    rows = {t.name: t.num_embeddings for t in variant.tables()}
    table_of = {f: t.name for t in variant.tables() for f in t.feature_names}

    def counts_of(host):
        return RB.host_counts([(local_batch, list(kjt_fields(b).values())) for b in host], rows, table_of)

    return rebalanced(me, job, record, records, batches, counts_of, rows, pooling, expected, build, measure, result_of)


def job_result(me: "_Rank", model, records, job, batches, peak_check: bool = False) -> dict | None:
    """Rank 0: the job's result from every rank's records (None elsewhere); ``model``: the
    identity of the model as run (model.Identity); ``peak_check``: the peak checked first (over
    this host's ranks), on the run the result is of."""
    args = me.args
    if me.env["rank"] != 0:
        return None
    if peak_check:
        me.watchdog.at("peak check")
        mine = [r for r in records if r["host"] == socket.gethostname()]
        recheck(me.peak, mine, [f" of rank {r['rank']}" for r in mine])
    sharded = Sharded(
        job.planned, _indices(args, batches), dist.get_backend(), args.sharding, args.pipeline, args.timeout
    )
    return build_result(model, args, records, me.options, sharded)


def rebalanced(
    me, job, record, records, batches, counts_of, rows, pooling, expected, build, measure, result_of
) -> dict:
    """--rebalance after the first run (``job``, its ``record``, rank 0's ``records``): the
    planner's plan (A), the re-planned one (B), then A again, each on the state the run before it
    trained, so that drift over the three runs cancels in B against A and A'.
    ``counts_of(batches)`` is rebalance.host_counts over this rank's host batches, ``rows``
    {table: rows}, ``pooling`` what the first plan was told, ``expected`` the pooling the model
    declares; ``build(me, pooling, measured)`` -> job (with .dmp, .planned,
    .optimizer), ``measure(job, me)`` -> (record, batches), ``result_of(records, job, batches,
    peak_check)`` the result on rank 0 (None elsewhere)."""
    from gembench.harness.train.distributed import rebalance as R

    args, rank, world, watchdog = me.args, me.env["rank"], me.env["world_size"], me.watchdog
    watchdog.at("rebalance")
    counts = [None] * world  # on the batches measure_loads counted
    dist.all_gather_object(counts, counts_of(timed_batches(batches, args.warmup, args.steps)[:LOAD_BATCHES]))
    loads = [None] * world
    dist.all_gather_object(loads, record["loads"])
    measured = R.Measured.from_ranks(counts, loads, rows)
    skew = R.row_skew(measured, job.planned.tables)

    before = result_of(records, job, batches)
    _say(
        args,
        rank,
        "re-planning from the measured load: pooling "
        + ", ".join(f"{t.removeprefix('table_')} {v:.1f}" for t, v in measured.pooling.items())
        + f"; lookup {measured.seconds_per_byte * 1e9:.2f} ns/byte",
    )
    job, carried = _rebuild(job, me, build, measured.pooling, R.MeasuredLookups(measured))
    gc.collect()  # the first model, now unreferenced, before the second is timed
    record, batches = measure(job, me)
    records = _gather(record, rank, world, watchdog)
    result = result_of(records, job, batches, peak_check=True)
    _say(args, rank, "the planner's plan once more, after the rebalanced one")
    job, _ = _rebuild(job, me, build, pooling)
    gc.collect()
    record, batches = measure(job, me)
    records = _gather(record, rank, world, watchdog)
    if rank != 0:
        return {}
    result["rebalance"] = R.section(before, result, result_of(records, job, batches), measured, expected, skew, carried)
    return result


def _rebuild(old, me: "_Rank", build, pooling: dict | None, measured=None):
    """The model built again (``build``) on a new plan, ``old``'s trained state carried into it:
    (job, carried). torch.compile's caches of the old model are dropped (the new one compiles on
    its first step anyway), so that nothing of it outlives the caller's last reference."""
    from gembench.harness.train.distributed.carry import carry_state

    job = build(me, pooling, measured)
    me.watchdog.at("carry")
    carried = carry_state(old.dmp, job.dmp, old.optimizer, job.optimizer)
    torch._dynamo.reset()
    return job, carried


UNTOLD = "untold"  # --sharding untold: TorchRec's planner without the tables' pooling (its default)


@dataclass
class _Rank:
    """What every build and measurement of this rank's job shares: the request, the torchrun
    environment, the device, the stack as run, the per-rank batch, the watchdog, an injected
    fault (tests), this rank's peak and its host's."""

    args: RunConfig
    env: dict
    dev: torch.device
    options: object
    local_batch: int
    watchdog: W.Watchdog
    fault: object
    peak: object
    host_peak: object


@dataclass
class _Data:
    """What every build of one rank's job trains on: the workload (its batches') and the model
    the stack runs (``variant``), this rank's batches, their FLOPs and basis (from the first
    build's unsharded model), and the model's parameter counts."""

    workload: Workload
    variant: Workload
    batches: list
    flops: list  # per batch {block: forward FLOPs}
    basis: str
    counts: dict


@dataclass
class _Job:
    """One build of the model on this rank: DMP over it, the planner's view, (batch field, sharded
    module) of each module fed one field whole (none: the forward runs whole), the staged engine
    (None under --pipeline: made in _measure)."""

    dmp: torch.nn.Module
    planned: P.PlanRecorder
    feeds: list | None
    engine: E.StagedStep | None
    start_bytes: int  # the rank's memory floor when the build began
    modules: int  # the model's TorchRec modules

    @property
    def optimizer(self):
        """The dense optimizer (--rebalance carries its state; it refuses the pipeline)."""
        return self.engine.optimizer


def _build(me: _Rank, data: _Data, pooling: dict | None, measured=None) -> _Job:
    """The model from the seed with checkpointing, TorchRec's plan (told ``pooling``; ``measured``:
    rebalance.MeasuredLookups) and DMP, the unsharded weights written into the shards, then FSDP2
    over the dense part (dense_parallel=fsdp|hsdp), compile, and the staged engine."""
    from gembench.harness.train.parallelize import apply_compile, apply_fsdp, dense_mesh, fsdp_units, sparse_modules
    from gembench.harness.train.stack import autocast_for, seeded_model

    args, env, dev, options, variant = me.args, me.env, me.dev, me.options, data.variant
    me.watchdog.at("build")
    start_bytes = reset_peak_memory(dev)  # the rank's floor: what was loaded before the run
    model = seeded_model(variant, options, dev, args.seed)  # same seed on every rank: identical weights
    if not data.flops:  # on the unsharded model, before DMP takes it
        autocast = autocast_for(options, dev)
        data.flops, data.basis = M.stack_flops(data.workload, variant, data.batches, autocast, dev, args.seed, model)
    fields = module_fields(variant, model, data.batches[0], required=args.pipeline)
    modules = len(sparse_modules(model))
    sharded = model
    if args.pipeline:  # its TorchRec modules lifted out where the pipeline's tracer finds them
        sharded = E.TrainModule(model, fields, lambda m, b: losses(variant, variant.forward(m, b), b))
        fields = {f"embedding_{i}": field for i, field in enumerate(fields.values())}
    # the unsharded tables, by reference: every rank starts from the weights one process would
    unsharded = {k: v.detach() for k, v in sharded.state_dict().items()}
    me.watchdog.at("plan")
    ddp = args.pipeline and options.dense_parallel == "ddp"  # the staged step syncs gradients itself
    dmp, planned = shard(
        variant, sharded, env, dev, me.local_batch, args.sharding, pooling, measured, ddp, args.rebalance
    )
    load_unsharded(dmp, unsharded)
    del unsharded
    if options.dense_parallel != "ddp":  # FSDP2 on the dense blocks DMP left plain
        mesh = dense_mesh(options.dense_parallel, env["world_size"], env["local_world_size"], dev.type)
        apply_fsdp(model, mesh, options.bf16, *fsdp_units(variant, model))
    apply_compile(variant, model, options)  # the dense part, after DMP has taken the tables
    feeds = None if fields is None else [(field, dmp.module.get_submodule(path)) for path, field in fields.items()]
    engine = None if args.pipeline else E.StagedStep(dmp, dev, env["world_size"], options, variant, feeds)
    return _Job(dmp, planned, feeds, engine, start_bytes, modules)


def _measure(job: _Job, me: _Rank, data: _Data) -> tuple[dict, list]:
    """Time, count and profile this rank's steps on ``job``: its record for rank 0, and the batches."""
    from gembench.harness.train.parallelize import dense_shards, dense_state_bytes
    from gembench.harness.train.stack import autocast_for

    args, env, dev, options, batches = me.args, me.env, me.dev, me.options, data.batches
    rank, world, dmp, watchdog = env["rank"], env["world_size"], job.dmp, me.watchdog
    total = args.warmup + args.steps + COUNTED_STEPS + PROFILED_STEPS
    timed = timed_batches(batches, args.warmup, args.steps)
    watchdog.at("load count")
    # before the pipeline rewrites the modules' input dist for its own schedule
    loads = L.measure_loads(job.feeds or [], timed[:LOAD_BATCHES], dev)
    per_block = timed_batches(data.flops, args.warmup, args.steps)
    shape = M.described(data.variant, per_block, timed, options)  # once, before any step
    since = C.fresh_compile_state()
    if args.pipeline:
        engine = E.PipelineStep(dmp, dev, options)
        # the pipeline holds batches in flight across steps: its own batch objects, regenerated
        # (same seed, same data) rather than the list measured above
        feed = iter([data.workload.batch(i % len(batches), rank, world, args.seed) for i in range(total)])
        engine_step, stages = _pipelined_step(engine, feed, watchdog, me.fault, rank), E.PIPELINE_STAGES
    else:
        engine = job.engine
        engine_step, stages = _staged_step(engine, batches, watchdog, me.fault, rank), engine.stages
    W.STAGE_ORDER.update({s: i for i, s in enumerate(stages)})
    counted = C.StepCounter(dev, [engine.optimizer])
    saved = SavedForBackward(dmp.parameters())  # around the counted step, with the counters
    at_timed_end = {}  # the memory when the timed steps end, before the counted and profiled ones add theirs

    def timed_end():
        at_timed_end.update(peak=peak_memory_bytes(dev), run=run_memory_bytes(dev, job.start_bytes))

    show = rank == 0 and not args.quiet
    autocast = autocast_for(options, dev)
    samples, prof = _steps(engine_step, stages, total, args, dev, counted, saved, autocast, show, timed_end)

    watchdog.at("analysis")
    comm_stats, counts = profiled_costs(prof, args, rank, world, counted, since)
    lookup = "embedding_lookup" if "embedding_lookup" in stages else "sparse_forward"
    if not args.pipeline:
        loads["lookup_s"] = float(np.mean(samples.stages[lookup]))
    storage = job.planned.storage
    estimate = M.memory_estimate(
        data.variant,
        data.counts,
        me.local_batch,
        options,
        dev.type,
        dense_shards=dense_shards(options.dense_parallel, world, env["local_world_size"]),
        embedding_share=storage[rank] / sum(storage) if sum(storage) else 1.0 / world,
        on_rank=True,
    )
    dense_state = dense_state_bytes(P.dense_parameters(dmp), engine.optimizer)
    record = rank_record(
        me,
        samples,
        shape,
        hot_counts(data.variant, timed),
        loads,
        comm_stats,
        counts,
        at_timed_end,
        estimate,
        dense_state,
        saved,
    )
    return record, batches


def profiled_costs(prof, args: RunConfig, rank: int, world: int, counted, since) -> tuple[dict, dict]:
    """From the profiled steps' trace (kept as --trace DIR/rank<R>.json): the communication
    analysis, and the cost counters with the device counts of the first profiled step (the device
    events that start before the second one does: kernels run after the host span that launched
    them)."""
    events = TR.trace_events(prof, None if args.trace is None else Path(args.trace) / f"rank{rank}.json")
    comm_stats = comm.analyze(events, world, STEP_SPAN)
    spans = sorted(comm.windows(events, STEP_SPAN))
    first = (spans[0][0], spans[1][0] if len(spans) > 1 else float("inf"))
    return comm_stats, C.counters(counted, events, C.compile_counts(since), window=first)


def rank_record(
    me: "_Rank",
    samples,
    shape: dict,
    hot: dict,
    loads: dict,
    comm_stats: dict,
    counts: dict,
    at_timed_end: dict,
    estimate: dict,
    dense_state: dict,
    saved,
) -> dict:
    """This rank's record for rank 0 (result.process_record with what only ranks have: local rank,
    hot rows, lookup loads, communication), the zoo's ranks and a workload's alike."""
    (memory, memory_source), (run_bytes, run_source) = at_timed_end["peak"], at_timed_end["run"]
    return process_record(
        me.dev,
        me.env["rank"],
        samples,
        me.peak,
        me.host_peak,
        local_rank=me.env["local_rank"],
        **shape,
        hot=hot,
        loads=loads,
        comm={k: v for k, v in comm_stats.items() if k != "calls"},
        comm_calls=comm_stats["calls"],
        peak_memory_bytes=memory,
        peak_memory_source=memory_source,
        dense_state_bytes=dense_state,
        **memory_fields(estimate, run_bytes, run_source),
        memory_estimate=estimate,
        activation_bytes=saved.bytes,
        counters=counts,
    )


def _gather(record: dict, rank: int, world: int, watchdog) -> list[dict] | None:
    """Every rank's record on rank 0 (None elsewhere)."""
    watchdog.at("gather")
    records = [None] * world if rank == 0 else None
    dist.gather_object(record, records, dst=0)
    return records


def _indices(args: RunConfig, batches: list) -> dict:
    """Which of the distinct batches each kind of step trained on (the result's run.batches)."""
    n, total = len(batches), args.warmup + args.steps + COUNTED_STEPS + PROFILED_STEPS
    return {
        "timed": [i % n for i in range(args.warmup, args.warmup + args.steps)],
        "counted": [i % n for i in range(args.warmup + args.steps, total - PROFILED_STEPS)],
        "profiled": [i % n for i in range(total - PROFILED_STEPS, total)],
    }


def _say(args: RunConfig, rank: int, text: str) -> None:
    if rank == 0 and not args.quiet:
        print(f"gembench run: {text}", file=sys.stderr, flush=True)


def _peaks(dev: torch.device, args, env: dict):
    """(this rank's peak, this host's peak at local ranks x threads or None).

    Measured once per host by its local rank 0 and shared: ranks that measured their GEMM peak
    all at once each saw a share of the cores and disagreed by 3x, and a provisional (busy)
    figure is not cached, so the others could not read it back.
    """
    if dev.type != "cpu" or args.peak_tflops is not None:
        return reference_peak(dev, args.peak_tflops), None
    mine = None
    if env["local_rank"] == 0:
        threads = torch.get_num_threads()
        host_threads = min(env["local_world_size"] * threads, os.cpu_count() or 1)
        mine = (socket.gethostname(), reference_peak(dev, None), cpu_peak("bf16", threads=host_threads))
    shared = [None] * env["world_size"]
    dist.all_gather_object(shared, mine)
    host = socket.gethostname()
    return next((p, h) for name, p, h in filter(None, shared) if name == host)


def _steps(
    engine_step, stages, total: int, args: RunConfig, dev: torch.device, counted, saved, autocast, show: bool, timed_end
):
    """This rank's steps in the one step loop (step.timed_steps): warm-up, the timed steps, then
    COUNTED_STEPS under the cost counters and PROFILED_STEPS under torch.profiler. Each step is
    one STEP_SPAN range (the communication analysis finds the steps by it).
    ``engine_step(i)`` -> (loss, {stage: seconds}): the staged or the pipelined engine."""
    prof = TR.profiler(dev)
    first_profiled, counting_step = total - PROFILED_STEPS, args.warmup + args.steps

    def one_step(i: int):
        if i == counting_step:
            timed_end()  # the memory of the run as timed, as on one process (runner.memory_now)
        if i == first_profiled:
            prof.__enter__()  # left at the loop's end: the profiled steps are the last ones
        counting = counted if i == counting_step else contextlib.nullcontext()
        saving = saved if i == counting_step else contextlib.nullcontext()
        with counting, saving, torch.autograd.profiler.record_function(STEP_SPAN), autocast():
            return engine_step(i)

    samples = timed_steps(
        one_step,
        total,
        range(args.warmup, args.warmup + args.steps),
        dev,
        stages,
        progress=Progress(show, "gembench run (rank 0)"),
    )
    prof.__exit__(None, None, None)
    return samples, prof


def _staged_step(engine: E.StagedStep, batches, watchdog, fault, rank: int):
    """The staged engine as one step of the loop: a stage clock, and at every stage boundary the
    watchdog told where this rank is (and an injected fault, if any, fired)."""

    stages = engine.stages

    def engine_step(i: int):
        clock = StageClock(engine.device, stages)

        def mark(stage):
            clock.mark(stage)
            following = stages[stages.index(stage) + 1] if stage != stages[-1] else "step end"
            watchdog.at(following, i)
            if fault:
                fault.trigger(rank, i, following)

        watchdog.at("data", i)
        clock.mark("start")
        loss = engine(batches[i % len(batches)], mark, clock.split)
        return loss, clock.durations()

    return engine_step


def _pipelined_step(engine: E.PipelineStep, feed, watchdog, fault, rank: int):
    """TorchRec's pipeline as one step of the loop: its phases timed by the engine itself."""

    def engine_step(i: int):
        watchdog.at("forward", i)
        if fault:
            fault.trigger(rank, i, "forward")
        with nvtx.span("step"):
            return engine(feed)

    return engine_step


# -- the workload's model on the ranks: its fields, shards, loads ------------------------------

UNPOOLED_TYPES = ("table_wise", "row_wise", "column_wise")  # what TorchRec shards an EmbeddingCollection by


def shard(
    workload: Workload, model, env: dict, dev, local_batch: int, sharding, pooling, measured, ddp, sharded_only=False
):
    """TorchRec's plan for the workload's model (told ``pooling``; ``measured``, ``sharded_only``:
    --rebalance's estimator and its plans) and DMP over it, with DDP over the dense part
    (``ddp``) or the dense part plain (the staged step syncs it, or FSDP2 shards it next)."""
    forced = P.parse_sharding(sharding, P.table_names(model))
    sharders = workload.sharders()
    plan, planned = P.plan_sharding(
        model,
        forced,
        env,
        dev,
        local_batch,
        pooling,
        measured,
        sharders=sharders,
        constraints=workload.constraints(),
        sharded_only=sharded_only,
    )
    return P.shard(model, plan, dev, ddp=ddp, sharders=sharders), planned


def load_unsharded(dmp, state: dict) -> int:
    """Write the unsharded model's tensors (``state``: its state_dict, taken before DMP) into the
    sharded one, so that every rank starts from the weights one process would: DMP initialises
    its shards afresh. Each rank copies the slices its shards cover; returns the tensors written."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    from gembench.harness.train.distributed.carry import _slices

    written = 0
    with torch.no_grad():
        for key, value in dmp.state_dict().items():
            source = state.get(key.removeprefix("module.").removeprefix("_dmp_wrapped_module."))
            if source is None or source is value:
                continue
            if isinstance(value, ShardedTensor):
                _slices(value.local_shards(), source, into_shards=True)
            else:
                value.copy_(source)
            written += 1
    return written


def module_fields(workload: Workload, model, batch, required: bool = False) -> dict[str, str] | None:
    """{module path: batch field} for each TorchRec module of the model, the field whose KJT holds
    exactly its features: what the staged step and the load count feed each module, and what
    TorchRec's pipeline needs (each module called on one field of a Pipelineable batch). None
    where a module has no such field (the staged step then runs the forward whole); ``required``
    (--pipeline): refused in one line instead."""
    from torchrec import EmbeddingBagCollection, EmbeddingCollection
    from torchrec.streamable import Pipelineable

    spec = named(workload)
    if required and not isinstance(batch, Pipelineable):
        raise UsageError(
            f"{spec}: --pipeline needs batch() to return a torchrec.streamable.Pipelineable "
            f"(it gave a {type(batch).__name__}); subclass it, or drop --pipeline"
        )
    by_keys = {frozenset(v.keys()): name for name, v in kjt_fields(batch).items()}
    out = {}
    for path, m in model.named_modules():
        if not isinstance(m, (EmbeddingBagCollection, EmbeddingCollection)):
            continue
        configs = m.embedding_bag_configs() if isinstance(m, EmbeddingBagCollection) else m.embedding_configs()
        features = frozenset(f for t in configs for f in t.feature_names)
        if features not in by_keys:
            if not required:
                return None
            raise UsageError(
                f"{spec}: --pipeline calls each TorchRec module on one batch field, and no KJT field of the "
                f"batch holds exactly the features of {path} ({', '.join(sorted(features))}); drop --pipeline"
            )
        out[path] = by_keys[features]
    return out


def hot_counts(workload: Workload, batches) -> dict:
    """Lookups, and lookups that hit each table's hottest 1% of rows, over this rank's batches."""
    rows = {f: t.num_embeddings for t in workload.tables() for f in t.feature_names}
    ids: dict[str, list] = {}
    for b in batches:
        for v in kjt_fields(b).values():
            for key, part in v.to_dict().items():
                ids.setdefault(key, []).append(part.values().numpy())
    hits = lookups = 0.0
    for key, parts in ids.items():
        values = np.concatenate(parts)
        hits += hot_share(values, rows[key]) * values.size
        lookups += values.size
    return {"lookups": lookups, "hot_1pct": hits}


def declared_pooling(workload: Workload) -> dict[str, float]:
    """The pooling the workload declares per table (pooling(); TorchRec's default 1 elsewhere):
    what --rebalance's section sets the measured pooling beside."""
    given = workload.pooling()
    return {t.name: float(given.get(t.name, P.POOLING_DEFAULT)) for t in workload.tables()}
