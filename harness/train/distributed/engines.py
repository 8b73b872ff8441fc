"""The two step engines of one rank: the staged step and TorchRec's pipelined step.

staged (default): every stage runs to completion before the next, so each is timed on its own:
    data              host batch -> device
    input_dist        KJT all-to-alls: IDs to the ranks that own their shards (every module)
    embedding_lookup  the sharded lookups on this rank's shards (TorchRec's ``compute``)
    output_dist       embeddings back to the ranks that own the examples (all-to-all or
                      reduce-scatter, waited for)
    dense_forward     the rest of the workload's forward, and its loss
    backward          autograd: dense backward, embedding-gradient all-to-alls, fused update,
                      and the data_parallel tables' gradient all-reduce (TorchRec's own DDP)
    grad_sync         one all-reduce of the other flattened dense gradients, waited
    optimizer         the dense optimizer step
    replica_sync      under 2D sparse parallelism (sparse2d.py): a shard's replicas averaged across
                      the groups, every replica_sync_every steps (the pipelined step ends with it too)
  Nothing overlaps, so comm is fully exposed: the naive reference. The sharded modules' three
  phases are run here, each on the batch field that feeds the module whole (a KJT field holding
  exactly its features), and the workload's forward then reads their outputs. A model whose
  modules are not each fed one field whole runs its forward in one piece instead (WHOLE_STAGES):
  sparse_forward is then the time inside its sparse modules (dists and lookups, the output
  waited for), timed as on one process.

pipeline (``--pipeline``): TorchRec's TrainPipelineSparseDist over DMP with DDP. It overlaps the
input_dist of batch i+1 with the forward/backward of batch i, and DDP overlaps the dense-gradient
all-reduce with the backward. Its phases are timed as TorchRec runs them: data (batch i+2
enqueued, batch i waited for), input_dist (start + wait of batch i+1's dist), forward
(lookup + output_dist + dense forward of batch i), backward (incl. DDP's all-reduce and the
embedding-gradient all-to-alls), optimizer.

The dense optimizer is the stack's (harness/train/stack.py), as on one process.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from gembench.harness.train import nvtx
from gembench.harness.train.distributed import sparse2d
from gembench.harness.train.distributed.plan import data_parallel_tables, dense_parameters
from gembench.harness.train.stack import StackOptions, autocast_for, dense_optimizer
from gembench.harness.train.step import StageClock, losses
from gembench.harness.train.workloads import SparseTimer

STAGES = (
    "data",
    "input_dist",
    "embedding_lookup",
    "output_dist",
    "dense_forward",
    "backward",
    "grad_sync",
    "optimizer",
)
WHOLE_STAGES = ("data", "sparse_forward", "dense_forward", "backward", "grad_sync", "optimizer")
PIPELINE_STAGES = ("data", "input_dist", "forward", "backward", "optimizer")


def span(stage: str):
    """A named range in profiler traces, so each collective can be told by its stage."""
    return torch.autograd.profiler.record_function(f"gembench/{stage}")


@contextmanager
def replaying(outputs: dict[nn.Module, tuple[object, object]]):
    """Make each sharded module return its already computed output when the model calls it on the
    input it was computed from (``outputs``: module -> (input, output)).

    The staged step runs input_dist / compute / output_dist itself to time them; the model's own
    forward then assembles their outputs exactly as in an ordinary forward.
    """

    def replay(module, fed, value):
        def forward(*args, **kwargs):
            given = args[0] if args else next(iter(kwargs.values()), None)
            if given is not fed:
                raise RuntimeError(
                    f"the staged step looked up {type(module).__name__}'s IDs on the batch field whose KJT holds "
                    "exactly its features, and the model called it on another input: call the module on that "
                    "batch field itself"
                )
            return value

        return forward

    for module, (fed, value) in outputs.items():
        module.forward = replay(module, fed, value)
    try:
        yield
    finally:
        for module in outputs:
            del module.forward


class StagedStep:
    """One training step, stage by stage, on one rank of a DMP model of ``workload``, as measure.py's
    engine: a stage clock per step, and at every stage boundary the ``world`` told where this rank is
    (and ``fault``, an injected one, fired). ``feeds``: (batch field, sharded module) for every
    sharded module (workloads.module_fields), or None: the forward runs whole, its sparse share timed
    by the sparse timer (``stages`` says which)."""

    def __init__(self, dmp: nn.Module, device, world, options: StackOptions, workload, feeds, batches=(), fault=None):
        self.dmp, self.model, self.device, self.world = dmp, dmp.module, device, world
        self.workload, self.feeds, self.batches, self.fault = workload, feeds, batches, fault
        self.autocast = autocast_for(options, device)
        # 2D sparse parallelism: the replicas averaged after the step, a stage of its own
        self.replicas = sparse2d.ReplicaSync(dmp, options) if sparse2d.is_2d(dmp) else None
        self.stages = (STAGES if feeds is not None else WHOLE_STAGES) + ((sparse2d.STAGE,) if self.replicas else ())
        self.timer = SparseTimer(self.model, device, workload) if feeds is None else None
        self.dense = dense_parameters(dmp)
        self.optimizer = dense_optimizer(self.dense, options)
        self.optimizers = [self.optimizer]
        # FSDP2's parameters (DTensors) are reduce-scattered in the backward itself, and so are the
        # data_parallel tables' (by TorchRec's own DDP): the rest are the grad_sync stage's
        synced = data_parallel_tables(dmp)
        self.replicated = [p for p in self.dense if not isinstance(p, DTensor) and id(p) not in synced]

    def parameters(self):
        return self.dmp.parameters()

    def step(self, i: int) -> tuple[torch.Tensor, dict[str, float]]:
        stages, world = self.stages, self.world
        clock = StageClock(self.device, stages)

        def mark(stage):
            clock.mark(stage)
            following = stages[stages.index(stage) + 1] if stage != stages[-1] else "step end"
            world.at(following, i)
            if self.fault:
                self.fault.trigger(world.rank, i, following)

        world.at("data", i)
        with self.autocast():
            clock.mark("start")
            per_task = self(self.batches[i % len(self.batches)], mark, clock.split)
            if self.replicas is not None:
                self.replicas(i)
                mark(sparse2d.STAGE)
        return per_task, clock.durations()

    def __call__(self, batch, mark, split=None) -> torch.Tensor:
        """``mark(stage)`` is called at the end of every stage; ``split``: the stage clock's, for the
        whole forward's sparse share. Returns the detached per-task losses."""
        batch = batch.to(self.device, non_blocking=True)
        mark("data")
        if self.feeds is None:
            self.timer.take()
            output = self.workload.forward(self.model, batch)
            loss, per_task = losses(self.workload, output, batch)
            mark("sparse_forward")
            mark("dense_forward")
            if split is not None:
                split("sparse_forward", "dense_forward", self.timer.take)
        else:
            fed = [getattr(batch, field) for field, _ in self.feeds]
            contexts, dist_inputs = [], []
            with span("input_dist"):
                for (_, module), kjt in zip(self.feeds, fed):
                    ctx = module.create_context()
                    contexts.append(ctx)
                    dist_inputs.append(module.input_dist(ctx, kjt).wait().wait())
            mark("input_dist")
            with span("embedding_lookup"):
                looked_up = [m.compute(ctx, x) for (_, m), ctx, x in zip(self.feeds, contexts, dist_inputs)]
            mark("embedding_lookup")
            with span("output_dist"):
                outputs = {
                    m: (kjt, m.output_dist(ctx, y).wait())
                    for (_, m), kjt, ctx, y in zip(self.feeds, fed, contexts, looked_up)
                }
            mark("output_dist")
            with replaying(outputs):
                output = self.workload.forward(self.model, batch)
            loss, per_task = losses(self.workload, output, batch)
            mark("dense_forward")
        loss.backward()
        mark("backward")
        self.sync_gradients()
        mark("grad_sync")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        mark("optimizer")
        return per_task.detach()

    def sync_gradients(self) -> None:
        """Average dense gradients over ranks: one all-reduce of one flat buffer (as DDP's
        buckets, without its overlap)."""
        if not self.replicated:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.replicated]
        flat = torch.cat([g.reshape(-1) for g in grads])
        with span("grad_sync"):
            dist.all_reduce(flat)
        flat /= self.world.size
        offset = 0
        for p, g in zip(self.replicated, grads):
            n = g.numel()
            p.grad = flat[offset : offset + n].view_as(g)
            offset += n


