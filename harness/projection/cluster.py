"""Clusters a projection is priced on: GPUs per node, peak, HBM, and the two kinds of link.

A cluster is data: a preset below (every figure sourced in docs/design.md section 8) or a TOML
file of the same fields, which is what `gembench project --calibrate` writes for this host.

    name = "h100"
    gpus_per_node = 8
    peak_tflops = 989.4          # dense bf16 per GPU
    hbm_gib = 80                 # HBM per GPU
    hbm_GBps = 3350              # HBM bandwidth per GPU
    efficiency = 0.5             # dense compute at this share of the peak, when no --from result
    lookup_efficiency = 0.5      # embedding rows read at this share of the HBM bandwidth
    [intra]                      # within a node (NVLink): per GPU, per direction, bus bandwidth
    latency_us = 10
    bandwidth_GBps = 360
    [inter]                      # across nodes (one NIC per GPU)
    latency_us = 25
    bandwidth_GBps = 45
    [collectives.all_to_all]     # optional: a measured intra-node link per collective family
    latency_us = 60
    bandwidth_GBps = 1.2
    links = "in_run"             # optional: price with [in_run.*] (default "isolated": the above)
    [in_run.kjt_all_to_all]      # a link as a run's own trace timed it, per collective's job (KINDS)
    latency_us = 200             # or per family; never under the isolated one (--calibrate --trace)
    bandwidth_GBps = 0.4
    storage_GBps = 2.0           # optional: a node's write bandwidth into the checkpoint store
    host_copy_GBps = 51.2        # optional: device to host memory, per GPU (an async save's staging)
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gembench.errors import UsageError, read_toml

FAMILIES = ("all_to_all", "all_reduce", "reduce_scatter", "all_gather")
# a collective's job (harness.metrics.comm.classify's kinds) -> its family: in a run, what runs
# beside a collective depends on its job (the backward's all-to-all waits on the backward)
KINDS = {
    "kjt_all_to_all": "all_to_all",
    "embedding_all_to_all": "all_to_all",
    "embedding_grad_all_to_all": "all_to_all",
    "embedding_reduce_scatter": "reduce_scatter",
    "embedding_grad_all_gather": "all_gather",
    "dense_grad_all_reduce": "all_reduce",
    "dense_grad_reduce_scatter": "reduce_scatter",
    "dense_param_all_gather": "all_gather",
}


@dataclass(frozen=True)
class Link:
    """alpha-beta: a collective of B bus bytes takes latency_s + B / bandwidth_Bps."""

    latency_s: float
    bandwidth_Bps: float


@dataclass(frozen=True)
class Cluster:
    name: str
    gpus_per_node: int
    peak_tflops: float
    hbm_bytes: float
    hbm_Bps: float
    intra: Link
    inter: Link
    efficiency: float = 0.5
    lookup_efficiency: float = 0.5
    collectives: dict[str, Link] = field(default_factory=dict)  # intra-node, per family, if measured
    source: str = "preset"
    in_run: dict[str, Link] = field(default_factory=dict)  # intra-node, per kind or family, from a run's trace
    links: str = "isolated"  # which the cost model prices with: "isolated" or "in_run"
    # bytes/s one device streams through its memory while every device of the node does (--calibrate:
    # fused Adam over a buffer far larger than the caches); 0: not measured. What a data-parallel
    # table's update costs, where a result measured on a small dense part ran from the caches
    memory_Bps: float = 0.0
    # what a checkpoint costs (projection/job.py): a node's write bandwidth into the checkpoint
    # store (no datasheet has it: a cluster file's, or --calibrate's of this host; 0: not priced)
    # and one GPU's copy into host memory, what an asynchronous save blocks the loop for
    storage_Bps: float = 0.0
    host_copy_Bps: float = 0.0

    def link(self, family: str, across_nodes: bool, kind: str | None = None) -> Link:
        if across_nodes:
            return self.inter
        if self.links == "in_run":
            found = self.in_run.get(kind) or self.in_run.get(family)
            if found:
                return found
        return self.collectives.get(family, self.intra)

    def links_used(self) -> str:
        """Which links the cost model prices collectives with, in words."""
        if self.links == "in_run" and self.in_run:
            return (
                f"in-run ({len(self.in_run)} links timed in a run, the isolated figures their floor; "
                f"collectives the run had not: isolated), from {self.source}"
            )
        if self.collectives:
            return f"isolated (collectives run alone, --calibrate), from {self.source}"
        return f"datasheet intra/inter links ({self.source})"

    def hash(self) -> str:
        content = {k: v for k, v in asdict(self).items() if k != "source"}
        return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:12]

    def describe(self) -> str:
        return (
            f"{self.name}: {self.gpus_per_node} GPUs/node, {self.peak_tflops:g} TFLOP/s, "
            f"{self.hbm_bytes / 2**30:.0f} GiB HBM at {self.hbm_Bps / 1e9:,.0f} GB/s, "
            f"intra {self.intra.bandwidth_Bps / 1e9:,.1f} GB/s + {self.intra.latency_s * 1e6:.0f} us, "
            f"inter {self.inter.bandwidth_Bps / 1e9:,.1f} GB/s + {self.inter.latency_s * 1e6:.0f} us "
            f"({self.source})"
        )


# PCIe Gen5 x16, every preset's host link: 128 GB/s both directions (the H100, H200 and B200
# datasheets; AMD's MI355X specifications), 64 GB/s each way
PCIE5_GBPS = 64.0


def _preset(name, gpus, peak, hbm_gib, hbm_GBps, nvlink_GBps, nic_Gbps) -> Cluster:
    # Bus bandwidths as nccl-tests would read them: ~80% of the per-direction link rate
    # (docs/design.md section 8); latencies of NCCL's small messages within and across nodes.
    # The host copy at the same share of PCIe's rate. No storage bandwidth: no datasheet gives one.
    return Cluster(
        name=name,
        gpus_per_node=gpus,
        peak_tflops=peak,
        hbm_bytes=hbm_gib * 2**30,
        hbm_Bps=hbm_GBps * 1e9,
        intra=Link(10e-6, 0.8 * nvlink_GBps * 1e9),
        inter=Link(25e-6, 0.9 * nic_Gbps / 8 * 1e9),
        source="preset",
        host_copy_Bps=0.8 * PCIE5_GBPS * 1e9,
    )


# name -> GPUs/node, dense bf16 TFLOP/s, HBM GiB, HBM GB/s, NVLink GB/s per direction, NIC Gb/s per GPU
PRESETS = {
    "h100": _preset("h100", 8, 989.4, 80, 3350, 450, 400),
    "h200": _preset("h200", 8, 989.4, 141, 4800, 450, 400),
    "b200": _preset("b200", 8, 2250.0, 180, 8000, 900, 400),
    # AMD Instinct MI355X (MLPerf DLRMv4's reference hardware; docs/dlrmv4.md section 6): AMD's
    # published specifications (amd.com, Instinct MI355X; CDNA 4 white paper): dense bf16 2.5
    # PFLOP/s = 256 CUs x 2.4 GHz x 4,096 FLOP/clock, 288 GB HBM3E (8 stacks of 36 GiB: ROCm's
    # GPU table gives 288 GiB of VRAM, as 80 and 141 stand for H100's and H200's) at 8 TB/s; 8 OAMs
    # a node, each with 7 Infinity Fabric links of 153.6 GB/s (both directions), one to every peer:
    # 537.6 GB/s per direction. One 400 Gb/s NIC a GPU, assumed as for the NVIDIA presets.
    "mi355x": _preset("mi355x", 8, 2516.6, 288, 8000, 7 * 153.6 / 2, 400),
}

REQUIRED = ("name", "gpus_per_node", "peak_tflops", "hbm_gib", "hbm_GBps", "intra", "inter")


def _link(data: dict, where: str, path: Path) -> Link:
    if not isinstance(data, dict):
        raise UsageError(f"{path}: [{where}] must be a table with latency_us and bandwidth_GBps")
    for key in ("latency_us", "bandwidth_GBps"):
        if key not in data:
            raise UsageError(f"{path}: [{where}] has no {key}; add it (see `gembench project --help`)")
        if not isinstance(data[key], (int, float)) or data[key] < 0 or (key == "bandwidth_GBps" and data[key] == 0):
            raise UsageError(f"{path}: [{where}] {key} must be a positive number, got {data[key]!r}")
    return Link(data["latency_us"] * 1e-6, data["bandwidth_GBps"] * 1e9)


def read_cluster(path: Path) -> Cluster:
    data = read_toml(path, f"cluster file {path} does not exist; name a preset ({', '.join(PRESETS)}) or a TOML file")
    for key in REQUIRED:
        if key not in data:
            raise UsageError(f"{path}: field {key!r} is missing; a cluster file needs {', '.join(REQUIRED)}")
    for key in ("gpus_per_node", "peak_tflops", "hbm_gib", "hbm_GBps"):
        if not isinstance(data[key], (int, float)) or data[key] <= 0:
            raise UsageError(f"{path}: {key} must be a positive number, got {data[key]!r}")
    extra, in_run = data.get("collectives", {}), data.get("in_run", {})
    for where, table, known in (("collectives", extra, FAMILIES), ("in_run", in_run, (*FAMILIES, *KINDS))):
        unknown = set(table) - set(known)
        if unknown:
            raise UsageError(f"{path}: [{where}] knows {', '.join(known)}, not {', '.join(sorted(unknown))}")
    for key in ("memory_GBps", "storage_GBps", "host_copy_GBps"):
        if key in data and (not isinstance(data[key], (int, float)) or data[key] < 0):
            raise UsageError(f"{path}: {key} must be a number of GB/s (0: not known), got {data[key]!r}")
    links = data.get("links", "isolated")
    if links not in ("isolated", "in_run"):
        raise UsageError(f'{path}: links must be "isolated" or "in_run", got {links!r}')
    if links == "in_run" and not in_run:
        raise UsageError(f'{path}: links = "in_run" but there is no [in_run.<family>]; run --calibrate --trace DIR')
    return Cluster(
        name=str(data["name"]),
        gpus_per_node=int(data["gpus_per_node"]),
        peak_tflops=float(data["peak_tflops"]),
        hbm_bytes=float(data["hbm_gib"]) * 2**30,
        hbm_Bps=float(data["hbm_GBps"]) * 1e9,
        intra=_link(data["intra"], "intra", path),
        inter=_link(data["inter"], "inter", path),
        efficiency=float(data.get("efficiency", 0.5)),
        lookup_efficiency=float(data.get("lookup_efficiency", 0.5)),
        collectives={f: _link(v, f"collectives.{f}", path) for f, v in extra.items()},
        source=str(path),
        in_run={k: _link(v, f"in_run.{k}", path) for k, v in in_run.items()},
        links=links,
        memory_Bps=float(data.get("memory_GBps", 0.0)) * 1e9,
        storage_Bps=float(data.get("storage_GBps", 0.0)) * 1e9,
        host_copy_Bps=float(data.get("host_copy_GBps", 0.0)) * 1e9,
    )


def load_cluster(spec: str) -> Cluster:
    """A preset by name, or a TOML file by path."""
    if spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec)
    if path.suffix != ".toml" and not path.exists():
        raise UsageError(f"--cluster: no preset {spec!r}; pick one of {', '.join(PRESETS)} or give a .toml file")
    return read_cluster(path)


def to_toml(c: Cluster, comment: str = "") -> str:
    def link(t: Link) -> str:
        return f"latency_us = {t.latency_s * 1e6:.3f}\nbandwidth_GBps = {t.bandwidth_Bps / 1e9:.6g}\n"

    lines = [f"# {line}" for line in comment.splitlines()] if comment else []
    lines += [
        f'name = "{c.name}"',
        f"gpus_per_node = {c.gpus_per_node}",
        f"peak_tflops = {c.peak_tflops:.6g}",
        f"hbm_gib = {c.hbm_bytes / 2**30:.6g}",
        f"hbm_GBps = {c.hbm_Bps / 1e9:.6g}",
        f"efficiency = {c.efficiency:g}",
        f"lookup_efficiency = {c.lookup_efficiency:g}",
        *([f"memory_GBps = {c.memory_Bps / 1e9:.6g}"] if c.memory_Bps else []),
        *([f"storage_GBps = {c.storage_Bps / 1e9:.6g}"] if c.storage_Bps else []),
        *([f"host_copy_GBps = {c.host_copy_Bps / 1e9:.6g}"] if c.host_copy_Bps else []),
        "",
        "[intra]",
        link(c.intra),
        "[inter]",
        link(c.inter),
    ]
    if c.in_run:
        lines.insert(lines.index(""), f'links = "{c.links}"')
    for family, t in c.collectives.items():
        lines += [f"[collectives.{family}]", link(t)]
    for family, t in c.in_run.items():
        lines += [f"[in_run.{family}]", link(t)]
    return "\n".join(lines)
