"""The one result of a run, for one process and N ranks alike: one process is a world of one.

Every process describes what it measured in a record (`process_record`): its samples, the FLOPs
and bytes of the batches it trained on (model.described), its memory, counters and peak. Rank 0 (or
the one process) turns the records into the result document (`build_result`, schema
``gembench.result/1``, fields in store/results.py). Job-level samples are per step: step time =
the slowest process's, stage time = the slowest process's in that stage (the critical path), model
FLOPs = the sum over processes. MFU = job model FLOPs / step time / sum of the peaks; on CPU
``mfu_host`` is against each host's own peak at (its processes x threads), the basis on which one
process and N ranks compare (`peak_section`).

Where tables are sharded over ranks (a torchrun job) the result also has ``ranks`` (per rank:
samples, MFU, lookup load, comm), ``plan``, ``imbalance`` and ``comm`` (`Sharded`).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

import numpy as np
import torch

from gembench.harness.device.env import fingerprint
from gembench.harness.device.hardware import Peak, device_name, peak_basis, recheck_peak
from gembench.harness.metrics.counters import flat_metrics
from gembench.harness.metrics.imbalance import critical_path, imbalance, stall_cost
from gembench.harness.metrics.mfu import mfu, per_step_mfu, summarize, tflops, train_flops
from gembench.harness.store.document import result_document
from gembench.harness.train.distributed.slurm import scheduler_section
from gembench.harness.train.step import divergence, finite_or_none

PRIMARY_LOAD = "bytes_read"  # deterministic and proportional to memory-bound lookup work


def timed_batches(batches: list, warmup: int, steps: int) -> list:
    """The batches the timed steps train on: steps cycle through the distinct batches."""
    return [batches[i % len(batches)] for i in range(warmup, warmup + steps)]


def peak_fields(peak: Peak, host_peak: Peak | None) -> dict:
    """A record's peak: the process's own, and its host's at (processes x threads) where known."""
    fields = {
        "peak_tflops": peak.tflops_per_device,
        "peak_source": peak.source,
        "peak_dtype": peak.dtype,
        "peak_provisional": peak.provisional,
        "peak_calibration": peak.calibration,
    }
    if host_peak is not None:
        fields.update(
            host_peak_tflops=host_peak.tflops_per_device,
            host_peak_source=host_peak.source,
            host_peak_threads=host_peak.calibration["threads"],
            host_peak_provisional=host_peak.provisional,
        )
    return fields


def process_record(dev: torch.device, rank: int, samples, peak: Peak, host_peak: Peak | None, **measured) -> dict:
    """One process's record: who and where it is, its samples, its peak and what it measured
    (``measured``: described(), memory fields, activation and dense-state bytes, counters and,
    on sharded ranks, loads and comm)."""
    return {
        "rank": rank,
        "host": socket.gethostname(),
        "device": str(dev),
        "device_name": device_name(dev),
        "torch_threads": torch.get_num_threads(),
        **peak_fields(peak, host_peak),
        "step_s": samples.step_s,
        "stages": samples.stages,
        "loss": samples.loss,
        "task_loss": samples.task_loss,
        **measured,
    }


def recheck(peak: Peak, records: list[dict], labels: list[str]) -> Peak | None:
    """The peak check (hardware.recheck_peak) over records of one host measured against ``peak``,
    each summarized on its own and named by its label (" of rank 1", " of baseline", ""). A new
    peak replaces the old one in those records and is returned (None when the peak stands)."""
    summaries = {
        label: summarize(r["step_s"], r["stages"], r["forward_flops"], 1, peak.tflops_per_device)
        for label, r in zip(labels, records)
    }
    new = recheck_peak(peak, summaries)
    if new is not None:
        for r in records:  # one process is its own host: its host peak is the same figure
            own_host = "host_peak_threads" in r and r["host_peak_threads"] == r.get("torch_threads")
            r.update(peak_fields(new, new if own_host else None))
    return new


@dataclass
class Sharded:
    """What only a sharded job has: the planner's plan, which batches each kind of step used, the
    process group's backend and the launch options (sharding spec, pipeline, timeout)."""

    planned: object  # distributed.plan.PlanRecorder
    batch_indices: dict
    backend: str
    sharding: str | None
    pipeline: bool
    timeout_s: float


