"""A model that is not gembench's, through the same stages, stack, counters and result.

The workload (gembench/workload.py) gives a pure model and its loss; the harness never looks
inside. Stages: data, sparse_forward = the time inside the TorchRec modules' forward (found by
type with forward pre/post hooks; on ranks their input and output dist too, the output waited
for), dense_forward = the rest of the forward, loss, backward, optimizer. The stack switches
that apply: bf16 autocast, fused TBE (fuse_embeddings, by module type), fused Adam, compile of
the submodules the workload names (``compiled()``), activation checkpointing of the blocks it
names (``blocks()``); the rest are recorded as not applicable (``switches``).
FLOPs: the workload's formula, checked once against FlopCounterMode, else counted (basis).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from gembench.errors import UsageError
from gembench.harness.train.step import TrainState
from gembench.workload import Workload, batch_fields, batch_spec, check_batch, check_switches, workload_hash

FLOPS_TOLERANCE = 0.01  # a formula the counter contradicts by more than this is refused
CPU_RUNTIME_BYTES = 0  # the process's own growth besides tensors: not estimated for a workload


def torchrec_types() -> tuple[type, ...]:
    """The embedding modules a workload's sparse part is made of, plain, fused and sharded."""
    from torchrec import EmbeddingBagCollection, EmbeddingCollection
    from torchrec.distributed.embedding import ShardedEmbeddingCollection
    from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection, FusedEmbeddingCollection

    return (
        EmbeddingBagCollection,
        EmbeddingCollection,
        FusedEmbeddingBagCollection,
        FusedEmbeddingCollection,
        ShardedEmbeddingBagCollection,
        ShardedEmbeddingCollection,
    )


def sparse_modules(model: nn.Module) -> list[nn.Module]:
    """The outermost TorchRec embedding modules of ``model``."""
    types, found, inside = torchrec_types(), [], set()
    for name, m in model.named_modules():
        if isinstance(m, types) and not any(name.startswith(p + ".") for p in inside):
            found.append(m)
            inside.add(name)
    return found


def embedding_parameters(model: nn.Module) -> set[int]:
    """ids of the parameters of the TorchRec modules (the tables)."""
    return {id(p) for m in sparse_modules(model) for p in m.parameters()}


class SparseTimer:
    """Seconds spent inside the TorchRec modules' forward, by forward pre/post hooks. A sharded
    module returns an awaitable: the post hook waits for it, so its output dist is sparse time."""

    def __init__(self, model: nn.Module, device: torch.device):
        self.cuda = device.type == "cuda"
        self.spans: list = []
        self.handles = []
        self.modules = sparse_modules(model)
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
        self.spans.append([self._now(), None])

    def _end(self, module, args, output):
        wait = getattr(output, "wait", None)
        if callable(wait):  # a sharded module's LazyAwaitable: the output dist belongs to it
            output = wait()
        self.spans[-1][1] = self._now()
        return output

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
    if options.activation_checkpointing == "hstu":
        raise UsageError(
            f"--model {workload.spec}: activation_checkpointing=hstu picks gembench's HSTU layers; "
            "use activation_checkpointing=all (the workload's blocks()) or none"
        )
    if options.activation_checkpointing == "all" and not workload.blocks():
        raise UsageError(
            f"--model {workload.spec}: activation_checkpointing=all wraps the blocks the workload names "
            "and blocks() names none; name them or use activation_checkpointing=none"
        )
    applied = {k: getattr(options, k) for k in ("bf16", "fused_embeddings", "fused_optimizer")}
    applied["activation_checkpointing"] = options.activation_checkpointing
    applied["dense_parallel"] = options.dense_parallel
    na = {
        "jagged": "gembench's HSTU attention kernel: the workload's model has its own",
        "content": "a gembench config section",
    }
    if workload.compiled():
        applied["compile"] = options.compile
    else:
        na["compile"] = "the workload names no submodule to compile (compiled())"
    return Applied(applied, na)


