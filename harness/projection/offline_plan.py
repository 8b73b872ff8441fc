"""TorchRec's sharding plan for a world of any size, made offline: meta tensors, no process group.

The planner sees a Topology built from the cluster and one ParameterConstraints per table (its
pooling factor, the sharding types it may take), and rates every plan it finds with the
projection's own cost model (`ProjectedStep`, a TorchRec PerfModel): the plan kept is the one
projected fastest. Each table is offered what TorchRec has for it where it applies: data_parallel,
table_wise, column_wise (blocks of CW_BLOCK), row_wise, and across nodes table_row_wise and grid.

The search (`ClassDescent`, a TorchRec Proposer): from the options TorchRec's own estimate ranks
first, each class of identical tables tries its other sharding types, the faster plan kept.

Kept for speed (``search="fast"``, the default; ``"full"`` lifts them, docs/projection.md has
what each costs): data_parallel only for tables that fit (``dp_limit``: their replicated state in
DP_HBM_SHARE of a GPU's HBM); row_wise, one shard per GPU,
for the largest tables while their shards stay under ROW_WISE_SHARDS (table_row_wise and grid
split the others within a node); the descent alone, not TorchRec's four proposers after it,
stopped after PLAN_BUDGET_S of CPU time in its proposals (not TorchRec's wall-clock timeout: a
loaded machine would rate fewer plans and keep another). Always: TorchRec's perf estimate
is made once per distinct shard (`OncePerShape`), and the HBM of the dense side is reserved from
gembench's own estimate. Plans are cached by config, world, batch, cluster, search and pricing.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from gembench.errors import UsageError
from gembench.harness.device.calibration import cache_dir
from gembench.harness.projection.cluster import Cluster
from gembench.harness.projection.subject import Subject
from gembench.harness.train.distributed.plan import PlanRecorder, sharders, table_constraints

SEARCHES = ("fast", "full")
# a replicated table holds weights, gradient and Adam state on every GPU (DP_STATE_BYTES an element)
DP_HBM_SHARE = 0.25
ROW_WISE_SHARDS = 2**16  # row_wise is a shard per GPU: the largest tables get it while their shards fit
CW_BLOCK = 64  # column-wise and grid blocks: dims of 128 and 160 split in two (TorchRec's own: 128)
PLAN_BUDGET_S = 20  # fast search: the descent stops proposing after this much CPU time (plans rated so far)
PLAN_VERSION = 8  # bump when what is cached changes, or how plans are priced


@dataclass
class OfflinePlan:
    tables: dict[str, dict]  # name -> sharding, ranks, shard_sizes, shard_offsets (as a result's plan)
    seconds: float  # planner time when it was made
    cached: bool
    fits: bool
    error: str = ""
    search: str = "fast"
    proposals: int = 0  # plans the planner partitioned and the cost model rated
    best_imbalance: float | None = None  # the lowest projected imbalance among them
    restrictions: list[dict] = field(default_factory=list)  # {what, tables}: kept for speed
    cpu_seconds: float = 0.0  # this process's CPU time planning: the wall clock less what other jobs took


_MODULES: dict[tuple, object] = {}  # one per table layout: only read by the planner, kept for the next world


def embedding_module(m: Subject):
    """The model's embedding tables on the meta device, in a module the planner can walk."""
    import torch
    from torch import nn
    from torchrec import EmbeddingBagCollection, EmbeddingCollection

    pooled = [t for t in m.tables if t.name not in m.sequences]
    sequences = [t for t in m.tables if t.name in m.sequences]
    key = tuple((t.name, t.num_embeddings, t.embedding_dim, tuple(t.feature_names)) for t in m.tables)
    if key not in _MODULES:
        meta = torch.device("meta")
        module = nn.Module()
        if pooled:
            module.pooled = EmbeddingBagCollection(tables=pooled, device=meta)
        if sequences:
            module.sequence = EmbeddingCollection(tables=sequences, device=meta)
        _MODULES.clear()
        _MODULES[key] = module
    return _MODULES[key]


