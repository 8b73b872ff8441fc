"""Whole result documents for the report tests: single-process, --ab and --nproc 2 shapes.

Built on synthetic.make_result (step times with controlled noise) plus the sections the report
draws (summary stages, peak, env, ab, ranks, imbalance, comm), shaped as `gembench run` writes them.
"""

from __future__ import annotations

import json
from pathlib import Path

from synthetic import make_result

from gembench.harness.store.results import BASELINE_SCHEMA

STAGES = {
    "data": 0.001,
    "sparse_forward": 0.004,
    "dense_forward": 0.030,
    "loss": 0.001,
    "backward": 0.055,
    "optimizer": 0.009,
}
RANK_STAGES = {
    "data": 0.001,
    "input_dist": 0.004,
    "embedding_lookup": 0.002,
    "output_dist": 0.005,
    "dense_forward": 0.02,
    "backward": 0.03,
    "grad_sync": 0.003,
    "optimizer": 0.002,
}


def summary(stages: dict, step_s: float, mfu: float) -> dict:
    return {
        "step_time_s": {"p50": step_s, "p90": step_s * 1.1, "mean": step_s, "ci95": [step_s * 0.95, step_s * 1.05]},
        "examples_per_s": 64 / step_s,
        "tflops": 1e9 / step_s / 1e12,
        "mfu": mfu,
        "stage_coverage": 1.0,
        "peak_memory_bytes": 123_456_789,
        "peak_memory_source": "test",
        "embedding_bytes_per_step": {"read": 1e5, "written": 1e5},
        "stages": {
            k: {
                "time_s": v,
                "share": v / step_s,
                "flops": 1e8 if k in ("dense_forward", "backward") else 0.0,
                "tflops": 0.0,
                "mfu": 0.0,
            }
            for k, v in stages.items()
        },
    }


def full_result(
    rid: str, commit: str, step_s: float = 0.100, created: str = "2026-01-01T00:00:00+00:00", seed: int = 0, **kw
) -> dict:
    r = make_result(
        rid,
        step_s=step_s,
        seed=seed,
        git_commit=commit,
        device_name="Test CPU (2 threads)",
        packages={"torch": "2.13.0", "torchrec": "1.8.0"},
        **kw,
    )
    r["created"] = created
    r["run"]["dtype"] = "bf16"
    r["peak"] = {"tflops_per_device": 0.1, "devices": 1, "dtype": "bf16", "source": "calibrated: test GEMM"}
    scale = step_s / sum(STAGES.values())
    r["summary"] = summary({k: v * scale for k, v in STAGES.items()}, step_s, r["metrics"]["mfu"])
    r["samples"]["stages"] = {k: [v * scale] * len(r["samples"]["step_s"]) for k, v in STAGES.items()}
    return r


def ab_result(rid: str, commit: str) -> dict:
    r = full_result(rid, commit)
    r["run"]["stack"] = "ab"
    base = summary({k: 2 * v for k, v in STAGES.items()}, 0.2, r["metrics"]["mfu"] / 2)
    r["ab"] = {
        "rounds": 2,
        "steps_per_round": 4,
        "order": "ABBA",
        "round_ratios": [2.0, 2.1],
        "mfu_ratio": 2.05,
        "mfu_ratio_ci95": [1.9, 2.2],
        "baseline": {"options": {}, "flops": {}, "samples": {}, "summary": base},
    }
    r["metrics"]["ab_mfu_ratio"] = 2.05
    return r


def dist_result(rid: str, commit: str, counters: bool = True) -> dict:
    r = full_result(rid, commit, step_s=0.08)
    r["run"].update(nproc=2, stack="optimized-staged", per_rank_batch=32)
    r["summary"] = summary(RANK_STAGES, 0.08, r["metrics"]["mfu"])
    r["ranks"] = [
        {"rank": i, "stage_means_s": {k: v * (1 + 0.3 * i) for k, v in RANK_STAGES.items()}, "step_time_p50_s": 0.08}
        for i in range(2)
    ]
    comm_kind = {
        "family": "all_to_all",
        "calls": 2.0,
        "bytes": 4096.0,
        "time_s": 0.004,
        "time_max_s": 0.005,
        "algbw_Bps": 1e6,
        "busbw_Bps": 5e5,
        "step_share": 0.05,
        "overlapped_s": 0.001,
        "exposed_s": 0.003,
    }
    r["imbalance"] = {
        "primary": "bytes_read",
        "measured": {
            "loads": {"ids": [100.0, 130.0], "bytes_read": [1e5, 1.4e5], "lookup_s": [0.001, 0.0012]},
            "metrics": {"bytes_read": {"max_mean": 1.167}},
        },
        "planned": {"loads": {"perf_ms": [1.0, 1.0], "storage_bytes": [3e6, 3e6]}, "metrics": {}},
        "critical_path_s": {k: v * 1.3 for k, v in RANK_STAGES.items()},
        "stall_cost": 0.1,
        "hot_1pct_share": 0.5,
    }
    r["comm"] = {
        "profiled_steps": 2,
        "by_kind": {"kjt_all_to_all": comm_kind, "dense_grad_all_reduce": dict(comm_kind, family="all_reduce")},
        "exposure": [
            {
                "rank": i,
                "comm_s": 0.008,
                "overlapped_s": 0.002,
                "exposed_s": 0.006,
                "overlap_fraction": 0.25,
                "exposed_fraction": 0.075,
                "step_s": 0.08,
            }
            for i in range(2)
        ],
        "exposed_comm_fraction": 0.075,
        "overlap_fraction": 0.25,
    }
    r["metrics"].update(imbalance_max_mean=1.167, exposed_comm_fraction=0.075)
    if counters:
        r["counters"] = {
            "aten_ops": 1234,
            "host_syncs": 3,
            "h2d_bytes": 2048,
            "kernels": None,
            "graph_breaks": 0,
            "recompiles": 0,
            "source": "test",
        }
    return r


def write(path: Path, doc: dict) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return str(path)


def baseline(runs: list[dict]) -> dict:
    return {
        "schema": BASELINE_SCHEMA,
        "promoted": "2026-01-01T00:00:00+00:00",
        "hardware_class": runs[0]["env"]["hardware_class"],
        "config": runs[0]["config"]["name"],
        "runs": runs,
    }
