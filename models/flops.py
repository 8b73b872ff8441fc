"""Analytic FLOPs, embedding bytes and memory of a config, from the blocks' own formulas.

Forward FLOPs come per block from the functions that sit next to each block (hstu.py,
wukong.py, cross.py, heads.py, dlrm.py), evaluated on a batch's real jagged lengths. Training
FLOPs are 3x forward (DESIGN.md section 2). Embedding lookups are not FLOPs: they are reported
as bytes read and written.
"""

from __future__ import annotations

import numpy as np
import torch

from gembench.models.config import ModelConfig
from gembench.models.cross import nonseq_summary_flops, summary_flops
from gembench.models.data import SEQUENCE_SIGMA, truncated_lognormal
from gembench.models.dlrm import reference_flops_per_example
from gembench.models.gem import interaction_tokens
from gembench.models.heads import mlp_flops, over_arch_flops
from gembench.models.hstu import sequence_arch_flops
from gembench.models.sparse import is_embedding_parameter
from gembench.models.wukong import interaction_arch_flops

TRAIN_FLOPS_PER_FORWARD = 3.0  # forward + backward (grad input, grad weight)


def sequence_lengths(batch, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Real lengths per sequence feature of a batch (without the CLS token)."""
    if batch.seq is None:
        return {}
    lengths = batch.seq.lengths().view(len(cfg.sequences), -1).cpu().numpy()
    return {s.name: lengths[i] for i, s in enumerate(cfg.sequences)}


def forward_flops(cfg: ModelConfig, batch_size: int, lengths: dict[str, np.ndarray]) -> dict[str, float]:
    """Forward FLOPs per block for one batch of ``batch_size`` with these sequence lengths."""
    if cfg.kind != "gem":
        return {k: v * batch_size for k, v in reference_flops_per_example(cfg).items()}
    d, h, w, x = cfg.sparse.dim, cfg.hstu, cfg.wukong, cfg.cross
    flops = {
        "dense_arch": batch_size * mlp_flops(cfg.data.dense_features, cfg.dense.mlp),
        "nonseq_summary": nonseq_summary_flops(1 + len(cfg.sparse.rows), d, h.dim, batch=batch_size),
        "sequence_arch": 0.0,
        "sequence_summary": 0.0,
    }
    for s in cfg.sequences:
        with_cls = np.asarray(lengths[s.name]) + 1  # InterFormer's CLS token is a real token
        flops["sequence_arch"] += sequence_arch_flops(with_cls, h.layers, h.dim, h.heads)
        flops["sequence_summary"] += summary_flops(with_cls, h.dim, d, x.pma_seeds, x.recent, h.heads)
    flops["interaction_arch"] = batch_size * interaction_arch_flops(
        w.layers, interaction_tokens(cfg), d, w.n_fm, w.n_lcb, w.rank, list(w.mlp)
    )
    flops["over_arch"] = batch_size * over_arch_flops((w.n_fm + w.n_lcb) * d, cfg.over.mlp, cfg.over.tasks)
    return flops


def batch_forward_flops(cfg: ModelConfig, batch) -> dict[str, float]:
    return forward_flops(cfg, batch.size, sequence_lengths(batch, cfg))


def expected_lengths(cfg: ModelConfig, samples: int = 65536, seed: int = 0) -> dict[str, np.ndarray]:
    """A large seeded sample of sequence lengths: per-example FLOPs depend on E[n^2], not E[n]^2."""
    rng = np.random.default_rng(seed)
    return {
        s.name: truncated_lognormal(rng, s.mean_len, SEQUENCE_SIGMA, samples, 1, s.max_len)
        for s in cfg.sequences
    }


def forward_flops_per_example(cfg: ModelConfig) -> dict[str, float]:
    """Expected forward FLOPs per example by block, for configs too large to run here."""
    lengths = expected_lengths(cfg)
    n = len(next(iter(lengths.values()))) if lengths else 1
    return {k: v / n for k, v in forward_flops(cfg, n, lengths).items()}


def embedding_bytes(cfg: ModelConfig, batch, bytes_per_element: int = 4) -> dict[str, float]:
    """Bytes moved by the embedding lookups of one batch (forward reads, backward writes).

    Each looked-up row is read once in the forward; its gradient row is written once in the
    backward (fused optimizers update in place: read + write of the row and its state).
    """
    pooled_rows = int(batch.sparse.values().numel())
    seq_rows = 0 if batch.seq is None else int(batch.seq.values().numel())
    read = (pooled_rows * cfg.sparse.dim + seq_rows * (cfg.hstu.dim if cfg.hstu else 0)) * bytes_per_element
    pooled_out = batch.size * len(cfg.sparse.rows) * cfg.sparse.dim * bytes_per_element
    return {"lookups": pooled_rows + seq_rows, "read": float(read), "written": float(read),
            "pooled_output": float(pooled_out)}


def parameter_counts(cfg: ModelConfig) -> dict[str, int]:
    """Embedding rows and parameters, and dense parameters, counted on the meta device."""
    from gembench.models.gem import build_model

    with torch.device("meta"):
        model = build_model(cfg, device="meta")
    embedding = sum(p.numel() for n, p in model.named_parameters() if is_embedding_parameter(n))
    dense = sum(p.numel() for p in model.parameters()) - embedding
    rows = sum(cfg.sparse.rows) + sum(s.rows for s in cfg.sequences)
    return {"embedding_rows": rows, "embedding_params": embedding, "dense_params": dense}


def memory_estimate(cfg: ModelConfig, batch_size: int, counts: dict | None = None) -> dict[str, float]:
    """A deliberately generous estimate of training memory, in bytes, for refusing early.

    fp32 embeddings + their gradient + one optimizer state each (eager Adagrad); dense
    parameters x4 (weight, grad, Adam m and v); activations ~ the forward FLOPs' output
    elements kept for backward, bounded by 4 bytes per FLOP/(2 x width), plus attention tiles.
    """
    counts = counts or parameter_counts(cfg)
    emb = counts["embedding_params"] * 4 * 3
    dense = counts["dense_params"] * 4 * 4
    acts = 0.0
    if cfg.kind == "gem":
        lengths = expected_lengths(cfg, samples=4096)
        h = cfg.hstu
        for s in cfg.sequences:
            n = lengths[s.name].astype(np.float64) + 1
            tokens = n.mean() * batch_size
            # per layer: x, LN, uvqk (4d), attention out, norm, gated: ~ 12 d floats per token,
            # and the scores/SiLU/mask of the attention tiles: 3 n^2 per head per sequence.
            acts += h.layers * (12 * h.dim * tokens + 3 * h.heads * (n**2).mean() * batch_size) * 4
        w = cfg.wukong
        widest = max([cfg.sparse.dim * interaction_tokens(cfg), *w.mlp, *cfg.over.mlp])
        acts += (w.layers + len(cfg.over.mlp) + 2) * 4 * widest * batch_size * 4
    else:
        widest = max([*cfg.dense.mlp, *cfg.over.mlp, (len(cfg.sparse.rows) + 1) * cfg.sparse.dim])
        acts += (len(cfg.dense.mlp) + len(cfg.over.mlp) + 8) * widest * batch_size * 4
    return {"embeddings": float(emb), "dense": float(dense), "activations": float(acts),
            "total": float(emb + dense + acts)}
