"""Communication overhead: pure functions from torch.profiler trace events to numbers.

Input: the ``traceEvents`` of one rank's Chrome trace (dicts with name, ph, ts and dur in
microseconds, tid, cat, args), as ``torch.profiler`` writes them with ``record_shapes=True``.

Where collectives show up (gloo, CPU):
  - ``c10d::<op>`` on the calling thread: only the queueing of the work, but with every argument's
    shape and dtype, and inside the annotations that say what it is for (TorchRec's
    "## all2all_data:kjt ... ##", the autograd backward, gembench's "gembench/<stage>").
  - ``gloo:<op>`` on one of gloo's worker threads: the real time, from the start of the transfer
    to its end, waiting for slower peers included (so bandwidths below are lower bounds).
Gloo's worker threads pop work in submission order, so the k-th ``c10d::`` call pairs with the
k-th ``gloo:`` event of a compatible op (gloo runs a reduce-scatter as an all-reduce).
There is no ``record_param_comms`` on gloo, so bytes come from shapes x dtype size.

Per collective kind: calls, bytes, time, algbw = bytes / time and busbw = algbw x factor, with
the nccl-tests factors (all-reduce 2(n-1)/n; reduce-scatter, all-gather, all-to-all (n-1)/n) and
nccl-tests' sizes (all-to-all: the send buffer; reduce-scatter: the full input; all-gather: the
full output; all-reduce: the buffer).

Exposure (HTA's interval algebra): C = union of communication intervals, K = union of compute
intervals (operators on the compute threads, minus those that only wait); overlapped = |C and K|,
exposed = |C minus K|, exposed fraction = exposed / step time.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

Interval = tuple[float, float]

# profiler "Input type" strings -> bytes per element
DTYPE_BYTES = {
    "float": 4,
    "double": 8,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "long int": 8,
    "int": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
}

# c10d operator (after "c10d::") -> collective family
C10D_FAMILY = {
    "alltoall_base_": "all_to_all",
    "alltoall_": "all_to_all",
    "allreduce_": "all_reduce",
    "allreduce_coalesced_": "all_reduce",
    "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "_allgather_base_": "all_gather",
    "allgather_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather",
    "broadcast_": "broadcast",
    "reduce_": "reduce",
    "gather_": "gather",
    "scatter_": "scatter",
    "barrier": "barrier",
}
# which gloo worker events may carry each family (gloo emulates reduce-scatter by all-reduce)
GLOO_OPS = {
    "all_to_all": {"all_to_all", "alltoall"},
    "all_reduce": {"all_reduce", "allreduce"},
    "reduce_scatter": {"reduce_scatter", "all_reduce", "allreduce"},
    "all_gather": {"all_gather", "allgather"},
    "broadcast": {"broadcast"},
    "reduce": {"reduce"},
    "gather": {"gather"},
    "scatter": {"scatter"},
    "barrier": {"barrier", "all_reduce", "allreduce"},
}


def bus_factor(family: str, n: int) -> float:
    """nccl-tests' busbw / algbw for ``n`` ranks: the share of data that crosses a link."""
    if n <= 1:
        return 0.0
    if family == "all_reduce":
        return 2 * (n - 1) / n
    if family in ("reduce_scatter", "all_gather", "all_to_all"):
        return (n - 1) / n
    return 1.0


