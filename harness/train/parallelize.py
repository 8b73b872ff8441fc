"""GEM's dense-side techniques, applied to a pure model from outside (as torchtitan's parallelize).

    apply_ac(workload, model, mode)         activation checkpointing around the blocks it names
    apply_fsdp(model, mesh, bf16, blocks, roots)   FSDP2 fully_shard per dense block and dense root
    apply_compile(workload, model, options) torch.compile of what the workload names

The model modules know nothing of these. Which blocks a mode checkpoints, which submodules are
dense blocks and what is compiled, the workload says (workload.py: checkpointed(),
blocks(), compiled()); the dense roots are read off the model's structure (everything with
parameters outside TorchRec's modules). The sparse part is TorchRec's, sharded by
DistributedModelParallel, and never touched here.
"""

from __future__ import annotations

import torch
from torch import nn

from gembench.errors import UsageError
from gembench.loader import named
from gembench.workload import Workload, dense_roots, torchrec_types


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


def submodule(workload: Workload, model: nn.Module, path: str, what: str) -> nn.Module:
    """``model``'s submodule at ``path``, which the workload's ``what`` names; one line if none."""
    try:
        return model.get_submodule(path)
    except AttributeError:
        raise UsageError(f"{named(workload)}: {what} names {path!r}, which the model has no submodule of") from None


def replace_submodule(model: nn.Module, path: str, module: nn.Module) -> None:
    parent_path, _, leaf = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    if isinstance(parent, nn.ModuleList):
        parent[int(leaf)] = module
    elif isinstance(parent, nn.ModuleDict):
        parent[leaf] = module
    else:
        setattr(parent, leaf, module)


def apply_ac(workload: Workload, model: nn.Module, mode: str) -> int:
    """Wrap the blocks the workload checkpoints under ``mode`` (checkpointed(mode)) in torch's
    non-reentrant activation checkpointing, in place; returns the blocks wrapped.

    A checkpointed block keeps only its inputs for the backward and runs its forward again there:
    activation memory for FLOPs (HFU - MFU = the recomputed share).
    """
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    paths = workload.checkpointed(mode) or ()
    for path in paths:
        block = submodule(workload, model, path, f"checkpointed({mode!r})")
        # preserve_rng_state only for a block that draws random numbers (dropout, as DLRMv4's
        # HSTU layers): its recompute must draw the same masks; keeping the RNG state costs a
        # copy per block per step. early_stop off: the whole forward is run again, so what is
        # recomputed is the block's forward formula exactly (HFU); early stop would skip the ops
        # after the last saved tensor (an HSTU layer's output projection).
        random = any(isinstance(m, nn.Dropout) and m.p > 0 for m in block.modules())
        wrapped = checkpoint_wrapper(
            block, checkpoint_impl=CheckpointImpl.NO_REENTRANT, preserve_rng_state=random, early_stop=False
        )
        replace_submodule(model, path, wrapped)
    return len(paths)


def fsdp_units(workload: Workload, model: nn.Module) -> tuple[list, list]:
    """(blocks, roots) FSDP2 shards: the blocks the workload names (blocks()), else its dense
    roots; then the roots that hold them. A dense parameter outside every root (held beside a
    TorchRec module) is refused: nothing would sync it."""
    roots = dense_roots(model)
    blocks = [(p, submodule(workload, model, p, "blocks()")) for p in workload.blocks()] or roots
    covered = {id(p) for _, m in roots + blocks for p in m.parameters()}
    tables = embedding_parameters(model)
    loose = [n for n, p in model.named_parameters() if id(p) not in covered and id(p) not in tables]
    if loose:
        raise UsageError(
            f"{named(workload)}: dense_parallel=fsdp shards submodules, and {loose[0]} is held beside a "
            "TorchRec module, in no dense submodule; move it into one or use dense_parallel=ddp"
        )
    return blocks, roots


HSDP_ONE_NODE = (
    "dense_parallel=hsdp replicates across nodes and shards within one: it needs "
    "torchrun --nnodes 2 or more; on one node use dense_parallel=fsdp"
)


