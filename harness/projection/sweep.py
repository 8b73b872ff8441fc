"""Plan and price each world size of a projection: the loop behind `gembench project`."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json

from gembench.harness.projection.cluster import Cluster
from gembench.harness.projection.cost import Compute, Pricer, dense_side, sharding_counts
from gembench.harness.projection.offline_plan import plan_offline
from gembench.harness.projection.published import DP_THRESHOLD_GIB, EXCHANGES, held_against, published
from gembench.models.config import ModelConfig, with_global_batch
from gembench.models.data import expected_ids_per_example
from gembench.models.memory import parameter_counts


@functools.lru_cache(maxsize=8)
def counts_of(cfg: ModelConfig) -> dict:
    return parameter_counts(cfg)


def pricing_key(compute: Compute, schedule: str, stack) -> str:
    """What the planner's ratings depend on besides config, world, batch and cluster (the cache key)."""
    fields = dataclasses.asdict(compute) | {"schedule": schedule, "stack": repr(stack)}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:12]


def sweep(
    cfg: ModelConfig,
    worlds: list[int],
    cluster: Cluster,
    compute: Compute,
    forced: str | None,
    schedule: str,
    use_cache: bool,
    progress,
    stack=None,
    batches: dict[int, int] | None = None,
    search: str = "fast",
) -> list[dict]:
    """One row per world size: its plan, and the step the cost model prices for it. ``batches``:
    a global batch per world size, where it differs from the config's."""
    counts = counts_of(cfg)
    ids = expected_ids_per_example(cfg)
    key = pricing_key(compute, schedule, stack)
    rows = []
    for world in worlds:
        wcfg = with_global_batch(cfg, (batches or {}).get(world))
        batch = wcfg.data.global_batch // world
        reserved = sum(dense_side(wcfg, batch, counts, stack, world, cluster.gpus_per_node).values())
        progress(f"gembench project: {cfg.name} on {world} GPUs of {cluster.name}: planning ...")
        pricer = Pricer(wcfg, ids, world, batch, cluster, compute, schedule, stack, counts)
        plan = plan_offline(wcfg, world, batch, cluster, reserved, pricer, key, ids, forced, use_cache, search)
        row = {
            "world": world,
            "plan": {
                "fits": plan.fits,
                "error": plan.error,
                "seconds": plan.seconds,
                "cpu_seconds": plan.cpu_seconds,
                "cached": plan.cached,
                "shardings": sharding_counts(plan.tables),
                "reserved_bytes": reserved,
                "search": plan.search,
                "proposals": plan.proposals,
                "restrictions": plan.restrictions,
            },
        }
        if plan.fits:
            row |= pricer.price(plan.tables)
            row["imbalance"]["best_found"] = plan.best_imbalance
            pub = published(cfg.name, cluster.name, world)
            if pub:
                row["published"] = _held_against(
                    pub,
                    row,
                    plan.tables,
                    wcfg,
                    ids,
                    world,
                    batch,
                    cluster,
                    compute,
                    schedule,
                    stack,
                    counts,
                    reserved,
                    key,
                    use_cache,
                )
        else:
            row |= {"nodes": -(-world // cluster.gpus_per_node), "per_rank_batch": batch, "global_batch": world * batch}
        progress(
            f"gembench project: {world} GPUs: planned in {plan.seconds:.1f} s ({plan.cpu_seconds:.1f} s of CPU)"
            + (" (cached)" if plan.cached else f", {plan.proposals} plans rated")
            + ("" if plan.fits else f"; no plan fits: {plan.error}")
        )
        rows.append(row)
    return rows


def _held_against(
    pub, row, tables, cfg, ids, world, batch, cluster, compute, schedule, stack, counts, reserved, key, use_cache
):
    """The published system beside the row, and the row priced with each of its differences."""
    priced = [
        (what, Pricer(cfg, ids, world, batch, cluster, compute, schedule, stack, counts, x).price(tables))
        for what, x in EXCHANGES
    ]
    nodes = -(-world // cluster.gpus_per_node)
    if nodes in DP_THRESHOLD_GIB:  # HugeCTR's data-parallel tables: those under its threshold
        # its threshold counts 8 bytes per element (weight and Adagrad state) in units of 1e9 bytes
        limit = DP_THRESHOLD_GIB[nodes] * 1e9 / 8 * 4  # as fp32 weights, as offline_plan counts them
        pricer = Pricer(cfg, ids, world, batch, cluster, compute, schedule, stack, counts)
        again = plan_offline(cfg, world, batch, cluster, reserved, pricer, key, ids, None, use_cache, "fast", limit)
        if again.fits:
            rows = int(limit / (cfg.sparse.dim * 4))
            what = f"data_parallel only under HugeCTR's threshold ({rows:,} rows), planned again"
            priced.append((what, pricer.price(again.tables)))
    return held_against(pub, row, priced)