def build_result(
    ident, run, records: list[dict], options, sharded: Sharded | None = None, stack: str | None = None
) -> dict:
    """The result document from every process's record. ``ident``: the model's identity
    (model.Identity); ``run``: the RunConfig; ``options``: the
    StackOptions that ran (recorded as run.options); ``sharded`` where tables were sharded;
    ``stack``: the name of what ran where it is not ``run.stack`` (an ablation's variant)."""
    world = len(records)
    records = sorted(records, key=lambda r: r["rank"])
    steps = len(records[0]["step_s"])
    step_s = [max(r["step_s"][i] for r in records) for i in range(steps)]
    stage_names = list(records[0]["stages"])
    crit_stages = {s: [max(r["stages"][s][i] for r in records) for i in range(steps)] for s in stage_names}
    job_forward = [sum(r["forward_flops"][i] for r in records) for i in range(steps)]
    job_recomputed = [sum(r["recomputed_flops"][i] for r in records) for i in range(steps)]
    peaks = [r["peak_tflops"] for r in records]
    global_batch = ident.global_batch
    summary = summarize(
        step_s, crit_stages, job_forward, global_batch, sum(peaks) / world, world, recomputed_flops=job_recomputed
    )
    summary.update(_memory(records))
    summary["embedding_bytes_per_step"] = _summed(records, "embedding_bytes")
    summary["input_bytes_per_step"] = sum(r["input_bytes"] for r in records)  # every process's batch
    stage_means = [{s: float(np.mean(r["stages"][s])) for s in stage_names} for r in records]
    summary["critical_path_s"] = sum(critical_path(stage_means).values())

    diverged = None  # the first non-finite loss of any process
    for r in records:
        found = divergence(r["loss"], r["task_loss"], first_step=run.warmup)
        if found and (diverged is None or found["step"] < diverged["step"]):
            diverged = {**found, "rank": r["rank"]} if sharded else found
    forward = float(np.mean(job_forward))
    stack = stack or run.stack
    if sharded:
        stack = f"{stack}-{'pipeline' if sharded.pipeline else 'staged'}"
    device = records[0]["device"]
    run_section = {
        "steps": run.steps,
        "warmup": run.warmup,
        "dtype": options.dtype,
        "device": device,
        "seed": run.seed,
        "stack": stack,
        "options": options.to_dict(),
        "nproc": world,
        "nnodes": len({r["host"] for r in records}),
        "global_batch": global_batch,
        "per_rank_batch": global_batch // world,
    }
    flops = {
        "forward_per_step": forward,
        "model_per_step": train_flops(forward),
        "recomputed_per_step": float(np.mean(job_recomputed)),
        "per_block": _summed(records, "per_block"),
        "memory_estimate_bytes": records[0]["memory_estimate"],  # by part; on ranks, rank 0's
    }
    samples = {
        "step_s": step_s,
        "mfu": per_step_mfu(job_forward, step_s, sum(peaks)),
        "loss": finite_or_none(records[0]["loss"]),
        "task_loss": [finite_or_none(t) for t in records[0]["task_loss"]],
        "stages": crit_stages,
    }
    peak = peak_section(records, summary)  # adds summary["mfu_host"]
    sections, metrics = {}, flat_metrics(records[0]["counters"]) if records[0]["counters"] else {}
    if sharded is not None:
        run_section.update(
            sharding=sharded.sharding or "auto",
            backend=sharded.backend,
            timeout_s=sharded.timeout_s,
            batches=sharded.batch_indices,
        )
        imb = imbalance_section(records, sharded.planned, stage_means, summary["step_time_s"]["p50"])
        comm = comm_section(records)
        sections = {
            "ranks": ranks_section(records, stage_means, global_batch, summary),
            "plan": sharded.planned.tables,
            "imbalance": imb,
            "comm": comm,
        }
        metrics = {
            "imbalance_max_mean": imb["measured"]["metrics"][PRIMARY_LOAD]["max_mean"],
            "exposed_comm_fraction": comm["exposed_comm_fraction"],
            **metrics,
        }
    sections.update(scheduler_section())  # a job a scheduler started: its id and nodes
    label = f"{stack}-{world}r" if sharded else stack
    result = result_document(
        ident,
        label,
        run_section,
        fingerprint(torch.device(device)),
        peak,
        flops,
        samples,
        summary,
        sections=sections,
        metrics=metrics,
        diverged=diverged,
    )
    # rank 0's (every rank's are under ranks[r].counters): ranks run the same code
    result["counters"] = records[0]["counters"]
    return result


def _summed(records: list[dict], key: str) -> dict:
    return {k: sum(r[key][k] for r in records) for k in records[0][key]}


def _memory(records: list[dict]) -> dict:
    """The job's memory figures: the largest process's peak, estimate against the process whose
    run rose most, the largest activations and dense state."""
    many = len(records) > 1
    out = {
        "peak_memory_bytes": max(r["peak_memory_bytes"] for r in records),
        "peak_memory_source": records[0]["peak_memory_source"] + (", max over ranks" if many else ""),
        "activation_bytes": max(r["activation_bytes"] for r in records),  # saved for backward
        # the largest process's dense weights, gradients and optimizer state
        "dense_state_bytes": max(r["dense_state_bytes"]["total"] for r in records),
    }
    if all(r.get("peak_memory_run_bytes") for r in records):
        worst = max(records, key=lambda r: r["peak_memory_run_bytes"])
        keys = (
            "peak_memory_estimate_bytes",
            "peak_memory_run_bytes",
            "peak_memory_run_source",
            "memory_estimate_ratio",
        )
        out.update({k: worst[k] for k in keys})
        if many:
            out["peak_memory_run_source"] += ", the rank that rose most"
    return out


def ranks_section(records: list[dict], stage_means: list[dict], global_batch: int, summary: dict) -> list[dict]:
    world, p50 = len(records), summary["step_time_s"]["p50"]
    ranks = []
    for r, means in zip(records, stage_means):
        train = train_flops(float(np.mean(r["forward_flops"])))
        steps = len(r["step_s"])
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
                "samples": {"step_s": r["step_s"], "stages": r["stages"], "loss": finite_or_none(r["loss"])},
                "stage_means_s": means,
                "step_time_p50_s": float(np.median(r["step_s"])),
                # this rank's stages over its own step: < 100% (its untimed gaps), unlike the
                # critical path, whose slowest-rank-per-stage sum can exceed the step
                "stage_coverage": float(
                    np.mean([sum(r["stages"][s][i] for s in means) / r["step_s"][i] for i in range(steps)])
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
    return ranks


def peak_section(records: list[dict], summary: dict) -> dict:
    """The job's peak: per-process figures and the MFU basis (hardware.peak_basis).

    Headline MFU is against the sum of the processes' peaks (N x peak(T threads) on one CPU host,
    N devices on GPUs). CPU processes also record their host's peak at N x T threads: summary and
    metrics mfu_host are against the sum of those over hosts, the basis one process of N x T
    threads is measured on, so the two compare. Adds mfu_host to ``summary``.
    """
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
        section["host"] = {
            "tflops": sum(r["host_peak_tflops"] for r in hosts.values()),
            "threads": first["host_peak_threads"],
            "hosts": len(hosts),
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