def _set(model: nn.Module, path: str, module: nn.Module) -> None:
    parent_path, _, leaf = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    if isinstance(parent, nn.ModuleList):
        parent[int(leaf)] = module
    else:
        setattr(parent, leaf, module)


def named_submodule(workload: Workload, model: nn.Module, path: str, what: str) -> nn.Module:
    try:
        return model.get_submodule(path)
    except AttributeError:
        raise UsageError(
            f"--model {workload.spec}: {what} names {path!r}, which the model has no submodule of"
        ) from None


def apply_ac(workload: Workload, model: nn.Module, mode: str) -> int:
    """activation_checkpointing=all: torch's non-reentrant checkpoint around each named block."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    if mode != "all":
        return 0
    for path in workload.blocks():
        block = named_submodule(workload, model, path, "blocks()")
        _set(
            model,
            path,
            checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT, preserve_rng_state=False),
        )
    return len(workload.blocks())


def apply_compile(workload: Workload, model: nn.Module, options) -> None:
    """compile=on: each submodule the workload names, compiled in place (dynamic shapes)."""
    if options.compile:
        for path in workload.compiled():
            named_submodule(workload, model, path, "compiled()").compile(dynamic=True)


def dense_roots(model: nn.Module, prefix: str = "") -> list[tuple[str, nn.Module]]:
    """The outermost submodules with parameters and no TorchRec module inside: the dense part,
    as models/blocks.py reads it off the zoo's models (a child holding a TorchRec module is
    looked into)."""
    types, out = torchrec_types(), []
    for name, child in model.named_children():
        if isinstance(child, types) or not any(True for _ in child.parameters()):
            continue
        if any(isinstance(m, types) for m in child.modules()):
            out += dense_roots(child, f"{prefix}{name}.")
        else:
            out.append((f"{prefix}{name}", child))
    return out


def fsdp_units(workload: Workload, model: nn.Module) -> tuple[list, list]:
    """(blocks, roots) FSDP2 shards on a workload's model (parallelize.apply_fsdp): the blocks it
    names (blocks()), else its dense roots; then the roots that hold them. A dense parameter
    outside every root (held beside a TorchRec module) is refused: nothing would sync it."""
    roots = dense_roots(model)
    blocks = [(p, named_submodule(workload, model, p, "blocks()")) for p in workload.blocks()] or roots
    covered = {id(p) for _, m in roots + blocks for p in m.parameters()}
    tables = embedding_parameters(model)
    loose = [n for n, p in model.named_parameters() if id(p) not in covered and id(p) not in tables]
    if loose:
        raise UsageError(
            f"--model {workload.spec}: dense_parallel=fsdp shards submodules, and {loose[0]} is held beside a "
            "TorchRec module, in no dense submodule; move it into one or use dense_parallel=ddp"
        )
    return blocks, roots


def seeded(workload: Workload, device: torch.device, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = workload.build(device)
    if not isinstance(model, nn.Module):
        raise UsageError(f"--model {workload.spec}: build() returned {type(model).__name__}, not an nn.Module")
    return model


def generic_step(state: TrainState, batch, clock) -> torch.Tensor:
    """One step of a workload's model: the staged step of step.train_step, the forward split by
    the sparse timer into sparse_forward and the rest."""
    workload, timer = state.workload, state.timer
    clock.mark("start")
    batch = batch.to(state.device, non_blocking=True)
    clock.mark("data")
    timer.take()
    with state.autocast():
        output = workload.forward(state.model, batch)
        clock.mark("sparse_forward")
        clock.mark("dense_forward")  # the whole forward; its sparse share moved back below
        loss = workload.loss(output, batch)
    clock.mark("loss")
    split = getattr(clock, "split", None)
    if split is not None:
        split("sparse_forward", "dense_forward", timer.take)
    loss.backward()
    clock.mark("backward")
    for opt in state.optimizers:
        opt.step()
    state.zero_grad()
    clock.mark("optimizer")
    return loss.detach().reshape(1)


def build_generic_state(workload: Workload, options, device: torch.device, seed: int = 0) -> TrainState:
    """The workload's model from ``seed`` with the stack applied (one process)."""
    from gembench.harness.train.stack import ADAGRAD_EPS, EMBEDDING_LR, autocast_for, dense_optimizer, fuse_embeddings

    applied_switches(workload, options)
    model = seeded(workload, device, seed)
    apply_ac(workload, model, options.activation_checkpointing)
    optimizers: list[torch.optim.Optimizer] = []
    if options.fused_embeddings:
        optimizers += fuse_embeddings(model, device)
    else:
        tables = [p for p in model.parameters() if id(p) in embedding_parameters(model)]
        optimizers.append(torch.optim.Adagrad(tables, lr=EMBEDDING_LR, eps=ADAGRAD_EPS))
    tables = embedding_parameters(model)
    dense = [p for p in model.parameters() if id(p) not in tables]
    optimizers.append(dense_optimizer(dense, options))
    apply_compile(workload, model, options)
    return TrainState(
        model=model,
        optimizers=optimizers,
        autocast=autocast_for(options, device),
        device=device,
        step_fn=generic_step,
        workload=workload,
        timer=SparseTimer(model, device),
        dense_params=dense,
    )


