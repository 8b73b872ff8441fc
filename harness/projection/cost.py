"""The projection's one cost model: a training step of a config on W GPUs of a cluster, per stage.

Every constant and assumption is written in docs/design.md section 8. In short:

- Volumes from the plan (harness/projection/offline_plan.py, or a measured run's own plan) and
  the config's mean IDs per example (models.data.expected_ids_per_example). With hashed IDs
  (data.id_layout) a row-wise shard serves its share of rows' share of the lookups; with sorted
  ones, the power law's mass over its rows (models.data.zipf_share): the first shard, the head.
- Compute per stage from a measured result (seconds per example per stage on that device,
  scaled to the per-rank batch) or, without one, from FLOPs at the cluster's efficiency.
- Embedding lookups: bytes read over HBM bandwidth (or the measured result's seconds per byte);
  the fused optimizer's update in the backward reads and writes each row: UPDATE_PER_LOOKUP.
- Collectives alpha-beta with nccl-tests' bus factors (harness.metrics.comm.bus_factor),
  hierarchical across nodes: `collective_time`.
- Overlap as the stack schedules it: ``staged`` (gembench's measured ranks: every stage on the
  critical path) or ``pipelined`` (TorchRec's TrainPipelineSparseDist: the next batch's
  input_dist under this batch's dense compute; DDP's bucketed all-reduce under the backward,
  the last bucket exposed).
The slowest rank sets every synchronized stage: lookups and all-to-alls take the max over ranks.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from gembench.harness.metrics.comm import bus_factor
from gembench.harness.metrics.mfu import STAGE_FLOP_SHARE, mfu, train_flops
from gembench.harness.projection.cluster import Cluster
from gembench.harness.train.parallelize import dense_shards as parallel_shards
from gembench.harness.train.parallelize import recomputed_forward_flops
from gembench.models.config import ModelConfig
from gembench.models.data import id_exponents, zipf_share
from gembench.models.flops import ADAM_BYTES, forward_flops_per_example, memory_estimate, parameter_counts

STAGES = ("input_dist", "embedding_lookup", "output_dist", "dense_forward", "backward", "grad_sync", "optimizer")
COMM_STAGES = ("input_dist", "output_dist", "grad_sync")
KJT_CALLS = 3  # TorchRec's KJTAllToAll per sharding group: splits, then lengths, then values
ID_BYTES = 8  # int64 IDs in the KJT all-to-all (TorchRec's default index dtype)
LENGTH_BYTES = 4  # one int32 length per example and feature
EMB_BYTES = 4  # fp32 embedding rows and pooled outputs (TorchRec's default, no quantized comms)
UPDATE_PER_LOOKUP = 2.0  # fused row-wise Adagrad: read and write each looked-up row once more
DDP_BUCKET_BYTES = 25 * 2**20  # DDP's default bucket: the last one cannot overlap the backward
ADAM_STEP_BYTES = 4 + 4 + ADAM_BYTES + 4 + ADAM_BYTES  # read p, g, m, v; write p, m, v (fp32)


def collective_time(cluster: Cluster, family: str, nbytes: float, ranks: int, per_node: int | None = None) -> float:
    """Seconds for one collective over ``ranks`` GPUs of ``nbytes`` (nccl-tests' sizes: the send
    buffer of an all-to-all, the full buffer of the others). Within a node: latency + bus bytes /
    the intra link. Across N nodes of G GPUs, each GPU on its own NIC:
      all_to_all: (N-1)/N of the buffer leaves the node at the NIC rate, under the NVLink part;
      all_reduce: reduce-scatter in the node, all-reduce of 1/G across nodes, all-gather in the node;
      reduce_scatter / all_gather: the in-node step and 1/G of the buffer across the nodes.
    ``per_node``: the group's GPUs in each node (default: as many as fit); 1 for a group of one
    GPU per node, as HSDP's replicas, whose collective runs on the NICs alone."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    g = per_node or min(ranks, cluster.gpus_per_node)
    nodes = math.ceil(ranks / g)
    if g == 1:
        return cluster.inter.latency_s + nbytes * bus_factor(family, nodes) / cluster.inter.bandwidth_Bps
    intra = cluster.link(family, across_nodes=False)
    if nodes == 1:
        return intra.latency_s + nbytes * bus_factor(family, g) / intra.bandwidth_Bps
    inter = cluster.inter
    if family == "all_to_all":
        leaving = nbytes * (nodes - 1) / nodes / inter.bandwidth_Bps
        staying = nbytes * (g - 1) / (g * nodes) / intra.bandwidth_Bps
        return inter.latency_s + max(leaving, staying)
    in_node = nbytes * bus_factor(family, g) / intra.bandwidth_Bps
    across = (nbytes / g) * bus_factor(family, nodes) / inter.bandwidth_Bps
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


