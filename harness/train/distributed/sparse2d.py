"""2D sparse parallelism: tables sharded within groups of G ranks, replicated across the W/G groups.

GEM's way of keeping the embedding all-to-alls small at thousands of GPUs, as TorchRec ships it
(DMPCollection): every group gets the same plan, made by the planner for a world of G ranks, and
its ranks exchange IDs and embeddings among themselves only; the dense part stays data parallel
over all W ranks. Each shard has one replica in every group, and the replicas drift apart as each
group trains on its own examples: ``sync()`` averages their weights and row-wise Adagrad state
over the replica group (TorchRec's DEFAULT strategy), here every ``replica_sync_every`` steps as
a stage of its own (replica_sync), so its bytes and time are measured like any collective's.

Averaging is not 1-D's arithmetic: under 1-D a row's update is computed from every rank's
gradient, under 2D each group updates its replica from its own, and a row only one group looked
up then moves 1/R as far once the R replicas are averaged (Adagrad's normalized step against R - 1
unmoved copies): embeddings learn slower. ``replica_merge=updates`` merges through TorchRec's
all-reduce hook instead: each replica's change since the last merge is summed onto the state they
shared then, so a row one group looked up moves as under 1-D, and the Adagrad sums add up the
squared gradients every group saw. It holds a copy of the rank's shards (weights and state) to
measure the change from.

TorchRec places a group's ranks W/G apart (g, g + W/G, ...), so that on several hosts the replicas
of a shard sit on one host and their averaging stays off the network.

TorchRec 1.8's constructor asserts a CUDA or MTIA device, but nothing after the assertion needs
one except the placements it writes into the plan ("rank:r/cpu:r", a device index a CPU shard
does not carry): on a CPU the constructor's steps are taken here, in its order, with TorchRec's
own methods, the placements written for the CPU, and the replicas averaged by a sum and a
division (gloo has no AVG). On CUDA, DMPCollection is called as it ships.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from gembench.errors import UsageError
from gembench.harness.train.stack import StackOptions

STAGE = "replica_sync"


def sharding_group(options: StackOptions, world: int, local: int) -> int:
    """G, the ranks a group shards the tables over: the switch's, or by default a host's ranks on
    several hosts and half the ranks on one."""
    if options.sharding_group:
        return options.sharding_group
    return local if world > local else world // 2


def check(options: StackOptions, world: int, local: int) -> None:
    """Refuse a 2D layout that cannot be made on ``world`` ranks, or 2D's numbers without 2D."""
    if options.sparse_parallel != "2d":
        moved = [
            n
            for n in ("sharding_group", "replica_sync_every", "replica_merge")
            if getattr(options, n) != StackOptions.__dataclass_fields__[n].default
        ]
        if moved:
            raise UsageError(f"--set {moved[0]} applies to sparse_parallel=2d: add --set sparse_parallel=2d")
        return
    group = sharding_group(options, world, local)
    if group < 1 or world % group or group == world:
        raise UsageError(
            f"sparse_parallel=2d: sharding_group={group} must divide the {world} ranks into 2 or more groups "
            f"(e.g. --set sharding_group={max(1, world // 2)})"
        )


def layout(options: StackOptions, world: int, local: int) -> dict | None:
    """The 2D layout as a result records it (None under 1-D): G, the groups that shard the tables
    (TorchRec's: a group's ranks W/G apart), the replica groups that average, the sync interval."""
    if options.sparse_parallel != "2d":
        return None
    group = sharding_group(options, world, local)
    apart = world // group
    groups = [[g + apart * k for k in range(group)] for g in range(apart)]
    return {
        "mode": "2d",
        "sharding_group": group,
        "groups": groups,
        "replica_groups": [list(ranks) for ranks in zip(*groups)],
        "replica_sync_every": options.replica_sync_every,
    }


def global_view(per_group_rank: list, sparse: dict | None) -> list:
    """A figure per rank of one group (the plan's ranks) as a figure per rank of the job: each
    rank holds what the rank in its place in every other group holds."""
    if sparse is None:
        return per_group_rank
    place = {r: k for ranks in sparse["groups"] for k, r in enumerate(ranks)}
    return [per_group_rank[place[r]] for r in range(len(place))]


def planning_env(options: StackOptions, env: dict) -> dict:
    """The job as the planner is to see it: a group's ranks under 2D, every rank otherwise."""
    if options.sparse_parallel != "2d":
        return env
    group = sharding_group(options, env["world_size"], env["local_world_size"])
    return env | {"world_size": group, "local_world_size": min(group, env["local_world_size"])}


def collection(module: nn.Module, plan, device: torch.device, group: int, sharders, wrapper=None) -> nn.Module:
    """TorchRec's DMPCollection over ``module``: ``plan`` (made for ``group`` ranks) on every group
    of the default process group; ``wrapper``: DMP's data-parallel wrapper (None: DDP)."""
    from torchrec.distributed.model_parallel import DMPCollection

    world = dist.get_world_size()
    kwargs = {} if wrapper is None else {"data_parallel_wrapper": wrapper}
    if device.type in ("cuda", "mtia"):
        return DMPCollection(
            module, device, plan, world, group, dist.group.WORLD, sharders=sharders, init_data_parallel=True, **kwargs
        )
    return _on_cpu(module, plan, device, world, group, sharders, kwargs)


