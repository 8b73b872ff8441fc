"""Memory of a run: will it fit (the estimate against the device's free memory, before anything
is allocated), and what it really took (the measured peak, comparable with the estimate).

The estimate itself is ``memory_estimate``: the workload's own where it gives one (the zoo's,
models/memory.py), else from its parameter shapes.
"""

from __future__ import annotations

import resource

import torch
from torch import nn

from gembench.errors import UsageError
from gembench.harness.device.hardware import memory_available
from gembench.harness.train import activations
from gembench.harness.train.parallelize import embedding_parameters, fsdp_units
from gembench.harness.train.stack import STACKS, StackOptions, stack_label
from gembench.loader import named
from gembench.workload import Workload

FIT_SHARE = 0.9  # of the free memory a run may plan to use: the allocator fragments the rest
ADAM_BYTES = 8  # Adam's m and v, fp32, per dense parameter
ADAGRAD_BYTES = 4  # exact Adagrad's sum, fp32, per embedding element


def parameter_shapes(workload: Workload, model: nn.Module | None = None) -> dict[str, int]:
    """Table and dense parameter counts and the largest FSDP unit's, from the meta build (``model``,
    if one is at hand)."""
    model = workload.build(torch.device("meta")) if model is None else model
    tables = embedding_parameters(model)
    emb = sum(p.numel() for p in model.parameters() if id(p) in tables)
    dense = sum(p.numel() for p in model.parameters() if id(p) not in tables)
    blocks, _ = fsdp_units(workload, model) if dense else ([], [])
    largest = max((sum(p.numel() for p in m.parameters()) for _, m in blocks), default=0)
    return {
        "embedding_rows": sum(t.num_embeddings for t in workload.tables()),
        "embedding_params": emb,
        "dense_params": dense,
        "total_params": emb + dense,
        "largest_block_params": largest,
    }


PARTS = ("embeddings", "dense", "activations", "transient", "build", "runtime")


def memory_estimate(
    workload: Workload,
    counts: dict,
    batch: int,
    options,
    device_type: str,
    dense_shards: int = 1,
    embedding_share: float = 1.0,
    on_rank: bool = False,
) -> dict[str, float]:
    """Training memory of one process or rank at ``batch`` examples, by part, and its total, as
    models/memory.py defines them: total = max(build, embeddings + dense + activations +
    transient) + runtime. What the workload estimates itself (memory_estimate(); the zoo: every
    part) stands; the rest is from the parameter shapes: tables fp32 + Adagrad state (+ a dense
    gradient without fused tables, + the plain tables while the fused ones are built), dense
    weights, gradients, Adam m and v (+ a bf16 copy), split over ``dense_shards`` under FSDP2;
    activations and the runtime's growth 0 (not estimated: the measured peak is the figure)."""
    fused = getattr(options, "fused_embeddings", True)  # None: the optimized stack
    emb = counts["embedding_params"] * (4 + ADAGRAD_BYTES + (0 if fused else 4))
    build = emb + counts["embedding_params"] * 4 * (1 if fused else 0)
    if embedding_share < 1.0:  # a rank builds every plain table, then DMP keeps its shards (fused)
        emb *= embedding_share
        build = counts["embedding_params"] * 4 + emb
    cast = 2 if getattr(options, "bf16", True) else 0
    parts = {
        "embeddings": float(emb),
        "dense": float(counts["dense_params"] * (4 + 4 + ADAM_BYTES + cast) / dense_shards),
        "activations": 0.0,
        "transient": 0.0,
        "build": float(build),
        "runtime": 0.0,
    }
    given = workload.memory_estimate(
        batch, options, device_type, dense_shards, embedding_share=embedding_share, on_rank=on_rank
    )
    parts.update({k: float(v) for k, v in (given or {}).items() if k in PARTS})
    steady = sum(parts[k] for k in ("embeddings", "dense", "activations", "transient"))
    return {**parts, "total": float(max(parts["build"], steady) + parts["runtime"])}


