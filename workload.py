"""The workload protocol: what a model gives the harness, whoever wrote it (docs/workload.md).

A workload is a subclass of ``Workload`` made by a factory the user names with ``--model
pkg.mod:factory`` or ``--model path/file.py:factory`` (``--model-arg key=value`` are its keyword
arguments). The harness reads only this: TorchRec table configs (the planner's input), a pure
``nn.Module`` whose sparse part is TorchRec modules (so DMP can shard it; it must build on the meta
device), a seeded batch source, a loss, and optionally a FLOPs formula, block names, sharders,
constraints, the stack switches it does not support, and for `project` its FLOPs per example, ID
skew and memory estimate. gembench's own configs are one provider
of it (models/zoo.py). This module sits below models/ and harness/ and imports neither.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import json
import math
import sys
from pathlib import Path

import torch
from torch import nn

from gembench.errors import UsageError


class Workload:
    """Subclass it and override what is marked "required"; the rest has a working default.

    name, global_batch                    required: the result's name and the job's global batch
    tables() -> [EmbeddingBagConfig|EmbeddingConfig]   required: every TorchRec table of the model
    build(device) -> nn.Module            required: pure, seeded by the caller, meta-buildable
    batch(i, rank, world, seed)           required: batch i of rank r, a torchrec Pipelineable
                                          (has .to(device)), identical for a seed; its KJTs hold
                                          global_batch/world examples
    loss(output, batch)                   required: a scalar, or a (tasks,) vector of per-task losses
                                          whose mean is trained (each task's is recorded)
    forward(model, batch) -> output       default model(batch)
    forward_flops(batch) -> {block: FLOPs}   forward FLOPs of one batch (None: counted once)
    pooling() -> {table: mean IDs per example}   for the planner (default: 1 per feature)
    row_skew() -> {table: Zipf exponent}  IDs by a power law, hottest rows first (default: uniform)
    flops_per_example() -> {block: FLOPs}  expected forward FLOPs of one example, for `project`
                                          (None: forward_flops of a batch, else counted)
    memory_estimate(batch, stack, device_type, shards, embedding_share, on_rank)
                                          -> {dense, activations, transient[, embeddings, build,
                                          runtime]} bytes of one rank (None: from the parameter
                                          shapes, activations not estimated)
    blocks() -> submodule paths           dense blocks: FSDP2's units, checkpointed under
                                          activation_checkpointing=all
    checkpointed(mode) -> paths | None    the blocks activation_checkpointing=mode wraps (default:
                                          none -> (), all -> blocks(), others refused)
    recomputed_flops(per_block, mode)     forward FLOPs the checkpointed blocks run again (default:
                                          the per_block entries named by a checkpointed path)
    compiled() -> paths                   submodules (or a method of the model, as "dense")
                                          compiled under compile=on (default: none, so compile is
                                          not applied and the result says so)
    sparse() -> paths                     submodules whose forward is the sparse_forward stage
                                          (default: the TorchRec embedding modules, by type)
    sharders(), constraints()             TorchRec sharders / ParameterConstraints (None: gembench's)
    unsupported                           stack switches this model cannot take (refused, exit 2)
    switches                              model switches (jagged, content) that for_stack() applies;
                                          for the rest the result says "not applicable"
    on_device(device_type) -> Workload    the workload as it runs there (default: itself)
    for_stack(options) -> Workload        the model a stack runs, same batches (default: itself)
    kind, fingerprint()                   the result's config kind and hash (default: "workload",
                                          a hash of tables, parameter shapes and batch spec)
    description                           one line for `gembench describe` (default: the class's)
    details() -> {title: {headers, rows[, note]}}   more of the model for `gembench describe`
    """

    name: str = ""
    global_batch: int = 0
    kind: str = "workload"
    description: str = ""
    unsupported: frozenset[str] = frozenset()
    switches: frozenset[str] = frozenset()

    def tables(self) -> list:
        raise NotImplementedError

    def build(self, device: torch.device) -> nn.Module:
        raise NotImplementedError

    def batch(self, i: int, rank: int = 0, world: int = 1, seed: int = 0):
        raise NotImplementedError

    def forward(self, model: nn.Module, batch):
        return model(batch)

    def loss(self, output, batch) -> torch.Tensor:
        raise NotImplementedError

    def forward_flops(self, batch) -> dict[str, float] | None:
        return None

    def pooling(self) -> dict[str, float]:
        return {}

    def row_skew(self) -> dict[str, float]:
        return {}

    def flops_per_example(self) -> dict[str, float] | None:
        return None

    def memory_estimate(
        self, batch: int, stack, device_type: str, shards: int, embedding_share: float = 1.0, on_rank: bool = False
    ) -> dict[str, float] | None:
        return None

    def blocks(self) -> tuple[str, ...]:
        return ()

    def checkpointed(self, mode: str) -> tuple[str, ...] | None:
        return {"none": (), "all": tuple(self.blocks())}.get(mode)

    def recomputed_flops(self, per_block: dict[str, float], mode: str) -> float:
        names = {n for p in self.checkpointed(mode) or () for n in (p, p.rpartition(".")[2])}
        return float(sum(v for k, v in per_block.items() if k in names))

    def compiled(self) -> tuple[str, ...]:
        return ()

    def sparse(self) -> tuple[str, ...]:
        return ()

    def sharders(self):
        return None

    def constraints(self):
        return None

    def on_device(self, device_type: str) -> Workload:
        return self

    def for_stack(self, options) -> Workload:
        return self

    def fingerprint(self) -> str | None:
        return None

    def details(self) -> dict:
        return {}


def torchrec_types() -> tuple[type, ...]:
    """The TorchRec embedding modules a model's sparse part is made of, plain, fused and sharded."""
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


def dense_roots(model: nn.Module, prefix: str = "") -> list[tuple[str, nn.Module]]:
    """The dense part of a model, read off its structure: the outermost submodules with parameters
    and no TorchRec module inside, in forward order. A child holding a TorchRec module is looked
    into, as is a container with no forward of its own (a ModuleDict or ModuleList: one module per
    sequence feature, say); modules without parameters (the pipeline's slots) are left out. FSDP2's
    roots (harness/train/parallelize.py) and the zoo's blocks (models/blocks.py) alike."""
    types, out = torchrec_types(), []
    for name, child in model.named_children():
        if isinstance(child, types) or not any(True for _ in child.parameters()):
            continue
        container = isinstance(child, (nn.ModuleDict, nn.ModuleList))
        if container or any(isinstance(m, types) for m in child.modules()):
            out += dense_roots(child, f"{prefix}{name}.")
        else:
            out.append((f"{prefix}{name}", child))
    return out


def zipf_share(lo: float, hi: float, rows: int, alpha: float) -> float:
    """What row_skew()'s exponents mean: the share of lookups of a table of ``rows`` rows whose IDs
    follow the bounded power law p(x) ~ x^-alpha (row 0 hottest) that land in rows [lo, hi).
    The law's CDF, F(x) = ((x + 1)^(1 - alpha) - 1) / ((rows + 1)^(1 - alpha) - 1), at hi minus at lo."""

    def cdf(x: float) -> float:
        if alpha == 0:
            return x / rows
        if abs(alpha - 1.0) < 1e-9:
            return math.log(x + 1) / math.log(rows + 1)
        e = 1.0 - alpha
        return ((x + 1) ** e - 1) / ((rows + 1) ** e - 1)

    return cdf(min(hi, rows)) - cdf(max(lo, 0))


def parse_args(pairs) -> dict:
    """``--model-arg key=value`` (repeatable) -> keyword arguments; values as Python literals
    where they parse (8, 0.5, True, [64, 32]), else strings."""
    out = {}
    for pair in pairs or ():
        key, sep, value = str(pair).partition("=")
        if not sep or not key.strip().isidentifier():
            raise UsageError(f"--model-arg takes KEY=VALUE with KEY a Python name, got {pair!r}")
        try:
            out[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            out[key.strip()] = value.strip()
    return out


def _import(spec: str, where: str):
    """The module of ``where`` (a dotted name or a .py path); any failure one line naming it."""
    try:
        if where.endswith(".py"):
            path = Path(where)
            if not path.is_file():
                raise UsageError(f"--model {spec}: no file {where}; give path/to/file.py:factory or pkg.module:factory")
            name = "gembench_workload_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
            if name in sys.modules:
                return sys.modules[name]
            loader = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(loader)
            sys.modules[name] = module
            try:
                loader.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
            return module
        return importlib.import_module(where)
    except UsageError:
        raise
    except BaseException as err:  # noqa: BLE001  the user's module: its own error's last line
        if isinstance(err, KeyboardInterrupt):
            raise
        last = f"{type(err).__name__}: {err}".strip().splitlines()[-1]
        raise UsageError(f"--model {spec}: {where} does not import ({last}); fix the module or the path") from None


def load_workload(spec: str, args=()) -> Workload:
    """The workload ``spec`` names (``pkg.mod:factory`` or ``path/file.py:factory``), made with
    ``args`` (KEY=VALUE strings or a dict); its tables checked. Records ``spec`` and ``args``."""
    where, sep, factory_name = str(spec).rpartition(":")
    if not sep or not where or not factory_name.isidentifier():
        raise UsageError(f"--model takes pkg.module:factory or path/to/file.py:factory, got {spec!r}")
    kwargs = dict(args) if isinstance(args, dict) else parse_args(args)
    module = _import(spec, where)
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        found = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))[:8]
        raise UsageError(
            f"--model {spec}: {where} has no factory {factory_name!r}; callables there: {', '.join(found) or 'none'}"
        )
    try:
        workload = factory(**kwargs)
    except TypeError as err:
        raise UsageError(
            f"--model {spec}: {factory_name}({', '.join(kwargs)}) failed: {err}; check --model-arg"
        ) from None
    if not isinstance(workload, Workload):
        raise UsageError(
            f"--model {spec}: {factory_name}() returned {type(workload).__name__}, not a gembench.workload.Workload; "
            "return an instance of a Workload subclass"
        )
    if not workload.name or not isinstance(workload.global_batch, int) or workload.global_batch < 1:
        raise UsageError(f"--model {spec}: the workload needs a name and a positive int global_batch")
    workload.spec, workload.args = str(spec), kwargs
    check_tables(workload)
    return workload


def check_global_batch(batch, nproc: int = 1) -> int:
    """``--batch``: a positive number of examples that splits evenly over ``nproc`` ranks."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise UsageError(f"--batch must be a positive number of examples, got {batch!r}")
    if batch % nproc:
        raise UsageError(
            f"--batch {batch} does not split evenly over --nproc {nproc} ranks: "
            f"pick a multiple of {nproc}, e.g. {max(nproc, batch - batch % nproc)}"
        )
    return batch


def check_tables(workload: Workload) -> list:
    """tables(): TorchRec EmbeddingBagConfig / EmbeddingConfig only, unique names."""
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig

    tables = list(workload.tables())
    for t in tables:
        if not isinstance(t, (EmbeddingBagConfig, EmbeddingConfig)):
            raise UsageError(
                f"{named(workload)}: tables() gave a {type(t).__name__}, not a TorchRec EmbeddingBagConfig "
                "or EmbeddingConfig; return torchrec.modules.embedding_configs objects"
            )
    names = [t.name for t in tables]
    if len(set(names)) != len(names) or not names:
        raise UsageError(f"{named(workload)}: tables() must give at least one table, names unique: {names}")
    return tables


def spec_of(workload: Workload) -> str:
    return getattr(workload, "spec", None) or workload.name


def named(workload: Workload) -> str:
    """How a message names the workload: as the user did, --config NAME (the zoo's) or --model SPEC."""
    return getattr(workload, "flag", None) or f"--model {spec_of(workload)}"


def check_switches(workload: Workload, used: dict) -> None:
    """Refuse a stack switch in use (``used``: name -> value) that the workload does not support."""
    for name in sorted(set(used) & set(workload.unsupported)):
        raise UsageError(
            f"{named(workload)}: the workload does not support {name}={used[name]}; "
            f"turn it off with --set {name}=... or pick another stack"
        )


def batch_fields(batch) -> dict:
    """A batch's fields: name -> Tensor or KeyedJaggedTensor (attributes, then dataclass fields)."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    items = vars(batch).items() if hasattr(batch, "__dict__") else ()
    return {k: v for k, v in items if isinstance(v, (torch.Tensor, KeyedJaggedTensor))}


def kjt_fields(batch) -> dict:
    """The batch's KeyedJaggedTensor fields by name: the IDs of the workload's tables."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    return {k: v for k, v in batch_fields(batch).items() if isinstance(v, KeyedJaggedTensor)}


def batch_spec(batch) -> dict:
    """The batch's shape as the result records it: tensors' dtype and shape, KJTs' keys."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    out = {}
    for k, v in sorted(batch_fields(batch).items()):
        if isinstance(v, KeyedJaggedTensor):
            out[k] = {"kjt": list(v.keys()), "stride": v.stride()}
        else:
            out[k] = {"dtype": str(v.dtype).removeprefix("torch."), "shape": list(v.shape)}
    return out


def check_batch(workload: Workload, batch, rank: int = 0, world: int = 1) -> None:
    """batch(): has .to(device); every KJT holds global_batch/world examples (its stride) of
    features a table has. Tensors are the workload's own: per example, or per item of a sequence
    (the zoo's item content), so their sizes are not checked here."""
    spec = named(workload)
    if not callable(getattr(batch, "to", None)):
        raise UsageError(f"{spec}: batch() gave a {type(batch).__name__} without .to(device); return a Pipelineable")
    expected = workload.global_batch // world
    features = {f for t in workload.tables() for f in t.feature_names}
    kjts = kjt_fields(batch)
    if not kjts:
        raise UsageError(f"{spec}: batch() has no KeyedJaggedTensor field; the tables' IDs go in one")
    for name, v in kjts.items():
        if v.stride() != expected:
            raise UsageError(
                f"{spec}: batch field {name!r} holds {v.stride()} examples, not global_batch/world = "
                f"{workload.global_batch}/{world} = {expected}; batch(i, rank, world, seed) gives one rank's slice"
            )
        if not set(v.keys()) <= features:
            unknown = sorted(set(v.keys()) - features)
            raise UsageError(f"{spec}: batch field {name!r} has keys {unknown} that no table's feature_names hold")


def workload_hash(workload: Workload, model: nn.Module, batch) -> str:
    """What identifies a workload across runs: its tables, parameter shapes, batch spec and args."""
    tables = [
        [type(t).__name__, t.name, t.num_embeddings, t.embedding_dim, list(t.feature_names)] for t in workload.tables()
    ]
    shapes = [[n, list(p.shape)] for n, p in model.named_parameters()]
    text = json.dumps(
        [workload.name, workload.global_batch, tables, shapes, batch_spec(batch)], sort_keys=True, default=str
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]
