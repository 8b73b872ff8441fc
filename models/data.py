"""Seeded synthetic batches shaped like ads-ranking traffic.

IDs follow a bounded Zipf law per table (hot items, flatter users), pooling factors follow the
configured distribution, and sequence lengths a truncated lognormal around the configured mean.
Batch ``i`` of rank ``r`` depends only on (seed, i, r), never on what was drawn before, so the
same seed gives the same batches on any machine and in any order.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from torchrec.streamable import Pipelineable

from gembench.models.config import ModelConfig

SEQUENCE_SIGMA = 0.6  # lognormal shape of sequence lengths; mean stays at the configured mean
POOLING_SIGMA = 1.0  # lognormal shape of list-feature pooling factors
# Seconds between consecutive events of a sequence (seq_time): lognormal, bursty like listening
# sessions (median a few minutes, a long tail of hours between sessions).
EVENT_GAP_MEAN_S = 1800.0
EVENT_GAP_SIGMA = 2.0


@dataclass
class Batch(Pipelineable):
    """One training batch: a TorchRec Pipelineable (to, record_stream, pin_memory), so that the
    sparse-dist pipeline runs it as it is.

    dense:  (B, dense_features) float32 continuous features
    sparse: KeyedJaggedTensor of pooled features, keys ``t0..t{F-1}``, lengths = pooling factors
    seq:    KeyedJaggedTensor of sequence item IDs, keys = sequence names, lengths = real lengths
            (None for models without sequences)
    labels: (B, tasks) float32 in {0, 1}
    content, content_tokens, item_content: the ad's content (configs with [content], else None),
            unit-norm vectors as frozen encoders give them, in content.dtype:
            (B, sum(vectors)), (B, tokens, token_dim), (items of every sequence in order, sequence_dim)
    seq_time: (events of every sequence of its own, in order,) float32 seconds between each event
            and its sequence's last one (configs with hstu.time_buckets, else None)
    """

    dense: torch.Tensor
    sparse: KeyedJaggedTensor
    seq: KeyedJaggedTensor | None
    labels: torch.Tensor
    content: torch.Tensor | None = None
    content_tokens: torch.Tensor | None = None
    item_content: torch.Tensor | None = None
    seq_time: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return self.dense.shape[0]

    def _tensors(self) -> list[torch.Tensor]:
        return [
            t
            for t in (self.dense, self.labels, self.content, self.content_tokens, self.item_content, self.seq_time)
            if t is not None
        ]

    @property
    def input_bytes(self) -> int:
        """Bytes of the batch as it is moved to the device: tensors, and IDs, lengths and weights."""
        kjts = [k for k in (self.sparse, self.seq) if k is not None]
        tensors = self._tensors() + [
            t for k in kjts for t in (k.values(), k.lengths(), k.weights_or_none()) if t is not None
        ]
        return int(sum(t.numel() * t.element_size() for t in tensors))

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Batch":
        move = lambda t: None if t is None else t.to(device, non_blocking=non_blocking)  # noqa: E731
        return Batch(
            dense=move(self.dense),
            sparse=self.sparse.to(device, non_blocking=non_blocking),
            seq=None if self.seq is None else self.seq.to(device, non_blocking=non_blocking),
            labels=move(self.labels),
            content=move(self.content),
            content_tokens=move(self.content_tokens),
            item_content=move(self.item_content),
            seq_time=move(self.seq_time),
        )

    def record_stream(self, stream) -> None:
        for t in self._tensors():
            t.record_stream(stream)
        self.sparse.record_stream(stream)
        if self.seq is not None:
            self.seq.record_stream(stream)

    def pin_memory(self) -> "Batch":
        pin = lambda t: None if t is None else t.pin_memory()  # noqa: E731
        return Batch(
            pin(self.dense),
            self.sparse.pin_memory(),
            None if self.seq is None else self.seq.pin_memory(),
            pin(self.labels),
            pin(self.content),
            pin(self.content_tokens),
            pin(self.item_content),
            pin(self.seq_time),
        )


def zipf_ids(
    rng: np.random.Generator, rows: int, alpha: float, size: int, hashed: bool = True, salt: str = ""
) -> np.ndarray:
    """Draw ``size`` IDs in [0, rows) from a bounded power law of exponent ``alpha``.

    Inverse-CDF of the continuous law p(x) ~ x^-alpha on [1, rows + 1): O(size), no table of
    ``rows`` entries, so it works for billion-row tables. Ranks are then scattered over the table
    by an affine permutation r -> (r * stride + offset(salt)) mod rows, as hashed production IDs
    are: the hot IDs are not all in the first rows (which would make row-wise sharding look
    artificially skewed). The offset, from the table's name (``salt``), moves each table's single
    hottest ID off row 0, where a multiplicative permutation alone leaves it: every table's first
    row-wise shard held its head (docs/distributed.md has the imbalance it caused). With
    ``hashed=False`` (data.id_layout "sorted") rank r is row r: the hot rows come first.
    """
    u = rng.random(size)
    if alpha == 0:
        rank = u * rows
    elif abs(alpha - 1.0) < 1e-9:
        rank = np.exp(u * math.log(rows + 1)) - 1
    else:
        e = 1.0 - alpha
        rank = (u * ((rows + 1) ** e - 1) + 1) ** (1.0 / e) - 1
    rank = np.minimum(rank.astype(np.int64), rows - 1)
    if not hashed:
        return rank
    return (rank * _coprime_stride(rows) + zlib.crc32(salt.encode()) % rows) % rows


def _coprime_stride(rows: int) -> int:
    stride = 2654435761 % rows or 1  # Knuth's multiplicative hash constant, reduced
    while math.gcd(stride, rows) != 1:
        stride += 1
    return stride


def truncated_lognormal(
    rng: np.random.Generator, mean: float, sigma: float, size: int, low: int, high: int
) -> np.ndarray:
    """Integers from a lognormal whose (untruncated) mean is ``mean``, clipped to [low, high]."""
    mu = math.log(mean) - sigma**2 / 2
    return np.clip(np.rint(rng.lognormal(mu, sigma, size)), low, high).astype(np.int64)


def draw_lengths(rng: np.random.Generator, s, size: int) -> np.ndarray:
    """``size`` lengths of sequence ``s``: truncated lognormal around its mean, or all max_len ("fixed")."""
    if s.lengths == "fixed":
        return np.full(size, s.max_len, dtype=np.int64)
    return truncated_lognormal(rng, s.mean_len, SEQUENCE_SIGMA, size, 1, s.max_len)


def expected_lengths(cfg: ModelConfig, samples: int = 65536, seed: int = 0) -> dict[str, np.ndarray]:
    """A large seeded sample of sequence lengths: per-example FLOPs depend on E[n^2], not E[n]^2."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for s in cfg.sequences:  # a follower has its sequence's lengths, as in the batches
        out[s.name] = out[s.follows] if s.follows else draw_lengths(rng, s, samples)
    return out