def candidates(m: Subject, world: int, gpus_per_node: int, search: str, dp_max_bytes: float) -> tuple[dict, list[dict]]:
    """Per table the sharding types offered, and the restrictions that left some out (fast search).

    A split applies where the table has a row per shard (row_wise over the world, table_row_wise
    and grid over a node's GPUs) or two column blocks (column_wise, grid); table_row_wise and grid
    across nodes only, for pooled tables (TorchRec shards sequence tables DP, TW, CW or RW)."""
    g, multi = min(world, gpus_per_node), world > gpus_per_node
    fast = search == "fast"
    types, dropped = {}, {"dp": 0, "rw": 0}
    unpooled = m.sequences
    tables = sorted(m.tables, key=lambda t: (t.name in unpooled, t.num_embeddings), reverse=True)
    row_wise = 0  # shards of the row_wise options so far: sequence tables (their only split) first, then the largest
    for t in tables:
        rows, dim, pooled = t.num_embeddings, t.embedding_dim, t.name not in unpooled
        blocks = dim >= 2 * CW_BLOCK
        offer = ["table_wise"]
        if world > 1:
            offer.append("data_parallel")
            if fast and rows * dim * 4 > dp_max_bytes:
                offer.pop()
                dropped["dp"] += 1
        if blocks:
            offer.append("column_wise")
        if rows >= world > 1:
            offer.append("row_wise")
            row_wise += world
            if fast and pooled and row_wise > ROW_WISE_SHARDS:
                offer.pop()
                row_wise -= world
                dropped["rw"] += 1
        if pooled and multi and rows >= g:
            offer += ["table_row_wise"] + (["grid_shard"] if blocks else [])
        types[t.name] = offer
    types = {t.name: types[t.name] for t in m.tables}  # the model's order
    restrictions = []
    if fast and dropped["dp"]:
        restrictions.append(
            {
                "what": f"data_parallel only for tables that fit, under {dp_max_bytes / 2**20:,.0f} MiB",
                "tables": dropped["dp"],
            }
        )
    if fast and dropped["rw"]:
        restrictions.append(
            {"what": f"row_wise for the largest tables, {ROW_WISE_SHARDS:,} shards", "tables": dropped["rw"]}
        )
    if fast:
        restrictions.append(
            {"what": "class-wise descent alone (full: and TorchRec's four proposers)", "tables": len(types)}
        )
    return types, restrictions


def constraints(m: Subject, ids: dict[str, float], types: dict[str, list[str]]) -> dict:
    """Each table's pooling factor, its sharding types, fused kernels (dense for data_parallel)."""
    return table_constraints(ids, types, compute_kernels=["fused", "dense"], min_partition=CW_BLOCK)


def topology(cluster: Cluster, world: int):
    from torchrec.distributed.planner import Topology

    return Topology(
        world_size=world,
        local_world_size=min(world, cluster.gpus_per_node),
        compute_device="cuda",
        hbm_cap=int(cluster.hbm_bytes),
        hbm_mem_bw=cluster.hbm_Bps,
        intra_host_bw=cluster.intra.bandwidth_Bps,
        inter_host_bw=cluster.inter.bandwidth_Bps,
    )


