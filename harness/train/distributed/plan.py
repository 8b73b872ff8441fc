"""Sharding: TorchRec's plan for this job and DistributedModelParallel over it.

The sparse arch is sharded by TorchRec's DistributedModelParallel with a plan from TorchRec's
EmbeddingShardingPlanner over a Topology of this job (world size, ranks per host, device kind);
``--sharding`` forces a sharding type for all tables or per table through ParameterConstraints.
Embedding tables train with TorchRec's fused row-wise Adagrad (applied inside the backward),
at the stack's learning rate (harness/train/stack.py).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch import nn

from gembench.errors import UsageError
from gembench.harness.metrics.startup import Startup
from gembench.harness.train.distributed import sparse2d
from gembench.harness.train.stack import ADAGRAD_EPS, EMBEDDING_LR
from gembench.workload import Workload

POOLING_DEFAULT = 1.0  # TorchRec's own default pooling factor
MIN_POOLING = 1e-3  # a table no example looks up still needs a positive factor
SHARDING_TYPES = ("table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel")
# --rebalance's plans keep every table sharded: a data_parallel table trains with the dense
# optimizer, a sharded one with the fused row-wise Adagrad, so a re-plan between the two would
# change the table's training and carry.py could not move its optimizer state
SHARDED_TYPES = SHARDING_TYPES[:-1]
ROW_SPLITS = ("row_wise", "table_row_wise", "grid_shard")
# a table split by rows over W ranks keeps at least this many rows a shard: a 20-row table split
# row-wise pays every rank's collectives to serve a handful of rows (the planner offers it anyway)
MIN_ROWS_PER_SHARD = 1024


def table_rows(model: nn.Module) -> dict[str, int]:
    """Rows of every embedding table (EmbeddingBagCollection and EmbeddingCollection), by name."""
    from torchrec import EmbeddingBagCollection, EmbeddingCollection

    rows = {}
    for m in model.modules():
        if isinstance(m, EmbeddingBagCollection):
            rows.update({t.name: t.num_embeddings for t in m.embedding_bag_configs()})
        elif isinstance(m, EmbeddingCollection):
            rows.update({t.name: t.num_embeddings for t in m.embedding_configs()})
    return rows


def table_names(model: nn.Module) -> list[str]:
    return list(table_rows(model))


def parse_sharding(spec: str | None, tables: list[str]) -> dict[str, str]:
    """``--sharding`` -> {table: sharding type} for the tables it forces (empty: planner's choice).

    ``row_wise`` forces every table; ``t0=row_wise,default=table_wise`` forces table t0 (a table
    is named as its feature, e.g. t0 or clicks, or in full, table_t0) and every other table.
    """
    if not spec or spec in ("auto", "untold"):  # untold: the planner without pooling factors (rank.py)
        return {}
    short = {t.removeprefix("table_"): t for t in tables}
    forced: dict[str, str] = {}
    default = None
    for item in spec.split(","):
        name, _, kind = item.strip().rpartition("=")
        if kind not in SHARDING_TYPES:
            raise UsageError(
                f"--sharding: {kind!r} is not a sharding type; pick one of {', '.join(SHARDING_TYPES)} (or auto)"
            )
        if not name or name == "default":
            default = kind
            continue
        table = short.get(name, name if name in tables else None)
        if table is None:
            raise UsageError(f"--sharding: no table {name!r} in this config; tables are {', '.join(sorted(short))}")
        forced[table] = kind
    if default:
        forced = {t: forced.get(t, default) for t in tables}
    return forced


def default_sharders():
    """TorchRec's sharders, with row-wise pooled sharding allowed on CPU.

    TorchRec lists row_wise / table_row_wise for EmbeddingBagCollection on CUDA only, but the
    CPU kernels and gloo's reduce-scatter run them; without this a CPU job could not measure
    how row-wise sharding levels a hot table.
    """
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    class PooledSharder(EmbeddingBagCollectionSharder):
        def sharding_types(self, compute_device_type: str) -> list[str]:
            types = super().sharding_types(compute_device_type)
            extra = [t for t in ("row_wise", "table_row_wise") if t not in types]
            return types + extra if compute_device_type == "cpu" else types

    # the single-process stack's learning rate and eps (harness/train/stack.py); TorchRec's sharded
    # kernels offer row-wise Adagrad, not the exact per-element one
    fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": EMBEDDING_LR, "eps": ADAGRAD_EPS}
    return [PooledSharder(fused_params=fused), EmbeddingCollectionSharder(fused_params=fused)]


class LookupBytes:
    """A TorchRec ShardEstimator for CPU jobs: a shard's lookup priced at the bytes it moves over
    the topology's memory bandwidth, rows read plus outputs written (what loads.lookup_load
    measures), in place of TorchRec's GPU kernel terms (rows of under 32 columns priced as 32, a
    block-usage penalty, index reads), which weighed a CPU rank's tables 20-30% off their bytes.
    Rows are read at the table's pooling factor, uniformly over its rows (DeclaredSkew, after it,
    prices the skew); a pooled shard writes one row of its width per example, a sequence shard one
    per ID. The backward keeps TorchRec's backward/forward proportion; comms untouched."""

    def __init__(self, world: int, bandwidth: float):
        self.world, self.bandwidth = world, bandwidth  # bytes/ms, TorchRec's unit

    def estimate(self, sharding_options, sharder_data_map=None) -> None:
        for option in sharding_options:
            rows = option.tensor.shape[0]
            examples = option.batch_size * (1 if option.sharding_type == "data_parallel" else self.world)
            for shard in option.shards:
                if shard.perf is None:
                    continue
                width = shard.size[1] * option.tensor.element_size()
                ids = examples * sum(option.input_lengths) * shard.size[0] / rows
                written = examples * width if option.is_pooled else ids * width
                fwd = (ids * width + written) / self.bandwidth
                p = shard.perf
                bwd = p.bwd_compute * fwd / p.fwd_compute if p.fwd_compute > 0 else 2 * fwd
                shard.perf = dataclasses.replace(p, fwd_compute=fwd, bwd_compute=bwd)


