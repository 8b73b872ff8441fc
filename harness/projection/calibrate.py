"""This host's links, measured: latency and bus bandwidth of each collective, as a cluster file.

`gembench project --calibrate --out here.toml` starts N torchrun ranks (gloo on CPU, nccl on
CUDA) running this module. Each collective family is timed over message sizes from 4 KiB to
16 MiB (nccl-tests' sizes: an all-to-all's send buffer, the full buffer of the others; the
median of ITERS calls after a barrier, slowest rank); then alpha-beta is fitted by least squares:
time = latency + size x bus_factor / bandwidth, in relative error. The file has one
[collectives.<family>] link per family; [inter] is copied from [intra] (one host measures no link
across nodes) and says so.

With ``--trace DIR`` (a `gembench run --nproc N --trace DIR`), each family is fitted again on the
run's own collectives: every call inside the profiled steps, its bytes and the time gloo's worker
(or the call) took on each rank, compute running beside it: the isolated link of the family is
slowed by the factor that makes it price those calls at what they took (`in_run_links`), never
below 1 (the floor); those [in_run.<family>] links are what the file prices with (links = "in_run").
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
from gembench.harness.projection.cluster import FAMILIES, KINDS, Cluster, Link, to_toml
from gembench.harness.projection.rates import ADAM_STEP_BYTES

SIZES = [2**k for k in range(12, 25, 2)]  # 4 KiB .. 16 MiB
ITERS = 15
STREAM_PARAMS = 2**25  # fp32 elements Adam steps over per rank for the memory rate: 512 MiB with its state
STREAM_STEPS = 5
STORAGE_BYTES = 256 * 2**20  # written and synced once for the storage bandwidth


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

            times.append(_slowest_median(call, device, ITERS, warmup=2))
        out[family] = times
    return out


def _slowest_median(call, device, iters: int, warmup: int) -> float:
    """``call()`` timed ``iters`` times after ``warmup``, every rank starting together (a barrier
    before each): the median call on each rank, the slowest rank's."""
    import torch
    import torch.distributed as dist

    samples = []
    for i in range(warmup + iters):
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            samples.append(time.perf_counter() - start)
    t = torch.tensor([float(np.median(samples))])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _stream(device) -> float:
    """Seconds per parameter of a fused Adam step over STREAM_PARAMS parameters (weights, gradients,
    m and v far larger than any cache), every rank at once: the memory rate a data-parallel table's
    update runs at, where the ranks of a node share the memory. Median step, slowest rank."""
    import torch

    p = torch.nn.Parameter(torch.zeros(STREAM_PARAMS, device=device))
    p.grad = torch.ones_like(p)
    opt = torch.optim.Adam([p], lr=1e-3, fused=True)
    return _slowest_median(opt.step, device, STREAM_STEPS, warmup=1) / STREAM_PARAMS


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
    stream = _stream(device)
    if rank == 0:
        Path(out_path).write_text(
            json.dumps(
                {
                    "world": world,
                    "backend": dist.get_backend(),
                    "sizes": SIZES,
                    "seconds": times,
                    "device": str(device),
                    "stream_s_per_param": stream,
                }
            )
        )
    dist.destroy_process_group()


def run_points(trace_dir: Path) -> tuple[dict[str, list[tuple[float, float]]], int]:
    """(kind -> [(bytes, seconds)] of every collective inside the profiled steps of every rank's
    trace in ``trace_dir``, its job as harness.metrics.comm classifies it; the world size)."""
    from gembench.harness.metrics import comm
    from gembench.harness.metrics.trace import STEP_SPAN

    files = sorted(Path(trace_dir).glob("rank*.json"))
    if not files:
        raise UsageError(
            f"--trace {trace_dir}: no rank<R>.json in it; make one with gembench run --nproc N --trace DIR"
        )
    points: dict[str, list[tuple[float, float]]] = {}
    for f in files:
        try:
            events = json.loads(f.read_text())["traceEvents"]
        except (OSError, ValueError, KeyError):
            raise UsageError(f"--trace {trace_dir}: {f.name} is not a profiler trace (Chrome JSON)") from None
        steps = comm.windows(events, STEP_SPAN)
        for c in comm.collectives(events):
            if c["kind"] in KINDS and c["bytes"] > 0 and any(a <= c["queued_us"] <= b for a, b in steps):
                points.setdefault(c["kind"], []).append((float(c["bytes"]), (c["end_us"] - c["start_us"]) / 1e6))
    if not points:
        raise UsageError(f"--trace {trace_dir}: no collectives inside the profiled steps (a run of --nproc 2 or more)")
    return points, len(files)


def in_run_links(points: dict[str, list[tuple[float, float]]], world: int, floor: dict[str, Link]) -> dict[str, Link]:
    """Per collective kind, and per family over its kinds: the isolated link of the family slowed
    by the factor k = (sum of the run's times) / (sum of what the isolated link gives for their
    bytes), so those calls priced again add up to what they took in the run. k is held at 1 or
    more (the isolated figures are the floor): latency x k, bandwidth / k."""

    def slowed(family: str, pts: list[tuple[float, float]]) -> Link | None:
        base = floor.get(family)
        if base is None or not pts:
            return None
        factor = bus_factor(family, world)
        isolated = sum(base.latency_s + b * factor / base.bandwidth_Bps for b, _ in pts)
        k = max(sum(t for _, t in pts) / isolated, 1.0) if isolated > 0 else 1.0
        return Link(base.latency_s * k, base.bandwidth_Bps / k)

    out = {kind: slowed(KINDS[kind], pts) for kind, pts in points.items()}
    for family in FAMILIES:
        out[family] = slowed(family, [p for kind, pts in points.items() if KINDS[kind] == family for p in pts])
    return {k: v for k, v in out.items() if v is not None}


