"""What the harness reads of a model, whoever wrote it: one workload (workload.py, gembench.workload).

A command's ``--config`` (the zoo's, models/zoo.py) and ``--model SPEC`` both become a Workload
here (``workload_of``), and every runner reads only that: its tables, pure model, seeded batches
and loss; which stack switches act on it (``applied_switches``); the sparse_forward stage (the time
inside the modules ``sparse()`` names, else its TorchRec modules, by forward pre/post hooks:
``SparseTimer``); the identity a result records; which batch field feeds each TorchRec module and
how hot its IDs are. The work its batches ask for is work.py's; its memory, memory.py's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from gembench.errors import UsageError
from gembench.harness.metrics.imbalance import hot_share
from gembench.harness.train import nvtx
from gembench.harness.train.parallelize import sparse_modules, submodule
from gembench.loader import (
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