class OncePerShape:
    """A TorchRec ShardEstimator run once per distinct shard: its estimate of a shard depends on the
    option (table shape, sharding type, kernel, pooling) and the shard's size only, so the W equal
    shards of a row_wise or data_parallel option, or the options of identical tables, are
    estimated once and share the figures (the same numbers as estimating each, in less time)."""

    def __init__(self, inner):
        self.inner = inner
        self.memo: dict[tuple, dict[tuple, object]] = {}  # option's key -> shard size -> Perf

    @staticmethod
    def _key(so) -> tuple:
        t = so.tensor
        return (so.module_type_key, so.sharding_type, so.compute_kernel, tuple(t.shape), str(t.dtype)) + (
            tuple(so.input_lengths),
            so.batch_size,
            so.is_pooled,
        )

    def estimate(self, sharding_options, sharder_data_map=None) -> None:
        from torchrec.distributed.planner.types import Shard

        proxies = []
        for so in sharding_options:
            known = self.memo.setdefault(self._key(so), {})
            missing = sorted({tuple(s.size) for s in so.shards} - set(known))
            if missing:
                proxy = copy.copy(so)
                proxy.shards = [Shard(size=list(size), offset=[0, 0]) for size in missing]
                proxies.append((known, proxy))
                known.update({size: None for size in missing})  # another option of this key reuses them
        if proxies:
            self.inner.estimate([p for _, p in proxies], sharder_data_map=sharder_data_map)
        for known, proxy in proxies:
            known.update({tuple(s.size): s.perf for s in proxy.shards})
        for so in sharding_options:
            known = self.memo[self._key(so)]
            for s in so.shards:
                s.perf = copy.copy(known[tuple(s.size)])


class ProjectedStep:
    """A TorchRec PerfModel: a plan's rating is its projected step (cost.Pricer), so the planner
    keeps the plan the projection says is fastest. Counts the plans and their best imbalance."""

    def __init__(self, pricer):
        self.pricer = pricer
        self.rated = 0
        self.best_imbalance = float("inf")

    def rate(self, plan) -> float:
        tables = {
            so.name: {
                "sharding": so.sharding_type,
                "ranks": [s.rank for s in so.shards],
                "shard_sizes": [s.size for s in so.shards],
                "shard_offsets": [s.offset for s in so.shards],
            }
            for so in plan
        }
        r = self.pricer.rate(tables)
        self.rated += 1
        self.best_imbalance = min(self.best_imbalance, r.imbalance)
        return r.step_time_s


class ClassDescent:
    """A TorchRec Proposer: descent over the plan's rating, one class of tables at a time.

    Tables of one shape, pooling (two digits) and module are a class (xl's 300 of 10M rows are one);
    each class starts at the option TorchRec's own estimate ranks first, as GreedyProposer does.
    A pass moves the largest 2, 4, 8, ... classes at one sharding type to another, then each
    class alone to each of its other types, the rest kept; a faster plan (feedback's perf_rating:
    `ProjectedStep`) is kept at once. It stops after a pass that found nothing faster, after
    MAX_PASSES passes, or after ``budget_s`` of this process's CPU time since its first proposal
    (``timed_out``): CPU time, so that a machine shared with other jobs keeps the same plan."""

    MAX_PASSES = 3
    clock = staticmethod(time.process_time)

    def __init__(self, budget_s: float | None = None):
        self.exhausted, self.timed_out = False, False
        self.budget_s, self._start = budget_s, None

    def load(self, search_space, enumerator=None) -> None:
        by_fqn: dict[str, list] = {}
        for so in search_space:
            by_fqn.setdefault(so.fqn, []).append(so)
        classes: dict[tuple, list[str]] = {}
        self._options: dict[str, dict[tuple, object]] = {}
        for fqn, options in by_fqn.items():
            options.sort(key=lambda o: max(s.perf.total for s in o.shards))  # TorchRec's rank of them
            labels = tuple((o.sharding_type, o.compute_kernel) for o in options)
            self._options[fqn] = dict(zip(labels, options))
            so = options[0]
            pooling = tuple(f"{x:.2g}" for x in so.input_lengths)  # means of sampled IDs: alike within 1%
            key = (so.module_type_key, tuple(so.tensor.shape), pooling, tuple(sorted(labels)))
            classes.setdefault(key, []).append(fqn)
        members = list(classes.values())
        size = lambda fqns: (by_fqn[fqns[0]][0].tensor.numel(), len(fqns))  # noqa: E731
        self._classes = sorted(members, key=size, reverse=True)  # the largest tables first
        self._labels = [[(o.sharding_type, o.compute_kernel) for o in by_fqn[c[0]]] for c in self._classes]
        self._best = [0] * len(self._classes)
        self._rating = float("inf")
        self._moves = self._pass()
        self._candidate = list(self._best)
        self._passes, self._improved = 1, False
        self.exhausted = False

    def _pass(self):
        """Moves from the best plan so far: the 2, 4, 8, ... largest classes now at sharding A that
        can take B, to B (a size threshold, as data-parallel against split tables is); then each
        class alone to each of its other types."""
        now = {self._labels[c][j] for c, j in enumerate(self._best)}
        every = {label for labels in self._labels for label in labels}
        for a in sorted(now):
            for b in sorted(every - {a}):
                at = [c for c, labels in enumerate(self._labels) if labels[self._best[c]] == a and b in labels]
                k = 2
                while k <= len(at):  # self._classes run largest first
                    yield {c: self._labels[c].index(b) for c in at[:k]}
                    k = k * 2 if k * 2 <= len(at) or k == len(at) else len(at)
        for c, labels in enumerate(self._labels):
            for j in range(len(labels)):
                if j != self._best[c]:
                    yield {c: j}

    def propose(self):
        if self._candidate is None:
            self.exhausted = True
            return None
        now = self.clock()
        self._start = now if self._start is None else self._start
        if self.budget_s is not None and now - self._start > self.budget_s:
            self.timed_out = True
            return None
        return [
            self._options[fqn][self._labels[c][self._candidate[c]]]
            for c, fqns in enumerate(self._classes)
            for fqn in fqns
        ]

    def feedback(self, partitionable: bool, plan=None, perf_rating=None, storage_constraint=None) -> None:
        if partitionable and perf_rating is not None and perf_rating < self._rating:
            self._rating, self._best, self._improved = perf_rating, list(self._candidate), True
        move = next(self._moves, None)
        if move is None and self._improved and self._passes < self.MAX_PASSES:
            self._moves, self._passes, self._improved = self._pass(), self._passes + 1, False
            move = next(self._moves, None)
        if move is None:
            self._candidate = None
            return
        self._candidate = list(self._best)
        for c, j in move.items():
            self._candidate[c] = j


