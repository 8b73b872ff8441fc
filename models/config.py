"""Model and data configurations: TOML files read into typed, validated dataclasses.

A config is data, not code: `models/configs/<name>.toml` for the shipped tiers, or any path a
user passes. Every mistake names the file and the field. The sections mirror the model's Arch
modules (TorchRec's vocabulary), so a reader can map each line of a file to a block.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import typing
from dataclasses import dataclass
from pathlib import Path

from gembench.errors import UsageError, read_toml
from gembench.loader import check_global_batch

CONFIG_DIR = Path(__file__).parent / "configs"
KINDS = ("gem", "dlrm", "dcnv2")
HASHED_WHEN_SET = (
    ("sparse", "cpu_rows_cap", 0),
    ("data", "zipf", ()),
    ("data", "pooling_kinds", ()),
    ("data", "id_layout", "hashed"),
    (None, "content", None),
    ("sequences", "follows", ""),
    ("sequences", "lengths", "lognormal"),
    ("hstu", "rab", True),
    ("hstu", "alpha", 0.0),
    ("hstu", "dropout", 0.0),
    ("hstu", "output", "gated"),
    ("hstu", "position_buckets", 0),
    ("hstu", "time_buckets", 0),
    ("hstu", "input_mlp", ()),
    ("hstu", "input_dropout", 0.0),
    (None, "candidate", None),
    (None, "reference", None),
)  # (section or None: top level, field, default): see ModelConfig.hash; "sequences": each entry
CONTENT_DTYPES = ("fp32", "bf16")
HSTU_OUTPUTS = ("gated", "concat")
SEQUENCE_LENGTHS = ("lognormal", "fixed")


@dataclass(frozen=True)
class DataConfig:
    """Synthetic batches: sizes and the distributions of IDs, pooling and sequence lengths."""

    global_batch: int
    dense_features: int = 13
    zipf_item: float = 1.05  # exponent for sequence item IDs (the hottest feature in ads)
    zipf_user: float = 0.6  # exponent for the first pooled table (user-like, flatter)
    zipf_other: float = 1.2  # exponent for every other pooled table
    pooling: str = "uniform"  # "fixed": exactly pooling[i] IDs; "uniform": 1..pooling[i]; "lognormal"
    pooling_cap: int = 100  # upper bound for lognormal pooling
    positive_rate: float = 0.1  # share of positive labels per task (CTR-like)
    # Per pooled table (one entry each, or none): its Zipf exponent (none: zipf_user for the
    # first table, zipf_other for the rest) and its pooling distribution (none: `pooling`).
    zipf: tuple[float, ...] = ()
    pooling_kinds: tuple[str, ...] = ()
    # Where the hot IDs sit in a table: "hashed" (scattered over its rows by a fixed permutation,
    # as production IDs are hashed before they index a table) or "sorted" (hot rows first: the
    # worst case for row-wise sharding, whose first shard then holds every table's head).
    id_layout: str = "hashed"


@dataclass(frozen=True)
class SparseConfig:
    """SparseArch: pooled embedding tables (one feature each), all of width ``dim``."""

    dim: int
    rows: tuple[int, ...]
    pooling: tuple[int, ...]  # mean (lognormal), max (uniform) or exact (fixed) IDs per example
    # On CPU every table is capped at this many rows (0: never), so that a config at published
    # shapes (dcnv2-mlperf's 40M-row tables) runs here while `project` prices it uncapped.
    cpu_rows_cap: int = 0


@dataclass(frozen=True)
class SequenceConfig:
    """One user-behaviour sequence: item-ID table and truncated-lognormal length."""

    name: str
    rows: int
    max_len: int
    mean_len: int
    # The name of an earlier sequence whose events this one describes (MLPerf DLRMv4's artist and
    # album of each listened item): the same lengths, no HSTU of its own; its embeddings join that
    # sequence's input tokens (models/hstu.py SequenceInput). "": a sequence of its own.
    follows: str = ""
    lengths: str = "lognormal"  # "fixed": every sequence is max_len long (a history truncated to max_len)


@dataclass(frozen=True)
class HSTUConfig:
    """SequenceArch: HSTU layers over the jagged sequences (arXiv 2402.17152).

    The defaults are the paper's layer as GEM runs it; the other values are MLPerf DLRMv4's
    (docs/dlrmv4.md): no relative attention bias, position and time embeddings added to the input.
    """

    layers: int
    dim: int
    heads: int
    rab: bool = True  # relative attention bias (distance buckets) inside SiLU(Q K^T + rab)
    alpha: float = 0.0  # Q K^T scaled by alpha before the SiLU (0: unscaled; DLRMv4: 1/sqrt(d_qk))
    dropout: float = 0.0  # on the output projection's input ("linear dropout")
    output: str = "gated"  # gated: W2 (LN(A V) * U); concat: W2 [U, A V, LN(A V) * U], 3 dim -> dim
    # The input side (SequenceInput): learned embeddings of each token's distance to the sequence's
    # end and of sqrt(minutes before the last event), added to the input (0: none); an MLP (these
    # hidden widths) over each sequence's embedding and another over its followers'; input dropout.
    position_buckets: int = 0
    time_buckets: int = 0
    input_mlp: tuple[int, ...] = ()
    input_dropout: float = 0.0


@dataclass(frozen=True)
class CrossConfig:
    """InterFormer-style summaries (arXiv 2411.09852): CLS + PMA seeds + most recent tokens."""

    pma_seeds: int = 2
    recent: int = 2


@dataclass(frozen=True)
class WukongConfig:
    """InteractionArch: stacked Wukong layers (arXiv 2403.02545)."""

    layers: int
    n_fm: int
    n_lcb: int
    rank: int
    mlp: tuple[int, ...]


@dataclass(frozen=True)
class DenseConfig:
    """DenseArch: bottom MLP over the continuous features (its last width becomes one token)."""

    mlp: tuple[int, ...]


@dataclass(frozen=True)
class OverConfig:
    """OverArch / TaskArch: shared MLP over the interaction output, then one head per task."""

    mlp: tuple[int, ...]
    tasks: int = 1


@dataclass(frozen=True)
class DCNConfig:
    """DCNv2 cross layers (low rank), used by kind = "dcnv2"."""

    layers: int = 3
    rank: int = 512


@dataclass(frozen=True)
class CandidateConfig:
    """Target-aware ranking (HSTU's formulation, MLPerf DLRMv4): the candidate is the last event of
    the behaviour sequence, so it attends to the whole history; the pooled features become
    contextual tokens in front of it (each through its own Linear). The user vector (HSTU's output
    at the candidate) times the item vector (``item_mlp`` over the candidate's embeddings, its own
    and its followers') goes through over.mlp to over.tasks logits. No Wukong, no summaries."""

    item_mlp: tuple[int, ...]


@dataclass(frozen=True)
class ReferenceConfig:
    """A published FLOPs count of this model, which `gembench describe` reconciles with gembench's
    (models/flops.py reconcile_flops). The published convention: training FLOPs per example of the
    HSTU layers only, at ``seq_len`` positions, weight GEMMs 3 x their forward, the causal
    attention ``attention_train`` x its forward."""

    published_in: str
    gflop_per_example: float
    seq_len: int
    attention_train: float = 3.0


@dataclass(frozen=True)
class ContentConfig:
    """ContentArch: the ad creative's content, as frozen upstream encoders hand it over.

    Per candidate, ``vectors`` (one width each, e.g. an image and a text embedding) and optionally
    ``tokens`` content tokens of width ``token_dim`` (e.g. title or OCR tokens); per behaviour
    sequence item, optionally a content vector of width ``sequence_dim``. Each is projected into the
    model width by an MLP of hidden widths ``mlp``; see models/content.py.
    """

    vectors: tuple[int, ...] = ()
    names: tuple[str, ...] = ()  # one per vector, for tables (default: content0, content1, ...)
    tokens: int = 0
    token_dim: int = 0
    mlp: tuple[int, ...] = ()
    sequence_dim: int = 0
    dtype: str = "fp32"  # of the content inputs in the batch (the encoders' output)

    @property
    def labels(self) -> tuple[str, ...]:
        return self.names or tuple(f"content{i}" for i in range(len(self.vectors)))

    @property
    def candidate_tokens(self) -> int:
        """Interaction tokens the content adds: one per vector, one for the content tokens."""
        return len(self.vectors) + (1 if self.tokens else 0)


@dataclass(frozen=True)
class ModelConfig:
    """A whole benchmark configuration: one GEM-like or reference model plus its data."""

    name: str
    kind: str
    description: str
    data: DataConfig
    sparse: SparseConfig
    dense: DenseConfig
    over: OverConfig
    sequences: tuple[SequenceConfig, ...] = ()
    hstu: HSTUConfig | None = None
    cross: CrossConfig | None = None
    wukong: WukongConfig | None = None
    dcn: DCNConfig | None = None
    content: ContentConfig | None = None
    candidate: CandidateConfig | None = None
    reference: ReferenceConfig | None = None
    source: str = ""  # the file it was read from

    @property
    def hash(self) -> str:
        """Stable hash of the content (not the file path): equal configs compare as equal."""
        content = dataclasses.asdict(self)
        content.pop("source")
        # fields added since results were first recorded count only when set, so that every
        # config without them keeps its hash (and its baselines and history stay comparable)
        for section, name, default in HASHED_WHEN_SET:
            where = content if section is None else content[section]
            for entry in where if isinstance(where, (list, tuple)) else [where] if where is not None else []:
                if entry.get(name) in (default, list(default) if isinstance(default, tuple) else default):
                    del entry[name]
        return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def with_global_batch(cfg: ModelConfig, batch: int | None, nproc: int = 1) -> ModelConfig:
    """``cfg`` with its global batch overridden by --batch (None: unchanged). The hash covers it,
    so runs at another batch never compare as the same config."""
    if batch is None:
        return cfg
    check_global_batch(batch, nproc)
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, global_batch=batch))