# -- what the batches hold: FLOPs, bytes ------------------------------------------------------


def counted_flops(workload: Workload, model: nn.Module, batch) -> dict[str, float]:
    """Forward FLOPs of one batch by FlopCounterMode, per top-level submodule of the model (the
    parts not inside one: "other")."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        workload.forward(model, batch)
    counts = counter.get_flop_counts()
    per = {k.split(".", 1)[1]: float(sum(v.values())) for k, v in counts.items() if k.count(".") == 1}
    total = float(counter.get_total_flops())
    if total - sum(per.values()) > 0:
        per["other"] = total - sum(per.values())
    return per or {"forward": total}


def flops_of(workload: Workload, model: nn.Module, batches: list) -> tuple[list[dict], str]:
    """Per batch {block: forward FLOPs} and the basis: "formula" (the workload's, checked against
    the counter on the first batch) or "counted" (FlopCounterMode on the first batch, every batch
    of one shape)."""
    counted = counted_flops(workload, model, batches[0])
    formula = workload.forward_flops(batches[0])
    if formula is None:
        return [counted for _ in batches], "counted"
    given, seen = float(sum(formula.values())), float(sum(counted.values()))
    if seen and abs(given - seen) > FLOPS_TOLERANCE * seen:
        raise UsageError(
            f"--model {workload.spec}: forward_flops() gives {given:,.0f} FLOPs for batch 0, FlopCounterMode counts "
            f"{seen:,.0f} ({given / seen - 1:+.1%}); fix the formula or drop it (the harness then counts)"
        )
    cache: dict[int, dict] = {}
    return [
        cache.setdefault(id(b), {k: float(v) for k, v in workload.forward_flops(b).items()}) for b in batches
    ], "formula"


def feature_dims(workload: Workload) -> dict[str, int]:
    return {f: t.embedding_dim for t in workload.tables() for f in t.feature_names}


def embedding_bytes(workload: Workload, batch, bytes_per_element: int = 4) -> dict[str, float]:
    """Bytes the batch's lookups move, as models.flops.embedding_bytes gives them for the zoo:
    rows read in the forward (IDs x dim, fp32), gradient rows written in the backward, and the
    pooled output (one row per example and feature of a pooled table)."""
    from torchrec import EmbeddingBagConfig
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    dims = feature_dims(workload)
    pooled = {f for t in workload.tables() if isinstance(t, EmbeddingBagConfig) for f in t.feature_names}
    lookups = read = out = 0.0
    for v in batch_fields(batch).values():
        if isinstance(v, KeyedJaggedTensor):
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
    """What train/result.py's ``described`` gives for the zoo, for a workload, from ``per_block``
    (flops_of on the same batches). Recomputed FLOPs under activation_checkpointing=all: the
    named blocks' forward."""
    blocks = {p.rpartition(".")[2] if p.count(".") else p for p in workload.blocks()}
    recompute = options.activation_checkpointing == "all"
    return {
        "forward_flops": [float(sum(b.values())) for b in per_block],
        "recomputed_flops": [
            float(sum(v for k, v in b.items() if k in blocks)) if recompute else 0.0 for b in per_block
        ],
        "per_block": {k: sum(b[k] for b in per_block) / len(per_block) for k in per_block[0]},
        "embedding_bytes": embedding_bytes(workload, batches[0]),
        "input_bytes": float(sum(input_bytes(b) for b in batches) / len(batches)),
    }


