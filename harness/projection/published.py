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
GOAL = 0.6  # projected over published throughput, at 64 and 128 GPUs, before the differences kept


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
