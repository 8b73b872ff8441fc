"""The work a workload's batches ask of a step: forward FLOPs per block and the bytes they move.

FLOPs come from the workload's formula (forward_flops(), checked once against FlopCounterMode) or,
without one, from the counter, which keeps apart what reaches the loss (model FLOPs) from what
cannot (no-grad work: executed once, so it raises HFU and never MFU); ``described`` is the one place
a run's per-step work is derived, for one process and every rank.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from gembench.errors import UsageError
from gembench.harness.train.step import losses
from gembench.harness.train.workloads import seeded
from gembench.loader import batch_fields, kjt_fields, named
from gembench.workload import Workload

FLOPS_TOLERANCE = 0.01  # a formula the counter contradicts by more than this is refused


@dataclass(frozen=True)
class Count:
    """One forward of one batch, counted by FlopCounterMode per top-level submodule (the parts not
    inside one: "other"): the FLOPs that reach the loss (their outputs in its autograd graph: model
    FLOPs, trained, so run again twice in the backward) and those that cannot (no-grad work, or
    output no loss reads: executed once, never model FLOPs)."""

    trained: dict[str, float]
    untrained: dict[str, float]


class _Calls(TorchFunctionMode):
    """Each torch call of a forward: its FLOPs (read off the enclosing FlopCounterMode), its block
    and the autograd node of its output. A custom autograd Function counts as one call."""

    def __init__(self, counter):
        super().__init__()
        self.counter, self.calls, self.depth = counter, [], 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return self.call(func, *args, **(kwargs or {}))

    def call(self, func, *args, **kwargs):
        """``func`` counted as one call, with whatever it calls inside (a Function it applies)."""
        before = self.counter.get_total_flops()
        self.depth += 1
        try:
            out = func(*args, **kwargs)
        finally:
            self.depth -= 1
        if self.depth == 0:
            self.record(self.counter.get_total_flops() - before, out)
        return out

    def record(self, flops: int, out) -> None:
        if flops:
            top = [p.split(".", 1)[1] for p in self.counter.mod_tracker.parents if p.count(".") == 1]
            tensors = [t for t in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(t, torch.Tensor)]
            node = next((t.grad_fn for t in tensors if t.grad_fn is not None), None)
            self.calls.append((float(flops), min(top) if top else "other", node))  # min: one, always the same

    @contextlib.contextmanager
    def functions_as_calls(self):
        """Function.apply runs its forward below the torch-function layer, grad off: count it whole."""
        apply = torch.autograd.Function.apply.__func__

        def counted(cls, *args, **kwargs):
            return self.call(apply, cls, *args, **kwargs)

        torch.autograd.Function.apply = classmethod(counted)
        try:
            yield
        finally:
            torch.autograd.Function.apply = classmethod(apply)


def _reached(loss: torch.Tensor) -> set[int]:
    """The autograd nodes the loss's backward reaches."""
    seen, todo = set(), [loss.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and id(node) not in seen:
            seen.add(id(node))
            todo += [n for n, _ in node.next_functions]
    return seen


def counted_flops(workload: Workload, model: nn.Module, batch, autocast=contextlib.nullcontext) -> Count:
    """One forward of ``batch`` counted (Count), grad on, under ``autocast`` (a model may need the
    stack's precision); the loss is taken after the count, to see which calls reach it."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.enable_grad(), autocast():
        with FlopCounterMode(display=False) as counter, _Calls(counter) as calls, calls.functions_as_calls():
            output = workload.forward(model, batch)
        loss = losses(workload, output, batch)[0]
    reached = _reached(loss) if loss.requires_grad else set()
    count = Count({}, {})
    for flops, block, node in calls.calls:
        side = count.trained if node is not None and id(node) in reached else count.untrained
        side[block] = side.get(block, 0.0) + flops
    return count


@dataclass(frozen=True)
class Work:
    """The forward FLOPs a workload's batches ask for, on what basis, and what a step executes
    beyond them (forward FLOPs of batch 0, repeated every step; result.build_result adds them up)."""

    per_batch: list[dict]  # {block: forward model FLOPs} per distinct batch
    basis: str  # "formula" (the workload's forward_flops(), checked against the count) or "counted"
    untrained: dict[str, float]  # {block: FLOPs that cannot reach the loss}: executed once a step
    beyond_formula: float = 0.0  # trained FLOPs the formula leaves out (padding): executed, not model


def flops_of(
    workload: Workload, model: nn.Module, batches: list, autocast=contextlib.nullcontext, device=None, count=None
) -> Work:
    """The Work of ``batches``: the workload's formula, checked against the count of the first
    batch (it may leave trained work out, padding, but never claim more than the count), or the
    count ("counted": every batch as the first). ``model``: the workload's, on ``device`` (the
    first batch is moved there); ``count``: its Count of the first batch, where the caller has it."""
    if count is None:
        first = batches[0] if device is None else batches[0].to(device)
        count = counted_flops(workload, model, first, autocast)
    formula = workload.forward_flops(batches[0])
    if formula is None:
        return Work([count.trained for _ in batches], "counted", count.untrained)
    given, seen = float(sum(formula.values())), float(sum(count.trained.values()))
    if given > (1 + FLOPS_TOLERANCE) * seen:
        raise UsageError(
            f"{named(workload)}: forward_flops() gives {given:,.0f} FLOPs for batch 0, more than the "
            f"{seen:,.0f} FlopCounterMode counts reaching the loss ({given / max(seen, 1) - 1:+.1%}); fix the "
            "formula or drop it (the harness then counts)"
        )
    beyond = seen - given if seen - given > FLOPS_TOLERANCE * seen else 0.0
    return Work(formula_flops(workload, batches, formula), "formula", count.untrained, beyond)


def stack_flops(workload: Workload, variant: Workload, batches: list, autocast, device, seed: int, model=None) -> Work:
    """flops_of for what a stack runs (``variant``, the workload's for_stack): the workload's
    formula is checked on the workload's own model (``model``, when the variant is the workload
    and it is at hand; else one built here and dropped), since a variant may execute more than
    its model FLOPs (the zoo's padded attention); then variant_work, or the count."""
    if variant is workload and model is not None:
        return flops_of(workload, model, batches, autocast, device)
    work = flops_of(workload, seeded(workload, device, seed), batches, autocast, device)
    if variant is workload:
        return work
    return variant_work(work, variant, batches, autocast, device, seed, model)


def variant_work(work: Work, variant: Workload, batches: list, autocast, device, seed: int, model=None) -> Work:
    """The Work of a stack's variant of a workload (``work``: the workload's own): with a formula,
    the variant's over the batches, and what the variant's model (``model``, else one built here)
    executes beyond it, counted on batch 0: the zoo's padded attention computes its padding, work
    that is executed (HFU) and never model FLOPs."""
    if work.basis != "formula":
        return work
    per_batch = formula_flops(variant, batches)
    model = model if model is not None else seeded(variant, device, seed)
    first = batches[0] if device is None else batches[0].to(device)
    seen = float(sum(counted_flops(variant, model, first, autocast).trained.values()))
    beyond = seen - float(sum(per_batch[0].values()))
    return dataclasses.replace(
        work, per_batch=per_batch, beyond_formula=beyond if beyond > FLOPS_TOLERANCE * seen else 0.0
    )


def flops_per_example(workload: Workload, world: int = 1) -> tuple[dict[str, float], str]:
    """Forward FLOPs of one example per block, and their basis: the workload's flops_per_example()
    or its formula over batch 0 ("formula"), else FlopCounterMode over one forward of batch 0 on
    CPU ("counted"); batch 0 of ``world`` ranks, one rank's slice (a smaller batch to count on)."""
    given = workload.flops_per_example()
    if given is not None:
        return {k: float(v) for k, v in given.items()}, "formula"
    batch = workload.batch(0, 0, world, 0)
    per_batch, basis = workload.forward_flops(batch), "formula"
    if per_batch is None:
        per_batch, basis = counted_flops(workload, seeded(workload, torch.device("cpu"), 0), batch).trained, "counted"
    examples = workload.global_batch // world
    return {k: float(v) / examples for k, v in per_batch.items()}, basis


def formula_flops(workload: Workload, batches: list, first: dict | None = None) -> list[dict]:
    """The workload's formula over ``batches``, each distinct batch once (``first``: batch 0's,
    where the caller has it already)."""
    cache: dict[int, dict] = {}
    for i, b in enumerate(batches):
        if id(b) not in cache:
            given = first if i == 0 and first is not None else workload.forward_flops(b)
            cache[id(b)] = {k: float(v) for k, v in given.items()}
    return [cache[id(b)] for b in batches]


def feature_dims(workload: Workload) -> dict[str, int]:
    return {f: t.embedding_dim for t in workload.tables() for f in t.feature_names}


def embedding_bytes(workload: Workload, batch, bytes_per_element: int = 4) -> dict[str, float]:
    """Bytes the batch's lookups move: rows read in the forward (IDs x dim, fp32), gradient rows
    written in the backward, and the pooled output (one row per example and feature of a pooled
    table)."""
    from torchrec import EmbeddingBagConfig

    dims = feature_dims(workload)
    pooled = {f for t in workload.tables() if isinstance(t, EmbeddingBagConfig) for f in t.feature_names}
    lookups = read = out = 0.0
    for v in kjt_fields(batch).values():
        for key, n in zip(v.keys(), v.length_per_key()):
            lookups += float(n)
            read += float(n) * dims[key] * bytes_per_element
            out += v.stride() * dims[key] * bytes_per_element if key in pooled else 0.0
    return {"lookups": lookups, "read": read, "written": read, "pooled_output": out}


def input_bytes(batch) -> int:
    """Bytes of the batch moved to the device: tensors, and the KJTs' IDs, lengths and weights."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    total = 0
    for v in batch_fields(batch).values():
        parts = [v.values(), v.lengths(), v.weights_or_none()] if isinstance(v, KeyedJaggedTensor) else [v]
        total += sum(t.numel() * t.element_size() for t in parts if t is not None)
    return total


def timed_batches(batches: list, warmup: int, steps: int) -> list:
    """What the timed steps train on (steps cycle through the distinct batches), of a list per
    distinct batch: the batches themselves, or their FLOPs."""
    return [batches[i % len(batches)] for i in range(warmup, warmup + steps)]


def described(workload: Workload, work: Work, batches: list, warmup: int, steps: int, options) -> dict:
    """What the timed steps' batches hold (``batches``, per distinct batch, ``work`` their FLOPs):
    forward and recomputed FLOPs per step (and the op step's) (the workload's recomputed_flops under the stack's
    checkpointing), mean FLOPs per block, what a step executes beyond them, the
    embedding bytes of one step and the mean bytes a step's batch moves to the device. The one
    place these are derived, for one process and every rank."""
    from gembench.harness.train.measure import step_indices

    op_batch = work.per_batch[step_indices(warmup, steps, False)["ops"].start % len(work.per_batch)]
    per_block, batches = timed_batches(work.per_batch, warmup, steps), timed_batches(batches, warmup, steps)
    mode = options.activation_checkpointing
    return {
        # the op step's batch: what the op table's FLOPs add up to
        "op_step_flops": {
            "forward": float(sum(op_batch.values())),
            "recomputed": workload.recomputed_flops(op_batch, mode) if mode != "none" else 0.0,
        },
        "forward_flops": [float(sum(b.values())) for b in per_block],
        "recomputed_flops": [workload.recomputed_flops(b, mode) if mode != "none" else 0.0 for b in per_block],
        "per_block": {k: sum(b[k] for b in per_block) / len(per_block) for k in per_block[0]},
        "untrained_per_block": dict(work.untrained),
        "beyond_formula_flops": work.beyond_formula,
        "embedding_bytes": embedding_bytes(workload, batches[0]),
        "input_bytes": float(sum(input_bytes(b) for b in batches) / len(batches)),
    }