# -- interval algebra ----------------------------------------------------------------------


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same points as ``intervals``."""
    out: list[list[float]] = []
    for a, b in sorted((float(a), float(b)) for a, b in intervals if b > a):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def length(intervals: Iterable[Interval]) -> float:
    return sum(b - a for a, b in union(intervals))


def intersect(x: Iterable[Interval], y: Iterable[Interval]) -> list[Interval]:
    """Points in both: a two-pointer sweep over the two unions."""
    xs, ys, out, i, j = union(x), union(y), [], 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if a < b:
            out.append((a, b))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(x: Iterable[Interval], y: Iterable[Interval]) -> list[Interval]:
    """Points of ``x`` not in ``y``."""
    out = []
    ys = union(y)
    for a, b in union(x):
        cur = a
        for c, d in ys:
            if d <= cur or c >= b:
                continue
            if c > cur:
                out.append((cur, c))
            cur = max(cur, d)
            if cur >= b:
                break
        if cur < b:
            out.append((cur, b))
    return out


def exposure(comm: Sequence[Interval], compute: Sequence[Interval], step_s: float) -> dict:
    """Overlapped and exposed communication (seconds, from intervals in seconds)."""
    c = length(comm)
    overlapped = length(intersect(comm, compute))
    exposed = length(subtract(comm, compute))
    return {
        "comm_s": c,
        "overlapped_s": overlapped,
        "exposed_s": exposed,
        "overlap_fraction": overlapped / c if c > 0 else 0.0,
        "exposed_fraction": exposed / step_s if step_s > 0 else 0.0,
    }


# -- trace events --------------------------------------------------------------------------


def tensor_bytes(dims, dtype: str) -> int:
    """Bytes of one argument: a shape [d0, d1, ...] or a list of shapes (tensor lists)."""
    if not dims:
        return 0
    if isinstance(dims[0], list):
        return sum(tensor_bytes(d, dtype) for d in dims)
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown profiler dtype {dtype!r}: add it to DTYPE_BYTES")
    return math.prod(dims) * DTYPE_BYTES[dtype]


def message_bytes(family: str, event: dict, worker: bool = False) -> int:
    """nccl-tests' message size of a ``c10d::`` event from its recorded argument shapes.

    0 when the profiler recorded no element type (tensor lists show as "TensorList"); the
    caller then takes the size from the ``worker`` event, which has one: an all-reduce's lists
    every tensor it reduces (several when coalesced), the others' their first argument.
    """
    args = event.get("args", {})
    dims, types = args.get("Input Dims", []), args.get("Input type", [])
    sizes = [tensor_bytes(d, t) if t in DTYPE_BYTES else 0 for d, t in zip(dims, types)]
    if worker:
        return sum(sizes) if family == "all_reduce" else (sizes[0] if sizes else 0)
    if family == "all_to_all":  # (output, input, ...): the send buffer
        return sizes[1] if len(sizes) > 1 else (sizes[0] if sizes else 0)
    if family in ("reduce_scatter", "all_gather"):  # the full (larger) buffer
        return max(sizes[:2]) if sizes else 0
    return sizes[0] if sizes else 0


def _op(event: dict) -> str:
    return event["name"].split(":", 2)[-1] if event["name"].startswith("c10d::") else ""


def is_c10d(event: dict) -> bool:
    return event.get("ph") == "X" and event["name"].startswith("c10d::") and _op(event) in C10D_FAMILY


def is_gloo(event: dict) -> bool:
    return event.get("ph") == "X" and event["name"].startswith("gloo:")


def enclosing(event: dict, spans: Sequence[dict]) -> list[str]:
    """Names of the spans on ``event``'s thread that contain it, outermost first."""
    s, e = event["ts"], event["ts"] + event.get("dur", 0)
    inside = [
        x
        for x in spans
        if x["tid"] == event["tid"] and x is not event and x["ts"] <= s and x["ts"] + x.get("dur", 0) >= e
    ]
    return [x["name"] for x in sorted(inside, key=lambda x: (x["ts"], -x.get("dur", 0)))]


def classify(family: str, context: Sequence[str]) -> str:
    """The collective's job, from its family and the annotations around it.

    kjt_all_to_all: IDs (lengths, values, splits) to the ranks owning their shards (input dist)
    embedding_all_to_all / embedding_reduce_scatter: looked-up embeddings back (output dist)
    embedding_grad_*: their gradients in the backward pass
    dense_grad_all_reduce: data-parallel gradient averaging (explicit, DDP's buckets, or HSDP's
        replicas)
    dense_param_all_gather / dense_grad_reduce_scatter: FSDP2's (inside its "FSDP::" spans):
        a block's parameters gathered before its forward or backward, its gradients reduce-scattered
    embedding_replica_sync: 2D sparse parallelism's averaging of a shard's replicas (weights and
        optimizer state) across the groups
    """
    ctx = " ".join(context).lower()
    if "replica_sync" in ctx or "2d_weight_sync" in ctx or "2d_optimizer_sync" in ctx:
        return "embedding_replica_sync"
    if "fsdp::" in ctx:
        if family == "all_gather":
            return "dense_param_all_gather"
        if family == "reduce_scatter":
            return "dense_grad_reduce_scatter"
        if family == "all_reduce":
            return "dense_grad_all_reduce"
    # autograd's engine: a gradient hook's collective (DDP's reducer fires from AccumulateGrad)
    backward = "backward" in ctx or "_bwd" in ctx or "autograd::engine" in ctx
    if family == "all_to_all":
        if any(m in ctx for m in ("kjt", "splits", "input_dist", "sparse_data_dist")):
            return "kjt_all_to_all"
        return "embedding_grad_all_to_all" if backward else "embedding_all_to_all"
    if family == "reduce_scatter":
        return "embedding_grad_reduce_scatter" if backward else "embedding_reduce_scatter"
    if family == "all_gather":
        return "embedding_grad_all_gather" if backward else "embedding_all_gather"
    if family == "all_reduce" and ("grad_sync" in ctx or "ddp" in ctx or backward):
        return "dense_grad_all_reduce"
    return family


