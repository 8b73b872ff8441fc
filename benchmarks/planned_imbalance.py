"""Does the run's planner foresee the imbalance the batches then make? Planned vs measured, 2 ranks.

One `gembench run --nproc 2` per workload: the two examples (examples/torchrec_dlrm.py and
examples/two_tower.py), the zoo's tiny (hashed IDs) and tiny with its IDs sorted (hottest rows
first: the skewed workload, whose row_skew() the planner is told). Prints, per workload, the plan
TorchRec's planner chose, its per-rank lookup estimate (``planner lookup``: the shards' forward and
backward compute, skew priced in) and the bytes each rank's lookups then move (rows read, outputs
written: what the planner prices), their max/mean and the goal: the two within 15% of each other.
About 4 minutes on 2 cores.

  python benchmarks/planned_imbalance.py
"""

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from tabulate import tabulate

REPO = Path(__file__).resolve().parents[1]
GOAL = 0.15
SHORT = {"table_wise": "TW", "row_wise": "RW", "column_wise": "CW", "table_row_wise": "TWRW", "data_parallel": "DP"}


def workloads(folder: Path) -> dict[str, list[str]]:
    from gembench.models.config import load_config

    tiny = Path(load_config("tiny").source).read_text()
    sorted_ids = folder / "tiny-sorted.toml"
    sorted_ids.write_text(re.sub(r"^\[data\]\n", '[data]\nid_layout = "sorted"\n', tiny, count=1, flags=re.M))
    small = ["--model-arg", "batch=64", "--model-arg", "max_rows=5000"]
    return {
        "torchrec_dlrm": ["--model", f"{REPO}/examples/torchrec_dlrm.py:dlrm", *small],
        "two_tower": ["--model", f"{REPO}/examples/two_tower.py:two_tower", *small],
        "tiny (hashed IDs)": ["--config", "tiny"],
        "tiny, IDs sorted (skewed)": ["--config", str(sorted_ids)],
    }


def main() -> None:
    load = os.getloadavg()
    rows, met = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, flags in workloads(Path(tmp)).items():
            out = Path(tmp) / f"{len(rows)}.json"
            cmd = [sys.executable, "-m", "gembench", "run", *flags, "--nproc", "2", "--steps", "6", "--warmup", "2"]
            print(f"{name} ...", file=sys.stderr, flush=True)
            proc = subprocess.run(
                [*cmd, "--set", "compile=off", "--quiet", "--out", str(out)], capture_output=True, text=True
            )
            if proc.returncode != 0:
                rows.append([name, "failed: " + (proc.stderr.strip().splitlines() or [""])[-1][:90]])
                continue
            r = json.loads(out.read_text())
            imb = r["imbalance"]
            planned, measured = imb["planned"]["metrics"]["lookup_ms"], imb["measured"]["metrics"]["bytes_moved"]
            off = measured["max_mean"] / planned["max_mean"] - 1
            met += abs(off) <= GOAL
            kinds: dict[str, int] = {}
            for t in r["plan"].values():
                kinds[t["sharding"]] = kinds.get(t["sharding"], 0) + 1
            rows.append(
                [
                    name,
                    " ".join(f"{SHORT.get(k, k)} {n}" for k, n in sorted(kinds.items())),
                    " / ".join(f"{v:.3f}" for v in imb["planned"]["loads"]["lookup_ms"]),
                    " / ".join(f"{v / 1e3:,.1f}" for v in imb["measured"]["loads"]["bytes_moved"]),
                    f"{planned['max_mean']:.3f}",
                    f"{measured['max_mean']:.3f}",
                    f"{off:+.1%}",
                ]
            )
    print(f"2 gloo ranks, 6 timed steps each; load average at the start {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}")
    headers = ["workload", "plan", "planner lookup ms, rank 0 / 1", "bytes moved kB, rank 0 / 1", "planned max/mean"]
    print(tabulate(rows, headers=[*headers, "measured max/mean", "measured vs planned"], disable_numparse=True))
    print(f"goal: planned and measured imbalance within {GOAL:.0%}: {met} of {len(rows)} met")


if __name__ == "__main__":
    main()
