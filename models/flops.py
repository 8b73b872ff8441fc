"""Analytic FLOPs and embedding bytes of a config, from the blocks' own formulas (memory: memory.py).

Forward FLOPs come per block from the functions that sit next to each block (hstu.py,
wukong.py, cross.py, heads.py, dlrm.py), evaluated on a batch's real jagged lengths. Training
FLOPs are 3x forward (docs/design.md section 2). Embedding lookups are not FLOPs: they are reported
as bytes read and written.
"""

from __future__ import annotations

import numpy as np

from gembench.models.candidate import contextual_arch_flops
from gembench.models.config import ModelConfig
from gembench.models.content import content_arch_flops, item_content_flops
from gembench.models.cross import nonseq_summary_flops, summary_flops
from gembench.models.data import expected_lengths
from gembench.models.dlrm import reference_flops_per_example
from gembench.models.gem import followers, has_sequence_input, interaction_tokens
from gembench.models.heads import mlp_flops, over_arch_flops, user_item_head_flops
from gembench.models.hstu import hstu_attention_flops, sequence_arch_flops, sequence_input_flops
from gembench.models.wukong import interaction_arch_flops


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
    if cfg.candidate is not None:
        return _candidate_flops(cfg, batch_size, lengths)
    d, h, w, x = cfg.sparse.dim, cfg.hstu, cfg.wukong, cfg.cross
    flops = {
        "dense_arch": batch_size * mlp_flops(cfg.data.dense_features, cfg.dense.mlp),
        "nonseq_summary": nonseq_summary_flops(1 + len(cfg.sparse.rows), d, h.dim, batch=batch_size),
        "sequence_arch": 0.0,
        "sequence_summary": 0.0,
    }
    follow = followers(cfg)
    if has_sequence_input(cfg):
        flops["sequence_input"] = sum(
            sequence_input_flops(int(np.sum(lengths[name])), h.dim, len(f), h.input_mlp) for name, f in follow.items()
        )
    for name in follow:
        with_cls = np.asarray(lengths[name]) + 1  # InterFormer's CLS token is a real token
        flops["sequence_arch"] += sequence_arch_flops(with_cls, h.layers, h.dim, h.heads, h.output)
        flops["sequence_summary"] += summary_flops(with_cls, h.dim, d, x.pma_seeds, x.recent, h.heads)
    c = cfg.content
    if c is not None:  # configs without content keep exactly their blocks
        if c.candidate_tokens:
            flops["content_arch"] = content_arch_flops(c, d, batch_size)
        if c.sequence_dim:
            items = sum(int(np.sum(lengths[s.name])) for s in cfg.sequences)
            flops["item_content"] = item_content_flops(c, h.dim, items)
    flops["interaction_arch"] = batch_size * interaction_arch_flops(
        w.layers, interaction_tokens(cfg), d, w.n_fm, w.n_lcb, w.rank, list(w.mlp)
    )
    flops["over_arch"] = batch_size * over_arch_flops((w.n_fm + w.n_lcb) * d, cfg.over.mlp, cfg.over.tasks)
    return flops


def _candidate_flops(cfg: ModelConfig, batch_size: int, lengths: dict[str, np.ndarray]) -> dict[str, float]:
    """The [candidate] layout's blocks (models/candidate.py): HSTU runs over the F contextual tokens
    and the sequence, whose last event is the candidate."""
    h, features = cfg.hstu, len(cfg.sparse.rows)
    ((name, follow),) = followers(cfg).items()
    n = np.asarray(lengths[name])
    return {
        "contextual_arch": contextual_arch_flops(batch_size, features, cfg.sparse.dim, h.dim),
        "sequence_input": sequence_input_flops(int(n.sum()), h.dim, len(follow), h.input_mlp),
        "sequence_arch": sequence_arch_flops(n + features, h.layers, h.dim, h.heads, h.output),
        "item_arch": batch_size * mlp_flops(h.dim * (1 + len(follow)), cfg.candidate.item_mlp),
        "over_arch": batch_size * user_item_head_flops(h.dim, cfg.over.mlp, cfg.over.tasks),
    }


def batch_forward_flops(cfg: ModelConfig, batch) -> dict[str, float]:
    return forward_flops(cfg, batch.size, sequence_lengths(batch, cfg))


def forward_flops_per_example(cfg: ModelConfig) -> dict[str, float]:
    """Expected forward FLOPs per example by block, for configs too large to run here."""
    lengths = expected_lengths(cfg)
    n = len(next(iter(lengths.values()))) if lengths else 1
    return {k: v / n for k, v in forward_flops(cfg, n, lengths).items()}


