"""One benchmark run on one process: config -> model + data -> staged steps -> result document.

This is the library entry point the CLI, the asv suite and the tests share.
"""

from __future__ import annotations

import datetime as dt
import resource
import secrets

import torch

from gembench.harness.env import fingerprint
from gembench.harness.errors import UsageError
from gembench.harness.hardware import memory_available, reference_peak, resolve_device
from gembench.harness.metrics.mfu import summarize
from gembench.harness.results import SCHEMA
from gembench.harness.stack import StackOptions, build_train_state
from gembench.harness.step import run_steps
from gembench.models.config import ModelConfig, load_config
from gembench.models.data import SyntheticData
from gembench.models.flops import batch_forward_flops, embedding_bytes, memory_estimate

MAX_DISTINCT_BATCHES = 32  # batches are prepared up front and cycled, like a prefetching loader


def check_fits(cfg: ModelConfig, batch_size: int, device: torch.device) -> dict:
    """Refuse, before allocating anything, a config whose estimated memory exceeds the device's."""
    estimate = memory_estimate(cfg, batch_size)
    available = memory_available(device)
    if estimate["total"] > 0.9 * available:
        gib = 2**30
        raise UsageError(
            f"config {cfg.name!r} needs about {estimate['total'] / gib:,.1f} GiB "
            f"(embeddings {estimate['embeddings'] / gib:,.1f}, dense {estimate['dense'] / gib:,.1f}, "
            f"activations {estimate['activations'] / gib:,.1f}) but {device.type} has "
            f"{available / gib:,.1f} GiB free; pick a smaller config (see `gembench describe`)"
        )
    return estimate


def peak_memory_bytes(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "torch.cuda.max_memory_allocated"
    # Linux reports ru_maxrss in KiB: the whole process's peak resident set.
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "peak RSS of the process"


def run_benchmark(config: str | ModelConfig, steps: int = 20, warmup: int = 3,
                  options: StackOptions = StackOptions(), device: str = "auto", seed: int = 0,
                  peak_tflops: float | None = None, progress=None, stack_name: str = "default") -> dict:
    """Train ``config`` for ``warmup`` + ``steps`` steps and return the result document."""
    if steps < 1:
        raise UsageError(f"--steps must be at least 1, got {steps}")
    if warmup < 0:
        raise UsageError(f"--warmup must be 0 or more, got {warmup}")
    cfg = config if isinstance(config, ModelConfig) else load_config(config)
    dev = resolve_device(device)
    batch_size = cfg.data.global_batch
    estimate = check_fits(cfg, batch_size, dev)
    peak = reference_peak(dev, peak_tflops)

    state = build_train_state(cfg, options, dev, seed=seed)
    data = SyntheticData(cfg, seed=seed, batch_size=batch_size)
    batches = [data.batch(i) for i in range(min(steps + warmup, MAX_DISTINCT_BATCHES))]
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    samples = run_steps(state, batches, steps, warmup, progress=progress)

    timed = [batches[i % len(batches)] for i in range(warmup, warmup + steps)]
    per_block = [batch_forward_flops(cfg, b) for b in timed]
    forward = [sum(blocks.values()) for blocks in per_block]
    summary = summarize(samples.step_s, samples.stages, forward, batch_size, peak.tflops_per_device)
    memory, memory_source = peak_memory_bytes(dev)
    summary["peak_memory_bytes"] = memory
    summary["peak_memory_source"] = memory_source
    summary["embedding_bytes_per_step"] = embedding_bytes(cfg, timed[0])
    mean_blocks = {k: sum(b[k] for b in per_block) / len(per_block) for k in per_block[0]}

    env = fingerprint(dev)
    created = dt.datetime.now(dt.timezone.utc)
    return {
        "schema": SCHEMA,
        "id": f"{created:%Y%m%dT%H%M%SZ}-{cfg.name}-{stack_name}-{secrets.token_hex(3)}",
        "created": created.isoformat(timespec="seconds"),
        "config": {"name": cfg.name, "hash": cfg.hash, "path": cfg.source, "kind": cfg.kind},
        "run": {
            "steps": steps, "warmup": warmup, "dtype": options.dtype, "device": str(dev),
            "seed": seed, "stack": stack_name, "options": options.to_dict(), "nproc": 1,
            "global_batch": batch_size, "per_rank_batch": batch_size,
        },
        "env": env,
        "peak": {"tflops_per_device": peak.tflops_per_device, "devices": 1, "dtype": peak.dtype,
                 "source": peak.source},
        "flops": {
            "forward_per_step": sum(forward) / len(forward),
            "model_per_step": 3.0 * sum(forward) / len(forward),
            "per_block": mean_blocks,
            "memory_estimate_bytes": estimate,
        },
        "samples": {"step_s": samples.step_s, "mfu": [
            3.0 * f / t / (peak.tflops_per_device * 1e12) for f, t in zip(forward, samples.step_s)
        ], "loss": samples.loss, "stages": samples.stages},
        "summary": summary,
        "metrics": {
            "mfu": summary["mfu"],
            "step_time_s": summary["step_time_s"]["p50"],
            "examples_per_s": summary["examples_per_s"],
            "peak_memory_bytes": memory,
        },
    }
