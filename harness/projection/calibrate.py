"""This host's links, measured: latency and bus bandwidth of each collective, as a cluster file.

`gembench project --calibrate --out here.toml` starts N torchrun ranks (gloo on CPU, nccl on
CUDA) running this module. Each collective family is timed over message sizes from 4 KiB to
16 MiB (nccl-tests' sizes: an all-to-all's send buffer, the full buffer of the others; the
median of ITERS calls after a barrier, slowest rank); then alpha-beta is fitted by least squares:
time = latency + size x bus_factor / bandwidth, in relative error. The file has one [collectives.<family>] link per
family; [inter] is copied from [intra] (one host measures no link across nodes) and says so.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from gembench.errors import UsageError
from gembench.harness.metrics.comm import bus_factor
from gembench.harness.projection.cluster import FAMILIES, Cluster, Link, to_toml

SIZES = [2**k for k in range(12, 25, 2)]  # 4 KiB .. 16 MiB
ITERS = 15


def fit(sizes, seconds, family: str, n: int) -> Link:
    """Least squares of t = a + b x bus bytes, in relative error (weights 1/t), so that the small
    sizes that decide the latency weigh as much as the large ones; a negative latency is 0."""
    x = np.array(sizes, dtype=float) * bus_factor(family, n)
    y = np.array(seconds, dtype=float)
    slope, intercept = np.polyfit(x, y, 1, w=1.0 / y)
    slope = max(slope, 1e-15)
    return Link(max(float(intercept), 0.0), float(1.0 / slope))


def _measure(rank: int, world: int, device) -> dict[str, list[float]]:
    import torch
    import torch.distributed as dist

    out = {}
    for family in FAMILIES:
        times = []
        for size in SIZES:
            n = max(size // 4, world) // world * world  # fp32 elements, a multiple of the world
            full = torch.ones(n, device=device)
            part = torch.empty(n // world, device=device)
            recv = torch.empty(n, device=device)

            def call():
                if family == "all_to_all":
                    dist.all_to_all_single(recv, full)
                elif family == "all_reduce":
                    dist.all_reduce(full)
                elif family == "reduce_scatter":
                    dist.reduce_scatter_tensor(part, full)
                else:
                    dist.all_gather_into_tensor(recv, part)

            samples = []
            for i in range(ITERS + 2):
                dist.barrier()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                call()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                if i >= 2:
                    samples.append(time.perf_counter() - start)
            t = torch.tensor([float(np.median(samples))])
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            times.append(float(t))
        out[family] = times
    return out


def worker(out_path: str) -> None:
    """One rank (under torchrun): measure, and rank 0 writes the figures as JSON."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    times = _measure(rank, world, device)
    if rank == 0:
        Path(out_path).write_text(
            json.dumps(
                {"world": world, "backend": dist.get_backend(), "sizes": SIZES, "seconds": times, "device": str(device)}
            )
        )
    dist.destroy_process_group()


def calibrate_command(args) -> int:
    from gembench.harness.store.results import atomic_write, check_writable

    if not args.out:
        raise UsageError("--calibrate writes a cluster file: pass --out FILE.toml")
    if not args.out.endswith(".toml"):
        raise UsageError(f"--calibrate writes TOML: name the file FILE.toml, not {args.out!r}")
    out = check_writable(args.out)
    if args.nproc < 2:
        raise UsageError("--calibrate needs --nproc 2 or more: a collective of one rank moves nothing")
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "links.json"
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(args.nproc),
            "-m",
            "gembench.harness.projection.calibrate",
            str(raw),
        ]
        if not args.quiet:
            print(
                f"gembench project --calibrate: {len(FAMILIES)} collectives x {len(SIZES)} sizes on "
                f"{args.nproc} ranks ...",
                file=sys.stderr,
                flush=True,
            )
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if proc.returncode != 0 or not raw.exists():
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise UsageError(f"--calibrate: the ranks failed ({tail})")
        data = json.loads(raw.read_text())
    cluster = cluster_from(data)
    rows = [
        f"{f}: latency {cluster.collectives[f].latency_s * 1e6:,.0f} us, bus bandwidth "
        f"{cluster.collectives[f].bandwidth_Bps / 1e9:.3f} GB/s"
        for f in FAMILIES
    ]
    comment = (
        f"gembench project --calibrate on {socket.gethostname()}: {data['world']} ranks, "
        f"{data['backend']} on {data['device']}, sizes {SIZES[0]}..{SIZES[-1]} bytes\n"
        + "\n".join(rows)
        + "\n[inter] is [intra]: one host measures no link across nodes; peak_tflops and "
        "hbm_GBps are placeholders:\n--check prices compute and lookups from the --from result it is given"
    )
    atomic_write(out, to_toml(cluster, comment) + "\n", replace=False)
    print("\n".join(rows))
    print(f"cluster file: {out}")
    return 0


def cluster_from(data: dict) -> Cluster:
    """A cluster of one node of ``world`` ranks from the measured figures."""
    world = data["world"]
    links = {f: fit(data["sizes"], data["seconds"][f], f, world) for f in FAMILIES}
    a2a = links["all_to_all"]
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / world
    return Cluster(
        name=f"calibrated-{socket.gethostname()}",
        gpus_per_node=world,
        peak_tflops=1.0,
        hbm_bytes=ram,
        hbm_Bps=10e9,
        intra=a2a,
        inter=a2a,
        collectives=links,
        source="calibrated",
    )


if __name__ == "__main__":
    worker(sys.argv[1])
