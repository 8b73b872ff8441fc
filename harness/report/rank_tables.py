"""The tables of a distributed run (run.nproc > 1): per-rank stages, embedding imbalance,
communication and --rebalance, under the one-process tables (tables.py) they share."""

from __future__ import annotations

from tabulate import tabulate

from gembench.harness.report.numbers import ms, pct, si
from gembench.harness.report.tables import (
    blocks_line,
    diverged_banner,
    header,
    stage_table,
    startup_block,
    totals_table,
)


def rank_stage_table(result: dict) -> str:
    """Mean ms per stage and rank; the last column is the critical path (slowest rank)."""
    ranks = result["ranks"]
    crit = result["imbalance"]["critical_path_s"]
    rows = [[s] + [ms(r["stage_means_s"][s]) for r in ranks] + [ms(crit[s])] for s in crit]
    rows.append(["sum"] + [ms(sum(r["stage_means_s"].values())) for r in ranks] + [ms(sum(crit.values()))])
    rows.append(
        ["step (wall, p50)"] + [ms(r["step_time_p50_s"]) for r in ranks] + [ms(result["summary"]["step_time_s"]["p50"])]
    )
    headers = ["stage (mean ms)"] + [f"rank {r['rank']}" for r in ranks] + ["critical path"]
    return tabulate(rows, headers=headers, colalign=("left",) + ("right",) * (len(ranks) + 1))


LOAD_LABELS = {
    "ids": "IDs looked up",
    "unique_ids": "unique IDs",
    "bytes_read": "bytes read",
    "bytes_written": "bytes written",
    "bytes_moved": "bytes moved (read + written)",
    "lookup_s": "lookup time",
    "perf_ms": "planner perf (ms)",
    "lookup_ms": "planner lookup (ms)",
    "storage_bytes": "planner storage",
}


def imbalance_table(result: dict) -> str:
    imb = result["imbalance"]
    rows = []
    for side in ("measured", "planned"):
        for load, values in imb[side]["loads"].items():
            m = imb[side]["metrics"][load]
            fmt = (lambda v: ms(v)) if load == "lookup_s" else (lambda v: si(v))
            primary = " *" if side == "measured" and load == imb["primary"] else ""
            rows.append(
                [
                    side,
                    LOAD_LABELS.get(load, load) + primary,
                    " / ".join(fmt(v) for v in values),
                    f"{m['max_mean']:.3f}",
                    f"{m['min_max']:.3f}",
                    f"{m['total_variation']:.3f}",
                    f"{m['total_distance']:.3f}",
                    f"{m['chi']:.3f}",
                    f"{m['kl']:.3f}",
                ]
            )
    table = tabulate(
        rows,
        headers=["", "load per rank", "rank 0 / 1 / ...", "max/mean", "min/max", "tot.var", "tot.dist", "chi", "KL"],
        colalign=("left", "left", "right") + ("right",) * 6,
    )
    return (
        f"{table}\n* primary. stall cost {pct(imb['stall_cost'])} of the step; "
        f"{pct(imb['hot_1pct_share'])} of lookups hit the hottest 1% of rows"
    )


def comm_table(result: dict) -> str:
    c = result["comm"]
    rows = [
        [
            kind,
            f"{k['calls']:.0f}",
            si(k["bytes"], "B"),
            ms(k["time_s"]),
            ms(k["time_max_s"]),
            si(k["algbw_Bps"], "B/s"),
            si(k["busbw_Bps"], "B/s"),
            pct(k["step_share"]),
        ]
        for kind, k in c["by_kind"].items()
    ]
    table = tabulate(
        rows,
        headers=[
            "collective (per step, mean of ranks)",
            "calls",
            "bytes",
            "ms",
            "ms max rank",
            "algbw",
            "busbw",
            "of step",
        ],
        colalign=("left",) + ("right",) * 7,
    )
    exp = tabulate(
        [
            [
                f"rank {e['rank']}",
                ms(e["comm_s"]),
                ms(e["overlapped_s"]),
                ms(e["exposed_s"]),
                pct(e["overlap_fraction"]),
                pct(e["exposed_fraction"]),
            ]
            for e in c["exposure"]
        ],
        headers=["", "comm ms", "overlapped", "exposed", "overlap %", "exposed of step"],
        colalign=("left",) + ("right",) * 5,
    )
    return (
        f"{table}\n\n{exp}\n(from {c['profiled_steps']} profiled steps per rank; exposed "
        f"communication {pct(c['exposed_comm_fraction'])} of the step, mean of ranks)"
    )


def placement(p: dict) -> str:
    """A planned table's placement as "sharding_type@ranks", e.g. row_wise@0,1."""
    return f"{p['sharding']}@{','.join(map(str, p['ranks']))}"


def _plan_kinds(plan: dict) -> str:
    kinds: dict[str, int] = {}
    for p in plan.values():
        kinds[p["sharding"]] = kinds.get(p["sharding"], 0) + 1
    return ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))


