"""Train a configuration for a few steps and report MFU per training stage.

Each step is cut into stages (data, sparse_forward, dense_forward, loss, backward, optimizer),
each timed on a synchronised device; warm-up steps are discarded and every timed step is kept in
the JSON result, with the environment fingerprint (packages, device, commit, config hash, seed and
the peak MFU is measured against). Extra steps after the timed ones count what a step costs
besides time: aten ops, host syncs, host-to-device bytes, kernels, graph breaks and recompiles
(docs/measuring.md). Stacks: `optimized` (default: bf16 where the device multiplies it in
hardware, else fp32; torch.compile, fused embeddings, jagged attention, fused Adam) and
`baseline` (fp32 eager, one EmbeddingBag per table, padded attention), both against the same
reference peak, so their MFU ratio is a throughput ratio.

exit status: 0 measured and written; 1 a rank of an --nproc run failed or hung (named); 2 a usage
error, a run refused before it starts (it would not fit: the largest --batch that does is named),
or a result that could not be written (kept in $TMPDIR); 130 interrupted.

examples:
  gembench run                                  # small, optimized stack
  gembench run --config tiny --steps 5 --out r.json
  gembench run --config small --ab              # optimized/baseline MFU ratio, interleaved
  gembench run --config tiny --trace traces/    # + one profiled step: traces/trace.json, top-10 ops
  gembench run --config small --nproc 2         # 2 torchrun ranks (docs/distributed.md)
  gembench run --nproc 2 --rebalance            # re-plan from the measured load; before/after
  gembench run --model examples/two_tower.py:two_tower --nproc 2   # your own model (docs/workload.md)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gembench.harness.store.results import RUNS_DIR as DEFAULT_OUT_DIR  # one name for the runs folder

if TYPE_CHECKING:
    from gembench.harness.train.runconfig import RunConfig


def add_model_flags(p: argparse.ArgumentParser, config_help: str = "") -> None:
    """--config, or --model with --model-arg: the one way every command names its model."""
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--config",
        default=None,
        help=config_help
        or "config name (tiny, small, medium, large, xl, dlrm, dcnv2) or path to a .toml file (default: small)",
    )
    which.add_argument(
        "--model",
        default=None,
        metavar="SPEC",
        help="your own model instead of a config: pkg.module:factory or path/to/file.py:factory returning a "
        "gembench.workload.Workload (docs/workload.md; check it first with `gembench check-model SPEC`)",
    )
    p.add_argument(
        "--model-arg",
        dest="model_args",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a keyword argument of --model's factory (repeatable; values as Python literals)",
    )


def configure(p: argparse.ArgumentParser) -> None:
    add_model_flags(p)
    p.add_argument("--steps", type=int, default=10, help="timed steps (default: 10)")
    p.add_argument("--warmup", type=int, default=3, help="discarded warm-up steps (default: 3)")
    p.add_argument(
        "--batch",
        type=int,
        default=None,
        metavar="N",
        help="global batch, overriding the config's (recorded in the result and its config "
        "hash; with --nproc split evenly over the ranks)",
    )
    p.add_argument(
        "--stack", choices=("optimized", "baseline"), default="optimized", help="training stack (default: optimized)"
    )
    p.add_argument(
        "--dtype",
        choices=("fp32", "bf16"),
        default=None,
        help="override the stack's precision of the dense arch (optimized: bf16 where the device "
        "multiplies it in hardware, else fp32; baseline: fp32)",
    )
    p.add_argument(
        "--set",
        dest="switches",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="one stack switch, over --stack (repeatable): dense_parallel=ddp|fsdp|hsdp, "
        "activation_checkpointing=none|hstu|all, activation_dtype=compute|fp8 (what the forward saves for "
        "the backward: as computed, or float8 with a scale per row), sparse_parallel=1d|2d (--nproc: tables "
        "sharded over every rank, or within groups of sharding_group=G ranks and replicated across the groups, "
        "the replicas averaged every replica_sync_every=N steps), or an on/off one (compile=off, "
        "fused_optimizer=off, jagged=off, ...); recorded in the result's run.options",
    )
    p.add_argument(
        "--ab",
        action="store_true",
        help="run baseline and optimized interleaved (ABBA rounds) and report their MFU ratio",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=6,
        help="with --ab: rounds; each times --steps/rounds steps of each stack (default: 6)",
    )
    p.add_argument("--device", default="auto", help="auto, cpu or cuda[:N] (default: auto)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and synthetic data (default: 0)")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"result JSON path; never overwritten (default: {DEFAULT_OUT_DIR}/<run id>.json)",
    )
    p.add_argument(
        "--bandwidth-gbs",
        type=float,
        default=None,
        help="memory bandwidth GB/s per device that the op table's roofline holds ops against (default: "
        "datasheet HBM on GPU, a STREAM triad measured and cached on CPU)",
    )
    p.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="peak TFLOP/s per device to measure MFU against (default: datasheet bf16 on GPU, the fastest "
        "measured GEMM on CPU)",
    )
    p.add_argument(
        "--nsys",
        type=Path,
        default=None,
        metavar="OUT",
        help="profile the timed steps with NVIDIA Nsight Systems into OUT.nsys-rep: NVTX "
        "ranges per step, stage and dense block (CUDA only; nsys on PATH)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument(
        "--verbose",
        action="store_true",
        help="show third-party messages kept off the terminal by default (TorchRec planner "
        "and deprecation warnings, torch.profiler's USDT lines of --nproc runs)",
    )
    dist = p.add_argument_group(
        "distributed (torchrun + TorchRec)",
        "--nproc N re-runs this command as N torchrun ranks on this host (gloo on CPU, nccl on CUDA);\n"
        "under your own `torchrun ... -m gembench run` each process runs as its rank. The config's\n"
        "global batch is split evenly: each rank trains global/N examples. Rank 0 writes one result\n"
        "with per-rank stages, embedding imbalance (measured and planned) and communication.",
    )
    dist.add_argument(
        "--nproc", type=int, default=None, metavar="N", help="ranks on this host (default: 1 process, no distribution)"
    )
    dist.add_argument(
        "--sharding",
        default=None,
        metavar="SPEC",
        help="force TorchRec sharding: one of table_wise, row_wise, column_wise, "
        "table_row_wise, data_parallel for every table, or per table, e.g. "
        "t0=row_wise,default=table_wise (default: auto, TorchRec's planner chooses, "
        "told each table's pooling and the workload's row_skew(); untold: the planner as "
        "TorchRec ships it, every table priced as pooling one ID over rows alike)",
    )
    dist.add_argument(
        "--pipeline",
        action="store_true",
        help="TorchRec's TrainPipelineSparseDist: next batch's input dist overlaps this "
        "batch's compute, DDP overlaps gradient sync with backward (default: staged "
        "step, every stage timed on its own, nothing overlapped)",
    )
    dist.add_argument(
        "--rebalance",
        action="store_true",
        help="run on the planner's plan, then re-plan from the lookup load measured on it "
        "(each table's pooling and how its IDs fall over its rows, and the measured "
        "lookup time per byte), re-shard with the trained state carried over, and run "
        "again; the table and JSON show imbalance, per-rank load and step before and "
        "after, and which tables moved (staged step only)",
    )
    dist.add_argument(
        "--trace",
        type=Path,
        default=None,
        metavar="DIR",
        help="keep the torch.profiler trace of the profiled step(s): DIR/trace.json on "
        "one process (and print its top-10 kernels or CPU ops by self time), "
        "DIR/rank<R>.json per rank (open in Perfetto or chrome://tracing)",
    )
    dist.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="a rank that makes no progress for S seconds ends the run, naming the rank and stage (default: 300)",
    )
    paced = p.add_argument_group("taking turns (how `gembench continuous` drives two revisions; one process only)")
    paced.add_argument(
        "--pace",
        default=None,
        metavar="R,W",
        help="file descriptors of two pipes: before every --burst timed steps, write 'r' "
        "to W and wait for 'g' on R; after the last, write 'd'",
    )
    paced.add_argument(
        "--burst", type=int, default=20, metavar="N", help="timed steps per turn with --pace (default: 20)"
    )
    saved = p.add_argument_group("checkpoints (torch.distributed.checkpoint; one process or --nproc ranks)")
    saved.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        metavar="N",
        help="save the whole training state, asynchronously, after every N-th warm-up or timed step "
        "into --checkpoint-dir DIR/step-<N> (on ranks, each writes its own shards); the result records "
        "each save's time, the time the step loop was blocked (each rank's) and the bytes written",
    )
    saved.add_argument(
        "--checkpoint-dir", type=Path, default=None, metavar="DIR", help="where --checkpoint-every saves"
    )
    saved.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="DIR",
        help="go on from a save: a step-<N> folder, or a --checkpoint-dir (its latest complete save); "
        "the steps continue from step N, bit for bit as if the run had never stopped",
    )


NSYS = [
    "nsys",
    "profile",
    "--capture-range=cudaProfilerApi",
    "--capture-range-end=stop",
    "-t",
    "cuda,nvtx,osrt",
    "--force-overwrite=false",
]


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def under_nsys(args) -> int:
    """`gembench run ... --nsys OUT`: this same command under nsys, with NVTX ranges on."""
    import os
    import shutil
    import subprocess
    from dataclasses import replace

    from gembench.errors import UsageError
    from gembench.harness.train.nvtx import ENV

    if args.device == "cpu" or not cuda_available():
        raise UsageError(
            "--nsys profiles CUDA work and this run has no CUDA device; on CPU use --trace DIR "
            "(torch.profiler, Perfetto)"
        )
    if shutil.which("nsys") is None:
        raise UsageError(
            "nsys (NVIDIA Nsight Systems) is not on PATH: install it (https://developer.nvidia.com/"
            "nsight-systems, or the CUDA toolkit's nsight-systems package), or drop --nsys"
        )
    argv = ["run", *replace(args, nsys=None).to_argv()]  # the same run without --nsys
    cmd = [*NSYS, "-o", str(args.nsys), sys.executable, "-m", "gembench", *argv]
    print("gembench run: " + " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.call(cmd, env={**os.environ, ENV: "1"})


def run_config_from(args: argparse.Namespace, **overrides) -> RunConfig:
    """A RunConfig from parsed arguments: `gembench run`'s, or another command's (ablate, submit),
    whose flags of the same name mean the same; ``overrides`` set the rest. Not yet checked."""
    from dataclasses import fields

    from gembench.harness.train.runconfig import DEFAULT_CONFIG, RunConfig

    values = {f.name: getattr(args, f.name) for f in fields(RunConfig) if hasattr(args, f.name)}
    values.update(overrides)
    values["switches"] = tuple(values.get("switches") or ())
    values["model_args"] = tuple(values.get("model_args") or ())
    if values.get("config") is None:  # the parser leaves --config unset: the default, unless --model
        values["config"] = None if values.get("model") else DEFAULT_CONFIG
    return RunConfig(**values)


def main(args: argparse.Namespace) -> int:
    import os

    run = run_config_from(args)
    distributed = run.nproc is not None or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)
    run.check(distributed)  # fail before minutes of work, not after: every path it will write too
    if run.nsys is not None:
        return under_nsys(run)
    if distributed:
        from gembench.harness.train.distributed.launch import main as distributed_main  # torchrun ranks

        return distributed_main(run)
    from gembench.harness.store.reservation import Reservation
    from gembench.harness.store.results import check_writable

    # a concurrent run with the same --out stops here
    reservation = Reservation.take(run.out) if run.out is not None else None
    if run.out is None:  # the default name is the run's unique id: only the folder can fail
        check_writable(DEFAULT_OUT_DIR / "any.json", overwrite=True)
    try:
        code = _run(run)
    finally:
        if reservation is not None:
            reservation.release()
    if run.pace is not None:
        # A paced worker (`gembench continuous`) is done once its result is written: the teardown
        # of an interpreter holding torch and a compiled model takes seconds more, paid twice per
        # pair on one CPU (measured in docs/continuous.md).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def first_step_key(run) -> str:
    """What the first step's time depends on: the config and its batch, the stack, torch, the CPU."""
    import torch

    from gembench.harness.device.calibration import cpu_model

    what = f"{run.model or run.config}|{run.model_args}|{run.batch}|{run.options.describe()}|{run.device}"
    return f"{what}|torch {torch.__version__}|{cpu_model()}"


