"""Which device we run on and the peak FLOP/s that MFU is measured against.

GPUs: the dense bf16 datasheet figure (as torchtitan's peak table), one reference peak per
device so MFU is comparable across dtypes and stacks. CPUs have no such figure: we measure it
with a large GEMM per dtype and cache the result per machine, stack and thread count.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from gembench.harness.errors import UsageError

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

CALIBRATION_SIZES = (1024, 2048, 3072)  # square GEMMs; the best of them is the peak
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Peak:
    """The peak one device is measured against, and where that number came from."""

    tflops_per_device: float
    dtype: str
    source: str  # "datasheet: H200 dense bf16", "calibrated: ...", "override: --peak-tflops"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def resolve_device(name: str) -> torch.device:
    """'auto' picks CUDA when present; an unavailable device is a usage error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError("--device cuda asked for, but this torch build sees no CUDA device; use --device cpu")
    if name not in ("cpu",) and not name.startswith("cuda"):
        raise UsageError(f"--device must be auto, cpu or cuda[:N], got {name!r}")
    return torch.device(name)


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
    raise UsageError(
        f"no datasheet peak for GPU {name!r}: pass --peak-tflops with its dense bf16 TFLOP/s"
    )


def cache_dir() -> Path:
    return Path(os.environ.get("GEMBENCH_CACHE", Path.home() / ".cache" / "gembench"))


def cpu_peak(dtype: str = "bf16", refresh: bool = False) -> Peak:
    """Measured CPU GEMM peak for ``dtype``, cached per CPU model, thread count and torch."""
    threads = torch.get_num_threads()
    key = hashlib.sha256(f"{cpu_model()}|{threads}|{torch.__version__}|{dtype}".encode()).hexdigest()[:12]
    path = cache_dir() / f"cpu-peak-{key}.json"
    if path.exists() and not refresh:
        try:
            data = json.loads(path.read_text())
            return Peak(**data)
        except (ValueError, TypeError):
            pass  # a damaged cache is re-measured, not trusted
    tflops, size = calibrate_gemm(DTYPES[dtype])
    peak = Peak(
        round(tflops, 4), dtype,
        f"calibrated: best {dtype} GEMM {size}^3 on {threads} threads of {cpu_model()} "
        f"(cached in {path})",
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(peak)))
        os.replace(tmp, path)
    except OSError:
        pass  # an unwritable cache only costs a re-measurement next time
    return peak


def calibrate_gemm(dtype: torch.dtype, seconds: float = 0.5) -> tuple[float, int]:
    """Best achieved TFLOP/s over a few square GEMM sizes (each run ~``seconds``)."""
    best, best_size = 0.0, 0
    for n in CALIBRATION_SIZES:
        a = torch.randn(n, n, dtype=dtype)
        b = torch.randn(n, n, dtype=dtype)
        torch.mm(a, b)  # warm-up: thread pool, packing buffers
        reps, start = 0, time.perf_counter()
        while True:
            torch.mm(a, b)
            reps += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds and reps >= 2:
                break
        tflops = 2 * n**3 * reps / elapsed / 1e12
        if tflops > best:
            best, best_size = tflops, n
    return best, best_size


def reference_peak(device: torch.device, override_tflops: float | None = None) -> Peak:
    """One reference peak per device: dense bf16 (datasheet on GPU, measured GEMM on CPU).

    MFU of every dtype and stack is measured against this same figure, so a bf16 stack's MFU
    and an fp32 stack's MFU divide into a throughput ratio at equal model FLOPs.
    """
    if override_tflops is not None:
        if override_tflops <= 0:
            raise UsageError(f"--peak-tflops must be positive, got {override_tflops}")
        return Peak(override_tflops, "bf16", "override: --peak-tflops")
    if device.type == "cuda":
        return gpu_peak(device)
    return cpu_peak("bf16")


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