def for_device(cfg: ModelConfig, device_type: str) -> ModelConfig:
    """``cfg`` as it runs on ``device_type``: on CPU, tables capped at sparse.cpu_rows_cap rows,
    the sequences' too (the hash follows the rows, so a capped run never compares with an uncapped one)."""
    cap = cfg.sparse.cpu_rows_cap
    if device_type != "cpu" or not cap or max([*cfg.sparse.rows, *(s.rows for s in cfg.sequences)]) <= cap:
        return cfg
    rows = tuple(min(r, cap) for r in cfg.sparse.rows)
    sequences = tuple(dataclasses.replace(s, rows=min(s.rows, cap)) for s in cfg.sequences)
    return dataclasses.replace(cfg, sparse=dataclasses.replace(cfg.sparse, rows=rows), sequences=sequences)


def _validate_candidate(cfg: ModelConfig, need) -> None:
    c = cfg.candidate
    leaders = [q for q in cfg.sequences if not q.follows]
    need(len(leaders) == 1, "sequences", "must have one sequence of its own with [candidate] (the others follow it)")
    need(cfg.wukong is None, "wukong", "is not used with [candidate] (the head is user x item): drop the section")
    need(cfg.cross is None, "cross", "is not used with [candidate] (no summaries): drop the section")
    need(cfg.content is None, "content", "is not read with [candidate]: drop the section")
    need(cfg.data.dense_features == 0, "data.dense_features", "must be 0 with [candidate] (no dense token)")
    need(bool(c.item_mlp) and all(w > 0 for w in c.item_mlp), "candidate.item_mlp", "must be positive widths")
    need(c.item_mlp[-1] == cfg.hstu.dim, "candidate.item_mlp", f"must end at hstu.dim ({cfg.hstu.dim}): x the user")


