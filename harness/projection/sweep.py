"""Plan and price each world size of a projection: the loop behind `gembench project`."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass

from gembench.harness.projection.cluster import Cluster
from gembench.harness.projection.cost import PricedStep, Pricer, dense_side, sharding_counts
from gembench.harness.projection.offline_plan import plan_offline
from gembench.harness.projection.published import DP_THRESHOLD_GIB, EXCHANGES, held_against, published
from gembench.harness.projection.rates import Compute, Exchange
from gembench.harness.projection.sparse2d import (
    SYNC_EVERY,
    SparseGroups,
    group_sizes,
    layouts,
    refuse_single_groups,
    table_state_bytes,
)
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
    sparse: str = "auto",
    sync_every: int | None = None,
) -> list[dict]:
    """One row per world size: its plan, and the step the cost model prices for it. ``batches``:
    a global batch per world size, where it differs from the model's. ``sparse``: "1d" plans the
    tables over the world, "2d" over each group size G (sparse2d.py), "auto" both, the fastest kept;
    ``sync_every``: 2D's steps between syncs of the replicas (None: TorchRec's default)."""
    sync_every = sync_every or SYNC_EVERY
    if sparse == "2d":
        refuse_single_groups(worlds, cluster)
    rows = []
    for world in worlds:
        wm = m.at_batch((batches or {}).get(world))
        batch = wm.global_batch // world
        reserved = sum(dense_side(wm, batch, stack, world, cluster.gpus_per_node).values())
        at = _World(wm, world, batch, cluster, compute, schedule, stack, reserved, use_cache, search, forced, progress)
        tried = [at.plan(None)] if sparse != "2d" else []
        if sparse != "1d":
            for size in group_sizes(world, cluster.gpus_per_node):
                tried += [at.plan(groups) for groups in layouts(world, size, cluster.gpus_per_node, sync_every)]
        fitting = [t for t in tried if t.step is not None]
        chosen = min(fitting, key=lambda t: t.step.step_time_s) if fitting else tried[0]
        rows.append(at.row(chosen, tried, sparse, sync_every))
    return rows


@dataclass
class _Tried:
    """One layout of a world: its plan (None: not planned, ``note`` says why) and priced step."""

    groups: SparseGroups | None
    plan: object | None
    step: PricedStep | None
    pricer: Pricer
    note: str = ""
    sync_s: float = 0.0  # one sync of the replicas (0 under 1-D, or where nothing was priced)

    @property
    def label(self) -> str:
        return self.groups.label() if self.groups else "1D"

    def break_even(self, reference: _Tried) -> int | None:
        """The fewest steps between syncs from which this 2D layout beats ``reference``'s step on
        its own plan: one sync over what the step without its sync gains; None if it gains nothing."""
        rest = self.step.step_time_s - self.sync_s / self.groups.sync_every
        gain = reference.step.step_time_s - rest
        return math.ceil(self.sync_s / gain) if gain > 0 else None


class _World:
    """Plans and prices the layouts of one world size: 1-D, or a 2D layout's one group."""

    def __init__(
        self, m, world, batch, cluster, compute, schedule, stack, reserved, use_cache, search, forced, progress
    ):
        self.m, self.world, self.batch, self.cluster, self.compute = m, world, batch, cluster, compute
        self.schedule, self.stack, self.reserved, self.use_cache = schedule, stack, reserved, use_cache
        self.search, self.forced, self.progress = search, forced, progress
        self.key = pricing_key(compute, schedule, stack)

    def pricer(self, groups: SparseGroups | None, exchange: Exchange = Exchange()) -> Pricer:
        return Pricer(
            self.m, self.m.ids, self.world, self.batch, self.cluster, self.compute, self.schedule, self.stack,
            exchange, groups,
        )  # fmt: skip

    def offline(self, groups, pricer, forced, search, dp_max_bytes=None):
        """TorchRec's plan for all W GPUs, or for one group of G placed as ``groups`` places it
        (its cache key names the layout: the rating prices the whole world's step)."""
        world, cluster, key = self.world, self.cluster, self.key
        if groups:
            world, cluster = groups.size, groups.group_cluster(self.cluster)
            key += f"-2d-w{self.world}-g{groups.size}-{'c' if groups.inter_host else 's'}-n{groups.sync_every}"
        return plan_offline(
            self.m, world, self.batch, cluster, self.reserved, pricer, key, self.m.ids, forced, self.use_cache,
            search, dp_max_bytes,
        )  # fmt: skip

    def plan(self, groups: SparseGroups | None) -> _Tried:
        where = f"{self.world} GPUs" + (f", {groups.label()}" if groups else "")
        pricer = self.pricer(groups)
        if groups:  # a group holds every table: 1/G of them a GPU, beside the dense side
            need, free = table_state_bytes(self.m) / groups.size, self.cluster.hbm_bytes - self.reserved
            if need > free:
                note = f"tables need {need / 2**30:,.1f} GiB a GPU, {free / 2**30:,.1f} GiB free: not offered"
                self.progress(f"gembench project: {where}: {note}")
                return _Tried(groups, None, None, pricer, note)
        self.progress(f"gembench project: {self.m.name} on {where} of {self.cluster.name}: planning ...")
        plan = self.offline(groups, pricer, self.forced, self.search)
        self.progress(
            f"gembench project: {where}: planned in {plan.seconds:.1f} s ({plan.cpu_seconds:.1f} s of CPU)"
            + (" (cached)" if plan.cached else f", {plan.proposals} plans rated")
            + ("" if plan.fits else f"; no plan fits: {plan.error}")
        )
        step = pricer.price(plan.tables) if plan.fits else None
        sync = pricer.replica_sync_s(pricer.volumes(plan.tables)) if step and groups else 0.0
        return _Tried(groups, plan, step, pricer, "" if plan.fits else plan.error, sync)

    def row(self, chosen: _Tried, tried: list[_Tried], sparse: str, sync_every: int) -> dict:
        world, plan, step = self.world, chosen.plan, chosen.step
        row = {"world": world}
        if plan is None:  # no layout was planned: none fits in memory
            row["plan"] = {"fits": False, "error": chosen.note, "seconds": 0.0, "cached": False, "shardings": {}}
        else:
            row["plan"] = {
                "fits": plan.fits,
                "error": plan.error,
                "seconds": plan.seconds,
                "cpu_seconds": plan.cpu_seconds,
                "cached": plan.cached,
                "shardings": sharding_counts(plan.tables),
                "reserved_bytes": self.reserved,
                "search": plan.search,
                "proposals": plan.proposals,
                "restrictions": plan.restrictions,
            }
        row["sparse"] = _sparse(chosen, tried, sparse, sync_every, world)
        if step is None:
            row |= {
                "nodes": -(-world // self.cluster.gpus_per_node),
                "per_rank_batch": self.batch,
                "global_batch": world * self.batch,
            }
            return row
        row |= step.to_dict()
        row["imbalance"]["best_found"] = plan.best_imbalance
        if self.search == "fast" and not self.forced and step.imbalance.max_mean > FULL_CHECK_IMBALANCE:
            self.progress(
                f"gembench project: {world} GPUs: the fast plan is {step.imbalance.max_mean:.2f}x imbalanced: "
                "asking the full search too ..."
            )
            full = self.offline(chosen.groups, chosen.pricer, None, "full")
            faster = chosen.pricer.price(full.tables) if full.fits else None
            if faster is not None and step.step_time_s > FULL_FASTER * faster.step_time_s:
                row["plan"]["full_search"] = {
                    "step_time_s": faster.step_time_s,
                    "imbalance": faster.imbalance.max_mean,
                    "seconds": full.seconds,
                }
        pub = published(self.m.name, self.cluster.name, world) if self.m.source == "config" else None
        if pub:
            row["published"] = self._held_against(pub, chosen)
        return row

    def _held_against(self, pub, chosen: _Tried):
        """The published system beside the row's step, and the row priced with each of its differences."""
        tables, groups = chosen.plan.tables, chosen.groups
        priced = [(what, self.pricer(groups, x).price(tables)) for what, x in EXCHANGES]
        nodes = -(-self.world // self.cluster.gpus_per_node)
        if nodes in DP_THRESHOLD_GIB:  # HugeCTR's data-parallel tables: those under its threshold
            # its threshold counts 8 bytes per element (weight and Adagrad state) in units of 1e9 bytes
            limit = DP_THRESHOLD_GIB[nodes] * 1e9 / 8 * 4  # as fp32 weights, as offline_plan counts them
            pricer = self.pricer(groups)
            again = self.offline(groups, pricer, None, "fast", limit)
            if again.fits:
                rows = int(limit / (max(t.embedding_dim for t in self.m.tables) * 4))
                what = f"data_parallel only under HugeCTR's threshold ({rows:,} rows), planned again"
                priced.append((what, pricer.price(again.tables)))
        return held_against(pub, chosen.step, priced)


def _sparse(chosen: _Tried, tried: list[_Tried], sparse: str, sync_every: int, world: int) -> dict:
    """The row's layout, the others tried, and why the one kept: its step against the best other;
    for a 2D layout not kept, the sync interval from which it would be (on its plan)."""
    one_d = next((t for t in tried if t.groups is None and t.step), None)
    candidates = []
    for t in tried:
        c = {"layout": t.label, "group_size": t.groups.size if t.groups else world, "fits": t.step is not None}
        if t.step is not None:
            c |= {"step_time_s": t.step.step_time_s, "imbalance": t.step.imbalance.max_mean, "sync_s": t.sync_s}
            if t.groups and one_d:  # the step without its sync, against 1-D's: the interval that pays
                c["break_even_sync_every"] = t.break_even(one_d)
        else:
            c["note"] = t.note
        candidates.append(c)
    g = chosen.groups
    out = {
        "mode": sparse,
        "chosen": "2d" if g else "1d",
        "layout": chosen.label,
        "group_size": g.size if g else world,
        "replicas": g.replicas if g else 1,
        "placement": g.placement if g else None,
        "sync_every": sync_every,
        "sync_s": chosen.sync_s,
        "candidates": candidates,
    }
    out["why"] = _why(chosen, tried, one_d, sparse)
    return out


def _why(chosen: _Tried, tried: list[_Tried], one_d: _Tried | None, sparse: str) -> str:
    if chosen.step is None:
        return "no layout fits"
    ms = lambda t: f"{1e3 * t.step.step_time_s:.2f} ms"  # noqa: E731
    others = [t for t in tried if t.step is not None and t is not chosen]
    if chosen.groups:
        g, sync = chosen.groups, chosen.sync_s
        cost = f"sync {1e3 * sync:.1f} ms every {g.sync_every} = {1e3 * sync / g.sync_every:.2f} ms/step"
        if one_d:
            return (
                f"2D G={g.size}: {ms(chosen)} vs 1D {ms(one_d)}, imbalance {chosen.step.imbalance.max_mean:.2f} vs "
                f"{one_d.step.imbalance.max_mean:.2f}; {cost}"
            )
        return f"2D G={g.size} (--sparse-parallel 2d): fastest of the group sizes, {ms(chosen)}; {cost}"
    twod = [t for t in others if t.groups]
    if not twod:
        if sparse == "1d":
            return "1D: --sparse-parallel 1d"
        if any(t.groups for t in tried):
            return "1D: no 2D group fits (" + "; ".join(f"G={t.groups.size}: {t.note}" for t in tried if t.groups) + ")"
        return "1D: no smaller group divides the world (2D needs two nodes or more)"
    best = min(twod, key=lambda t: t.step.step_time_s)
    g, sync, even = best.groups, best.sync_s, best.break_even(chosen)
    pays = "slower even without its sync" if even is None else f"it is faster syncing every {even} steps or more"
    return (
        f"1D: {ms(chosen)}; best 2D G={g.size} ({g.placement}) {ms(best)}, of it sync {1e3 * sync / g.sync_every:.2f} "
        f"ms/step (one sync {1e3 * sync:.1f} ms, every {g.sync_every}): {pays}"
    )
