"""2D sparse parallelism as TorchRec's DMPCollection runs it, for the projection to price beside 1-D.

The embedding tables are sharded within a group of G GPUs (one plan, made for world G, the same in
every group) and replicated across the W/G groups; each group serves its W/G share of the global
batch, so the per-GPU batch is the 1-D one. The dense side stays data-parallel over all W GPUs (DMP's
DDP, and its data-parallel tables, use the global process group). With the DEFAULT strategy the
replicas are averaged by ``DMPCollection.sync()``: an all-reduce (AVG) of every GPU's TBE weights and
row-wise Adagrad state over its replica group, which TorchRec's TrainPipelineSparseDist calls between
the backward and the optimizer every ``dmp_collection_sync_interval_batches`` steps (default 1).

Placement (DMPCollection._create_process_groups): by default a group strides across the nodes (ranks
k, k + W/G, ...), so its replicas sit side by side within a node; ``use_inter_host_allreduce=True``
puts a group on consecutive ranks (within a node where G <= GPUs per node) and its replicas across
the nodes. Both are priced; docs/projection.md has the formulas.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gembench.harness.projection.cluster import Cluster
from gembench.harness.projection.rates import collective_time
from gembench.harness.projection.volumes import EMB_BYTES, ROW_STATE_BYTES

MODES = ("auto", "1d", "2d")
# TorchRec's TrainPipelineSparseDist syncs the replicas every batch unless told otherwise
# (dmp_collection_sync_interval_batches=1)
SYNC_EVERY = 1


@dataclass(frozen=True)
class SparseGroups:
    """Tables sharded within groups of ``size`` GPUs of ``world``, replicas averaged every
    ``sync_every`` steps; ``inter_host``: a group on consecutive ranks (use_inter_host_allreduce)."""

    size: int
    world: int
    inter_host: bool
    sync_every: int = SYNC_EVERY

    @property
    def replicas(self) -> int:
        return self.world // self.size

    @property
    def stride(self) -> int:
        """Rank distance between a strided group's members (TorchRec's ``step``)."""
        return self.world // self.size

    def group_per_node(self, gpus_per_node: int) -> int:
        """A group's GPUs in each node it spans."""
        if self.inter_host:
            return min(self.size, gpus_per_node)
        return max(1, gpus_per_node // self.stride)

    def replica_per_node(self, gpus_per_node: int) -> int:
        """A replica group's GPUs in each node it spans."""
        if self.inter_host:
            return max(1, gpus_per_node // self.size)
        return min(self.stride, gpus_per_node)

    def group_cluster(self, cluster: Cluster) -> Cluster:
        """The cluster as one group sees it: its GPUs per node are the group's, the links the same
        (every group runs its collectives at once, each GPU on its own NVLink port and NIC)."""
        return dataclasses.replace(cluster, gpus_per_node=self.group_per_node(cluster.gpus_per_node))

    @property
    def placement(self) -> str:
        return "groups on consecutive ranks" if self.inter_host else "groups strided over nodes"

    def label(self) -> str:
        return f"2D G={self.size} x {self.replicas} ({self.placement})"


def group_sizes(world: int, gpus_per_node: int) -> list[int]:
    """G offered at ``world``: a node, two, four ... that divide the world, short of the whole world
    (G = world is the 1-D plan)."""
    sizes, g = [], gpus_per_node
    while g < world:
        if world % g == 0:
            sizes.append(g)
        g *= 2
    return sizes


def refuse_single_groups(worlds: list[int], cluster: Cluster) -> None:
    """--sparse-parallel 2d: every world needs a group size short of it, else one line, exit 2."""
    from gembench.errors import UsageError

    single = [w for w in worlds if not group_sizes(w, cluster.gpus_per_node)]
    if single:
        raise UsageError(
            f"--sparse-parallel 2d: --gpus {','.join(map(str, single))} has no sharding group smaller than the "
            f"world ({cluster.name}: nodes of {cluster.gpus_per_node}; 2D needs {2 * cluster.gpus_per_node} GPUs "
            "or more): leave those sizes out or use --sparse-parallel auto"
        )


def layouts(world: int, size: int, gpus_per_node: int, sync_every: int) -> list[SparseGroups]:
    """The placements of groups of ``size`` that tile the nodes evenly (both, for powers of two)."""
    out = []
    for inter_host in (True, False):
        s = SparseGroups(size, world, inter_host, sync_every)
        spread = s.size if inter_host else s.stride
        if gpus_per_node % spread == 0 or spread % gpus_per_node == 0:
            out.append(s)
    return out


def table_state_bytes(m) -> float:
    """Every table's fp32 weights and row-wise Adagrad state (one fp32 a row): what a group holds
    in all, and what a GPU holds 1/G of (volumes.Volumes counts a sharded table's bytes so)."""
    return float(sum(t.num_embeddings * (t.embedding_dim * EMB_BYTES + ROW_STATE_BYTES) for t in m.tables))


def sync_time(cluster: Cluster, groups: SparseGroups, nbytes: float, in_network: bool = False) -> float:
    """One ``sync()``: the all-reduce of ``nbytes`` (a GPU's weights and optimizer state) over the
    W/G replicas, placed as ``groups`` places them; every replica group runs at once, so the GPU
    with the most bytes sets it."""
    per_node = groups.replica_per_node(cluster.gpus_per_node)
    return collective_time(cluster, "all_reduce", nbytes, groups.replicas, per_node, in_network=in_network)
