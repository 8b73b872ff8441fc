"""The projection's one cost model: a training step of a model on W GPUs of a cluster, per stage.

Constants and assumptions: docs/design.md section 8 and docs/projection.md. In short:

- Volumes per GPU (volumes.py) from the plan (offline_plan.py, or a measured run's own) and the
  model's mean IDs per example (subject.py: the workload protocol, gembench's configs one
  provider of it).
- Collectives as TorchRec runs them, alpha-beta per family (rates.py's `collective_time`, links
  from the cluster file: `Cluster.link`): the KJT all-to-all of IDs; table- and column-wise
  outputs by one all-to-all; row-wise by a world reduce-scatter; table_row_wise and grid by a
  reduce-scatter within the node, then an all-to-all of one GPU per node over the NICs; the
  backward mirrors them. Data-parallel tables as DMP runs them: looked up on every rank (no
  all-to-all: their input and output dists pass through), a gradient as large as the table
  written in the backward and all-reduced with the dense gradients, Adam-updated by the dense
  optimizer.
- Compute from a measured result or the datasheet (rates.py's `Compute`); lookups as bytes over
  HBM; the fused update reads and writes each looked-up row once more (UPDATE_PER_LOOKUP).
- 2D sparse parallelism (sparse2d.py, TorchRec's DMPCollection): the tables planned for a group
  of G GPUs placed as the group is (its GPUs per node), the embedding collectives within the group,
  the dense side and the data-parallel tables over all W; the replicas' sync (an all-reduce of each
  GPU's shards and row-wise Adagrad state over W/G GPUs) a stage of its own, ``replica_sync``, once
  every N steps (blocking: TorchRec calls it between the backward and the optimizer).
- Overlap: ``staged`` (every stage on the critical path) or ``pipelined`` (TorchRec's sparse-dist
  pipeline and DDP's buckets). Each synchronized stage takes its slowest GPU: `Pricer.price`
  names it and what sets it (lookup bytes, all-to-all bytes, dense compute, gradient bytes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from gembench.harness.metrics.mfu import mfu, train_flops
from gembench.harness.projection.cluster import Cluster
from gembench.harness.projection.rates import (
    ADAM_STEP_BYTES,
    UPDATE_PER_LOOKUP,
    Compute,
    Exchange,
    collective_time,
)
from gembench.harness.projection.sparse2d import SparseGroups, sync_time
from gembench.harness.projection.subject import Subject
from gembench.harness.projection.volumes import EMB_BYTES, Volumes
from gembench.harness.train.parallelize import dense_shards as parallel_shards

# the stages a measured run times; and the projection's, with 2D's replica sync (0 under 1-D)
RUN_STAGES = ("input_dist", "embedding_lookup", "output_dist", "dense_forward", "backward", "grad_sync", "optimizer")
STAGES = (*RUN_STAGES, "replica_sync")
KJT_CALLS = 3  # TorchRec's KJTAllToAll per sharding group: splits, then lengths, then values
DDP_BUCKET_BYTES = 25 * 2**20  # DDP's default bucket: the last one cannot overlap the backward
NODE_SPLIT = ("table_row_wise", "grid_shard")  # rows over one node's GPUs, outputs out by the NICs
SET_BY = {
    "input_dist": "all-to-all bytes",
    "embedding_lookup": "lookup bytes",
    "output_dist": "all-to-all bytes",
    "dense_forward": "dense compute",
    "grad_sync": "gradient bytes",
    "optimizer": "dense compute",
    "replica_sync": "table bytes",
}


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
    """Prices plans of one setup (model, world, per-rank batch, cluster, compute, schedule, stack;
    ``groups``: 2D sparse parallelism, the plans then made for one group): what does not depend on
    the plan is computed once."""

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
        groups: SparseGroups | None = None,
    ):
        self.world, self.batch, self.cluster = world, batch, cluster
        self.compute, self.schedule, self.stack, self.exchange = compute, schedule, stack, exchange
        self.counts = m.counts
        # the embeddings' world: all W GPUs (1-D), or one group of G placed as it is (2D)
        self.groups = groups
        self.sparse_world = groups.size if groups else world
        self.sparse_cluster = groups.group_cluster(cluster) if groups else cluster
        self.volumes = Volumes(m, ids, self.sparse_world, batch, self.sparse_cluster.gpus_per_node, exchange.emb_bytes)
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
        cl, w, g = self.sparse_cluster, self.sparse_world, self.volumes.g
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
        replica_sync = self.replica_sync_s(v) / self.groups.sync_every if self.groups else 0.0
        stages = {
            "input_dist": comm["kjt"][0] + over.get("input_dist", 0.0),
            "embedding_lookup": float(lookup_rank[heavy]),
            "output_dist": output + over.get("output_dist", 0.0),
            "dense_forward": dense_fwd,
            "backward": dense_bwd + grad_comm + update + dp_sync,
            "grad_sync": sync + over.get("grad_sync", 0.0),
            "optimizer": c.optimizer_s / self.shards + dp_more * dp_param_s,
            "replica_sync": replica_sync,
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
        comm_exposed += replica_sync
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
        gpu["replica_sync"] = int(np.argmax(v["synced"]))
        critical = max(STAGES, key=lambda k: exposed[k])
        memory = float(v["held"].max()) + sum(self.side.values())
        flops = train_flops(self.fwd * w * batch)
        return PricedStep(
            world=w,
            nodes=-(-w // cl.gpus_per_node),
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

    def replica_sync_s(self, v: dict) -> float:
        """2D: one sync() of the replicas (sparse2d.sync_time), set by the GPU holding the most of
        the sharded tables' weights and optimizer state (``v``: the plan's volumes)."""
        if not self.groups:
            return 0.0
        most = float(v["synced"].max())
        return sync_time(self.cluster, self.groups, most, self.exchange.in_network_reduce)

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
    groups: SparseGroups | None = None,
) -> PricedStep:
    """One projected step of ``tables`` (a plan; under 2D ``groups``, one group's): `Pricer.price`."""
    return Pricer(m, m.ids, world, batch, cluster, compute, schedule, stack, groups=groups).price(tables)


def sharding_counts(tables: dict[str, dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in tables.values():
        counts[t["sharding"]] = counts.get(t["sharding"], 0) + 1
    return dict(sorted(counts.items()))