def known_configs() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.toml"))


def load_config(name_or_path: str | Path) -> ModelConfig:
    """Read a shipped config by name (``small``) or any TOML file by path."""
    text = str(name_or_path)
    path = Path(text)
    if not (path.suffix == ".toml" or path.exists()):
        path = CONFIG_DIR / f"{text}.toml"
        if not path.exists():
            raise UsageError(
                f"unknown config {text!r}: known configs are {', '.join(known_configs())}, "
                "or pass the path of a .toml file"
            )
    raw = read_toml(path, f"config file {path} does not exist")
    raw.setdefault("name", path.stem)
    cfg = _build(ModelConfig, raw, str(path), "")
    cfg = dataclasses.replace(cfg, source=str(path))
    validate(cfg)
    return cfg


# --- parsing: generic over the dataclasses above, so every field is checked the same way ---


def _build(cls, raw, path: str, where: str):
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: [{where or 'top level'}] must be a table, got {raw!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "source"}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise UsageError(
            f"{path}: unknown field {_join(where, unknown[0])!r}; "
            f"fields of [{where or 'top level'}] are {', '.join(fields)}"
        )
    values = {}
    for name, f in fields.items():
        key = _join(where, name)
        if name not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise UsageError(f"{path}: missing field {key!r}")
            continue
        values[name] = _convert(hints[name], raw[name], path, key)
    return cls(**values)


