"""The projection as a document (gembench.projection/1) and as the tables a person reads."""

from __future__ import annotations

from dataclasses import asdict

from tabulate import tabulate

from gembench.harness.device.env import git_state
from gembench.harness.projection.cluster import Cluster
from gembench.harness.projection.cost import STAGES
from gembench.harness.projection.rates import Compute
from gembench.harness.projection.subject import Subject
from gembench.harness.report.numbers import figures2

SHORT = {
    "table_wise": "TW",
    "row_wise": "RW",
    "column_wise": "CW",
    "table_row_wise": "TWRW",
    "data_parallel": "DP",
    "grid_shard": "GRID",
}


def projection_document(
    m: Subject, cluster: Cluster, rows: list[dict], schedule: str, compute: Compute, stack, id: str, created: str
) -> dict:
    commit, dirty = git_state()
    c = asdict(cluster)
    return {
        "schema": "gembench.projection/1",
        "id": id,
        "created": created,
        "config": m.document(),
        "cluster": c | {"hash": cluster.hash(), "links_used": cluster.links_used()},
        "schedule": schedule,
        "options": {
            "dense_parallel": stack.dense_parallel,
            "activation_checkpointing": stack.activation_checkpointing,
            "bf16": stack.bf16,
        },
        "compute": {
            "source": compute.source,
            "per_example_s": compute.per_example,
            "optimizer_s": compute.optimizer_s,
            "lookup_s_per_byte": compute.lookup_s_per_byte,
        },
        "env": {"git_commit": commit, "git_dirty": dirty},
        "rows": rows,
    }


def plan_text(shardings: dict[str, int]) -> str:
    return " ".join(f"{SHORT.get(k, k)} {n}" for k, n in sorted(shardings.items(), key=lambda kv: -kv[1]))


def print_projection(doc: dict) -> None:
    c = doc["cluster"]
    print(
        f"gembench project {doc['config']['name']} ({_global_batches(doc)}) on "
        f"{c['name']}: {c['gpus_per_node']} GPUs/node, peak {c['peak_tflops']:g} TFLOP/s per GPU (dense bf16), "
        f"{c['hbm_bytes'] / 2**30:.0f} GiB HBM; schedule {doc['schedule']}; dense {doc['options']['dense_parallel']}, "
        f"checkpointing {doc['options']['activation_checkpointing']}; commit {doc['env']['git_commit'][:10]}"
        + (" (uncommitted changes)" if doc["env"].get("git_dirty") else "")
    )
    print(f"compute: {doc['compute']['source']}")
    model = doc["config"]
    if model.get("source") == "workload":
        print(f"model: --model {model['import_path']}, forward FLOPs {model['flops_basis']}")
    if model.get("activations_estimated") is False:
        print("memory: the tables and the dense state; the model gives no activation estimate (memory_estimate())")
    print(f"links: {c.get('links_used', c['source'])}\n")
    head = [
        "GPUs",
        "nodes",
        "batch/GPU",
        "plan",
        "step ms",
        "MFU",
        "imbalance",
        "exposed comm",
        "memory GiB/GPU",
        "examples/s",
        "critical path",
        "plan s",
    ]
    table, stages = [], []
    for r in doc["rows"]:
        p = r["plan"]
        plan_s = f"{p['seconds']:.1f}" + (" (cached)" if p["cached"] else "")
        if not p["fits"]:
            table.append(
                [r["world"], r["nodes"], f"{r['per_rank_batch']:,}", "no plan fits", "", "", "", "", "", "", "", plan_s]
            )
            continue
        m = r["memory"]
        table.append(
            [
                r["world"],
                r["nodes"],
                f"{r['per_rank_batch']:,}",
                _layout(r) + plan_text(p["shardings"]),
                f"{1e3 * r['step_time_s']:,.1f}",
                f"{100 * r['mfu']:.1f}%",
                _imbalance(r["imbalance"]),
                f"{100 * r['exposed_comm_fraction']:.1f}%",
                figures2(m["per_gpu_bytes"] / 2**30) + ("" if m["fits"] else " (over)"),
                f"{r['examples_per_s']:,.0f}",
                _critical(r),
                plan_s,
            ]
        )
        stages.append([r["world"]] + [f"{1e3 * r['stages'][s]['exposed_s']:,.2f}" for s in STAGES])
    print(
        tabulate(
            table,
            headers=head,
            disable_numparse=True,
            colalign=["right"] * 3 + ["left"] + ["right"] * 6 + ["left", "right"],
        )
    )
    if stages:
        print("\ncritical path per stage, ms (what the schedule cannot hide):")
        print(tabulate(stages, headers=["GPUs", *STAGES], disable_numparse=True))
    hbm = c["hbm_bytes"]
    opts = doc["options"]
    tries = [
        t
        for t, done in (
            ("--set dense_parallel=fsdp", opts["dense_parallel"] != "ddp"),
            ("--set activation_checkpointing=hstu", opts["activation_checkpointing"] != "none"),
        )
        if not done
    ] + ["more GPUs", "a smaller --batch"]
    for r in doc["rows"]:
        if not r["plan"]["fits"]:
            dense = r["plan"].get("reserved_bytes", 0.0)
            why = (
                (
                    f"the dense side alone (weights, gradients, Adam state, activations) needs "
                    f"{dense / 2**30:,.0f} GiB of the {hbm / 2**30:,.0f} GiB per GPU"
                    + (f"; try {', '.join(tries)}" if dense > 0.9 * hbm else "")
                )
                if dense > 0.5 * hbm
                else f"TorchRec's planner: {r['plan']['error']}"
            )
            print(f"\n{r['world']} GPUs: no plan fits: {why}")
    _print_sparse(doc["rows"])
    _print_search(doc["rows"])
    _print_job(doc)
    _print_published(doc)
    print(
        "\n(imbalance: max/mean of per-GPU embedding lookup bytes from the plan, in brackets the lowest among "
        "the plans the planner rated; critical path: the stage the schedule hides least, the GPU that sets it "
        "and by what; exposed comm: share of the step; memory: the largest GPU's embedding shards + dense "
        "state + activations)"
    )


