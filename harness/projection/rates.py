"""How fast a projected step's parts go: collectives as TorchRec runs them, alpha-beta per family
over the cluster file's links (``collective_time``), and the compute rates of the dense stages, the
lookup and the optimizer, from a measured result or the datasheet (``Compute``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from gembench.harness.metrics.comm import bus_factor
from gembench.harness.metrics.mfu import STAGE_FLOP_SHARE
from gembench.harness.projection.cluster import Cluster
from gembench.harness.projection.subject import Subject
from gembench.harness.projection.volumes import EMB_BYTES
from gembench.harness.train.memory import ADAM_BYTES

COMM_STAGES = ("input_dist", "output_dist", "grad_sync")
UPDATE_PER_LOOKUP = 2.0  # fused row-wise Adagrad: read and write each looked-up row once more
ADAM_STEP_BYTES = 4 + 4 + ADAM_BYTES + 4 + ADAM_BYTES  # read p, g, m, v; write p, m, v (fp32)


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
