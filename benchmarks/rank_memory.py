"""Each rank's memory estimate against its measured rise, for ddp/fsdp x none/hstu checkpointing.

The grid of the dense-side switches (tiny and small on 2 gloo ranks), one `gembench run --nproc N` per cell,
printed with the ratio and whether it is inside 0.7-1.5. The test suite holds these cells without
compile (tests/test_parallelize.py: tiny in fp32, all four; tests/test_rank_memory.py: small in bf16,
ddp and fsdp+hstu); this prints them all for any stack (about 4 minutes on 2 cores with the default,
compiled one).

  python benchmarks/rank_memory.py                        # tiny and small, the optimized stack
  python benchmarks/rank_memory.py --configs small --set compile=off
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from tabulate import tabulate

CELLS = [("ddp", "none"), ("ddp", "hstu"), ("fsdp", "none"), ("fsdp", "hstu")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default="tiny,small")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--set", dest="switches", action="append", default=[], metavar="NAME=VALUE")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for config in args.configs.split(","):
            for dense, checkpointing in CELLS:
                out = Path(tmp) / f"{config}-{dense}-{checkpointing}.json"
                cmd = [
                    sys.executable,
                    "-m",
                    "gembench",
                    "run",
                    "--config",
                    config,
                    "--nproc",
                    str(args.nproc),
                    "--steps",
                    "2",
                    "--warmup",
                    "1",
                    "--out",
                    str(out),
                    "--quiet",
                    "--set",
                    f"dense_parallel={dense}",
                    "--set",
                    f"activation_checkpointing={checkpointing}",
                ]
                for switch in args.switches:
                    cmd += ["--set", switch]
                print(f"{config} {dense} {checkpointing} ...", file=sys.stderr, flush=True)
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0:
                    rows.append([config, dense, checkpointing, "failed", "", "", proc.stderr.strip().splitlines()[-1:]])
                    continue
                for rank in json.loads(out.read_text())["ranks"]:
                    ratio = rank["memory_estimate_ratio"]
                    rows.append(
                        [
                            config,
                            dense,
                            checkpointing,
                            rank["rank"],
                            f"{rank['peak_memory_estimate_bytes'] / 2**20:,.0f}",
                            f"{rank['peak_memory_run_bytes'] / 2**20:,.0f}",
                            f"{ratio:.2f} {'ok' if 0.7 <= ratio <= 1.5 else 'OUTSIDE 0.7-1.5'}",
                        ]
                    )
    print(
        tabulate(
            rows,
            headers=["config", "dense", "checkpointing", "rank", "estimate MiB", "measured MiB", "estimate / measured"],
        )
    )


if __name__ == "__main__":
    main()
