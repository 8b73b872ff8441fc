"""SparseArch: TorchRec embedding modules for the pooled features and the sequence items.

Plain TorchRec modules (EmbeddingBagCollection, EmbeddingCollection) so that
DistributedModelParallel can shard them from outside; nothing here knows about ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torchrec import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    KeyedJaggedTensor,
    PoolingType,
)

from gembench.models.config import ModelConfig


def is_embedding_parameter(name: str) -> bool:
    """Whether a parameter name (from model.named_parameters()) belongs to an embedding table.

    GEM keeps its tables under ``sparse_arch``; TorchRec's DLRM under ``embedding_bag_collection``.
    """
    return "sparse_arch" in name or "embedding_bag_collection" in name


@dataclass
class Jagged:
    """One jagged sequence feature: values (T, d) and offsets (B + 1,) into them."""

    values: torch.Tensor
    offsets: torch.Tensor
    max_len: int


def pooled_tables(cfg: ModelConfig) -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(
            name=f"table_t{i}",
            embedding_dim=cfg.sparse.dim,
            num_embeddings=rows,
            feature_names=[f"t{i}"],
            pooling=PoolingType.SUM,
        )
        for i, rows in enumerate(cfg.sparse.rows)
    ]


def sequence_tables(cfg: ModelConfig) -> list[EmbeddingConfig]:
    return [
        EmbeddingConfig(
            name=f"table_{s.name}",
            embedding_dim=cfg.hstu.dim,
            num_embeddings=s.rows,
            feature_names=[s.name],
        )
        for s in cfg.sequences
    ]


class SparseArch(nn.Module):
    """Embeds the sparse features.

    forward(sparse, seq):
        sparse: KeyedJaggedTensor, F pooled features -> pooled (B, F, sparse.dim)
        seq:    KeyedJaggedTensor, S sequence features -> {name: Jagged((T_s, hstu.dim), offsets)}
    """

    def __init__(self, cfg: ModelConfig, device: torch.device | str | None = None):
        super().__init__()
        self.feature_names = [f"t{i}" for i in range(len(cfg.sparse.rows))]
        self.max_len = {s.name: s.max_len for s in cfg.sequences}
        self.pooled = EmbeddingBagCollection(tables=pooled_tables(cfg), device=torch.device(device or "cpu"))
        self.sequence = (
            EmbeddingCollection(tables=sequence_tables(cfg), device=torch.device(device or "cpu"))
            if cfg.sequences
            else None
        )

    def forward(self, sparse: KeyedJaggedTensor, seq: KeyedJaggedTensor | None):
        kt = self.pooled(sparse)
        # One table per feature, all of one width. Read by feature name: a sharded collection's
        # KeyedTensor lists its keys by sharding type, then by rank (TorchRec's own DLRM reads it
        # by name too), so its columns are in config order only where its keys are (then a view).
        if kt.keys() == self.feature_names:
            values = kt.values()
        else:
            by_name = kt.to_dict()
            values = torch.cat([by_name[f] for f in self.feature_names], dim=1)
        pooled = values.view(-1, len(self.feature_names), values.shape[1] // len(self.feature_names))
        sequences = {}
        if self.sequence is not None and seq is not None:
            for name, jt in self.sequence(seq).items():
                sequences[name] = Jagged(jt.values(), jt.offsets(), self.max_len[name])
        return pooled, sequences
