"""The one result of a run, for one process and N ranks alike: one process is a world of one.

Every process describes what it measured in a record (`process_record`): its samples, the FLOPs
and bytes of the batches it trained on (work.described), its memory, counters and peak. Rank 0 (or
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
from dataclasses import asdict, dataclass

import numpy as np
import torch

from gembench.harness.device.env import fingerprint
from gembench.harness.device.hardware import Bandwidth, Peak, device_name, peak_basis, recheck_peak
from gembench.harness.metrics import ops, startup
from gembench.harness.metrics.comm import across_ranks
from gembench.harness.metrics.counters import flat_metrics
from gembench.harness.metrics.imbalance import critical_path, job_imbalance
from gembench.harness.metrics.mfu import end_to_end, mfu, per_step_mfu, summarize, tflops, train_flops
from gembench.harness.store.document import result_document
from gembench.harness.train import checkpoint
from gembench.harness.train.distributed.slurm import scheduler_section
from gembench.harness.train.distributed.sparse2d import global_view
from gembench.harness.train.memory import memory_fields
from gembench.harness.train.step import divergence, finite_or_none


@dataclass
class ProcessRecord:
    """What one process measured, for the result: who and where it is, its peak (and its host's at
    processes x threads, where known), its timed steps, the FLOPs and bytes of the batches they
    trained on (``Shape``), its memory, counters and, on a sharded rank, lookup loads and comm."""

    rank: int
    host: str
    device: str
    device_name: str
    torch_threads: int
    peak: Peak
    host_peak: Peak | None
    step_s: list[float]
    stages: dict[str, list[float]]
    loss: list[float]
    task_loss: list[list[float]]
    forward_flops: list[float]  # per timed step
    recomputed_flops: list[float]
    per_block: dict[str, float]  # mean forward FLOPs per block
    untrained_per_block: dict[str, float]  # forward FLOPs a step runs that reach no loss: executed once
    beyond_formula_flops: float  # forward FLOPs that reach the loss but the formula leaves out
    embedding_bytes: dict[str, float]
    input_bytes: float
    peak_memory_bytes: int
    peak_memory_source: str
    peak_memory_estimate_bytes: float
    peak_memory_run_bytes: int
    peak_memory_run_source: str
    memory_estimate_ratio: float | None
    memory_estimate: dict  # by part
    activation_bytes: int  # saved for backward in the counted step
    dense_state_bytes: dict
    counters: dict | None
    local_rank: int = 0
    hot: dict | None = None  # sharded ranks: lookups and hot-row hits
    loads: dict | None = None
    comm: dict | None = None
    comm_calls: list | None = None
    bandwidth: Bandwidth | None = None  # the memory side of the op table's roofline
    op_step_flops: dict | None = None  # forward and recomputed FLOPs of the op step's batch
    op_calls: list | None = None  # the op step's ops (metrics/ops.OpRecorder.calls)
    startup: dict | None = None  # metrics/startup.py's record of what the process paid before its first timed step
    checkpoint: dict | None = None  # train/checkpoint.py: the saves and the save resumed from
    op_step_s: float = 0.0  # the op step's wall time, less the recorder's own

    def __post_init__(self):
        steps = len(self.step_s)
        lengths = {"loss": len(self.loss), "forward_flops": len(self.forward_flops)}
        lengths.update({f"stages.{s}": len(v) for s, v in self.stages.items()})
        wrong = {k: n for k, n in lengths.items() if n != steps}
        if wrong or self.peak.tflops_per_device <= 0:
            raise ValueError(f"rank {self.rank}'s record: {steps} timed steps, but {wrong} (peak {self.peak})")


def process_record(
    device: torch.device,
    world,
    measurement,
    peak: Peak,
    host_peak: Peak | None,
    shape: dict,
    estimate: dict,
    dense_state: dict,
    bandwidth: Bandwidth | None = None,
    **sharded,
) -> ProcessRecord:
    """The record of one process of ``world`` (measure.World) from its ``measurement``
    (measure.Measurement) and ``shape`` (work.described of the timed batches); ``estimate``: the
    memory estimate it is held against; ``sharded``: hot, loads, comm, comm_calls of a rank."""
    samples, memory = measurement.samples, measurement.memory
    return ProcessRecord(
        rank=world.rank,
        host=socket.gethostname(),
        device=str(device),
        device_name=device_name(device),
        torch_threads=torch.get_num_threads(),
        peak=peak,
        host_peak=host_peak,
        step_s=samples.step_s,
        stages=samples.stages,
        loss=samples.loss,
        task_loss=samples.task_loss,
        **shape,
        peak_memory_bytes=memory.peak_bytes,
        peak_memory_source=memory.peak_source,
        **memory_fields(estimate, memory.run_bytes, memory.run_source),
        memory_estimate=estimate,
        activation_bytes=measurement.activation_bytes,
        dense_state_bytes=dense_state,
        counters=measurement.counters,
        local_rank=world.local_rank,
        bandwidth=bandwidth,
        op_calls=measurement.op_calls or None,
        op_step_s=measurement.op_step_s,
        startup=measurement.startup,
        checkpoint=measurement.checkpoint,
        **sharded,
    )


def recheck(peak: Peak, records: list[ProcessRecord], labels: list[str]) -> Peak | None:
    """The peak check (hardware.recheck_peak) over records of one host measured against ``peak``,
    each summarized on its own and named by its label (" of rank 1", " of baseline", ""). A new
    peak replaces the old one in those records and is returned (None when the peak stands)."""
    summaries = {
        label: summarize(r.step_s, r.stages, r.forward_flops, 1, peak.tflops_per_device)
        for label, r in zip(labels, records)
    }
    new = recheck_peak(peak, summaries)
    if new is not None:
        for r in records:  # one process is its own host: its host peak is the same figure
            own_host = r.host_peak is not None and r.host_peak.calibration["threads"] == r.torch_threads
            r.peak = new
            if own_host:
                r.host_peak = new
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
    sparse: dict | None = None  # 2D sparse parallelism's layout (distributed/sparse2d.py layout())


def build_result(
    ident, run, records: list[ProcessRecord], options, sharded: Sharded | None = None, stack: str | None = None
) -> dict:
    """The result document from every process's record. ``ident``: the model's identity
    (model.Identity); ``run``: the RunConfig; ``options``: the
    StackOptions that ran (recorded as run.options); ``sharded`` where tables were sharded;
    ``stack``: the name of what ran where it is not ``run.stack`` (an ablation's variant)."""
    world = len(records)
    records = sorted(records, key=lambda r: r.rank)
    steps = len(records[0].step_s)
    step_s = [max(r.step_s[i] for r in records) for i in range(steps)]
    stage_names = list(records[0].stages)
    crit_stages = {s: [max(r.stages[s][i] for r in records) for i in range(steps)] for s in stage_names}
    job_forward = [sum(r.forward_flops[i] for r in records) for i in range(steps)]
    job_recomputed = [sum(r.recomputed_flops[i] for r in records) for i in range(steps)]
    # executed beyond the model's FLOPs: the untrained work once, what a formula leaves out trained
    left_out = train_flops(sum(r.beyond_formula_flops for r in records))
    beyond = sum(sum(r.untrained_per_block.values()) for r in records) + left_out
    peaks = [r.peak.tflops_per_device for r in records]
    global_batch = ident.global_batch
    summary = summarize(
        step_s,
        crit_stages,
        job_forward,
        global_batch,
        sum(peaks) / world,
        world,
        recomputed_flops=job_recomputed,
        beyond_model_flops=beyond,
    )
    summary.update(_memory(records))
    summary["embedding_bytes_per_step"] = _summed(records, "embedding_bytes")
    summary["input_bytes_per_step"] = sum(r.input_bytes for r in records)  # every process's batch
    stage_means = [{s: float(np.mean(r.stages[s])) for s in stage_names} for r in records]
    summary["critical_path_s"] = sum(critical_path(stage_means).values())

    diverged = None  # the first non-finite loss of any process
    for r in records:
        found = divergence(r.loss, r.task_loss, first_step=run.warmup)
        if found and (diverged is None or found["step"] < diverged["step"]):
            diverged = {**found, "rank": r.rank} if sharded else found
    forward = float(np.mean(job_forward))
    ran, why = run.precision()
    why = why if (stack or run.stack) == run.stack and options.bf16 == ran.bf16 else None
    stack = stack or run.stack
    if sharded:
        stack = f"{stack}-{'pipeline' if sharded.pipeline else 'staged'}"
    device = records[0].device
    run_section = {
        "steps": run.steps,
        "warmup": run.warmup,
        "dtype": options.dtype,
        **({"dtype_why": why} if why else {}),
        "device": device,
        "seed": run.seed,
        "stack": stack,
        "options": options.to_dict(),
        "choices": options.chosen(),
        "nproc": world,
        "nnodes": len({r.host for r in records}),
        "global_batch": global_batch,
        "per_rank_batch": global_batch // world,
    }
    flops = {
        "forward_per_step": forward,
        "model_per_step": train_flops(forward),
        "recomputed_per_step": float(np.mean(job_recomputed)),
        "per_block": _summed(records, "per_block"),
        "untrained_per_block": _summed(records, "untrained_per_block"),
        "beyond_formula_per_step": left_out,
        "executed_beyond_model_per_step": beyond,
        "memory_estimate_bytes": records[0].memory_estimate,  # by part; on ranks, rank 0's
    }
    samples = {
        "step_s": step_s,
        "mfu": per_step_mfu(job_forward, step_s, sum(peaks)),
        "loss": finite_or_none(records[0].loss),
        "task_loss": [finite_or_none(t) for t in records[0].task_loss],
        "stages": crit_stages,
    }
    peak = peak_section(records, summary)  # adds summary["mfu_host"]
    sections, metrics = {}, flat_metrics(records[0].counters) if records[0].counters else {}
    if sharded is not None:
        p50 = summary["step_time_s"]["p50"]
        run_section.update(
            sharding=sharded.sharding or "auto",
            backend=sharded.backend,
            timeout_s=sharded.timeout_s,
            batches=sharded.batch_indices,
        )
        planned = sharded.planned
        # under 2D the plan is one group's: each rank holds what its place in the group does
        planned_loads = {
            "perf_ms": global_view(planned.perf, sharded.sparse),
            "lookup_ms": global_view(planned.lookup, sharded.sparse),
            "storage_bytes": global_view(planned.storage, sharded.sparse),
        }
        if sharded.sparse is not None:
            run_section["sparse_parallel"] = sharded.sparse
        imb = job_imbalance(
            [r.loads for r in records], [r.hot for r in records], planned_loads, stage_means, step_s=p50
        )
        comm = dict(across_ranks([r.comm for r in records]), calls=[r.comm_calls for r in records])
        sections = {
            "ranks": ranks_section(records, stage_means, global_batch, summary),
            "plan": sharded.planned.tables,
            "imbalance": imb,
            "comm": comm,
        }
        metrics = {
            "imbalance_max_mean": imb["measured"]["metrics"][imb["primary"]]["max_mean"],
            "exposed_comm_fraction": comm["exposed_comm_fraction"],
            **metrics,
        }
    sections.update(scheduler_section())  # a job a scheduler started: its id and nodes
    saved = checkpoint.across_ranks([r.checkpoint for r in records])
    if saved is not None:
        sections["checkpoint"] = saved
        if "blocked_s" in saved:
            metrics["checkpoint_blocked_s"] = saved["blocked_s"]
    start = startup.slowest([r.startup for r in records])
    if start is not None:  # the slowest process's: the job's first step waits for it
        blocked = (saved or {}).get("blocked_s", 0.0)
        job = end_to_end(start["to_first_step_s"], step_s, job_forward, sum(peaks) / world, world, blocked)
        sections["startup"] = start | job
        metrics.update(startup.metrics(start))
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
    result["counters"] = records[0].counters
    if records[0].op_calls and records[0].bandwidth is not None:
        result["ops"] = op_section(records[0])
        result["peak"]["bandwidth"] = asdict(records[0].bandwidth)
    return result


def op_section(r: ProcessRecord) -> dict:
    """The op table of one process's op step (rank 0's on ranks), held against its peak and
    bandwidth, with what its FLOPs should add up to: the model FLOPs of the op step's batch, its
    recomputed forward and what the step executes beyond the model (HFU's extra), named apart."""
    rows = ops.table(r.op_calls, r.peak.tflops_per_device, r.bandwidth.gbs)
    by_stage: dict[str, float] = {}
    for row in rows:
        by_stage[row["stage"]] = by_stage.get(row["stage"], 0.0) + row["flops"]
    beyond = sum(r.untrained_per_block.values()) + train_flops(r.beyond_formula_flops)
    return {
        "rank": r.rank,
        "peak_tflops": r.peak.tflops_per_device,
        "bandwidth_gbs": r.bandwidth.gbs,
        "summary": ops.summary(rows, r.op_step_s)
        | {
            "flops_by_stage": by_stage,
            "model_flops": train_flops(r.op_step_flops["forward"]),
            "recomputed_flops": r.op_step_flops["recomputed"],
            "executed_beyond_model_flops": beyond,
        },
        "rows": rows,
    }


def _summed(records: list[ProcessRecord], key: str) -> dict:
    return {k: sum(getattr(r, key)[k] for r in records) for k in getattr(records[0], key)}


def _memory(records: list[ProcessRecord]) -> dict:
    """The job's memory figures: the largest process's peak, estimate against the process whose
    run rose most, the largest activations and dense state."""
    many = len(records) > 1
    out = {
        "peak_memory_bytes": max(r.peak_memory_bytes for r in records),
        "peak_memory_source": records[0].peak_memory_source + (", max over ranks" if many else ""),
        "activation_bytes": max(r.activation_bytes for r in records),  # saved for backward
        # the largest process's dense weights, gradients and optimizer state
        "dense_state_bytes": max(r.dense_state_bytes["total"] for r in records),
    }
    if all(r.peak_memory_run_bytes for r in records):
        worst = max(records, key=lambda r: r.peak_memory_run_bytes)
        keys = (
            "peak_memory_estimate_bytes",
            "peak_memory_run_bytes",
            "peak_memory_run_source",
            "memory_estimate_ratio",
        )
        out.update({k: getattr(worst, k) for k in keys})
        if many:
            out["peak_memory_run_source"] += ", the rank that rose most"
    return out


def ranks_section(
    records: list[ProcessRecord], stage_means: list[dict], global_batch: int, summary: dict
) -> list[dict]:
    world, p50 = len(records), summary["step_time_s"]["p50"]
    ranks = []
    for r, means in zip(records, stage_means):
        train = train_flops(float(np.mean(r.forward_flops)))
        steps = len(r.step_s)
        ranks.append(
            {
                "rank": r.rank,
                "host": r.host,
                "device": r.device,
                "device_name": r.device_name,
                "torch_threads": r.torch_threads,
                "peak_tflops": r.peak.tflops_per_device,
                "peak_source": r.peak.source,
                "per_rank_batch": global_batch // world,
                "samples": {"step_s": r.step_s, "stages": r.stages, "loss": finite_or_none(r.loss)},
                "stage_means_s": means,
                "step_time_p50_s": float(np.median(r.step_s)),
                # this rank's stages over its own step: < 100% (its untimed gaps), unlike the
                # critical path, whose slowest-rank-per-stage sum can exceed the step
                "stage_coverage": float(
                    np.mean([sum(r.stages[s][i] for s in means) / r.step_s[i] for i in range(steps)])
                ),
                "model_flops_per_step": train,
                # its share of the job's FLOPs over the job's step time: what this rank achieved
                "tflops": tflops(train, p50),
                "mfu": mfu(train, p50, r.peak.tflops_per_device),
                "loads": r.loads,
                "comm": r.comm,
                "peak_memory_bytes": r.peak_memory_bytes,
                "dense_state_bytes": r.dense_state_bytes,
                **{
                    k: getattr(r, k)
                    for k in ("peak_memory_estimate_bytes", "peak_memory_run_bytes", "memory_estimate_ratio")
                },
                "counters": r.counters,
            }
        )
    return ranks


def peak_section(records: list[ProcessRecord], summary: dict) -> dict:
    """The job's peak: per-process figures and the MFU basis (hardware.peak_basis).

    Headline MFU is against the sum of the processes' peaks (N x peak(T threads) on one CPU host,
    N devices on GPUs). CPU processes also record their host's peak at N x T threads: summary and
    metrics mfu_host are against the sum of those over hosts, the basis one process of N x T
    threads is measured on, so the two compare. Adds mfu_host to ``summary``.
    """
    world = len(records)
    peaks = [r.peak.tflops_per_device for r in records]
    first = records[0]
    section = {
        "tflops_per_device": sum(peaks) / world,
        "devices": world,
        "dtype": first.peak.dtype,
        "source": first.peak.source + (" (per rank)" if world > 1 else ""),
        "per_rank": peaks,
        "provisional": any(r.peak.provisional for r in records),
        "calibration": first.peak.calibration,
    }
    section.update(
        peak_basis(
            torch.device(first.device),
            world,
            first.torch_threads,
            None,
            override=first.peak.source.startswith("override"),
        )
    )
    hosts = {r.host: r for r in records if r.host_peak is not None}
    if hosts and len(hosts) == len({r.host for r in records}):
        section["host"] = {
            "tflops": sum(r.host_peak.tflops_per_device for r in hosts.values()),
            "threads": first.host_peak.calibration["threads"],
            "hosts": len(hosts),
            "source": first.host_peak.source,
            "provisional": any(r.host_peak.provisional for r in hosts.values()),
        }
        summary["mfu_host"] = summary["mfu"] * sum(peaks) / section["host"]["tflops"]
    return section
