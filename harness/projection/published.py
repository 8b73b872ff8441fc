"""Published systems a projection is held against: MLPerf Training v4.0, DLRM-DCNv2, closed division.

Source: github.com/mlcommons/training_results_v4.0, NVIDIA/results/<system>/dlrm_dcnv2/result_0..9.txt
(MLLOG: global_batch_size, train_samples, run_start/run_stop, eval_start/eval_stop) and the launch
configs NVIDIA/benchmarks/dlrm_dcnv2/implementations/merlin_hugectr/config_DGXH100_*.sh. Throughput
here is training examples per second: samples trained to the target (epoch_num at run_stop x
train_samples) over run time minus the evaluations, the median of the ten runs (their spread is
under 1.5%). docs/projection.md has the derivation and what the projection keeps different.
"""

from __future__ import annotations

from dataclasses import dataclass

from gembench.harness.projection.cost import PricedStep
from gembench.harness.projection.rates import Exchange


@dataclass(frozen=True)
class Published:
    config: str
    gpu: str  # the cluster preset it compares with
    gpus: int
    global_batch: int
    examples_per_s: float  # training only, median of the runs
    system: str
    source: str


_RESULTS = "mlcommons/training_results_v4.0 NVIDIA/results/{}/dlrm_dcnv2"
MLPERF_V4_DCNV2 = (
    Published(
        "dcnv2-mlperf",
        "h100",
        8,
        55296,
        15.63e6,
        "1x DGX H100 (Eos), HugeCTR",
        _RESULTS.format("eos_ngc24.04_merlin_hugectr"),
    ),
    Published(
        "dcnv2-mlperf",
        "h100",
        64,
        135168,
        55.83e6,
        "8x DGX H100 (Eos), HugeCTR",
        _RESULTS.format("eos_n8_ngc24.04_merlin_hugectr"),
    ),
    Published(
        "dcnv2-mlperf",
        "h100",
        128,
        135168,
        73.72e6,
        "16x DGX H100 (Eos), HugeCTR",
        _RESULTS.format("eos_n16_ngc24.04_merlin_hugectr"),
    ),
)
# Goals of the projection against these systems (each printed met or NOT met, never timed in a test):
# throughput within this range of the published at every published size (above the top is not
# credible against a hand-tuned record); the chosen plan's imbalance at the published sizes past one
# node; per-GPU throughput at the largest published size over one node's (the published: 0.30)
THROUGHPUT_GOAL = (0.8, 1.1)
IMBALANCE_GOAL = 1.5
SCALING_GOAL = 0.27


def published(config: str, cluster: str, world: int) -> Published | None:
    """The published system of this config, cluster preset and GPU count, if there is one."""
    return next((p for p in MLPERF_V4_DCNV2 if (p.config, p.gpu, p.gpus) == (config, cluster, world)), None)


# What the published systems do otherwise, as the projection can price it: HugeCTR's own exchange
# (launch configs: USE_MIXED_PRECISION=true, SBATCH_NETWORK=sharp, NCCL_COLLNET_ENABLE=1 at 8 and
# 16 nodes) and its data-parallel threshold (DP_SHARDING_THRESHOLD, GiB: 0.008 on one node, 0.0125
# on 8 and 16). Each is priced alone on the row's own plan (the threshold: planned again).
EXCHANGES = (
    ("embeddings and their gradients sent in fp16 (HugeCTR's mixed precision; TorchRec: fp32)", Exchange(emb_bytes=2)),
    ("dense gradients all-reduced in fp16 (TorchRec's DDP: fp32)", Exchange(grad_bytes=2)),
    ("all-reduce in the switches (SHARP, at 8 and 16 nodes)", Exchange(in_network_reduce=True)),
    ("the three together", Exchange(emb_bytes=2, grad_bytes=2, in_network_reduce=True)),
)
DP_THRESHOLD_GIB = {1: 0.008, 8: 0.0125, 16: 0.0125}  # nodes -> HugeCTR's DP_SHARDING_THRESHOLD


def held_against(pub: Published, step: PricedStep, priced: list[tuple[str, PricedStep]]) -> dict:
    """The published figure beside the row's step, and beside each difference priced (what, its step)."""
    ratio = lambda r: r.examples_per_s / pub.examples_per_s  # noqa: E731
    return {
        "system": pub.system,
        "source": pub.source,
        "global_batch": pub.global_batch,
        "examples_per_s": pub.examples_per_s,
        "ratio": ratio(step),
        "same_batch": step.global_batch == pub.global_batch,
        "differences": [
            {"what": what, "examples_per_s": r.examples_per_s, "ratio": ratio(r), "step_time_s": r.step_time_s}
            for what, r in priced
        ],
    }


def goals(rows: list[dict], gpus_per_node: int) -> list[tuple[str, bool]]:
    """The goals a projection's rows can be held to (those rows held against a published system):
    each as (what, with the figures, met)."""
    held = {r["world"]: r for r in rows if r.get("published") and r["plan"]["fits"]}
    if not held:
        return []
    out = []
    lo, hi = THROUGHPUT_GOAL
    ratios = {w: r["published"]["ratio"] for w, r in held.items()}
    figures = ", ".join(f"{v:.2f}x at {w}" for w, v in ratios.items())
    out.append((f"throughput {lo}-{hi}x of published: {figures}", all(lo <= v <= hi for v in ratios.values())))
    past = {w: r["imbalance"]["max_mean"] for w, r in held.items() if w > gpus_per_node}
    if past:
        figures = ", ".join(f"{v:.2f} at {w}" for w, v in past.items())
        out.append(
            (f"imbalance <= {IMBALANCE_GOAL} past one node: {figures}", all(v <= IMBALANCE_GOAL for v in past.values()))
        )
    one, top = min(held), max(held)
    if one <= gpus_per_node < top:
        per = lambda r: r["examples_per_s"] / r["world"]  # noqa: E731
        pub = lambda r: r["published"]["examples_per_s"] / r["world"]  # noqa: E731
        kept, theirs = per(held[top]) / per(held[one]), pub(held[top]) / pub(held[one])
        what = f"per-GPU throughput at {top} over {one}: {kept:.2f} (>= {SCALING_GOAL}; published {theirs:.2f})"
        out.append((what, kept >= SCALING_GOAL))
    return out
