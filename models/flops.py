"""Analytic FLOPs, embedding bytes and memory of a config, from the blocks' own formulas.

Forward FLOPs come per block from the functions that sit next to each block (hstu.py,
wukong.py, cross.py, heads.py, dlrm.py), evaluated on a batch's real jagged lengths. Training
FLOPs are 3x forward (docs/design.md section 2). Embedding lookups are not FLOPs: they are reported
as bytes read and written.
"""

from __future__ import annotations

import numpy as np
import torch

from gembench.models.blocks import largest_block_params
from gembench.models.candidate import contextual_arch_flops
from gembench.models.config import ModelConfig
from gembench.models.content import content_arch_flops, content_memory_bytes, item_content_flops
from gembench.models.cross import nonseq_summary_flops, summary_flops
from gembench.models.data import draw_lengths
from gembench.models.dlrm import reference_flops_per_example
from gembench.models.gem import followers, has_sequence_input, interaction_tokens
from gembench.models.heads import mlp_flops, over_arch_flops, user_item_head_flops
from gembench.models.hstu import hstu_attention_flops, sequence_arch_flops, sequence_input_flops
from gembench.models.ops.pytorch.hstu_attention import TILE_MAX, TILE_SCORES
from gembench.models.sparse import is_embedding_parameter
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