def activations_estimated(workload: Workload) -> bool:
    """Whether the workload estimates its own activations (memory_estimate() overridden)."""
    return type(workload).memory_estimate is not Workload.memory_estimate


def combined_estimate(estimates: list[dict]) -> dict:
    """One process holding several stacks' states (--ab, built one after the other) and running
    them one at a time: every state stays resident, activations of one stack at a time."""
    if len(estimates) == 1:
        return estimates[0]
    resident = [e["embeddings"] + e["dense"] for e in estimates]
    working = max(e["activations"] + e["transient"] for e in estimates)
    last_build = sum(resident[:-1]) + estimates[-1]["build"]  # the last stack built while the rest live
    out = {k: float(sum(e[k] for e in estimates)) for k in ("embeddings", "dense")}
    out.update(
        activations=max(e["activations"] for e in estimates),
        transient=max(e["transient"] for e in estimates),
        build=float(last_build),
        runtime=max(e["runtime"] for e in estimates),
    )
    out["total"] = float(max(sum(resident) + working, last_build) + out["runtime"])
    return out


def stacks_estimate(
    workload: Workload, counts: dict, batch_size: int, stacks: list[StackOptions], device_type: str
) -> dict:
    """One process holding ``stacks`` (each as it runs the workload: for_stack), at ``batch_size``."""
    return combined_estimate(
        [memory_estimate(workload.for_stack(s), counts, batch_size, s, device_type) for s in stacks]
    )


def largest_fitting_batch(
    workload: Workload,
    counts: dict,
    stacks: list[StackOptions],
    device_type: str,
    available: float,
    upto: int | None = None,
) -> int:
    """The largest batch (<= upto) whose estimate fits ``available`` bytes; 0 if none does."""
    fits = lambda b: stacks_estimate(workload, counts, b, stacks, device_type)["total"] <= available  # noqa: E731
    lo, hi = 0, upto or workload.global_batch
    while lo < hi:  # the estimate grows with the batch: bisect
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def fit_hint(
    workload: Workload,
    counts: dict,
    stacks: list[StackOptions],
    device_type: str,
    available: float,
    upto: int | None = None,
) -> str:
    best = largest_fitting_batch(workload, counts, stacks, device_type, available, upto)
    if best == 0:
        return (
            "it does not fit at any batch (its tables and dense state alone are too large): "
            "pick a smaller model (see `gembench describe`)"
        )
    return f"the estimate fits --batch {best} or smaller"


def check_fits(
    workload: Workload,
    counts: dict,
    batch_size: int,
    device: torch.device,
    stacks: list[StackOptions] | None = None,
) -> dict:
    """Refuse, before allocating anything, a run whose estimated peak exceeds the device's free memory.

    ``stacks``: the stacks the process will hold (two for --ab); default the optimized one.
    ``counts``: parameter_shapes of the workload.
    """
    stacks = stacks or [STACKS["optimized"]]
    estimate = stacks_estimate(workload, counts, batch_size, stacks, device.type)
    available = memory_available(device)
    if estimate["total"] > FIT_SHARE * available:
        gib = 2**30
        names = " + ".join(stack_label(s) for s in stacks)
        raise UsageError(
            f"{named(workload)} needs about {estimate['total'] / gib:,.1f} GiB at batch {batch_size} "
            f"with the {names} stack{'s' if len(stacks) > 1 else ''} "
            f"(embeddings {estimate['embeddings'] / gib:,.1f}, dense {estimate['dense'] / gib:,.1f}, "
            f"activations {estimate['activations'] / gib:,.1f}, transient {estimate['transient'] / gib:,.1f}) "
            f"but {device.type} has {available / gib:,.1f} GiB free; "
            f"{fit_hint(workload, counts, stacks, device.type, FIT_SHARE * available, batch_size)}"
        )
    return estimate


def reset_peak_memory(device: torch.device) -> int:
    """Start a new peak: several runs in one process (asv, --ab, ablate) must not inherit one.

    Returns the memory in use now (CUDA: allocated by tensors; CPU: resident set less file pages),
    the floor that run_memory_bytes subtracts on CPU.
    """
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return int(torch.cuda.memory_allocated(device))
    release_free_heap()
    try:  # Linux: writing 5 to clear_refs resets the process's peak RSS (VmHWM)
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass
    now = _proc_status("VmRSS", "RssFile")
    return now["VmRSS"] - now["RssFile"]


