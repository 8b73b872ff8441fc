"""Sharded training on one rank: process group, TorchRec plan, DMP, and the staged step.

The sparse arch is sharded by TorchRec's DistributedModelParallel with a plan from TorchRec's
EmbeddingShardingPlanner over a Topology of this job (world size, ranks per host, device kind);
``--sharding`` forces a sharding type for all tables or per table through ParameterConstraints.
Embedding tables train with TorchRec's fused row-wise Adagrad (applied inside the backward);
the dense arch is replicated (data parallel) and trains with Adam.

Two step engines:

staged (default): every stage runs to completion before the next, so each is timed on its own:
    data              host batch -> device
    input_dist        KJT all-to-alls: IDs to the ranks that own their shards (both modules)
    embedding_lookup  the sharded lookups on this rank's shards (TorchRec's ``compute``)
    output_dist       embeddings back to the ranks that own the examples (all-to-all or
                      reduce-scatter, waited for)
    dense_forward     the dense arch forward and the loss
    backward          autograd: dense backward, embedding-gradient all-to-alls, fused update
    grad_sync         one all-reduce of the flattened dense gradients (data parallel), waited
    optimizer         the dense optimizer step
  Nothing overlaps, so comm is fully exposed: the naive reference.

pipeline (``--pipeline``): TorchRec's TrainPipelineSparseDist over DMP with DDP. It overlaps the
input_dist of batch i+1 with the forward/backward of batch i, and DDP overlaps the dense-gradient
all-reduce with the backward. Its phases are timed as TorchRec runs them: data (batch i+2
enqueued, batch i waited for), input_dist (start + wait of batch i+1's dist), forward
(lookup + output_dist + dense forward of batch i), backward (incl. DDP's all-reduce and the
embedding-gradient all-to-alls), optimizer.
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import time
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

from gembench.harness.stack import ADAGRAD_EPS, EMBEDDING_LR, StackOptions, dense_optimizer
from gembench.models.heads import multitask_loss
from gembench.usage import UsageError

SHARDING_TYPES = ("table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel")
STAGES = ("data", "input_dist", "embedding_lookup", "output_dist", "dense_forward", "backward",
          "grad_sync", "optimizer")
PIPELINE_STAGES = ("data", "input_dist", "forward", "backward", "optimizer")


# -- process group -------------------------------------------------------------------------

def torchrun_env() -> dict | None:
    """Rank, world and local sizes from torchrun's environment; None outside torchrun."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    return {
        "rank": int(os.environ["RANK"]), "world_size": int(os.environ["WORLD_SIZE"]),
        "local_rank": int(os.environ.get("LOCAL_RANK", 0)),
        "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"])),
    }


def backend_for(device: torch.device) -> str:
    """gloo on CPU, nccl on CUDA; a build without it is a usage error, found before launching."""
    if not dist.is_available():
        raise UsageError("this torch build has no torch.distributed: install a build with it to use --nproc")
    if device.type == "cuda":
        if not dist.is_nccl_available():
            raise UsageError("--device cuda needs the nccl backend, which this torch build lacks")
        return "nccl"
    if not dist.is_gloo_available():
        raise UsageError("--device cpu needs the gloo backend, which this torch build lacks")
    return "gloo"


