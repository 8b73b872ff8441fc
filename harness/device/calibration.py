"""CPU GEMM peaks and memory bandwidth: measured, judged for load, cached best-of per (CPU, dtype,
threads, torch).

A CPU has no datasheet peak we trust, so we time large square GEMMs (per dtype), and its memory
bandwidth with a STREAM triad (a = b + s x c over arrays far larger than the caches: the "dtype"
TRIAD, its figure in TB/s where a GEMM's is in TFLOP/s). Noise on a shared machine
only ever *lowers* the measured figure, and a peak that is too low inflates every MFU measured
against it, so the rules are:

* best of: a cache entry keeps every measurement's figure and serves the highest one;
* no busy calibration sticks: while measuring we record the load average and how many cores
  other processes kept busy (from /proc/stat, minus our own CPU time). A measurement with more
  than BUSY_SHARE x (the cores the GEMM leaves free, at least 1) busy elsewhere is *busy*: it is
  used for this run only, marked provisional, and does not create a cache entry (it can only
  raise an entry that a quiet measurement settled, since a higher figure is a better bound);
* a run that beats its peak re-measures: if a GEMM-bound stage or the whole step achieves more
  TFLOP/s than the peak, the peak was underestimated (beaten(), called by the runners);
* entries written by older gembench versions (``cpu-peak-<key>.json``: figure and source only,
  no load) are read as unsettled legacy figures: the next quiet measurement settles the entry,
  keeping the legacy figure if it was higher. Old files are left alone for old versions.

Cache files live in $GEMBENCH_CACHE (default ~/.cache/gembench) as ``cpu-peak-<key>.v2.json``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import re
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

CALIBRATION_SIZES = (1024, 2048, 3072)  # square GEMMs; the best of them is the peak
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TRIAD = "triad"  # the memory bandwidth's entry: STREAM's triad over fp32 arrays of TRIAD_SIZES elements
TRIAD_SIZES = (1 << 24, 1 << 25)  # 64 and 128 MiB an array: STREAM's rule, 4x the last-level cache and more
SECONDS_PER_SIZE = 0.5  # timed seconds per GEMM size and round
BUSY_SHARE = 0.5  # busy when others keep more than this share of the free cores (at least 1) busy
PROBE_SECONDS = 0.1  # the start-of-run check of a cached peak (peak())
# A probe re-measures only when it beats the cached best by more than this: a best-of figure is
# not a true maximum (and is stored rounded), so a probe a hair above it is noise, not a wrong cache.
PROBE_MARGIN = 1.05
HISTORY = 20  # measurements kept per entry (the best is always kept)
# Set by a parent that probed this machine's settled peaks before starting runs of its own (continuous
# does, for processes whose start-up is not judged): its torch version and the entries it probed,
# "2.13.0 bf16/1 triad/1". A child of that version serves those without probing them again.
PROBED_ENV = "GEMBENCH_PEAKS_PROBED"
FORMAT = 2


@dataclass(frozen=True)
class Measurement:
    """One calibration: the best GEMM figure of ``rounds`` rounds over CALIBRATION_SIZES."""

    tflops: float
    size: int  # the GEMM size (n of n x n x n) that gave the best figure; 0 if unknown
    rounds: int
    threads: int
    measured_at: str  # ISO 8601 UTC
    loadavg: list  # os.getloadavg() just before measuring: 1, 5, 15 min
    others_busy: float | None  # cores kept busy by other processes while measuring
    cores: int
    quiet: bool | None  # None: unknown (legacy entry)
    how: str  # "run", "recalibrate", "beaten by <stage>", "legacy"

    def describe(self, kind: str = "") -> str:
        """How and when: 'GEMM 2048^3 on 1 thread(s), best of 5 round(s), 2026-12-01 03:37 UTC,
        load 0.61, others busy 0.10 of 2 cores (quiet), recalibrate' (``kind`` TRIAD: 'triad of
        16,777,216 elements on ...')."""
        load = (
            "load unknown"
            if self.quiet is None
            else f"load {self.loadavg[0]:.2f}, others busy {self.others_busy:.2f} of {self.cores} cores"
            f" ({'quiet' if self.quiet else 'busy'})"
        )
        size = f"GEMM {self.size}^3" if self.size else "GEMM size unknown"
        if kind == TRIAD:
            size = f"triad of {self.size:,} fp32 elements"
        when = self.measured_at.replace("T", " ")[:16] + " UTC"
        return f"{size} on {self.threads} thread(s), best of {self.rounds} round(s), {when}, {load}, {self.how}"


