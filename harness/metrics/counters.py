"""Cost counters of one training step: what the step asks of the host and the device.

Counted on extra steps after the timed ones (never inside them): ops and host syncs on one,
kernels and bytes on the next, under torch.profiler (the counting mode re-dispatches every op,
which a profiler of the same step would record twice). The compile counts cover the whole
run, because that is where compiling happens. All are lower-is-better and
deterministic for a seed (the same code over the same batches dispatches the same ops):

  aten_ops      ops in the ``aten`` namespace that the step dispatches, as a TorchDispatchMode
                sees them: the ops Python code, TorchRec and autograd call (after autocast and
                composite decompositions), not the ops an op's own kernel calls inside it. So a
                custom op (the tiled jagged attention, fbgemm's TBE) counts as one call of its
                own namespace and adds none, and an inductor graph counts the ops it calls out to.
  aten_op_counts  the same ops by name and overload ({"aten.mm.default": 12, ...}): what a
                change of aten_ops consists of (regression/opdiff.py lists the difference).
  host_syncs    CUDA: the synchronising calls ``torch.cuda.set_sync_debug_mode("warn")`` reports
                during the step, wherever they come from (TorchRec, fbgemm, our ops).
                CPU, where nothing synchronises: the host reads of tensor values that would
                (HOST_READ_OPS: item / bool / int / float, nonzero and other ops whose output size
                depends on the data; copies from a device to the CPU; ``Tensor.tolist``), outside
                custom ops (the CPU-only tiled attention plans its tiles on the host by design)
                and except the optimizers' step counters, which stay on the CPU in GPU runs too.
  h2d_bytes     CUDA: bytes of the profiler's host-to-device memcpy records in the step. CPU: 0,
                the device is the host and the data stage moves nothing.
  kernels       CUDA: kernels the profiler records in the step; None on CPU.
  graph_breaks  torch._dynamo graph breaks over the whole run (warm-up included).
  recompiles    torch._dynamo compilations of a frame it had compiled before, over the whole run.

Use: ``snapshot = compile_snapshot()`` when the run starts; around the extra step,
``with StepCounter(device) as c: step()``; a step under torch.profiler for its trace events;
then ``counters(c, trace_events, compile_counts(snapshot))``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

KEYS = ("aten_ops", "host_syncs", "h2d_bytes", "kernels", "graph_breaks", "recompiles")

# aten ops that read tensor values on the host: their result (a Python scalar, or an output whose
# size depends on the data) needs the device to finish first.
HOST_READ_OPS = frozenset(
    {
        "_local_scalar_dense",  # Tensor.item, bool(t), int(t), float(t), t.__index__
        "nonzero",
        "nonzero_numpy",
        "argwhere",
        "masked_select",
        "unique",
        "_unique",
        "_unique2",
        "unique_consecutive",
        "unique_dim",
        "equal",
        "is_nonzero",
    }
)
COPY_OPS = frozenset({"_to_copy", "copy_", "_copy_from", "_copy_from_and_resize"})
SYNC_WARNING = "synchronizing CUDA operation"  # the text of sync debug mode's warning


def tensors_in(args) -> list[torch.Tensor]:
    """The tensors among ``args``, lists and tuples opened."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(tensors_in(a))
    return out


def host_resident(optimizers) -> set[int]:
    """ids of the optimizers' step counters that live on the CPU.

    torch.optim keeps ``state["step"]`` on the CPU unless capturable or fused, in a GPU run too,
    and reads it with ``item()`` in every step: a host read that never waits for a device.
    """
    out = set()
    for opt in optimizers:
        for st in getattr(opt, "state", {}).values():
            step = st.get("step") if isinstance(st, dict) else None
            if isinstance(step, torch.Tensor) and step.device.type == "cpu":
                out.add(id(step))
    return out


