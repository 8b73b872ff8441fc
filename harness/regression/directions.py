"""Which way is better for each headline metric, and how to read it from a result.

compare, gate and the asv suite all need the same answers, so they live here once. A metric not
listed is shown by compare but never judged: guessing its direction would turn an improvement into
a regression.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MetricInfo:
    name: str
    lower_is_better: bool
    unit: str
    exact: bool = False  # does not vary between runs of one commit: compare values directly
    samples: str | None = None  # key under result["samples"] holding its per-step values
    # Cost counters: deterministic counts of work done. Judged with no statistics: any increase
    # beyond the threshold named ``limit`` (a fraction of A's count, results/thresholds.toml; the
    # general ``max_counter_increase`` next, ``default_increase`` when neither is set) regresses.
    counter: bool = False
    limit: str | None = None
    default_increase: float = 0.0


METRICS: dict[str, MetricInfo] = {
    m.name: m
    for m in (
        MetricInfo("mfu", False, "fraction", samples="mfu"),
        MetricInfo("examples_per_s", False, "1/s"),
        MetricInfo("ab_mfu_ratio", False, "x"),
        MetricInfo("baseline_mfu", False, "fraction"),
        MetricInfo("step_time_s", True, "s", samples="step_s"),
        MetricInfo("imbalance_max_mean", True, "x"),
        MetricInfo("exposed_comm_fraction", True, "fraction"),
        MetricInfo("peak_memory_bytes", True, "B", exact=True),
        MetricInfo("startup_s", True, "s"),  # time to first step (metrics/startup.py); its phases are shown
    )
}

# The cost counters every result carries (result["counters"], copied into result["metrics"]):
# aten ops dispatched, host-device syncs, host-to-device bytes, GPU kernels launched (none on CPU),
# torch.compile graph breaks and recompiles. All lower-is-better and deterministic for a seed.
COUNTERS = ("aten_ops", "host_syncs", "h2d_bytes", "kernels", "graph_breaks", "recompiles")
GENERAL_COUNTER_LIMIT = "max_counter_increase"
for _name in COUNTERS:
    METRICS[_name] = MetricInfo(
        _name, True, "B" if _name == "h2d_bytes" else "count", exact=True, counter=True, limit=f"max_{_name}_increase"
    )

# Instruction counts of the kernel micro-benchmarks (benchmarks/instructions.py), one metric per
# kernel named "instructions.<kernel>". Callgrind counts vary ~0.2% between runs (interpreter and
# allocator state), so the default allowance is 1%, and the general counter limit does not apply.
INSTRUCTIONS_PREFIX = "instructions."
INSTRUCTIONS_LIMIT = "max_instructions_increase"


def info(metric: str) -> MetricInfo | None:
    """How to judge ``metric``, or None when its direction is unknown (shown, never judged)."""
    if metric in METRICS:
        return METRICS[metric]
    if metric.startswith(INSTRUCTIONS_PREFIX):
        return MetricInfo(
            metric, True, "instructions", exact=True, counter=True, limit=INSTRUCTIONS_LIMIT, default_increase=0.01
        )
    return None


def per_step(result: dict, metric: str) -> list[float]:
    """Per-step values of ``metric`` from one result, or [] when the run did not record them.

    examples_per_s is derived from step times and the global batch, since throughput per step is
    exactly global_batch / step time.
    """
    samples = result.get("samples") or {}
    info = METRICS.get(metric)
    if info and info.samples:
        values = samples.get(info.samples) or []
        return [float(v) for v in values if v is not None]
    if metric == "examples_per_s":
        batch = (result.get("run") or {}).get("global_batch")
        steps = samples.get("step_s") or []
        if batch and steps and all(s > 0 for s in steps):
            return [batch / s for s in steps]
    return []
