"""Loading a workload and checking what it gives (docs/workload.md): the protocol's other half.

``load_workload`` turns ``--model pkg.mod:factory`` (or ``path/file.py:factory``) and its
``--model-arg``s into a checked gembench.workload.Workload; the ``check_*`` validators refuse, in
one line naming the model and what to do (exit 2), what the harness cannot take; ``batch_spec``
and ``workload_hash`` are a workload's identity as a result records it. This module imports only
gembench.workload and gembench.errors: models/ and the harness import it, never the reverse.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import json
import sys
from pathlib import Path

import torch
from torch import nn

from gembench.errors import UsageError
from gembench.workload import Workload


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