def _cache_path(m: Subject, world: int, batch: int, cluster: Cluster, key: str) -> Path:
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return cache_dir() / "plans" / f"{m.name}-{m.hash}-w{world}-b{batch}-{cluster.hash()}-{digest}.json"


def dp_limit(cluster: Cluster) -> float:
    """The largest table (fp32 weights) the fast search offers data_parallel: one whose weights,
    gradient and Adam state fit in DP_HBM_SHARE of a GPU's HBM."""
    from gembench.harness.projection.volumes import DP_STATE_BYTES

    return DP_HBM_SHARE * cluster.hbm_bytes * 4 / DP_STATE_BYTES


def plan_offline(
    m: Subject,
    world: int,
    per_rank_batch: int,
    cluster: Cluster,
    reserved_bytes: float,
    pricer,
    pricing: str,
    ids: dict[str, float],
    forced: str | None = None,
    use_cache: bool = True,
    search: str = "fast",
    dp_max_bytes: float | None = None,
) -> OfflinePlan:
    """TorchRec's plan for ``world`` GPUs of ``cluster`` at ``per_rank_batch`` examples per rank,
    the one ``pricer`` (cost.Pricer of this setup; ``pricing`` names it for the cache) projects
    fastest; ``ids``: mean IDs per example per table (Subject.ids); ``dp_max_bytes``: the largest
    table (fp32 weights) offered data_parallel (default: ``dp_limit`` of the cluster)."""
    dp_max_bytes = dp_limit(cluster) if dp_max_bytes is None else dp_max_bytes
    types, restrictions = candidates(m, world, cluster.gpus_per_node, search, dp_max_bytes)
    if forced:
        types, restrictions = {t: [forced] for t in types}, []
    key = f"{forced or 'auto'}-{search}-r{int(reserved_bytes) >> 20}-{pricing}-dp{int(dp_max_bytes)}-v{PLAN_VERSION}"
    path = _cache_path(m, world, per_rank_batch, cluster, key)
    if use_cache and path.exists():
        try:
            data = json.loads(path.read_text())
            return OfflinePlan(**data, cached=True)
        except (OSError, ValueError, TypeError):
            pass  # a damaged cache entry is planned again
    if reserved_bytes >= 0.95 * cluster.hbm_bytes:  # no plan can fit: the planner is not asked
        need = f"{reserved_bytes / 2**30:,.0f} of {cluster.hbm_bytes / 2**30:,.0f} GiB"
        return OfflinePlan({}, 0.0, False, False, f"the dense side alone needs {need} per GPU", search)
    share = min(max(reserved_bytes / cluster.hbm_bytes, 0.0), 0.95)  # of each GPU's HBM, for the dense side
    quiet = [(lg, lg.level) for lg in (logging.getLogger(), logging.getLogger("torchrec"))]
    for lg, _ in quiet:  # TorchRec's advice on TopologyFactory, dry runs and data-parallel specs
        lg.setLevel(logging.ERROR)
    try:
        return _plan(m, world, per_rank_batch, cluster, share, pricer, ids, types, restrictions, search, path)
    finally:
        for lg, level in quiet:
            lg.setLevel(level)


