"""One rank of `gembench run --model SPEC --nproc N`: a workload's model under TorchRec's DMP.

The same job as rank.py's for a config: the same seed on every rank, TorchRec's planner (told the
workload's pooling, its sharders and constraints where it gives them), DMP with DDP over the dense
part, the timed steps in the one step loop, one counted step and profiled steps after them, the
measured lookup load, one record per rank and one result on rank 0. The step is generic.py's:
sparse_forward is the time inside the sharded modules' forward (input dist, lookup, output dist
waited for), dense_forward the rest, then loss, backward (DDP's all-reduce inside it), optimizer.
dense_parallel=fsdp|hsdp: FSDP2 on the workload's dense blocks (generic.fsdp_units), as
parallelize does for the zoo; --rebalance: rank.rebalanced's three runs over the workload's tables;
--pipeline: TorchRec's TrainPipelineSparseDist (engines.PipelineStep) over engines.TrainModule,
the workload's TorchRec modules lifted out, each fed the KJT field of its features.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from gembench.errors import UsageError
from gembench.harness.metrics import counters as C
from gembench.harness.metrics.imbalance import hot_share
from gembench.harness.train import generic as G
from gembench.harness.train.distributed import engines as E
from gembench.harness.train.distributed import loads as L
from gembench.harness.train.distributed import plan as P
from gembench.harness.train.distributed import watchdog as W
from gembench.harness.train.memory import (
    SavedForBackward,
    peak_memory_bytes,
    reset_peak_memory,
    run_memory_bytes,
)
from gembench.harness.train.result import timed_batches
from gembench.harness.train.runconfig import RunConfig
from gembench.harness.train.step import STAGES, StageClock, TrainState, train_step
from gembench.workload import Workload, load_workload


def check(args: RunConfig, nproc: int) -> Workload:
    """What every rank would refuse, before launching: the workload, its batch split, switches."""
    from gembench.harness.train.distributed.rank import per_rank_batch
    from gembench.harness.train.stack import on_ranks

    workload = load_workload(args.model, args.model_args)
    if args.batch is not None:
        workload.global_batch = args.batch
    per_rank_batch(workload.global_batch, nproc)
    options = on_ranks(args.options, args.pipeline)
    G.applied_switches(workload, options)
    if args.pipeline:
        pipeline_fields(workload, workload.build(torch.device("meta")), workload.batch(0, 0, nproc, args.seed))
    tables = [t.name for t in workload.tables()]
    forced = P.parse_sharding(args.sharding, tables)
    if args.rebalance:
        from gembench.harness.train.distributed.rebalance import check as check_rebalance

        check_rebalance(args.sharding, forced, tables, nproc, args.pipeline)
    return workload


def shard(
    workload: Workload, model, env: dict, dev, local_batch: int, sharding, pooling, measured, ddp, sharded_only=False
):
    """TorchRec's plan for the workload's model (told ``pooling``; ``measured``, ``sharded_only``:
    --rebalance's estimator and its plans) and DMP over it, with DDP over the dense part
    (``ddp``) or the dense part plain (FSDP2 shards it next)."""
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
            if source is None:
                continue
            if isinstance(value, ShardedTensor):
                _slices(value.local_shards(), source, into_shards=True)
            else:
                value.copy_(source)
            written += 1
    return written


def module_inputs(workload: Workload, dmp, batch) -> list[tuple[str, object]]:
    """(batch field, sharded module) for the sharded modules each fed one KJT field whole: what
    the load count replays (loads.measure_loads reads these pairs)."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from gembench.workload import batch_fields

    fields = {k: v for k, v in batch_fields(batch).items() if isinstance(v, KeyedJaggedTensor)}
    out = []
    for _, m in P.sharded_modules(dmp.module):
        features = set(
            getattr(m, "_feature_names", None) or [f for fs in getattr(m, "_feature_splits", []) for f in fs]
        )
        if not features:
            features = {f for t in getattr(m, "_embedding_bag_configs", []) for f in t.feature_names}
        for name, kjt in fields.items():
            if set(kjt.keys()) == features:
                out.append((name, m))
    return out


def measure_loads(workload: Workload, dmp, batches, dev) -> dict[str, float]:
    """Mean lookup load of this rank, as loads.measure_loads counts it, over the sharded modules
    whose KJT field the batch holds whole (0 where none is: the planner's estimate stands alone)."""
    pairs = module_inputs(workload, dmp, batches[0])
    if not pairs:
        return {"ids": 0.0, "unique_ids": 0.0, "bytes_read": 0.0}
    total: dict[str, float] = {}
    with torch.no_grad():
        for b in batches:
            b = b.to(dev)
            inputs = []
            for field, module in pairs:
                ctx = module.create_context()
                inputs.append(module.input_dist(ctx, getattr(b, field)).wait().wait())
            for k, v in L.lookup_load(pairs, inputs).items():
                total[k] = total.get(k, 0.0) + v
    return {k: v / len(batches) for k, v in total.items()}


def hot_counts(workload: Workload, batches) -> dict:
    """Lookups, and lookups that hit each table's hottest 1% of rows, over this rank's batches."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from gembench.workload import batch_fields

    rows = {f: t.num_embeddings for t in workload.tables() for f in t.feature_names}
    ids: dict[str, list] = {}
    for b in batches:
        for v in batch_fields(b).values():
            if isinstance(v, KeyedJaggedTensor):
                for key, part in v.to_dict().items():
                    ids.setdefault(key, []).append(part.values().numpy())
    hits = lookups = 0.0
    for key, parts in ids.items():
        values = np.concatenate(parts)
        hits += hot_share(values, rows[key]) * values.size
        lookups += values.size
    return {"lookups": lookups, "hot_1pct": hits}


@dataclass
class _Job:
    """One build of the workload's model on this rank: DMP over it, the planner's view, the
    dense optimizer and the generic step's state."""

    dmp: torch.nn.Module
    planned: P.PlanRecorder
    optimizer: torch.optim.Optimizer
    state: TrainState
    start_bytes: int  # the rank's memory floor when the build began


@dataclass
class _Data:
    """What every build of one rank's job trains on: the workload, its batches and their figures."""

    workload: Workload
    batches: list
    flops: list  # per batch {block: forward FLOPs}, from the first build's unsharded model
    basis: str


def _build(me, data: _Data, pooling: dict | None, measured=None) -> _Job:
    """The workload's model from the seed, AC, TorchRec's plan (told ``pooling``; ``measured``:
    rebalance.MeasuredLookups) and DMP, the unsharded weights written into the shards, then
    FSDP2 over the dense part (dense_parallel=fsdp|hsdp; DDP's otherwise) and compile."""
    from gembench.harness.train.parallelize import apply_fsdp, dense_mesh
    from gembench.harness.train.stack import autocast_for, dense_optimizer

    args, env, dev, options, workload = me.args, me.env, me.dev, me.options, data.workload
    me.watchdog.at("build")
    start_bytes = reset_peak_memory(dev)
    model = G.seeded(workload, dev, args.seed)  # same seed on every rank: identical replicated weights
    if not data.flops:  # on the unsharded model, before DMP takes it
        data.flops, data.basis = G.flops_of(workload, model, data.batches)
    G.apply_ac(workload, model, options.activation_checkpointing)
    sharded = model
    if args.pipeline:  # its TorchRec modules lifted out where the pipeline's tracer finds them
        fields = pipeline_fields(workload, model, data.batches[0])
        sharded = E.TrainModule(
            model, lambda path, m: fields[path], lambda m, b: workload.loss(workload.forward(m, b), b)
        )
    unsharded = {k: v.detach().clone() for k, v in sharded.state_dict().items()}
    me.watchdog.at("plan")
    ddp = options.dense_parallel == "ddp"
    dmp, planned = shard(
        workload, sharded, env, dev, me.local_batch, args.sharding, pooling, measured, ddp, args.rebalance
    )
    load_unsharded(dmp, unsharded)
    del unsharded
    if not ddp:  # FSDP2 on the dense part DMP left plain, as parallelize does for the zoo
        mesh = dense_mesh(options.dense_parallel, env["world_size"], env["local_world_size"], dev.type)
        apply_fsdp(model, mesh, options.bf16, *G.fsdp_units(workload, model))
    G.apply_compile(workload, model, options)
    if args.pipeline:  # the pipeline's engine (and its optimizer) is made in _measure
        return _Job(dmp, planned, None, None, start_bytes)
    dense = P.dense_parameters(dmp)
    optimizer = dense_optimizer(dense, options)
    state = TrainState(
        model=dmp,
        optimizers=[optimizer],
        autocast=autocast_for(options, dev),
        device=dev,
        step_fn=G.generic_step,
        workload=workload,
        timer=G.SparseTimer(dmp.module, dev),
        dense_params=dense,
    )
    return _Job(dmp, planned, optimizer, state, start_bytes)


def _measure(job: _Job, me, data: _Data) -> tuple[dict, list]:
    """Time, count and profile this rank's steps on ``job``: its record for rank 0, and the batches."""
    from gembench.harness.train.distributed import rank as R
    from gembench.harness.train.parallelize import dense_shards, dense_state_bytes
    from gembench.harness.train.stack import autocast_for

    args, env, dev, options, workload, batches = me.args, me.env, me.dev, me.options, data.workload, data.batches
    rank, world, dmp, watchdog = env["rank"], env["world_size"], job.dmp, me.watchdog
    total = args.warmup + args.steps + R.COUNTED_STEPS + R.PROFILED_STEPS
    timed = timed_batches(batches, args.warmup, args.steps)
    watchdog.at("load count")
    loads = measure_loads(workload, dmp, timed[: R.LOAD_BATCHES], dev)
    shape = G.described(workload, timed_batches(data.flops, args.warmup, args.steps), timed, options)
    since = C.fresh_compile_state()

    def engine_step(i: int):
        watchdog.at("step", i)
        if me.fault:
            me.fault.trigger(rank, i, "step")
        clock = StageClock(dev, STAGES)
        loss = train_step(job.state, batches[i % len(batches)], clock)
        return loss, clock.durations()

    stages, autocast = STAGES, _nothing  # the generic step's autocast is its own
    if args.pipeline:  # after the load count: the pipeline rewrites the modules' input dist
        engine = E.PipelineStep(dmp, dev, options)
        job.optimizer = engine.optimizer
        # the pipeline holds batches in flight across steps: its own batch objects, regenerated
        feed = iter([workload.batch(i % len(batches), rank, world, args.seed) for i in range(total)])
        engine_step, stages = R._pipelined_step(engine, feed, watchdog, me.fault, rank), E.PIPELINE_STAGES
        autocast = autocast_for(options, dev)
    W.STAGE_ORDER.update({s: i for i, s in enumerate(stages)})
    counted = C.StepCounter(dev, [job.optimizer])
    saved = SavedForBackward(dmp.parameters())
    at_end: dict = {}

    def timed_end():
        at_end.update(peak=peak_memory_bytes(dev), run=run_memory_bytes(dev, job.start_bytes))

    samples, prof = R._steps(
        engine_step, stages, total, args, dev, counted, saved, autocast, rank == 0 and not args.quiet, timed_end
    )
    watchdog.at("analysis")
    comm_stats, counts = R.profiled_costs(prof, args, rank, world, counted, since)
    if not args.pipeline:
        loads["lookup_s"] = float(np.mean(samples.stages["sparse_forward"]))
    storage = job.planned.storage
    share = storage[rank] / sum(storage) if sum(storage) else 1.0 / world
    shards = dense_shards(options.dense_parallel, world, env["local_world_size"])
    estimate = G.memory_estimate(
        G.parameter_shapes(workload), options, dev.type, embedding_share=share, dense_shards=shards
    )
    record = R.rank_record(
        me,
        samples,
        shape,
        hot_counts(workload, timed),
        loads,
        comm_stats,
        counts,
        at_end,
        estimate,
        dense_state_bytes(P.dense_parameters(dmp), job.optimizer),
        saved,
    )
    return record, batches


def run(args: RunConfig, env: dict, dev: torch.device, watchdog, fault) -> dict:
    """This rank's whole job for a workload; the result on rank 0 ({} on the others). With
    --rebalance, rank.rebalanced's three runs (the planner's plan, the re-planned one, the
    planner's again), the workload's tables counted from its batches' KJTs."""
    from gembench.harness.train.distributed import rank as R
    from gembench.harness.train.distributed import rebalance as RB
    from gembench.harness.train.stack import on_ranks

    rank, world = env["rank"], env["world_size"]
    workload = check(args, world)
    local_batch = R.per_rank_batch(workload.global_batch, world)
    watchdog.at("peak")
    peak, host_peak = R._peaks(dev, args, env)
    options = on_ranks(args.options, args.pipeline)
    watchdog.at("data")
    total = args.warmup + args.steps + R.COUNTED_STEPS + R.PROFILED_STEPS
    batches, ident = G.prepared(workload, args.seed, world, rank, count=min(total, R.MAX_DISTINCT_BATCHES))
    data = _Data(workload, batches, [], "")
    expected = declared_pooling(workload)
    pooling = None if args.sharding == R.UNTOLD else workload.pooling()

    def result_of(records, job, batches, peak_check: bool = False):
        result = R.job_result(me, ident, records, job, batches, peak_check)
        if result is not None:
            sparse = len(P.sharded_modules(job.dmp.module))
            result["workload"] = G.section(workload, ident, data.basis, options, batches[0], sparse)
        return result

    def build(me, pooling, measured=None):
        return _build(me, data, pooling, measured)

    def measure(job, me):
        return _measure(job, me, data)

    me = R._Rank(args, env, dev, None, options, local_batch, watchdog, fault, peak, host_peak)
    job = build(me, pooling)
    record, batches = measure(job, me)
    records = R._gather(record, rank, world, watchdog)
    if not args.rebalance:
        return result_of(records, job, batches, peak_check=True) or {}
    rows = {t.name: t.num_embeddings for t in workload.tables()}
    table_of = {f: t.name for t in workload.tables() for f in t.feature_names}

    def counts_of(host):
        return RB.host_counts([(local_batch, list(kjt_fields(b).values())) for b in host], rows, table_of)

    return R.rebalanced(
        me, job, record, records, batches, counts_of, rows, pooling, expected, build, measure, result_of
    )


def pipeline_fields(workload: Workload, model, batch) -> dict[str, str]:
    """--pipeline: {module path: batch field} for each TorchRec module of the model, the field the
    KJT of exactly its features; TorchRec's pipeline needs each module called on one field of a
    Pipelineable batch, and refuses (one line) a model that does otherwise."""
    from torchrec import EmbeddingBagCollection
    from torchrec.streamable import Pipelineable

    spec = workload.spec
    if not isinstance(batch, Pipelineable):
        raise UsageError(
            f"--model {spec}: --pipeline needs batch() to return a torchrec.streamable.Pipelineable "
            f"(it gave a {type(batch).__name__}); subclass it, or drop --pipeline"
        )
    by_keys = {frozenset(v.keys()): name for name, v in kjt_fields(batch).items()}
    out = {}
    for path, m in model.named_modules():
        if not isinstance(m, G.torchrec_types()):
            continue
        configs = m.embedding_bag_configs() if isinstance(m, EmbeddingBagCollection) else m.embedding_configs()
        features = frozenset(f for t in configs for f in t.feature_names)
        if features not in by_keys:
            raise UsageError(
                f"--model {spec}: --pipeline calls each TorchRec module on one batch field, and no KJT field of the "
                f"batch holds exactly the features of {path} ({', '.join(sorted(features))}); drop --pipeline"
            )
        out[path] = by_keys[features]
    return out


def kjt_fields(batch) -> dict:
    """The batch's KeyedJaggedTensor fields by name: the IDs of the workload's tables."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from gembench.workload import batch_fields

    return {k: v for k, v in batch_fields(batch).items() if isinstance(v, KeyedJaggedTensor)}


def declared_pooling(workload: Workload) -> dict[str, float]:
    """The pooling the workload declares per table (pooling(); TorchRec's default 1 elsewhere):
    what --rebalance's section sets the measured pooling beside."""
    given = workload.pooling()
    return {t.name: float(given.get(t.name, P.POOLING_DEFAULT)) for t in workload.tables()}


def _nothing():
    """The step's autocast is generic_step's own."""
    import contextlib

    return contextlib.nullcontext()