def init_process_group(device: torch.device, timeout_s: float) -> str:
    backend = backend_for(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # Slightly longer than the watchdog's timeout: the watchdog names the rank at fault first,
    # the process-group timeout is only the backstop for a rank whose watchdog cannot run.
    dist.init_process_group(backend, timeout=dt.timedelta(seconds=timeout_s + 30))
    return backend


def rank_device(device: str, local_rank: int) -> torch.device:
    if device.startswith("cuda"):
        return torch.device("cuda", local_rank)
    return torch.device(device)


# -- sharding ------------------------------------------------------------------------------

def table_names(model: nn.Module) -> list[str]:
    """Names of every embedding table (EmbeddingBagCollection and EmbeddingCollection)."""
    from torchrec import EmbeddingBagCollection, EmbeddingCollection

    names = []
    for m in model.modules():
        if isinstance(m, EmbeddingBagCollection):
            names += [t.name for t in m.embedding_bag_configs()]
        elif isinstance(m, EmbeddingCollection):
            names += [t.name for t in m.embedding_configs()]
    return names


def parse_sharding(spec: str | None, tables: list[str]) -> dict[str, str]:
    """``--sharding`` -> {table: sharding type} for the tables it forces (empty: planner's choice).

    ``row_wise`` forces every table; ``t0=row_wise,default=table_wise`` forces table t0 (a table
    is named as its feature, e.g. t0 or clicks, or in full, table_t0) and every other table.
    """
    if not spec or spec == "auto":
        return {}
    short = {t.removeprefix("table_"): t for t in tables}
    forced: dict[str, str] = {}
    default = None
    for item in spec.split(","):
        name, _, kind = item.strip().rpartition("=")
        if kind not in SHARDING_TYPES:
            raise UsageError(f"--sharding: {kind!r} is not a sharding type; pick one of "
                             f"{', '.join(SHARDING_TYPES)} (or auto)")
        if not name or name == "default":
            default = kind
            continue
        table = short.get(name, name if name in tables else None)
        if table is None:
            raise UsageError(f"--sharding: no table {name!r} in this config; tables are "
                             f"{', '.join(sorted(short))}")
        forced[table] = kind
    if default:
        forced = {t: forced.get(t, default) for t in tables}
    return forced


def sharders():
    """TorchRec's sharders, with row-wise pooled sharding allowed on CPU.

    TorchRec lists row_wise / table_row_wise for EmbeddingBagCollection on CUDA only, but the
    CPU kernels and gloo's reduce-scatter run them; without this a CPU job could not measure
    how row-wise sharding levels a hot table.
    """
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    class PooledSharder(EmbeddingBagCollectionSharder):
        def sharding_types(self, compute_device_type: str) -> list[str]:
            types = super().sharding_types(compute_device_type)
            extra = [t for t in ("row_wise", "table_row_wise") if t not in types]
            return types + extra if compute_device_type == "cpu" else types

    # the single-process stack's learning rate and eps (harness/stack.py); TorchRec's sharded
    # kernels offer row-wise Adagrad, not the exact per-element one
    fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": EMBEDDING_LR, "eps": ADAGRAD_EPS}
    return [PooledSharder(fused_params=fused), EmbeddingCollectionSharder(fused_params=fused)]


class PlanRecorder:
    """A planner Stats hook: keeps the planner's per-rank estimates of the plan it chose.

    perf (ms per step: forward + backward compute and comms of the shards on a rank, TorchRec's
    cost model) and storage (bytes) per rank, and the placement of each table's shards.
    """

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.perf = [0.0] * world_size
        self.storage = [0.0] * world_size
        self.tables: dict[str, dict] = {}

    def log(self, sharding_plan, topology, batch_size, storage_reservation, num_proposals, num_plans,
            run_time, best_plan, *args, **kwargs) -> None:
        for option in best_plan:
            ranks = []
            for shard in option.shards:
                if shard.rank is None:
                    continue
                ranks.append(shard.rank)
                if shard.perf is not None:
                    self.perf[shard.rank] += float(shard.perf.total)
                if shard.storage is not None:
                    self.storage[shard.rank] += float(shard.storage.hbm + shard.storage.ddr)
            self.tables[option.name] = {
                "sharding": option.sharding_type, "kernel": option.compute_kernel,
                "ranks": ranks, "shard_sizes": [list(s.size) for s in option.shards],
                "shard_offsets": [list(s.offset) for s in option.shards],
            }


def plan_sharding(model: nn.Module, forced: dict[str, str], env: dict, device: torch.device,
                  batch_size: int):
    """TorchRec's plan for ``model`` on this job, honouring ``forced``; and the planner's view."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology

    topology = Topology(world_size=env["world_size"], local_world_size=env["local_world_size"],
                        compute_device=device.type)
    constraints = {t: ParameterConstraints(sharding_types=[kind]) for t, kind in forced.items()}
    recorder = PlanRecorder(env["world_size"])
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=batch_size,
                                       constraints=constraints, stats=[recorder])
    try:
        plan = planner.collective_plan(model, sharders(), dist.GroupMember.WORLD)
    except Exception as err:  # noqa: BLE001  the planner's own message names the table
        text = str(err).splitlines()[0]
        raise UsageError(f"TorchRec's planner found no plan for --sharding: {text}") from None
    return plan, recorder


def shard(model: nn.Module, plan, device: torch.device, pipeline: bool) -> nn.Module:
    """DMP over the model. Staged runs sync dense gradients themselves (a stage of their own);
    the pipeline lets DMP wrap the dense part in DDP, which overlaps that sync with backward."""
    from torchrec.distributed.model_parallel import DataParallelWrapper, DistributedModelParallel

    class NoWrap(DataParallelWrapper):
        def wrap(self, dmp, env, device) -> None:  # dense params stay plain: grad_sync stage syncs them
            pass

    kwargs = {} if pipeline else {"data_parallel_wrapper": NoWrap()}
    return DistributedModelParallel(model, device=device, plan=plan, sharders=sharders(), **kwargs)


def dense_parameters(dmp: nn.Module) -> list[torch.Tensor]:
    """Replicated parameters: all but the sharded tables, whose fused optimizer runs in backward."""
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    return [p for _, p in in_backward_optimizer_filter(dmp.named_parameters())]


def sharded_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(batch field, sharded module) pairs: pooled tables read batch.sparse, sequences batch.seq."""
    from torchrec.distributed.embedding import ShardedEmbeddingCollection
    from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection

    out = []
    for m in model.modules():
        if isinstance(m, ShardedEmbeddingBagCollection):
            out.append(("sparse", m))
        elif isinstance(m, ShardedEmbeddingCollection):
            out.append(("seq", m))
    return out


# -- the staged step -----------------------------------------------------------------------

def span(stage: str):
    """A named range in profiler traces, so each collective can be told by its stage."""
    return torch.autograd.profiler.record_function(f"gembench/{stage}")


@contextmanager
def replaying(outputs: dict[nn.Module, object]):
    """Make each sharded module return its already computed output when the model calls it.

    The staged step runs input_dist / compute / output_dist itself to time them; the model's own
    forward then assembles their outputs exactly as in an ordinary forward.
    """
    for module, value in outputs.items():
        module.forward = lambda *args, _value=value, **kwargs: _value
    try:
        yield
    finally:
        for module in outputs:
            del module.forward


class StagedStep:
    """One training step, stage by stage, on one rank of a DMP model."""

    def __init__(self, dmp: nn.Module, device: torch.device, world_size: int, options: StackOptions):
        self.dmp, self.model, self.device, self.world_size = dmp, dmp.module, device, world_size
        self.modules = sharded_modules(self.model)
        self.dense = dense_parameters(dmp)
        self.optimizer = dense_optimizer(self.dense, options)

    def __call__(self, batch, mark) -> torch.Tensor:
        """``mark(stage)`` is called at the end of every stage."""
        batch = batch.to(self.device, non_blocking=True)
        mark("data")
        contexts, dist_inputs = [], []
        with span("input_dist"):
            for field, module in self.modules:
                ctx = module.create_context()
                contexts.append(ctx)
                dist_inputs.append(module.input_dist(ctx, getattr(batch, field)).wait().wait())
        mark("input_dist")
        with span("embedding_lookup"):
            looked_up = [m.compute(ctx, x) for (_, m), ctx, x in zip(self.modules, contexts, dist_inputs)]
        mark("embedding_lookup")
        with span("output_dist"):
            outputs = {m: m.output_dist(ctx, y).wait() for (_, m), ctx, y in zip(self.modules, contexts, looked_up)}
        mark("output_dist")
        with replaying(outputs):
            logits = self.model.dense(batch, self.model.embed(batch))
        loss = multitask_loss(logits, batch.labels)
        mark("dense_forward")
        loss.backward()
        mark("backward")
        self.sync_gradients()
        mark("grad_sync")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        mark("optimizer")
        return loss.detach()

    def sync_gradients(self) -> None:
        """Average dense gradients over ranks: one all-reduce of one flat buffer (as DDP's
        buckets, without its overlap)."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.dense]
        flat = torch.cat([g.reshape(-1) for g in grads])
        with span("grad_sync"):
            dist.all_reduce(flat)
        flat /= self.world_size
        offset = 0
        for p, g in zip(self.dense, grads):
            n = g.numel()
            p.grad = flat[offset:offset + n].view_as(g)
            offset += n


# -- the pipelined step --------------------------------------------------------------------

class Slot(nn.Module):
    """Stands in for an embedding module inside the model: returns what the pipeline computed."""

    def __init__(self):
        super().__init__()
        self.value = None

    def forward(self, *args, **kwargs):
        return self.value


class DenseHead(nn.Module):
    """Everything but the embedding modules: the model's own embed/dense halves over Slots.

    It holds the model's dense submodules as its children (so DDP and the optimizer see them) and
    the model itself unregistered, so TorchRec's tracer treats this whole module as one leaf.
    """

    def __init__(self, model: nn.Module, slots: list[Slot]):
        super().__init__()
        self.parts = nn.ModuleList([m for m in model.children()])
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_slots", slots)

    def forward(self, batch, *embedded):
        for slot, value in zip(self._slots, embedded):
            slot.value = value
        logits = self._model.dense(batch, self._model.embed(batch))
        for slot in self._slots:
            slot.value = None
        loss = multitask_loss(logits, batch.labels)
        return loss, loss.detach()  # progress() hands back the second: the loss, for the record


class TrainModule(nn.Module):
    """What TrainPipelineSparseDist drives: forward(batch) -> (loss, detached loss).

    The pipeline finds sharded modules by FX-tracing the model's forward and needs each one called
    directly on a field of the batch; GEM's own forward is not traceable (jagged, data-dependent),
    so the embedding modules are lifted out here and the rest runs as one untraced leaf.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        from torchrec import EmbeddingBagCollection, EmbeddingCollection

        found = [(path, m) for path, m in model.named_modules()
                 if isinstance(m, (EmbeddingBagCollection, EmbeddingCollection))]
        self.fields, slots = [], []
        for i, (path, module) in enumerate(found):
            name = f"embedding_{i}"
            self.add_module(name, module)
            self.fields.append((name, "sparse" if isinstance(module, EmbeddingBagCollection) else "seq"))
            parent_path, _, leaf = path.rpartition(".")
            parent = model.get_submodule(parent_path) if parent_path else model
            slot = Slot()
            setattr(parent, leaf, slot)  # the model now reads this module's output from the slot
            slots.append(slot)
        self.head = DenseHead(model, slots)

    def forward(self, batch):
        embedded = [getattr(self, name)(getattr(batch, field)) for name, field in self.fields]
        return self.head(batch, *embedded)


def pipelineable(batch):
    """The batch as TorchRec's pipeline wants it: an instance of its Pipelineable interface
    (which models/data.py's Batch satisfies in behaviour but not by inheritance)."""
    return _pipeline_batch_class()(batch)


@functools.cache
def _pipeline_batch_class():
    """Made once (on first use, as TorchRec's streamable module is imported): a class made per
    batch would fail torch.compile's type guard on every step and recompile the dense arch."""
    from torchrec.streamable import Pipelineable

    class PipelineBatch(Pipelineable):
        def __init__(self, b):
            self.batch = b
            self.dense, self.sparse, self.seq, self.labels = b.dense, b.sparse, b.seq, b.labels

        def to(self, device, non_blocking=False):
            return PipelineBatch(self.batch.to(device, non_blocking=non_blocking))

        def record_stream(self, stream):
            self.batch.record_stream(stream)

        def pin_memory(self):
            return PipelineBatch(self.batch.pin_memory())

    return PipelineBatch


class PipelineStep:
    """TorchRec's TrainPipelineSparseDist, its phases timed by wrapping the pipeline's methods."""

    PHASES = {"_wait_for_batch": "data", "enqueue_batch": "data",
              "start_sparse_data_dist": "input_dist", "wait_sparse_data_dist": "input_dist",
              "_model_fwd": "forward", "_backward": "backward", "_optimizer_step": "optimizer"}

    def __init__(self, dmp: nn.Module, device: torch.device, options: StackOptions):
        from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
        from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
        from torchrec.optim.optimizers import in_backward_optimizer_filter

        dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                                      lambda params: dense_optimizer(params, options))
        self.optimizer = CombinedOptimizer([dmp.fused_optimizer, dense])
        self.pipeline = TrainPipelineSparseDist(dmp, self.optimizer, device, execute_all_batches=True)
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.times: dict[str, float] = {}
        for method, phase in self.PHASES.items():
            setattr(self.pipeline, method, self._timed(getattr(self.pipeline, method), phase))

    def _timed(self, fn, phase):
        def wrapper(*args, **kwargs):
            self.sync()
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.sync()
                self.times[phase] = self.times.get(phase, 0.0) + time.perf_counter() - start
        return wrapper

    def __call__(self, batches) -> tuple[torch.Tensor, dict[str, float]]:
        """One ``progress`` over the iterator ``batches``; the loss and its phase times."""
        self.times = {p: 0.0 for p in PIPELINE_STAGES}
        loss = self.pipeline.progress(batches)
        return loss, dict(self.times)


