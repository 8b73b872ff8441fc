"""The dense blocks of a model, read off its structure: the units parallelism and memory work on.

Each entry of a ``.layers`` ModuleList of a dense root (gembench.workload.dense_roots: HSTU's
SequenceArch, Wukong's InteractionArch) is a block; every other dense root is one whole. The sparse
arch is TorchRec's and never a dense block. The zoo names these blocks to the harness (blocks(),
checkpointed()), which checkpoints and shards them; models/memory.py sizes the largest one for the
FSDP memory estimate.
"""

from __future__ import annotations

from torch import nn

from gembench.workload import dense_roots


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
