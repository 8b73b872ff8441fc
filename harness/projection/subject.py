"""What the projection reads of a model, from the workload protocol alone (workload.py).

A config of the zoo and a team's own ``--model`` workload are projected by the same code: the
tables (TorchRec configs; an EmbeddingConfig table is an unpooled sequence), the mean IDs per
example of each (pooling(), else one per feature), the power law of their IDs (row_skew(), else
uniform), forward FLOPs per example per block (flops_per_example(), else forward_flops() of one
batch, else FlopCounterMode on one), parameter counts from the meta build, and the memory beside
the tables (memory_estimate(), else the dense state from the parameter counts, activations not
estimated). The identity is a run's (workloads.identity): a config's name and hash, a workload's
name and the hash of its tables, parameter shapes and batch spec.
"""

from __future__ import annotations

import copy
import functools

import torch

from gembench.workload import Workload

FLOPS_SAMPLE = 64  # examples in the batch FLOPs are taken from, when the workload has no per-example figure


class Subject:
    """A model as the projection sees it (``of``). ``source``: "config" for the zoo's, whose
    projection is held against published systems where one is known, else "workload"."""

    def __init__(self, workload: Workload, name: str, hash: str, source: str):
        self.workload, self.name, self.hash, self.source = workload, name, hash, source
        self.global_batch = workload.global_batch

    @classmethod
    def of(cls, workload: Workload) -> Subject:
        """A workload (a config's or a ``--model``), identified as its results are."""
        from gembench.harness.train.workloads import identity

        ident = identity(workload)
        return cls(workload, ident.name, ident.hash, "workload" if ident.kind == "workload" else "config")

    def at_batch(self, global_batch: int | None) -> Subject:
        """The same model at another global batch (None: this one). Every cached figure is per
        example or per parameter, so the copy shares them instead of deriving them again."""
        if not global_batch or global_batch == self.global_batch:
            return self
        other = copy.copy(self)
        other.workload = copy.copy(self.workload)
        other.workload.global_batch = other.global_batch = global_batch
        return other

    @functools.cached_property
    def tables(self) -> list:
        return list(self.workload.tables())

    @functools.cached_property
    def sequences(self) -> set[str]:
        """Names of the unpooled tables (EmbeddingConfig): their rows go back to the examples whole."""
        from torchrec import EmbeddingBagConfig

        return {t.name for t in self.tables if not isinstance(t, EmbeddingBagConfig)}

    @functools.cached_property
    def ids(self) -> dict[str, float]:
        """Mean IDs one example looks up per table: pooling(), else one per feature."""
        given = self.workload.pooling()
        return {t.name: float(given.get(t.name, len(t.feature_names))) for t in self.tables}

    @functools.cached_property
    def skew(self) -> dict[str, float]:
        """Each table's Zipf exponent, hottest rows first; a table not named has uniform IDs."""
        return {k: float(v) for k, v in self.workload.row_skew().items()}

    @functools.cached_property
    def _meta(self) -> torch.nn.Module:
        return self.workload.build(torch.device("meta"))

    @functools.cached_property
    def counts(self) -> dict[str, int]:
        """Embedding and dense parameters (the meta build) and the largest FSDP unit's."""
        from gembench.harness.train.memory import parameter_shapes

        return parameter_shapes(self.workload, self._meta)

    @functools.cached_property
    def _flops(self) -> tuple[dict[str, float], str]:
        from gembench.harness.train.work import flops_per_example

        return flops_per_example(self.workload, _world_for(self.global_batch, FLOPS_SAMPLE))

    @property
    def flops(self) -> dict[str, float]:
        """Forward FLOPs of one example, per block."""
        return self._flops[0]

    @property
    def flops_basis(self) -> str:
        """ "formula" (the workload's own) or "counted" (FlopCounterMode on one batch)."""
        return self._flops[1]

    def side(self, batch: int, stack, shards: int) -> dict[str, float]:
        """HBM of one GPU beside its embedding shards, at ``batch`` examples per rank: the dense
        weights, gradients and optimizer state (over ``shards`` under FSDP), and the activations
        saved for the backward with the largest transient (0 where the workload gives no estimate)."""
        from gembench.harness.train.memory import memory_estimate

        m = memory_estimate(self.workload.for_stack(stack), self.counts, batch, stack, "cuda", dense_shards=shards)
        return {"dense": m["dense"], "activations": m["activations"] + m["transient"]}

    @property
    def activations_estimated(self) -> bool:
        from gembench.harness.train.memory import activations_estimated

        return activations_estimated(self.workload)

    def document(self) -> dict:
        """The projection's ``config`` section: what was projected, and on which terms."""
        out = {"name": self.name, "hash": self.hash, "global_batch": self.global_batch, "source": self.source}
        if self.source == "workload":
            w = self.workload
            out |= {"import_path": getattr(w, "spec", w.name), "flops_basis": self.flops_basis}
        out["activations_estimated"] = self.activations_estimated
        return out


def _world_for(global_batch: int, examples: int) -> int:
    """The fewest ranks that give one rank at most ``examples`` of ``global_batch`` (a divisor)."""
    for world in range(1, global_batch + 1):
        if global_batch % world == 0 and global_batch // world <= examples:
            return world
    return global_batch


def subject_of_result(result: dict, path: str, as_run: bool = False) -> Subject:
    """The model a result measured: its config (``as_run``: as sized for the device it ran on, a
    CPU's capped tables) or its workload, made again from the recorded import path and arguments
    at the run's global batch and checked against the result's hash."""
    measured = result["config"]
    batch = result["run"].get("global_batch") or measured.get("global_batch")
    if measured.get("kind") != "workload":
        from gembench.harness.train.workloads import workload_of

        workload = workload_of(measured["name"], batch=batch)
        return Subject.of(workload.on_device(result["run"].get("device", "cpu")) if as_run else workload)
    from gembench.loader import load_workload

    recorded = result.get("workload") or {}
    workload = load_workload(recorded.get("import_path", measured.get("source", "")), recorded.get("args") or {})
    return workload_as_measured(workload, result, path)


def workload_as_measured(workload: Workload, result: dict, path: str) -> Subject:
    """``workload`` at the global batch ``result`` ran, refused in one line if it is not the model
    the result measured (its hash: tables, parameter shapes, batch spec)."""
    from gembench.errors import UsageError

    measured = result["config"]
    workload = copy.copy(workload)
    workload.global_batch = result["run"].get("global_batch") or measured["global_batch"]
    m = Subject.of(workload)
    if measured.get("kind") != "workload" or measured.get("hash") != m.hash:
        raise UsageError(
            f"--from {path} measured {measured['name']!r} ({measured.get('kind', 'config')} {measured.get('hash')}), "
            f"not --model {m.workload.spec} ({m.hash}): give a result of this model, or leave out --model"
        )
    return m
