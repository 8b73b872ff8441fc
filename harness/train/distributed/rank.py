"""One rank of a distributed `gembench run`: its life from the process group to teardown.

The rank joins the process group, starts its watchdog, measures its host's peak once per host,
runs its job (job.py: build, measure, and on rank 0 the result) and writes the result on rank 0;
every failure names its rank and stage, and no rank tears the group down under a live peer.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from gembench.errors import UsageError
from gembench.harness.device.hardware import cpu_peak, reference_bandwidth, reference_peak, resolve_device
from gembench.harness.metrics.startup import Startup
from gembench.harness.train.distributed import library_logs, process_group, watchdog
from gembench.harness.train.distributed.job import RankJob
from gembench.harness.train.measure import World
from gembench.harness.train.runconfig import RunConfig


def main(args: RunConfig, env: dict) -> int:
    """Run this rank; rank 0 writes the result. Exit status: 0, 2 (usage), 1 (failure)."""
    from gembench.harness.store.reservation import HELD_ENV, OUTCOME_ENV, Reservation, write_or_fallback
    from gembench.harness.store.results import RUNS_DIR

    rank = env["rank"]
    startup = Startup(from_process_start=True)
    dog = reservation = None
    finished = False  # every rank got through its job: they can part together
    try:
        held = os.environ.get(HELD_ENV)
        if rank == 0 and args.out is not None and held != str(Path(args.out).resolve()):
            reservation = Reservation.take(args.out)  # plain torchrun: rank 0 holds --out itself
        fault = watchdog.Fault.from_env()
        with startup.phase("process_group"):
            dev = process_group.rank_device(str(resolve_device(args.device)), env["local_rank"])
            process_group.init_process_group(dev, args.timeout)
            store = getattr(dist.distributed_c10d, "_get_default_store", lambda: None)()
            dog = watchdog.Watchdog(rank, env["world_size"], args.timeout, store)
        world = World(rank, env["world_size"], env["local_rank"], env["local_world_size"], dog)
        with startup.phase("peak"):
            rank_peaks = peaks(dev, args, world)
        result = RankJob(args, world, dev, fault, rank_peaks, startup).run()
        if rank == 0:
            from gembench.harness.report.rank_tables import distributed_report

            out = args.out or RUNS_DIR / f"{result['id']}.json"
            print(distributed_report(result), flush=True)  # the figures first: the write may fail
            try:
                write_or_fallback(out, result)
            except UsageError as err:
                print(f"gembench run: error: {err}", file=sys.stderr, flush=True)
                finished = True
                if os.environ.get(OUTCOME_ENV):  # our launcher turns this into exit 2
                    Path(os.environ[OUTCOME_ENV]).write_text("write-failed\n")
                    return 0
                return 2
            print(f"\nresult: {out}", flush=True)
            if library_logs.hidden_note(rank):
                print(library_logs.hidden_note(rank), file=sys.stderr, flush=True)
        finished = True
        return 0
    except UsageError as err:
        print(f"gembench run: error: rank {rank}: {err}", file=sys.stderr, flush=True)
        return 2
    except BaseException as err:  # noqa: BLE001  every failure names its rank and stage
        watchdog.report_failure(rank, dog, err)
        return 1
    finally:
        if reservation is not None:
            reservation.release()
        if dog is not None:
            dog.stop()
        if dist.is_initialized():
            if finished:  # the other ranks wait for rank 0's writing: no rank tears gloo down under a live peer
                try:
                    dist.barrier()
                except Exception:  # noqa: BLE001  a peer already gone: parting is all that is left
                    pass
            dist.destroy_process_group()


def peaks(dev: torch.device, args: RunConfig, world: World):
    """(this rank's peak, this host's peak at local ranks x threads or None, its memory bandwidth).

    Measured once per host by its local rank 0 and shared: ranks that measured their GEMM peak
    all at once each saw a share of the cores and disagreed by 3x (and would share the memory
    bus), and a provisional (busy) figure is not cached, so the others could not read it back.
    """
    world.at("peak")
    if dev.type != "cpu":
        return reference_peak(dev, args.peak_tflops), None, reference_bandwidth(dev, args.bandwidth_gbs)
    mine = None
    if world.local_rank == 0:
        threads = torch.get_num_threads()
        host_threads = min(world.local_size * threads, os.cpu_count() or 1)
        peak = reference_peak(dev, args.peak_tflops)
        host = cpu_peak(threads=host_threads) if args.peak_tflops is None else None
        mine = (socket.gethostname(), peak, host, reference_bandwidth(dev, args.bandwidth_gbs))
    shared = [None] * world.size
    dist.all_gather_object(shared, mine)
    host = socket.gethostname()
    return next((p, h, b) for name, p, h, b in filter(None, shared) if name == host)
