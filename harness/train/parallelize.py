"""GEM's dense-side techniques, applied to a pure model from outside (as torchtitan's parallelize).

    apply_ac(model, mode)                   activation checkpointing around blocks
    apply_fsdp(model, mesh, bf16)           FSDP2 fully_shard per dense block and per dense root
    apply_compile(model, options)           torch.compile of the dense half

The model modules know nothing of these. What is a "dense block" is read off the model's
structure (models/blocks.py); the sparse arch is TorchRec's, sharded by
DistributedModelParallel, and never touched here.
"""

from __future__ import annotations

import torch
from torch import nn

from gembench.errors import UsageError
from gembench.models.zoo import dense_blocks, dense_roots, hstu_layer_type


def checkpointed(model: nn.Module, mode: str) -> list[tuple[str, nn.Module]]:
    """The blocks ``mode`` checkpoints: none, each HSTU layer ("hstu"), every dense block ("all")."""
    HSTULayer = hstu_layer_type()
    if mode == "none":
        return []
    if mode == "hstu":
        return [(p, b) for p, b in dense_blocks(model) if isinstance(b, HSTULayer)]
    if mode == "all":
        return dense_blocks(model)
    raise UsageError(f"activation_checkpointing must be none, hstu or all, got {mode!r}")


# which of the analytic per-block FLOPs (models/flops.py forward_flops keys) a mode recomputes
RECOMPUTED_BLOCKS = {"none": (), "hstu": ("sequence_arch",), "all": None}  # None: every block


def recomputed_forward_flops(per_block: dict[str, float], mode: str) -> float:
    """Forward FLOPs run again in the backward under ``mode``: the checkpointed blocks' forward."""
    names = RECOMPUTED_BLOCKS[mode]
    return float(sum(per_block.values()) if names is None else sum(per_block.get(n, 0.0) for n in names))


def apply_ac(model: nn.Module, mode: str) -> int:
    """Wrap the blocks of ``mode`` in torch's non-reentrant activation checkpointing, in place.

    A checkpointed block keeps only its inputs for the backward and runs its forward again there:
    activation memory for FLOPs (HFU - MFU = the recomputed share). Returns the blocks wrapped.
    """
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    blocks = checkpointed(model, mode)
    for path, block in blocks:
        parent_path, _, leaf = path.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        # preserve_rng_state only for a block that draws random numbers (dropout, as DLRMv4's
        # HSTU layers): its recompute must draw the same masks; keeping the RNG state costs a
        # copy per block per step. early_stop off: the whole forward is run again, so what is
        # recomputed is the block's forward formula exactly (HFU); early stop would skip the ops
        # after the last saved tensor (an HSTU layer's output projection).
        random = any(isinstance(m, nn.Dropout) and m.p > 0 for m in block.modules())
        wrapped = checkpoint_wrapper(
            block, checkpoint_impl=CheckpointImpl.NO_REENTRANT, preserve_rng_state=random, early_stop=False
        )
        if isinstance(parent, (nn.ModuleList, nn.ModuleDict)):
            parent[int(leaf) if isinstance(parent, nn.ModuleList) else leaf] = wrapped
        else:
            setattr(parent, leaf, wrapped)
    return len(blocks)


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


def apply_fsdp(model: nn.Module, mesh, bf16: bool, blocks=None, roots=None) -> int:
    """FSDP2 ``fully_shard`` on each dense block, then on each dense root that holds blocks.

    Parameters are sharded over the mesh's "shard" dimension (and replicated over "replicate"
    for HSDP); with ``bf16`` they are all-gathered in bf16 and gradients reduced in fp32
    (MixedPrecisionPolicy), as GEM's bf16 training does. The roots' own forward all-gathers
    the leftover parameters and drives the blocks' prefetch. ``blocks``, ``roots``: (path,
    module) pairs of a model that is not the zoo's (generic.fsdp_units); by default the zoo's,
    read off its structure. Returns the modules sharded.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None, reduce_dtype=torch.float32)
    blocks = dense_blocks(model) if blocks is None else blocks
    roots = dense_roots(model) if roots is None else roots
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


def apply_compile(model: nn.Module, options) -> None:
    """torch.compile the dense arch (the model's ``dense`` module) in place when the stack says so."""
    if options.compile:
        # Jagged batches change T every step: compile for dynamic shapes once, not per batch.
        model.dense = torch.compile(model.dense, dynamic=True)