@dataclass
class Entry:
    """Every measurement of one (cpu, dtype, threads, torch); serves the best."""

    cpu: str
    dtype: str
    threads: int
    torch: str
    history: list = field(default_factory=list)  # [Measurement]

    @property
    def best(self) -> Measurement | None:
        return max(self.history, key=lambda m: m.tflops, default=None)

    @property
    def settled(self) -> bool:
        """A quiet measurement has been taken: the best is trusted without measuring again."""
        return any(m.quiet for m in self.history)

    def add(self, m: Measurement) -> None:
        self.history.append(m)
        best = self.best
        # the most recent ones, plus the best (the figure served) whatever its age
        keep = self.history[-HISTORY:]
        if best not in keep:
            keep = [best] + self.history[-(HISTORY - 1) :]
        self.history = keep


# -- where entries live ------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_dir() -> Path:
    return Path(os.environ.get("GEMBENCH_CACHE") or Path.home() / ".cache" / "gembench")


def _key(cpu: str, threads: int, torch_version: str, dtype: str) -> str:
    # the same key as the first cache format, so a legacy file is found by its entry
    return hashlib.sha256(f"{cpu}|{threads}|{torch_version}|{dtype}".encode()).hexdigest()[:12]


def entry_path(dtype: str, threads: int) -> Path:
    return cache_dir() / f"cpu-peak-{_key(cpu_model(), threads, torch.__version__, dtype)}.v2.json"


def _legacy_path(path: Path) -> Path:
    return path.with_name(path.name.replace(".v2.json", ".json"))


LEGACY_SOURCE = re.compile(r"GEMM (\d+)\^3 on (\d+) threads of (.+?) \(cached in")


def _legacy_measurement(data: dict, mtime: float) -> tuple[Measurement, dict]:
    """A first-format file {tflops_per_device, dtype, source} as an unsettled measurement."""
    m = LEGACY_SOURCE.search(data.get("source", ""))
    when = dt.datetime.fromtimestamp(mtime, dt.timezone.utc).isoformat(timespec="seconds")
    meas = Measurement(
        float(data["tflops_per_device"]),
        int(m.group(1)) if m else 0,
        1,
        int(m.group(2)) if m else 0,
        when,
        [],
        None,
        os.cpu_count() or 1,
        None,
        "legacy",
    )
    return meas, {"threads": meas.threads, "cpu": m.group(3) if m else "?"}


def _read(path: Path) -> Entry | None:
    """The entry at ``path`` (format 2), or a legacy file migrated; None if absent or damaged."""
    try:
        data = json.loads(path.read_text())
        if data.get("format") == FORMAT:
            return Entry(
                data["cpu"],
                data["dtype"],
                int(data["threads"]),
                data["torch"],
                [Measurement(**m) for m in data["history"]],
            )
        meas, known = _legacy_measurement(data, path.stat().st_mtime)
        return Entry(known["cpu"], data["dtype"], known["threads"], "?", [meas])
    except (OSError, ValueError, TypeError, KeyError):
        return None  # a damaged entry is measured again, not trusted


def load_entry(dtype: str, threads: int) -> Entry | None:
    path = entry_path(dtype, threads)
    entry = _read(path) if path.exists() else None
    if entry is None and _legacy_path(path).exists():
        entry = _read(_legacy_path(path))
        if entry is not None:
            entry = replace(entry, cpu=cpu_model(), threads=threads, torch=torch.__version__)
    return entry


def save_entry(entry: Entry) -> Path | None:
    path = entry_path(entry.dtype, entry.threads)
    data = {
        "format": FORMAT,
        "cpu": entry.cpu,
        "dtype": entry.dtype,
        "threads": entry.threads,
        "torch": entry.torch,
        "best_tflops": entry.best.tflops,
        "history": [asdict(m) for m in entry.history],
    }
    from gembench.harness.store.results import atomic_write

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return atomic_write(path, json.dumps(data, indent=1), durable=False)  # a cache, as before
    except OSError:
        return None  # an unwritable cache only costs a measurement next time


def all_entries() -> list[tuple[Path, Entry]]:
    """Every entry in the cache folder (any CPU, torch, dtype, threads), legacy files included
    unless a format-2 file of the same key supersedes them."""
    folder = cache_dir()
    if not folder.is_dir():
        return []
    out = []
    for path in sorted(folder.glob("cpu-peak-*.json")):
        if not path.name.endswith(".v2.json") and path.with_name(path.stem + ".v2.json").exists():
            continue
        entry = _read(path)
        if entry is not None:
            out.append((path, entry))
    return out


def clear() -> list[Path]:
    removed = []
    for path in cache_dir().glob("cpu-peak-*.json") if cache_dir().is_dir() else []:
        path.unlink(missing_ok=True)
        removed.append(path)
    return removed


# -- measuring ---------------------------------------------------------------------------------