def is_host_read(func, args, kwargs, out, exempt: set[int] = frozenset()) -> bool:
    """Whether one dispatched aten op reads tensor values on the host (see HOST_READ_OPS);
    reads of the tensors in ``exempt`` (ids, see ``host_resident``) are not counted."""
    name = func._schema.name.split("::", 1)[-1]
    if name == "_local_scalar_dense" and id(args[0]) in exempt:
        return False
    if name in HOST_READ_OPS:
        return True
    if name == "repeat_interleave" and kwargs.get("output_size") is None and len(args) < 3:
        return func._overloadname in ("Tensor", "self_Tensor")  # size from the repeats' values
    if name == "index" and any(t.dtype == torch.bool for t in tensors_in(args[1:])):
        return True  # a boolean mask index runs nonzero on it
    if name in COPY_OPS:
        tensors = tensors_in(args)
        src = tensors[-1] if name == "copy_" else tensors[0] if tensors else None
        dst = out if isinstance(out, torch.Tensor) else (tensors[0] if tensors else None)
        return src is not None and dst is not None and src.device.type != "cpu" and dst.device.type == "cpu"
    return False


class _Dispatched(TorchDispatchMode):
    """Counts aten ops and host reads; ops inside an op's own kernel run below the mode, unseen."""

    def __init__(self, owner: "StepCounter"):
        super().__init__()
        self.owner = owner

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # True: compiled code runs compiled under this mode, which sees the ops it calls out to
        # (the default makes torch.compile fall back to eager whenever a dispatch mode is on,
        # and the count would be the eager step's). Consulted by torch >= 2.9's dynamo.
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.owner._depth += 1  # inside an op: its own tolist calls are its business
        try:
            out = func(*args, **kwargs)
        finally:
            self.owner._depth -= 1
        if func.namespace == "aten":
            self.owner.aten_ops += 1
            name = str(func)  # aten.mm.default: the op and its overload, as torch names it
            self.owner.op_counts[name] = self.owner.op_counts.get(name, 0) + 1
            if not self.owner._in_tolist and is_host_read(func, args, kwargs, out, self.owner.exempt):
                self.owner.host_reads += 1
        return out


class StepCounter:
    """Context manager around one step: counts its aten ops, host reads and (CUDA) syncs.

    ``Tensor.tolist`` reads CPU tensors without dispatching anything, so it is wrapped for the
    duration: counted when called outside any op (not inside a custom op's implementation, as
    the tiled attention's host plan is), and its own device-to-host copy is not counted twice.
    """

    def __init__(self, device: torch.device, optimizers=()):
        self.device = torch.device(device)
        self.optimizers = optimizers  # their CPU step counters are exempt (host_resident)
        self.aten_ops = 0
        self.op_counts: dict[str, int] = {}  # aten_ops by op name
        self.host_reads = 0
        self.cuda_syncs: int | None = None
        self._in_tolist = False
        self._depth = 0

    def __enter__(self) -> "StepCounter":
        owner = self
        self.exempt = host_resident(self.optimizers)
        original = torch.Tensor.tolist

        def tolist(t, *args, **kwargs):
            if owner._in_tolist or owner._depth:
                return original(t, *args, **kwargs)
            owner.host_reads += 1
            owner._in_tolist = True
            try:
                return original(t, *args, **kwargs)
            finally:
                owner._in_tolist = False

        self._own_tolist = "tolist" in torch.Tensor.__dict__  # else inherited from TensorBase
        self._original_tolist = original
        torch.Tensor.tolist = tolist
        self._warnings = None
        if self.device.type == "cuda":
            self._sync_mode = torch.cuda.get_sync_debug_mode()
            self._warnings = warnings.catch_warnings(record=True)
            self._caught = self._warnings.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        self._mode = _Dispatched(self)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        if self._own_tolist:
            torch.Tensor.tolist = self._original_tolist
        else:
            del torch.Tensor.tolist
        if self._warnings is not None:
            torch.cuda.set_sync_debug_mode(self._sync_mode)
            self._warnings.__exit__(*exc)
            self.cuda_syncs = sum(SYNC_WARNING in str(w.message) for w in self._caught)
            # the rest of the step's warnings still reach the user as they would have
            for w in self._caught:
                if SYNC_WARNING not in str(w.message):
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

    @property
    def host_syncs(self) -> int:
        return self.cuda_syncs if self.cuda_syncs is not None else self.host_reads


# -- profiler trace events -> device counts ---------------------------------------------------


