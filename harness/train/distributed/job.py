"""One rank's job in a distributed `gembench run`: build the sharded model, measure it, and on rank 0
turn every rank's record into the result.

Every rank builds the same workload's model from the same seed, shards it with the same plan
(TorchRec's planner, told the workload's pooling, its sharders and constraints where it gives
them; DMP; the unsharded weights written into the shards), and trains on its own slice of the
global batch (the workload's batch(i, rank, world, seed)). FSDP2, checkpointing and compile come
from parallelize.py as on one process; the step is one of engines.py's, measured as on one
process (measure.py). A rank's record adds what only ranks have: its lookup load, hot rows and
communication. With --rebalance the job measures three plans in turn (``rebalanced``).
"""

from __future__ import annotations

import gc
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from gembench.harness.metrics import comm, counters
from gembench.harness.metrics.startup import Startup
from gembench.harness.metrics.trace import STEP_SPAN
from gembench.harness.train import checkpoint
from gembench.harness.train.distributed import engines, loads, plan, rebalance, sparse2d, watchdog
from gembench.harness.train.distributed.carry import carry_state, load_unsharded
from gembench.harness.train.distributed.checks import UNTOLD, check, per_rank_batch
from gembench.harness.train.measure import Measurement, World, measure, step_indices
from gembench.harness.train.memory import memory_estimate, parameter_shapes, reset_peak_memory
from gembench.harness.train.parallelize import (
    apply_compile,
    apply_fsdp,
    dense_mesh,
    dense_shards,
    dense_state_bytes,
    fsdp_units,
    sparse_modules,
)
from gembench.harness.train.progress import Progress
from gembench.harness.train.result import ProcessRecord, Sharded, build_result, process_record, recheck
from gembench.harness.train.runconfig import RunConfig
from gembench.harness.train.runner import MAX_DISTINCT_BATCHES
from gembench.harness.train.stack import StackOptions, autocast_for, on_ranks, seeded_model
from gembench.harness.train.step import losses
from gembench.harness.train.work import Work, described, stack_flops, timed_batches
from gembench.harness.train.workloads import hot_counts, identity, module_fields, section
from gembench.loader import kjt_fields

LOAD_BATCHES = 8  # batches whose real input dist is counted for the measured load


@dataclass
class Built:
    """One build of the model on this rank: DMP over it, the planner's view, (batch field, sharded
    module) of each module fed one field whole (None: the forward runs whole), the staged engine
    (None under --pipeline, whose engine is made when it is measured)."""

    dmp: torch.nn.Module
    planned: plan.PlanRecorder
    feeds: list | None
    engine: engines.StagedStep | None
    start_bytes: int  # the rank's memory floor when the build began
    modules: int  # the model's TorchRec modules


def rank_saves(args: RunConfig, ident, world_size: int) -> dict | None:
    """--checkpoint-every and --resume on ``world_size`` ranks (checkpoint.plan), checked by the
    launcher before any rank starts and by every rank; None: the job neither saves nor resumes."""
    if not checkpoint.wanted(args):
        return None
    options = on_ranks(args.options, args.pipeline).to_dict()
    return checkpoint.plan(args, checkpoint.manifest_of(ident, world_size, options, args.seed))


