"""`gembench project --check`: the cost model against a measured distributed run of the same setup.

The measured run gives the setup (config or workload, global batch, world, its own plan, its stack
and schedule); a 1-rank result of the same model and stack gives compute per example and the
lookup's seconds per byte; a calibrated cluster file gives the links. The projection of that
setup is printed stage by stage beside what the ranks measured, with the error. Goals: the step
within 15%, each stage within 25% (stages under MINOR_SHARE of the step are shown, not held).
A 2D run (run.sparse_parallel) is priced as its groups: its plan is one group's, and its replica
sync is a stage held like the others.
"""

from __future__ import annotations

import dataclasses

from tabulate import tabulate

from gembench.errors import UsageError
from gembench.harness.projection.cluster import load_cluster
from gembench.harness.projection.cost import RUN_STAGES, project
from gembench.harness.projection.offline_plan import plan_from_result
from gembench.harness.projection.rates import measured_compute
from gembench.harness.projection.sparse2d import SparseGroups
from gembench.harness.projection.subject import subject_of_result

STEP_GOAL, STAGE_GOAL = 0.15, 0.25
MINOR_SHARE = 0.05
SETUP = ("dense_parallel", "activation_checkpointing", "bf16", "compile", "fused_embeddings", "jagged")


def check(measured: dict, one_rank: dict, cluster, path: str = "the checked result") -> dict:
    from gembench.harness.train.stack import STACKS

    run = measured["run"]
    if (run.get("nproc") or 1) < 2 or not measured.get("ranks"):
        raise UsageError("--check takes a distributed result (gembench run --nproc N, N >= 2)")
    if one_rank["config"]["name"] != measured["config"]["name"]:
        raise UsageError(
            f"--from measured {one_rank['config']['name']!r}, the checked run "
            f"{measured['config']['name']!r}: give a result of the same model"
        )
    mine, theirs = run.get("options") or {}, one_rank["run"].get("options") or {}
    # dense_parallel may differ: one rank holds the whole dense part whatever the run shards it over
    differ = [k for k in SETUP if k in mine and k in theirs and mine[k] != theirs[k] and k != "dense_parallel"]
    if differ:
        raise UsageError(
            f"--from ran another stack ({', '.join(f'{k} {theirs[k]} vs {mine[k]}' for k in differ)}): "
            "measure the 1-rank result with the checked run's switches"
        )
    model = subject_of_result(measured, path, as_run=True)
    stack = dataclasses.replace(STACKS["optimized"], **{k: mine[k] for k in SETUP if k in mine})
    world, batch = run["nproc"], run["per_rank_batch"]
    peak = measured["ranks"][0]["peak_tflops"]
    cluster = dataclasses.replace(cluster, peak_tflops=peak)
    schedule = "pipelined" if mine.get("pipeline") else "staged"
    # a 2D run: its plan is one group's, priced as such, its replica sync a stage of its own
    # (TorchRec's placement: a group's ranks W/G apart)
    sparse = run.get("sparse_parallel")
    groups = (
        SparseGroups(sparse["sharding_group"], world, inter_host=False, sync_every=sparse["replica_sync_every"])
        if sparse
        else None
    )
    projected = project(
        model,
        plan_from_result(measured),
        world,
        batch,
        cluster,
        measured_compute(one_rank),
        schedule,
        stack,
        groups,
    )
    got = measured["summary"]["stages"]
    step = measured["summary"]["step_time_s"]["p50"]
    rows = []
    for s in RUN_STAGES + (("replica_sync",) if groups else ()):
        p, m = projected.stages[s].exposed_s, got.get(s, {}).get("time_s", 0.0)
        held = m >= MINOR_SHARE * step
        rows.append(
            {
                "stage": s,
                "projected_s": p,
                "measured_s": m,
                "error": (p - m) / m if m else None,
                "held": held,
                "ok": (abs(p - m) <= STAGE_GOAL * m) if held else None,
            }
        )
    step_p = projected.step_time_s
    return {
        "stages": rows,
        "step": {
            "projected_s": step_p,
            "measured_s": step,
            "error": (step_p - step) / step,
            "ok": abs(step_p - step) <= STEP_GOAL * step,
        },
        "projected": projected,
        "schedule": schedule,
        "links": cluster.links_used(),
        "world": world,
        "config": model.name,
        "sharding": run.get("sharding"),
        "mfu": {"projected": projected.mfu, "measured": measured["summary"]["mfu"]},
    }


def check_command(measured: str, one_rank: str, cluster: str) -> int:
    """`gembench project --check MEASURED --from ONE_RANK --cluster FILE.toml`: the table printed."""
    from gembench.harness.store.results import load_result

    out = check(load_result(measured), load_result(one_rank), load_cluster(cluster), measured)
    pct = lambda x: "" if x is None else f"{100 * x:+.1f}%"  # noqa: E731
    verdict = lambda r: "" if r.get("ok") is None else ("ok" if r["ok"] else "OUTSIDE")  # noqa: E731
    table = [
        [
            r["stage"],
            f"{1e3 * r['projected_s']:,.1f}",
            f"{1e3 * r['measured_s']:,.1f}",
            pct(r["error"]),
            verdict(r) if r["held"] else "(minor)",
        ]
        for r in out["stages"]
    ]
    st = out["step"]
    table.append(
        ["step", f"{1e3 * st['projected_s']:,.1f}", f"{1e3 * st['measured_s']:,.1f}", pct(st["error"]), verdict(st)]
    )
    print(
        f"gembench project --check: {out['config']} on {out['world']} ranks, sharding {out['sharding']}, "
        f"schedule {out['schedule']}; compute from {one_rank}"
    )
    print(f"links: {out['links']}")
    print(
        tabulate(
            table,
            headers=[
                "stage",
                "projected ms",
                "measured ms",
                "error",
                f"goal (step {STEP_GOAL:.0%}, stage {STAGE_GOAL:.0%})",
            ],
            disable_numparse=True,
            colalign=("left", "right", "right", "right", "left"),
        )
    )
    print(f"MFU projected {100 * out['mfu']['projected']:.2f}%, measured {100 * out['mfu']['measured']:.2f}%")
    return 0