def device_counts(events: Sequence[dict], window: tuple[float, float] | None = None) -> dict:
    """Kernels launched and host-to-device bytes in a Chrome trace's events (``ts`` in us).

    ``window`` (start, end) keeps the device events that start inside it (one step of several).
    """
    kernels = h2d = 0
    for e in events:
        if e.get("ph") != "X" or (window and not window[0] <= e.get("ts", 0) <= window[1]):
            continue
        cat = e.get("cat", "")
        if cat == "kernel":
            kernels += 1
        elif cat == "gpu_memcpy" and "HtoD" in e.get("name", ""):
            h2d += int(e.get("args", {}).get("bytes", 0))
    return {"kernels": kernels, "h2d_bytes": h2d}


# -- torch.compile ----------------------------------------------------------------------------


def compile_snapshot() -> dict:
    """Dynamo's counts so far; ``compile_counts(snapshot)`` gives the run's own."""
    from torch._dynamo.utils import counters, get_compilation_metrics

    return {
        "graph_breaks": sum(counters["graph_break"].values()),
        "metrics": {id(m) for m in get_compilation_metrics()},
    }


# frames the harness compiles for itself, not the model's: the FP8 activation codec compiles once
# per dtype and layout of what is saved (harness/train/activations.py), by design
HARNESS_FRAMES = ("harness/train/activations.py",)


def compile_counts(since: dict) -> dict:
    """Graph breaks and recompiles of the model's frames since ``since`` (a compilation whose
    metrics name a recompile reason compiled a frame that had a cache entry already)."""
    from torch._dynamo.utils import counters, get_compilation_metrics

    new = [m for m in get_compilation_metrics() if id(m) not in since["metrics"]]
    own = lambda m: str(getattr(m, "co_filename", "")).endswith(HARNESS_FRAMES)  # noqa: E731
    return {
        "graph_breaks": sum(counters["graph_break"].values()) - since["graph_breaks"],
        "recompiles": sum(1 for m in new if getattr(m, "recompile_reason", None) and not own(m)),
    }


def fresh_compile_state() -> dict:
    """Forget what this process compiled before, then snapshot: a run's recompiles are its
    own (a second model of the same code would otherwise count as a recompile of the first,
    and spend dynamo's recompile limit)."""
    torch._dynamo.reset()
    return compile_snapshot()


# -- the result fields ------------------------------------------------------------------------


def source(device: torch.device) -> str:
    if torch.device(device).type == "cuda":
        return (
            "extra steps after the timed ones: aten ops seen by a TorchDispatchMode; host "
            "syncs = calls torch.cuda.set_sync_debug_mode('warn') reported; kernels and "
            "host-to-device bytes from torch.profiler on the next step (kernel events, HtoD "
            "memcpy); graph breaks and recompiles from torch._dynamo over the whole run"
        )
    return (
        "extra steps after the timed ones on the CPU: aten ops seen by a TorchDispatchMode; "
        "host syncs = host reads of tensor values that would sync a GPU (item/bool/int/float, "
        "tolist, nonzero and data-sized ops, device-to-CPU copies) outside custom ops, "
        "optimizer step counters (CPU-resident on GPUs too) exempt; h2d_bytes 0 (the device "
        "is the host); kernels null (no device kernels); graph breaks and recompiles from "
        "torch._dynamo over the whole run"
    )


def counters(
    step: StepCounter, events: Sequence[dict], compiled: dict, window: tuple[float, float] | None = None
) -> dict:
    """``result["counters"]`` from a finished StepCounter, the step's trace events and
    ``compile_counts``."""
    cuda = step.device.type == "cuda"
    dev = device_counts(events, window)
    return {
        "aten_ops": step.aten_ops,
        "aten_op_counts": dict(sorted(step.op_counts.items())),
        "host_syncs": step.host_syncs,
        "h2d_bytes": dev["h2d_bytes"] if cuda else 0,
        "kernels": dev["kernels"] if cuda else None,
        "graph_breaks": compiled["graph_breaks"],
        "recompiles": compiled["recompiles"],
        "source": source(step.device),
    }


def flat_metrics(counts: dict) -> dict:
    """The numbers of ``counts`` for ``result["metrics"]`` (kernels only when measured)."""
    return {k: counts[k] for k in KEYS if counts.get(k) is not None}
