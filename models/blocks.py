"""The dense blocks of a model, read off its structure: the units parallelism and memory work on.

Each entry of a ``.layers`` ModuleList of a top-level dense module (HSTU's SequenceArch, Wukong's
InteractionArch) is a block; every other top-level dense module is one whole. The sparse arch is
TorchRec's and never a dense block. harness/train/parallelize.py checkpoints and shards these blocks;
models/memory.py sizes the largest one for the FSDP memory estimate.
"""

from __future__ import annotations

from torch import nn


def dense_roots(model: nn.Module, prefix: str = "") -> list[tuple[str, nn.Module]]:
    """The model's top-level dense modules, in forward order: everything but the sparse arch.

    A container holding the sparse arch (TorchRec's DLRM inside ReferenceDLRM) is looked into,
    as is a ModuleDict (one module per sequence feature); modules without parameters (the
    pipeline's slots) are left out.
    """
    out = []
    for name, child in model.named_children():
        path = f"{prefix}{name}"
        if name == "sparse_arch" or not any(True for _ in child.parameters()):
            continue
        if isinstance(child, nn.ModuleDict) or any(n == "sparse_arch" for n, _ in child.named_children()):
            out += dense_roots(child, f"{path}.")
        else:
            out.append((path, child))
    return out


def dense_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The dense blocks in forward order: each ``.layers`` entry of a root that stacks layers, or
    the root itself (docs/design.md section 7: what "every dense block" means)."""
    out = []
    for path, root in dense_roots(model):
        layers = getattr(root, "layers", None)
        if isinstance(layers, nn.ModuleList) and len(layers):
            out += [(f"{path}.layers.{i}", layer) for i, layer in enumerate(layers)]
        else:
            out.append((path, root))
    return out


def largest_block_params(model: nn.Module) -> int:
    """Parameters of the largest dense block: what FSDP holds unsharded while it runs."""
    return max((sum(p.numel() for p in block.parameters()) for _, block in dense_blocks(model)), default=0)