def event_ages(rng: np.random.Generator, lengths: np.ndarray) -> np.ndarray:
    """Per event of sequences of these lengths, back to back: seconds before its sequence's last
    event (0 for the last), from lognormal gaps between consecutive events. float32."""
    mu = math.log(EVENT_GAP_MEAN_S) - EVENT_GAP_SIGMA**2 / 2
    total = np.cumsum(rng.lognormal(mu, EVENT_GAP_SIGMA, int(lengths.sum())))
    last = np.repeat(np.cumsum(lengths) - 1, lengths)  # each event's sequence's last event
    return (total[last] - total).astype(np.float32)


class SyntheticData:
    """Reproducible batches for one config. ``batch(i)`` is the i-th batch of this rank."""

    def __init__(self, cfg: ModelConfig, seed: int = 0, batch_size: int | None = None, rank: int = 0):
        self.cfg = cfg
        self.seed = seed
        self.rank = rank
        self.batch_size = batch_size or cfg.data.global_batch
        self.feature_names = [f"t{i}" for i in range(len(cfg.sparse.rows))]
        self.sequence_names = [s.name for s in cfg.sequences]
        self.hashed = cfg.data.id_layout == "hashed"

    def table_alpha(self, table: int) -> float:
        d = self.cfg.data
        if d.zipf:
            return d.zipf[table]
        return d.zipf_user if table == 0 else d.zipf_other

    def pooling_factors(self, rng: np.random.Generator, table: int) -> np.ndarray:
        d, p, b = self.cfg.data, self.cfg.sparse.pooling[table], self.batch_size
        kind = d.pooling_kinds[table] if d.pooling_kinds else d.pooling
        if kind == "fixed" or p <= 1:
            return np.full(b, p, dtype=np.int64)
        if kind == "uniform":
            return rng.integers(1, p + 1, b, dtype=np.int64)
        return truncated_lognormal(rng, p, POOLING_SIGMA, b, 1, d.pooling_cap)

    def batch(self, index: int) -> Batch:
        cfg, b = self.cfg, self.batch_size
        rng = np.random.default_rng([self.seed, index, self.rank])
        lengths, values = [], []
        for t, rows in enumerate(cfg.sparse.rows):
            n = self.pooling_factors(rng, t)
            lengths.append(n)
            values.append(zipf_ids(rng, rows, self.table_alpha(t), int(n.sum()), self.hashed, self.feature_names[t]))
        sparse = _kjt(self.feature_names, lengths, values)
        seq = None
        if cfg.sequences:
            lengths, values, own = [], [], {}
            for s in cfg.sequences:
                # a follower describes its sequence's events: the same lengths, drawn once
                n = own[s.follows] if s.follows else draw_lengths(rng, s, b)
                own.setdefault(s.name, n)
                lengths.append(n)
                values.append(zipf_ids(rng, s.rows, cfg.data.zipf_item, int(n.sum()), self.hashed, s.name))
            seq = _kjt(self.sequence_names, lengths, values)
        dense = np.log1p(np.abs(rng.standard_normal((b, cfg.data.dense_features)) * 10))
        labels = rng.random((b, cfg.over.tasks)) < cfg.data.positive_rate
        # drawn last, so that a config without content gets the very batches it always got
        content = self.content(rng, seq) if cfg.content is not None else {}
        if cfg.hstu is not None and cfg.hstu.time_buckets:  # then ages, for the same reason
            content["seq_time"] = torch.from_numpy(
                np.concatenate([event_ages(rng, n) for s, n in zip(cfg.sequences, lengths) if not s.follows])
            )
        return Batch(
            dense=torch.from_numpy(dense.astype(np.float32)),
            sparse=sparse,
            seq=seq,
            labels=torch.from_numpy(labels.astype(np.float32)),
            **content,
        )

    def content(self, rng: np.random.Generator, seq: KeyedJaggedTensor | None) -> dict:
        """The ad's content for a batch: unit-norm vectors (an encoder's normalised output)."""
        c, b = self.cfg.content, self.batch_size
        dtype = torch.bfloat16 if c.dtype == "bf16" else torch.float32
        out = {}
        if c.vectors:
            out["content"] = torch.cat([_unit(rng, (b, w), dtype) for w in c.vectors], dim=1)
        if c.tokens:
            out["content_tokens"] = _unit(rng, (b, c.tokens, c.token_dim), dtype)
        if c.sequence_dim and seq is not None:
            out["item_content"] = _unit(rng, (int(seq.values().numel()), c.sequence_dim), dtype)
        return out