def dense_mesh(mode: str, world: int, local_world: int, device_type: str):
    """The device mesh of the dense part: 1-D over all ranks (fsdp), or (nodes, ranks per node)
    for hsdp, replicas across nodes and shards within one."""
    from torch.distributed.device_mesh import init_device_mesh

    if mode == "fsdp":
        return init_device_mesh(device_type, (world,), mesh_dim_names=("shard",))
    if mode == "hsdp":
        if world <= local_world:
            raise UsageError(HSDP_ONE_NODE)
        return init_device_mesh(device_type, (world // local_world, local_world), mesh_dim_names=("replicate", "shard"))
    raise UsageError(f"dense_parallel must be ddp, fsdp or hsdp, got {mode!r}")


def dense_shards(mode: str, world: int, local_world: int) -> int:
    """Ranks one dense parameter is split over: none under ddp, all under fsdp, a node's under hsdp."""
    return {"ddp": 1, "fsdp": world, "hsdp": local_world}[mode]


def apply_fsdp(model: nn.Module, mesh, bf16: bool, blocks: list, roots: list) -> int:
    """FSDP2 ``fully_shard`` on each dense block, then on each dense root that holds blocks.

    Parameters are sharded over the mesh's "shard" dimension (and replicated over "replicate"
    for HSDP); with ``bf16`` they are all-gathered in bf16 and gradients reduced in fp32
    (MixedPrecisionPolicy), as GEM's bf16 training does. The roots' own forward all-gathers
    the leftover parameters and drives the blocks' prefetch. ``blocks``, ``roots``: (path,
    module) pairs (fsdp_units). Returns the modules sharded.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None, reduce_dtype=torch.float32)
    roots = [(p, r) for p, r in roots if all(b is not r for _, b in blocks)]
    for _, module in blocks + roots:
        fully_shard(module, mesh=mesh, mp_policy=policy)
    return len(blocks) + len(roots)


def dense_state_bytes(params, optimizer) -> dict[str, int]:
    """This rank's dense training state, measured from its tensors: the parameters as stored
    (FSDP: the local shard), their gradients (the same shapes, held from the backward to the
    optimizer step) and the optimizer's state for them (Adam's m and v)."""
    from torch.distributed.tensor import DTensor

    def nbytes(t) -> int:
        t = t.to_local() if isinstance(t, DTensor) else t
        return t.numel() * t.element_size()

    ids = {id(p) for p in params}
    state = getattr(optimizer, "state", {})
    opt = sum(
        nbytes(v) for p, st in state.items() if id(p) in ids for v in st.values() if torch.is_tensor(v) and v.dim() > 0
    )
    weights = sum(nbytes(p) for p in params)
    return {"params": weights, "grads": weights, "optimizer": opt, "total": 2 * weights + opt}


def apply_compile(workload: Workload, model: nn.Module, options) -> None:
    """compile=on: what the workload names in compiled(), in place, for dynamic shapes (jagged
    batches change their sizes every step: compile once, not per batch). A submodule has its
    forward compiled; a method of the model (the zoo's "dense", its dense half) is replaced by its
    compiled function. Not Module.compile: a module's compiled call traces the saved-tensor hooks
    the harness counts activation memory with (memory.SavedForBackward), a graph break at each
    saved tensor and recompiles past dynamo's limit; a compiled forward saves the same tensors."""
    if not options.compile:
        return
    # each fused CPU kernel in a profiler range of its name, so that the op table times it (a
    # range costs a flag test while no profiler runs)
    import torch._inductor.config

    torch._inductor.config.cpp.enable_kernel_profile = True
    for path in workload.compiled():
        parent_path, _, leaf = path.rpartition(".")
        parent = submodule(workload, model, parent_path, "compiled()") if parent_path else model
        target = getattr(parent, leaf, None)
        if isinstance(target, nn.Module):
            parent, leaf, target = target, "forward", target.forward
        if not callable(target):
            raise UsageError(f"{named(workload)}: compiled() names {path!r}, which is no submodule or method")
        setattr(parent, leaf, torch.compile(target, dynamic=True))