def affordable_size(n: int, dtype: torch.dtype, seconds: float) -> int:
    """``n``, halved (down to 128) while one n x n x n GEMM would take over 4 x ``seconds``, as
    predicted from a 256^3 GEMM timed first. Where ``dtype`` has no fast path (bf16 on a CPU
    without AVX-512 BF16 or AMX runs at about a GFLOP/s) the largest size would take minutes."""
    a = torch.randn(256, 256, dtype=dtype)
    torch.mm(a, a)
    start = time.perf_counter()
    torch.mm(a, a)
    small = time.perf_counter() - start
    while n > 128 and small * (n / 256) ** 3 > 4 * seconds:
        n //= 2
    return n


def time_triad(n: int, seconds: float) -> tuple[float, int]:
    """(TB/s, n) of STREAM's triad a = b + 3 c over fp32 arrays of ``n`` elements, for about
    ``seconds`` after one warm-up: 12 bytes an element, as STREAM counts it (b and c read, a
    written; the write-allocate read of a not counted)."""
    b, c, a = torch.rand(n), torch.rand(n), torch.empty(n)
    torch.add(b, c, alpha=3.0, out=a)
    reps, start = 0, time.perf_counter()
    while True:
        torch.add(b, c, alpha=3.0, out=a)
        reps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and reps >= 2:
            return 12 * n * reps / elapsed / 1e12, n


def timed(kind: str, n: int, seconds: float) -> tuple[float, int]:
    """(figure, size) of one calibration kind: a GEMM of a dtype in DTYPES, or TRIAD."""
    return time_triad(n, seconds) if kind == TRIAD else time_gemm(n, DTYPES[kind], seconds)


def sizes(kind: str) -> tuple[int, ...]:
    return TRIAD_SIZES if kind == TRIAD else CALIBRATION_SIZES


def time_gemm(n: int, dtype: torch.dtype, seconds: float) -> tuple[float, int]:
    """(TFLOP/s, size) of repeated GEMMs for about ``seconds`` (after one warm-up), at n x n x n or
    the smaller size this machine affords in that time (affordable_size)."""
    n = affordable_size(n, dtype, seconds)
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    torch.mm(a, b)  # warm-up: thread pool, packing buffers
    reps, start = 0, time.perf_counter()
    while True:
        torch.mm(a, b)
        reps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and reps >= 2:
            return 2 * n**3 * reps / elapsed / 1e12, n