def _convert(hint, value, path: str, key: str):
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(inner, value, path, key)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, path, key)
    if origin is tuple:
        if not isinstance(value, list):
            raise UsageError(f"{path}: field {key!r} must be a list, got {value!r}")
        if args[-1] is Ellipsis:
            return tuple(_convert(args[0], v, path, f"{key}[{i}]") for i, v in enumerate(value))
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float, str) and (type(value) is not hint):
        raise UsageError(f"{path}: field {key!r} must be {hint.__name__}, got {value!r}")
    return value


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


# --- validation: sizes that cannot make a model ---


def validate(cfg: ModelConfig) -> None:
    path = cfg.source or cfg.name

    def need(ok: bool, key: str, what: str) -> None:
        if not ok:
            raise UsageError(f"{path}: field {key!r} {what}")

    need(cfg.kind in KINDS, "kind", f"must be one of {', '.join(KINDS)}, got {cfg.kind!r}")
    d, s = cfg.data, cfg.sparse
    need(d.global_batch > 0, "data.global_batch", "must be positive")
    candidate = cfg.candidate is not None
    need(
        d.dense_features > 0 or candidate,
        "data.dense_features",
        "must be positive (0, no dense features, only with [candidate])",
    )
    need(d.pooling in ("fixed", "uniform", "lognormal"), "data.pooling", "must be fixed, uniform or lognormal")
    need(0 < d.positive_rate < 1, "data.positive_rate", "must be between 0 and 1")
    for key in ("zipf_item", "zipf_user", "zipf_other"):
        need(getattr(d, key) >= 0, f"data.{key}", "must be >= 0 (0 is uniform)")
    n = len(s.rows)
    need(len(d.zipf) in (0, n), "data.zipf", f"must have one exponent per pooled table ({n}) or none")
    need(all(a >= 0 for a in d.zipf), "data.zipf", "must all be >= 0 (0 is uniform)")
    need(len(d.pooling_kinds) in (0, n), "data.pooling_kinds", f"must have one entry per pooled table ({n}) or none")
    need(
        all(k in ("fixed", "uniform", "lognormal") for k in d.pooling_kinds),
        "data.pooling_kinds",
        "must each be fixed, uniform or lognormal",
    )
    need(d.id_layout in ("hashed", "sorted"), "data.id_layout", "must be hashed or sorted")
    need(s.dim > 0, "sparse.dim", "must be positive")
    need(len(s.rows) > 0, "sparse.rows", "must list at least one table")
    need(len(s.pooling) == len(s.rows), "sparse.pooling", f"must have one entry per table ({len(s.rows)})")
    need(all(r > 0 for r in s.rows), "sparse.rows", "must all be positive")
    need(all(p > 0 for p in s.pooling), "sparse.pooling", "must all be positive")
    if d.dense_features == 0:
        need(not cfg.dense.mlp, "dense.mlp", "must be [] when data.dense_features = 0 (there is no dense arch)")
    else:
        need(all(w > 0 for w in cfg.dense.mlp) and cfg.dense.mlp, "dense.mlp", "must be positive widths")
    need(all(w > 0 for w in cfg.over.mlp), "over.mlp", "must be positive widths")
    need(cfg.over.tasks > 0, "over.tasks", "must be positive")
    need(not candidate or cfg.kind == "gem", "candidate", f"is read by kind = 'gem' only, not {cfg.kind!r}")
    if cfg.reference is not None:
        r = cfg.reference
        need(
            cfg.kind == "gem" and len([q for q in cfg.sequences if not q.follows]) == 1,
            "reference",
            "reconciles the FLOPs of one HSTU stack: it needs kind = 'gem' and one sequence of its own",
        )
        need(r.gflop_per_example > 0, "reference.gflop_per_example", "must be positive")
        need(r.seq_len > 0, "reference.seq_len", "must be positive")
        need(r.attention_train >= 1, "reference.attention_train", "must be >= 1 (training counts the forward)")
    if cfg.kind == "gem":
        need(cfg.hstu is not None, "hstu", "is required for kind = 'gem'")
        need(len(cfg.sequences) > 0, "sequences", "must list at least one sequence for kind = 'gem'")
        if candidate:
            _validate_candidate(cfg, need)
        else:
            need(cfg.wukong is not None, "wukong", "is required for kind = 'gem' (or a [candidate] section)")
            need(cfg.dense.mlp[-1] == s.dim, "dense.mlp", f"must end at sparse.dim ({s.dim}): it becomes one token")
            w = cfg.wukong
            need(w.layers > 0 and w.n_fm > 0 and w.n_lcb > 0 and w.rank > 0, "wukong", "sizes must be positive")
            need(all(x > 0 for x in w.mlp), "wukong.mlp", "must be positive widths")
        h = cfg.hstu
        need(h.layers >= 0 and h.dim > 0 and h.heads > 0, "hstu", "needs layers >= 0, dim > 0, heads > 0")
        need(h.dim % h.heads == 0, "hstu.dim", f"must be divisible by hstu.heads ({h.heads})")
        need(h.alpha >= 0, "hstu.alpha", "must be >= 0 (0: Q K^T unscaled)")
        need(0 <= h.dropout < 1 and 0 <= h.input_dropout < 1, "hstu", "dropout and input_dropout must be in [0, 1)")
        need(h.output in HSTU_OUTPUTS, "hstu.output", f"must be one of {', '.join(HSTU_OUTPUTS)}")
        need(h.position_buckets >= 0 and h.time_buckets >= 0, "hstu", "position_buckets and time_buckets must be >= 0")
        need(all(x > 0 for x in h.input_mlp), "hstu.input_mlp", "must be positive widths ([]: no input MLP)")
        names = [q.name for q in cfg.sequences]
        need(len(set(names)) == len(names), "sequences", "must have distinct names")
        for i, q in enumerate(cfg.sequences):
            key = f"sequences[{i}]"
            need(q.rows > 0, f"{key}.rows", "must be positive")
            need(q.max_len > 0, f"{key}.max_len", "must be positive")
            need(0 < q.mean_len <= q.max_len, f"{key}.mean_len", f"must be in 1..max_len ({q.max_len})")
            need(q.lengths in SEQUENCE_LENGTHS, f"{key}.lengths", f"must be one of {', '.join(SEQUENCE_LENGTHS)}")
            if q.follows:
                leaders = {p.name: p for p in cfg.sequences[:i] if not p.follows}
                need(q.follows in leaders, f"{key}.follows", "must name an earlier sequence that follows none")
                lead = leaders[q.follows]
                need(
                    (q.max_len, q.mean_len, q.lengths) == (lead.max_len, lead.mean_len, lead.lengths),
                    f"{key}.follows",
                    f"needs max_len, mean_len and lengths equal to {q.follows!r}'s: it describes the same events",
                )
        if cfg.cross is not None:
            need(cfg.cross.pma_seeds >= 0 and cfg.cross.recent >= 0, "cross", "sizes must be >= 0")
    if cfg.content is not None:
        c = cfg.content
        need(
            cfg.kind == "gem",
            "content",
            f"is read by GEM's ContentArch only; kind = {cfg.kind!r} has no content block: drop the [content] section",
        )
        need(
            all(w > 0 for w in c.vectors),
            "content.vectors",
            "must be positive widths (a width of 0 is no vector: leave it out)",
        )
        need(len(c.names) in (0, len(c.vectors)), "content.names", f"must name every vector ({len(c.vectors)}) or none")
        need(c.tokens >= 0, "content.tokens", "must be 0 (none) or a positive count of content tokens")
        need(c.tokens == 0 or c.token_dim > 0, "content.token_dim", "must be a positive width when content.tokens > 0")
        need(c.sequence_dim >= 0, "content.sequence_dim", "must be 0 (none) or a positive width")
        need(all(w > 0 for w in c.mlp), "content.mlp", "must be positive widths")
        need(c.dtype in CONTENT_DTYPES, "content.dtype", f"must be one of {', '.join(CONTENT_DTYPES)}")
        need(
            not (c.sequence_dim and any(q.follows for q in cfg.sequences)),
            "content.sequence_dim",
            "is per item of a sequence of its own: drop it, or the sequences' follows",
        )
        need(
            c.vectors or c.tokens or c.sequence_dim,
            "content",
            "has nothing in it: give vectors, tokens or sequence_dim, or drop the section",
        )
    if cfg.kind == "dcnv2":
        need(cfg.dcn is not None, "dcn", "is required for kind = 'dcnv2'")
        need(cfg.dcn.layers > 0 and cfg.dcn.rank > 0, "dcn", "layers and rank must be positive")
    if cfg.kind in ("dlrm", "dcnv2"):
        need(cfg.dense.mlp[-1] == s.dim, "dense.mlp", f"must end at sparse.dim ({s.dim})")
        need(not cfg.sequences, "sequences", f"are not used by kind = {cfg.kind!r}")
