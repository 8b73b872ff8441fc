"""TorchRec's own DLRM (torchrec.models.dlrm.DLRM) as a gembench workload, at the shapes of
gembench's `dlrm` config (models/configs/dlrm.toml): 26 one-hot tables of dim 128, 13 dense
features, dense arch 512-256-128, over arch 1024-1024-512-256-1, global batch 512.

    gembench check-model examples/torchrec_dlrm.py:dlrm
    gembench run --model examples/torchrec_dlrm.py:dlrm --model-arg max_rows=1000 --nproc 2
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.models.dlrm import DLRM
from torchrec.streamable import Pipelineable

from gembench.workload import Workload

ROWS = [100000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 100000, 100000, 100000, 10]
ROWS += [2209, 11938, 155, 4, 976, 14, 100000, 100000, 100000, 100000, 12973, 108, 36]


@dataclass
class Batch(Pipelineable):
    dense: torch.Tensor  # (B, 13)
    sparse: KeyedJaggedTensor  # one ID per table per example
    labels: torch.Tensor  # (B,)

    def to(self, device, non_blocking=False):
        return Batch(*(x.to(device, non_blocking=non_blocking) for x in (self.dense, self.sparse, self.labels)))

    def record_stream(self, stream):
        for x in (self.dense, self.sparse, self.labels):
            x.record_stream(stream)

    def pin_memory(self):
        return Batch(self.dense.pin_memory(), self.sparse.pin_memory(), self.labels.pin_memory())


class TorchRecDLRM(Workload):
    def __init__(self, batch: int = 512, max_rows: int = 100000, dim: int = 128):
        self.name, self.global_batch, self.dim = "torchrec-dlrm", batch, dim
        self.rows = [min(r, max_rows) for r in ROWS]
        self.dense_mlp, self.over_mlp = [512, 256, dim], [1024, 1024, 512, 256, 1]

    def tables(self):
        return [
            EmbeddingBagConfig(name=f"table_t{i}", embedding_dim=self.dim, num_embeddings=r, feature_names=[f"t{i}"])
            for i, r in enumerate(self.rows)
        ]

    def build(self, device):
        ebc = EmbeddingBagCollection(tables=self.tables(), device=device)
        return DLRM(ebc, 13, self.dense_mlp, self.over_mlp, dense_device=device)

    def batch(self, i, rank=0, world=1, seed=0):
        g = torch.Generator().manual_seed(seed * 1_000_003 + i * 1_009 + rank)  # batch i of rank r, any process
        b = self.global_batch // world
        rows = torch.tensor(self.rows)
        ids = (torch.rand(len(rows), b, generator=g) ** 3 * rows[:, None]).long()  # skewed: hot low IDs
        sparse = KeyedJaggedTensor.from_lengths_sync(
            keys=[f"t{k}" for k in range(len(rows))],
            values=ids.flatten(),
            lengths=torch.ones(len(rows) * b, dtype=torch.int32),
        )
        return Batch(torch.rand(b, 13, generator=g), sparse, (torch.rand(b, generator=g) < 0.25).float())

    def forward(self, model, batch):
        return model(batch.dense, batch.sparse)

    def loss(self, output, batch):
        return torch.nn.functional.binary_cross_entropy_with_logits(output.squeeze(-1), batch.labels)

    def forward_flops(self, batch):
        """Per block, one GEMM at a time: 2 x in x out per layer, plus the (F+1)^2 x D dot products."""
        b, f, d = batch.dense.shape[0], len(self.rows), self.dim

        def mlp(n, sizes):
            return sum(2 * a * c for a, c in zip([n, *sizes[:-1]], sizes))

        return {
            "dense_arch": float(b * mlp(13, self.dense_mlp)),
            "inter_arch": float(b * 2 * (f + 1) ** 2 * d),
            "over_arch": float(b * mlp(d + f * (f + 1) // 2, self.over_mlp)),
        }

    def pooling(self):
        return {t.name: 1.0 for t in self.tables()}

    def blocks(self):
        return ("dense_arch", "over_arch")

    def compiled(self):
        return ("dense_arch", "inter_arch", "over_arch")


def dlrm(batch: int = 512, max_rows: int = 100000, dim: int = 128) -> TorchRecDLRM:
    return TorchRecDLRM(batch, max_rows, dim)
