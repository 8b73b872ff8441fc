"""Which device we run on and the peak FLOP/s that MFU is measured against.

GPUs: the dense bf16 datasheet figure (as torchtitan's peak table), one reference peak per
device so MFU is comparable across dtypes and stacks. CPUs have no such figure: we measure it
with large GEMMs per dtype and thread count, cache the best quiet measurement (calibration.py),
and take the fastest dtype's as the CPU's one reference peak.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from gembench.errors import UsageError
from gembench.harness.device import calibration
from gembench.harness.metrics.mfu import STAGE_FLOP_SHARE

# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s, from vendor datasheets.
GPU_PEAK_TFLOPS = {
    "A100": 312.0,
    "H100 PCIe": 756.0,
    "H100": 989.4,  # SXM; also H100 NVL/HBM3 boards report as "H100"
    "H200": 989.4,
    "B200": 2250.0,
    "GB200": 2500.0,
    "MI300X": 1307.4,
}


# HBM bandwidth in GB/s, from the same datasheets (the memory side of an op's roofline).
GPU_HBM_GBS = {
    "A100": 2039.0,  # 80 GB SXM
    "H100 PCIe": 2000.0,
    "H100": 3350.0,
    "H200": 4800.0,
    "B200": 8000.0,
    "GB200": 8000.0,
    "MI300X": 5300.0,
}


@dataclass(frozen=True)
class Bandwidth:
    """The memory bandwidth one device's ops are held against, and where it came from."""

    gbs: float
    source: str  # "datasheet: H200 HBM", "calibrated: triad ...", "override: --bandwidth-gbs"
    provisional: bool = False


@dataclass(frozen=True)
class Peak:
    """The peak one device is measured against, and where that number came from."""

    tflops_per_device: float
    dtype: str
    source: str  # "datasheet: H200 dense bf16", "calibrated: ...", "override: --peak-tflops"
    provisional: bool = False  # CPU: measured under load for this run only, not cached
    calibration: dict | None = None  # CPU: the calibration.Measurement served, as a dict


cpu_model = calibration.cpu_model
cache_dir = calibration.cache_dir


def resolve_device(name: str) -> torch.device:
    """'auto' picks CUDA when present; an unavailable device is a usage error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError("--device cuda asked for, but this torch build sees no CUDA device; use --device cpu")
    if name not in ("cpu",) and not name.startswith("cuda"):
        raise UsageError(f"--device must be auto, cpu or cuda[:N], got {name!r}")
    return torch.device(name)


def keep_freed_memory() -> bool:
    """Tells glibc's malloc to keep what a step frees for the next step to reuse: large blocks
    from the heap (mmap threshold 1 GiB) and a heap it never trims. By default glibc maps every
    block over 32 MiB afresh and unmaps it when freed, so every step page-faults its large
    activations in again, zeroed by the kernel: on a 2-core VM a 63 MB SiLU took 58 ms fresh
    against 24 ms on memory kept. What torch's CPU launcher gets from jemalloc or tcmalloc,
    without a preload. GEMBENCH_KEEP_FREED=0 leaves malloc as it is; False where it was left so."""
    if os.environ.get("GEMBENCH_KEEP_FREED", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (musl): its malloc has no such knobs
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    return bool(libc.mallopt(m_mmap_threshold, 2**30) and libc.mallopt(m_trim_threshold, 2**31 - 1))


def cpu_native_bf16() -> bool:
    """Whether this host's CPU multiplies bf16 in hardware (AVX-512 BF16 or AMX). Elsewhere torch
    emulates bf16 GEMMs, about a hundred times slower than fp32's, so mixed precision there loses
    time instead of saving it."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_model()} ({torch.get_num_threads()} threads)"


def hardware_class(device: torch.device) -> str:
    """A short label under which results are comparable: the same chip, the same core count."""
    if device.type == "cuda":
        return "cuda-" + _slug(torch.cuda.get_device_name(device))
    return f"cpu-{_slug(cpu_model())}-{torch.get_num_threads()}t"


def _slug(text: str) -> str:
    keep = "".join(c.lower() if c.isalnum() else "-" for c in text)
    return "-".join(part for part in keep.split("-") if part)


def gpu_peak(device: torch.device) -> Peak:
    name = torch.cuda.get_device_name(device)
    # Longest key first, so "H100 PCIe" wins over "H100" and "GB200" over "B200".
    for key in sorted(GPU_PEAK_TFLOPS, key=len, reverse=True):
        if key.lower() in name.lower():
            return Peak(GPU_PEAK_TFLOPS[key], "bf16", f"datasheet: {key} dense bf16")
    raise UsageError(f"no datasheet peak for GPU {name!r}: pass --peak-tflops with its dense bf16 TFLOP/s")


def cpu_peak(dtype: str | None = None, threads: int | None = None) -> Peak:
    """Measured CPU GEMM peak for ``dtype`` on ``threads`` threads (default: torch's count):
    the cached best when a quiet calibration settled it, else measured now (calibration.py).

    No ``dtype``: the CPU's reference peak, its fastest dense GEMM over the dtypes a stack runs.
    That is bf16's where the CPU has a bf16 path (AMX, AVX-512 BF16) and fp32's where it has not
    (bf16 then runs near a GFLOP/s): a bf16-only figure there would put an fp32 stack above 100%.
    Without a bf16 path bf16 is not measured at all: it cannot be the fastest, and its emulated
    GEMMs are slow and noisy enough that the start-of-run probe kept re-measuring them (tens of
    seconds of every run's start-up)."""
    if dtype is None:
        dtypes = calibration.DTYPES if cpu_native_bf16() else ("fp32",)
        return max((cpu_peak(d, threads) for d in dtypes), key=lambda p: p.tflops_per_device)
    return _as_peak(calibration.peak(dtype, threads), dtype)


