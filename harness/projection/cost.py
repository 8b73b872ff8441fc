"""The projection's one cost model: a training step of a model on W GPUs of a cluster, per stage.

Constants and assumptions: docs/design.md section 8 and docs/projection.md. In short:

- Volumes per GPU from the plan (offline_plan.py, or a measured run's own) and the model's mean
  IDs per example (subject.py: the workload protocol, gembench's configs one provider of it); a
  row-split shard serves its rows' share of the lookups (uniform IDs) or the power law's mass
  over its rows (row_skew(): hot rows first, `zipf_share`).
- Collectives as TorchRec runs them, alpha-beta per family (`collective_time`, links from the
  cluster file: `Cluster.link`): the KJT all-to-all of IDs; table- and column-wise outputs by
  one all-to-all; row-wise by a world reduce-scatter; table_row_wise and grid by a reduce-scatter
  within the node, then an all-to-all of one GPU per node over the NICs; the backward mirrors
  them. Data-parallel tables as DMP runs them: looked up on every rank (no all-to-all: their
  input and output dists pass through), a gradient as large as the table written in the backward
  and all-reduced with the dense gradients, Adam-updated by the dense optimizer.
- Compute from a measured result or the datasheet; lookups as bytes over HBM; the fused update
  reads and writes each looked-up row once more (UPDATE_PER_LOOKUP).
- Overlap: ``staged`` (every stage on the critical path) or ``pipelined`` (TorchRec's sparse-dist
  pipeline and DDP's buckets). Each synchronized stage takes its slowest GPU: `Pricer.price`
  names it and what sets it (lookup bytes, all-to-all bytes, dense compute, gradient bytes).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from gembench.harness.metrics.comm import bus_factor
from gembench.harness.metrics.mfu import STAGE_FLOP_SHARE, mfu, train_flops
from gembench.harness.projection.cluster import Cluster
from gembench.harness.projection.subject import Subject
from gembench.harness.train.memory import ADAM_BYTES
from gembench.harness.train.parallelize import dense_shards as parallel_shards

STAGES = ("input_dist", "embedding_lookup", "output_dist", "dense_forward", "backward", "grad_sync", "optimizer")
COMM_STAGES = ("input_dist", "output_dist", "grad_sync")
KJT_CALLS = 3  # TorchRec's KJTAllToAll per sharding group: splits, then lengths, then values
ID_BYTES = 8  # int64 IDs in the KJT all-to-all (TorchRec's default index dtype)
LENGTH_BYTES = 4  # one int32 length per example and feature
EMB_BYTES = 4  # fp32 embedding rows and pooled outputs (TorchRec's default, no quantized comms)
UPDATE_PER_LOOKUP = 2.0  # fused row-wise Adagrad: read and write each looked-up row once more
DDP_BUCKET_BYTES = 25 * 2**20  # DDP's default bucket: the last one cannot overlap the backward
ADAM_STEP_BYTES = 4 + 4 + ADAM_BYTES + 4 + ADAM_BYTES  # read p, g, m, v; write p, m, v (fp32)
DP_STATE_BYTES = 16  # a data-parallel table's element: weight, gradient, Adam m and v (fp32)
ROW_SPLIT = ("row_wise", "table_row_wise", "grid_shard")
NODE_SPLIT = ("table_row_wise", "grid_shard")  # rows over one node's GPUs, outputs out by the NICs
SET_BY = {
    "input_dist": "all-to-all bytes",
    "embedding_lookup": "lookup bytes",
    "output_dist": "all-to-all bytes",
    "dense_forward": "dense compute",
    "grad_sync": "gradient bytes",
    "optimizer": "dense compute",
}


@dataclass(frozen=True)
class Exchange:
    """How the stack moves its bytes: TorchRec's and DDP's defaults. A published system that moves
    them otherwise (published.py: HugeCTR's fp16 exchange, SHARP) is priced with its own."""

    emb_bytes: int = EMB_BYTES  # per element of the pooled embeddings and their gradients sent
    grad_bytes: int = 4  # per element of the dense gradients reduced
    in_network_reduce: bool = False  # all-reduces reduced in the switches (SHARP): each byte over the NIC once


def collective_time(
    cluster: Cluster,
    family: str,
    nbytes: float,
    ranks: int,
    per_node: int | None = None,
    kind: str | None = None,
    in_network: bool = False,
) -> float:
    """Seconds for one collective over ``ranks`` GPUs of ``nbytes`` (nccl-tests' sizes: the send
    buffer of an all-to-all, the full buffer of the others). Within a node: latency + bus bytes /
    the intra link. Across N nodes of G GPUs, each GPU on its own NIC:
      all_to_all: (N-1)/N of the buffer leaves the node at the NIC rate, under the NVLink part;
      all_reduce: reduce-scatter in the node, all-reduce of 1/G across nodes, all-gather in the node;
      reduce_scatter / all_gather: the in-node step and 1/G of the buffer across the nodes.
    ``per_node``: the group's GPUs in each node (default: as many as fit); 1 for a group of one
    GPU per node (HSDP's replicas, table_row_wise's cross-node all-to-all): the NICs alone.
    ``kind``: the collective's job (cluster.KINDS), for links timed in a run per job; ``in_network``:
    an all-reduce the switches reduce (SHARP), its bytes over each NIC once, not 2(N-1)/N times."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    g = per_node or min(ranks, cluster.gpus_per_node)
    nodes = math.ceil(ranks / g)
    reduce_in_switch = in_network and family == "all_reduce"
    if g == 1:
        inter = cluster.link(family, across_nodes=True)
        factor = 1.0 if reduce_in_switch else bus_factor(family, nodes)
        return inter.latency_s + nbytes * factor / inter.bandwidth_Bps
    intra = cluster.link(family, across_nodes=False, kind=kind)
    if nodes == 1:
        return intra.latency_s + nbytes * bus_factor(family, g) / intra.bandwidth_Bps
    inter = cluster.link(family, across_nodes=True)
    if family == "all_to_all":
        leaving = nbytes * (nodes - 1) / nodes / inter.bandwidth_Bps
        staying = nbytes * (g - 1) / (g * nodes) / intra.bandwidth_Bps
        return inter.latency_s + max(leaving, staying)
    in_node = nbytes * bus_factor(family, g) / intra.bandwidth_Bps
    across = (nbytes / g) * (1.0 if reduce_in_switch else bus_factor(family, nodes)) / inter.bandwidth_Bps
    if family == "all_reduce":  # in_node already counts both halves (2(g-1)/g)
        return 2 * intra.latency_s + inter.latency_s + in_node + across
    return intra.latency_s + inter.latency_s + in_node + across


@dataclass(frozen=True)
class Compute:
    """Seconds per example per dense stage on one device, the optimizer's seconds per step over
    all the dense parameters (FSDP divides it by the shards), and the lookup's seconds per byte;
    from a measured result or from the cluster's datasheet."""

    per_example: dict[str, float]  # dense_forward, backward (dense part only)
    optimizer_s: float
    lookup_s_per_byte: float
    source: str
    # what a communication stage costs one rank besides the link (TorchRec's splits, permutes and
    # copies; DDP's bucket copies): the 1-rank result's time in that stage, where nothing is sent
    overhead_s: dict[str, float] = dataclasses.field(default_factory=dict)
    optimizer_s_per_param: float = 0.0  # Adam over one more parameter (a data-parallel table's)
    # parameters of data-parallel tables the stage times already hold (a reference run with the
    # checked plan's data-parallel tables: their lookups, dense gradients and Adam measured)
    dp_params: float = 0.0


def datasheet_compute(m: Subject, cluster: Cluster) -> Compute:
    fwd = sum(m.flops.values())
    rate = cluster.peak_tflops * 1e12 * cluster.efficiency
    per = {stage: fwd * STAGE_FLOP_SHARE[stage] / rate for stage in ("dense_forward", "backward")}
    dense = m.counts["dense_params"]
    return Compute(
        per,
        dense * ADAM_STEP_BYTES / cluster.hbm_Bps,
        1.0 / (cluster.hbm_Bps * cluster.lookup_efficiency),
        f"datasheet: {cluster.peak_tflops:g} TFLOP/s x {cluster.efficiency:g}, "
        f"HBM {cluster.hbm_Bps / 1e9:,.0f} GB/s x {cluster.lookup_efficiency:g}",
        optimizer_s_per_param=ADAM_STEP_BYTES / cluster.hbm_Bps,
    )


def measured_compute(result: dict) -> Compute:
    """From a measured result (one process or one rank): its stages per example. The lookup's rate
    is its forward lookup time over the bytes it read; the backward loses the embedding update it
    contains (UPDATE_PER_LOOKUP x the lookup time), which the projection adds back per rank."""
    ranks = result.get("ranks") or []
    if ranks:
        r = ranks[0]
        stages, batch = r["stage_means_s"], r["per_rank_batch"]
        read = (r.get("loads") or {}).get("bytes_read")
    else:
        stages = {k: v["time_s"] for k, v in result["summary"]["stages"].items()}
        batch = (
            result["run"].get("per_rank_batch")
            or result["run"].get("global_batch")
            or result["config"]["data"]["global_batch"]
        )
        read = (result["summary"].get("embedding_bytes_per_step") or {}).get("read")
    lookup = stages.get("embedding_lookup", 0.0)
    rate = lookup / read if read else 0.0
    options = result["run"].get("options") or {}
    nproc, nnodes = result["run"].get("nproc") or 1, result["run"].get("nnodes") or 1
    shards = {"fsdp": nproc, "hsdp": nproc // nnodes}.get(options.get("dense_parallel"), 1)
    backward = max(stages.get("backward", 0.0) - UPDATE_PER_LOOKUP * lookup, 0.0)
    dense = (result.get("model") or {}).get("dense_params") or 0
    optimizer = stages.get("optimizer", 0.0) * shards
    dp = data_parallel_params(result)  # stepped by the dense optimizer too
    return Compute(
        {"dense_forward": stages.get("dense_forward", 0.0) / batch, "backward": backward / batch},
        optimizer,
        rate,
        f"measured: {result.get('id', '?')} on {result['env'].get('device_name', '?')}, {batch} examples per rank",
        # only a run that sent nothing shows a communication stage's cost without the link
        {k: stages.get(k, 0.0) for k in COMM_STAGES} if (result["run"].get("nproc") or 1) == 1 else {},
        optimizer / (dense + dp) if dense + dp else 0.0,
        dp_params=dp,
    )


def data_parallel_params(result: dict) -> float:
    """Parameters of the tables a result's plan replicated (data_parallel), one copy: what its own
    stage times spent on them (their dense-kernel lookups, table-sized gradients, Adam)."""
    plan = result.get("plan") or {}
    return float(
        sum(t["shard_sizes"][0][0] * t["shard_sizes"][0][1] for t in plan.values() if t["sharding"] == "data_parallel")
    )


def zipf_share(lo: float, hi: float, rows: int, alpha: float) -> float:
    """What row_skew()'s exponents mean: the share of lookups of a table of ``rows`` rows whose IDs
    follow the bounded power law p(x) ~ x^-alpha (row 0 hottest) that land in rows [lo, hi).
    The law's CDF, F(x) = ((x + 1)^(1 - alpha) - 1) / ((rows + 1)^(1 - alpha) - 1), at hi minus at lo."""

    def cdf(x: float) -> float:
        if alpha == 0:
            return x / rows
        if abs(alpha - 1.0) < 1e-9:
            return math.log(x + 1) / math.log(rows + 1)
        e = 1.0 - alpha
        return ((x + 1) ** e - 1) / ((rows + 1) ** e - 1)

    return cdf(min(hi, rows)) - cdf(max(lo, 0))


def _lookup_shares(sizes: list, offsets: list, rows: int, alpha: float) -> np.ndarray:
    """The share of a row-split table's lookups each shard serves: its share of the rows when IDs
    are uniform over them (hashed), the power law's mass over its row range when hot rows come first."""
    if not alpha:
        return np.array([s[0] / rows for s in sizes], dtype=float)
    return np.array([zipf_share(o[0], o[0] + s[0], rows, alpha) for s, o in zip(sizes, offsets)])


@dataclass
class _Table:
    """One table's volumes under one sharding, per shard (placed by ranks) and for every GPU."""

    kind: str
    sequence: bool
    look: np.ndarray  # lookup bytes, per shard
    kjt_recv: np.ndarray  # ID bytes received, per shard
    a2a_send: np.ndarray  # output all-to-all bytes sent (world), per shard
    rs_in: np.ndarray  # partial sums into a node's reduce-scatter (table_row_wise, grid), per shard
    cross_send: np.ndarray  # after it, bytes sent to the other nodes, per shard
    kjt_send: float = 0.0  # every GPU: ID bytes sent
    a2a_recv: float = 0.0  # every GPU: output bytes received (world all-to-all)
    cross_recv: float = 0.0  # every GPU: output bytes received from the nodes (table_row_wise, grid)
    rs_world: float = 0.0  # every GPU: row-wise reduce-scatter buffer
    dp_lookup: float = 0.0  # every GPU: a data-parallel table's own lookups
    dp_params: float = 0.0  # a data-parallel table's elements (all-reduced, Adam-updated)
    held: np.ndarray | None = None  # bytes held, per shard (weights + optimizer state)


class Volumes:
    """Each GPU's bytes under a plan, for one model, world and per-rank batch; each table's
    volumes are computed once per sharding (the planner rates many plans of the same options)."""

    def __init__(
        self, m: Subject, ids: dict[str, float], world: int, batch: int, gpus_per_node: int, sent: int = EMB_BYTES
    ):
        self.ids, self.world, self.batch, self.sent = ids, world, batch, sent  # sent: bytes per element sent
        self.g = min(world, gpus_per_node)
        self.nodes = math.ceil(world / self.g)
        self.sequences, self.alphas = m.sequences, m.skew
        self._cache: dict[tuple, _Table] = {}

    def _table(self, name: str, t: dict) -> _Table:
        sizes = t["shard_sizes"]
        key = (name, t["sharding"], len(sizes), tuple(sizes[0]), tuple(sizes[-1]))
        if key not in self._cache:
            self._cache[key] = self._new(name, t["sharding"], sizes, t.get("shard_offsets") or _offsets(t))
        return self._cache[key]

    def _new(self, name: str, kind: str, sizes: list, offsets: list) -> _Table:
        n_ids, n = self.ids.get(name, 0.0), len(sizes)
        gb, batch = self.world * self.batch, self.batch
        sequence = name in self.sequences
        cols = np.array([s[1] for s in sizes], dtype=float)
        zeros = np.zeros(n)
        out = _Table(kind, sequence, zeros, zeros, zeros, zeros, zeros)
        if kind == "data_parallel":
            rows, dim = sizes[0]
            out.dp_lookup, out.dp_params = batch * n_ids * dim * EMB_BYTES, float(rows * dim)
            out.held = np.full(n, rows * dim * DP_STATE_BYTES, dtype=float)
            return out
        first_block = [i for i in range(n) if offsets[i][1] == offsets[0][1]]
        dim_total = float(sum(s[1] for s, o in zip(sizes, offsets) if o[0] == offsets[0][0]))
        if kind in ROW_SPLIT:
            block_rows = sum(sizes[i][0] for i in first_block)
            share = _lookup_shares(sizes, offsets, block_rows, self.alphas.get(name, 0.0))
        else:
            share = np.ones(n)
        id_bytes = n_ids * ID_BYTES + LENGTH_BYTES
        looked = gb * n_ids * share
        out.look, out.kjt_recv = looked * cols * EMB_BYTES, gb * id_bytes * share
        out.kjt_send = batch * id_bytes * len({o[1] for o in offsets})  # each column block needs every ID
        out.held = np.array([s[0] * s[1] * EMB_BYTES + s[0] * 4 for s in sizes], dtype=float)
        sent = self.sent
        if sequence:  # unpooled rows go back to their examples' ranks
            out.a2a_send = looked * cols * sent
            out.a2a_recv = batch * n_ids * dim_total * sent
        elif kind in ("table_wise", "column_wise"):
            out.a2a_send = gb * cols * sent
            out.a2a_recv = batch * dim_total * sent
        elif kind == "row_wise":
            out.rs_world = gb * dim_total * sent
        else:  # table_row_wise, grid: reduce-scatter in the node, then each GPU's share to its peers
            out.rs_in = gb * cols * sent
            out.cross_send = gb / self.g * cols * sent
            out.cross_recv = batch * dim_total * sent
        return out

    def __call__(self, tables: dict[str, dict]) -> dict:
        """Per GPU (arrays of W): bytes looked up, sent and received by each collective, held."""
        w = self.world
        keys = ("lookup", "kjt_send", "kjt_recv", "a2a_send", "a2a_recv", "rs_in", "cross_send", "cross_recv", "held")
        v: dict = {k: np.zeros(w) for k in keys}
        v["rs_world"], v["dp_params"], v["dp_lookup"] = 0.0, 0.0, 0.0
        groups = set()  # TorchRec sends each (module, sharding type) group in collectives of its own
        for name, t in tables.items():
            x = self._table(name, t)
            if x.kind == "data_parallel":
                v["lookup"] += x.dp_lookup
                v["dp_lookup"] += x.dp_lookup
                v["held"] += x.held[0]
                v["dp_params"] += x.dp_params
                continue
            ranks = np.asarray(t["ranks"], dtype=int)
            groups.add((x.sequence, x.kind))
            for key in ("kjt_recv", "a2a_send", "rs_in", "cross_send", "held"):
                np.add.at(v[key], ranks, getattr(x, key))
            np.add.at(v["lookup"], ranks, x.look)
            v["kjt_send"] += x.kjt_send
            v["a2a_recv"] += x.a2a_recv
            v["cross_recv"] += x.cross_recv
            v["rs_world"] += x.rs_world
        v["groups"] = len(groups)
        v["a2a_groups"] = len([g for g in groups if g[0] or g[1] in ("table_wise", "column_wise")])
        return v


def _offsets(t: dict) -> list:
    """Shard offsets of a plan recorded without them: rows stacked (row splits) or columns side by side."""
    sizes = t["shard_sizes"]
    if t["sharding"] == "column_wise":
        starts = np.cumsum([0] + [s[1] for s in sizes])
        return [[0, int(starts[i])] for i in range(len(sizes))]
    if t["sharding"] in ROW_SPLIT:
        starts = np.cumsum([0] + [s[0] for s in sizes])
        return [[int(starts[i]), 0] for i in range(len(sizes))]
    return [[0, 0]] * len(sizes)


@dataclass(frozen=True)
class StageCost:
    """One stage of a projected step: its time, what the schedule leaves of it on the critical
    path, and the GPU that sets it and by what (SET_BY's kinds)."""

    time_s: float
    exposed_s: float
    gpu: int
    set_by: str


@dataclass(frozen=True)
class CriticalPath:
    """The stage the schedule hides least, the GPU that sets it, and its share of the step."""

    stage: str
    gpu: int
    set_by: str
    exposed_s: float
    share: float


@dataclass(frozen=True)
class MostBytes:
    """The GPU with the most of some bytes of the step, its bytes and the mean over the GPUs."""

    gpu: int
    bytes: float
    mean_bytes: float


@dataclass(frozen=True)
class DenseCompute:
    """The dense forward and backward of one GPU (alike on every GPU: the one ending last named)."""

    gpu: int
    s: float
    alike: bool = True


@dataclass(frozen=True)
class MostLoaded:
    lookup_bytes: MostBytes
    all_to_all_bytes: MostBytes
    dense_compute: DenseCompute


@dataclass(frozen=True)
class Imbalance:
    """Max over mean of the GPUs' embedding lookup bytes, and the two."""

    max_mean: float
    lookup_bytes_max: float
    lookup_bytes_mean: float


@dataclass(frozen=True)
class StepMemory:
    """HBM per GPU: the largest GPU's embedding shards plus the dense side, against the cluster's."""

    per_gpu_bytes: float
    embeddings_bytes: float
    dense_bytes: float
    activations_bytes: float
    hbm_bytes: float
    fits: bool


@dataclass(frozen=True)
class PricedStep:
    """One projected step of a plan (`Pricer.price`); ``to_dict()`` is a projection row's figures
    (gembench.projection/1), in this order."""

    world: int
    nodes: int
    per_rank_batch: int
    global_batch: int
    schedule: str
    stages: dict[str, StageCost]  # by STAGES
    step_time_s: float
    examples_per_s: float
    mfu: float
    hfu: float | None  # executed FLOPs over the step (None: nothing checkpointed runs again)
    critical_path: CriticalPath
    most_loaded: MostLoaded
    imbalance: Imbalance
    exposed_comm_s: float
    exposed_comm_fraction: float
    memory: StepMemory

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Rating:
    """A plan as the planner rates it (`Pricer.rate`): the projected step and its imbalance (max/mean)."""

    step_time_s: float
    imbalance: float


class Pricer:
    """Prices plans of one setup (model, world, per-rank batch, cluster, compute, schedule, stack):
    what does not depend on the plan is computed once."""

    def __init__(
        self,
        m: Subject,
        ids: dict[str, float],
        world: int,
        batch: int,
        cluster: Cluster,
        compute: Compute,
        schedule: str = "pipelined",
        stack=None,
        exchange: Exchange = Exchange(),
    ):
        self.world, self.batch, self.cluster = world, batch, cluster
        self.compute, self.schedule, self.stack, self.exchange = compute, schedule, stack, exchange
        self.counts = m.counts
        self.volumes = Volumes(m, ids, world, batch, cluster.gpus_per_node, exchange.emb_bytes)
        self.shards = dense_shards(stack, world, cluster.gpus_per_node)
        blocks = m.flops
        self.fwd = sum(blocks.values())
        mode = getattr(stack, "activation_checkpointing", "none")
        recomputed = m.workload.recomputed_flops(blocks, mode) if mode != "none" else 0.0
        self.recomputed_share = recomputed / self.fwd if self.fwd else 0.0
        self.side = dense_side(m, batch, stack, world, cluster.gpus_per_node)
        # Adam over one more parameter of a data-parallel table: the compute's rate, measured on a
        # dense part that may have run from the caches, but never faster than the memory streams
        # a table-sized state where the cluster file measured it (--calibrate's memory_GBps)
        memory = ADAM_STEP_BYTES / cluster.memory_Bps if cluster.memory_Bps else 0.0
        self.stream_s_per_param = max(compute.optimizer_s_per_param, memory)

    def _comms(self, v: dict) -> dict[str, tuple[float, int]]:
        """Each collective of the step: (seconds, the GPU whose bytes set it). A collective waits
        for its slowest member, so it takes the time of the GPU with the most bytes."""
        cl, w, g = self.cluster, self.world, self.volumes.g
        multi = w > cl.gpus_per_node

        def most(family, kind, nbytes, ranks, per_node=None, calls=1):
            r = int(np.argmax(nbytes))
            t = collective_time(cl, family, float(nbytes[r]), ranks, per_node, kind)
            lat = cl.link(family, across_nodes=multi, kind=kind).latency_s
            return (t + (calls - 1) * lat if t else 0.0), r

        kjt = np.maximum(v["kjt_send"], v["kjt_recv"])
        a2a = np.maximum(v["a2a_send"], v["a2a_recv"])
        cross = np.maximum(v["cross_send"], v["cross_recv"]) if multi else np.zeros(w)
        rs_world = np.full(w, v["rs_world"])
        return {
            "kjt": most("all_to_all", "kjt_all_to_all", kjt, w, calls=KJT_CALLS * v["groups"]),
            "a2a": most("all_to_all", "embedding_all_to_all", a2a, w, calls=v["a2a_groups"]),
            "grad_a2a": most("all_to_all", "embedding_grad_all_to_all", a2a, w, calls=v["a2a_groups"]),
            "rs": most("reduce_scatter", "embedding_reduce_scatter", rs_world, w),
            "ag": most("all_gather", "embedding_grad_all_gather", rs_world, w),
            "node_rs": most("reduce_scatter", "embedding_reduce_scatter", v["rs_in"], g),
            "node_ag": most("all_gather", "embedding_grad_all_gather", v["rs_in"], g),
            # TorchRec's cross_pg: one GPU of each node (the same local rank), a group of the nodes
            "cross": most("all_to_all", "embedding_all_to_all", cross, self.volumes.nodes, per_node=1),
            "grad_cross": most("all_to_all", "embedding_grad_all_to_all", cross, self.volumes.nodes, per_node=1),
        }

    def rate(self, tables: dict[str, dict]) -> Rating:
        """The step and imbalance only: the planner's perf model (offline_plan.ProjectedStep)."""
        return self._price(tables, rating=True)

    def price(self, tables: dict[str, dict]) -> PricedStep:
        """One projected step: stages (time, exposed time, the GPU that sets it and by what), step,
        MFU, imbalance, memory."""
        return self._price(tables, rating=False)

    def _price(self, tables: dict[str, dict], rating: bool) -> PricedStep | Rating:
        c, w, cl, batch = self.compute, self.world, self.cluster, self.batch
        v = self.volumes(tables)
        over = c.overhead_s
        comm = self._comms(v)
        out_parts = [comm[k] for k in ("a2a", "rs", "node_rs", "cross")]
        grad_parts = [comm[k] for k in ("grad_a2a", "ag", "node_ag", "grad_cross")]
        output = sum(t for t, _ in out_parts)
        grad_comm = sum(t for t, _ in grad_parts)
        lookup_rank = v["lookup"] * c.lookup_s_per_byte
        heavy = int(np.argmax(lookup_rank))
        dense_fwd = c.per_example["dense_forward"] * batch
        plain_bwd = c.per_example["backward"] * batch
        dense_bwd = plain_bwd + dense_fwd * self.recomputed_share  # checkpointed blocks run again
        # backward: the dense part, the embeddings' gradients back (the output collectives
        # reversed: all-to-alls, all-gathers), then the fused update of each looked-up row; a
        # data-parallel table (dense kernel) instead adds its looked-up rows into a gradient as
        # large as the table, zeroed first: a streaming write, at the rate the dense optimizer
        # streams its bytes (not the lookup's, a gather of scattered rows), and that gradient is
        # all-reduced before the backward ends (_dp_sync)
        dp_param_s = self.stream_s_per_param
        dp_more = max(v["dp_params"] - c.dp_params, 0.0)  # beyond what the compute's own run replicated
        dp_grad = UPDATE_PER_LOOKUP * v["dp_lookup"] * c.lookup_s_per_byte
        dp_grad += dp_more * EMB_BYTES * dp_param_s / ADAM_STEP_BYTES
        update = UPDATE_PER_LOOKUP * (float(lookup_rank[heavy]) - v["dp_lookup"] * c.lookup_s_per_byte) + dp_grad
        sync, first, last = self._grad_sync()
        dp_sync = self._dp_sync(v["dp_params"])
        stages = {
            "input_dist": comm["kjt"][0] + over.get("input_dist", 0.0),
            "embedding_lookup": float(lookup_rank[heavy]),
            "output_dist": output + over.get("output_dist", 0.0),
            "dense_forward": dense_fwd,
            "backward": dense_bwd + grad_comm + update + dp_sync,
            "grad_sync": sync + over.get("grad_sync", 0.0),
            "optimizer": c.optimizer_s / self.shards + dp_more * dp_param_s,
        }
        exposed = dict(stages)
        if self.schedule == "pipelined":
            exposed["input_dist"] = max(0.0, stages["input_dist"] - (dense_fwd + plain_bwd))
            if w > 1:  # FSDP: one block's gather ahead of the forward; DDP: its last bucket
                hide = dense_fwd + plain_bwd if self.shards > 1 else plain_bwd
                exposed["grad_sync"] = max(first if self.shards > 1 else last, stages["grad_sync"] - hide)
            else:
                exposed["grad_sync"] = 0.0
        step = sum(exposed[k] for k in STAGES)
        mean = v["lookup"].mean()
        imbalance = float(v["lookup"].max() / mean) if mean > 0 else 1.0
        if rating:
            return Rating(step, imbalance)
        comm_exposed = exposed["input_dist"] + exposed["output_dist"] + grad_comm + dp_sync + exposed["grad_sync"]
        a2a_bytes = v["kjt_send"] + v["kjt_recv"] + v["a2a_send"] + v["a2a_recv"] + v["cross_send"] + v["cross_recv"]
        # who sets each stage: the GPU with the most of what the stage's largest part moves
        gpu = {k: heavy for k in STAGES}  # compute alike on every GPU: the one with the most lookups ends last
        by = dict(SET_BY)
        gpu["input_dist"] = comm["kjt"][1]
        gpu["output_dist"] = max(out_parts)[1]
        parts = {"dense compute": (dense_bwd, heavy), "lookup bytes": (update, heavy)}
        parts["all-to-all bytes"] = (grad_comm, max(grad_parts)[1])
        parts["gradient bytes"] = (dp_sync, heavy)  # every GPU all-reduces the same
        by["backward"] = max(parts, key=lambda k: parts[k][0])
        gpu["backward"] = parts[by["backward"]][1]
        critical = max(STAGES, key=lambda k: exposed[k])
        memory = float(v["held"].max()) + sum(self.side.values())
        flops = train_flops(self.fwd * w * batch)
        return PricedStep(
            world=w,
            nodes=self.volumes.nodes,
            per_rank_batch=batch,
            global_batch=w * batch,
            schedule=self.schedule,
            stages={k: StageCost(stages[k], exposed[k], gpu[k], by[k]) for k in STAGES},
            step_time_s=step,
            examples_per_s=w * batch / step if step else 0.0,
            mfu=mfu(flops, step, cl.peak_tflops, w),
            # executed FLOPs: the model's plus the checkpointed blocks' forward run again
            hfu=mfu(flops + self.recomputed_share * self.fwd * w * batch, step, cl.peak_tflops, w)
            if self.recomputed_share
            else None,
            critical_path=CriticalPath(
                critical, gpu[critical], by[critical], exposed[critical], exposed[critical] / step if step else 0.0
            ),
            most_loaded=MostLoaded(
                _most(v["lookup"]), _most(a2a_bytes), DenseCompute(heavy, dense_fwd + dense_bwd, alike=True)
            ),
            imbalance=Imbalance(imbalance, float(v["lookup"].max()), float(mean)),
            exposed_comm_s=comm_exposed,
            exposed_comm_fraction=min(comm_exposed / step, 1.0) if step else 0.0,
            memory=StepMemory(
                per_gpu_bytes=memory,
                embeddings_bytes=float(v["held"].max()),
                dense_bytes=self.side["dense"],
                activations_bytes=self.side["activations"],
                hbm_bytes=cl.hbm_bytes,
                fits=memory <= cl.hbm_bytes,
            ),
        )

    def _dp_sync(self, dp_params: float) -> float:
        """The data-parallel tables' gradient all-reduce. TorchRec wraps their lookup in a DDP of its
        own, which all-reduces in the backward once their gradients are in, at its very end (the
        lookup is the forward's first op): exposed under either schedule, and no FSDP shards it."""
        x = self.exchange
        kind, net = "dense_grad_all_reduce", x.in_network_reduce
        return collective_time(
            self.cluster, "all_reduce", dp_params * x.grad_bytes, self.world, kind=kind, in_network=net
        )

    def _grad_sync(self) -> tuple[float, float, float]:
        """(gradient sync, FSDP's first gather, DDP's last bucket) of the dense gradients."""
        cl, w, shards, counts, x = self.cluster, self.world, self.shards, self.counts, self.exchange
        dense_grad = counts["dense_params"] * x.grad_bytes
        net = x.in_network_reduce
        ar, rs, ag = "dense_grad_all_reduce", "dense_grad_reduce_scatter", "dense_param_all_gather"
        if shards > 1:  # fp32 gradients reduce-scattered; parameters all-gathered (bf16) for forward and backward
            gather = counts["dense_params"] * (2 if getattr(self.stack, "bf16", True) else 4)
            sync = collective_time(cl, "reduce_scatter", dense_grad, shards, kind=rs) + 2 * collective_time(
                cl, "all_gather", gather, shards, kind=ag
            )
            if shards < w:  # HSDP: each shard all-reduced with its replicas, one GPU per node
                sync += collective_time(cl, "all_reduce", dense_grad / shards, w // shards, 1, ar, net)
        else:
            sync = collective_time(cl, "all_reduce", dense_grad, w, kind=ar, in_network=net)
        first = collective_time(cl, "all_gather", counts.get("largest_block_params", 0) * 2, shards, kind=ag)
        last = collective_time(cl, "all_reduce", min(dense_grad, DDP_BUCKET_BYTES), w, kind=ar, in_network=net)
        return sync, first, last


def _most(x: np.ndarray) -> MostBytes:
    r = int(np.argmax(x))
    return MostBytes(r, float(x[r]), float(x.mean()))


def volumes(
    m: Subject, tables: dict[str, dict], ids: dict[str, float], world: int, batch: int, gpus_per_node: int = 8
) -> dict:
    """Per rank (arrays of W): the bytes of each collective of the step; ``batch`` is per rank."""
    return Volumes(m, ids, world, batch, gpus_per_node)(tables)


def dense_shards(stack, world: int, gpus_per_node: int) -> int:
    """GPUs one dense parameter is split over on ``world`` GPUs of nodes of ``gpus_per_node``, as
    measured runs split it (harness.parallelize.dense_shards)."""
    return parallel_shards(getattr(stack, "dense_parallel", "ddp"), world, min(world, gpus_per_node))


def dense_side(m: Subject, batch: int, stack, world: int, gpus_per_node: int) -> dict[str, float]:
    """HBM per GPU outside the embedding shards (Subject.side): dense weights, gradients and Adam
    state (sharded under FSDP); activations saved for the backward with the largest transient."""
    return m.side(batch, stack, dense_shards(stack, world, gpus_per_node))


def project(
    m: Subject,
    tables: dict[str, dict],
    world: int,
    batch: int,
    cluster: Cluster,
    compute: Compute,
    schedule: str = "pipelined",
    stack=None,
) -> PricedStep:
    """One projected step of ``tables`` (a plan): `Pricer.price`."""
    return Pricer(m, m.ids, world, batch, cluster, compute, schedule, stack).price(tables)


def sharding_counts(tables: dict[str, dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in tables.values():
        counts[t["sharding"]] = counts.get(t["sharding"], 0) + 1
    return dict(sorted(counts.items()))
