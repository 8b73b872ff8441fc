"""The projection as a document (gembench.projection/1) and as the tables a person reads."""

from __future__ import annotations

from dataclasses import asdict

from tabulate import tabulate

from gembench.harness.device.env import git_state
from gembench.harness.projection.cluster import Cluster
from gembench.harness.projection.cost import STAGES, Compute
from gembench.models.config import ModelConfig

SHORT = {"table_wise": "TW", "row_wise": "RW", "column_wise": "CW", "table_row_wise": "TWRW", "data_parallel": "DP"}


def projection_document(
    cfg: ModelConfig, cluster: Cluster, rows: list[dict], schedule: str, compute: Compute, stack, id: str, created: str
) -> dict:
    commit, dirty = git_state()
    c = asdict(cluster)
    return {
        "schema": "gembench.projection/1",
        "id": id,
        "created": created,
        "config": {"name": cfg.name, "hash": cfg.hash, "global_batch": cfg.data.global_batch},
        "cluster": c | {"hash": cluster.hash()},
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
        f"gembench project {doc['config']['name']} (global batch {doc['config']['global_batch']:,}) on "
        f"{c['name']}: {c['gpus_per_node']} GPUs/node, peak {c['peak_tflops']:g} TFLOP/s per GPU (dense bf16), "
        f"{c['hbm_bytes'] / 2**30:.0f} GiB HBM; schedule {doc['schedule']}; dense {doc['options']['dense_parallel']}, "
        f"checkpointing {doc['options']['activation_checkpointing']}; commit {doc['env']['git_commit'][:10]}"
        + (" (uncommitted changes)" if doc["env"].get("git_dirty") else "")
    )
    print(f"compute: {doc['compute']['source']}\n")
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
        "plan s",
    ]
    table, stages = [], []
    for r in doc["rows"]:
        p = r["plan"]
        plan_s = f"{p['seconds']:.1f}" + (" (cached)" if p["cached"] else "")
        if not p["fits"]:
            table.append(
                [r["world"], r["nodes"], f"{r['per_rank_batch']:,}", "no plan fits", "", "", "", "", "", "", plan_s]
            )
            continue
        m = r["memory"]
        table.append(
            [
                r["world"],
                r["nodes"],
                f"{r['per_rank_batch']:,}",
                plan_text(p["shardings"]),
                f"{1e3 * r['step_time_s']:,.1f}",
                f"{100 * r['mfu']:.1f}%",
                f"{r['imbalance']['max_mean']:.2f}",
                f"{100 * r['exposed_comm_fraction']:.1f}%",
                f"{m['per_gpu_bytes'] / 2**30:,.1f}" + ("" if m["fits"] else " (over)"),
                f"{r['examples_per_s']:,.0f}",
                plan_s,
            ]
        )
        stages.append([r["world"]] + [f"{1e3 * r['stages'][s]['exposed_s']:,.2f}" for s in STAGES])
    print(tabulate(table, headers=head, disable_numparse=True, colalign=["right"] * 3 + ["left"] + ["right"] * 7))
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
    print(
        "\n(imbalance: max/mean of per-GPU embedding lookup bytes from the plan; exposed comm: share of "
        "the step; memory: the largest GPU's embedding shards + dense state + activations)"
    )