def expected_lengths(cfg: ModelConfig, samples: int = 65536, seed: int = 0) -> dict[str, np.ndarray]:
    """A large seeded sample of sequence lengths: per-example FLOPs depend on E[n^2], not E[n]^2."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for s in cfg.sequences:  # a follower has its sequence's lengths, as in the batches
        out[s.name] = out[s.follows] if s.follows else draw_lengths(rng, s, samples)
    return out


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


def parameter_counts(cfg: ModelConfig) -> dict[str, int]:
    """Embedding rows and parameters, and dense parameters, counted on the meta device."""
    from gembench.models.gem import build_model

    with torch.device("meta"):
        model = build_model(cfg, device="meta")
    embedding = sum(p.numel() for n, p in model.named_parameters() if is_embedding_parameter(n))
    dense = sum(p.numel() for p in model.parameters()) - embedding
    rows = sum(cfg.sparse.rows) + sum(s.rows for s in cfg.sequences)
    return {
        "embedding_rows": rows,
        "embedding_params": embedding,
        "dense_params": dense,
        "largest_block_params": largest_block_params(model),
    }


# Training memory (see memory_estimate). Bytes per element of each kind of state.
ADAGRAD_BYTES = 4  # exact Adagrad: one fp32 sum per embedding element (fused or not)
ADAM_BYTES = 8  # Adam: m and v, fp32
# Saved-for-backward bytes per token and unit of width of one HSTU layer, counted tensor by tensor
# in HSTULayer.forward: x and LN(x) (fp32), the cast of LN(x) to bf16 (autocast), W1's output and
# its SiLU (4 d each), the attention output, out_norm's output (fp32), the gated product and its
# bf16 cast. fp32: 4 + 4 + 16 + 16 + 4 + 4 + 4 = 52; bf16: 4 + 4 + 2 + 8 + 8 + 2 + 4 + 4 + 2 = 38.
HSTU_SAVED_BYTES = {"fp32": 52, "bf16": 38}
# The sequence's embedding output and its copy with the CLS token prepended (fp32), per token and width.
SEQUENCE_INPUT_BYTES = 8
# HSTU's output="concat" (MLPerf DLRMv4) saves [U, A V, LN(A V) * U] (3 d) and the dropout mask on
# top: measured per token and width with torch.autograd.graph.saved_tensors_hooks on one layer.
HSTU_CONCAT_EXTRA_BYTES = {"fp32": 21, "bf16": 11}
# SequenceInput's saves per token and width, measured the same way: with input MLPs of hidden
# width dim / 2 over the token and two followers (DLRMv4's layout), and position and time only.
SEQUENCE_INPUT_SAVED_BYTES = {"fp32": 38, "bf16": 20}
SEQUENCE_INPUT_PLAIN_BYTES = 4.25
# What a CPU process's resident set grows by in a run besides tensors: lazily loaded kernels and
# allocator arenas (eager fp32), those plus oneDNN's bf16 kernels and their reordered weights under
# bf16 autocast (eager bf16), and torch.compile's FX graphs and generated code (compile, bf16).
# Measured with `gembench run --config tiny` (torch 2.13, 2-core x86), where tensors are a few MiB:
# eager bf16 rose 126 MiB over 17 MiB of tensors, eager fp32 34 MiB over 18. On CUDA the measured
# peak is torch.cuda.max_memory_allocated, tensors only: no runtime term.
CPU_RUNTIME_BYTES = {"eager fp32": 16 * 2**20, "eager bf16": 112 * 2**20, "compile": 280 * 2**20}
# The same for one torchrun rank (1 thread, after the rank has set up its process group and its
# peak): compile grows it less than it grows one process, measured with benchmarks/rank_memory.py
# on tiny (2 gloo ranks: a 185-204 MiB rise around 12 MiB of tensors); eager as one process
# (eager bf16 on ranks: 98-111 MiB on tiny, 120-160 MiB on small over the tensors' estimate).
CPU_RUNTIME_BYTES_RANK = {"eager fp32": 16 * 2**20, "eager bf16": 112 * 2**20, "compile": 180 * 2**20}
# Sequences per tile of the jagged attention op, at most TILE_SCORES scores per head in a tile: its
# transient scores are per tile.
ATTENTION_TILE = TILE_MAX


def embedding_param_split(cfg: ModelConfig) -> tuple[int, int]:
    """(pooled, sequence) embedding parameters of a config."""
    pooled = sum(cfg.sparse.rows) * cfg.sparse.dim
    sequence = sum(s.rows for s in cfg.sequences) * (cfg.hstu.dim if cfg.hstu else 0)
    return pooled, sequence


def memory_estimate(
    cfg: ModelConfig,
    batch_size: int,
    counts: dict | None = None,
    stack=None,
    device_type: str = "cuda",
    shards: int = 1,
    embedding_share: float = 1.0,
    on_rank: bool = False,
) -> dict[str, float]:
    """Training memory of one process (or one rank), in bytes, for the stack that will run: its peak.

    ``stack`` is any object with the StackOptions fields fused_embeddings, jagged, bf16, compile,
    activation_checkpointing (None: the optimized stack). On ranks, ``batch_size`` is the rank's,
    ``embedding_share`` the share of the tables this rank holds, ``shards`` the FSDP shard
    group of the dense part (1: every rank holds all of it), and ``on_rank`` picks the rank's
    runtime term. The figures, each a sum of tensors
    counted from the code:

    - embeddings: fp32 tables + exact Adagrad state (4 + 4 B per element), + a dense fp32
      gradient of every table without fused embeddings (+4 B). Fused tables are built next to the
      plain ones and loaded from them, so while the stack is built both exist: ``build`` is that
      moment's total, before any activation exists.
    - dense: weight, gradient, Adam m and v (16 B per parameter), + a bf16 autocast copy. Under
      FSDP (``shards`` > 1) those 16 B are divided by the shard group, and the largest block is
      held unsharded twice (it and the next one, prefetched) in the gather dtype, plus its fp32
      gradient before the reduce-scatter.
    - activations: tensors saved for backward, bf16 or fp32 as the stack computes them:
      HSTU_SAVED_BYTES per token, width and layer over E[n] + 1 tokens per sequence; padded
      attention adds its (B, H, N, N) scores and SiLU (both saved) and padded Q, K, V per layer,
      N = max_len + 1; Wukong and the MLPs a few widths per example. A checkpointed block keeps
      only its input (4 B per token and width for an HSTU layer, its widest input for the others)
      and one block's activations live again during its recompute.
    - transient: the largest short-lived block on top of them: the attention scores of one layer's
      backward (padded: 3 x (B, H, N, N); jagged: tiles of ATTENTION_TILE sequences).
    - runtime: on CPU, what the process grows by besides tensors (CPU_RUNTIME_BYTES, or
      CPU_RUNTIME_BYTES_RANK on a rank).

    total = max(build, embeddings + dense + activations + transient) + runtime.
    """
    counts = counts or parameter_counts(cfg)
    fused = getattr(stack, "fused_embeddings", True)
    jagged = getattr(stack, "jagged", True)
    dtype = "bf16" if getattr(stack, "bf16", True) else "fp32"
    act = 2 if dtype == "bf16" else 4
    pooled, sequence = embedding_param_split(cfg)
    if fused:
        # fbgemm has no CPU kernel for sequence tables: on CPU they stay plain with row-sparse grads.
        fused_params = pooled + (sequence if device_type == "cuda" else 0)
        emb = (pooled + sequence) * (4 + ADAGRAD_BYTES)
        build = emb + fused_params * 4  # the plain tables, until the fused ones replace them
    else:
        emb = (pooled + sequence) * (4 + 4 + ADAGRAD_BYTES)
        build = emb
    cast = 2 if dtype == "bf16" else 0
    if shards > 1:
        gathered = counts.get("largest_block_params", 0) * (2 * (2 if dtype == "bf16" else 4) + 4)
        dense = counts["dense_params"] * (4 + 4 + ADAM_BYTES) / shards + gathered
    else:
        dense = counts["dense_params"] * (4 + 4 + ADAM_BYTES + cast)
    if embedding_share < 1.0:  # a rank builds every plain table, then DMP keeps its shards (fused)
        emb *= embedding_share
        build = (pooled + sequence) * 4 + emb
    checkpointing = getattr(stack, "activation_checkpointing", "none")
    acts = transient = 0.0
    if cfg.kind == "gem":
        lengths = expected_lengths(cfg, samples=4096)
        h = cfg.hstu
        target_aware = cfg.candidate is not None
        prefix = len(cfg.sparse.rows) if target_aware else 1  # contextual tokens, or the CLS
        saved = HSTU_SAVED_BYTES[dtype] + (HSTU_CONCAT_EXTRA_BYTES[dtype] if h.output == "concat" else 0)
        for s in cfg.sequences:
            if s.follows:  # its embeddings are part of its sequence's input, counted there
                continue
            n = lengths[s.name].astype(np.float64) + prefix
            tokens = n.mean() * batch_size
            acts += SEQUENCE_INPUT_BYTES * h.dim * tokens
            if has_sequence_input(cfg):
                per_width = SEQUENCE_INPUT_SAVED_BYTES[dtype] if h.input_mlp else SEQUENCE_INPUT_PLAIN_BYTES
                acts += per_width * h.dim * lengths[s.name].mean() * batch_size
            if checkpointing == "none":
                acts += h.layers * saved * h.dim * tokens
            else:  # each layer keeps its fp32 input; one layer's saves live again in its recompute
                acts += h.layers * 4 * h.dim * tokens
                transient = max(transient, saved * h.dim * tokens)
            if jagged and device_type != "cuda":  # (on CUDA the Triton kernels keep scores in SRAM)
                # Inside the op, per tile: scores and SiLU (forward), their gradients (backward),
                # and with a bias its gradient summed over the tiles.
                tile = min(batch_size, ATTENTION_TILE, max(1, TILE_SCORES // int(n.max()) ** 2))
                bias = h.heads * float(n.max()) ** 2 * 4 if h.rab else 0.0
                transient = max(transient, 4 * h.heads * tile * float(n.max()) ** 2 * act + bias)
            elif not jagged:
                square = batch_size * h.heads * (s.max_len + prefix) ** 2
                pad = batch_size * (s.max_len + prefix) * h.dim
                acts += h.layers * (2 * square * act + square / h.heads + 3 * pad * act)
                transient = max(transient, 3 * square * act)
        if cfg.content is not None:
            items = sum(float(lengths[s.name].mean()) for s in cfg.sequences) * batch_size
            acts += content_memory_bytes(cfg.content, cfg.sparse.dim, batch_size, items, act)
        if target_aware:  # contextual tokens, item tower and head: a few widths per example
            widest = max([len(cfg.sparse.rows) * h.dim, *cfg.candidate.item_mlp, *cfg.over.mlp])
            blocks = len(cfg.candidate.item_mlp) + len(cfg.over.mlp) + 2
        else:
            w = cfg.wukong
            widest = max([cfg.sparse.dim * interaction_tokens(cfg), *w.mlp, *cfg.over.mlp])
            blocks = w.layers + len(cfg.over.mlp) + 2
        if checkpointing == "all":  # inputs kept, one block's activations live again at a time
            acts += blocks * widest * batch_size * 4 + 4 * widest * batch_size * act
        else:
            acts += blocks * 4 * widest * batch_size * act
    else:
        widest = max([*cfg.dense.mlp, *cfg.over.mlp, (len(cfg.sparse.rows) + 1) * cfg.sparse.dim])
        acts += (len(cfg.dense.mlp) + len(cfg.over.mlp) + 8) * widest * batch_size * act
    runtime = 0.0
    if device_type != "cuda":
        table = CPU_RUNTIME_BYTES_RANK if on_rank else CPU_RUNTIME_BYTES
        runtime = table["compile" if getattr(stack, "compile", True) else f"eager {dtype}"]
    steady = emb + dense + acts + transient
    return {
        "embeddings": float(emb),
        "dense": float(dense),
        "activations": float(acts),
        "transient": float(transient),
        "build": float(build),
        "runtime": float(runtime),
        "total": float(max(build, steady) + runtime),
    }
