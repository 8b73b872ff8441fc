"""Project MFU, embedding imbalance and exposed communication to 8 to 4,096 GPUs, before the cluster is spent.

For each world size: TorchRec's plan for it (its planner, offline: meta tensors, no process
group, a Topology from the cluster, each table's pooling factor as a constraint), then one cost
model (harness/projection/cost.py; every constant in docs/design.md section 8) prices each
stage of a step: compute from a measured result (--from) or the datasheet, lookups from bytes
over HBM, each collective alpha-beta over NVLink within a node and the NIC across nodes, overlap
as TorchRec's pipeline schedules it. The slowest rank sets each synchronized stage.

examples:
  gembench project --config xl --gpus 8,64,512,4096 --cluster h100 \
      --set dense_parallel=fsdp --set activation_checkpointing=hstu
  gembench project --config dcnv2-mlperf --gpus 8,64,128 --cluster h200 --out p.json
  gembench project --config small --gpus 8,64 --from results/runs/r.json   # compute as measured
  gembench project --calibrate --out here.toml           # this host's links, as a cluster file
  gembench project --calibrate --trace tr/ --cluster here.toml --out run.toml   # links as a run saw them
  gembench project --check dist.json --from one-rank.json --cluster here.toml   # vs measured

A projection is a model: `--check` prints its error against a measured run of the same setup.
Clusters: h100, h200, b200 (nodes of 8; see docs/design.md section 8) or your own TOML file
(fields: name, gpus_per_node, peak_tflops, hbm_gib, hbm_GBps, [intra] and [inter] with
latency_us and bandwidth_GBps; optional efficiency, lookup_efficiency, [collectives.<family>]).
"""

from __future__ import annotations

import argparse
import datetime
import sys
import uuid

from gembench.errors import UsageError


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="small", help="config name or .toml path (default: small)")
    p.add_argument(
        "--gpus", default="8,64,512,4096", metavar="W,W,...", help="world sizes to project (default: 8,64,512,4096)"
    )
    p.add_argument(
        "--cluster", default="h100", metavar="NAME|FILE", help="h100, h200, b200 or a cluster TOML file (default: h100)"
    )
    p.add_argument(
        "--from",
        dest="from_result",
        metavar="RESULT.json",
        help="a measured result of this config: compute per stage as measured on its device",
    )
    p.add_argument("--batch", type=int, metavar="N", help="global batch (default: the config's)")
    p.add_argument("--sharding", metavar="TYPE", help="force one sharding type on every table (default: planner's)")
    p.add_argument(
        "--schedule",
        choices=("pipelined", "staged"),
        default="pipelined",
        help="pipelined: TorchRec's sparse-dist pipeline and DDP overlap (default); "
        "staged: every stage on the critical path, as gembench's measured ranks run",
    )
    p.add_argument(
        "--set",
        dest="switches",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a switch of the optimized stack, as `gembench run --set` takes it: "
        "activation_checkpointing=hstu|all, dense_parallel=fsdp|hsdp (memory, recompute, gradient sync)",
    )
    p.add_argument("--no-cache", action="store_true", help="plan again instead of reading the plan cache")
    p.add_argument(
        "--out",
        metavar="FILE",
        help="projection JSON (gembench.projection/1); with --calibrate the cluster TOML; never overwritten",
    )
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="measure this host's collectives (gloo on CPU, nccl on GPU) and write a cluster file",
    )
    p.add_argument("--nproc", type=int, default=2, metavar="N", help="ranks for --calibrate (default: 2)")
    p.add_argument(
        "--trace",
        metavar="DIR",
        help="with --calibrate: the links as a run's own collectives took them (the rank<R>.json of "
        "gembench run --nproc N --trace DIR), isolated figures as the floor (--cluster FILE.toml reuses them)",
    )
    p.add_argument(
        "--check",
        metavar="RESULT.json",
        help="project a measured --nproc result's own setup and print projected vs measured",
    )
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _worlds(spec: str) -> list[int]:
    try:
        worlds = [int(w) for w in spec.split(",") if w.strip()]
    except ValueError:
        raise UsageError(f"--gpus takes world sizes like 8,64,512, got {spec!r}") from None
    if not worlds or any(w < 1 for w in worlds):
        raise UsageError(f"--gpus takes positive world sizes like 8,64,512, got {spec!r}")
    return worlds


def main(args: argparse.Namespace) -> int:
    if args.calibrate:
        from gembench.harness.projection.calibrate import calibrate_command

        return calibrate_command(args)
    if args.check:
        from gembench.harness.projection.check import check_command

        return check_command(args)
    return project_command(args)


def project_command(args) -> int:
    from gembench.harness.projection.cluster import load_cluster
    from gembench.harness.projection.report import print_projection, projection_document
    from gembench.harness.projection.sweep import sweep
    from gembench.harness.store.results import check_writable, write_result
    from gembench.harness.train.stack import stack_options
    from gembench.models.config import load_config, with_global_batch

    cluster = load_cluster(args.cluster)
    stack = stack_options("optimized", None, tuple(args.switches))
    if args.sharding:
        from gembench.harness.train.distributed.plan import SHARDING_TYPES

        if args.sharding not in SHARDING_TYPES:
            raise UsageError(f"--sharding must be one of {', '.join(SHARDING_TYPES)}, got {args.sharding!r}")
    worlds = _worlds(args.gpus)
    cfg = with_global_batch(load_config(args.config), args.batch)
    for w in worlds:
        if cfg.data.global_batch % w:
            raise UsageError(
                f"--gpus {w} does not divide the global batch {cfg.data.global_batch}; "
                "pick world sizes that divide it or pass --batch"
            )
    result = None
    if args.from_result:
        from gembench.harness.store.results import load_result

        result = load_result(args.from_result)
        if result["config"]["name"] != cfg.name:
            raise UsageError(
                f"--from {args.from_result} measured config {result['config']['name']!r}, "
                f"not {cfg.name!r}: project the config it measured"
            )
        device = result["run"].get("device", "cpu")
        if device == "cpu" and cluster.source == "preset":
            print(
                f"gembench project: warning: --from {args.from_result} was measured on a CPU; its compute "
                f"prices {cluster.name} GPUs as that CPU (a result measured on the cluster's GPU belongs here)",
                file=sys.stderr,
            )
    if args.out:
        check_writable(args.out)
    progress = (lambda msg: print(msg, file=sys.stderr, flush=True)) if not args.quiet else (lambda msg: None)
    rows, compute = sweep(
        cfg, worlds, cluster, result, args.sharding, args.schedule, not args.no_cache, progress, stack
    )
    doc = projection_document(
        cfg,
        cluster,
        rows,
        args.schedule,
        compute,
        stack,
        id=uuid.uuid4().hex[:12],
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(),
    )
    print_projection(doc)
    if args.out:
        from gembench.harness.store.schema import validate

        validate(doc, args.out)
        write_result(args.out, doc)
        print(f"projection: {args.out}")
    return 0
