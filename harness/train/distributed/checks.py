"""What every rank of a job would refuse, checked before the ranks are launched and again on each.

No device is looked at: the model, its batch split, the switches, the pipeline's fields, the
sharding spec and --rebalance. Each refusal is one line naming the flag or the table.
"""

from __future__ import annotations

import torch

from gembench.errors import UsageError
from gembench.harness.train.distributed import plan, sparse2d
from gembench.harness.train.runconfig import RunConfig
from gembench.harness.train.stack import on_ranks
from gembench.harness.train.workloads import applied_switches, module_fields, workload_of
from gembench.workload import Workload

UNPOOLED_TYPES = ("table_wise", "row_wise", "column_wise")  # what TorchRec shards an EmbeddingCollection by
UNTOLD = "untold"  # --sharding untold: TorchRec's planner without the tables' pooling (its default)


def per_rank_batch(global_batch: int, world_size: int) -> int:
    if global_batch % world_size:
        raise UsageError(
            f"global batch {global_batch} does not split evenly over {world_size} ranks: "
            f"pick a rank count that divides it (each rank trains global / ranks examples)"
        )
    return global_batch // world_size


def check(args: RunConfig, nproc: int) -> Workload:
    """What every rank of an ``nproc``-rank job would refuse; the workload, as the ranks load it."""
    from torchrec import EmbeddingBagConfig

    workload = workload_of(args.config, args.model, args.model_args, args.batch, nproc)
    per_rank_batch(workload.global_batch, nproc)
    options = on_ranks(args.options, args.pipeline)
    sparse2d.check(options, nproc, nproc)
    if options.sparse_parallel == "2d":
        taken = [
            flag
            for flag, on in (
                ("--rebalance", args.rebalance),
                ("--checkpoint-every", args.checkpoint_every),
                ("--resume", args.resume),
            )
            if on
        ]
        if taken:
            raise UsageError(
                f"{taken[0]} does not take sparse_parallel=2d yet (it moves 1-D shards): run it without 2D"
            )
    variant = workload.for_stack(options)
    applied_switches(variant, options)
    if args.pipeline:
        built = variant.build(torch.device("meta"))
        module_fields(variant, built, workload.batch(0, 0, nproc, args.seed), True)
    tables = variant.tables()
    forced = plan.parse_sharding(args.sharding, [t.name for t in tables])
    # TorchRec's EmbeddingCollection (unpooled tables) shards table-, row- or column-wise only
    odd = sorted(
        t.name.removeprefix("table_")
        for t in tables
        if not isinstance(t, EmbeddingBagConfig) and forced.get(t.name) not in (None, *UNPOOLED_TYPES)
    )
    if odd:
        raise UsageError(
            f"--sharding: sequence table(s) {', '.join(odd)} can only be {', '.join(UNPOOLED_TYPES)} "
            f"in TorchRec; add e.g. {odd[0]}=row_wise to the spec"
        )
    if args.rebalance:
        from gembench.harness.train.distributed.rebalance import check as check_rebalance

        check_rebalance(args.sharding, forced, [t.name for t in tables], nproc, args.pipeline)
    return workload
