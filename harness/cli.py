"""`gembench` command line: one subcommand per module, loaded only when used.

Each command module exposes ``configure(parser)`` to add its arguments and ``main(args) -> int``
to run. Expected mistakes raise UsageError and end as one line on stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import os
import sys
import threading

from gembench.errors import UsageError

# name -> (module, one-line help). Keep in the order a new user meets them.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("gembench.harness.commands.run", "train a config for a few steps and report MFU per stage"),
    "check-model": (
        "gembench.harness.commands.check_model",
        "check that your own model (--model pkg.mod:factory) runs through gembench: one line per check",
    ),
    "ablate": ("gembench.harness.commands.ablate", "add and remove each optimization of the stack; MFU gain of each"),
    "describe": ("gembench.harness.commands.describe", "parameters, memory and FLOPs of a config, without running it"),
    "compare": ("gembench.harness.commands.compare", "compare runs metric by metric: change, interval, verdict"),
    "gate": ("gembench.harness.commands.gate", "CI gate: thresholds and regressions vs the baseline (exit 0/1/2/3/4)"),
    "continuous": (
        "gembench.harness.commands.continuous",
        "run two commits side by side (ABBA), paired verdict per metric (exit 0/1/2/4)",
    ),
    "bisect": (
        "gembench.harness.commands.bisect",
        "find the commit that made training slower: git bisect run with paired comparisons (exit 0/2/4)",
    ),
    "promote": ("gembench.harness.commands.promote", "make runs the committed baseline for their config and hardware"),
    "peak": ("gembench.harness.commands.peak", "show, re-measure (--recalibrate) or forget (--clear) the CPU peaks"),
    "project": (
        "gembench.harness.commands.project",
        "MFU, imbalance and exposed comm at 8 to 4,096 GPUs: planner + cost model",
    ),
    "report": (
        "gembench.harness.commands.report",
        "one self-contained HTML page: MFU across commits, stages, ranks, comm",
    ),
    "submit": (
        "gembench.harness.commands.submit",
        "run on a Slurm cluster: one sbatch job, torchrun on every node, one merged result",
    ),
}

EPILOG = """\
examples:
  gembench run                          # default config (small), table + JSON under results/runs/
  gembench run --config tiny --steps 5 --out r.json
  gembench run --config small --ab      # optimized vs baseline stack, interleaved: the MFU ratio
  gembench run --config small --nproc 2 # torchrun ranks: sharding, imbalance, communication
  gembench ablate --config small        # what each optimization of the stack buys
  gembench check-model examples/two_tower.py:two_tower   # your own model through gembench (docs/workload.md)
  gembench describe --config xl         # sizes and FLOPs of a config no laptop runs
  gembench compare a.json b.json        # change, interval and verdict per metric
  gembench gate r.json                  # CI: exit 0 pass, 1 regression, 3 not comparable, 4 noisy
  gembench continuous HEAD~1 HEAD       # two commits in alternating processes: catches a 5% slowdown
  gembench bisect v1.2 HEAD             # the first commit between them that got slower, and its subject
  gembench promote r.json               # make a run the baseline of its config and hardware
  gembench peak --recalibrate           # CPU peaks: best of several quiet GEMM rounds
  gembench project --config dcnv2-mlperf --cluster h200   # 8 to 4,096 GPUs: TorchRec's planner + a cost model
  gembench report --out report/         # HTML page of results/runs and the baselines
  gembench submit --nodes 2 --gpus-per-node 8 --wait -- run --config medium   # a Slurm job, 16 ranks
  gembench <command> --help             # every flag of a command
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gembench",
        description="Benchmarks and regression gates for GEM-like recommendation training: "
        "MFU, embedding imbalance and communication overhead, recorded across commits.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        command = importlib.import_module(module)
        p = sub.add_parser(
            name,
            help=help_text,
            description=(command.__doc__ or help_text).strip(),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.configure(p)
        p.set_defaults(_main=command.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    from gembench.harness.train.distributed.library_logs import install_logging

    install_logging(getattr(args, "verbose", False))
    try:
        return int(args._main(args) or 0)
    except UsageError as err:
        print(f"gembench {args.command}: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print(f"gembench {args.command}: interrupted; nothing was written", file=sys.stderr)
        return 130


def entry() -> None:
    """The console script and ``python -m gembench``: ``main()``, then an exit without Python's
    teardown of the interpreter. Freeing torch's and TorchRec's module graph object by object is
    most of a second of CPU per command (docs/ci.md); the process gives nothing back by it. What a
    normal exit does first still happens: the atexit handlers run (logging, multiprocessing,
    torch's compile workers) and stdout and stderr are flushed. Where a thread other than a daemon
    is still alive, Python's own exit joins it instead."""
    try:
        code = main()
    except SystemExit as done:  # argparse's --help and refusals
        if done.code is not None and not isinstance(done.code, int):
            print(done.code, file=sys.stderr)
        code = done.code if isinstance(done.code, int) else int(done.code is not None)
    except BrokenPipeError:  # `gembench ... | head`: the reader has what it wanted; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 1
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that closed the pipe, a stream already closed
            pass
    os._exit(code)
