"""Where a step's time goes, op by op, and how far each op is from what the hardware allows.

Recorded on an extra step of its own (never a timed one, nor the cost counters' step) by
OpRecorder, a TorchDispatchMode whose clock around an op holds the op alone; its own bookkeeping is
timed apart (``own_s``), so that the ops' times can be held against the step without it. Per call
of an op (aten, fbgemm, gembench's own: what the dispatcher sees, after autocast and composite
decompositions; an inductor graph shows the ops it calls out to; on a CPU its fused kernels are
timed too, by a profiler over the op step, as ops named ``inductor.<kernel>``, and their bytes
noted from the buffers each call is handed):

- time: wall time around the call; CPU ops are synchronous, and on CUDA the device is synchronised
  before and after, so the time is the op's kernels';
- FLOPs: torch's FLOP formulas (flop_registry, into which gembench registers its custom ops');
- bytes: read, the distinct tensors the op takes; written, the tensors it returns (a view moves
  nothing, an in-place op writes its output);
- stage: the stage the step's clock marked it in (``stage_ended``); block: the top-level module
  of the model it ran under (torch's ModuleTracker), forward or backward, else "other" (outside
  the model's modules, or inside a compiled graph, whose modules run no hooks).

``table`` rolls the calls into one row per (stage, block, op) and sets each against the roofline
of the device: an op of intensity I = FLOPs / bytes can run at min(peak, I x bandwidth), so its
time at the bound is max(FLOPs / peak, bytes / bandwidth); the rest is ``lost_s``. Rows are
sorted by time lost. A fused kernel's bytes are those of the buffers it is handed (fused.py); one
whose buffers went unseen (compiled during the op step) is bound "fused", its whole time lost.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry
from torch.utils.module_tracker import ModuleTracker

from gembench.harness.metrics import trace
from gembench.harness.metrics.counters import tensors_in
from gembench.harness.metrics.fused import FUSED_OP, KernelBytes

OUTSIDE = "outside stages"
ROOT = "model"  # the tracker's name of the model: a block is a top-level submodule of it
# inductor's CPU kernels, which it wraps in a profiler range of their name
# (torch._inductor.config.cpp.enable_kernel_profile, set where the stack compiles)
FUSED = "cpp_fused_"
STAGE_MARK = "gembench.stage_end:"  # a profiler range at each stage's end: the fused kernels' clock


def _nbytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the distinct tensors (one tensor passed twice is read once)."""
    seen, total = set(), 0
    for t in tensors:
        if t.device.type == "meta" or id(t) in seen:
            continue
        seen.add(id(t))
        total += t.numel() * t.element_size()
    return total


def _is_view(func) -> bool:
    """An op whose outputs alias its inputs without writing them: moves no data."""
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