def datasheet_compute(cfg: ModelConfig, cluster: Cluster, counts: dict | None = None) -> Compute:
    fwd = sum(forward_flops_per_example(cfg).values())
    rate = cluster.peak_tflops * 1e12 * cluster.efficiency
    per = {stage: fwd * STAGE_FLOP_SHARE[stage] / rate for stage in ("dense_forward", "backward")}
    dense = (counts or parameter_counts(cfg))["dense_params"]
    return Compute(
        per,
        dense * ADAM_STEP_BYTES / cluster.hbm_Bps,
        1.0 / (cluster.hbm_Bps * cluster.lookup_efficiency),
        f"datasheet: {cluster.peak_tflops:g} TFLOP/s x {cluster.efficiency:g}, "
        f"HBM {cluster.hbm_Bps / 1e9:,.0f} GB/s x {cluster.lookup_efficiency:g}",
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
    return Compute(
        {"dense_forward": stages.get("dense_forward", 0.0) / batch, "backward": backward / batch},
        stages.get("optimizer", 0.0) * shards,
        rate,
        f"measured: {result.get('id', '?')} on {result['env'].get('device_name', '?')}, {batch} examples per rank",
        # only a run that sent nothing shows a communication stage's cost without the link
        {k: stages.get(k, 0.0) for k in COMM_STAGES} if (result["run"].get("nproc") or 1) == 1 else {},
    )


def _lookup_share(table: dict, shard: int, rows: int, alpha: float, hashed: bool) -> float:
    """The share of a row-split table's lookups its shard serves: its share of the rows when IDs
    are hashed over them, the power law's mass over its row range when hot rows come first."""
    size = table["shard_sizes"][shard][0]
    if hashed:
        return size / rows
    offsets = table.get("shard_offsets") or [
        [sum(s[0] for s in table["shard_sizes"][:i]), 0] for i in range(len(table["shard_sizes"]))
    ]
    lo = offsets[shard][0]
    return zipf_share(lo, lo + size, rows, alpha)


def volumes(cfg: ModelConfig, tables: dict[str, dict], ids: dict[str, float], world: int, batch: int) -> dict:
    """Per rank: bytes looked up, and bytes sent and received by each communication of the step.

    ``batch`` is the per-rank batch; the global batch is world x batch. Returns arrays of W.
    """
    gb = world * batch
    sequences = {f"table_{s.name}" for s in cfg.sequences}
    alphas, hashed = id_exponents(cfg), cfg.data.id_layout == "hashed"
    lookup = np.zeros(world)
    kjt_send, kjt_recv = np.zeros(world), np.zeros(world)
    a2a_send, a2a_recv = np.zeros(world), np.zeros(world)  # pooled TW/CW and sequence outputs
    rs_bytes: dict[tuple, float] = {}  # (sharding, group size) -> bytes: one reduce-scatter forward per group
    groups = set()  # TorchRec sends each (module, sharding type) group in collectives of its own
    for name, t in tables.items():
        n_ids = ids.get(name, 0.0)
        kind = t["sharding"]
        rows = sum(s[0] for s in t["shard_sizes"]) if kind in ("row_wise", "table_row_wise") else t["shard_sizes"][0][0]
        dim_total = sum(s[1] for s in t["shard_sizes"]) if kind == "column_wise" else t["shard_sizes"][0][1]
        sequence = name in sequences
        if kind == "data_parallel":
            lookup += batch * n_ids * dim_total * EMB_BYTES
            continue
        groups.add((sequence, kind))
        id_bytes = n_ids * ID_BYTES + LENGTH_BYTES
        # every rank sends its examples' IDs once per shard that needs them
        copies = len(t["ranks"]) if kind == "column_wise" else 1
        kjt_send += batch * id_bytes * copies
        for i, rank in enumerate(t["ranks"]):
            cols = t["shard_sizes"][i][1]
            share = (
                _lookup_share(t, i, rows, alphas.get(name, 0.0), hashed)
                if kind in ("row_wise", "table_row_wise")
                else 1.0
            )
            looked = gb * n_ids * share
            lookup[rank] += looked * cols * EMB_BYTES
            kjt_recv[rank] += gb * id_bytes * share
            if sequence:  # unpooled rows go back to their examples' ranks
                a2a_send[rank] += looked * cols * EMB_BYTES
            elif kind in ("table_wise", "column_wise"):
                a2a_send[rank] += gb * cols * EMB_BYTES
        if sequence:
            a2a_recv += batch * n_ids * dim_total * EMB_BYTES
        elif kind in ("table_wise", "column_wise"):
            a2a_recv += batch * dim_total * EMB_BYTES
        else:
            key = (kind, len(t["ranks"]))
            rs_bytes[key] = rs_bytes.get(key, 0.0) + gb * dim_total * EMB_BYTES
    return {
        "lookup": lookup,
        "kjt_send": kjt_send,
        "kjt_recv": kjt_recv,
        "a2a_send": a2a_send,
        "a2a_recv": a2a_recv,
        "reduce_scatter": [(size, b) for (_, size), b in rs_bytes.items()],
        "groups": len(groups),
        "a2a_groups": len([g for g in groups if g[0] or g[1] in ("table_wise", "column_wise")]),
    }


def embedding_bytes_per_rank(tables: dict[str, dict], world: int) -> np.ndarray:
    """Weights and row-wise Adagrad state held by each rank, from the plan's shard sizes."""
    held = np.zeros(world)
    for t in tables.values():
        ranks = t["ranks"] if t["sharding"] != "data_parallel" else range(world)
        for i, rank in enumerate(ranks):
            rows, cols = t["shard_sizes"][min(i, len(t["shard_sizes"]) - 1)]
            held[rank] += rows * cols * EMB_BYTES + rows * 4
    return held


def dense_shards(stack, world: int, gpus_per_node: int) -> int:
    """GPUs one dense parameter is split over on ``world`` GPUs of nodes of ``gpus_per_node``, as
    measured runs split it (harness.parallelize.dense_shards)."""
    return parallel_shards(getattr(stack, "dense_parallel", "ddp"), world, min(world, gpus_per_node))


def dense_side(cfg: ModelConfig, batch: int, counts: dict, stack, world: int, gpus_per_node: int) -> dict[str, float]:
    """HBM per GPU outside the embedding shards (memory_estimate): dense weights, gradients and Adam
    state (sharded under FSDP); activations saved for the backward with the largest transient."""
    m = memory_estimate(
        cfg, batch, counts=counts, stack=stack, device_type="cuda", shards=dense_shards(stack, world, gpus_per_node)
    )
    return {"dense": m["dense"], "activations": m["activations"] + m["transient"]}


def project(
    cfg: ModelConfig,
    tables: dict[str, dict],
    ids: dict[str, float],
    world: int,
    batch: int,
    cluster: Cluster,
    compute: Compute,
    schedule: str = "pipelined",
    stack=None,
    counts: dict | None = None,
) -> dict:
    """One projected step: stages (time and exposed time), step, MFU, imbalance, memory."""
    counts = counts or parameter_counts(cfg)
    shards = dense_shards(stack, world, cluster.gpus_per_node)
    fsdp = shards > 1  # FSDP, or HSDP within each node
    v = volumes(cfg, tables, ids, world, batch)
    lat = cluster.link("all_to_all", across_nodes=world > cluster.gpus_per_node).latency_s

    def a2a(send, recv, calls: int) -> float:  # one collective's bytes, and the latency of the others
        if not calls:
            return 0.0
        return collective_time(cluster, "all_to_all", float(max(send.max(), recv.max())), world) + (calls - 1) * lat

    # the KJT all-to-all is three per group (splits, lengths, values); the outputs one per group
    input_dist = a2a(v["kjt_send"], v["kjt_recv"], KJT_CALLS * v["groups"]) + compute.overhead_s.get("input_dist", 0.0)
    pooled_out = a2a(v["a2a_send"], v["a2a_recv"], v["a2a_groups"])
    rs = sum(collective_time(cluster, "reduce_scatter", b, n) for n, b in v["reduce_scatter"])
    output_dist = pooled_out + rs + compute.overhead_s.get("output_dist", 0.0)
    lookup_rank = v["lookup"] * compute.lookup_s_per_byte
    lookup = float(lookup_rank.max())
    dense_fwd = compute.per_example["dense_forward"] * batch
    dense_bwd = compute.per_example["backward"] * batch
    # backward: the dense part, the embeddings' gradients back (the reverse of output_dist: an
    # all-to-all, and an all-gather for row-wise pooled tables), then the fused update
    ag = sum(collective_time(cluster, "all_gather", b, n) for n, b in v["reduce_scatter"])
    grad_comm = pooled_out + ag
    backward = dense_bwd + grad_comm + UPDATE_PER_LOOKUP * lookup
    # checkpointed blocks run their forward again in the backward (HFU counts it, MFU does not)
    fwd_blocks = forward_flops_per_example(cfg)
    fwd = sum(fwd_blocks.values())
    recomputed_share = recomputed_forward_flops(fwd_blocks, getattr(stack, "activation_checkpointing", "none")) / fwd
    backward += dense_fwd * recomputed_share
    dense_grad = counts["dense_params"] * 4
    if fsdp:  # fp32 gradients reduce-scattered; parameters all-gathered (bf16) for forward and backward
        gather = counts["dense_params"] * (2 if getattr(stack, "bf16", True) else 4)
        sync = collective_time(cluster, "reduce_scatter", dense_grad, shards) + 2 * collective_time(
            cluster, "all_gather", gather, shards
        )
        if shards < world:  # HSDP: each shard all-reduced with its replicas, one GPU per node
            sync += collective_time(cluster, "all_reduce", dense_grad / shards, world // shards, per_node=1)
    else:
        sync = collective_time(cluster, "all_reduce", dense_grad, world)
    sync += compute.overhead_s.get("grad_sync", 0.0)
    stages = {
        "input_dist": input_dist,
        "embedding_lookup": lookup,
        "output_dist": output_dist,
        "dense_forward": dense_fwd,
        "backward": backward,
        "grad_sync": sync,
        "optimizer": compute.optimizer_s / shards,
    }
    exposed = dict(stages)
    if schedule == "pipelined":
        exposed["input_dist"] = max(0.0, input_dist - (dense_fwd + dense_bwd))
        if fsdp:  # one block's gather ahead of the forward, the rest prefetched under compute
            first = collective_time(cluster, "all_gather", counts.get("largest_block_params", 0) * 2, shards)
            exposed["grad_sync"] = max(first, sync - dense_fwd - dense_bwd) if world > 1 else 0.0
        else:
            last_bucket = collective_time(cluster, "all_reduce", min(dense_grad, DDP_BUCKET_BYTES), world)
            exposed["grad_sync"] = max(last_bucket, sync - dense_bwd) if world > 1 else 0.0
    step = sum(exposed.values())
    comm_exposed = exposed["input_dist"] + exposed["output_dist"] + grad_comm + exposed["grad_sync"]
    shares = v["lookup"] / v["lookup"].mean() if v["lookup"].mean() > 0 else np.ones(world)
    emb_held = embedding_bytes_per_rank(tables, world)
    side = dense_side(cfg, batch, counts, stack, world, cluster.gpus_per_node)
    memory = float(emb_held.max()) + sum(side.values())
    return {
        "world": world,
        "nodes": math.ceil(world / cluster.gpus_per_node),
        "per_rank_batch": batch,
        "global_batch": world * batch,
        "schedule": schedule,
        "stages": {k: {"time_s": stages[k], "exposed_s": exposed[k]} for k in STAGES},
        "step_time_s": step,
        "examples_per_s": world * batch / step if step else 0.0,
        "mfu": mfu(train_flops(fwd * world * batch), step, cluster.peak_tflops, world),
        # executed FLOPs: the model's plus the checkpointed blocks' forward run again
        "hfu": mfu(
            train_flops(fwd * world * batch) + recomputed_share * fwd * world * batch, step, cluster.peak_tflops, world
        )
        if recomputed_share
        else None,
        "imbalance": {
            "max_mean": float(shares.max()),
            "lookup_bytes_max": float(v["lookup"].max()),
            "lookup_bytes_mean": float(v["lookup"].mean()),
        },
        "exposed_comm_s": comm_exposed,
        "exposed_comm_fraction": comm_exposed / step if step else 0.0,
        "memory": {
            "per_gpu_bytes": memory,
            "embeddings_bytes": float(emb_held.max()),
            "dense_bytes": side["dense"],
            "activations_bytes": side["activations"],
            "hbm_bytes": cluster.hbm_bytes,
            "fits": memory <= cluster.hbm_bytes,
        },
    }


def sharding_counts(tables: dict[str, dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in tables.values():
        counts[t["sharding"]] = counts.get(t["sharding"], 0) + 1
    return dict(sorted(counts.items()))
