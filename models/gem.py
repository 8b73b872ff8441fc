"""The GEM-like ranking model: a few named Arch modules, shapes stated, nothing about devices.

    batch.sparse ─ SparseArch.pooled ──► (B, F, D) ─┐
    batch.dense ── DenseArch (MLP) ────► (B, 1, D) ─┤ non-sequence tokens
                        NonSeqSummary ◄──────────────┘ (CLS, InterFormer)
    batch.seq ──── SparseArch.sequence ► jagged (T, d) ─ prepend CLS ─ SequenceArch (HSTU)
                                                   ─ SequenceSummary ─► (B, 1+k_p+K, D) per sequence
    batch.content ── ContentArch (models/content.py) ─► (B, V [+1], D) content tokens (configs with [content])
    batch.item_content ─ ItemContent per sequence, added to the item embeddings before HSTU
    [non-sequence tokens | content tokens | summaries] ─ InteractionArch (Wukong) ─► (B, n_F+n_L, D)
    flatten ─ OverArch (shared MLP + task heads) ─► logits (B, tasks)

A config with [candidate] (MLPerf DLRMv4) ranks target-aware instead: contextual tokens, HSTU over
[contextual | history | candidate], user x item head (models/candidate.py); no summaries, no Wukong.
A sequence that follows another (sequences[].follows) and HSTU's input options go through
SequenceInput before HSTU, in both layouts.

Parallelism, precision and compilation are applied from outside (harness/train/stack.py).
"""

from __future__ import annotations

import torch
from torch import nn
from torchrec.modules.mlp import MLP

from gembench.models.candidate import ContextualArch, last_rows
from gembench.models.config import ModelConfig
from gembench.models.content import ContentArch, ItemContent
from gembench.models.cross import NonSeqSummary, SequenceSummary, prepend_cls, prepend_tokens
from gembench.models.heads import OverArch, SwishMLP, UserItemHead
from gembench.models.hstu import SequenceArch, SequenceInput
from gembench.models.sparse import SparseArch
from gembench.models.wukong import InteractionArch


def followers(cfg: ModelConfig) -> dict[str, list[str]]:
    """Each sequence of its own (in config order) and the sequences that follow it."""
    out = {s.name: [] for s in cfg.sequences if not s.follows}
    for s in cfg.sequences:
        if s.follows:
            out[s.follows].append(s.name)
    return out


def has_sequence_input(cfg: ModelConfig) -> bool:
    """Whether the sequences go through SequenceInput (followers or an HSTU input option) first."""
    h = cfg.hstu
    options = h.input_mlp or h.position_buckets or h.time_buckets or h.input_dropout
    return bool(options) or any(s.follows for s in cfg.sequences)


def hstu_options(cfg: ModelConfig) -> dict:
    h = cfg.hstu
    return {"rab": h.rab, "alpha": h.alpha, "dropout": h.dropout, "output": h.output}


def interaction_tokens(cfg: ModelConfig) -> int:
    """Tokens entering the InteractionArch: dense + F pooled + content + per sequence (CLS + PMA + recent)."""
    per_sequence = 1 + cfg.cross.pma_seeds + cfg.cross.recent
    content = cfg.content.candidate_tokens if cfg.content else 0
    return 1 + len(cfg.sparse.rows) + content + len(followers(cfg)) * per_sequence


