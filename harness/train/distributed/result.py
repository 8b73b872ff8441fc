"""The one result document of a distributed run, from every rank's record (on rank 0).

Same schema as a single-process run (store/results.py), with ``run.nproc`` > 1 and:
    ranks:     per rank: host, device, peak, step_s / stages / loss samples, forward FLOPs,
               achieved TFLOP/s and MFU against its own peak, measured lookup load, comm
    plan:      {table: {sharding, kernel, ranks, shard_sizes, shard_offsets}} as the planner chose
    imbalance: {measured: {loads: {load: [per rank]}, metrics: {load: imbalance()}},
                planned:  {loads: {perf_ms, storage_bytes}: [per rank], metrics: ...},
                primary, critical_path_s, stall_cost, hot_1pct_share}
    comm:      {by_kind: {kind: calls, bytes, time_s, time_max_s, algbw_Bps, busbw_Bps, step_share}
                (per step, mean over ranks), exposure: [per rank], exposed_comm_fraction,
                overlap_fraction, profiled_steps, calls: [per rank: [{kind, family, bytes}]]}
    counters:  rank 0's cost counters (metrics/counters.py): ops and host syncs on one step after
               the timed ones, kernels and H2D bytes on the first profiled step after it; each
               rank's own are in ranks[r].counters
Job-level samples are per step: step time = the slowest rank's (the step ends when the last rank
is done), stage times = the slowest rank's in each stage (the critical path), model FLOPs = the
sum over ranks. MFU = job model FLOPs / step time / sum of the ranks' peaks; on CPU hosts
mfu_host is against each host's own peak at (its ranks x threads) instead (peak_section).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gembench.harness.device.env import fingerprint
from gembench.harness.metrics.counters import flat_metrics
from gembench.harness.metrics.imbalance import critical_path, imbalance, stall_cost
from gembench.harness.metrics.mfu import mfu, per_step_mfu, summarize, tflops, train_flops
from gembench.harness.store.document import result_document
from gembench.harness.train.distributed.slurm import scheduler_section
from gembench.harness.train.step import divergence, finite_or_none

if TYPE_CHECKING:
    from gembench.harness.train.runconfig import RunConfig

PRIMARY_LOAD = "bytes_read"  # deterministic and proportional to memory-bound lookup work


def build_result(
    cfg, args: RunConfig, env: dict, records: list[dict], planned, options, batch_indices: dict, backend: str
) -> dict:
    """``options``: the StackOptions the ranks ran (stack.on_ranks), recorded as run.options."""
    import torch

    world = env["world_size"]
    records = sorted(records, key=lambda r: r["rank"])
    steps = len(records[0]["step_s"])
    step_s = [max(r["step_s"][i] for r in records) for i in range(steps)]
    stage_names = list(records[0]["stages"])
    crit_stages = {s: [max(r["stages"][s][i] for r in records) for i in range(steps)] for s in stage_names}
    job_forward = [sum(r["forward_flops"][i] for r in records) for i in range(steps)]
    peaks = [r["peak_tflops"] for r in records]
    global_batch = cfg.data.global_batch
    job_recomputed = [sum(r["recomputed_flops"][i] for r in records) for i in range(steps)]
    summary = summarize(
        step_s, crit_stages, job_forward, global_batch, sum(peaks) / world, world, recomputed_flops=job_recomputed
    )
    p50 = summary["step_time_s"]["p50"]
    summary["peak_memory_bytes"] = max(r["peak_memory_bytes"] for r in records)
    if all(r.get("peak_memory_run_bytes") for r in records):  # the rank whose run rose most
        worst = max(records, key=lambda r: r["peak_memory_run_bytes"])
        summary.update(
            {
                k: worst[k]
                for k in (
                    "peak_memory_estimate_bytes",
                    "peak_memory_run_bytes",
                    "peak_memory_run_source",
                    "memory_estimate_ratio",
                )
            }
        )
        summary["peak_memory_run_source"] += ", the rank that rose most"
    summary["activation_bytes"] = max(r["activation_bytes"] for r in records)  # saved for backward, largest rank
    # the largest rank's dense weights, gradients and optimizer state
    summary["dense_state_bytes"] = max(r["dense_state_bytes"]["total"] for r in records)
    summary["peak_memory_source"] = records[0]["peak_memory_source"] + ", max over ranks"
    summary["embedding_bytes_per_step"] = {
        k: sum(r["embedding_bytes"][k] for r in records) for k in records[0]["embedding_bytes"]
    }
    summary["input_bytes_per_step"] = sum(r.get("input_bytes", 0.0) for r in records)  # every rank's batch
    stage_means = [{s: float(np.mean(r["stages"][s])) for s in stage_names} for r in records]
    summary["critical_path_s"] = sum(critical_path(stage_means).values())

    ranks = []
    diverged = None  # the first non-finite loss of any rank (the staged step keeps no per-task loss)
    for r in records:
        found = divergence(r["loss"], [], first_step=args.warmup)
        if found and (diverged is None or found["step"] < diverged["step"]):
            diverged = {**found, "rank": r["rank"]}
        r["loss"] = finite_or_none(r["loss"])
    for r, means in zip(records, stage_means):
        train = train_flops(float(np.mean(r["forward_flops"])))
        ranks.append(
            {
                "rank": r["rank"],
                "host": r["host"],
                "device": r["device"],
                "device_name": r["device_name"],
                "torch_threads": r["torch_threads"],
                "peak_tflops": r["peak_tflops"],
                "peak_source": r["peak_source"],
                "per_rank_batch": global_batch // world,
                "samples": {"step_s": r["step_s"], "stages": r["stages"], "loss": r["loss"]},
                "stage_means_s": means,
                "step_time_p50_s": float(np.median(r["step_s"])),
                # this rank's stages over its own step: < 100% (its untimed gaps), unlike the
                # critical path, whose slowest-rank-per-stage sum can exceed the step
                "stage_coverage": float(
                    np.mean([sum(r["stages"][s][i] for s in stage_names) / r["step_s"][i] for i in range(steps)])
                ),
                "model_flops_per_step": train,
                # its share of the job's FLOPs over the job's step time: what this rank achieved
                "tflops": tflops(train, p50),
                "mfu": mfu(train, p50, r["peak_tflops"]),
                "loads": r["loads"],
                "comm": r["comm"],
                "peak_memory_bytes": r["peak_memory_bytes"],
                "dense_state_bytes": r["dense_state_bytes"],
                **{k: r[k] for k in ("peak_memory_estimate_bytes", "peak_memory_run_bytes", "memory_estimate_ratio")},
                "counters": r["counters"],
            }
        )

    imb = imbalance_section(records, planned, stage_means, p50)
    comm = comm_section(records)
    forward = float(np.mean(job_forward))
    stack = f"{args.stack}-{'pipeline' if args.pipeline else 'staged'}"
    device = records[0]["device"]
    run = {
        "steps": args.steps,
        "warmup": args.warmup,
        "dtype": options.dtype,
        "device": device,
        "seed": args.seed,
        "stack": stack,
        "options": options.to_dict(),
        "nproc": world,
        "nnodes": len({r["host"] for r in records}),
        "global_batch": global_batch,
        "per_rank_batch": global_batch // world,
        "sharding": args.sharding or "auto",
        "backend": backend,
        "timeout_s": args.timeout,
        "batches": batch_indices,
    }
    flops = {
        "forward_per_step": forward,
        "model_per_step": train_flops(forward),
        "per_block": {k: sum(r["per_block"][k] for r in records) for k in records[0]["per_block"]},
    }
    samples = {
        "step_s": step_s,
        "mfu": per_step_mfu(job_forward, step_s, sum(peaks)),
        "loss": records[0]["loss"],
        "stages": crit_stages,
    }
    peak = peak_section(records, summary)  # adds summary["mfu_host"]
    result = result_document(
        cfg,
        f"{stack}-{world}r",
        run,
        fingerprint(torch.device(device)),
        peak,
        flops,
        samples,
        summary,
        sections={"ranks": ranks, "plan": planned.tables, "imbalance": imb, "comm": comm, **scheduler_section()},
        metrics={
            "imbalance_max_mean": imb["measured"]["metrics"][PRIMARY_LOAD]["max_mean"],
            "exposed_comm_fraction": comm["exposed_comm_fraction"],
            **flat_metrics(records[0]["counters"]),
        },
        diverged=diverged,
    )
    # rank 0's (every rank's are under ranks[r].counters): ranks run the same code
    result["counters"] = records[0]["counters"]
    return result


def peak_section(records, summary: dict) -> dict:
    """The job's peak: per-rank figures and the MFU basis (hardware.peak_basis).

    Headline MFU is against the sum of the ranks' peaks (N x peak(T threads) on one CPU host,
    N devices on GPUs). CPU ranks also record their host's peak at N x T threads: summary and
    metrics mfu_host are against the sum of those over hosts, the basis one process of N x T
    threads is measured on, so the two compare. Adds mfu_host to ``summary``.
    """
    import torch

    from gembench.harness.device.hardware import peak_basis

    world = len(records)
    peaks = [r["peak_tflops"] for r in records]
    first = records[0]
    section = {
        "tflops_per_device": sum(peaks) / world,
        "devices": world,
        "dtype": first["peak_dtype"],
        "source": first["peak_source"] + (" (per rank)" if world > 1 else ""),
        "per_rank": peaks,
        "provisional": any(r.get("peak_provisional") for r in records),
        "calibration": first.get("peak_calibration"),
    }
    section.update(
        peak_basis(
            torch.device(first["device"]),
            world,
            first["torch_threads"],
            None,
            override=first["peak_source"].startswith("override"),
        )
    )
    hosts = {r["host"]: r for r in records if r.get("host_peak_tflops")}
    if hosts and len(hosts) == len({r["host"] for r in records}):
        nodes = len(hosts)
        section["host"] = {
            "tflops": sum(r["host_peak_tflops"] for r in hosts.values()),
            "threads": first["host_peak_threads"],
            "hosts": nodes,
            "source": first["host_peak_source"],
            "provisional": any(r["host_peak_provisional"] for r in hosts.values()),
        }
        summary["mfu_host"] = summary["mfu"] * sum(peaks) / section["host"]["tflops"]
    return section


def imbalance_section(records, planned, stage_means, step_s: float) -> dict:
    loads = {k: [r["loads"][k] for r in records] for k in records[0]["loads"]}
    planned_loads = {"perf_ms": planned.perf, "storage_bytes": planned.storage}
    lookups = sum(r["hot"]["lookups"] for r in records)
    return {
        "primary": PRIMARY_LOAD,
        "measured": {"loads": loads, "metrics": {k: imbalance(v) for k, v in loads.items()}},
        "planned": {"loads": planned_loads, "metrics": {k: imbalance(v) for k, v in planned_loads.items()}},
        "critical_path_s": critical_path(stage_means),
        "stall_cost": stall_cost(stage_means, step_s),
        "hot_1pct_share": sum(r["hot"]["hot_1pct"] for r in records) / lookups if lookups else 0.0,
    }


def comm_section(records) -> dict:
    kinds = sorted({k for r in records for k in r["comm"]["by_kind"]})
    by_kind = {}
    for kind in kinds:
        rows = [r["comm"]["by_kind"].get(kind) for r in records]
        rows = [x for x in rows if x]
        mean = lambda key: float(np.mean([x[key] for x in rows]))  # noqa: E731
        time_s, size = mean("time_s"), mean("bytes")
        factor = rows[0]["busbw_Bps"] / rows[0]["algbw_Bps"] if rows[0]["algbw_Bps"] else 0.0
        by_kind[kind] = {
            "family": rows[0]["family"],
            "calls": mean("calls"),
            "bytes": size,
            "time_s": time_s,
            "time_max_s": float(max(x["time_s"] for x in rows)),
            "algbw_Bps": size / time_s if time_s > 0 else 0.0,
            "busbw_Bps": factor * size / time_s if time_s > 0 else 0.0,
            "step_share": mean("step_share"),
        }
        if all("exposed_s" in x for x in rows):  # traces analysed before per-kind exposure lack it
            by_kind[kind]["overlapped_s"] = mean("overlapped_s")
            by_kind[kind]["exposed_s"] = mean("exposed_s")
    exposure = [dict(r["comm"]["exposure"], rank=r["rank"], step_s=r["comm"]["step_s"]) for r in records]
    return {
        "profiled_steps": records[0]["comm"]["profiled_steps"],
        "by_kind": by_kind,
        "exposure": exposure,
        "exposed_comm_fraction": float(np.mean([e["exposed_fraction"] for e in exposure])),
        "overlap_fraction": float(np.mean([e["overlap_fraction"] for e in exposure])),
        "calls": [r["comm_calls"] for r in records],
    }
