"""Train a configuration for a few steps and report MFU per training stage.

Each step is cut into stages (data, sparse_forward, dense_forward, loss, backward, optimizer),
each timed on a synchronised device; warm-up steps are discarded and every timed step is kept
in the JSON result, with the environment fingerprint (packages, device, commit, config hash,
seed, and the peak the MFU is measured against).

examples:
  gembench run                                  # small, fp32, ~1 minute on 2 cores
  gembench run --config tiny --steps 5 --out r.json
  gembench run --config small --dtype bf16
  gembench run --config my_model.toml           # any config file of your own
  gembench run --device cuda --peak-tflops 989  # override the datasheet peak
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

DEFAULT_OUT_DIR = Path("results/runs")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="small",
                   help="config name (tiny, small, medium, large, xl, dlrm, dcnv2) or path to a .toml "
                        "file (default: small)")
    p.add_argument("--steps", type=int, default=20, help="timed steps (default: 20)")
    p.add_argument("--warmup", type=int, default=3, help="discarded warm-up steps (default: 3)")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                   help="compute precision of the dense arch: bf16 autocasts it (default: fp32)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda[:N] (default: auto)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and synthetic data (default: 0)")
    p.add_argument("--out", type=Path, default=None,
                   help=f"result JSON path; never overwritten (default: {DEFAULT_OUT_DIR}/<run id>.json)")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="peak TFLOP/s per device to measure MFU against (default: datasheet on GPU, "
                        "measured bf16 GEMM on CPU)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


class Progress:
    """A one-line progress meter on stderr, for runs long enough to need one."""

    def __init__(self, enabled: bool, label: str):
        self.enabled, self.label = enabled, label
        self.started = time.perf_counter()
        self.last = 0.0

    def __call__(self, done: int, total: int, step_s: float) -> None:
        now = time.perf_counter()
        if not self.enabled or (now - self.last < 1.0 and done < total):
            return
        self.last = now
        eta = (now - self.started) / done * (total - done)
        end = "\n" if done == total else "\r"
        print(f"{self.label}: step {done}/{total}, last {step_s * 1e3:.0f} ms, ~{eta:.0f} s left",
              end=end, file=sys.stderr, flush=True)


def main(args: argparse.Namespace) -> int:
    from gembench.harness.results import check_writable, write_result
    from gembench.harness.runner import run_benchmark
    from gembench.harness.report import run_report
    from gembench.harness.stack import StackOptions

    if args.out is not None:
        check_writable(args.out)  # fail before minutes of work, not after
    options = StackOptions(bf16=args.dtype == "bf16")
    result = run_benchmark(
        args.config, steps=args.steps, warmup=args.warmup, options=options, device=args.device,
        seed=args.seed, peak_tflops=args.peak_tflops,
        progress=Progress(not args.quiet, f"gembench run {args.config}"),
    )
    out = args.out or DEFAULT_OUT_DIR / f"{result['id']}.json"
    write_result(out, result)
    print(run_report(result))
    print(f"\nresult: {out}")
    return 0
