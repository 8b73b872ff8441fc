"""gembench's own configs as one provider of the workload protocol (gembench/workload.py).

``ZooWorkload(cfg)`` gives a gem, dlrm or dcnv2 config to whatever reads the protocol (check-model,
the generic runner), with the zoo's analytic FLOPs per block. It is also the one entry through
which the harness reaches the zoo's blocks (the models, losses and block lists it re-exports here):
the import-linter contract in pyproject.toml keeps the harness off gem, hstu, cross, heads and blocks.
"""

from __future__ import annotations

import functools

import torch

from gembench.models.blocks import dense_blocks, dense_roots, largest_block_params  # noqa: F401  (the harness's entry)
from gembench.models.config import ModelConfig, load_config
from gembench.models.content import content_input_bytes  # noqa: F401
from gembench.models.cross import SequenceSummary, summary_flops  # noqa: F401
from gembench.models.data import SyntheticData, expected_ids_per_example, id_exponents
from gembench.models.flops import batch_forward_flops, forward_flops_per_example
from gembench.models.gem import build_model
from gembench.models.heads import multitask_loss, task_losses  # noqa: F401
from gembench.models.hstu import hstu_attention_flops  # noqa: F401
from gembench.models.memory import memory_estimate as config_memory
from gembench.models.memory import parameter_counts
from gembench.models.ops.pytorch.hstu_attention import hstu_jagged_attention, hstu_padded_attention  # noqa: F401
from gembench.models.sparse import pooled_tables, sequence_tables
from gembench.workload import Workload

# a meta build per config, not per call: the projection asks once per world size and plan rating
_counts = functools.lru_cache(maxsize=8)(parameter_counts)


def zoo_tables(cfg: ModelConfig) -> list:
    """Every TorchRec table of a config: its pooled tables, and a gem config's sequence tables."""
    return pooled_tables(cfg) + (sequence_tables(cfg) if cfg.kind == "gem" else [])


def sequence_table_names(cfg: ModelConfig) -> list[str]:
    return [t.name for t in sequence_tables(cfg)] if cfg.kind == "gem" else []


def hstu_layer_type():
    from gembench.models.hstu import HSTULayer

    return HSTULayer  # the one block type activation_checkpointing=hstu picks


class ZooWorkload(Workload):
    """A gembench config through the protocol: tables, build, seeded SyntheticData, multitask loss."""

    def __init__(self, cfg: ModelConfig | str, attention: str = "jagged"):
        self.cfg = load_config(cfg) if isinstance(cfg, str) else cfg
        self.name, self.global_batch, self.attention = self.cfg.name, self.cfg.data.global_batch, attention

    def tables(self):
        return zoo_tables(self.cfg)

    def build(self, device):
        return build_model(self.cfg, device, attention=self.attention)

    def batch(self, i, rank=0, world=1, seed=0):
        return SyntheticData(self.cfg, seed=seed, batch_size=self.global_batch // world, rank=rank).batch(i)

    def forward(self, model, batch):
        return model.dense(batch, model.embed(batch))

    def loss(self, output, batch):
        return multitask_loss(output, batch.labels)

    def forward_flops(self, batch):
        return batch_forward_flops(self.cfg, batch)

    def pooling(self):
        return expected_ids_per_example(self.cfg)

    def row_skew(self):
        return {} if self.cfg.data.id_layout == "hashed" else id_exponents(self.cfg)

    def flops_per_example(self):
        return forward_flops_per_example(self.cfg)

    def memory_estimate(self, batch, stack, device_type, shards):
        counts = _counts(self.cfg)
        return config_memory(self.cfg, batch, counts=counts, stack=stack, device_type=device_type, shards=shards)

    def blocks(self):
        return tuple(name for name, _ in dense_blocks(self.build(torch.device("meta"))))


def zoo(config: str = "tiny") -> ZooWorkload:
    """`--model gembench.models.zoo:zoo --model-arg config=tiny`: a config through the protocol."""
    return ZooWorkload(config)
