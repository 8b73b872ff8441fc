"""Reference baselines: MLPerf DLRM and DLRM-DCNv2, built from TorchRec's own DLRM modules.

TorchRec ships both (torchrec.models.dlrm); we wrap them only to expose the same two halves as
the GEM-like model, embed(batch) and dense(batch, embedded), so the staged step can time them.
"""

from __future__ import annotations

import torch
from torch import nn
from torchrec import EmbeddingBagCollection
from torchrec.models.dlrm import DLRM, DLRM_DCN

from gembench.models.config import ModelConfig
from gembench.models.heads import mlp_flops
from gembench.models.sparse import pooled_tables


class ReferenceDLRM(nn.Module):
    """DLRM (dot interaction) or DLRM-DCNv2 (low-rank cross network).

    embed(batch) -> (B, F, D) pooled embeddings (TorchRec SparseArch)
    dense(batch, embedded) -> logits (B, 1): DenseArch, InteractionArch, OverArch
    """

    def __init__(self, cfg: ModelConfig, device: torch.device | str | None = None):
        super().__init__()
        device = torch.device(device or "cpu")
        ebc = EmbeddingBagCollection(tables=pooled_tables(cfg), device=device)
        common = dict(
            embedding_bag_collection=ebc,
            dense_in_features=cfg.data.dense_features,
            dense_arch_layer_sizes=list(cfg.dense.mlp),
            over_arch_layer_sizes=list(cfg.over.mlp) + [cfg.over.tasks],
            dense_device=device,
        )
        if cfg.kind == "dcnv2":
            self.net = DLRM_DCN(dcn_num_layers=cfg.dcn.layers, dcn_low_rank_dim=cfg.dcn.rank, **common)
        else:
            self.net = DLRM(**common)

    @property
    def sparse_arch(self) -> nn.Module:
        return self.net.sparse_arch

    def embed(self, batch):
        return self.net.sparse_arch(batch.sparse)

    def dense(self, batch, embedded: torch.Tensor) -> torch.Tensor:
        d = self.net.dense_arch(batch.dense)
        x = self.net.inter_arch(dense_features=d, sparse_features=embedded)
        return self.net.over_arch(x)

    def forward(self, batch) -> torch.Tensor:
        return self.dense(batch, self.embed(batch))


def reference_flops_per_example(cfg: ModelConfig) -> dict[str, float]:
    """Forward FLOPs per example by block, following TorchRec's layers one GEMM at a time."""
    f, d = len(cfg.sparse.rows), cfg.sparse.dim
    flops = {"dense_arch": mlp_flops(cfg.data.dense_features, cfg.dense.mlp)}
    if cfg.kind == "dcnv2":
        width = (f + 1) * d
        # LowRankCrossNet: x_{l+1} = x_0 * (W (V x_l) + b) + x_l, V: width -> rank, W: rank -> width
        flops["interaction_arch"] = cfg.dcn.layers * 2 * (2 * width * cfg.dcn.rank)
        over_in = width
    else:
        # pairwise dot products of the F + 1 vectors: one (F+1, D) x (D, F+1) matmul per example
        flops["interaction_arch"] = 2.0 * (f + 1) ** 2 * d
        over_in = d + f * (f + 1) // 2
    flops["over_arch"] = mlp_flops(over_in, list(cfg.over.mlp) + [cfg.over.tasks])
    return flops