# -- measured embedding load ---------------------------------------------------------------

def local_dims(module: nn.Module) -> list[dict[str, int]]:
    """Per sharding of a sharded module: feature -> width of this rank's shard of its table."""
    out = []
    shardings = getattr(module, "_embedding_shardings", None)
    if shardings is None:  # EmbeddingCollection keeps them by type, in input-dist order
        shardings = list(module._sharding_type_to_sharding.values())
    for sharding in shardings:
        groups = getattr(sharding, "_grouped_embedding_configs", None)
        if groups is None:  # table-row-wise keeps them per node
            per_node = getattr(sharding, "_grouped_embedding_configs_per_node", [])
            groups = [g for node in per_node for g in node]
        dims = {}
        for group in groups:
            for table in group.embedding_tables:
                for f in table.feature_names:
                    dims[f] = table.local_cols
        out.append(dims)
    return out


def lookup_load(modules: list[tuple[str, nn.Module]], dist_inputs: list) -> dict[str, float]:
    """IDs this rank looked up, unique IDs, and bytes read, from the KJTs its shards received."""
    ids = unique = read = 0
    for (_, module), kjts in zip(modules, dist_inputs):
        for dims, kjt in zip(local_dims(module), kjts):
            itemsize = 4  # fp32 tables
            values, lengths = kjt.values(), kjt.lengths()
            per_key = torch.split(values, [int(x) for x in kjt.length_per_key()]) if len(kjt.keys()) else []
            for key, v in zip(kjt.keys(), per_key):
                ids += v.numel()
                unique += int(torch.unique(v).numel())
                read += v.numel() * dims.get(key, 0) * itemsize
            del lengths
    return {"ids": float(ids), "unique_ids": float(unique), "bytes_read": float(read)}


def measure_loads(dmp: nn.Module, batches, device: torch.device) -> dict[str, float]:
    """Mean per-step lookup load of this rank over ``batches``: each batch's real input dist,
    counted on what arrives (run outside the timed steps, so counting costs no step time)."""
    modules = sharded_modules(dmp.module)
    total: dict[str, float] = {}
    with torch.no_grad():
        for b in batches:
            b = b.to(device)
            inputs = []
            for field, module in modules:
                ctx = module.create_context()
                inputs.append(module.input_dist(ctx, getattr(b, field)).wait().wait())
            for k, v in lookup_load(modules, inputs).items():
                total[k] = total.get(k, 0.0) + v
    return {k: v / len(batches) for k, v in total.items()}
