"""One rank of `gembench run --model SPEC --nproc N`: a workload's model under TorchRec's DMP.

The same job as rank.py's for a config: the same seed on every rank, TorchRec's planner (told the
workload's pooling, its sharders and constraints where it gives them), DMP with DDP over the dense
part, the timed steps in the one step loop, one counted step and profiled steps after them, the
measured lookup load, one record per rank and one result on rank 0. The step is generic.py's:
sparse_forward is the time inside the sharded modules' forward (input dist, lookup, output dist
waited for), dense_forward the rest, then loss, backward (DDP's all-reduce inside it), optimizer.
Not yet for a workload: --pipeline, dense_parallel=fsdp/hsdp, --rebalance (refused before launch).
"""

from __future__ import annotations

import socket

import numpy as np
import torch
import torch.distributed as dist

from gembench.errors import UsageError
from gembench.harness.metrics import counters as C
from gembench.harness.metrics.imbalance import hot_share
from gembench.harness.train import generic as G
from gembench.harness.train.distributed import loads as L
from gembench.harness.train.distributed import plan as P
from gembench.harness.train.memory import (
    SavedForBackward,
    peak_memory_bytes,
    reset_peak_memory,
    run_memory_bytes,
)
from gembench.harness.train.result import Sharded, build_result, recheck, timed_batches
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
    options = on_ranks(args.options, False)
    if options.dense_parallel != "ddp":
        raise UsageError(f"--model: dense_parallel={options.dense_parallel} is not yet applied to a workload; use ddp")
    if args.rebalance:
        raise UsageError("--rebalance re-plans gembench's synthetic tables: not yet for --model")
    G.applied_switches(workload, options)
    P.parse_sharding(args.sharding, [t.name for t in workload.tables()])
    return workload


def shard(workload: Workload, model, env: dict, dev: torch.device, local_batch: int, sharding: str | None):
    """TorchRec's plan for the workload's model and DMP over it (DDP over the dense part)."""
    forced = P.parse_sharding(sharding, P.table_names(model))
    pooling = None if sharding == "untold" else workload.pooling()
    sharders = workload.sharders()
    plan, planned = P.plan_sharding(
        model, forced, env, dev, local_batch, pooling, sharders=sharders, constraints=workload.constraints()
    )
    return P.shard(model, plan, dev, ddp=True, sharders=sharders), planned


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


def run(args: RunConfig, env: dict, dev: torch.device, watchdog, fault) -> dict:
    """This rank's whole job for a workload; the result on rank 0 ({} on the others)."""
    from gembench.harness.train.distributed import rank as R
    from gembench.harness.train.parallelize import dense_state_bytes
    from gembench.harness.train.stack import autocast_for, dense_optimizer, on_ranks

    rank, world = env["rank"], env["world_size"]
    workload = check(args, world)
    local_batch = R.per_rank_batch(workload.global_batch, world)
    watchdog.at("peak")
    peak, host_peak = R._peaks(dev, args, env)
    options = on_ranks(args.options, False)
    watchdog.at("data")
    total = args.warmup + args.steps + R.COUNTED_STEPS + R.PROFILED_STEPS
    batches, ident = G.prepared(workload, args.seed, world, rank, count=min(total, R.MAX_DISTINCT_BATCHES))
    timed = timed_batches(batches, args.warmup, args.steps)

    watchdog.at("build")
    start_bytes = reset_peak_memory(dev)
    model = G.seeded(workload, dev, args.seed)  # same seed on every rank: identical replicated weights
    flops, basis = G.flops_of(workload, model, batches)  # on the unsharded model, before DMP takes it
    G.apply_ac(workload, model, options.activation_checkpointing)
    unsharded = {k: v.detach().clone() for k, v in model.state_dict().items()}
    watchdog.at("plan")
    dmp, planned = shard(workload, model, env, dev, local_batch, args.sharding)
    load_unsharded(dmp, unsharded)
    del unsharded
    G.apply_compile(workload, dmp.module, options)
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
    watchdog.at("load count")
    loads = measure_loads(workload, dmp, timed[: R.LOAD_BATCHES], dev)
    shape = G.described(workload, timed_batches(flops, args.warmup, args.steps), timed, options)
    since = C.fresh_compile_state()

    def engine_step(i: int):
        watchdog.at("step", i)
        if fault:
            fault.trigger(rank, i, "step")
        clock = StageClock(dev, STAGES)
        loss = train_step(state, batches[i % len(batches)], clock)
        return loss, clock.durations()

    counted = C.StepCounter(dev, [optimizer])
    saved = SavedForBackward(dmp.parameters())
    at_end: dict = {}

    def timed_end():
        at_end.update(peak=peak_memory_bytes(dev), run=run_memory_bytes(dev, start_bytes))

    samples, prof = R._steps(
        engine_step, STAGES, total, args, dev, counted, saved, _nothing, rank == 0 and not args.quiet, timed_end
    )
    watchdog.at("analysis")
    comm_stats, counts = R.profiled_costs(prof, args, rank, world, counted, since)
    loads["lookup_s"] = float(np.mean(samples.stages["sparse_forward"]))
    storage = planned.storage
    share = storage[rank] / sum(storage) if sum(storage) else 1.0 / world
    estimate = G.memory_estimate(G.parameter_shapes(workload), options, dev.type, embedding_share=share)
    me = R._Rank(args, env, dev, None, options, local_batch, watchdog, fault, peak, host_peak)
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
        dense_state_bytes(dense, optimizer),
        saved,
    )
    records = R._gather(record, rank, world, watchdog)
    if rank != 0:
        return {}
    watchdog.at("peak check")
    mine = [r for r in records if r["host"] == socket.gethostname()]
    recheck(peak, mine, [f" of rank {r['rank']}" for r in mine])
    sharded = Sharded(planned, R._indices(args, batches), dist.get_backend(), args.sharding, False, args.timeout)
    result = build_result(ident, args, records, options, sharded)
    sparse = len(P.sharded_modules(dmp.module))
    result["workload"] = G.section(workload, ident, basis, options, batches[0], sparse)
    return result


def _nothing():
    """The step's autocast is generic_step's own."""
    import contextlib

    return contextlib.nullcontext()
