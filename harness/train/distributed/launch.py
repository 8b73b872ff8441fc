"""Single process or torchrun ranks: how `gembench run --nproc N` becomes a distributed job.

Outside torchrun, ``--nproc N`` checks everything a rank would refuse (config, batch split,
sharding, backend, device count, port, output path) so mistakes cost one line and exit 2, then
runs torch's elastic agent (torchrun's, with torchrun's own arguments) in this process over N
ranks on this host, a rendezvous on 127.0.0.1 and a free port (or $MASTER_PORT if set). The
ranks are forked from this process, which has imported the stack already, kept torch on one
thread (a forked OpenMP pool hangs) and left CUDA uninitialized; else spawned. Inside torchrun
(RANK and WORLD_SIZE set, as for a plain multi-node
``torchrun --nnodes 2 --nproc_per_node 8 --rdzv-endpoint host:port -m gembench run ...``)
the process runs as its rank (rank.py).

A failing rank ends the job: the agent stops the other ranks when one exits non-zero, and a hung
rank is ended by its watchdog after ``--timeout`` seconds (watchdog.py); the exit status is then
non-zero and no result is written.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from typing import TYPE_CHECKING, Callable

from gembench.errors import UsageError
from gembench.harness.metrics.startup import LAUNCHED_AT_ENV, process_started

if TYPE_CHECKING:
    from gembench.harness.train.runconfig import RunConfig

HOST = "127.0.0.1"


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_free(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def main(args: RunConfig) -> int:
    from gembench.harness.train.distributed import library_logs

    library_logs.install(args.verbose)  # before TorchRec's import, which may warn
    from gembench.harness.train.distributed.process_group import torchrun_env

    env = torchrun_env()
    if env is not None:
        if args.nproc is not None and args.nproc != env["world_size"]:
            raise UsageError(
                f"--nproc {args.nproc} but torchrun started {env['world_size']} ranks "
                f"(WORLD_SIZE): drop --nproc under torchrun, or make them agree"
            )
        from gembench.harness.train.distributed.rank import main as rank_main

        return rank_main(args, env)
    import torch

    torch.set_num_threads(1)  # before any op: the ranks are forked from this process
    check(args)
    from gembench.harness.store.reservation import HELD_ENV, OUTCOME_ENV, Reservation

    if args.out is None:
        return relaunch(args.nproc, main, args)
    # held for the whole job; rank 0 writes under it (HELD_ENV) and reports a failed write in
    # the outcome file, so the job exits 2 after the table rather than as a failed rank
    import tempfile

    with Reservation.take(args.out) as held, tempfile.NamedTemporaryFile("r", prefix="gembench-outcome-") as outcome:
        extra = {HELD_ENV: str(held.path.resolve()), OUTCOME_ENV: outcome.name}
        code = relaunch(args.nproc, main, args, extra_env=extra)
        return 2 if code == 0 and outcome.read().strip() == "write-failed" else code


def check(args: RunConfig) -> None:
    """Refuse, before starting any rank, what every rank would refuse and RunConfig.check (done
    already) cannot see: the batch split, the sharding spec, the backend and devices, --out."""
    import torch

    from gembench.harness.device.hardware import resolve_device
    from gembench.harness.store.results import check_writable
    from gembench.harness.train.distributed.process_group import backend_for

    workload = check_job(args, nnodes=1)
    dev = resolve_device(args.device)
    check_saves(args, workload, dev)
    backend_for(dev)
    if dev.type == "cuda" and torch.cuda.device_count() < args.nproc:
        raise UsageError(
            f"--nproc {args.nproc} needs {args.nproc} GPUs on this host, torch sees {torch.cuda.device_count()}"
        )
    if args.out is not None:
        check_writable(args.out)


def check_saves(args: RunConfig, workload, dev) -> None:
    """--checkpoint-every and --resume as every rank will check them (the save to resume from
    matches the job, no save to overwrite), once, before any rank starts."""
    from gembench.harness.train import checkpoint

    if not checkpoint.wanted(args):
        return
    import torch

    from gembench.harness.train.distributed.job import rank_saves
    from gembench.harness.train.stack import on_ranks
    from gembench.harness.train.workloads import identity

    variant = workload.on_device(dev.type).for_stack(on_ranks(args.options, args.pipeline))
    rank_saves(args, identity(variant, args.seed, variant.build(torch.device("meta"))), args.nproc)


def check_job(args: RunConfig, nnodes: int):
    """What the ranks of a job of ``args.nproc`` ranks on ``nnodes`` nodes would refuse, wherever
    they run (no device is looked at): the model, the batch split, the sharding spec, --rebalance,
    the pipeline's fields, HSDP on one node. The workload, as the ranks will load it."""
    from gembench.harness.train.distributed.checks import check as check_ranks
    from gembench.harness.train.parallelize import HSDP_ONE_NODE

    if args.options.dense_parallel == "hsdp" and nnodes < 2:  # --nproc starts every rank on this one host
        raise UsageError(HSDP_ONE_NODE)
    return check_ranks(args, args.nproc)