def _print_job(doc: dict) -> None:
    """The job around the steps (projection/job.py): start-up, checkpoints, end-to-end MFU."""
    jobs = [(r, r["job"]) for r in doc["rows"] if r.get("job")]
    if not jobs:
        return
    c, first = doc["cluster"], jobs[0][1]

    def seconds(x):
        return "" if x is None else f"{x:,.2f}"

    table = [
        [
            r["world"],
            seconds(j["startup_s"]) or "not known",
            figures2(j["checkpoint_bytes_per_gpu"] / 2**30),
            seconds(j["checkpoint_staged_s"]),
            seconds(j["checkpoint_written_s"]) or "no storage_GBps",
            seconds(j["checkpoint_blocked_s"]),
            f"{100 * j['goodput']:.1f}%",
            f"{100 * j['end_to_end_mfu']:.1f}% ({100 * r['mfu']:.1f}%)",
        ]
        for r, j in jobs
    ]
    storage = f"{c['storage_Bps'] / 1e9:g} GB/s a node" if c.get("storage_Bps") else "not in the cluster file"
    host = f"{c['host_copy_Bps'] / 1e9:g} GB/s a GPU" if c.get("host_copy_Bps") else "not in the cluster file"
    print(
        f"\nthe job: {first['steps']:,} steps, a checkpoint every {first['checkpoint_every']:,} (a model, "
        f"not a measurement: projection/job.py; host copy {host}, storage {storage}; "
        f"the job counts {' and '.join(first['includes']) or 'the steps alone'}):"
    )
    print(
        tabulate(
            table,
            headers=[
                "GPUs",
                "start-up s",
                "checkpoint GiB/GPU",
                "staged s",
                "written s",
                "blocks s/save",
                "goodput",
                "end-to-end MFU (steady)",
            ],
            disable_numparse=True,
            colalign=["right"] * 8,
        )
    )
    if first["startup_s"] is not None:
        print(
            "start-up: each phase as --from measured it, the sharding plan as this projection's planner "
            "took at each size; rendezvous, build and compile held as measured (not scaled)"
        )
    else:
        print("start-up: not known (--from a result that recorded it prices it)")


def _layout(r: dict) -> str:
    """A 2D row's plan names its group: the plan is one group's."""
    sp = r.get("sparse") or {}
    return f"2D G={sp['group_size']}: " if sp.get("chosen") == "2d" else ""


def _print_sparse(rows: list[dict]) -> None:
    """1-D or 2D sparse parallelism, per world: the layout kept and why, and each one tried."""
    rows = [r for r in rows if r.get("sparse")]
    if not any(len(r["sparse"]["candidates"]) > 1 or r["sparse"]["chosen"] == "2d" for r in rows):
        return
    first = rows[0]["sparse"]
    print(
        f"\nsparse parallelism (--sparse-parallel {first['mode']}; 2D as TorchRec's DMPCollection runs it, "
        f"the replicas synced every {first['sync_every']} step(s)):"
    )
    for r in rows:
        print(f"  {r['world']} GPUs: {r['sparse']['why']}")
    table = []
    for r in rows:
        for c in r["sparse"]["candidates"]:
            if not c["fits"]:
                table.append([r["world"], c["layout"], "does not fit", "", "", c.get("note", "")])
                continue
            even = c.get("break_even_sync_every", "")
            table.append(
                [
                    r["world"],
                    c["layout"] + (" (kept)" if c["layout"] == r["sparse"]["layout"] else ""),
                    f"{1e3 * c['step_time_s']:,.2f}",
                    f"{c['imbalance']:.2f}",
                    f"{1e3 * c['sync_s']:,.1f}" if c["group_size"] < r["world"] else "",
                    "" if even == "" else ("never" if even is None else f"{even:,}"),
                ]
            )
    print(
        tabulate(
            table,
            headers=["GPUs", "layout", "step ms", "imbalance", "one sync ms", "faster than 1D syncing every N >="],
            disable_numparse=True,
            colalign=("right", "left", "right", "right", "right", "right"),
        )
    )
    if any(r["sparse"]["chosen"] == "2d" for r in rows) or first["sync_every"] > 1:
        print(
            "2D trains otherwise than 1D: each group's replicas see only the group's share of the batch, and sync() "
            "averages their weights and Adagrad state, not their gradients; between syncs (every "
            f"{first['sync_every']} step(s) here) the replicas drift apart. A layout, and an algorithm change"
        )


