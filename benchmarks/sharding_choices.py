"""Measured embedding imbalance and step time for each sharding choice, with hashed and sorted IDs.

One `gembench run --nproc N` per (ID layout, sharding): table_wise, row_wise, column_wise forced on
every table; TorchRec's planner as it ships (untold: every table priced as pooling one ID), told
each table's pooling factor (auto), and re-planned from the load measured on auto's plan
(`--rebalance`, the rebalanced run's figures). The layouts are the
config's own `[data] id_layout`, written into a copy of the config: `hashed` (IDs scattered over
rows, as production hashes them) and `sorted` (hot rows first: the first row-wise shard of every
table holds its head). Prints max/mean of the measured per-rank lookup work (bytes read), the
stall it costs, exposed communication and the step, with the machine's load. About 10 minutes for
small on 2 ranks on 2 cores.

  python benchmarks/sharding_choices.py                      # small, 2 ranks
  python benchmarks/sharding_choices.py --config tiny --layouts sorted
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from tabulate import tabulate

CHOICES = {
    "untold": ["--sharding", "untold"],
    "auto": ["--sharding", "auto"],
    "table_wise": ["--sharding", "table_wise"],
    "row_wise": ["--sharding", "row_wise"],
    "column_wise": ["--sharding", "column_wise"],
    "rebalanced": ["--rebalance"],
}

SHORT = {"table_wise": "TW", "row_wise": "RW", "column_wise": "CW", "table_row_wise": "TWRW", "data_parallel": "DP"}


def config_with_layout(source: str, layout: str, folder: Path) -> Path:
    text = Path(source).read_text()
    text = re.sub(r"^id_layout = .*\n", "", text, flags=re.M)
    text = text.replace("[data]\n", f'[data]\nid_layout = "{layout}"\n', 1)
    path = folder / f"{Path(source).stem}.toml"
    path.write_text(text)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="small")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--layouts", default="hashed,sorted")
    p.add_argument("--steps", type=int, default=6)
    args = p.parse_args()
    from gembench.models.config import load_config

    source = load_config(args.config).source
    rows = []
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for layout in args.layouts.split(","):
            folder = Path(tmp) / layout
            folder.mkdir()
            cfg = config_with_layout(source, layout, folder)
            for choice, flags in CHOICES.items():
                out = folder / f"{choice}.json"
                cmd = [
                    sys.executable,
                    "-m",
                    "gembench",
                    "run",
                    "--config",
                    str(cfg),
                    "--nproc",
                    str(args.nproc),
                    "--steps",
                    str(args.steps),
                    "--warmup",
                    "2",
                    *flags,
                    "--out",
                    str(out),
                    "--quiet",
                ]
                print(f"{layout} {choice} ...", file=sys.stderr, flush=True)
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0:
                    rows.append([layout, choice, "failed: " + (proc.stderr.strip().splitlines() or [""])[-1][:80]])
                    continue
                r = json.loads(out.read_text())
                imb = r["imbalance"]
                read = imb["measured"]["metrics"]["bytes_read"]
                kinds: dict[str, int] = {}
                for t in r["plan"].values():
                    kinds[t["sharding"]] = kinds.get(t["sharding"], 0) + 1
                rows.append(
                    [
                        layout,
                        choice,
                        " ".join(f"{SHORT.get(k, k)} {n}" for k, n in sorted(kinds.items())),
                        f"{read['max_mean']:.3f}",
                        f"{100 * imb['stall_cost']:.1f}%",
                        f"{100 * imb['hot_1pct_share']:.1f}%",
                        f"{100 * r['comm']['exposed_comm_fraction']:.1f}%",
                        f"{1e3 * r['summary']['step_time_s']['p50']:.1f}",
                    ]
                )
    print(
        f"{args.config} on {args.nproc} gloo ranks, {args.steps} timed steps each; load average at the start "
        f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}"
    )
    print(
        tabulate(
            rows,
            headers=[
                "IDs",
                "sharding",
                "plan",
                "lookup bytes max/mean",
                "stall cost",
                "hottest 1% rows' lookups",
                "exposed comm",
                "step ms",
            ],
            disable_numparse=True,
        )
    )


if __name__ == "__main__":
    main()