def collectives(events: Sequence[dict]) -> list[dict]:
    """Every collective of a trace: family, kind, bytes and the interval (us) it really took."""
    calls = sorted((e for e in events if is_c10d(e)), key=lambda e: e["ts"])
    workers = sorted((e for e in events if is_gloo(e)), key=lambda e: e["ts"])
    spans = [
        e
        for e in events
        if e.get("ph") == "X"
        and not is_gloo(e)
        and e.get("cat") in ("user_annotation", "cpu_op", "gpu_user_annotation", None)
    ]
    out, used = [], set()
    for call in calls:
        family = C10D_FAMILY[_op(call)]
        # the first unused worker event of a compatible op that starts after the call was queued
        match = next(
            (
                k
                for k, w in enumerate(workers)
                if k not in used and w["name"][5:] in GLOO_OPS.get(family, {family}) and w["ts"] >= call["ts"] - 1.0
            ),
            None,
        )
        if match is not None:
            used.add(match)
            w = workers[match]
            start, end = w["ts"], w["ts"] + w.get("dur", 0)
            size = message_bytes(family, call) or message_bytes(family, w, worker=True)
        else:  # no worker event (nccl without kernels traced): the call's own span, a lower bound
            start, end = call["ts"], call["ts"] + call.get("dur", 0)
            size = message_bytes(family, call)
        context = enclosing(call, spans)
        out.append(
            {
                "family": family,
                "kind": classify(family, context),
                "bytes": size,
                "start_us": start,
                "end_us": end,
                "queued_us": call["ts"],
                "context": context,
            }
        )
    return out


# Lower-cased name parts of operators that block on communication. TorchRec pairs autograd
# functions around each collective: "<X>_Req" launches it and "<X>_Wait" waits for it in the
# forward; in the backward the roles swap ("<X>_WaitBackward" launches, "<X>_ReqBackward" waits).
BLOCKING_MARKERS = ("wait", "reqbackward", "req_backward", "c10d::", "record_param_comms", "barrier")


def compute_intervals(events: Sequence[dict]) -> list[Interval]:
    """Busy time (us) of the compute threads: operators that do work, not those that wait.

    An operator that waits for communication (BLOCKING_MARKERS, the c10d queueing calls) and
    every operator around one is left out; the operators inside it still count.
    """
    comm_threads = {e["tid"] for e in events if is_gloo(e)}
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op" and e["tid"] not in comm_threads]
    blocking = [e for e in ops if any(m in e["name"].lower() for m in BLOCKING_MARKERS)]
    by_tid: dict = {}
    for b in blocking:
        by_tid.setdefault(b["tid"], []).append((b["ts"], b["ts"] + b.get("dur", 0)))
    keep = []
    for e in ops:
        s, t = e["ts"], e["ts"] + e.get("dur", 0)
        if any(m in e["name"].lower() for m in BLOCKING_MARKERS):
            continue
        if any(s <= a and b <= t for a, b in by_tid.get(e["tid"], ())):
            continue
        keep.append((s, t))
    return union(keep)


def windows(events: Sequence[dict], name: str) -> list[Interval]:
    """Intervals (us) of the spans called ``name`` (the profiled steps)."""
    return [(e["ts"], e["ts"] + e.get("dur", 0)) for e in events if e.get("ph") == "X" and e["name"] == name]


