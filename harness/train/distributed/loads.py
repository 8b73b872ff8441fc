"""The measured embedding load of one rank: what its shards really look up, counted on the
KJTs that its input dist delivers (outside the timed steps)."""

from __future__ import annotations

import torch
from torch import nn


def local_dims(module: nn.Module) -> list[dict[str, int]]:
    """Per sharding of a sharded module: feature -> width of this rank's shard of its table."""
    out = []
    shardings = getattr(module, "_embedding_shardings", None)
    if shardings is None:  # EmbeddingCollection keeps them by type, in input-dist order
        shardings = list(module._sharding_type_to_sharding.values())
    for sharding in shardings:
        groups = getattr(sharding, "_grouped_embedding_configs", None)
        if groups is None:  # table-row-wise keeps them per node
            per_node = getattr(sharding, "_grouped_embedding_configs_per_node", [])
            groups = [g for node in per_node for g in node]
        dims = {}
        for group in groups:
            for table in group.embedding_tables:
                for f in table.feature_names:
                    dims[f] = table.local_cols
        out.append(dims)
    return out


def lookup_load(modules: list[tuple[str, nn.Module]], dist_inputs: list) -> dict[str, float]:
    """IDs this rank looked up, unique IDs, and the bytes its lookups move, from the KJTs its shards
    received: rows read, and outputs written (a pooled shard writes one row of its width per bag,
    whatever the bag's IDs; a sequence shard one per ID). Read plus written is what TorchRec's
    planner prices a lookup by, so it is what the planned loads compare with."""
    ids = unique = read = written = 0
    for (_, module), kjts in zip(modules, dist_inputs):
        pooled = hasattr(module, "_embedding_shardings")  # an EmbeddingBagCollection's, not a sequence's
        for dims, kjt in zip(local_dims(module), kjts):
            itemsize = 4  # fp32 tables
            values = kjt.values()
            per_key = torch.split(values, [int(x) for x in kjt.length_per_key()]) if len(kjt.keys()) else []
            bags = kjt.stride() if len(kjt.keys()) else 0
            for key, v in zip(kjt.keys(), per_key):
                width = dims.get(key, 0) * itemsize
                ids += v.numel()
                unique += int(torch.unique(v).numel())
                read += v.numel() * width
                written += (bags if pooled else v.numel()) * width
    return {
        "ids": float(ids),
        "unique_ids": float(unique),
        "bytes_read": float(read),
        "bytes_written": float(written),
        "bytes_moved": float(read + written),
    }


def measure_loads(feeds: list[tuple[str, nn.Module]], batches, device: torch.device) -> dict[str, float]:
    """Mean per-step lookup load of this rank over ``batches``: each batch's real input dist,
    counted on what arrives (run outside the timed steps, so counting costs no step time).
    ``feeds``: (batch field, sharded module) for the modules fed one field whole (rank.module_fields);
    0 where there is none (the planner's estimate then stands alone)."""
    if not feeds:
        return {"ids": 0.0, "unique_ids": 0.0, "bytes_read": 0.0, "bytes_written": 0.0, "bytes_moved": 0.0}
    total: dict[str, float] = {}
    with torch.no_grad():
        for b in batches:
            b = b.to(device)
            inputs = []
            for field, module in feeds:
                ctx = module.create_context()
                inputs.append(module.input_dist(ctx, getattr(b, field)).wait().wait())
            for k, v in lookup_load(feeds, inputs).items():
                total[k] = total.get(k, 0.0) + v
    return {k: v / len(batches) for k, v in total.items()}
