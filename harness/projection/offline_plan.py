"""TorchRec's sharding plan for a world of any size, made offline: meta tensors, no process group.

The planner sees a Topology built from the cluster (GPUs per node, HBM, the two links) and one
ParameterConstraints per table carrying its pooling factor (mean IDs per example, from the
config's distributions), so a table pooling 100 IDs is no longer priced like one pooling 1.

Speed (TorchRec's default proposers took 60 s for `large` at 64 ranks and over 580 s for `xl`):
one GreedyProposer, the fused kernel only, and per table only the sharding types that can hold
it: a table whose weights are under SMALL_TABLE_BYTES is table_wise (one rank reads it faster
than any split sends its IDs), a larger pooled one table_row_wise across nodes (row_wise within
one), a larger sequence table row_wise, and so is a sequence table of more than HOT_SEQUENCE_IDS
IDs per example whatever its size (placed whole, one GPU would serve every event). The HBM the
dense side needs (weights, gradients, Adam state, activations) is reserved up front from
gembench's own estimate, not TorchRec's heuristic, which cannot see tensors on the meta device.
Plans are cached by config, world, batch and cluster.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from gembench.errors import UsageError
from gembench.harness.device.calibration import cache_dir
from gembench.harness.projection.cluster import Cluster
from gembench.harness.train.distributed.plan import PlanRecorder, sharders, table_constraints
from gembench.models.config import ModelConfig
from gembench.models.data import expected_ids_per_example

SMALL_TABLE_BYTES = 16 * 2**30  # fp32 weights; below this a table is placed whole (table_wise)
# Above it, pooled tables are split over one node's GPUs (table_row_wise: their partial sums are
# reduced over NVLink before anything crosses the NIC); row_wise, one shard per GPU of the world,
# was 164k of xl's 177k shard estimates at 4,096 GPUs and the planner's time with it.
# A sequence table read this many times per example is row_wise however small: MLPerf DLRMv4's
# artist and album tables (2.6 and 6.9 GB) are read at each of 4,087 events, and placed whole
# their GPU served every lookup (11x the mean at 32 MI355X). GEM's tiers read theirs <= 1,024 times.
HOT_SEQUENCE_IDS = 1024
PLAN_VERSION = 3  # bump when what is cached changes


@dataclass
class OfflinePlan:
    tables: dict[str, dict]  # name -> sharding, ranks, shard_sizes, shard_offsets (as a result's plan)
    seconds: float  # planner time when it was made
    cached: bool
    fits: bool
    error: str = ""


def embedding_module(cfg: ModelConfig):
    """The config's embedding tables on the meta device, in a module the planner can walk."""
    import torch
    from torch import nn
    from torchrec import EmbeddingBagCollection, EmbeddingCollection

    from gembench.models.sparse import pooled_tables, sequence_tables

    meta = torch.device("meta")
    module = nn.Module()
    module.pooled = EmbeddingBagCollection(tables=pooled_tables(cfg), device=meta)
    if cfg.sequences:
        module.sequence = EmbeddingCollection(tables=sequence_tables(cfg), device=meta)
    return module


def constraints(cfg: ModelConfig, ids: dict[str, float], forced: str | None = None, multi_node: bool = True) -> dict:
    """Each table's pooling factor, the fused kernel, and the sharding types its size allows."""
    from gembench.models.sparse import pooled_tables, sequence_tables

    sequences = sequence_tables(cfg) if cfg.sequences else []
    types = {}
    for t in pooled_tables(cfg) + sequences:
        if forced:
            types[t.name] = [forced]
        elif t.num_embeddings * t.embedding_dim * 4 < SMALL_TABLE_BYTES and not (
            t in sequences and ids.get(t.name, 0.0) > HOT_SEQUENCE_IDS
        ):
            types[t.name] = ["table_wise"]
        else:  # sequence tables are EmbeddingCollections: TorchRec shards those table- or row-wise
            types[t.name] = ["table_row_wise"] if multi_node and t not in sequences else ["row_wise"]
    return table_constraints(ids, types, compute_kernels=["fused"])


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


def _cache_path(
    cfg: ModelConfig, world: int, batch: int, cluster: Cluster, forced: str | None, reserved: float
) -> Path:
    key = f"{cfg.hash}-w{world}-b{batch}-{cluster.hash()}-{forced or 'auto'}-r{int(reserved) >> 20}-v{PLAN_VERSION}"
    return cache_dir() / "plans" / f"{cfg.name}-{key}.json"


def plan_offline(
    cfg: ModelConfig,
    world: int,
    per_rank_batch: int,
    cluster: Cluster,
    reserved_bytes: float,
    forced: str | None = None,
    use_cache: bool = True,
) -> OfflinePlan:
    """TorchRec's plan for ``world`` GPUs of ``cluster`` at ``per_rank_batch`` examples per rank."""
    path = _cache_path(cfg, world, per_rank_batch, cluster, forced, reserved_bytes)
    if use_cache and path.exists():
        try:
            data = json.loads(path.read_text())
            return OfflinePlan(data["tables"], data["seconds"], True, data["fits"], data.get("error", ""))
        except (OSError, ValueError, KeyError):
            pass  # a damaged cache entry is planned again
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.proposers import GreedyProposer
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation

    logging.getLogger("torchrec").setLevel(logging.ERROR)  # its advice on TopologyFactory and dry runs
    share = min(max(reserved_bytes / cluster.hbm_bytes, 0.0), 0.95)  # of each GPU's HBM, for the dense side
    recorder = PlanRecorder(world)
    planner = EmbeddingShardingPlanner(
        topology=topology(cluster, world),
        batch_size=per_rank_batch,
        proposer=[GreedyProposer()],
        storage_reservation=FixedPercentageStorageReservation(share),
        constraints=constraints(cfg, expected_ids_per_example(cfg), forced, world > cluster.gpus_per_node),
        stats=[recorder],
    )
    start = time.perf_counter()
    try:
        planner.plan(embedding_module(cfg), sharders())
        fits, error = True, ""
    except Exception as err:  # noqa: BLE001  the planner says which table found no room
        fits, error = False, _first_line(err)
    result = OfflinePlan(recorder.tables, time.perf_counter() - start, False, fits, error)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"tables": result.tables, "seconds": result.seconds, "fits": fits, "error": error}))
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