def analyze(events: Sequence[dict], world_size: int, step_name: str) -> dict:
    """One rank's communication per kind and its exposure, over the spans named ``step_name``.

    Times in seconds, per profiled step; bytes per profiled step.
    """
    steps = windows(events, step_name)
    if not steps:
        raise ValueError(f"no {step_name!r} spans in the trace")
    n = len(steps)
    step_s = length(steps) / 1e6 / n
    inside = [c for c in collectives(events) if any(a <= c["queued_us"] <= b for a, b in steps)]
    by_kind: dict[str, dict] = {}
    for c in inside:
        k = by_kind.setdefault(c["kind"], {"family": c["family"], "calls": 0, "bytes": 0, "time_s": 0.0})
        k["calls"] += 1
        k["bytes"] += c["bytes"]
        k["time_s"] += (c["end_us"] - c["start_us"]) / 1e6
    for k in by_kind.values():
        k["calls"] /= n
        k["bytes"] /= n
        k["time_s"] /= n
        k["algbw_Bps"] = k["bytes"] / k["time_s"] if k["time_s"] > 0 else 0.0
        k["busbw_Bps"] = k["algbw_Bps"] * bus_factor(k["family"], world_size)
        k["step_share"] = k["time_s"] / step_s if step_s > 0 else 0.0
    comm = intersect([(c["start_us"], c["end_us"]) for c in inside], steps)
    compute = intersect(compute_intervals(events), steps)
    # the same split per kind, so a report can say which collective is the exposed one; kinds that
    # run at the same time each count the shared wall time, so these may sum to more than the total
    for kind, k in by_kind.items():
        mine = intersect([(c["start_us"], c["end_us"]) for c in inside if c["kind"] == kind], steps)
        k["overlapped_s"] = length(intersect(mine, compute)) / 1e6 / n
        k["exposed_s"] = length(subtract(mine, compute)) / 1e6 / n
    exp = exposure([(a / 1e6, b / 1e6) for a, b in comm], [(a / 1e6, b / 1e6) for a, b in compute], step_s * n)
    for key in ("comm_s", "overlapped_s", "exposed_s"):
        exp[key] /= n
    return {
        "profiled_steps": n,
        "step_s": step_s,
        "by_kind": by_kind,
        "exposure": exp,
        "calls": [{k: c[k] for k in ("kind", "family", "bytes")} for c in inside],
    }


def across_ranks(analyses: list[dict]) -> dict:
    """The job's communication from every rank's ``analyze`` (in rank order): per kind the ranks'
    mean (and slowest time), each rank's exposure, and their mean exposed and overlapped shares."""
    kinds = sorted({k for r in analyses for k in r["by_kind"]})
    by_kind = {}
    for kind in kinds:
        rows = [r["by_kind"].get(kind) for r in analyses]
        rows = [x for x in rows if x]
        mean = lambda key: float(np.mean([x[key] for x in rows]))  # noqa: E731
        time_s, size = mean("time_s"), mean("bytes")
        factor = rows[0]["busbw_Bps"] / rows[0]["algbw_Bps"] if rows[0]["algbw_Bps"] else 0.0
        by_kind[kind] = {
            "family": rows[0]["family"],
            "calls": mean("calls"),
            "bytes": size,
            "time_s": time_s,
            "time_max_s": float(max(x["time_s"] for x in rows)),
            "algbw_Bps": size / time_s if time_s > 0 else 0.0,
            "busbw_Bps": factor * size / time_s if time_s > 0 else 0.0,
            "step_share": mean("step_share"),
        }
        if all("exposed_s" in x for x in rows):  # traces analysed before per-kind exposure lack it
            by_kind[kind]["overlapped_s"] = mean("overlapped_s")
            by_kind[kind]["exposed_s"] = mean("exposed_s")
    exposure = [dict(r["exposure"], rank=rank, step_s=r["step_s"]) for rank, r in enumerate(analyses)]
    return {
        "profiled_steps": analyses[0]["profiled_steps"],
        "by_kind": by_kind,
        "exposure": exposure,
        "exposed_comm_fraction": float(np.mean([e["exposed_fraction"] for e in exposure])),
        "overlap_fraction": float(np.mean([e["overlap_fraction"] for e in exposure])),
    }