class DeclaredSkew:
    """A TorchRec ShardEstimator: a row-split shard's lookup compute priced at the share of lookups
    its rows serve under the workload's row_skew() (metrics/imbalance.py's zipf_share, hottest rows
    first), where TorchRec prices every row alike. Runs after TorchRec's EmbeddingPerfEstimator
    and scales its fwd and bwd compute; comms untouched."""

    def __init__(self, skew: dict[str, float]):
        self.skew = skew

    def estimate(self, sharding_options, sharder_data_map=None) -> None:
        from gembench.harness.metrics.imbalance import zipf_share

        for option in sharding_options:
            alpha = self.skew.get(option.name, 0.0)
            if not alpha or option.sharding_type not in ROW_SPLITS:
                continue
            rows = option.tensor.shape[0]
            for shard in option.shards:
                if shard.perf is None:
                    continue
                lo, size = shard.offset[0], shard.size[0]
                factor = zipf_share(lo, lo + size, rows, alpha) / (size / rows)
                p = shard.perf
                shard.perf = dataclasses.replace(
                    p, fwd_compute=p.fwd_compute * factor, bwd_compute=p.bwd_compute * factor
                )


class PlanRecorder:
    """A planner Stats hook: keeps the planner's per-rank estimates of the plan it chose.

    perf (ms per step: forward + backward compute and comms of the shards on a rank, TorchRec's
    cost model), its lookup share (the compute alone: what the measured bytes read compare with)
    and storage (bytes) per rank, and the placement of each table's shards.
    """

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.perf = [0.0] * world_size
        self.lookup = [0.0] * world_size
        self.storage = [0.0] * world_size
        self.tables: dict[str, dict] = {}

    def log(
        self,
        sharding_plan,
        topology,
        batch_size,
        storage_reservation,
        num_proposals,
        num_plans,
        run_time,
        best_plan,
        *args,
        **kwargs,
    ) -> None:
        for option in best_plan:
            ranks = []
            for shard in option.shards:
                if shard.rank is None:
                    continue
                ranks.append(shard.rank)
                if shard.perf is not None:
                    self.perf[shard.rank] += float(shard.perf.total)
                    self.lookup[shard.rank] += float(shard.perf.fwd_compute + shard.perf.bwd_compute)
                if shard.storage is not None:
                    self.storage[shard.rank] += float(shard.storage.hbm + shard.storage.ddr)
            self.tables[option.name] = {
                "sharding": option.sharding_type,
                "kernel": option.compute_kernel,
                "ranks": ranks,
                "shard_sizes": [list(s.size) for s in option.shards],
                "shard_offsets": [list(s.offset) for s in option.shards],
            }


