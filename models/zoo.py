"""gembench's own configs as one provider of the workload protocol (workload.py, gembench.workload).

``workload(config)`` is the harness's one way into the zoo: every command that takes ``--config``
turns it into a ``ZooWorkload`` here and from then on reads only the protocol, as it does for a
team's ``--model``. The zoo implements every optional part of it: the analytic FLOPs per block
(models/flops.py), the pooling and ID skew of its synthetic data, its memory estimate
(models/memory.py), its dense blocks (models/blocks.py) and HSTU layers for checkpointing, the
dense half compiled as one method, and the model switches only it has (jagged attention, the
ad's content). The import-linter contract in pyproject.toml keeps the harness off every other
module of models/.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import torch

from gembench.models.blocks import dense_blocks
from gembench.models.config import CONFIG_DIR, ModelConfig, for_device, known_configs, load_config, with_global_batch
from gembench.models.data import SyntheticData, expected_ids_per_example, id_exponents
from gembench.models.flops import TRAIN_PER_FORWARD, batch_forward_flops, forward_flops_per_example
from gembench.models.gem import build_model
from gembench.models.heads import task_losses
from gembench.models.memory import memory_estimate, parameter_counts
from gembench.models.sparse import pooled_tables, sequence_tables
from gembench.workload import Workload

__all__ = ["ZooWorkload", "known_configs", "workload", "zoo"]

SPEC = "gembench.models.zoo:zoo"
# which of the analytic per-block FLOPs (models/flops.py keys) a checkpointing mode runs again
RECOMPUTED_BLOCKS = {"none": (), "hstu": ("sequence_arch",), "all": None}  # None: every block


@functools.lru_cache(maxsize=4)
def _meta(cfg: ModelConfig) -> torch.nn.Module:
    """The config's model on the meta device, built once for what the zoo reads off it (its
    parameter counts, its blocks): read here, never handed out."""
    with torch.device("meta"):
        return build_model(cfg, "meta")


@functools.lru_cache(maxsize=16)
def _counts(cfg: ModelConfig) -> dict:
    """parameter_counts once per config: asked per stack, world size and plan."""
    return parameter_counts(cfg, _meta(cfg))


@functools.lru_cache(maxsize=16)
def _block_paths(cfg: ModelConfig) -> tuple[tuple[str, bool], ...]:
    """(path, is an HSTU layer) of every dense block of the config's model."""
    from gembench.models.hstu import HSTULayer

    return tuple((path, isinstance(block, HSTULayer)) for path, block in dense_blocks(_meta(cfg)))


