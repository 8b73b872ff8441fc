"""Plan and price each world size of a projection: the loop behind `gembench project`."""

from __future__ import annotations

import dataclasses
import hashlib
import json

from gembench.harness.projection.cluster import Cluster
from gembench.harness.projection.cost import Pricer, dense_side, sharding_counts
from gembench.harness.projection.offline_plan import plan_offline
from gembench.harness.projection.published import DP_THRESHOLD_GIB, EXCHANGES, held_against, published
from gembench.harness.projection.rates import Compute
from gembench.harness.projection.subject import Subject

# The fast search's restrictions cost balance first (a large table kept off data_parallel, a row
# split left out): where its plan is this imbalanced, the full search is asked too, and its plan
# named when it is FULL_FASTER quicker.
FULL_CHECK_IMBALANCE = 1.10
FULL_FASTER = 1.10


def pricing_key(compute: Compute, schedule: str, stack) -> str:
    """What the planner's ratings depend on besides model, world, batch and cluster (the cache key)."""
    fields = dataclasses.asdict(compute) | {"schedule": schedule, "stack": repr(stack)}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:12]


def sweep(
    m: Subject,
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
    a global batch per world size, where it differs from the model's."""
    ids = m.ids
    key = pricing_key(compute, schedule, stack)
    rows = []
    for world in worlds:
        wm = m.at_batch((batches or {}).get(world))
        batch = wm.global_batch // world
        reserved = sum(dense_side(wm, batch, stack, world, cluster.gpus_per_node).values())
        progress(f"gembench project: {m.name} on {world} GPUs of {cluster.name}: planning ...")
        pricer = Pricer(wm, ids, world, batch, cluster, compute, schedule, stack)
        plan = plan_offline(wm, world, batch, cluster, reserved, pricer, key, ids, forced, use_cache, search)
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
            step = pricer.price(plan.tables)
            row |= step.to_dict()
            row["imbalance"]["best_found"] = plan.best_imbalance
            if search == "fast" and not forced and step.imbalance.max_mean > FULL_CHECK_IMBALANCE:
                progress(
                    f"gembench project: {world} GPUs: the fast plan is {step.imbalance.max_mean:.2f}x imbalanced: "
                    "asking the full search too ..."
                )
                full = plan_offline(wm, world, batch, cluster, reserved, pricer, key, ids, None, use_cache, "full")
                faster = pricer.price(full.tables) if full.fits else None
                if faster is not None and step.step_time_s > FULL_FASTER * faster.step_time_s:
                    row["plan"]["full_search"] = {
                        "step_time_s": faster.step_time_s,
                        "imbalance": faster.imbalance.max_mean,
                        "seconds": full.seconds,
                    }
            pub = published(m.name, cluster.name, world) if m.source == "config" else None
            if pub:
                row["published"] = _held_against(
                    pub,
                    step,
                    plan.tables,
                    wm,
                    ids,
                    world,
                    batch,
                    cluster,
                    compute,
                    schedule,
                    stack,
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


def _held_against(pub, step, tables, m, ids, world, batch, cluster, compute, schedule, stack, reserved, key, use_cache):
    """The published system beside the row's step, and the row priced with each of its differences."""
    priced = [
        (what, Pricer(m, ids, world, batch, cluster, compute, schedule, stack, x).price(tables))
        for what, x in EXCHANGES
    ]
    nodes = -(-world // cluster.gpus_per_node)
    if nodes in DP_THRESHOLD_GIB:  # HugeCTR's data-parallel tables: those under its threshold
        # its threshold counts 8 bytes per element (weight and Adagrad state) in units of 1e9 bytes
        limit = DP_THRESHOLD_GIB[nodes] * 1e9 / 8 * 4  # as fp32 weights, as offline_plan counts them
        pricer = Pricer(m, ids, world, batch, cluster, compute, schedule, stack)
        again = plan_offline(m, world, batch, cluster, reserved, pricer, key, ids, None, use_cache, "fast", limit)
        if again.fits:
            rows = int(limit / (max(t.embedding_dim for t in m.tables) * 4))
            what = f"data_parallel only under HugeCTR's threshold ({rows:,} rows), planned again"
            priced.append((what, pricer.price(again.tables)))
    return held_against(pub, step, priced)