def allowed_types(rows: dict[str, int], world: int, forced: dict[str, str], sharded_only: bool) -> dict:
    """{table: the sharding types the planner may give it}, for the tables it may not give any:
    ``forced`` ones their one type; under ``sharded_only`` none data_parallel; a table too small to
    give every rank MIN_ROWS_PER_SHARD rows none split by rows."""
    allowed = list(SHARDED_TYPES) if sharded_only else list(SHARDING_TYPES)
    types = {t: [k for k in allowed if k not in ROW_SPLITS] for t, n in rows.items() if n < MIN_ROWS_PER_SHARD * world}
    if sharded_only:
        types = {t: allowed for t in rows if t not in types} | types
    return types | {t: [kind] for t, kind in forced.items()}


def table_constraints(pooling: dict[str, float], types: dict[str, list[str]], **extra) -> dict:
    """TorchRec ParameterConstraints per table: its pooling factor (mean IDs per example; a table
    with none gets TorchRec's default, an empty one a floor the planner can divide by) and, where
    given, the sharding types it may take; ``extra`` for every table (e.g. compute_kernels)."""
    from torchrec.distributed.planner import ParameterConstraints

    return {
        t: ParameterConstraints(
            sharding_types=types.get(t), pooling_factors=[max(pooling.get(t, POOLING_DEFAULT), MIN_POOLING)], **extra
        )
        for t in {*pooling, *types}
    }


