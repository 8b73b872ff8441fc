"""ContentArch: the ad creative's image and text features, as GEM reads them, into the model width.

Meta's account of GEM (2025-2026) says the model reads the visual and text features of the ad
during training, besides user behaviour. They arrive as the outputs of frozen upstream encoders
(an image embedding, a text embedding; optionally a short sequence of content tokens), so this
block trains only the projections that bring them into the model:

    batch.content         (B, sum(vectors))   ─ split ─ MLP_i(w_i -> mlp -> D) per vector ─┐
    batch.content_tokens  (B, T, token_dim)   ─ MLP(token_dim -> mlp -> D) per token,       ├► (B, V [+1], D)
                                                 mean over the T tokens ────────────────────┘  interaction tokens
    batch.item_content    (N, sequence_dim)   ─ ItemContent: Linear(sequence_dim -> d_hstu) per sequence,
                                                 added to each item's embedding before HSTU

Widths and token counts of the shipped configs, with their reasons: docs/design.md section 3.
"""

from __future__ import annotations

import torch
from torch import nn
from torchrec.modules.mlp import MLP

from gembench.models.config import ContentConfig
from gembench.models.heads import mlp_flops


class ContentArch(nn.Module):
    """Candidate content -> extra interaction tokens.

    forward(vectors: (B, sum(cfg.vectors)) | None, tokens: (B, T, token_dim) | None) -> (B, V + [1], D):
    one token per content vector (each through its own MLP), and, with content tokens, one more:
    the mean over T of a shared per-token MLP (a bag of content tokens; order-free, as pooled
    sparse features are).
    """

    def __init__(self, cfg: ContentConfig, dim: int, device=None):
        super().__init__()
        widths = list(cfg.mlp) + [dim]
        self.widths = list(cfg.vectors)
        self.vectors = nn.ModuleList([MLP(w, widths, device=device) for w in cfg.vectors])
        self.tokens = MLP(cfg.token_dim, widths, device=device) if cfg.tokens else None

    def forward(self, vectors: torch.Tensor | None, tokens: torch.Tensor | None) -> torch.Tensor:
        out = []
        if self.widths:
            for mlp, x in zip(self.vectors, torch.split(vectors, self.widths, dim=1)):
                out.append(mlp(x).unsqueeze(1))
        if self.tokens is not None:
            out.append(self.tokens(tokens).mean(dim=1, keepdim=True))
        return torch.cat(out, dim=1)


class ItemContent(nn.Module):
    """One behaviour sequence's item content -> its items' width: forward((N, sequence_dim)) -> (N, d)."""

    def __init__(self, sequence_dim: int, dim: int, device=None):
        super().__init__()
        self.proj = nn.Linear(sequence_dim, dim, device=device)

    def forward(self, content: torch.Tensor) -> torch.Tensor:
        return self.proj(content)


def content_arch_flops(cfg: ContentConfig, dim: int, batch: int) -> float:
    """Forward FLOPs of ContentArch on ``batch`` candidates (the token mean is no FLOP the counter counts)."""
    widths = list(cfg.mlp) + [dim]
    per_example = sum(mlp_flops(w, widths) for w in cfg.vectors)
    if cfg.tokens:
        per_example += cfg.tokens * mlp_flops(cfg.token_dim, widths)
    return float(batch * per_example)


def item_content_flops(cfg: ContentConfig, dim: int, items: int) -> float:
    """Forward FLOPs of the item projections over ``items`` sequence items (all sequences)."""
    return float(2 * items * cfg.sequence_dim * dim)


def content_input_bytes(cfg: ContentConfig, batch: float, items: float) -> float:
    """Bytes of the content in a batch of ``batch`` candidates and ``items`` sequence items, in
    content.dtype: candidate vectors, content tokens, and each item's content."""
    given = 2 if cfg.dtype == "bf16" else 4
    return float((batch * (sum(cfg.vectors) + cfg.tokens * cfg.token_dim) + items * cfg.sequence_dim) * given)


def content_memory_bytes(cfg: ContentConfig, dim: int, batch: float, items: float, act: int) -> float:
    """What the content costs in memory for ``batch`` candidates and ``items`` sequence items: its
    inputs on the device (content_input_bytes), and what the projections save for the backward,
    ``act`` bytes an element: each MLP's input and each layer's ReLU output (the next Linear saves
    the same tensor), and each item projection's input. Neither the token mean nor the add into the
    items' embeddings saves anything (the sum replaces the embedding HSTU's first layer saves).
    small, batch 512: 2.4 MiB saved by this, 2.4 MiB measured (saved for backward, content on - off)."""
    hidden = sum(cfg.mlp) + dim
    saved = batch * sum(w + hidden for w in cfg.vectors) * act
    saved += batch * cfg.tokens * (cfg.token_dim + hidden) * act
    saved += items * cfg.sequence_dim * act
    return content_input_bytes(cfg, batch, items) + float(saved)