def release_free_heap() -> None:
    """Hand memory that earlier work freed back to the OS (glibc's malloc_trim), so the run's RSS rise
    is its own: a peak calibration in the same process (a cold cache) left ~20 MiB free in the heap
    that tiny's run then reused without its RSS rising (measured rise 23 MiB instead of 41 MiB)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim this way
        pass


def _proc_status(*fields: str) -> dict[str, int]:
    """These fields of /proc/self/status in bytes, read in one pass; 0 for each it lacks (no /proc)."""
    found = dict.fromkeys(fields, 0)
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                name, _, value = line.partition(":")
                if name in found:
                    found[name] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return found


def run_memory_bytes(device: torch.device, start: int) -> tuple[int, str]:
    """The run's measured peak, comparable with memory_estimate: CUDA, the tensors' peak
    (max_memory_allocated); CPU, how far the resident set, file pages excepted, rose above
    ``start`` (the Python, torch and torchrec runtime loaded before the run is not the run's:
    CPU_RUNTIME_BYTES models what the run itself adds besides tensors).

    File pages (RssFile: the libraries' code and data) are not the run's memory either: a rank
    forked from the launcher holds none of them until it touches them (fork copies no
    file-backed page tables), so its RSS would rise by torch's code as it runs, where a fresh
    process had read it in at import."""
    peak, source = peak_memory_bytes(device)
    if device.type == "cuda":
        return peak, source
    return (
        max(0, peak - _proc_status("RssFile")["RssFile"] - start),
        "rise of the process's peak RSS over its RSS when the run began, file pages excepted",
    )


class SavedForBackward:
    """Around one training step's forward and backward: the activation memory it held, measured.

    Counts the bytes of every distinct storage autograd saved for the backward
    (torch.autograd.graph.saved_tensors_hooks, torch.compile's graphs included), parameters
    excepted: what activation checkpointing trades for recompute. A checkpointed block's own
    saves go through checkpointing's hooks and are not held, so only its inputs count here.
    Hooks do not nest: hooks entered inside these (FP8 activations) report what they hold to the
    one counting, ``activations.counting``.
    """

    def __init__(self, params):
        self.params = {ptr for ptr in map(_storage_ptr, params) if ptr is not None}
        self.storages: dict[int, int] = {}

    def count(self, t) -> None:
        if t.is_leaf and t.requires_grad:  # a weight the model does not list (fbgemm's flat table buffer)
            return
        ptr = _storage_ptr(t)
        if ptr is not None and ptr not in self.params:
            self.storages[ptr] = t.untyped_storage().nbytes()

    def _pack(self, t):
        self.count(t)
        return t

    def __enter__(self) -> "SavedForBackward":
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        activations.counting = self
        return self

    def __exit__(self, *exc) -> None:
        activations.counting = None
        self._hooks.__exit__(*exc)

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())


def _storage_ptr(t) -> int | None:
    """Where ``t``'s storage starts; None for tensors without one of their own: DTensor, sparse and
    fake tensors, and FSDP2's unsharded parameters between gathers (storage freed to size 0)."""
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, AttributeError):
        return None


def memory_fields(estimate: dict, measured: int, source: str) -> dict:
    """Estimate and measured peak side by side, for every result's summary."""
    return {
        "peak_memory_estimate_bytes": estimate["total"],
        "peak_memory_run_bytes": measured,
        "peak_memory_run_source": source,
        "memory_estimate_ratio": estimate["total"] / measured if measured else None,
    }


def peak_memory_bytes(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "torch.cuda.max_memory_allocated"
    hwm = _proc_status("VmHWM")["VmHWM"]
    if hwm:
        return hwm, "peak RSS of the process since the run began"
    # ru_maxrss (KiB on Linux) never resets: the peak of the whole process's life.
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "peak RSS of the process"
