"""gembench's `dlrm` config beside TorchRec's DLRM example at the same shapes, interleaved in one process.

Both built with the same stack (optimized, compile off by default), their steps alternated round by
round on one machine, so drift hits both; prints p50 step and stage times of each (docs/workload.md).

  python benchmarks/zoo_vs_torchrec_dlrm.py --rounds 6
"""

import argparse
from pathlib import Path

import numpy as np
import torch

from gembench.harness.train.measure import run_steps
from gembench.harness.train.stack import STACKS, build_train_state, with_switches
from gembench.harness.train.workloads import workload_of

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "torchrec_dlrm.py"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--set", dest="switches", action="append", default=["compile=off"])
    args = p.parse_args()
    opts = with_switches(STACKS["optimized"], args.switches)
    dev = torch.device("cpu")
    z = workload_of("dlrm").on_device(dev.type).for_stack(opts)
    zoo = build_train_state(z, opts, dev)
    zb = [z.batch(i) for i in range(4)]
    w = workload_of(model=f"{EXAMPLE}:dlrm")
    wl = build_train_state(w, opts, dev)
    wb = [w.batch(i) for i in range(4)]
    run_steps(zoo, zb, 0, 2)  # warm-up of each
    run_steps(wl, wb, 0, 2)
    t = {"zoo": [], "wl": []}
    stages = {"zoo": {}, "wl": {}}
    for r in range(args.rounds):
        for name in ("zoo", "wl") if r % 2 == 0 else ("wl", "zoo"):
            s = run_steps(zoo if name == "zoo" else wl, zb if name == "zoo" else wb, 2, 0)
            t[name] += s.step_s
            for k, v in s.stages.items():
                stages[name].setdefault(k, []).extend(v)
    for n in t:
        print(
            n,
            "p50 %.1f ms" % (1e3 * np.median(t[n])),
            {k: round(1e3 * float(np.median(v)), 1) for k, v in stages[n].items()},
        )
    print("ratio wl/zoo p50 %.3f" % (np.median(t["wl"]) / np.median(t["zoo"])))


if __name__ == "__main__":
    main()