def relaunch(nproc: int, entry: Callable[..., int], *entry_args, extra_env: dict | None = None) -> int:
    """Run ``entry(*entry_args)`` as ``nproc`` ranks on this host (it returns the rank's exit
    status) under torch's elastic agent in this process; 0 when every rank exited 0, else 1.

    The ranks are forked when this process runs torch on one thread (callers set that before
    their first op: a fork of a live OpenMP pool hangs) and nothing has touched CUDA, else
    spawned."""
    import torch
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, get_args_parser

    if os.environ.get("MASTER_PORT"):
        port = int(os.environ["MASTER_PORT"])
        if not port_free(port):
            raise UsageError(
                f"port {port} on {HOST} (from $MASTER_PORT) is in use: pick a free one "
                f"or unset MASTER_PORT to let gembench choose"
            )
    else:
        port = free_port()
    fork = torch.get_num_threads() == 1 and not torch.cuda.is_initialized()
    # torchrun's own parser and config: what `torchrun --nproc-per-node N -m gembench` would run
    torchrun = get_args_parser().parse_args(
        [
            *("--nnodes", "1", "--nproc-per-node", str(nproc), "--max-restarts", "0"),
            *("--master-addr", HOST, "--master-port", str(port)),
            *("--start-method", "fork" if fork else "spawn", "gembench"),
        ]
    )
    saved = dict(os.environ)
    # Ranks share the cores: one rank per core slice, not every rank on every core.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    os.environ.update(extra_env or {})
    started = process_started()  # each rank's start-up names the launch from here
    os.environ[LAUNCHED_AT_ENV] = str(started if started is not None else time.time())
    try:
        config, _, _ = config_from_args(torchrun)
        sys.stdout.flush()
        sys.stderr.flush()
        elastic_launch(config, entrypoint=as_rank)(entry, *entry_args)
    except ChildFailedError as err:
        print(
            f"gembench: the {nproc}-rank job failed ({_failures(err)}); "
            "the rank messages above say which rank and stage; no result written",
            file=sys.stderr,
            flush=True,
        )
        return 1
    except SignalException as err:
        if err.sigval == signal.SIGINT:
            raise KeyboardInterrupt from None
        raise
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return 0


def as_rank(entry: Callable[..., int], *entry_args) -> None:
    """One rank, as a process of its own would start: the torch threads its environment asks for,
    Ctrl-C as KeyboardInterrupt and SIGTERM's default end (a fork inherits the agent's handlers)."""
    import torch

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    code = entry(*entry_args)
    if code:
        sys.exit(code)


def _failures(err) -> str:
    """'rank 1 exit status 2' for each failed rank of the agent's error."""
    return ", ".join(f"rank {r} exit status {f.exitcode}" for r, f in sorted(err.failures.items()))