def _on_cpu(module, plan, device, world, group, sharders, kwargs) -> nn.Module:
    """DMPCollection.__init__'s steps for one context (no submodule configs, no sharded relay)."""
    from torch.distributed.remote_device import _remote_device
    from torchrec.distributed.model_parallel import DistributedModelParallel, DMPCollection
    from torchrec.distributed.types import DMPCollectionContext, EnumerableShardingSpec, ShardingEnv2D

    dmp = DMPCollection.__new__(DMPCollection)
    nn.Module.__init__(dmp)
    dmp._device, dmp._pg, dmp._global_rank = device, dist.group.WORLD, dist.get_rank()
    dmp._sharder_map = {s.module_type: s for s in sharders}
    ctx = DMPCollectionContext(module=None, plan=plan, sharding_group_size=group)
    dmp._default_ctx, dmp._submodule_ctxs, dmp._ctxs = ctx, [], [ctx]
    ctx.device_mesh, ctx.sharding_pg, ctx.replica_pg = dmp._create_process_groups(
        global_rank=dmp._global_rank, world_size=world, local_size=group
    )
    dmp._remap_sharding_plan(plan=plan, rank=dmp._global_rank, step=world // group, sharding_group_size=group)
    for tables in plan.plan.values():
        for spec in tables.values():
            if isinstance(spec.sharding_spec, EnumerableShardingSpec):
                for shard in spec.sharding_spec.shards:
                    shard.placement = _remote_device(f"rank:{shard.placement.rank()}/cpu")
    dmp._custom_all_reduce = None  # gloo's merge: ReplicaSync sets it
    env = ShardingEnv2D(
        global_pg=dmp._pg, sharding_pg=ctx.sharding_pg, replica_pg=ctx.replica_pg, device_mesh=ctx.device_mesh
    )
    # the shards' state as ShardedTensors, as 1-D DMP writes it: what load_unsharded copies into
    env.output_dtensor = False
    DistributedModelParallel.__init__(dmp, module, env, device, plan, sharders, **kwargs)
    dmp._group_sharded_modules(dmp._ctxs)
    dmp._cache_sync_tensors(dmp._ctxs)
    dmp._use_sharded_relay, dmp._sharded_relay_state = False, None
    return dmp


class Average:
    """TorchRec's merge on gloo, which has no AVG: a sum over the replicas, divided by their count."""

    def __init__(self, group, replicas: int):
        self.group, self.replicas = group, replicas

    def __call__(self, tensors: list[torch.Tensor]) -> None:
        dist.all_reduce_coalesced(tensors, group=self.group)
        for t in tensors:
            t.div_(self.replicas)


class SumOfUpdates:
    """Each replica's change since the last merge, summed onto the state the replicas shared then.
    ``base(tensors)`` records that state: call it on the sync's tensors once they hold it."""

    def __init__(self, group, reduce=None):
        self.shared = {}
        self.reduce = reduce or (lambda tensors: dist.all_reduce_coalesced(tensors, group=group))

    def base(self, tensors: list[torch.Tensor]) -> None:
        for t in tensors:
            self.shared[id(t)] = t.detach().clone()

    def __call__(self, tensors: list[torch.Tensor]) -> None:
        shared = [self.shared[id(t)] for t in tensors]
        for t, s in zip(tensors, shared):
            t.sub_(s)
        self.reduce(tensors)  # the replicas' changes, summed
        for t, s in zip(tensors, shared):
            t.add_(s)
            s.copy_(t)


def sync_tensors(dmp: nn.Module) -> list[torch.Tensor]:
    """What a sync merges on this rank: its shards' weights and row-wise Adagrad state."""
    ctx = dmp._default_ctx
    return [t for ts in (*ctx.weights_by_dtype.values(), *ctx.optimizer_tensors_by_dtype.values()) for t in ts]


class ReplicaSync:
    """The replicas' merge after a step: every ``options.replica_sync_every`` steps, else nothing;
    made once the replicas hold the same state (the unsharded weights loaded), which an
    ``updates`` merge takes as its base."""

    def __init__(self, dmp: nn.Module, options: StackOptions):
        self.dmp, self.every = dmp, options.replica_sync_every
        ctx = dmp._default_ctx
        if options.replica_merge == "updates":
            merge = SumOfUpdates(ctx.replica_pg)
            merge.base(sync_tensors(dmp))
            dmp.set_all_reduce_hook(merge)
        elif dmp.device.type == "cpu":  # gloo has no AVG: _on_cpu left the merge to be set here
            dmp.set_all_reduce_hook(Average(ctx.replica_pg, dist.get_world_size(ctx.replica_pg)))

    def __call__(self, step: int) -> None:
        if (step + 1) % self.every == 0:
            with torch.autograd.profiler.record_function(f"gembench/{STAGE}"):
                self.dmp.sync()


def is_2d(dmp: nn.Module) -> bool:
    from torchrec.distributed.model_parallel import DMPCollection

    return isinstance(dmp, DMPCollection)