def rebalance_table(result: dict) -> str:
    """--rebalance: the first plan's run beside the re-planned one, the plan change, the goal."""
    rb = result["rebalance"]
    sides = [rb["before"], rb["after"], rb["again"]]

    def row(label, cell):
        return [label, *(cell(side) for side in sides)]

    def per_rank(load, fmt):
        return lambda side: " / ".join(fmt(v) for v in side["loads"][load])

    rows = []
    for load in rb["before"]["loads"]:
        fmt = ms if load == "lookup_s" else si
        label = LOAD_LABELS.get(load, load)
        rows.append(row(label + " per rank", per_rank(load, fmt)))
        rows.append(
            row(
                label + " max/mean" + (" *" if load == rb["primary"] else ""),
                lambda side: f"{side['metrics'][load]['max_mean']:.3f}",
            )
        )
    rows += [
        row("step p50 per rank (ms)", lambda side: " / ".join(ms(v) for v in side["rank_step_p50_s"])),
        row("step p50 (ms)", lambda side: ms(side["step_time_s"]["p50"])),
        row("stall cost", lambda side: pct(side["stall_cost"])),
        row("exposed comm", lambda side: pct(side["exposed_comm_fraction"])),
        row("MFU", lambda side: pct(side["mfu"])),
        row("plan", lambda side: _plan_kinds(side["plan"])),
    ]
    table = tabulate(
        rows,
        headers=["", "planner's plan", "rebalanced", "planner's plan again"],
        colalign=("left", "right", "right", "right"),
    )
    moved = rb["moved"]
    shown = ", ".join(f"{m['table'].removeprefix('table_')} {m['before']} -> {m['after']}" for m in moved[:12])
    more = f" and {len(moved) - 12} more" if len(moved) > 12 else ""
    change, goal, carried = rb["step_change"], rb["goal"], rb["carried"]
    lo, hi = change["ci95"]
    worse = "met" if goal["step_not_worse"] else "NOT met (slower, 95% CI above 1)"
    lines = [
        table + "\n* primary",
        f"moved {len(moved)} table(s)" + (f": {shown}{more}" if moved else " (the re-plan kept the plan)"),
        f"step rebalanced / planner's plan: {change['ratio']:.3f}, 95% CI [{lo:.3f}, {hi:.3f}] ({change['test']}: "
        f"the runs went A, B, A' in the same processes)"
        + ("" if rb["again_same_plan"] else "; NOTE: the planner's plan came out different the second time"),
        f"goal: measured max/mean <= {goal['max_mean_at_most']:.2f} after: {goal['max_mean']:.3f} "
        f"{'met' if goal['met_imbalance'] else 'NOT met'}; step not worse: {worse}",
        f"re-planned from: measured pooling and per-row load of every table, lookup "
        f"{rb['lookup_s_per_byte'] * 1e9:.2f} ns per byte read; carried {carried['tensors']} tensors and "
        f"{carried['optimizer_states']} optimizer states"
        + (
            f", {len(carried['reset'])} optimizer state(s) reset (their layout changed shape)"
            if carried["reset"]
            else ""
        ),
    ]
    return "\n".join(lines)


def sparse_line(run: dict) -> str:
    """2D sparse parallelism's layout, under the plan it repeats in every group ("" under 1-D)."""
    sparse = run.get("sparse_parallel")
    if not sparse:
        return ""
    groups = ", ".join(str(g) for g in sparse["groups"])
    every = sparse["replica_sync_every"]
    merged = "averaged" if run["options"].get("replica_merge", "average") == "average" else "merged by their updates"
    return (
        f"\n2D sparse parallel: that plan (its ranks a group's) on each of {len(sparse['groups'])} groups of "
        f"{sparse['sharding_group']} ranks {groups}; each shard's replicas {merged} every "
        f"{'step' if every == 1 else f'{every} steps'} (stage replica_sync)"
    )


def distributed_report(result: dict) -> str:
    run = result["run"]
    plan = ", ".join(f"{t.removeprefix('table_')}:{placement(p)}" for t, p in result["plan"].items())
    ranks = result["ranks"]
    per_rank = ", ".join(f"rank {r['rank']} {r['tflops']:.3f} TFLOP/s ({pct(r['mfu'])} of its peak)" for r in ranks)
    engine = (
        "TorchRec TrainPipelineSparseDist (input dist and DDP gradient sync overlapped)"
        if run["options"].get("pipeline")
        else "staged (nothing overlapped)"
    )
    return "\n\n".join(
        [
            header(result),
            *diverged_banner(result),
            f"{run['nproc']} ranks on {run['nnodes']} host(s), {run['backend']}; step: {engine}\n"
            f"batch: global {run['global_batch']} = {run['nproc']} ranks x {run['per_rank_batch']} per rank\n"
            f"sharding ({run['sharding']}): {plan}" + sparse_line(run),
            "critical path: the slowest rank in each stage\n" + stage_table(result) + "\n" + blocks_line(result),
            rank_stage_table(result),
            "embedding imbalance: measured on the real batches vs the planner's estimates\n" + imbalance_table(result),
            "communication\n" + comm_table(result),
            *(
                [
                    "rebalance: the planner's plan, then TorchRec's planner again on the load measured on it, then the "
                    "planner's plan once more\n" + rebalance_table(result)
                ]
                if "rebalance" in result
                else []
            ),
            totals_table(result) + f"\nper rank: {per_rank}",
            *([startup_block(result)] if "startup" in result else []),
        ]
    )