class RankJob:
    """This rank's job: the request, its world, the workload as the stack runs it, its batches and
    their FLOPs, and its peak; ``build`` shards a model, ``measure`` measures one build, ``result``
    makes the job's result on rank 0, ``rebalanced`` runs --rebalance's three plans."""

    def __init__(self, args: RunConfig, world: World, dev: torch.device, fault, peaks: tuple, startup=None):
        self.args, self.world, self.dev, self.fault = args, world, dev, fault
        self.peak, self.host_peak, self.bandwidth = peaks  # rank.peaks: Peak, Peak | None, Bandwidth
        self.startup: Startup = startup or Startup()  # the rank's start-up clock, until its first timed step
        with self.startup.phase("config"):
            workload = check(args, world.size).on_device(dev.type)  # on CPU the zoo caps its tables
        self.local_batch = per_rank_batch(workload.global_batch, world.size)
        # The stack from harness/train/stack.py, as on one process; embeddings are always fbgemm's
        # fused TBE under DMP, and overlap is the --pipeline switch (stack.on_ranks).
        self.options: StackOptions = on_ranks(args.options, args.pipeline)
        self.workload = workload
        self.variant = workload.for_stack(self.options)  # the model this stack runs
        world.at("data")
        steps = step_indices(args.warmup, args.steps, distributed=True)
        self.total = steps["profiled"].stop
        count = MAX_DISTINCT_BATCHES if checkpoint.wanted(args) else min(self.total, MAX_DISTINCT_BATCHES)
        with self.startup.phase("data"):
            self.batches = [workload.batch(i, world.rank, world.size, args.seed) for i in range(count)]
        with self.startup.phase("config"):
            meta = self.variant.build(torch.device("meta"))  # its shapes, for the identity and the estimate
            self.ident = identity(self.variant, args.seed, meta)
            self.counts = parameter_shapes(self.variant, meta)
            del meta
            self.saves = rank_saves(args, self.ident, world.size)  # the save resumed from, the steps to save after
        self.work: Work | None = None  # the batches' FLOPs, from the first build's unsharded model
        self.pooling = None if args.sharding == UNTOLD else self.variant.pooling()

    def run(self) -> dict:
        """The job; its result on rank 0 ({} on the others)."""
        built = self.build(self.pooling)
        record = self.measure(built, self.saver(built))
        records = self.world.gather(record)
        if self.args.rebalance:
            return self.rebalanced(built, record, records)
        return self.result(records, built, peak_check=True) or {}

    def build(self, pooling: dict | None, measured=None) -> Built:
        """The model from the seed with checkpointing, TorchRec's plan (told ``pooling``;
        ``measured``: rebalance.MeasuredLookups) and DMP, the unsharded weights written into the
        shards, then FSDP2 over the dense part (dense_parallel=fsdp|hsdp), compile, and the
        staged engine."""
        args, world, dev, options, variant = self.args, self.world, self.dev, self.options, self.variant
        world.at("build")
        start_bytes = reset_peak_memory(dev)  # the rank's floor: what was loaded before the run
        with self.startup.phase("build"):
            built = seeded_model(variant, options, dev, args.seed)  # same seed on every rank: identical weights
        if self.work is None:  # on the unsharded model, before DMP takes it
            with self.startup.phase("flops"):
                autocast = autocast_for(options, dev)
                self.work = stack_flops(self.workload, variant, self.batches, autocast, dev, args.seed, built)
        fields = module_fields(variant, built, self.batches[0], required=args.pipeline)
        modules = len(sparse_modules(built))
        sharded = built
        if args.pipeline:  # its TorchRec modules lifted out where the pipeline's tracer finds them
            sharded = engines.TrainModule(built, fields, lambda m, b: losses(variant, variant.forward(m, b), b))
            fields = {f"embedding_{i}": field for i, field in enumerate(fields.values())}
        # the unsharded tables, by reference: every rank starts from the weights one process would
        unsharded = {k: v.detach() for k, v in sharded.state_dict().items()}
        world.at("plan")
        ddp = args.pipeline and options.dense_parallel == "ddp"  # the staged step syncs gradients itself
        env = {"rank": world.rank, "world_size": world.size, "local_world_size": world.local_size}
        dmp, planned = plan.shard_workload(
            variant,
            sharded,
            env,
            dev,
            self.local_batch,
            args.sharding,
            pooling,
            measured,
            ddp,
            args.rebalance,
            self.startup,
            options,
        )
        with self.startup.phase("shard"):
            load_unsharded(dmp, unsharded)
            del unsharded
        with self.startup.phase("wrap"):
            if options.dense_parallel != "ddp":  # FSDP2 on the dense blocks DMP left plain
                mesh = dense_mesh(options.dense_parallel, world.size, world.local_size, dev.type)
                apply_fsdp(built, mesh, options.bf16, *fsdp_units(variant, built))
            apply_compile(variant, built, options)  # the dense part, after DMP has taken the tables
        feeds = None if fields is None else [(field, dmp.module.get_submodule(path)) for path, field in fields.items()]
        if args.pipeline:
            engine = None
        else:
            engine = engines.StagedStep(dmp, dev, world, options, variant, feeds, self.batches, self.fault)
        return Built(dmp, planned, feeds, engine, start_bytes, modules)

    def saver(self, built: Built) -> checkpoint.Saver | None:
        """--resume: the save loaded into ``built`` (every rank its shards); --checkpoint-every: the
        saver of its state (None: no saving)."""
        if self.saves is None:
            return None
        held = checkpoint.of_rank(built.dmp, built.engine.optimizer, self.world.rank)
        if self.saves["resume"] is not None:
            self.world.at("restore")
            with self.startup.phase("restore"):
                checkpoint.restore(held, self.saves["resume"], self.saves["first"], dist.group.WORLD)
        if self.args.checkpoint_every is None:
            return None
        # DCP finishes an async save collectively from its writing thread: a group of its own
        group = dist.new_group(backend="gloo")
        args, saves = self.args, self.saves
        saver = checkpoint.Saver(
            held,
            args.checkpoint_every,
            args.checkpoint_dir,
            saves["manifest"],
            saves["first"],
            saves["due"],
            group=group,
            lead=self.world.rank == 0,
            rank=self.world.rank,
            startup=self.startup,
        )
        return saver

    def measure(self, built: Built, saver: checkpoint.Saver | None = None) -> ProcessRecord:
        """This rank's record of ``built``: its lookup load counted, then measured (measure.py),
        saved by ``saver`` as it goes; a resumed run's steps go on from the save's."""
        args, world, dev, options, batches = self.args, self.world, self.dev, self.options, self.batches
        timed = timed_batches(batches, args.warmup, args.steps)
        world.at("load count")
        # before the pipeline rewrites the modules' input dist for its own schedule
        with self.startup.phase("load_count"):
            lookup_loads = loads.measure_loads(built.feeds or [], timed[:LOAD_BATCHES], dev)
        shape = described(self.variant, self.work, batches, args.warmup, args.steps, options)  # once, before any step
        since = counters.fresh_compile_state()
        if args.pipeline:
            # the pipeline holds batches in flight across steps: its own batch objects, regenerated
            # (same seed, same data) rather than the list measured above
            n = len(batches)
            feed = iter([self.workload.batch(i % n, world.rank, world.size, args.seed) for i in range(self.total)])
            engine = engines.PipelineStep(built.dmp, dev, world, options, feed, self.fault)
        else:
            engine = built.engine
        watchdog.STAGE_ORDER.update({s: i for i, s in enumerate(engine.stages)})
        measured = measure(
            engine,
            world,
            args.warmup,
            args.steps,
            start_bytes=built.start_bytes,
            compile_since=since,
            trace_path=None if args.trace is None else Path(args.trace) / f"rank{world.rank}.json",
            progress=Progress(world.rank == 0 and not args.quiet, "gembench run (rank 0)"),
            startup=self.startup,
            first=self.saves["first"] if self.saves is not None else 0,
            after_step=saver,
        )
        if self.saves is not None:
            resumed = self.saves["resume"]
            measured.checkpoint = {
                **(saver.record() if saver is not None else {}),
                **({"resumed_from": str(resumed), "resumed_at": self.saves["first"]} if resumed else {}),
            }
        world.at("analysis")
        comm_stats = comm.analyze(measured.events, world.size, STEP_SPAN)
        if not args.pipeline:
            lookup = "embedding_lookup" if "embedding_lookup" in engine.stages else "sparse_forward"
            lookup_loads["lookup_s"] = float(np.mean(measured.samples.stages[lookup]))
        hot = hot_counts(self.variant, timed)
        return self._record(built, engine.optimizers[0], measured, shape, hot, lookup_loads, comm_stats)

    def _record(
        self, built: Built, optimizer, measured: Measurement, shape, hot, lookup_loads, comm_stats
    ) -> ProcessRecord:
        world, storage = self.world, built.planned.storage
        estimate = memory_estimate(
            self.variant,
            self.counts,
            self.local_batch,
            self.options,
            self.dev.type,
            dense_shards=dense_shards(self.options.dense_parallel, world.size, world.local_size),
            embedding_share=storage[world.rank] / sum(storage) if sum(storage) else 1.0 / world.size,
            on_rank=True,
        )
        dense_state = dense_state_bytes(plan.dense_parameters(built.dmp), optimizer)
        return process_record(
            self.dev,
            world,
            measured,
            self.peak,
            self.host_peak,
            shape,
            estimate,
            dense_state,
            self.bandwidth,
            hot=hot,
            loads=lookup_loads,
            comm={k: v for k, v in comm_stats.items() if k != "calls"},
            comm_calls=comm_stats["calls"],
        )

    def result(self, records: list[ProcessRecord] | None, built: Built, peak_check: bool = False) -> dict | None:
        """Rank 0: the job's result from every rank's records (None elsewhere); ``peak_check``: the
        peak checked first (over this host's ranks), on the run the result is of."""
        if self.world.rank != 0:
            return None
        if peak_check:
            self.world.at("peak check")
            mine = [r for r in records if r.host == socket.gethostname()]
            recheck(self.peak, mine, [f" of rank {r.rank}" for r in mine])
        args = self.args
        sharded = Sharded(
            built.planned,
            self.batch_indices(),
            dist.get_backend(),
            args.sharding,
            args.pipeline,
            args.timeout,
            sparse2d.layout(self.options, self.world.size, self.world.local_size),
        )
        result = build_result(self.ident, args, records, self.options, sharded)
        result["workload"] = section(
            self.variant, self.ident, self.work.basis, self.options, self.batches[0], built.modules
        )
        return result

    def batch_indices(self) -> dict:
        """Which of the distinct batches each kind of step trained on (the result's run.batches)."""
        n = len(self.batches)
        steps = step_indices(self.args.warmup, self.args.steps, distributed=True)
        return {kind: [i % n for i in steps[kind]] for kind in ("timed", "counted", "ops", "profiled")}

    def rebalanced(self, built: Built, record: ProcessRecord, records: list | None) -> dict:
        """--rebalance after the first run (``built``, its ``record``, rank 0's ``records``): the
        planner's plan (A), the re-planned one (B), then A again, each on the state the run before
        it trained, so that drift over the three runs cancels in B against A and A'."""
        args, world = self.args, self.world
        world.at("rebalance")
        rows = {t.name: t.num_embeddings for t in self.variant.tables()}
        table_of = {f: t.name for t in self.variant.tables() for f in t.feature_names}
        timed = timed_batches(self.batches, args.warmup, args.steps)[:LOAD_BATCHES]  # those the load counted
        mine = rebalance.host_counts([(self.local_batch, list(kjt_fields(b).values())) for b in timed], rows, table_of)
        counts = [None] * world.size
        dist.all_gather_object(counts, mine)
        measured_loads = [None] * world.size
        dist.all_gather_object(measured_loads, record.loads)
        measured = rebalance.Measured.from_ranks(counts, measured_loads, rows)
        skew = rebalance.row_skew(measured, built.planned.tables)

        before = self.result(records, built)
        self._say(
            "re-planning from the measured load: pooling "
            + ", ".join(f"{t.removeprefix('table_')} {v:.1f}" for t, v in measured.pooling.items())
            + f"; lookup {measured.seconds_per_byte * 1e9:.2f} ns/byte"
        )
        built, carried = self._rebuild(built, measured.pooling, rebalance.MeasuredLookups(measured))
        gc.collect()  # the first model, now unreferenced, before the second is timed
        records = world.gather(self.measure(built))
        result = self.result(records, built, peak_check=True)
        self._say("the planner's plan once more, after the rebalanced one")
        built, _ = self._rebuild(built, self.pooling)
        gc.collect()
        records = world.gather(self.measure(built))
        if world.rank != 0:
            return {}
        expected = rebalance.declared_pooling(self.variant)
        after = self.result(records, built)
        result["rebalance"] = rebalance.section(before, result, after, measured, expected, skew, carried)
        return result

    def _rebuild(self, old: Built, pooling: dict | None, measured=None) -> tuple[Built, object]:
        """The model built again on a new plan, ``old``'s trained state carried into it. torch.compile's
        caches of the old model are dropped (the new one compiles on its first step anyway), so that
        nothing of it outlives the caller's last reference."""
        built = self.build(pooling, measured)
        self.world.at("carry")
        carried = carry_state(old.dmp, built.dmp, old.engine.optimizer, built.engine.optimizer)  # staged only
        torch._dynamo.reset()
        return built, carried

    def _say(self, text: str) -> None:
        if self.world.rank == 0 and not self.args.quiet:
            print(f"gembench run: {text}", file=sys.stderr, flush=True)