def plan_sharding(
    model: nn.Module,
    forced: dict[str, str],
    env: dict,
    device: torch.device,
    batch_size: int,
    pooling: dict[str, float] | None = None,
    measured=None,
    sharders=None,
    constraints: dict | None = None,
    sharded_only: bool = False,
    skew: dict[str, float] | None = None,
):
    """TorchRec's plan for ``model`` on this job, honouring ``forced``; and the planner's view.

    ``pooling``: mean IDs per example per table (models.data.expected_ids_per_example, or as
    measured), given to the planner as each table's pooling factor; without it TorchRec prices
    every table as if it pooled one ID, and a table pooling 100 is planned like one pooling 1.
    ``measured``: a ShardEstimator run after TorchRec's own (rebalance.MeasuredLookups): each
    shard's lookup time from the load measured on it, TorchRec's communication estimates kept.
    ``sharders``, ``constraints``: a workload's own (workload.py, gembench.workload), over gembench's.
    ``sharded_only`` (--rebalance): tables not forced take any type but data_parallel. ``skew``:
    the workload's row_skew(), priced into row-split shards (DeclaredSkew) where nothing was
    measured. On a CPU, told the pooling, a lookup is priced at the bytes it moves (LookupBytes).
    A table too small to give every rank MIN_ROWS_PER_SHARD rows is not split by rows."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator, EmbeddingStorageEstimator

    topology = Topology(
        world_size=env["world_size"], local_world_size=env["local_world_size"], compute_device=device.type
    )
    types = allowed_types(table_rows(model), env["world_size"], forced, sharded_only)
    constraints = {**table_constraints(pooling or {}, types), **(constraints or {})}
    enumerator = None
    priced = []  # after TorchRec's estimate, in order
    if measured is not None:
        priced.append(measured)
    else:
        if device.type == "cpu" and pooling is not None:  # untold: TorchRec's planner as it ships
            priced.append(LookupBytes(env["world_size"], topology.ddr_mem_bw))
        if skew:
            priced.append(DeclaredSkew(skew))
    if priced:
        enumerator = EmbeddingEnumerator(
            topology=topology,
            batch_size=batch_size,
            constraints=constraints,
            estimator=[
                EmbeddingPerfEstimator(topology, constraints),
                *priced,
                EmbeddingStorageEstimator(topology, constraints),
            ],
        )
    recorder = PlanRecorder(env["world_size"])
    planner = EmbeddingShardingPlanner(
        topology=topology, batch_size=batch_size, enumerator=enumerator, constraints=constraints, stats=[recorder]
    )
    try:
        plan = planner.collective_plan(model, sharders or default_sharders(), dist.GroupMember.WORLD)
    except Exception as err:  # noqa: BLE001  the planner's own message names the table
        text = str(err).splitlines()[0]
        raise UsageError(f"TorchRec's planner found no plan for --sharding: {text}") from None
    return plan, recorder


def shard(model: nn.Module, plan, device: torch.device, ddp: bool, sharders=None, group: int = 0) -> nn.Module:
    """DMP over the model. With ``ddp`` (the pipeline's default) DMP wraps the dense part in DDP,
    which overlaps the gradient sync with the backward; otherwise the dense parameters stay plain:
    staged runs sync them in a stage of their own, and FSDP2 (harness/train/parallelize.py) shards them.
    ``group``: 2D sparse parallelism, ``plan`` made for groups of this many ranks (sparse2d.py)."""
    from torchrec.distributed.model_parallel import DataParallelWrapper, DistributedModelParallel

    class NoWrap(DataParallelWrapper):
        def wrap(self, dmp, env, device) -> None:  # dense params stay plain: grad_sync stage syncs them
            pass

    sharders = sharders or default_sharders()
    if group:
        return sparse2d.collection(model, plan, device, group, sharders, None if ddp else NoWrap())
    kwargs = {} if ddp else {"data_parallel_wrapper": NoWrap()}
    return DistributedModelParallel(model, device=device, plan=plan, sharders=sharders, **kwargs)


def dense_parameters(dmp: nn.Module) -> list[torch.Tensor]:
    """Replicated parameters: all but the sharded tables, whose fused optimizer runs in backward."""
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    return [p for _, p in in_backward_optimizer_filter(dmp.named_parameters())]


def data_parallel_tables(dmp: nn.Module) -> set[int]:
    """The weights of the tables ``dmp``'s plan replicates (ids). TorchRec wraps their lookup in a
    DDP of its own, which all-reduces their gradients in the backward: no one syncs them again."""
    replicated = {
        (path, table)
        for path, tables in dmp.plan.plan.items()
        for table, spec in tables.items()
        if spec.sharding_type == "data_parallel"
    }
    out = set()
    for name, p in dmp.named_parameters():  # <module path>.embedding_bags|embeddings.<table>.weight
        parts = name.rsplit(".", 3)
        if len(parts) == 4 and (parts[0], parts[2]) in replicated:
            out.add(id(p))
    return out


sharders = default_sharders  # the name the rest of the harness imports


def shard_workload(
    workload: Workload,
    model,
    env: dict,
    dev,
    local_batch: int,
    sharding,
    pooling,
    measured,
    ddp,
    sharded_only=False,
    startup: Startup | None = None,
    options=None,
):
    """TorchRec's plan for the workload's model (told ``pooling``; ``measured``, ``sharded_only``:
    --rebalance's estimator and its plans) and DMP over it, with DDP over the dense part
    (``ddp``) or the dense part plain (the staged step syncs it, or FSDP2 shards it next).
    ``startup``: the rank's start-up clock, told the plan and the sharding apart. ``options``: the
    stack's (StackOptions); under sparse_parallel=2d the plan is made for a group's ranks."""
    startup = startup or Startup()
    planning = env if options is None else sparse2d.planning_env(options, env)  # 2D: a group's ranks
    with startup.phase("plan"):
        forced = parse_sharding(sharding, table_names(model))
        sharders = workload.sharders()
        plan, planned = plan_sharding(
            model,
            forced,
            planning,
            dev,
            local_batch,
            pooling,
            measured,
            sharders=sharders,
            constraints=workload.constraints(),
            sharded_only=sharded_only,
            skew=workload.row_skew() if pooling is not None else None,  # --sharding untold: told nothing
        )
    with startup.phase("shard"):
        group = planning["world_size"] if planning is not env else 0
        return shard(model, plan, dev, ddp=ddp, sharders=sharders, group=group), planned