def _run(run) -> int:
    from gembench.errors import UsageError
    from gembench.harness.metrics.startup import Startup
    from gembench.harness.report.tables import run_report
    from gembench.harness.store.reservation import write_or_fallback
    from gembench.harness.train.progress import Progress, first_step_seconds, remember_first_step
    from gembench.harness.train.runner import run_ab, run_benchmark

    progress = Progress(not run.quiet, f"gembench run {run.model or run.config}")
    first_step = first_step_key(run)
    expected = first_step_seconds(first_step)

    def compile_notice(compiles: bool) -> None:  # once the run is validated and fits: never before a refusal
        if not run.quiet and compiles:
            how_long = (
                f"~{expected:.0f} s, as the last time on this machine"
                if expected
                else "1-2 minutes on 2 cores the first time on a machine, seconds once torch's cache has it"
            )
            print(
                f"gembench run: the first warm-up step compiles the dense part with torch.compile ({how_long})",
                file=sys.stderr,
                flush=True,
            )
            if not run.ab:  # --ab warms both stacks up before its first timed round
                progress.during_first_step("compiling the dense part (first warm-up step)", expected)

    pace = None
    if run.pace is not None:
        from gembench.harness.continuous.interleave import Pacer

        try:
            pace = Pacer(run.pace, run.burst)
        except (ValueError, OSError) as err:
            raise UsageError(f"--pace {run.pace}: {err}") from None
    if run.ab:
        result = run_ab(run, progress=progress, on_prepared=compile_notice)
    else:
        startup = Startup(from_process_start=True)  # this process is the run: its imports count
        result = run_benchmark(run, progress=progress, on_prepared=compile_notice, pace=pace, startup=startup)
    if progress.first_step_s is not None and not run.ab:
        remember_first_step(first_step, progress.first_step_s)
    out = run.out or DEFAULT_OUT_DIR / f"{result['id']}.json"
    print(run_report(result), flush=True)  # the figures reach the user even if the write fails
    write_or_fallback(out, result)
    print(f"\nresult: {out}")
    return 0
