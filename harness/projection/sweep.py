"""Plan and price each world size of a projection: the loop behind `gembench project`."""

from __future__ import annotations

import functools

from gembench.harness.projection.cluster import Cluster
from gembench.harness.projection.cost import datasheet_compute, dense_side, measured_compute, project, sharding_counts
from gembench.harness.projection.offline_plan import plan_offline
from gembench.models.config import ModelConfig
from gembench.models.data import expected_ids_per_example
from gembench.models.flops import parameter_counts


@functools.lru_cache(maxsize=8)
def _counts(cfg: ModelConfig) -> dict:
    return parameter_counts(cfg)


def sweep(
    cfg: ModelConfig,
    worlds: list[int],
    cluster: Cluster,
    result: dict | None,
    forced: str | None,
    schedule: str,
    use_cache: bool,
    progress,
    stack=None,
):
    """(rows, compute): one row per world size, and the compute the rows were priced with."""
    counts = _counts(cfg)
    ids = expected_ids_per_example(cfg)
    compute = measured_compute(result) if result else datasheet_compute(cfg, cluster, counts=counts)
    rows = []
    for world in worlds:
        batch = cfg.data.global_batch // world
        reserved = sum(dense_side(cfg, batch, counts, stack, world, cluster.gpus_per_node).values())
        progress(f"gembench project: {cfg.name} on {world} GPUs of {cluster.name}: planning ...")
        plan = plan_offline(cfg, world, batch, cluster, reserved, forced, use_cache)
        row = {
            "world": world,
            "plan": {
                "fits": plan.fits,
                "error": plan.error,
                "seconds": plan.seconds,
                "cached": plan.cached,
                "shardings": sharding_counts(plan.tables),
                "reserved_bytes": reserved,
            },
        }
        if plan.fits:
            row |= project(cfg, plan.tables, ids, world, batch, cluster, compute, schedule, stack, counts)
        else:
            row |= {"nodes": -(-world // cluster.gpus_per_node), "per_rank_batch": batch, "global_batch": world * batch}
        progress(
            f"gembench project: {world} GPUs: planned in {plan.seconds:.1f} s"
            + (" (cached)" if plan.cached else "")
            + ("" if plan.fits else f"; no plan fits: {plan.error}")
        )
        rows.append(row)
    return rows, compute