def _plan(m, world, per_rank_batch, cluster, share, pricer, ids, types, restrictions, search, path) -> OfflinePlan:
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.constants import DEFAULT_PERF_ESTIMATOR
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.estimator import EmbeddingPerfEstimatorFactory
    from torchrec.distributed.planner.proposers import GreedyProposer, GridSearchProposer, UniformProposer
    from torchrec.distributed.planner.shard_estimators import EmbeddingStorageEstimator
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation

    start, cpu = time.perf_counter(), time.process_time()
    topo = topology(cluster, world)
    cons = constraints(m, ids, types)
    estimators = [
        OncePerShape(EmbeddingPerfEstimatorFactory.create(DEFAULT_PERF_ESTIMATOR, topology=topo, constraints=cons)),
        EmbeddingStorageEstimator(topology=topo, constraints=cons),
    ]
    recorder, rating = PlanRecorder(world), ProjectedStep(pricer)
    descent = ClassDescent(PLAN_BUDGET_S if search == "fast" else None)
    proposers = [descent]
    if search == "full":  # and TorchRec's own four
        proposers += [GridSearchProposer(), GreedyProposer(), GreedyProposer(use_depth=False), UniformProposer()]
    planner = EmbeddingShardingPlanner(
        topology=topo,
        batch_size=per_rank_batch,
        enumerator=EmbeddingEnumerator(topo, per_rank_batch, cons, estimator=estimators),
        proposer=proposers,
        performance_model=rating,
        storage_reservation=FixedPercentageStorageReservation(share),
        constraints=cons,
        stats=[recorder],
        debug=False,
    )
    try:
        planner.plan(embedding_module(m), sharders())
        fits, error = True, ""
    except Exception as err:  # noqa: BLE001  the planner says which table found no room
        fits, error = False, _first_line(err)
    best = rating.best_imbalance if rating.rated else None
    if search == "fast" and fits and descent.timed_out:
        restrictions = restrictions + [{"what": f"search stopped at its {PLAN_BUDGET_S} s CPU budget", "tables": 0}]
    result = OfflinePlan(
        recorder.tables,
        time.perf_counter() - start,
        False,
        fits,
        error,
        search,
        rating.rated,
        best,
        restrictions,
        time.process_time() - cpu,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    data = {k: v for k, v in result.__dict__.items() if k != "cached"}
    tmp.write_text(json.dumps(data))
    tmp.replace(path)
    return result


def _first_line(err: Exception) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    useful = [line for line in lines if "does not fit" in line or "Couldn't find" in line or "failed" in line]
    return (useful or lines or [type(err).__name__])[0][:300]


def plan_from_result(result: dict) -> dict[str, dict]:
    """The plan a measured distributed run used, as recorded in its result."""
    tables = result.get("plan")
    if not tables:
        raise UsageError("the result has no recorded plan (run it with --nproc N)")
    return tables