def _busy_ticks() -> float | None:
    """Non-idle CPU seconds of the whole machine so far (/proc/stat), None where unavailable."""
    try:
        with open("/proc/stat") as fh:
            fields = [float(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system


class LoadProbe:
    """How many cores other processes kept busy between start() and stop()."""

    def start(self) -> None:
        self.wall, self.busy, self.own = time.perf_counter(), _busy_ticks(), _own_cpu()

    def stop(self) -> float:
        wall = time.perf_counter() - self.wall
        busy = _busy_ticks()
        if self.busy is None or busy is None or wall <= 0:
            return float(os.getloadavg()[0])  # no /proc/stat: the load average is the estimate
        return max(0.0, (busy - self.busy - (_own_cpu() - self.own)) / wall)


def busy_limit(threads: int, cores: int) -> float:
    return BUSY_SHARE * max(1, cores - threads)


@contextmanager
def torch_threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def measure(
    dtype: str, threads: int, rounds: int = 1, how: str = "run", seconds: float = SECONDS_PER_SIZE
) -> Measurement:
    """Best figure of ``rounds`` rounds over CALIBRATION_SIZES on ``threads`` threads, with the
    load seen while measuring (the quietest round's, since the best figure is what we keep)."""
    cores = os.cpu_count() or 1
    loadavg = [round(x, 2) for x in os.getloadavg()]
    best, best_size, others = 0.0, 0, None
    probe = LoadProbe()
    with torch_threads(threads):
        for _ in range(rounds):
            probe.start()
            for n in sizes(dtype):
                tflops, size = timed(dtype, n, seconds)
                if tflops > best:
                    best, best_size = tflops, size
            busy = probe.stop()
            others = busy if others is None else min(others, busy)
    return Measurement(
        round(best, 6),
        best_size,
        rounds,
        threads,
        dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        loadavg,
        round(others, 2),
        cores,
        others <= busy_limit(threads, cores),
        how,
    )


# -- what runs call ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibrated:
    """The figure a run uses, and whether it may be trusted beyond this run."""

    measurement: Measurement  # the one whose figure is served
    provisional: bool  # measured under load this run and not settled in the cache
    note: str  # one line for the table


_this_process: dict = {}  # (dtype, threads) -> provisional Calibrated: one busy measurement per process


def probe(m: Measurement, dtype: str, threads: int) -> float:
    """A short GEMM at the cached best's size (PROBE_SECONDS): what this machine does now."""
    with torch_threads(threads):
        return timed(dtype, m.size or max(sizes(dtype)), PROBE_SECONDS)[0]


def peak(dtype: str, threads: int | None = None) -> Calibrated:
    """The GEMM peak for ``dtype`` on ``threads`` threads (default: torch's current count).

    A settled cached peak is served after a short probe at its GEMM size: a probe that beats it
    shows the cache too low (cached on a busier machine, or a faster one took its place), and the
    peak is re-measured before the run uses it, whatever stages the run itself will beat."""
    threads = threads or torch.get_num_threads()
    entry = load_entry(dtype, threads)
    if entry is not None and entry.settled:
        cached = Calibrated(entry.best, False, f"cached best of {len(entry.history)} measurement(s)")
        if probed_by_parent(dtype, threads):
            return replace(cached, note=f"{cached.note}, probed by the parent process")
        now = probe(entry.best, dtype, threads)
        if now <= PROBE_MARGIN * entry.best.tflops:
            return cached
        return beaten(cached, now, "a start-of-run GEMM probe", dtype, threads) or cached
    if (dtype, threads) in _this_process:
        return _this_process[(dtype, threads)]
    m = measure(dtype, threads)
    legacy = entry.best if entry is not None else None
    if m.quiet:
        entry = entry or Entry(cpu_model(), dtype, threads, torch.__version__)
        entry.add(m)
        path = save_entry(entry)
        kept = entry.best
        note = f"measured quiet, cached{f' in {path}' if path else ''}"
        if kept is not m:
            note += f"; the older cached {kept.tflops:.4g} is higher and kept"
        return Calibrated(kept, False, note)
    served = legacy if legacy is not None and legacy.tflops > m.tflops else m
    why = (
        f"PROVISIONAL: this run measured {m.tflops:.4g} under load (others busy {m.others_busy:.2f} "
        f"cores > {busy_limit(threads, m.cores):.2f}), not cached"
    )
    if served is not m:
        why += f"; the unsettled {served.how} figure {served.tflops:.4g} is higher and used"
    result = Calibrated(served, True, why)
    _this_process[(dtype, threads)] = result
    return result


def probed_by_parent(dtype: str, threads: int) -> bool:
    version, *probed = os.environ.get(PROBED_ENV, "").split() or [""]
    return version == torch.__version__ and f"{dtype}/{threads}" in probed


def probe_for_children(kinds: tuple[str, ...], threads: int) -> str:
    """Serves (probing) each of ``kinds`` on ``threads`` threads in this process: the value of
    PROBED_ENV for child processes that would probe the same settled entries."""
    probed = []
    for kind in kinds:
        entry = load_entry(kind, threads)
        peak(kind, threads)
        if entry is not None and entry.settled:
            probed.append(f"{kind}/{threads}")
    return " ".join([torch.__version__, *probed])


def recalibrate(dtype: str, threads: int, rounds: int, how: str = "recalibrate") -> tuple[Measurement, Entry, bool]:
    """Measure again; store the measurement when quiet, or when it beats a settled best.
    Returns (measurement, entry, stored)."""
    m = measure(dtype, threads, rounds=rounds, how=how)
    entry = load_entry(dtype, threads) or Entry(cpu_model(), dtype, threads, torch.__version__)
    before = entry.best
    stored = bool(m.quiet or (entry.settled and before is not None and m.tflops > before.tflops))
    if stored:
        entry.add(m)
        save_entry(entry)
    _this_process.pop((dtype, threads), None)
    return m, entry, stored


def beaten(
    current: Calibrated, achieved_tflops: float, what: str, dtype: str, threads: int, rounds: int = 3
) -> Calibrated | None:
    """A run achieved ``achieved_tflops`` (``what``: a GEMM-bound stage or the step) above the
    peak it was measured against: the peak was underestimated. Re-measure; return the higher
    figure as the new peak (stored when quiet or when it beats a settled best), None if the
    figure stands."""
    if achieved_tflops <= current.measurement.tflops:
        return None
    m, entry, stored = recalibrate(dtype, threads, rounds, how=f"beaten by {what}")
    new = max([m, current.measurement] + ([entry.best] if entry.best else []), key=lambda x: x.tflops)
    note = (
        f"RE-MEASURED: {what} reached {achieved_tflops:.4g} TFLOP/s, above the peak "
        f"{current.measurement.tflops:.4g}; new best {new.tflops:.4g} "
        f"({'cached' if stored else 'not cached: machine busy'})"
    )
    if new.tflops < achieved_tflops:
        note += f"; {what} still beats it, so MFU there exceeds 100%"
    covered = entry.settled and entry.best is not None and new.tflops <= entry.best.tflops
    return Calibrated(new, not covered, note)
