"""A two-tower retrieval model: a query tower and an item tower over TorchRec
EmbeddingBagCollections, trained with an in-batch softmax (each query's positive is its own
item, the rest of the batch its negatives). No FLOPs formula: the harness counts them.

    gembench check-model examples/two_tower.py:two_tower
    gembench run --model examples/two_tower.py:two_tower --nproc 2
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.streamable import Pipelineable

from gembench.workload import Workload

QUERY = {"user_id": 50000, "query_terms": 20000}  # feature -> rows
ITEM = {"item_id": 100000, "item_category": 500}
MEAN_TERMS = 6  # query_terms is multi-hot


@dataclass
class Batch(Pipelineable):
    query: KeyedJaggedTensor
    item: KeyedJaggedTensor

    def to(self, device, non_blocking=False):
        return Batch(self.query.to(device, non_blocking=non_blocking), self.item.to(device, non_blocking=non_blocking))

    def record_stream(self, stream):
        self.query.record_stream(stream)
        self.item.record_stream(stream)

    def pin_memory(self):
        return Batch(self.query.pin_memory(), self.item.pin_memory())


class TwoTowerModel(nn.Module):
    def __init__(self, query_ebc, item_ebc, dim: int, layers: list[int]):
        super().__init__()
        self.query_ebc, self.item_ebc = query_ebc, item_ebc

        def tower(n):
            sizes = [n, *layers]
            mods = [m for a, b in zip(sizes, sizes[1:]) for m in (nn.Linear(a, b), nn.ReLU())][:-1]
            return nn.Sequential(*mods)

        self.query_tower, self.item_tower = tower(dim * len(QUERY)), tower(dim * len(ITEM))

    def forward(self, batch):
        # by feature name: a sharded collection's KeyedTensor need not keep the tables' order
        query, item = self.query_ebc(batch.query), self.item_ebc(batch.item)
        q = self.query_tower(torch.cat([query[f] for f in QUERY], dim=1))
        i = self.item_tower(torch.cat([item[f] for f in ITEM], dim=1))
        return nn.functional.normalize(q, dim=-1), nn.functional.normalize(i, dim=-1)


class TwoTower(Workload):
    def __init__(self, batch: int = 256, dim: int = 64, layers=(256, 128), max_rows: int = 100000, temperature=0.05):
        self.name, self.global_batch, self.dim, self.layers = "two-tower", batch, dim, list(layers)
        self.max_rows, self.temperature = max_rows, temperature

    def _configs(self, features):
        return [
            EmbeddingBagConfig(
                name=f"table_{f}", embedding_dim=self.dim, num_embeddings=min(r, self.max_rows), feature_names=[f]
            )
            for f, r in features.items()
        ]

    def tables(self):
        return self._configs(QUERY) + self._configs(ITEM)

    def build(self, device):
        q = EmbeddingBagCollection(tables=self._configs(QUERY), device=device)
        i = EmbeddingBagCollection(tables=self._configs(ITEM), device=device)
        return TwoTowerModel(q, i, self.dim, self.layers).to(device)

    def _kjt(self, features, b, g):
        keys, values, lengths = list(features), [], []
        for f in keys:
            n = (
                torch.randint(1, 2 * MEAN_TERMS, (b,), generator=g)
                if f == "query_terms"
                else torch.ones(b, dtype=torch.long)
            )
            rows = min(features[f], self.max_rows)
            values.append((torch.rand(int(n.sum()), generator=g) ** 2 * rows).long())
            lengths.append(n)
        return KeyedJaggedTensor.from_lengths_sync(keys, torch.cat(values), torch.cat(lengths).int())

    def batch(self, i, rank=0, world=1, seed=0):
        g = torch.Generator().manual_seed(seed * 1_000_003 + i * 1_009 + rank)  # batch i of rank r, any process
        b = self.global_batch // world
        return Batch(self._kjt(QUERY, b, g), self._kjt(ITEM, b, g))

    def loss(self, output, batch):
        q, i = output
        logits = q @ i.T / self.temperature  # in-batch softmax: the diagonal is the positive
        return nn.functional.cross_entropy(logits, torch.arange(q.shape[0], device=q.device))

    def pooling(self):
        return {"table_query_terms": float(MEAN_TERMS)}

    def blocks(self):
        return ("query_tower", "item_tower")

    def compiled(self):
        return ("query_tower", "item_tower")


def two_tower(batch: int = 256, dim: int = 64, max_rows: int = 100000) -> TwoTower:
    return TwoTower(batch=batch, dim=dim, max_rows=max_rows)
