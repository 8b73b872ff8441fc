"""One rank of a distributed `gembench run`: set up, time the steps, profile, hand rank 0 the record.

Every rank builds the same model from the same seed, shards it with the same plan, and trains on
its own slice of the global batch (SyntheticData with its rank). After the timed steps it runs
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
from gembench.harness.train.result import Sharded, build_result, described, process_record, recheck, timed_batches
from gembench.harness.train.runconfig import RunConfig
from gembench.harness.train.runner import MAX_DISTINCT_BATCHES
from gembench.harness.train.step import StageClock, timed_steps
from gembench.models.config import for_device, load_config, with_global_batch
from gembench.models.data import SyntheticData, expected_ids_per_example
from gembench.models.memory import memory_estimate, parameter_counts

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


def run(args: RunConfig, env: dict, dev: torch.device, watchdog: W.Watchdog, fault) -> dict:
    """This rank's whole job; the result on rank 0 ({} on the others).

    With --rebalance the job runs twice: once on the planner's plan, then, after a re-plan from
    the load measured on it (rebalance.py), on the new plan with the trained state carried over
    (carry.py); the result is the second run's, the first's figures in its ``rebalance`` section.
    """
    from gembench.harness.train.distributed import rebalance as R
    from gembench.harness.train.stack import model_config, on_ranks

    if args.model is not None:  # a workload's model (gembench/workload.py): its own rank job
        from gembench.harness.train.distributed.workload_rank import run as run_workload

        return run_workload(args, env, dev, watchdog, fault)
    rank, world = env["rank"], env["world_size"]
    cfg = for_device(with_global_batch(load_config(args.config), args.batch, world), dev.type)  # --batch; CPU row cap
    local_batch = per_rank_batch(cfg.data.global_batch, world)
    # the peaks first: calibrating one (large GEMMs) must not count as the run's memory
    watchdog.at("peak")
    peak, host_peak = _peaks(dev, args, env)
    # The stack from harness/train/stack.py, as on one process: kernels, precision, compile, optimizer
    # and learning rates; embeddings are always fbgemm's fused TBE under DMP, and overlap is the
    # --pipeline switch (stack.on_ranks).
    options = on_ranks(args.options, args.pipeline)
    cfg = model_config(cfg, options)  # content=off: the config without its [content] section
    expected = expected_ids_per_example(cfg)
    pooling = None if args.sharding == UNTOLD else expected
    rows = _table_rows(cfg)
    if args.rebalance:
        R.check(args.sharding, P.parse_sharding(args.sharding, list(rows)), list(rows), world, args.pipeline)

    me = _Rank(args, env, dev, cfg, options, local_batch, watchdog, fault, peak, host_peak)

    def result_of(records, job, batches, peak_check: bool = False):
        return job_result(me, cfg, records, job, batches, peak_check)

    job = _build(me, pooling)
    record, batches = _measure(job, me)
    records = _gather(record, rank, world, watchdog)
    if not args.rebalance:
        return result_of(records, job, batches, peak_check=True) or {}

    counts_of = lambda batches: R.host_counts([(b.size, (b.sparse, b.seq)) for b in batches], rows)  # noqa: E731
    return rebalanced(
        me, job, record, records, batches, counts_of, rows, pooling, expected, _build, _measure, result_of
    )


def job_result(me: "_Rank", model, records, job, batches, peak_check: bool = False) -> dict | None:
    """Rank 0: the job's result from every rank's records (None elsewhere); ``model``: the
    config as run, or a workload's identity (generic.Identity); ``peak_check``: the peak checked
    first (over this host's ranks), on the run the result is of."""
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
    trained, so that drift over the three runs cancels in B against A and A'. The zoo's ranks and
    a workload's alike: ``counts_of(batches)`` is rebalance.host_counts over this rank's host
    batches, ``rows`` {table: rows}, ``pooling`` what the first plan was told, ``expected`` the
    pooling the model declares; ``build(me, pooling, measured)`` -> job (with .dmp, .planned,
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
    environment, the device, the config and stack as run, the per-rank batch, the watchdog, an
    injected fault (tests), this rank's peak and its host's."""

    args: RunConfig
    env: dict
    dev: torch.device
    cfg: object
    options: object
    local_batch: int
    watchdog: W.Watchdog
    fault: object
    peak: object
    host_peak: object


@dataclass
class _Job:
    """One build of the model on this rank: DMP over it, the planner's view, the step engine."""

    dmp: torch.nn.Module
    planned: P.PlanRecorder
    engine: E.StagedStep | None  # the pipeline's engine is made in _measure
    start_bytes: int  # the rank's memory floor when the build began

    @property
    def optimizer(self):
        """The dense optimizer (--rebalance carries its state; it refuses the pipeline)."""
        return self.engine.optimizer


def _build(me: _Rank, pooling: dict | None, measured=None) -> _Job:
    """Model, plan (TorchRec's planner told ``pooling``; ``measured``: rebalance.MeasuredLookups),
    DMP, FSDP, compile, and the step engine (the staged one; the pipeline's is made in _measure)."""
    args, env, dev, cfg, options, watchdog = me.args, me.env, me.dev, me.cfg, me.options, me.watchdog
    from gembench.harness.train.parallelize import apply_compile, apply_fsdp, dense_mesh
    from gembench.harness.train.stack import seeded_model

    watchdog.at("build")
    start_bytes = reset_peak_memory(dev)  # the rank's floor: what was loaded before the run
    gem = seeded_model(cfg, options, dev, args.seed)  # same seed on every rank: identical replicated weights
    model = gem
    if args.pipeline:  # embedding modules lifted out where the pipeline's tracer can find them
        model = E.TrainModule(gem)
    watchdog.at("plan")
    forced = P.parse_sharding(args.sharding, P.table_names(model))
    plan, planned = P.plan_sharding(
        model, forced, env, dev, me.local_batch, pooling, measured, sharded_only=args.rebalance
    )
    watchdog.at("shard")
    dmp = P.shard(model, plan, dev, ddp=args.pipeline and options.dense_parallel == "ddp")
    if options.dense_parallel != "ddp":  # FSDP2 on the dense blocks DMP left plain
        mesh = dense_mesh(options.dense_parallel, env["world_size"], env["local_world_size"], dev.type)
        apply_fsdp(gem, mesh, options.bf16)
    apply_compile(gem, options)  # the dense arch, after DMP has taken the tables
    engine = None if args.pipeline else E.StagedStep(dmp, dev, env["world_size"], options)
    return _Job(dmp, planned, engine, start_bytes)


def _measure(job: _Job, me: _Rank) -> tuple[dict, list]:
    """Time, count and profile this rank's steps on ``job``: its record for rank 0, and the batches."""
    args, env, dev, cfg, options, local_batch = me.args, me.env, me.dev, me.cfg, me.options, me.local_batch
    watchdog, fault = me.watchdog, me.fault
    from gembench.harness.train.parallelize import dense_shards, dense_state_bytes
    from gembench.harness.train.stack import autocast_for

    rank, world, dmp = env["rank"], env["world_size"], job.dmp
    watchdog.at("data")
    data = SyntheticData(cfg, seed=args.seed, batch_size=local_batch, rank=rank)
    total = args.warmup + args.steps + COUNTED_STEPS + PROFILED_STEPS
    batches = [data.batch(i) for i in range(min(total, MAX_DISTINCT_BATCHES))]

    timed = timed_batches(batches, args.warmup, args.steps)
    watchdog.at("load count")
    # before the pipeline rewrites the modules' input dist for its own schedule
    loads = L.measure_loads(dmp, timed[:LOAD_BATCHES], dev)
    shape = described(cfg, timed, options)  # once, before any step, from the host batches as generated
    autocast = autocast_for(options, dev)
    since = C.fresh_compile_state()
    W.STAGE_ORDER.update({s: i for i, s in enumerate(E.PIPELINE_STAGES if args.pipeline else E.STAGES)})
    show = rank == 0 and not args.quiet
    if args.pipeline:
        engine = E.PipelineStep(dmp, dev, options)
        # the pipeline holds batches in flight across steps: it gets its own batch objects
        # (regenerated: same seed, same data) rather than the list measured above
        feed = iter([E.pipelineable(data.batch(i % len(batches))) for i in range(total)])
        engine_step, stages = _pipelined_step(engine, feed, watchdog, fault, rank), E.PIPELINE_STAGES
    else:
        engine = job.engine
        engine_step, stages = _staged_step(engine, batches, watchdog, fault, rank), E.STAGES
    counted = C.StepCounter(dev, [engine.optimizer])
    saved = SavedForBackward(dmp.parameters())  # around the counted step, with the counters
    at_timed_end = {}  # the memory when the timed steps end, before the counted and profiled ones add theirs

    def timed_end():
        at_timed_end.update(peak=peak_memory_bytes(dev), run=run_memory_bytes(dev, job.start_bytes))

    samples, prof = _steps(engine_step, stages, total, args, dev, counted, saved, autocast, show, timed_end)

    watchdog.at("analysis")
    comm_stats, counts = profiled_costs(prof, args, rank, world, counted, since)
    if not args.pipeline:
        loads["lookup_s"] = float(np.mean(samples.stages["embedding_lookup"]))
    storage = job.planned.storage
    estimate = memory_estimate(
        cfg,
        local_batch,
        parameter_counts(cfg),
        options,
        dev.type,
        shards=dense_shards(options.dense_parallel, world, env["local_world_size"]),
        embedding_share=storage[rank] / sum(storage) if sum(storage) else 1.0 / world,
        on_rank=True,
    )
    dense_state = dense_state_bytes(P.dense_parameters(dmp), engine.optimizer)
    record = rank_record(
        me,
        samples,
        shape,
        _hot_counts(cfg, timed),
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


def _table_rows(cfg) -> dict[str, int]:
    """Rows of every table by its name, from the config as run (models.sparse's table configs)."""
    from gembench.models.zoo import zoo_tables

    return {t.name: t.num_embeddings for t in zoo_tables(cfg)}


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

    def engine_step(i: int):
        clock = StageClock(engine.device, E.STAGES)

        def mark(stage):
            clock.mark(stage)
            following = E.STAGES[E.STAGES.index(stage) + 1] if stage != E.STAGES[-1] else "step end"
            watchdog.at(following, i)
            if fault:
                fault.trigger(rank, i, following)

        watchdog.at("data", i)
        clock.mark("start")
        loss = engine(batches[i % len(batches)], mark)
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


def _hot_counts(cfg, batches) -> dict:
    """Lookups, and lookups that hit each table's hottest 1% of rows, over this rank's batches."""
    hits = lookups = 0.0
    tables = [
        (b_field, key, rows)
        for b_field, key, rows in [("sparse", f"t{i}", r) for i, r in enumerate(cfg.sparse.rows)]
        + [("seq", s.name, s.rows) for s in cfg.sequences]
    ]
    for field, key, rows in tables:
        ids = np.concatenate([getattr(b, field)[key].values().numpy() for b in batches])
        hits += hot_share(ids, rows) * ids.size
        lookups += ids.size
    return {"lookups": lookups, "hot_1pct": hits}
