"""Single process or torchrun ranks: how `gembench run --nproc N` becomes a distributed job.

Outside torchrun, ``--nproc N`` checks everything a rank would refuse (config, batch split,
sharding, backend, device count, port, output path) so mistakes cost one line and exit 2, then
re-executes the same command line under ``python -m torch.distributed.run`` with N ranks on this
host, a rendezvous on 127.0.0.1 and a free port (or $MASTER_PORT if set). Inside torchrun
(RANK and WORLD_SIZE set, as for a plain multi-node
``torchrun --nnodes 2 --nproc_per_node 8 --rdzv-endpoint host:port -m gembench run ...``)
the process runs as its rank (rank.py).

A failing rank ends the job: torchrun stops the other ranks when one exits non-zero, and a hung
rank is ended by its watchdog after ``--timeout`` seconds (watchdog.py); the exit status is then
non-zero and no result is written.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import TYPE_CHECKING

from gembench.errors import UsageError

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
    check(args)
    from gembench.harness.store.reservation import HELD_ENV, OUTCOME_ENV, Reservation

    if args.out is None:
        return relaunch(args.nproc, rank_argv(args))
    # held for the whole job; rank 0 writes under it (HELD_ENV) and reports a failed write in
    # the outcome file, so the job exits 2 after the table rather than as a failed rank
    import tempfile

    with Reservation.take(args.out) as held, tempfile.NamedTemporaryFile("r", prefix="gembench-outcome-") as outcome:
        extra = {HELD_ENV: str(held.path.resolve()), OUTCOME_ENV: outcome.name}
        code = relaunch(args.nproc, rank_argv(args), extra)
        return 2 if code == 0 and outcome.read().strip() == "write-failed" else code


def rank_argv(args: RunConfig) -> list[str]:
    """The ranks' command line: this run without --nproc (the ranks take the world size from
    torchrun, whose own parser would take --nproc for a prefix of its --nproc-per-node)."""
    from dataclasses import replace

    return ["run", *replace(args, nproc=None).to_argv()]


def check(args: RunConfig) -> None:
    """Refuse, before starting any rank, what every rank would refuse and RunConfig.check (done
    already) cannot see: the batch split, the sharding spec, the backend and devices, --out."""
    import torch

    from gembench.harness.device.hardware import resolve_device
    from gembench.harness.store.results import check_writable
    from gembench.harness.train.distributed.process_group import backend_for

    check_job(args, nnodes=1)
    dev = resolve_device(args.device)
    backend_for(dev)
    if dev.type == "cuda" and torch.cuda.device_count() < args.nproc:
        raise UsageError(
            f"--nproc {args.nproc} needs {args.nproc} GPUs on this host, torch sees {torch.cuda.device_count()}"
        )
    if args.out is not None:
        check_writable(args.out)


def check_job(args: RunConfig, nnodes: int):
    """What the ranks of a job of ``args.nproc`` ranks on ``nnodes`` nodes would refuse, wherever
    they run (no device is looked at): the config, the batch split, the sharding spec, --rebalance,
    HSDP on one node. The config, as the ranks will load it."""
    from gembench.harness.train.distributed.plan import parse_sharding
    from gembench.harness.train.distributed.rank import per_rank_batch
    from gembench.harness.train.parallelize import HSDP_ONE_NODE
    from gembench.models.config import load_config, with_global_batch
    from gembench.models.sparse import pooled_tables
    from gembench.models.zoo import sequence_table_names

    if args.options.dense_parallel == "hsdp" and nnodes < 2:  # --nproc starts every rank on this one host
        raise UsageError(HSDP_ONE_NODE)
    if args.model is not None:
        from gembench.harness.train.distributed.workload_rank import check as check_workload

        check_workload(args, args.nproc)  # the device and --out: check() after this
        return None
    cfg = with_global_batch(load_config(args.config), args.batch, args.nproc)
    per_rank_batch(cfg.data.global_batch, args.nproc)
    tables = [t.name for t in pooled_tables(cfg)]
    sequences = sequence_table_names(cfg)
    forced = parse_sharding(args.sharding, tables + sequences)
    # TorchRec's EmbeddingCollection (sequence tables) shards table-, row- or column-wise only
    odd = sorted(
        t.removeprefix("table_")
        for t in sequences
        if forced.get(t) not in (None, "table_wise", "row_wise", "column_wise")
    )
    if odd:
        raise UsageError(
            f"--sharding: sequence table(s) {', '.join(odd)} can only be table_wise, row_wise "
            f"or column_wise in TorchRec; add e.g. {odd[0]}=row_wise to the spec"
        )
    if args.rebalance:
        from gembench.harness.train.distributed.rebalance import check as check_rebalance

        check_rebalance(args.sharding, forced, tables + sequences, args.nproc, args.pipeline)
    return cfg


def relaunch(nproc: int, argv: list[str], extra_env: dict | None = None) -> int:
    """Run ``gembench <argv>`` as ``nproc`` torchrun ranks on this host; torchrun's exit status."""
    if os.environ.get("MASTER_PORT"):
        port = int(os.environ["MASTER_PORT"])
        if not port_free(port):
            raise UsageError(
                f"port {port} on {HOST} (from $MASTER_PORT) is in use: pick a free one "
                f"or unset MASTER_PORT to let gembench choose"
            )
    else:
        port = free_port()
    env = {**os.environ, **(extra_env or {})}
    # Ranks share the cores: one rank per core slice, not every rank on every core.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc_per_node",
        str(nproc),
        "--master_addr",
        HOST,
        "--master_port",
        str(port),
        "--max_restarts",
        "0",
        "-m",
        "gembench",
        *argv,
    ]
    proc = subprocess.run(cmd, env=env)
    if proc.returncode != 0:
        print(
            f"gembench run: the {nproc}-rank run failed (torchrun exit status {proc.returncode}); "
            "the rank messages above say which rank and stage; no result written",
            file=sys.stderr,
            flush=True,
        )
        return 1
    return 0