class Slot(nn.Module):
    """Stands in for an embedding module inside the model: returns what the pipeline computed."""

    def __init__(self):
        super().__init__()
        self.value = None

    def forward(self, *args, **kwargs):
        return self.value


class DenseHead(nn.Module):
    """Everything but the embedding modules: ``head(model, batch)`` (the workload's forward and
    loss) over Slots that stand in for them.

    It holds the model's dense submodules as its children (so DDP and the optimizer see them) and
    the model itself unregistered, so TorchRec's tracer treats this whole module as one leaf.
    """

    def __init__(self, model: nn.Module, slots: list[Slot], head):
        super().__init__()
        self.parts = nn.ModuleList([m for m in model.children()])
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_slots", slots)
        object.__setattr__(self, "_head", head)

    def forward(self, batch, *embedded):
        for slot, value in zip(self._slots, embedded):
            slot.value = value
        loss, per_task = self._head(self._model, batch)
        for slot in self._slots:
            slot.value = None
        return loss, per_task.detach()  # progress() hands back the second: the losses, for the record


class TrainModule(nn.Module):
    """What TrainPipelineSparseDist drives: forward(batch) -> (loss, detached per-task losses).

    The pipeline finds sharded modules by FX-tracing the model's forward and needs each one called
    directly on a field of the batch; a model's own forward need not be traceable (GEM's is
    jagged and data-dependent), so the embedding modules are lifted out here and the rest runs as
    one untraced leaf. ``fields``: {module path: the batch field that feeds it} (the rank's
    module_fields); ``head(model, batch)`` -> (loss, per-task losses): the workload's forward and
    loss.
    """

    def __init__(self, model: nn.Module, fields: dict[str, str], head):
        super().__init__()
        self.fields, slots = [], []
        for i, (path, field) in enumerate(fields.items()):
            name = f"embedding_{i}"
            self.add_module(name, model.get_submodule(path))
            self.fields.append((name, field))
            parent_path, _, leaf = path.rpartition(".")
            parent = model.get_submodule(parent_path) if parent_path else model
            slot = Slot()
            setattr(parent, leaf, slot)  # the model now reads this module's output from the slot
            slots.append(slot)
        self.head = DenseHead(model, slots, head)

    def forward(self, batch):
        embedded = [getattr(self, name)(getattr(batch, field)) for name, field in self.fields]
        return self.head(batch, *embedded)


