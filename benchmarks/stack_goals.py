"""The doubling on this machine: optimized vs baseline stack, interleaved, against the goals.

Goals: optimized/baseline MFU >= 2.0 (GEM's doubled efficiency), and on a CPU the
optimized MFU >= 25% of the measured bf16 GEMM peak; on one H200 (medium) >= 25% of 989 TFLOP/s.
Printed, never asserted: a speed goal is a figure to watch, not a test to flake.

  python benchmarks/stack_goals.py                 # small on CPU
  python benchmarks/stack_goals.py --config medium --device cuda
"""

import argparse

from gembench.harness.report.numbers import pct
from gembench.harness.report.tables import loss_line, run_report
from gembench.harness.train.runconfig import RunConfig
from gembench.harness.train.runner import run_ab

RATIO_GOAL = 2.0
MFU_GOAL = 0.25


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="small")
    p.add_argument("--device", default="auto")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps-per-round", type=int, default=2)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args()
    run = RunConfig(
        args.config,
        steps=args.rounds * args.steps_per_round,
        rounds=args.rounds,
        warmup=args.warmup,
        device=args.device,
        ab=True,
    )
    result = run_ab(run)
    print(run_report(result))
    ab, mfu = result["ab"], result["summary"]["mfu"]
    lo, hi = ab["mfu_ratio_ci95"]
    print("\ngoals")
    print(
        f"  optimized/baseline MFU  {ab['mfu_ratio']:.2f}x [{lo:.2f}, {hi:.2f}]  goal >= {RATIO_GOAL}: "
        f"{'met' if lo >= RATIO_GOAL else 'not met' if hi < RATIO_GOAL else 'inconclusive'}"
    )
    print(
        f"  optimized MFU           {pct(mfu)} of {result['peak']['tflops_per_device']:.4g} TFLOP/s "
        f"({result['peak']['source']})  goal >= {pct(MFU_GOAL)}: {'met' if mfu >= MFU_GOAL else 'not met'}"
    )
    print(f"  {loss_line(result)}")


if __name__ == "__main__":
    main()
