"""Show, re-measure or forget the CPU GEMM peaks that MFU is measured against, and the memory
bandwidth (a STREAM triad, GB/s) that the op table's roofline holds ops against.

A CPU peak is the best figure of large square GEMMs, per CPU model, dtype, thread count and
torch version, cached in $GEMBENCH_CACHE (default ~/.cache/gembench); MFU's reference is the
faster dtype's (bf16 where the CPU has a bf16 path, else fp32). Noise only lowers a measured
figure, and a low peak inflates MFU, so each entry keeps the best of its measurements and a
measurement taken while other processes kept the cores busy is never cached on its own (runs use
it as a provisional peak and say so). The table shows every measurement: when, GEMM size, rounds,
load average, cores other processes kept busy, quiet or busy.

--recalibrate measures again, several rounds, best of: for the thread counts runs use, one thread
(what each rank of `gembench run --nproc N` gets on an N-core host) and all cores (one process),
plus any other thread count already cached. Quiet figures are cached; busy ones are not, except
that a figure beating a settled entry raises it. GPUs use datasheet peaks and are not calibrated
(docs/measuring.md).

examples:
  gembench peak                            # cached peaks: figure, when and how measured
  gembench peak --recalibrate              # measure 1 thread and all threads, 5 rounds each
  gembench peak --recalibrate --threads 2 --rounds 3 --dtype fp32
  gembench peak --clear                    # forget every cached peak
  gembench peak --json                     # the same, for machines
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from tabulate import tabulate

from gembench.errors import UsageError
from gembench.harness.device import calibration


def configure(p: argparse.ArgumentParser) -> None:
    action = p.add_mutually_exclusive_group()
    action.add_argument(
        "--recalibrate", action="store_true", help="measure again (several rounds, best of) and cache quiet figures"
    )
    action.add_argument("--clear", action="store_true", help="forget every cached CPU peak")
    p.add_argument(
        "--threads",
        default=None,
        metavar="N[,N...]",
        help="with --recalibrate: thread counts (default: 1, all cores, and those cached)",
    )
    p.add_argument(
        "--dtype",
        choices=(*calibration.DTYPES, calibration.TRIAD),
        default=None,
        help="with --recalibrate: a GEMM dtype, or triad (the memory bandwidth of the op table's roofline) "
        "(default: all three; the faster GEMM is MFU's reference peak)",
    )
    p.add_argument(
        "--rounds", type=int, default=5, help="with --recalibrate: rounds over the GEMM sizes, best of (default: 5)"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def thread_counts(spec: str | None, dtype: str) -> list[int]:
    cores = os.cpu_count() or 1
    if spec is None:
        cached = {
            e.threads
            for _, e in calibration.all_entries()
            if e.dtype == dtype and e.cpu == calibration.cpu_model() and 0 < e.threads <= cores
        }
        return sorted({1, cores} | cached)
    try:
        counts = sorted({int(x) for x in spec.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"--threads takes thread counts like 1,2 — got {spec!r}") from None
    if not counts or counts[0] < 1:
        raise UsageError(f"--threads must be positive thread counts, got {spec!r}")
    return counts


def rows(entries) -> list[list]:
    out = []
    for _path, e in entries:
        best = e.best
        for m in sorted(e.history, key=lambda m: m.measured_at):
            load = "unknown" if m.quiet is None else (f"{m.loadavg[0]:.2f} / {m.others_busy:.2f} of {m.cores}")
            out.append(
                [
                    e.cpu,
                    e.dtype,
                    e.threads,
                    e.torch,
                    (f"{1e3 * m.tflops:.4g} GB/s" if e.dtype == calibration.TRIAD else f"{m.tflops:.4g}")
                    + (" *" if m is best else ""),
                    m.measured_at.replace("+00:00", "Z"),
                    m.size or "?",
                    m.rounds,
                    load,
                    {None: "legacy", True: "quiet", False: "busy"}[m.quiet],
                    m.how,
                ]
            )
    return out


def show(entries, as_json: bool) -> str:
    if as_json:
        return json.dumps(
            [
                {
                    "path": str(p),
                    "cpu": e.cpu,
                    "dtype": e.dtype,
                    "threads": e.threads,
                    "torch": e.torch,
                    "best_tflops": e.best.tflops,
                    "settled": e.settled,
                    "history": [vars(m) for m in e.history],
                }
                for p, e in entries
            ],
            indent=1,
        )
    if not entries:
        return f"no cached CPU peaks in {calibration.cache_dir()} (a run or --recalibrate measures them)"
    table = tabulate(
        rows(entries),
        headers=[
            "cpu",
            "dtype",
            "threads",
            "torch",
            "TFLOP/s",
            "measured (UTC)",
            "GEMM n",
            "rounds",
            "load 1m / others busy",
            "",
            "why",
        ],
        colalign=("left", "left", "right", "left", "right", "left", "right", "right", "right", "left", "left"),
    )
    unsettled = sum(not e.settled for _, e in entries)
    return (
        f"{table}\n* the figure served (best of the entry). cache: {calibration.cache_dir()}\n"
        f"busy: other processes kept more than {calibration.BUSY_SHARE} x (cores the GEMM leaves free, "
        f"at least 1) busy; busy and legacy figures alone are not trusted"
        + (
            f"\n{unsettled} entr{'y' if unsettled == 1 else 'ies'} not settled by a quiet "
            f"measurement: runs measure again"
            if unsettled
            else ""
        )
    )


def main(args: argparse.Namespace) -> int:
    if args.clear:
        removed = calibration.clear()
        print(f"forgot {len(removed)} cached CPU peak file(s) in {calibration.cache_dir()}")
        return 0
    if args.recalibrate:
        if args.rounds < 1:
            raise UsageError(f"--rounds must be at least 1, got {args.rounds}")
        for dtype, t in (
            (d, t)
            for d in ([args.dtype] if args.dtype else (*calibration.DTYPES, calibration.TRIAD))
            for t in thread_counts(args.threads, d)
        ):
            print(f"gembench peak: {dtype} on {t} thread(s), {args.rounds} round(s)...", file=sys.stderr, flush=True)
            m, entry, stored = calibration.recalibrate(dtype, t, args.rounds)
            verdict = (
                "cached"
                if stored
                else f"NOT cached: busy (others kept {m.others_busy:.2f} cores busy > "
                f"{calibration.busy_limit(t, m.cores):.2f}); run again on a quiet machine"
            )
            served = f"; runs use {entry.best.tflops:.4g}" if entry.settled else ""
            print(
                f"{dtype} {t} thread(s): {m.tflops:.4g} TFLOP/s (GEMM {m.size}^3), {verdict}{served}",
                file=sys.stderr,
                flush=True,
            )
    print(show(calibration.all_entries(), args.json))
    return 0
