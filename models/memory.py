"""Sizes and training memory of a config: parameter counts and the peak-memory estimate.

Each figure is a sum of tensors counted from the blocks' code (see memory_estimate); the fit check
that refuses a run before it allocates is harness/train/memory.py.
"""

from __future__ import annotations

import numpy as np
import torch

from gembench.models.blocks import largest_block_params
from gembench.models.config import ModelConfig
from gembench.models.content import content_memory_bytes
from gembench.models.data import expected_lengths
from gembench.models.gem import has_sequence_input, interaction_tokens
from gembench.models.ops.pytorch.hstu_attention import TILE_MAX, TILE_SCORES, TILE_WASTE
from gembench.models.sparse import is_embedding_parameter


def parameter_counts(cfg: ModelConfig, model=None) -> dict[str, int]:
    """Embedding rows and parameters, and dense parameters, counted on the meta device (``model``:
    the config's meta build, if one is at hand)."""
    from gembench.models.gem import build_model

    if model is None:
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
# eager bf16 rose 126 MiB over 17 MiB of tensors; eager fp32 26 MiB over 24; compile 188-193 MiB in
# all, file pages (libraries' code read in as it runs) excepted. On CUDA the measured peak is
# torch.cuda.max_memory_allocated, tensors only: no runtime term.
CPU_RUNTIME_BYTES = {"eager fp32": 4 * 2**20, "eager bf16": 112 * 2**20, "compile": 190 * 2**20}
# The same for one torchrun rank (1 thread, after the rank has set up its process group and its
# peak): compile grows it less than it grows one process, measured with benchmarks/rank_memory.py
# on tiny (2 gloo ranks: a 185-204 MiB rise around 12 MiB of tensors); eager as one process
# (eager bf16 on ranks: 98-111 MiB on tiny, 120-160 MiB on small over the tensors' estimate).
CPU_RUNTIME_BYTES_RANK = {"eager fp32": 4 * 2**20, "eager bf16": 112 * 2**20, "compile": 180 * 2**20}
# Sequences per tile of the jagged attention op, at most TILE_SCORES scores per head in a tile: its
# transient scores are per tile.
ATTENTION_TILE = TILE_MAX
# Padded rows per real row in the op's tile order: at most 1 + TILE_WASTE of the square work.
ATTENTION_PADDING = 1.0 + TILE_WASTE


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
    activation_checkpointing, activation_dtype (None: the optimized stack). On ranks, ``batch_size``
    is the rank's, ``embedding_share`` the share of the tables this rank holds, ``shards`` the FSDP
    shard group of the dense part (1: every rank holds all of it), and ``on_rank`` picks the rank's
    runtime term. The figures, each a sum of tensors counted from the code:

    - embeddings: fp32 tables + exact Adagrad state (4 + 4 B per element), + a dense fp32
      gradient of every table without fused embeddings (+4 B). Fused tables are built next to the
      plain ones and loaded from them, so while the stack is built both exist: ``build`` is that
      moment's total, before any activation exists.
    - dense: weight, gradient, Adam m and v (16 B per parameter), + a bf16 autocast copy. Under
      FSDP (``shards`` > 1) those 16 B are divided by the shard group, and the largest block is
      held unsharded twice (it and the next one, prefetched) in the gather dtype, plus its fp32
      gradient before the reduce-scatter.
    - activations: tensors saved for backward, bf16 or fp32 as the stack computes them (float8
      under activation_dtype=fp8):
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
                # and with a bias its gradient summed over the tiles; over the whole batch, the
                # backward's tile-order copies (q, k, v, the gradient in; three gradients out,
                # padded) and its three results.
                tile = min(batch_size, ATTENTION_TILE, max(1, TILE_SCORES // int(n.max()) ** 2))
                bias = h.heads * float(n.max()) ** 2 * 4 if h.rab else 0.0
                copies = (7 * ATTENTION_PADDING + 3) * tokens * h.dim * act
                transient = max(transient, 4 * h.heads * tile * float(n.max()) ** 2 * act + bias + copies)
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
    if getattr(stack, "activation_dtype", "compute") == "fp8":  # a byte an element (and a scale a row)
        acts /= act
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