class ZooWorkload(Workload):
    """A gembench config through the protocol: TorchRec tables, the pure model, seeded
    SyntheticData, the multitask loss (one BCE per task), and the zoo's formulas."""

    def __init__(self, cfg: ModelConfig | str | Path, attention: str = "jagged"):
        self.cfg = cfg if isinstance(cfg, ModelConfig) else load_config(cfg)
        self.attention = attention
        self.spec, self.args = SPEC, {"config": self.cfg.name if _shipped(self.cfg) else self.cfg.source}
        self.flag = f"--config {self.args['config']}"  # how error messages name it

    # -- identity -----------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.cfg.name

    @property
    def kind(self) -> str:
        return self.cfg.kind

    @property
    def source(self) -> str:
        return self.cfg.source

    @property
    def description(self) -> str:
        return self.cfg.description

    @property
    def global_batch(self) -> int:
        return self.cfg.data.global_batch

    @global_batch.setter
    def global_batch(self, batch: int) -> None:
        self.cfg = with_global_batch(self.cfg, batch)  # the config hash follows it

    @property
    def switches(self) -> frozenset[str]:
        has = set()
        if self.cfg.sequences:
            has.add("jagged")
        if self.cfg.content is not None:
            has.add("content")
        return frozenset(has)

    def fingerprint(self) -> str:
        return self.cfg.hash

    def _with(self, cfg: ModelConfig, attention: str | None = None) -> ZooWorkload:
        other = ZooWorkload(cfg, attention or self.attention)
        other.spec, other.args, other.flag = self.spec, self.args, self.flag
        return other

    def on_device(self, device_type: str) -> ZooWorkload:
        """On CPU, tables capped at sparse.cpu_rows_cap rows (the hash follows the rows)."""
        capped = for_device(self.cfg, device_type)
        return self if capped is self.cfg else self._with(capped)

    def for_stack(self, options) -> ZooWorkload:
        """The model a stack runs: its attention kernel (jagged, or padded to the batch maximum)
        and, under content=off, the config without its [content] section (FLOPs, memory and hash
        then those of the model that runs)."""
        cfg = self.cfg
        if getattr(options, "content", "on") == "off" and cfg.content is not None:
            cfg = dataclasses.replace(cfg, content=None)
        attention = "jagged" if getattr(options, "jagged", True) else "padded"
        return self if (cfg is self.cfg and attention == self.attention) else self._with(cfg, attention)

    # -- what every workload gives --------------------------------------------------------------

    def tables(self):
        return pooled_tables(self.cfg) + (sequence_tables(self.cfg) if self.cfg.sequences else [])

    def build(self, device):
        return build_model(self.cfg, device, attention=self.attention)

    def batch(self, i, rank=0, world=1, seed=0):
        return SyntheticData(self.cfg, seed=seed, batch_size=self.global_batch // world, rank=rank).batch(i)

    def forward(self, model, batch):
        return model.dense(batch, model.embed(batch))

    def loss(self, output, batch):
        return task_losses(output, batch.labels)  # (tasks,): trained on their mean

    # -- the zoo's formulas and structure -------------------------------------------------------

    def forward_flops(self, batch):
        return batch_forward_flops(self.cfg, batch)

    def flops_per_example(self):
        return forward_flops_per_example(self.cfg)

    def pooling(self):
        return expected_ids_per_example(self.cfg)

    def row_skew(self):
        return {} if self.cfg.data.id_layout == "hashed" else id_exponents(self.cfg)

    def memory_estimate(self, batch, stack, device_type, shards, embedding_share=1.0, on_rank=False):
        return memory_estimate(
            self.cfg,
            batch,
            _counts(self.cfg),
            stack,
            device_type,
            shards=shards,
            embedding_share=embedding_share,
            on_rank=on_rank,
        )

    def blocks(self):
        return tuple(path for path, _ in _block_paths(self.cfg))

    def checkpointed(self, mode):
        if mode == "hstu":
            return tuple(path for path, hstu in _block_paths(self.cfg) if hstu)
        return super().checkpointed(mode)

    def recomputed_flops(self, per_block, mode):
        names = RECOMPUTED_BLOCKS[mode]
        return float(sum(per_block.values()) if names is None else sum(per_block.get(n, 0.0) for n in names))

    def compiled(self):
        return ("dense",)  # the dense half, one method over the dense blocks, dynamic shapes

    def sparse(self):
        return ("sparse_arch",)  # embed(batch): the lookups and their reshaping into tokens

    def details(self):
        return {**_content(self.cfg), **_reconciliation(self.cfg)}


def _shipped(cfg: ModelConfig) -> bool:
    """A config of models/configs/, named by its name (any other by its path)."""
    return Path(cfg.source).resolve() == (CONFIG_DIR / f"{cfg.name}.toml").resolve()


def _content(cfg: ModelConfig) -> dict:
    """describe's content section: per candidate and per sequence item, and the input bytes."""
    from gembench.models.content import content_input_bytes
    from gembench.models.data import expected_lengths

    c = cfg.content
    if c is None:
        return {}
    items = sum(float(n.mean()) for n in expected_lengths(cfg, samples=4096).values())
    rows = [[label, str(width)] for label, width in zip(c.labels, c.vectors)]
    if c.tokens:
        rows.append(["tokens", f"{c.tokens} x {c.token_dim}"])
    if c.sequence_dim:
        rows.append(["per sequence item", str(c.sequence_dim)])
    rows += [
        ["dtype", c.dtype],
        ["interaction tokens", str(c.candidate_tokens)],
        ["input bytes per example", f"{content_input_bytes(c, 1, items):,.0f}"],
    ]
    return {"content (the ad's, from frozen encoders)": {"headers": ["", "width"], "rows": rows}}


def _reconciliation(cfg: ModelConfig) -> dict:
    """describe's reconciliation of gembench's training FLOPs with a published count, where the
    config names one ([reference]): per part, then gembench's total turned into the reference's
    convention one difference at a time, and the residual."""
    from gembench.models.flops import reconcile_flops

    if cfg.reference is None:
        return {}
    r = reconcile_flops(cfg)
    rows = [[k, f"{a:,.3f}", f"{b:,.3f}", f"{a - b:+,.3f}"] for k, a, b in r["rows"]]
    ours, theirs = sum(a for _, a, _ in r["rows"]), sum(b for _, _, b in r["rows"])
    rows.append(["total", f"{ours:,.3f}", f"{theirs:,.3f}", f"{ours - theirs:+,.3f}"])
    residual = r["residual_gflop"]
    note = (
        f"reconciled {r['reconciled_gflop']:,.2f} GFLOP per example vs {r['published_gflop']:g} published "
        f"({r['published_in']}): residual {residual:+.3f} GFLOP ({100 * residual / r['published_gflop']:+.3f}%)"
    )
    return {
        f"training GFLOP per example ({r['tokens']:,.0f} tokens)": {
            "headers": ["part", "gembench", "reference's convention", "difference"],
            "rows": rows,
        },
        f"from gembench's count ({TRAIN_PER_FORWARD} x forward) to the reference's": {
            "headers": ["step", "GFLOP"],
            "rows": [[what, f"{v:,.3f}"] for what, v in r["steps"]],
            "note": note,
        },
    }


def workload(config: ModelConfig | str | Path | None = None) -> ZooWorkload:
    """A config by name, .toml path or ModelConfig (None: small), as a workload."""
    return ZooWorkload(config if config is not None else "small")


def zoo(config: str = "tiny") -> ZooWorkload:
    """`--model gembench.models.zoo:zoo --model-arg config=tiny`: a config through --model."""
    return ZooWorkload(config)
