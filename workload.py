"""The workload protocol: what a model gives the harness, whoever wrote it (docs/workload.md).

A workload is a subclass of ``Workload`` made by a factory the user names with ``--model
pkg.mod:factory`` or ``--model path/file.py:factory`` (``--model-arg key=value`` are its keyword
arguments; gembench.loader loads it and checks what it gives). The harness reads only this:
TorchRec table configs (the planner's input), a pure ``nn.Module`` whose sparse part is TorchRec
modules (so DMP can shard it; it must build on the meta device), a seeded batch source, a loss,
and optionally what the class docstring lists by who reads it. gembench's own configs are one
provider of it (models/zoo.py). This module sits below models/ and harness/ and imports neither.
"""

from __future__ import annotations

import torch
from torch import nn


class Workload:
    """Subclass it and give the five required members; every optional one has a working default.
    The members by who reads them (the class body keeps the same groups):

    Required
      name, global_batch                  the result's name and the job's global batch
      tables() -> [EmbeddingBagConfig|EmbeddingConfig]   every TorchRec table of the model
      build(device) -> nn.Module          pure, seeded by the caller, meta-buildable
      batch(i, rank, world, seed)         batch i of rank r, a torchrec Pipelineable (has
                                          .to(device)), identical for a seed; its KJTs hold
                                          global_batch/world examples
      loss(output, batch)                 a scalar, or a (tasks,) vector of per-task losses whose
                                          mean is trained (each task's is recorded)

    Training: the step, and which stack switches act on the model
      forward(model, batch) -> output     default model(batch)
      forward_flops(batch) -> {block: FLOPs}   forward FLOPs of one batch (None: counted once)
      unsupported                         stack switches this model cannot take (refused, exit 2)
      switches                            model switches (jagged, content) that for_stack() applies;
                                          for the rest the result says "not applicable"
      for_stack(options) -> Workload      the model a stack runs, same batches (default: itself)
      on_device(device_type) -> Workload  the workload as it runs there (default: itself)

    Placement: what is sharded, wrapped, compiled and timed where
      pooling() -> {table: mean IDs per example}   for the planner (default: 1 per feature)
      sharders(), constraints()           TorchRec sharders / ParameterConstraints (None: gembench's)
      sparse() -> paths                   submodules whose forward is the sparse_forward stage
                                          (default: the TorchRec embedding modules, by type)
      blocks() -> submodule paths         dense blocks: FSDP2's units, checkpointed under
                                          activation_checkpointing=all
      checkpointed(mode) -> paths | None  the blocks activation_checkpointing=mode wraps (default:
                                          none -> (), all -> blocks(), others refused)
      recomputed_flops(per_block, mode)   forward FLOPs the checkpointed blocks run again (default:
                                          the per_block entries named by a checkpointed path)
      compiled() -> paths                 submodules (or a method of the model, as "dense")
                                          compiled under compile=on (default: none, so compile is
                                          not applied and the result says so)

    Cost hints: what `project` (and the fit check before a run) read instead of running it
      flops_per_example() -> {block: FLOPs}   expected forward FLOPs of one example (None:
                                          forward_flops of a batch, else counted)
      row_skew() -> {table: Zipf exponent}   IDs by a power law, hottest rows first (default:
                                          uniform; metrics/imbalance.py's zipf_share is the law)
      memory_estimate(batch, stack, device_type, shards, embedding_share, on_rank)
                                          -> {dense, activations, transient[, embeddings, build,
                                          runtime]} bytes of one rank (None: from the parameter
                                          shapes, activations not estimated)

    Identity and presentation
      kind, fingerprint()                 the result's config kind and hash (default: "workload",
                                          a hash of tables, parameter shapes and batch spec)
      description                         one line for `gembench describe` (default: the class's)
      details() -> {title: {headers, rows[, note]}}   more of the model for `gembench describe`
    """

    # -- required ------------------------------------------------------------------------------

    name: str = ""
    global_batch: int = 0

    def tables(self) -> list:
        raise NotImplementedError

    def build(self, device: torch.device) -> nn.Module:
        raise NotImplementedError

    def batch(self, i: int, rank: int = 0, world: int = 1, seed: int = 0):
        raise NotImplementedError

    def loss(self, output, batch) -> torch.Tensor:
        raise NotImplementedError

    # -- training ------------------------------------------------------------------------------

    unsupported: frozenset[str] = frozenset()
    switches: frozenset[str] = frozenset()

    def forward(self, model: nn.Module, batch):
        return model(batch)

    def forward_flops(self, batch) -> dict[str, float] | None:
        return None

    def for_stack(self, options) -> Workload:
        return self

    def on_device(self, device_type: str) -> Workload:
        return self

    # -- placement -----------------------------------------------------------------------------

    def pooling(self) -> dict[str, float]:
        return {}

    def sharders(self):
        return None

    def constraints(self):
        return None

    def sparse(self) -> tuple[str, ...]:
        return ()

    def blocks(self) -> tuple[str, ...]:
        return ()

    def checkpointed(self, mode: str) -> tuple[str, ...] | None:
        return {"none": (), "all": tuple(self.blocks())}.get(mode)

    def recomputed_flops(self, per_block: dict[str, float], mode: str) -> float:
        names = {n for p in self.checkpointed(mode) or () for n in (p, p.rpartition(".")[2])}
        return float(sum(v for k, v in per_block.items() if k in names))

    def compiled(self) -> tuple[str, ...]:
        return ()

    # -- cost hints for `project` --------------------------------------------------------------

    def flops_per_example(self) -> dict[str, float] | None:
        return None

    def row_skew(self) -> dict[str, float]:
        return {}

    def memory_estimate(
        self, batch: int, stack, device_type: str, shards: int, embedding_share: float = 1.0, on_rank: bool = False
    ) -> dict[str, float] | None:
        return None

    # -- identity and presentation -------------------------------------------------------------

    kind: str = "workload"
    description: str = ""

    def fingerprint(self) -> str | None:
        return None

    def details(self) -> dict:
        return {}


def torchrec_types() -> tuple[type, ...]:
    """The TorchRec embedding modules a model's sparse part is made of, plain, fused and sharded."""
    from torchrec import EmbeddingBagCollection, EmbeddingCollection
    from torchrec.distributed.embedding import ShardedEmbeddingCollection
    from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection, FusedEmbeddingCollection

    return (
        EmbeddingBagCollection,
        EmbeddingCollection,
        FusedEmbeddingBagCollection,
        FusedEmbeddingCollection,
        ShardedEmbeddingBagCollection,
        ShardedEmbeddingCollection,
    )


def dense_roots(model: nn.Module, prefix: str = "") -> list[tuple[str, nn.Module]]:
    """The dense part of a model, read off its structure: the outermost submodules with parameters
    and no TorchRec module inside, in forward order. A child holding a TorchRec module is looked
    into, as is a container with no forward of its own (a ModuleDict or ModuleList: one module per
    sequence feature, say); modules without parameters (the pipeline's slots) are left out. FSDP2's
    roots (harness/train/parallelize.py) and the zoo's blocks (models/blocks.py) alike."""
    types, out = torchrec_types(), []
    for name, child in model.named_children():
        if isinstance(child, types) or not any(True for _ in child.parameters()):
            continue
        container = isinstance(child, (nn.ModuleDict, nn.ModuleList))
        if container or any(isinstance(m, types) for m in child.modules()):
            out += dense_roots(child, f"{prefix}{name}.")
        else:
            out.append((f"{prefix}{name}", child))
    return out