def probe_cpu_calibrations(threads: int) -> str:
    """Probes, in this process, the calibrations a CPU run on ``threads`` threads serves (its
    reference peak's dtypes and the triad): calibration.PROBED_ENV's value for its children."""
    dtypes = tuple(calibration.DTYPES) if cpu_native_bf16() else ("fp32",)
    return calibration.probe_for_children((*dtypes, calibration.TRIAD), threads)


def _as_peak(c: "calibration.Calibrated", dtype: str) -> Peak:
    m = c.measurement
    return Peak(
        m.tflops,
        dtype,
        f"calibrated: {dtype} {m.describe()}; {c.note}",
        provisional=c.provisional,
        calibration=asdict(m),
    )


def recheck_peak(peak: Peak, summaries: dict[str, dict]) -> Peak | None:
    """The one check, after a run, that its figures did not beat a calibrated CPU peak: one
    process, every variant of an ablation, every rank of a host alike.

    ``summaries``: {label: a step summary (metrics.mfu.summarize)}; the label (" of rank 1", "")
    goes into the note. What must not beat the peak: the GEMM-bound stages (those with a share of
    the training FLOPs, metrics.mfu.STAGE_FLOP_SHARE) and the whole step. If one does, the peak
    was underestimated: it is re-measured and the new one returned (None when the peak stands
    or is not a calibration)."""
    if peak.calibration is None:
        return None
    achieved = {}
    for label, summary in summaries.items():
        for name, row in summary["stages"].items():
            if name in STAGE_FLOP_SHARE and row.get("flops"):
                achieved[f"stage {name}{label}"] = row["tflops"]
        achieved[f"the step{label}"] = summary["tflops"]
    what, best = max(achieved.items(), key=lambda kv: kv[1], default=("", 0.0))
    if best <= peak.tflops_per_device:
        return None
    import sys

    print(
        f"gembench run: {what} beat the peak of {peak.tflops_per_device:.4g} TFLOP/s, so it was "
        "underestimated: re-measuring it",
        file=sys.stderr,
        flush=True,
    )
    current = calibration.Calibrated(calibration.Measurement(**peak.calibration), peak.provisional, "")
    new = calibration.beaten(current, best, what, peak.dtype, peak.calibration["threads"])
    return None if new is None else _as_peak(new, peak.dtype)


def peak_basis(device: torch.device, ranks: int, threads: int, host: Peak | None, override: bool = False) -> dict:
    """How MFU's denominator is formed (the result's peak.basis and its words).

    GPUs: one device per rank, so N x the device's peak. CPUs: N ranks of T threads each, MFU
    against N x peak(T threads) ("ranks"); ``host`` is the host's own peak at N x T threads, the
    basis on which one process of N x T threads and N ranks of T threads compare (mfu_host).
    """
    if device.type == "cuda":
        return {"basis": "devices", "basis_text": f"{ranks} device(s) x the device's peak"}
    if override:
        return {"basis": "ranks", "basis_text": f"{ranks} rank(s) x the --peak-tflops figure"}
    out = {"basis": "ranks", "basis_text": f"{ranks} rank(s) x peak at {threads} thread(s)"}
    if host is not None:
        out["host"] = {
            "tflops": host.tflops_per_device,
            "threads": ranks * threads,
            "source": host.source,
            "provisional": host.provisional,
        }
    return out


def reference_peak(device: torch.device, override_tflops: float | None = None) -> Peak:
    """One reference peak per device: the dense bf16 datasheet figure on a GPU, the fastest
    measured GEMM on a CPU (cpu_peak).

    MFU of every dtype and stack is measured against this same figure, so a bf16 stack's MFU
    and an fp32 stack's MFU divide into a throughput ratio at equal model FLOPs.
    """
    if override_tflops is not None:
        if override_tflops <= 0:
            raise UsageError(f"--peak-tflops must be positive, got {override_tflops}")
        return Peak(override_tflops, "bf16", "override: --peak-tflops")
    if device.type == "cuda":
        return gpu_peak(device)
    return cpu_peak()


def reference_bandwidth(
    device: torch.device, override_gbs: float | None = None, threads: int | None = None
) -> Bandwidth:
    """The memory bandwidth of ``device``: the datasheet HBM figure of a GPU, a CPU's measured
    STREAM triad on ``threads`` threads (calibration.TRIAD, cached by the peak's rules), or
    ``override_gbs``."""
    if override_gbs is not None:
        if override_gbs <= 0:
            raise UsageError(f"--bandwidth-gbs must be positive, got {override_gbs}")
        return Bandwidth(override_gbs, "override: --bandwidth-gbs")
    if device.type == "cuda":
        name = device_name(device)
        for key in sorted(GPU_HBM_GBS, key=len, reverse=True):
            if key.lower() in name.lower():
                return Bandwidth(GPU_HBM_GBS[key], f"datasheet: {key} HBM")
        raise UsageError(f"no datasheet HBM bandwidth for GPU {name!r}: pass --bandwidth-gbs with its GB/s")
    c = calibration.peak(calibration.TRIAD, threads)
    m = c.measurement
    return Bandwidth(1e3 * m.tflops, f"calibrated: {m.describe(calibration.TRIAD)}; {c.note}", c.provisional)


def memory_available(device: torch.device) -> int:
    """Bytes this process may still allocate on ``device``."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