# Training FLOPs per forward FLOP of the model (docs/design.md section 2; harness/metrics/mfu.py's
# TRAIN_FLOPS_PER_FORWARD, the same 3: forward, and the gradients of both matmul operands).
TRAIN_PER_FORWARD = 3


def hstu_parts(cfg: ModelConfig, lengths: np.ndarray) -> dict[str, float]:
    """Forward FLOPs per example of the HSTU layers over sequences of these lengths (tokens HSTU
    reads), split as hstu_layer_flops adds them: attention, U V Q K projection, output projection."""
    h, n = cfg.hstu, np.asarray(lengths, dtype=np.int64)
    out = 6 if h.output == "concat" else 2
    return {
        "attention": h.layers * hstu_attention_flops(n, h.dim) / n.size,
        "uvqk": h.layers * 8 * float(n.mean()) * h.dim**2,
        "output_projection": h.layers * out * float(n.mean()) * h.dim**2,
    }


def reconcile_flops(cfg: ModelConfig) -> dict:
    """gembench's training FLOPs per example against cfg.reference's published count, in GFLOP.

    ``rows``: per part, gembench's (3 x forward, on the real token counts) and the reference's
    convention evaluated with gembench's own formulas (HSTU layers only, at reference.seq_len
    positions, attention x reference.attention_train). ``steps``: gembench's total turned into the
    reference's one difference at a time. ``residual``: what is left against the published figure.
    """
    r = cfg.reference
    name = next(iter(followers(cfg)))  # validate: one sequence of its own
    prefix = len(cfg.sparse.rows) if cfg.candidate is not None else 1  # contextual tokens, or the CLS
    blocks = forward_flops_per_example(cfg)
    real = hstu_parts(cfg, expected_lengths(cfg)[name] + prefix)
    padded = hstu_parts(cfg, np.array([r.seq_len]))
    g = 1e9
    ours = {k: TRAIN_PER_FORWARD * v / g for k, v in real.items()}
    theirs = {k: TRAIN_PER_FORWARD * v / g for k, v in padded.items()}
    theirs["attention"] = r.attention_train * padded["attention"] / g
    others = {k: TRAIN_PER_FORWARD * v / g for k, v in blocks.items() if k != "sequence_arch"}
    rows = [[k, ours[k], theirs[k]] for k in ours] + [[k, v, 0.0] for k, v in others.items()]
    total = TRAIN_PER_FORWARD * sum(blocks.values()) / g
    at_seq_len = sum(TRAIN_PER_FORWARD * v / g for v in padded.values())
    steps = [
        ["gembench: training = 3 x forward, every block, real token counts", total],
        ["without the blocks the reference leaves out (" + ", ".join(others) + ")", total - sum(others.values())],
        [f"HSTU at the reference's {r.seq_len:,} positions (max_seq_len) instead of the real tokens", at_seq_len],
        [
            f"attention x{r.attention_train:g} instead of x{TRAIN_PER_FORWARD} (the reference's backward count)",
            sum(theirs.values()),
        ],
    ]
    return {
        "published_in": r.published_in,
        "published_gflop": r.gflop_per_example,
        "gembench_gflop": total,
        "rows": rows,
        "steps": steps,
        "reconciled_gflop": sum(theirs.values()),
        "residual_gflop": sum(theirs.values()) - r.gflop_per_example,
        "tokens": float(np.mean(expected_lengths(cfg)[name])) + prefix,
    }


def embedding_bytes(cfg: ModelConfig, batch, bytes_per_element: int = 4) -> dict[str, float]:
    """Bytes moved by the embedding lookups of one batch (forward reads, backward writes).

    Each looked-up row is read once in the forward; its gradient row is written once in the
    backward (fused optimizers update in place: read + write of the row and its state).
    """
    pooled_rows = int(batch.sparse.values().numel())
    seq_rows = 0 if batch.seq is None else int(batch.seq.values().numel())
    read = (pooled_rows * cfg.sparse.dim + seq_rows * (cfg.hstu.dim if cfg.hstu else 0)) * bytes_per_element
    pooled_out = batch.size * len(cfg.sparse.rows) * cfg.sparse.dim * bytes_per_element
    return {
        "lookups": pooled_rows + seq_rows,
        "read": float(read),
        "written": float(read),
        "pooled_output": float(pooled_out),
    }