class GEM(nn.Module):
    """GEM-like model for a config of kind "gem".

    embed(batch) -> (pooled (B, F, D), {sequence: Jagged (T_s, d)})    the sparse half
    dense(batch, embedded) -> logits (B, tasks)                         the dense half
    forward(batch) = dense(batch, embed(batch))
    """

    def __init__(self, cfg: ModelConfig, device: torch.device | str | None = None, attention: str = "jagged"):
        super().__init__()
        device = torch.device(device or "cpu")
        d, h, w, x = cfg.sparse.dim, cfg.hstu, cfg.wukong, cfg.cross
        self.followers = followers(cfg)
        self.target_aware = cfg.candidate is not None
        self.sparse_arch = SparseArch(cfg, device)
        if cfg.candidate is not None:
            self._build_candidate(cfg, device, attention)
            return
        n_nonseq = 1 + len(cfg.sparse.rows)
        self.dense_arch = MLP(cfg.data.dense_features, list(cfg.dense.mlp), device=device)
        self.nonseq_summary = NonSeqSummary(n_nonseq, d, h.dim).to(device)
        # only for configs that ask for it, so that GEM's tiers draw their weights as they always did
        self.sequence_input = self._sequence_input(cfg, device) if has_sequence_input(cfg) else None
        self.sequence_arch = nn.ModuleDict(
            {
                s.name: SequenceArch(
                    h.layers, h.dim, h.heads, s.max_len + 1, attention=attention, **hstu_options(cfg)
                ).to(device)
                for s in cfg.sequences
                if not s.follows
            }
        )
        self.sequence_summary = nn.ModuleDict(
            {
                s.name: SequenceSummary(h.dim, d, x.pma_seeds, x.recent, h.heads).to(device)
                for s in cfg.sequences
                if not s.follows
            }
        )
        c = cfg.content  # None, or a block only for what the config gives
        self.content_arch = ContentArch(c, d, device=device) if c is not None and c.candidate_tokens else None
        self.item_content = (
            nn.ModuleDict({s.name: ItemContent(c.sequence_dim, h.dim, device) for s in cfg.sequences})
            if c is not None and c.sequence_dim
            else None
        )
        self.interaction_arch = InteractionArch(
            w.layers, interaction_tokens(cfg), d, w.n_fm, w.n_lcb, w.rank, list(w.mlp)
        ).to(device)
        self.over_arch = OverArch((w.n_fm + w.n_lcb) * d, cfg.over.mlp, cfg.over.tasks, device=device)

    def _sequence_input(self, cfg: ModelConfig, device) -> nn.ModuleDict:
        h = cfg.hstu
        return nn.ModuleDict(
            {
                name: SequenceInput(
                    h.dim, len(follow), h.input_mlp, h.position_buckets, h.time_buckets, h.input_dropout
                ).to(device)
                for name, follow in self.followers.items()
            }
        )

    def _build_candidate(self, cfg: ModelConfig, device, attention: str) -> None:
        """The [candidate] layout: contextual tokens, HSTU, item tower and user x item head."""
        h, features = cfg.hstu, len(cfg.sparse.rows)
        (name,) = self.followers
        self.contextual_arch = ContextualArch(features, cfg.sparse.dim, h.dim).to(device)
        self.sequence_input = self._sequence_input(cfg, device)
        seq = next(s for s in cfg.sequences if s.name == name)
        self.sequence_arch = nn.ModuleDict(
            {
                name: SequenceArch(
                    h.layers, h.dim, h.heads, seq.max_len + features, attention=attention, **hstu_options(cfg)
                ).to(device)
            }
        )
        width = h.dim * (1 + len(self.followers[name]))  # the candidate's own embedding and its followers'
        self.item_arch = SwishMLP(width, cfg.candidate.item_mlp).to(device)
        self.over_arch = UserItemHead(h.dim, cfg.over.mlp, cfg.over.tasks).to(device)

    def embed(self, batch):
        return self.sparse_arch(batch.sparse, batch.seq)

    def dense(self, batch, embedded) -> torch.Tensor:
        if self.target_aware:
            return self._dense_candidate(batch, embedded)
        pooled, sequences = embedded
        nonseq = torch.cat([self.dense_arch(batch.dense).unsqueeze(1), pooled.to(batch.dense.dtype)], dim=1)
        cls = self.nonseq_summary(nonseq)
        tokens = [nonseq]
        if self.content_arch is not None:
            tokens.append(self.content_arch(batch.content, batch.content_tokens).to(nonseq.dtype))
        items = self._item_content(batch, sequences)
        inputs = self._inputs(batch, sequences)
        for name, seq in sequences.items():
            if name not in self.sequence_arch:  # a follower: part of its sequence's input
                continue
            values = inputs.get(name, seq.values)
            values = values if name not in items else values + items[name].to(values.dtype)
            values, offsets = prepend_cls(values, seq.offsets, cls.to(seq.values.dtype))
            values = self.sequence_arch[name](values, offsets, seq.max_len + 1)
            tokens.append(self.sequence_summary[name](values, offsets, seq.max_len + 1).to(nonseq.dtype))
        interacted = self.interaction_arch(torch.cat(tokens, dim=1))
        return self.over_arch(interacted.flatten(1))

    def _inputs(self, batch, sequences) -> dict[str, torch.Tensor]:
        """Each sequence of its own through its SequenceInput (with its followers' embeddings and,
        with time buckets, batch.seq_time: the events' ages, every such sequence's in order)."""
        if self.sequence_input is None:
            return {}
        names = list(self.sequence_input)
        ages = (
            torch.split(batch.seq_time, [sequences[n].values.shape[0] for n in names])
            if batch.seq_time is not None
            else [None] * len(names)
        )
        return {
            name: self.sequence_input[name](
                sequences[name].values,
                [sequences[f].values for f in self.followers[name]],
                sequences[name].offsets,
                age,
            )
            for name, age in zip(names, ages)
        }

    def _dense_candidate(self, batch, embedded) -> torch.Tensor:
        """[contextual | history | candidate] through HSTU; the output at the candidate is the user."""
        pooled, sequences = embedded
        (name,) = self.sequence_arch
        seq = sequences[name]
        values = self._inputs(batch, sequences)[name]
        context = self.contextual_arch(pooled)
        values, offsets = prepend_tokens(values, seq.offsets, context)
        values = self.sequence_arch[name](values, offsets, seq.max_len + context.shape[1])
        user = values.index_select(0, last_rows(offsets))
        rows = last_rows(seq.offsets)
        candidate = [sequences[n].values.index_select(0, rows) for n in [name, *self.followers[name]]]
        item = self.item_arch(torch.cat(candidate, dim=-1))
        return self.over_arch(user, item.to(user.dtype))

    def _item_content(self, batch, sequences) -> dict[str, torch.Tensor]:
        """Each sequence's items' content projected to the items' width: batch.item_content holds
        every sequence's items in the batch's sequence order, each sequence's as many as its values."""
        if self.item_content is None:
            return {}
        names = list(self.item_content)  # the config's sequence order, the batch's
        parts = torch.split(batch.item_content, [sequences[n].values.shape[0] for n in names])
        return {name: self.item_content[name](x) for name, x in zip(names, parts)}

    def forward(self, batch) -> torch.Tensor:
        return self.dense(batch, self.embed(batch))


def build_model(cfg: ModelConfig, device: torch.device | str | None = None, attention: str = "jagged") -> nn.Module:
    """The pure model for a config: GEM for kind "gem", TorchRec's DLRM / DLRM-DCN otherwise.

    Every tensor lands on ``device``, including those of modules that take no device argument
    (TorchRec's LowRankCrossNet creates its W/V kernels with a bare torch.empty): building under
    the device context is what puts them there, where a later ``.to()`` would copy a model that
    may not fit the host (medium's tables) and miss plain tensor attributes.
    """
    from gembench.models.dlrm import ReferenceDLRM

    device = torch.device(device or "cpu")
    with torch.device(device):
        if cfg.kind == "gem":
            return GEM(cfg, device, attention=attention)
        return ReferenceDLRM(cfg, device)
