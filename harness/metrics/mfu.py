"""MFU and the step summary: pure functions from step samples, FLOPs and a peak to numbers.

MFU (PaLM, appendix B) = model FLOPs per step / step time / (peak FLOP/s x devices).
Model FLOPs are the analytic training FLOPs (3 x forward of the dense parts, on the batch's real
jagged lengths); recomputation, padding and embedding lookups are not model FLOPs.
HFU (hardware FLOPs utilization, same paper) counts what was executed: the model FLOPs plus the
forward FLOPs that activation checkpointing runs again in the backward. HFU - MFU is the
recomputed share; without checkpointing the two are equal.
"""

from __future__ import annotations

import math

import numpy as np

# Which share of the training FLOPs each stage performs: the forward pass in dense_forward,
# its two backward GEMMs (grad input, grad weight) in backward.
STAGE_FLOP_SHARE = {"dense_forward": 1.0, "backward": 2.0}
# Training FLOPs per forward FLOP: forward + backward (docs/design.md section 2). The one owner.
TRAIN_FLOPS_PER_FORWARD = sum(STAGE_FLOP_SHARE.values())


def train_flops(forward_flops):
    """Model training FLOPs from forward model FLOPs (a number or an array)."""
    return TRAIN_FLOPS_PER_FORWARD * forward_flops


def tflops(flops: float, seconds: float) -> float:
    """Achieved TFLOP/s."""
    return flops / seconds / 1e12


def per_step_mfu(forward_flops, step_s, peak_tflops: float, devices: int = 1) -> list[float]:
    """MFU of each step from its own forward FLOPs (jagged lengths vary) and its time."""
    return [mfu(train_flops(f), t, peak_tflops, devices) for f, t in zip(forward_flops, step_s)]


def mfu(flops_per_step: float, step_s: float, peak_tflops: float, devices: int = 1) -> float:
    return flops_per_step / step_s / (peak_tflops * 1e12 * devices)


def end_to_end(
    startup_s: float, step_s, forward_flops, peak_tflops: float, devices: int = 1, checkpoint_s: float = 0.0
) -> dict:
    """A job of these timed steps taken whole, start-up and the checkpoints' blocking included
    (what GEM calls end-to-end efficiency): its wall time, goodput (the share of it spent in the
    steps) and end-to-end MFU, the model FLOPs of every step over that wall time."""
    stepping = float(np.sum(step_s))
    job_s = startup_s + stepping + checkpoint_s
    return {
        "job_s": job_s,
        "goodput": stepping / job_s if job_s > 0 else 0.0,
        "end_to_end_mfu": mfu(float(train_flops(np.sum(forward_flops))), job_s, peak_tflops, devices) if job_s else 0.0,
    }


def median_ci(xs, confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free confidence interval of the median from order statistics.

    The ranks come from the binomial(n, 1/2) law, so no normality is assumed; step times are
    skewed (a slow outlier now and then) and this interval is honest about that.
    """
    xs = np.sort(np.asarray(xs, dtype=float))
    n = len(xs)
    if n < 3:
        return float(xs[0]), float(xs[-1])
    from scipy.special import bdtr  # the binomial CDF; scipy.stats costs every run most of a second to import

    q = (1 - confidence) / 2
    cdf = bdtr(np.arange(n + 1), n, 0.5)
    lo = int(np.argmax(cdf >= q))  # binom.ppf(q): the least k with P(X <= k) >= q
    hi = int(np.argmax(1 - cdf <= q))  # binom.isf(q): the least k with P(X > k) <= q
    return float(xs[max(lo - 1, 0)]), float(xs[min(hi, n - 1)])


def distribution(xs) -> dict:
    xs = np.asarray(xs, dtype=float)
    lo, hi = median_ci(xs)
    return {
        "p50": float(np.median(xs)),
        "p90": float(np.percentile(xs, 90)),
        "mean": float(xs.mean()),
        "min": float(xs.min()),
        "ci95": [lo, hi],
        "n": int(len(xs)),
    }


# the stage in which a checkpointed block's forward is run again
RECOMPUTE_STAGE = "backward"


def summarize(
    step_s,
    stages: dict,
    forward_flops: list[float],
    examples: int,
    peak_tflops: float,
    devices: int = 1,
    recomputed_flops: list[float] | None = None,
    beyond_model_flops: float = 0.0,
) -> dict:
    """Step summary: step time, throughput, achieved TFLOP/s, MFU and HFU, and the same per stage.

    ``forward_flops`` holds each timed step's forward model FLOPs (they vary with the jagged
    lengths of its batch); a stage's FLOPs are its share of the training FLOPs.
    ``recomputed_flops``: each step's forward FLOPs run again by activation checkpointing
    (harness/train/parallelize.py recomputed_forward_flops), executed in the backward; none if absent.
    ``beyond_model_flops``: what a step executes beyond its model and recomputed FLOPs (work that
    reaches no loss, work a formula leaves out): in HFU, never in MFU.
    """
    step_s = np.asarray(step_s, dtype=float)
    fwd = np.asarray(forward_flops, dtype=float)
    recomputed = np.zeros_like(fwd) if recomputed_flops is None else np.asarray(recomputed_flops, dtype=float)
    train = train_flops(fwd)
    step_mfu = train / step_s / (peak_tflops * 1e12 * devices)
    p50 = float(np.median(step_s))
    timed = {name: np.asarray(v, dtype=float) for name, v in stages.items() if len(v)}
    # Stage times are means, not medians: means add up, so the stage rows sum to the step.
    per_step_stage_sum = sum(timed.values()) if timed else np.zeros_like(step_s)
    total_stage_time = float(np.mean(per_step_stage_sum)) if timed else 0.0
    stage_rows = {}
    for name, times in timed.items():
        t = float(times.mean())
        flops = float(fwd.mean()) * STAGE_FLOP_SHARE.get(name, 0.0)
        executed = flops + (float(recomputed.mean()) if name == RECOMPUTE_STAGE else 0.0)
        stage_rows[name] = {
            "time_s": t,
            "p50_s": float(np.median(times)),
            "share": t / total_stage_time if total_stage_time else math.nan,
            "flops": flops,
            "tflops": tflops(flops, t) if t > 0 else 0.0,
            "mfu": mfu(flops, t, peak_tflops, devices) if t > 0 and flops else 0.0,
            "hfu": mfu(executed, t, peak_tflops, devices) if t > 0 and executed else 0.0,
        }
    mean_train = float(train.mean())
    mean_executed = mean_train + float(recomputed.mean()) + beyond_model_flops
    return {
        "step_time_s": distribution(step_s),
        "stage_sum_s": total_stage_time,
        # share of each step's wall time that the stages account for (1.0 = nothing untimed)
        "stage_coverage": float(np.mean(per_step_stage_sum / step_s)) if timed else 0.0,
        "examples_per_s": examples / p50,
        "tflops": tflops(mean_train, p50),
        "mfu": mfu(mean_train, p50, peak_tflops, devices),
        "mfu_per_step": distribution(step_mfu),
        # executed FLOPs: the model's, the recomputed forwards and the work beyond the model (hfu equals
        # mfu without checkpointing or such work)
        "executed_flops_per_step": mean_executed,
        "hfu": mfu(mean_executed, p50, peak_tflops, devices),
        "stages": stage_rows,
    }
