"""What the stage timing costs: the same steps with stage clocks and without, interleaved.

Each round runs `--steps` steps untimed (one clock read per step) and `--steps` with every stage
boundary marked, in alternating order, on the same model and batches. The overhead is the
median over rounds of (timed / untimed - 1). Goal: under 2% on `small`.

  python benchmarks/stage_timing_overhead.py                  # small, optimized stack
  python benchmarks/stage_timing_overhead.py --config tiny --stack baseline
"""

import argparse
import time

import numpy as np
import torch

from gembench.harness.train.stack import STACKS, build_train_state
from gembench.harness.train.step import run_steps
from gembench.models.config import load_config
from gembench.models.data import SyntheticData


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="small")
    p.add_argument("--stack", default="optimized", choices=sorted(STACKS))
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    cfg, device = load_config(args.config), torch.device(args.device)
    state = build_train_state(cfg, STACKS[args.stack], device)
    data = SyntheticData(cfg, seed=0)
    batches = [data.batch(i) for i in range(args.steps)]
    run_steps(state, batches, 0, warmup=3)  # compile and warm caches outside the measurement
    ratios, totals = [], {True: 0.0, False: 0.0}
    for r in range(args.rounds):
        spent = {}
        for timed in (True, False) if r % 2 else (False, True):
            start = time.perf_counter()
            run_steps(state, batches, args.steps, 0, timed=timed)
            spent[timed] = time.perf_counter() - start
            totals[timed] += spent[timed]
        ratios.append(spent[True] / spent[False] - 1)
    print(f"{args.config} ({args.stack}): {args.rounds} rounds x {args.steps} steps each way")
    print(
        f"untimed {1e3 * totals[False] / (args.rounds * args.steps):.1f} ms/step, "
        f"timed {1e3 * totals[True] / (args.rounds * args.steps):.1f} ms/step"
    )
    print(
        f"stage-timing overhead: median {100 * np.median(ratios):+.2f}% "
        f"(rounds: {', '.join(f'{100 * x:+.1f}%' for x in ratios)}); goal < 2%"
    )


if __name__ == "__main__":
    main()
