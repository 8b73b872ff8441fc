"""What the harness reads of a model, whoever wrote it: one workload (gembench/workload.py).

A command's ``--config`` (the zoo's, models/zoo.py) and ``--model SPEC`` both become a Workload
here (``workload_of``), and every runner reads only that: its tables, pure model, seeded batches
and loss; which stack switches act on it (``applied_switches``); the sparse_forward stage (the time
inside the modules ``sparse()`` names, else its TorchRec modules, by forward pre/post hooks:
``SparseTimer``); its forward FLOPs per batch (its formula, checked once against FlopCounterMode,
else counted: ``flops_of``), the bytes its batches move, its memory estimate (its own where it
gives one, else from the parameter shapes), and the identity a result records.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from gembench.errors import UsageError
from gembench.harness.metrics.imbalance import hot_share
from gembench.harness.train import nvtx
from gembench.harness.train.parallelize import embedding_parameters, fsdp_units, sparse_modules, submodule
from gembench.loader import (
    batch_fields,
    batch_spec,
    check_batch,
    check_global_batch,
    check_switches,
    kjt_fields,
    load_workload,
    named,
    workload_hash,
)
from gembench.workload import Workload

FLOPS_TOLERANCE = 0.01  # a formula the counter contradicts by more than this is refused
ADAM_BYTES = 8  # Adam's m and v, fp32, per dense parameter
ADAGRAD_BYTES = 4  # exact Adagrad's sum, fp32, per embedding element


def workload_of(config=None, model: str | None = None, model_args=(), batch: int | None = None, nproc: int = 1):
    """The workload a command names: ``--model SPEC`` (with its ``--model-arg``s) or ``--config``
    (a name, a .toml path or a ModelConfig of the zoo; None: small), at ``--batch`` if given."""
    if model is not None:
        workload = load_workload(model, model_args)
    else:
        from gembench.models.zoo import workload as zoo_workload

        workload = zoo_workload(config)
    if batch is not None:
        workload.global_batch = check_global_batch(batch, nproc)
    return workload


class SparseTimer:
    """Seconds spent inside the sparse modules' forward (the workload's ``sparse()``, else its
    TorchRec modules), by forward pre/post hooks. A sharded module returns an awaitable: the post
    hook waits for it, so its output dist is sparse time."""

    def __init__(self, model: nn.Module, device: torch.device, workload: Workload | None = None):
        self.cuda = device.type == "cuda"
        self.spans: list = []
        self.handles = []
        paths = workload.sparse() if workload is not None else ()
        self.modules = [submodule(workload, model, p, "sparse()") for p in paths] or sparse_modules(model)
        if not self.modules:
            raise UsageError(
                "the workload's model has no TorchRec embedding module: its sparse part must be TorchRec's"
            )
        self.attach()

    def attach(self) -> None:
        for m in self.modules:
            self.handles.append(m.register_forward_pre_hook(self._start))
            self.handles.append(m.register_forward_hook(self._end))

    def detach(self) -> None:
        """Hooks off (benchmarks/stage_timing_overhead.py's untimed reference); attach() again."""
        for h in self.handles:
            h.remove()
        self.handles = []

    def _now(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _start(self, module, args):
        nvtx.push("sparse_forward")
        self.spans.append([self._now(), None])

    def _end(self, module, args, output):
        wait = getattr(output, "wait", None)
        if callable(wait):  # a sharded module's LazyAwaitable: the output dist belongs to it
            output = wait()
        self.spans[-1][1] = self._now()
        nvtx.pop()
        return output

    def inside(self) -> bool:
        """Whether a sparse module's forward has begun and not ended (it raised, say)."""
        return bool(self.spans) and self.spans[-1][1] is None

    def take(self) -> float:
        """The seconds of the spans since the last take (after the step's end on CUDA)."""
        spans, self.spans = self.spans, []
        if self.cuda:
            if spans:
                spans[-1][1].synchronize()
            return sum(a.elapsed_time(b) / 1e3 for a, b in spans)
        return sum(b - a for a, b in spans)


@dataclass
class Applied:
    """Which stack switches act on a workload and which do not (the result's workload.switches)."""

    applied: dict
    not_applicable: dict


MODEL_SWITCHES = {
    "jagged": "gembench's HSTU attention kernel: the workload's model has its own",
    "content": "a gembench config section",
}


def applied_switches(workload: Workload, options) -> Applied:
    """The switches of ``options`` as they act on ``workload``; refuses an unsupported one in use."""
    used = {}
    for name in ("bf16", "fused_embeddings", "fused_optimizer", "compile"):
        if getattr(options, name):
            used[name] = True
    if options.activation_checkpointing != "none":
        used["activation_checkpointing"] = options.activation_checkpointing
    if options.dense_parallel != "ddp":
        used["dense_parallel"] = options.dense_parallel
    check_switches(workload, used)
    mode = options.activation_checkpointing
    if workload.checkpointed(mode) is None:
        raise UsageError(
            f"{named(workload)}: activation_checkpointing={mode} names blocks the workload does not have "
            "(checkpointed() gives none); use activation_checkpointing=all (its blocks()) or none"
        )
    if mode != "none" and not workload.checkpointed(mode):
        raise UsageError(
            f"{named(workload)}: activation_checkpointing={mode} wraps the blocks the workload names "
            "and it names none; name them (blocks()) or use activation_checkpointing=none"
        )
    applied = {k: getattr(options, k) for k in ("bf16", "fused_embeddings", "fused_optimizer")}
    applied["activation_checkpointing"] = mode
    applied["dense_parallel"] = options.dense_parallel
    na = {}
    for name, why in MODEL_SWITCHES.items():
        if name in workload.switches:
            applied[name] = getattr(options, name)
        else:
            na[name] = why
    if workload.compiled():
        applied["compile"] = options.compile
    else:
        na["compile"] = "the workload names no submodule to compile (compiled())"
    return Applied(applied, na)


def seeded(workload: Workload, device: torch.device, seed: int) -> nn.Module:
    """The workload's pure model, built from ``seed``: the same weights for every stack and rank."""
    torch.manual_seed(seed)
    model = workload.build(device)
    if not isinstance(model, nn.Module):
        raise UsageError(f"{named(workload)}: build() returned {type(model).__name__}, not an nn.Module")
    return model


# -- what the batches hold: FLOPs, bytes ------------------------------------------------------


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


def described(workload: Workload, per_block: list[dict], batches: list, options) -> dict:
    """What the timed steps' batches hold (``per_block``: their forward FLOPs, flops_of or
    formula_flops on the same batches): forward and recomputed FLOPs per step (the workload's
    recomputed_flops under the stack's checkpointing), mean FLOPs per block, the embedding bytes
    of one step and the mean bytes a step's batch moves to the device. The one place these are
    derived, for one process and every rank."""
    mode = options.activation_checkpointing
    return {
        "forward_flops": [float(sum(b.values())) for b in per_block],
        "recomputed_flops": [workload.recomputed_flops(b, mode) if mode != "none" else 0.0 for b in per_block],
        "per_block": {k: sum(b[k] for b in per_block) / len(per_block) for k in per_block[0]},
        "embedding_bytes": embedding_bytes(workload, batches[0]),
        "input_bytes": float(sum(input_bytes(b) for b in batches) / len(batches)),
    }


# -- sizes and memory -------------------------------------------------------------------------


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


# -- identity ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Identity:
    """What a result's config section and id read of a run's model."""

    name: str
    hash: str
    source: str
    kind: str
    global_batch: int


def identity(workload: Workload, seed: int = 0, meta: nn.Module | None = None, first=None) -> Identity:
    """The workload's identity: its own fingerprint() (the zoo: the config's hash) or a hash of its
    tables, parameter shapes, batch spec and global batch; its source (the zoo: the config's file).
    ``meta``, ``first``: its meta build and its batch 0 of one rank, where the caller has them."""
    digest = workload.fingerprint()
    if digest is None:
        meta = workload.build(torch.device("meta")) if meta is None else meta
        first = workload.batch(0, 0, 1, seed) if first is None else first
        digest = workload_hash(workload, meta, first)
    source = getattr(workload, "source", None) or getattr(workload, "spec", workload.name)
    return Identity(workload.name, digest, source, workload.kind, workload.global_batch)


def prepared(
    workload: Workload, seed: int, world: int = 1, rank: int = 0, count: int = 1, meta: nn.Module | None = None
) -> tuple[list, Identity]:
    """Batches ``0..count-1`` of this rank, checked (shape, determinism), and the run's identity
    (``meta``: the workload's meta build, where the caller has one)."""
    batches = [workload.batch(i, rank, world, seed) for i in range(count)]
    for b in batches[:2]:
        check_batch(workload, b, rank, world)
    return batches, identity(workload, seed, meta, batches[0] if world == 1 else None)


def section(workload: Workload, ident: Identity, basis: str, options, batch, sparse: int) -> dict:
    """The result's ``workload`` section: what ran and on which terms."""
    sw = applied_switches(workload, options)
    args = getattr(workload, "args", {}) or {}
    return {
        "name": workload.name,
        "import_path": getattr(workload, "spec", workload.name),
        "args": {k: v if isinstance(v, (int, float, str, bool)) else repr(v) for k, v in args.items()},
        "hash": ident.hash,
        "flops_basis": basis,
        "tables": [t.name for t in workload.tables()],
        "batch_spec": batch_spec(batch),
        "sparse_modules": sparse,
        "switches": {"applied": sw.applied, "not_applicable": sw.not_applicable},
    }


# -- batch introspection: what feeds each TorchRec module, how hot its IDs are ----------------


def module_fields(workload: Workload, model, batch, required: bool = False) -> dict[str, str] | None:
    """{module path: batch field} for each TorchRec module of the model, the field whose KJT holds
    exactly its features: what the staged step and the load count feed each module, and what
    TorchRec's pipeline needs (each module called on one field of a Pipelineable batch). None
    where a module has no such field (the staged step then runs the forward whole); ``required``
    (--pipeline): refused in one line instead."""
    from torchrec import EmbeddingBagCollection, EmbeddingCollection
    from torchrec.streamable import Pipelineable

    spec = named(workload)
    if required and not isinstance(batch, Pipelineable):
        raise UsageError(
            f"{spec}: --pipeline needs batch() to return a torchrec.streamable.Pipelineable "
            f"(it gave a {type(batch).__name__}); subclass it, or drop --pipeline"
        )
    by_keys = {frozenset(v.keys()): name for name, v in kjt_fields(batch).items()}
    out = {}
    for path, m in model.named_modules():
        if not isinstance(m, (EmbeddingBagCollection, EmbeddingCollection)):
            continue
        configs = m.embedding_bag_configs() if isinstance(m, EmbeddingBagCollection) else m.embedding_configs()
        features = frozenset(f for t in configs for f in t.feature_names)
        if features not in by_keys:
            if not required:
                return None
            raise UsageError(
                f"{spec}: --pipeline calls each TorchRec module on one batch field, and no KJT field of the "
                f"batch holds exactly the features of {path} ({', '.join(sorted(features))}); drop --pipeline"
            )
        out[path] = by_keys[features]
    return out


def hot_counts(workload: Workload, batches) -> dict:
    """Lookups, and lookups that hit each table's hottest 1% of rows, over this rank's batches."""
    rows = {f: t.num_embeddings for t in workload.tables() for f in t.feature_names}
    ids: dict[str, list] = {}
    for b in batches:
        for v in kjt_fields(b).values():
            for key, part in v.to_dict().items():
                ids.setdefault(key, []).append(part.values().numpy())
    hits = lookups = 0.0
    for key, parts in ids.items():
        values = np.concatenate(parts)
        hits += hot_share(values, rows[key]) * values.size
        lookups += values.size
    return {"lookups": lookups, "hot_1pct": hits}