def _isolated(args, world: int) -> tuple[Cluster, dict]:
    """The isolated links: the --cluster file's, if it has them, else measured now on ``world`` ranks."""
    if args.cluster.endswith(".toml"):
        from gembench.harness.projection.cluster import load_cluster

        given = load_cluster(args.cluster)
        if given.collectives:
            return given, {"world": world, "backend": "from " + args.cluster, "device": "-"}
    data = _measure_ranks(world, args.quiet)
    return cluster_from(data), data


def _measure_ranks(nproc: int, quiet: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "links.json"
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(nproc),
            "-m",
            "gembench.harness.projection.calibrate",
            str(raw),
        ]
        if not quiet:
            print(
                f"gembench project --calibrate: {len(FAMILIES)} collectives x {len(SIZES)} sizes on {nproc} ranks ...",
                file=sys.stderr,
                flush=True,
            )
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if proc.returncode != 0 or not raw.exists():
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise UsageError(f"--calibrate: the ranks failed ({tail})")
        return json.loads(raw.read_text())


def _link_text(t: Link) -> str:
    return f"latency {t.latency_s * 1e6:,.0f} us, bus bandwidth {t.bandwidth_Bps / 1e9:.3f} GB/s"


def calibrate_command(args) -> int:
    import dataclasses

    from gembench.harness.store.results import atomic_write, check_writable

    if not args.out:
        raise UsageError("--calibrate writes a cluster file: pass --out FILE.toml")
    if not args.out.endswith(".toml"):
        raise UsageError(f"--calibrate writes TOML: name the file FILE.toml, not {args.out!r}")
    out = check_writable(args.out)
    trace = getattr(args, "trace", None)
    if trace:
        points, world = run_points(Path(trace))
        cluster, data = _isolated(args, world)
        links = in_run_links(points, world, cluster.collectives)
        cluster = dataclasses.replace(cluster, in_run=links, links="in_run")
        rows = [
            f"{k}: {len(points.get(k, []))} calls in the run, {_link_text(t)} "
            f"(isolated {KINDS.get(k, k)}: {_link_text(cluster.collectives[KINDS.get(k, k)])})"
            for k, t in links.items()
            if k in points
        ]
        comment = (
            f"gembench project --calibrate --trace {trace} on {socket.gethostname()}: {world} ranks; isolated "
            f"links {data['backend']}\n" + "\n".join(rows) + "\nlinks = in_run: the cost model prices with "
            "[in_run.*]: per kind, else per family (over the run's kinds), else isolated"
        )
        atomic_write(out, to_toml(cluster, comment) + "\n", replace=False)
        print("\n".join(rows))
        print(f"cluster file: {out} (prices with the in-run links)")
        return 0
    if args.nproc < 2:
        raise UsageError("--calibrate needs --nproc 2 or more: a collective of one rank moves nothing")
    data = _measure_ranks(args.nproc, args.quiet)
    store = next(d for d in (out.parent.resolve(), *out.parent.resolve().parents) if d.is_dir())
    storage = storage_Bps(store)
    # a checkpoint's staging on a CPU host is a copy within its memory
    cluster = dataclasses.replace(cluster_from(data), storage_Bps=storage)
    cluster = dataclasses.replace(cluster, host_copy_Bps=cluster.memory_Bps)
    rows = [f"{f}: {_link_text(cluster.collectives[f])}" for f in FAMILIES]
    rows.append(
        f"storage: {storage / 1e9:.2f} GB/s into {store} ({STORAGE_BYTES / 2**20:.0f} MiB "
        "written and synced: where a checkpoint of this host would go)"
    )
    if cluster.memory_Bps:
        rows.append(
            f"memory: {cluster.memory_Bps / 1e9:.2f} GB/s per rank, every rank at once (fused Adam over "
            f"{STREAM_PARAMS:,} parameters each)"
        )
    comment = (
        f"gembench project --calibrate on {socket.gethostname()}: {data['world']} ranks, "
        f"{data['backend']} on {data['device']}, sizes {SIZES[0]}..{SIZES[-1]} bytes\n"
        + "\n".join(rows)
        + "\n[inter] is [intra]: one host measures no link across nodes; peak_tflops and "
        "hbm_GBps are placeholders:\n--check prices compute and lookups from the --from result it is given, "
        "a data-parallel table's update from memory_GBps"
    )
    atomic_write(out, to_toml(cluster, comment) + "\n", replace=False)
    print("\n".join(rows))
    print(f"cluster file: {out}")
    return 0


def storage_Bps(folder: Path) -> float:
    """Bytes per second one file takes to be written and synced in ``folder``, as a checkpoint's
    shards are (DCP syncs each file it writes)."""
    import tempfile

    block = os.urandom(2**20)
    with tempfile.NamedTemporaryFile(dir=folder, prefix=".gembench-storage-") as f:
        start = time.perf_counter()
        for _ in range(STORAGE_BYTES // len(block)):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
        return STORAGE_BYTES / (time.perf_counter() - start)


def cluster_from(data: dict) -> Cluster:
    """A cluster of one node of ``world`` ranks from the measured figures."""
    world = data["world"]
    links = {f: fit(data["sizes"], data["seconds"][f], f, world) for f in FAMILIES}
    a2a = links["all_to_all"]
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / world
    stream = data.get("stream_s_per_param")  # Adam's bytes per parameter over its seconds per parameter
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
        memory_Bps=ADAM_STEP_BYTES / stream if stream else 0.0,
    )


if __name__ == "__main__":
    worker(sys.argv[1])