def _unit(rng: np.random.Generator, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    x = rng.standard_normal(shape, dtype=np.float32)
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    return torch.from_numpy(x).to(dtype)


def _kjt(keys: list[str], lengths: list[np.ndarray], values: list[np.ndarray]) -> KeyedJaggedTensor:
    """A KJT that carries its host-side layout, as a loader hands it over.

    TorchRec reads the per-key lengths and offsets (``length_per_key``, ``offset_per_key``) as
    host ints, in ``to_dict``/``split`` and in its embedding modules' forward; left out, it
    computes them from the lengths with a ``tolist``, a device sync in every step on GPU. Here
    they are known when the batch is made, and ``KeyedJaggedTensor.to`` keeps them.
    """
    per_key = [int(n.sum()) for n in lengths]
    flat = np.concatenate(lengths)
    return KeyedJaggedTensor(
        keys=keys,
        values=torch.from_numpy(np.concatenate(values)),
        lengths=torch.from_numpy(flat),
        offsets=torch.from_numpy(np.concatenate([[0], np.cumsum(flat)])),
        stride=len(lengths[0]),
        length_per_key=per_key,
        offset_per_key=[0, *np.cumsum(per_key).tolist()],
    )


def id_exponents(cfg: ModelConfig) -> dict[str, float]:
    """Each table's Zipf exponent, by table name, as the batches draw its IDs."""
    data = SyntheticData(cfg, batch_size=1)
    return {f"table_t{t}": data.table_alpha(t) for t in range(len(cfg.sparse.rows))} | {
        f"table_{s.name}": cfg.data.zipf_item for s in cfg.sequences
    }


def expected_ids_per_example(cfg: ModelConfig, samples: int = 65536) -> dict[str, float]:
    """Mean IDs one example looks up per table (``table_t0``..., ``table_<sequence>``), from the
    same pooling and length distributions the batches are drawn from, for the planner and the
    projection's lookup and communication volumes."""
    data = SyntheticData(cfg, seed=0, batch_size=samples)
    rng = np.random.default_rng(0)
    out = {f"table_t{t}": float(data.pooling_factors(rng, t).mean()) for t in range(len(cfg.sparse.rows))}
    out |= {f"table_{name}": float(n.mean()) for name, n in expected_lengths(cfg, samples).items()}
    return out
