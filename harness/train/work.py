"""The work a workload's batches ask of a step: forward FLOPs per block and the bytes they move.

FLOPs come from the workload's formula (forward_flops(), checked once against FlopCounterMode) or,
without one, from the counter; ``described`` is the one place a run's per-step work is derived,
for one process and every rank.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from gembench.errors import UsageError
from gembench.harness.train.workloads import seeded
from gembench.loader import batch_fields, kjt_fields, named
from gembench.workload import Workload

FLOPS_TOLERANCE = 0.01  # a formula the counter contradicts by more than this is refused


def counted_flops(workload: Workload, model: nn.Module, batch, autocast=contextlib.nullcontext) -> dict[str, float]:
    """Forward FLOPs of one batch by FlopCounterMode, per top-level submodule of the model (the
    parts not inside one: "other"), under ``autocast`` (a model may need the stack's precision)."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), autocast(), FlopCounterMode(display=False) as counter:
        workload.forward(model, batch)
    counts = counter.get_flop_counts()
    per = {k.split(".", 1)[1]: float(sum(v.values())) for k, v in counts.items() if k.count(".") == 1}
    total = float(counter.get_total_flops())
    if total - sum(per.values()) > 0:
        per["other"] = total - sum(per.values())
    return per or {"forward": total}


def flops_of(workload: Workload, model: nn.Module, batches: list, autocast=contextlib.nullcontext, device=None):
    """Per batch {block: forward FLOPs} and the basis: "formula" (the workload's, checked against
    the counter on the first batch) or "counted" (FlopCounterMode on the first batch, every batch
    of one shape). ``model``: the workload's, on ``device`` (the first batch is moved there)."""
    first = batches[0] if device is None else batches[0].to(device)
    counted = counted_flops(workload, model, first, autocast)
    formula = workload.forward_flops(batches[0])
    if formula is None:
        return [counted for _ in batches], "counted"
    given, seen = float(sum(formula.values())), float(sum(counted.values()))
    if seen and abs(given - seen) > FLOPS_TOLERANCE * seen:
        raise UsageError(
            f"{named(workload)}: forward_flops() gives {given:,.0f} FLOPs for batch 0, FlopCounterMode counts "
            f"{seen:,.0f} ({given / seen - 1:+.1%}); fix the formula or drop it (the harness then counts)"
        )
    return formula_flops(workload, batches, formula), "formula"


def stack_flops(workload: Workload, variant: Workload, batches: list, autocast, device, seed: int, model=None):
    """flops_of for what a stack runs (``variant``, the workload's for_stack): the workload's
    formula is checked on the workload's own model (``model``, when the variant is the workload
    and it is at hand; else one built here and dropped), since a variant may execute more than
    its model FLOPs (the zoo's padded attention); then the variant's formula, or the count."""
    if model is None or variant is not workload:
        model = seeded(workload, device, seed)
    flops, basis = flops_of(workload, model, batches, autocast, device)
    if variant is not workload and basis == "formula":
        flops = formula_flops(variant, batches)
    return flops, basis


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
        per_batch, basis = counted_flops(workload, seeded(workload, torch.device("cpu"), 0), batch), "counted"
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


def described(workload: Workload, flops: list[dict], batches: list, warmup: int, steps: int, options) -> dict:
    """What the timed steps' batches hold (``batches``, per distinct batch, and ``flops``, their
    forward FLOPs per block: flops_of or formula_flops): forward and recomputed FLOPs per step (the
    workload's recomputed_flops under the stack's checkpointing), mean FLOPs per block, the
    embedding bytes of one step and the mean bytes a step's batch moves to the device. The one
    place these are derived, for one process and every rank."""
    per_block, batches = timed_batches(flops, warmup, steps), timed_batches(batches, warmup, steps)
    mode = options.activation_checkpointing
    return {
        "forward_flops": [float(sum(b.values())) for b in per_block],
        "recomputed_flops": [workload.recomputed_flops(b, mode) if mode != "none" else 0.0 for b in per_block],
        "per_block": {k: sum(b[k] for b in per_block) / len(per_block) for k in per_block[0]},
        "embedding_bytes": embedding_bytes(workload, batches[0]),
        "input_bytes": float(sum(input_bytes(b) for b in batches) / len(batches)),
    }
