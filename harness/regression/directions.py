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
    )
}


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