def _imbalance(imb: dict) -> str:
    best = imb.get("best_found")
    return f"{imb['max_mean']:.2f}" + ("" if best is None else f" ({best:.2f})")


def _critical(r: dict) -> str:
    cp = r.get("critical_path")
    return f"{cp['stage']}: GPU {cp['gpu']}, {cp['set_by']}" if cp else ""


def _print_search(rows: list[dict]) -> None:
    """The planner's search per world: plans rated, and each restriction kept for speed."""
    lines = []
    for r in rows:
        p = r["plan"]
        kept = "; ".join(f"{x['what']} ({x['tables']} tables)" for x in p.get("restrictions") or [])
        lines.append(
            f"  {r['world']} GPUs: {p.get('proposals', 0)} plans rated, {p.get('search', 'fast')} search"
            + (" (cached)" if p["cached"] else "")
            + (f"; kept for speed: {kept}" if kept else "")
        )
    print(
        "\nplanner (the plan kept is the one projected fastest; --search full lifts the restrictions, "
        "docs/projection.md has what each costs):"
    )
    print("\n".join(lines))
    for r in rows:
        full = r["plan"].get("full_search")
        if full:
            times = r["step_time_s"] / full["step_time_s"]
            print(
                f"  {r['world']} GPUs: --search full finds a plan {times:.2f}x faster: "
                f"{1e3 * full['step_time_s']:.3g} ms a step at imbalance {full['imbalance']:.2f}, against the fast "
                f"search's {1e3 * r['step_time_s']:.3g} ms at {r['imbalance']['max_mean']:.2f} (planned in "
                f"{full['seconds']:.0f} s): pass --search full"
            )


def _print_published(doc: dict) -> None:
    """Beside the published system of the same config, cluster, GPUs and global batch, if any."""
    from gembench.harness.projection.published import THROUGHPUT_GOAL, goals

    table, differences = [], []
    for r in doc["rows"]:
        pub = r.get("published")
        if not pub:
            continue
        same = pub["same_batch"]
        table.append(
            [
                r["world"],
                f"{pub['global_batch']:,}" + ("" if same else f" (projected at {r['global_batch']:,})"),
                f"{pub['examples_per_s'] / 1e6:,.2f} M",
                f"{r['examples_per_s'] / 1e6:,.2f} M",
                f"{pub['ratio']:.2f}x" + ("" if same else " (another batch)"),
                pub["system"],
            ]
        )
        differences += [
            [r["world"], d["what"], f"{d['examples_per_s'] / 1e6:,.2f} M", f"{d['ratio']:.2f}x"]
            for d in pub["differences"]
        ]
    if table:
        print(
            f"\nheld against MLPerf Training v4.0 DLRM-DCNv2 (closed; goal {THROUGHPUT_GOAL[0]}-{THROUGHPUT_GOAL[1]}x; "
            "the differences in docs/projection.md):"
        )
        print(
            tabulate(
                table,
                headers=["GPUs", "global batch", "published examples/s", "projected", "ratio", "system"],
                disable_numparse=True,
                colalign=("right", "right", "right", "right", "right", "left"),
            )
        )
        print(
            "source: mlcommons/training_results_v4.0, NVIDIA/results/eos*_ngc24.04_merlin_hugectr "
            "(training time, evaluations out)"
        )
        print("\nwhat the published systems do otherwise, each priced alone on the row's plan:")
        print(
            tabulate(
                differences,
                headers=["GPUs", "difference", "projected", "vs published"],
                disable_numparse=True,
                colalign=("right", "left", "right", "right"),
            )
        )
        for what, met in goals(doc["rows"], doc["cluster"]["gpus_per_node"]):
            print(f"goal: {what}: {'met' if met else 'NOT met'}")


def _global_batches(doc: dict) -> str:
    batches = {r["world"]: r["global_batch"] for r in doc["rows"]}
    if len(set(batches.values())) <= 1:
        return f"global batch {next(iter(batches.values()), doc['config']['global_batch']):,}"
    return "global batch " + ", ".join(f"{gb:,} at {w}" for w, gb in batches.items())