class OpRecorder(TorchDispatchMode):
    """Every op of a step: its time, FLOPs, bytes, stage and block (see the module's docstring).

    ``split``: (first, second, inside) for stages that one call interleaves (the one-process
    forward: sparse_forward and dense_forward): an op that ``inside()`` says ran in ``first`` is
    filed there when the clock marks ``first``, the others under ``second``."""

    def __init__(
        self,
        device: torch.device,
        split: tuple[str, str, Callable[[], bool]] | None = None,
        model: torch.nn.Module | None = None,
    ):
        super().__init__()
        self.model = model
        self.cuda = torch.device(device).type == "cuda"
        self.split = split
        self.calls: list[list] = []  # [op, stage, block, seconds, flops, read, written, in first]
        self._pending = 0  # calls[_pending:] wait for the stage that ends next
        self._tracker = ModuleTracker()
        self._depth = 0
        self.own_s = 0.0  # the recorder's bookkeeping: FLOP formulas, byte counts, module lookups
        self._profile = None if self.cuda else trace.profiler(torch.device("cpu"), shapes=False)
        self._kernel_bytes = None if self.cuda else KernelBytes()

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True  # compiled code runs compiled under the mode (counters._Dispatched has why)

    def __enter__(self):
        if self.model is not None:  # every module named from the model's root, whoever calls it
            known = self._tracker._known_modules  # torch names a module first called alone by its class
            for top, child in self.model.named_children():
                for name, m in child.named_modules():
                    known[m] = f"{ROOT}.{top}" + (f".{name}" if name else "")
        self._tracker.__enter__()
        if self._profile is not None:
            start = time.perf_counter()
            self._kernel_bytes.__enter__()
            self._profile.__enter__()
            self.own_s += time.perf_counter() - start
        return super().__enter__()

    def __exit__(self, *exc):
        out = super().__exit__(*exc)
        self._tracker.__exit__(*exc)
        self.stage_ended(OUTSIDE)
        if self._profile is not None:
            start = time.perf_counter()
            self._profile.__exit__(*exc)
            self._kernel_bytes.__exit__(*exc)
            self.calls += self._fused_calls(self._profile.events())
            self.own_s += time.perf_counter() - start
        return out

    def stage_ended(self, stage: str) -> None:
        """The step's clock marked the end of ``stage``: the calls since the last mark ran in it."""
        for call in self.calls[self._pending :]:
            first = self.split is not None and stage == self.split[0]
            call[1] = stage if not first or call[7] else self.split[1]
        self._pending = len(self.calls)
        if self._profile is not None:
            with torch.profiler.record_function(STAGE_MARK + stage):
                pass

    def _fused_calls(self, events) -> list[list]:
        """The profiled fused kernels as calls, each in the stage whose end mark follows it (a
        compiled graph is dense work: never the split's first, interleaved stage)."""
        marks = sorted((e.time_range.start, e.name[len(STAGE_MARK) :]) for e in events if e.name.startswith(STAGE_MARK))
        calls = []
        for e in events:
            if FUSED not in e.name:
                continue
            stage = next((s for at, s in marks if at >= e.time_range.end), OUTSIDE)
            if self.split is not None and stage == self.split[0]:
                stage = self.split[1]
            seconds = (e.time_range.end - e.time_range.start) / 1e6
            read, written = self._kernel_bytes.take(e.name)
            calls.append([FUSED_OP + e.name, stage, "other", seconds, 0.0, read, written, False])
        return calls

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._depth:  # an op called inside another op's Python implementation: the outer one's
            return func(*args, **kwargs)
        entered = time.perf_counter()
        self._depth += 1
        try:
            if self.cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = func(*args, **kwargs)
            if self.cuda:
                torch.cuda.synchronize()
            end = time.perf_counter()
            seconds = end - start
        finally:
            self._depth -= 1
        packet = func._overloadpacket
        flops = float(flop_registry[packet](*args, **kwargs, out_val=out)) if packet in flop_registry else 0.0
        if _is_view(func):
            read = written = 0
        else:
            read = _nbytes(tensors_in(list(args) + list(kwargs.values())))
            written = _nbytes(tensors_in([out]))
        inside = self.split is not None and self.split[2]()
        self.calls.append([str(func), None, self._block(), seconds, flops, read, written, inside])
        self.own_s += (start - entered) + (time.perf_counter() - end)
        return out

    def _block(self) -> str:
        top = sorted(p.split(".")[1] for p in self._tracker.parents if p.startswith(ROOT + "."))
        return top[0] if top else "other"


def table(calls: list[list], peak_tflops: float, bandwidth_gbs: float) -> list[dict]:
    """One row per (stage, block, op) of ``calls`` (OpRecorder.calls), against the roofline of
    ``peak_tflops`` and ``bandwidth_gbs``; sorted by time lost, the largest first."""
    rows: dict[tuple, dict] = {}
    for op, stage, block, seconds, flops, read, written, _ in calls:
        r = rows.setdefault(
            (stage, block, op),
            {
                "stage": stage,
                "block": block,
                "op": op,
                "calls": 0,
                "time_s": 0.0,
                "flops": 0.0,
                "read": 0,
                "written": 0,
            },
        )
        r["calls"] += 1
        r["time_s"] += seconds
        r["flops"] += flops
        r["read"] += read
        r["written"] += written
    out = []
    for r in rows.values():
        if r["op"].startswith(FUSED_OP) and not r["read"] + r["written"]:  # bytes unseen: no bound, all lost
            t = r["time_s"]
            out.append(
                r | {"tflops": 0.0, "gbs": 0.0, "intensity": None, "bound": "fused", "bound_s": 0.0, "lost_s": t}
            )
            continue
        moved = r["read"] + r["written"]
        compute_s, memory_s = r["flops"] / (peak_tflops * 1e12), moved / (bandwidth_gbs * 1e9)
        bound = max(compute_s, memory_s)
        t = r["time_s"]
        out.append(
            r
            | {
                "tflops": r["flops"] / t / 1e12 if t > 0 else 0.0,
                "gbs": moved / t / 1e9 if t > 0 else 0.0,
                "intensity": r["flops"] / moved if moved else None,
                "bound": "compute" if compute_s >= memory_s else "memory",
                "bound_s": bound,
                "lost_s": max(t - bound, 0.0),
            }
        )
    return sorted(out, key=lambda r: -r["lost_s"])


def summary(rows: list[dict], step_s: float) -> dict:
    """The table's totals: time covered (of the op step's ``step_s``), FLOPs, bytes, time lost."""
    time_s = sum(r["time_s"] for r in rows)
    return {
        "ops": len(rows),
        "calls": sum(r["calls"] for r in rows),
        "time_s": time_s,
        "step_s": step_s,
        "coverage": time_s / step_s if step_s > 0 else None,
        "flops": sum(r["flops"] for r in rows),
        "bytes": sum(r["read"] + r["written"] for r in rows),
        "lost_s": sum(r["lost_s"] for r in rows),
    }