class PipelineStep:
    """TorchRec's TrainPipelineSparseDist as measure.py's engine, its phases timed by wrapping the
    pipeline's methods; it reads its own ``feed`` (an iterator of batches)."""

    PHASES = {
        "_wait_for_batch": "data",
        "enqueue_batch": "data",
        "start_sparse_data_dist": "input_dist",
        "wait_sparse_data_dist": "input_dist",
        "_model_fwd": "forward",
        "_backward": "backward",
        "_optimizer_step": "optimizer",
    }

    def __init__(self, dmp: nn.Module, device, world, options: StackOptions, feed, fault=None):
        from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
        from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
        from torchrec.optim.optimizers import in_backward_optimizer_filter

        self.dmp, self.world, self.feed, self.fault = dmp, world, feed, fault
        self.autocast = autocast_for(options, device)
        dense = KeyedOptimizerWrapper(
            dict(in_backward_optimizer_filter(dmp.named_parameters())), lambda params: dense_optimizer(params, options)
        )
        self.optimizer = CombinedOptimizer([dmp.fused_optimizer, dense])
        self.optimizers = [self.optimizer]
        self.pipeline = TrainPipelineSparseDist(dmp, self.optimizer, device, execute_all_batches=True)
        self.device = device
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.replicas = sparse2d.ReplicaSync(dmp, options) if sparse2d.is_2d(dmp) else None
        self.stages = PIPELINE_STAGES + ((sparse2d.STAGE,) if self.replicas else ())
        self.times: dict[str, float] = {}
        for method, phase in self.PHASES.items():
            setattr(self.pipeline, method, self._timed(getattr(self.pipeline, method), phase))

    def _timed(self, fn, phase):
        def wrapper(*args, **kwargs):
            self.sync()
            start = time.perf_counter()
            try:
                with nvtx.span(phase):
                    return fn(*args, **kwargs)
            finally:
                self.sync()
                self.times[phase] = self.times.get(phase, 0.0) + time.perf_counter() - start

        return wrapper

    def parameters(self):
        return self.dmp.parameters()

    def step(self, i: int) -> tuple[torch.Tensor, dict[str, float]]:
        """One ``progress`` over the feed (the pipeline holds batches in flight across steps): the
        loss and its phase times."""
        self.world.at("forward", i)
        if self.fault:
            self.fault.trigger(self.world.rank, i, "forward")
        self.times = {p: 0.0 for p in self.stages}
        with self.autocast(), nvtx.span("step"):
            loss = self.pipeline.progress(self.feed)
            if self.replicas is not None:
                self._timed(self.replicas, sparse2d.STAGE)(i)
        return loss, dict(self.times)