def parameter_shapes(workload: Workload) -> dict[str, int]:
    """Table and dense parameter counts, from the model built on the meta device."""
    model = workload.build(torch.device("meta"))
    tables = embedding_parameters(model)
    emb = sum(p.numel() for p in model.parameters() if id(p) in tables)
    dense = sum(p.numel() for p in model.parameters() if id(p) not in tables)
    return {"embedding_params": emb, "dense_params": dense, "total_params": emb + dense}


def memory_estimate(
    counts: dict, options, device_type: str, embedding_share: float = 1.0, dense_shards: int = 1
) -> dict[str, float]:
    """Training memory from parameter shapes alone (tables and dense from the meta build, the
    stack's precision): tables fp32 + Adagrad state (+ a dense gradient without fused tables),
    dense weights, gradients, Adam m and v (+ a bf16 copy), split over ``dense_shards`` ranks
    under FSDP2 (parallelize.dense_shards). Activations are the model's own and not estimated
    (0): the result's peak_memory_run_bytes is the measured figure."""
    emb = counts["embedding_params"] * (8 if options.fused_embeddings else 12) * embedding_share
    build = emb + counts["embedding_params"] * 4 * (1 if options.fused_embeddings else 0)
    dense = counts["dense_params"] * (16 + (2 if options.bf16 else 0)) / dense_shards
    runtime = CPU_RUNTIME_BYTES if device_type != "cuda" else 0.0
    return {
        "embeddings": float(emb),
        "dense": float(dense),
        "activations": 0.0,
        "transient": 0.0,
        "build": float(build),
        "runtime": float(runtime),
        "total": float(max(build, emb + dense) + runtime),
    }


@dataclass(frozen=True)
class Identity:
    """What a result's config section and id read of a run's model (a ModelConfig's fields)."""

    name: str
    hash: str
    source: str
    kind: str
    global_batch: int
    content: None = None

    @property
    def data(self):
        return self  # .data.global_batch, as of a ModelConfig


def prepared(workload: Workload, seed: int, world: int = 1, rank: int = 0, count: int = 1) -> tuple[list, Identity]:
    """Batches ``0..count-1`` of this rank, checked (shape, determinism), and the run's identity."""
    batches = [workload.batch(i, rank, world, seed) for i in range(count)]
    for b in batches[:2]:
        check_batch(workload, b, rank, world)
    meta = workload.build(torch.device("meta"))
    first = workload.batch(0, 0, 1, seed) if world > 1 else batches[0]
    digest = workload_hash(workload, meta, first)
    ident = Identity(workload.name, digest, workload.spec, "workload", workload.global_batch)
    return batches, ident


def section(workload: Workload, ident: Identity, basis: str, options, batch, sparse: int) -> dict:
    """The result's ``workload`` section: what ran and on which terms."""
    sw = applied_switches(workload, options)
    return {
        "name": workload.name,
        "import_path": workload.spec,
        "args": {k: v if isinstance(v, (int, float, str, bool)) else repr(v) for k, v in workload.args.items()},
        "hash": ident.hash,
        "flops_basis": basis,
        "tables": [t.name for t in workload.tables()],
        "batch_spec": batch_spec(batch),
        "sparse_modules": sparse,
        "switches": {"applied": sw.applied, "not_applicable": sw.not_applicable},
    }
