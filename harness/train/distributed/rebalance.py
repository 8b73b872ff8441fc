"""`gembench run --nproc N --rebalance`: re-plan the sharding from the lookup load measured on it.

The first plan is TorchRec's, told each table's expected pooling (plan.plan_sharding). After its
timed steps every rank counts, on the batches it trained on, each table's IDs and how they fall
over the table's rows (a histogram of RESOLUTION equal row bins), and the ranks' measured lookup
time per byte moved. TorchRec's planner then plans again with

- the **measured pooling** of every table as its constraint, and
- **MeasuredLookups**, a ShardEstimator run after TorchRec's own: each candidate shard's lookup
  time (forward, and backward in TorchRec's own backward/forward proportion) is the bytes it moves,
  the IDs that fall in its rows read and a row written per example (per ID for a sequence table),
  of its columns x 4 bytes, x the measured seconds per byte moved. TorchRec's estimator
  assumes every row is looked up equally often, so under hot-rows-first IDs it prices the first
  row-wise shard like the others; this one prices it by what it was measured to take. TorchRec's
  communication estimates are kept.

The model is then rebuilt with the new plan, its weights and optimizer state carried over
(carry.py), and measured again; then once more on the planner's plan (A B A'), so that the step
comparison is not the order the runs went in. The result is the rebalanced run's, with a
``rebalance`` section holding the other two runs' figures and the plan change (section()).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from gembench.errors import UsageError
from gembench.harness.regression.stats import interval, relative_change
from gembench.harness.report.rank_tables import placement
from gembench.harness.train.distributed.plan import POOLING_DEFAULT
from gembench.workload import Workload

RESOLUTION = 256  # row bins per table: shard boundaries fall between bins to 0.4% of the rows
BYTES = 4  # fp32 tables (loads.lookup_load reads the same)
GOAL_MAX_MEAN = 1.10  # the goal: measured max/mean lookup work after rebalancing, small at 2 ranks


def check(sharding: str | None, forced: dict[str, str], tables: list[str], world: int, pipeline: bool) -> None:
    """What --rebalance refuses, before any work: nothing to re-plan, or an engine it cannot rebuild."""
    if world < 2:
        raise UsageError(
            f"--rebalance moves tables between ranks and this job has {world}: run it with --nproc 2 or more"
        )
    if forced and set(forced) >= set(tables):
        raise UsageError(
            f"--rebalance: --sharding {sharding} forces every table, so the planner has nothing "
            "to re-plan; force only some tables (t0=row_wise,...) or drop --sharding"
        )
    if pipeline:
        raise UsageError("--rebalance rebuilds the staged step; drop --pipeline")


def host_counts(batches, rows: dict[str, int], table_of: dict[str, str] | None = None) -> dict:
    """This rank's IDs per table over ``batches``, (examples, [KeyedJaggedTensor or None, ...])
    per batch (host KJTs as generated): examples, and per table the IDs and their histogram over
    RESOLUTION equal row bins. ``table_of``: feature -> table (default ``table_<feature>``, the
    zoo's naming); a workload's come from its table configs' feature_names."""
    ids = {t: 0.0 for t in rows}
    hist = {t: np.zeros(min(RESOLUTION, r), dtype=np.float64) for t, r in rows.items()}
    examples = 0
    for size, kjts in batches:
        examples += size
        for kjt in kjts:
            if kjt is None:
                continue
            for feature, jt in kjt.to_dict().items():
                table = table_of[feature] if table_of else f"table_{feature}"
                v = jt.values().numpy()
                ids[table] += v.size
                bins = len(hist[table])
                hist[table] += np.bincount(v * bins // rows[table], minlength=bins)
    return {"examples": examples, "batches": len(batches), "ids": ids, "hist": hist}


@dataclass
class Measured:
    """What the first plan's run measured, summed over the ranks (per step of the whole job)."""

    ids: dict[str, float]  # IDs looked up per step, per table
    pooling: dict[str, float]  # IDs per example, per table
    hist: dict[str, np.ndarray]  # share of the table's IDs per equal row bin
    rows: dict[str, int]
    seconds_per_byte: float  # lookup time per byte moved, sum over ranks of lookup_s / bytes_moved
    world: int

    @classmethod
    def from_ranks(cls, counts: list[dict], loads: list[dict], rows: dict[str, int]) -> "Measured":
        steps = counts[0]["batches"]
        examples = sum(c["examples"] for c in counts)
        ids = {t: sum(c["ids"][t] for c in counts) for t in rows}
        hist = {}
        for t in rows:
            h = sum(c["hist"][t] for c in counts)
            hist[t] = h / h.sum() if h.sum() else np.full(len(h), 1.0 / len(h))
        moved = sum(r["bytes_moved"] for r in loads)
        seconds = sum(r.get("lookup_s", 0.0) for r in loads)
        return cls(
            ids={t: v / steps for t, v in ids.items()},
            pooling={t: v / examples for t, v in ids.items()},
            hist=hist,
            rows=rows,
            seconds_per_byte=seconds / moved if moved else 0.0,
            world=len(loads),
        )

    def share(self, table: str, lo: int, hi: int) -> float:
        """Share of ``table``'s IDs that fall in rows [lo, hi), partial bins pro rata."""
        h, rows = self.hist[table], self.rows[table]
        edges = np.linspace(0, rows, len(h) + 1)
        overlap = np.clip(np.minimum(edges[1:], hi) - np.maximum(edges[:-1], lo), 0, None)
        return float((h * overlap / np.diff(edges)).sum())


class MeasuredLookups:
    """A TorchRec ShardEstimator: every shard's lookup compute from the measured load on its rows.

    Runs after TorchRec's EmbeddingPerfEstimator (plan.plan_sharding) and replaces fwd_compute
    with the measured figure, bwd_compute in TorchRec's own proportion to it; comms untouched.
    """

    def __init__(self, measured: Measured):
        self.measured = measured

    def estimate(self, sharding_options, sharder_data_map=None) -> None:
        m = self.measured
        for option in sharding_options:
            if option.name not in m.ids:
                continue
            for shard in option.shards:
                if shard.perf is None:
                    continue
                lo = shard.offset[0]
                share = m.share(option.name, lo, lo + shard.size[0])
                examples = m.ids[option.name] / m.pooling[option.name] if m.pooling[option.name] else 0.0
                if option.sharding_type == "data_parallel":  # each rank looks up its own examples
                    share /= m.world
                    examples /= m.world
                ids = m.ids[option.name] * share
                written = examples if getattr(option, "is_pooled", True) else ids  # rows of the shard's width
                fwd_ms = 1e3 * (ids + written) * shard.size[1] * BYTES * m.seconds_per_byte
                p = shard.perf
                bwd_ms = p.bwd_compute * fwd_ms / p.fwd_compute if p.fwd_compute > 0 else 2 * fwd_ms
                shard.perf = dataclasses.replace(p, fwd_compute=fwd_ms, bwd_compute=bwd_ms)


def row_skew(measured: Measured, plan: dict) -> dict[str, float]:
    """Per table split by rows over several ranks: max/mean of the measured IDs of its shards."""
    out = {}
    for table, p in plan.items():
        if table not in measured.hist or len(p["ranks"]) < 2 or p["sharding"] not in ("row_wise", "table_row_wise"):
            continue
        shares = [
            measured.share(table, off[0], off[0] + size[0]) for off, size in zip(p["shard_offsets"], p["shard_sizes"])
        ]
        out[table] = float(max(shares) / np.mean(shares)) if np.mean(shares) > 0 else 1.0
    return out


def plan_change(before: dict, after: dict) -> list[dict]:
    """Tables whose sharding type or ranks changed, as "type@ranks" before and after."""
    return [
        {"table": t, "before": placement(before[t]), "after": placement(after[t])}
        for t in after
        if t in before and placement(before[t]) != placement(after[t])
    ]


@dataclass
class Carried:
    """What carry.carry_state moved from the first model to the second."""

    tensors: int = 0
    optimizer_states: int = 0
    reset: list[str] = field(default_factory=list)  # optimizer states whose layout changed shape


def _side(result: dict) -> dict:
    imb = result["imbalance"]
    return {
        "plan": result["plan"],
        "loads": imb["measured"]["loads"],
        "metrics": {
            k: {m: v[m] for m in ("max_mean", "min_max", "chi", "kl")} for k, v in imb["measured"]["metrics"].items()
        },
        "planned_perf_ms": imb["planned"]["loads"]["perf_ms"],
        "stall_cost": imb["stall_cost"],
        "exposed_comm_fraction": result["comm"]["exposed_comm_fraction"],
        "step_s": result["samples"]["step_s"],
        "step_time_s": result["summary"]["step_time_s"],
        "mfu": result["summary"]["mfu"],
        "rank_step_p50_s": [r["step_time_p50_s"] for r in result["ranks"]],
        "rank_lookup_s": [r["stage_means_s"].get("embedding_lookup", 0.0) for r in result["ranks"]],
    }


def section(
    before: dict,
    after: dict,
    again: dict,
    measured: Measured,
    expected: dict[str, float],
    skew: dict[str, float],
    carried: Carried,
) -> dict:
    """The result's ``rebalance`` section: the three runs' imbalance and step (the planner's plan,
    the rebalanced one, the planner's plan again), the plan change, the inputs of the re-plan.

    The step comparison pools the two runs of the planner's plan against the rebalanced one
    between them: a drift that is linear over the three runs cancels."""
    primary = after["imbalance"]["primary"]
    change = relative_change(before["samples"]["step_s"] + again["samples"]["step_s"], after["samples"]["step_s"])
    lo, hi = interval(change, 0.025)
    after_max_mean = after["imbalance"]["measured"]["metrics"][primary]["max_mean"]
    return {
        "primary": primary,
        "before": _side(before),
        "after": _side(after),
        "again": _side(again),
        "again_same_plan": {t: placement(p) for t, p in again["plan"].items()}
        == {t: placement(p) for t, p in before["plan"].items()},
        "moved": plan_change(before["plan"], after["plan"]),
        "pooling": {"measured": measured.pooling, "expected": {t: expected.get(t) for t in measured.pooling}},
        "row_skew_before": skew,
        "lookup_s_per_byte": measured.seconds_per_byte,
        "step_change": {
            "ratio": change.change + 1.0,
            "ci95": [lo + 1.0, hi + 1.0],
            "test": "Welch on log step times, the planner's plan's two runs pooled",
        },
        "carried": dataclasses.asdict(carried),
        "goal": {
            "max_mean_at_most": GOAL_MAX_MEAN,
            "max_mean": after_max_mean,
            "met_imbalance": after_max_mean <= GOAL_MAX_MEAN,
            "step_not_worse": lo <= 0.0,
        },
    }


def declared_pooling(workload: Workload) -> dict[str, float]:
    """The pooling the workload declares per table (pooling(); TorchRec's default 1 elsewhere):
    what --rebalance's section sets the measured pooling beside."""
    given = workload.pooling()
    return {t.name: float(given.get(t.name, POOLING_DEFAULT)) for t in workload.tables()}
