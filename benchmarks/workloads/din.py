"""A DIN-style ranking model (Zhou et al., Deep Interest Network, 2018), written from docs/workload.md
alone as a team would: the candidate item attends over the user's click history, history and
candidate looked up in one shared item table (a TorchRec EmbeddingCollection), pooled user features
in an EmbeddingBagCollection. No FLOPs formula: the harness counts them. Steps of 10-50 ms on a
2-core CPU: the fast model of benchmarks/fast_verdicts.py.

    gembench check-model benchmarks/workloads/din.py:din
    gembench run --model benchmarks/workloads/din.py:din --model-arg batch=256
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection, EmbeddingConfig, KeyedJaggedTensor
from torchrec.streamable import Pipelineable

from gembench.workload import Workload

USER = {"user_id": 100_000, "user_segment": 1_000, "user_city": 5_000}  # pooled, one ID each
ITEMS = 200_000  # the shared item table: history and candidate


@dataclass
class Batch(Pipelineable):
    user: KeyedJaggedTensor  # one ID per example and feature
    items: KeyedJaggedTensor  # hist_items (jagged) and cand_item (one per example)
    labels: torch.Tensor

    def to(self, device, non_blocking=False):
        return Batch(*(x.to(device, non_blocking=non_blocking) for x in (self.user, self.items, self.labels)))

    def record_stream(self, stream):
        self.user.record_stream(stream)
        self.items.record_stream(stream)
        self.labels.record_stream(stream)

    def pin_memory(self):
        return Batch(self.user.pin_memory(), self.items.pin_memory(), self.labels.pin_memory())


class Attention(nn.Module):
    """DIN's local activation unit: a weight per history item from [h, c, h*c, h-c]."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(4 * dim, hidden), nn.Sigmoid(), nn.Linear(hidden, 1))

    def forward(self, history, mask, candidate):  # (B, L, D), (B, L), (B, D) -> (B, D)
        c = candidate.unsqueeze(1).expand_as(history)
        w = self.mlp(torch.cat([history, c, history * c, history - c], dim=-1)).squeeze(-1)
        return (w.masked_fill(~mask, 0.0).unsqueeze(-1) * history).sum(dim=1)


class DINModel(nn.Module):
    def __init__(self, dim: int, max_len: int, hidden: list[int], device=None):
        super().__init__()
        self.max_len = max_len
        self.user_ebc = EmbeddingBagCollection(
            tables=[EmbeddingBagConfig(name=f"t_{f}", embedding_dim=dim, num_embeddings=n, feature_names=[f])
                    for f, n in USER.items()],
            device=device,
        )  # fmt: skip
        self.item_ec = EmbeddingCollection(
            tables=[EmbeddingConfig(name="t_items", embedding_dim=dim, num_embeddings=ITEMS,
                                    feature_names=["hist_items", "cand_item"])],
            device=device,
        )  # fmt: skip
        self.attention = Attention(dim, 36)
        sizes = [dim * (len(USER) + 2), *hidden]
        self.mlp = nn.Sequential(*[m for a, b in zip(sizes, sizes[1:]) for m in (nn.Linear(a, b), nn.ReLU())])
        self.out = nn.Linear(sizes[-1], 1)

    def forward(self, batch: Batch) -> torch.Tensor:
        user = self.user_ebc(batch.user)
        items = self.item_ec(batch.items)
        hist, cand = items["hist_items"], items["cand_item"]
        history = hist.to_padded_dense(self.max_len)  # (B, L, D)
        lengths = hist.lengths()
        mask = torch.arange(self.max_len, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)
        candidate = cand.values()  # one per example
        interest = self.attention(history, mask, candidate)
        x = torch.cat([*(user[f] for f in USER), interest, candidate], dim=1)
        return self.out(self.mlp(x)).squeeze(-1)


class DIN(Workload):
    def __init__(self, batch: int = 256, dim: int = 32, max_len: int = 50, hidden=(200, 80)):
        self.name, self.global_batch, self.dim, self.max_len = "din", batch, dim, max_len
        self.hidden = list(hidden)

    def tables(self):
        model = self.build(torch.device("meta"))
        return model.user_ebc.embedding_bag_configs() + model.item_ec.embedding_configs()

    def build(self, device):
        return DINModel(self.dim, self.max_len, self.hidden, device=device).to(device)

    def batch(self, i, rank=0, world=1, seed=0):
        g = torch.Generator().manual_seed(seed * 1_000_003 + i * 1_009 + rank)
        b = self.global_batch // world
        user = KeyedJaggedTensor.from_lengths_sync(
            list(USER),
            torch.cat([(torch.rand(b, generator=g) ** 3 * n).long() for n in USER.values()]),
            torch.ones(b * len(USER), dtype=torch.int32),
        )
        hist_len = torch.randint(1, self.max_len + 1, (b,), generator=g)
        hist = (torch.rand(int(hist_len.sum()), generator=g) ** 3 * ITEMS).long()
        cand = (torch.rand(b, generator=g) ** 3 * ITEMS).long()
        items = KeyedJaggedTensor.from_lengths_sync(
            ["hist_items", "cand_item"],
            torch.cat([hist, cand]),
            torch.cat([hist_len, torch.ones(b, dtype=torch.long)]).int(),
        )
        return Batch(user, items, (torch.rand(b, generator=g) < 0.1).float())

    def loss(self, output, batch):
        return nn.functional.binary_cross_entropy_with_logits(output, batch.labels)

    def pooling(self):
        return {"t_items": (self.max_len + 1) / 2 + 1}

    def blocks(self):
        return ("attention", "mlp")

    def compiled(self):
        return ("attention", "mlp")


def din(batch: int = 256, dim: int = 32, max_len: int = 50) -> DIN:
    return DIN(batch=batch, dim=dim, max_len=max_len)
