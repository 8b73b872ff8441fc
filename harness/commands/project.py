"""Project MFU, embedding imbalance and exposed communication to 8 to 4,096 GPUs, before the cluster is spent.

For each world size: TorchRec's planner, offline (meta tensors, a Topology from the cluster),
offered data_parallel, table/row/column-wise, table_row_wise and grid where they apply, every
plan it finds rated by one cost model (harness/projection/cost.py, docs/projection.md): compute
from a measured result (--from) or the datasheet, lookups from bytes over HBM, each collective
as TorchRec runs it, alpha-beta over the cluster file's links, overlap as the pipeline schedules
it. The fastest is kept; each row names the stage on the critical path and the GPU that sets it.
Past one node, 2D sparse parallelism too (TorchRec's DMPCollection: tables sharded within groups
of G GPUs, replicated across them, the replicas synced every --sync-every steps): the faster kept.
A config and a --model workload are read the same way, through the workload protocol.

examples:
  gembench project --config xl --gpus 8,64,512,4096 --cluster h100 \
      --set dense_parallel=fsdp --set activation_checkpointing=hstu
  gembench project --config dcnv2-mlperf --gpus 8,64,128 --batch 8=55296,64=135168,128=135168
  gembench project --config dcnv2-mlperf --gpus 64,128 --batch 135168 --sparse-parallel 2d --sync-every 1000
  gembench project --config small --gpus 8,64,512 --batch-per-gpu 4096   # weak scaling
  gembench project --config small --gpus 8,64 --from results/runs/r.json   # compute as measured
  gembench project --model examples/two_tower.py:two_tower --gpus 8,64 --batch 4096   # your own model
  gembench project --calibrate --out here.toml           # this host's links, as a cluster file
  gembench project --calibrate --trace tr/ --cluster here.toml --out run.toml   # links as a run saw them
  gembench project --check dist.json --from one-rank.json --cluster run.toml   # vs measured

Clusters: h100, h200, b200, mi355x (nodes of 8; docs/dlrmv4.md) or a TOML file (name, gpus_per_node, peak_tflops,
hbm_gib, hbm_GBps, [intra], [inter]; optional [collectives.*], [in_run.*], links).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import sys
import uuid

from gembench.errors import UsageError


@dataclasses.dataclass(frozen=True)
class ProjectConfig:
    """What `gembench project` is asked to do, checked: a projection, --calibrate or --check."""

    config: str | None = None
    model: str | None = None
    model_args: tuple[str, ...] = ()
    worlds: tuple[int, ...] = ()  # --gpus (a projection's)
    batch: int | None = None  # --batch N: every world's global batch
    per_world: dict[int, int] = dataclasses.field(default_factory=dict)  # --batch W=N,... or --batch-per-gpu
    cluster: str = "h100"
    from_result: str | None = None
    sharding: str | None = None
    schedule: str = "pipelined"
    switches: tuple[str, ...] = ()
    search: str = "fast"
    no_cache: bool = False
    out: str | None = None
    calibrate: bool = False
    nproc: int = 2
    trace: str | None = None
    check: str | None = None
    quiet: bool = False
    sparse_parallel: str = "auto"  # the tables over the world (1d), in groups with replicas (2d), or the faster
    sync_every: int | None = None  # 2D: steps between the replicas' syncs (None: sparse2d.SYNC_EVERY)
    job_steps: int = 10_000  # the job a row's start-up and checkpoints are priced over (projection/job.py)
    checkpoint_every: int = 500


def configure(p: argparse.ArgumentParser) -> None:
    from gembench.harness.commands.run import add_model_flags

    add_model_flags(p, "config name or .toml path (default: small, or the model --from measured)")
    p.add_argument(
        "--gpus", default="8,64,512,4096", metavar="W,W,...", help="world sizes to project (default: 8,64,512,4096)"
    )
    p.add_argument(
        "--cluster",
        default="h100",
        metavar="NAME|FILE",
        help="h100, h200, b200, mi355x or a cluster TOML file (default: h100)",
    )
    p.add_argument(
        "--from",
        dest="from_result",
        metavar="RESULT.json",
        help="a measured result of this model: compute per stage as measured on its device "
        "(alone: project the config or --model workload it measured)",
    )
    p.add_argument(
        "--batch",
        metavar="N|W=N,...",
        help="global batch at every size (strong scaling; default: the model's), or one per world size: "
        "8=55296,64=135168",
    )
    p.add_argument(
        "--batch-per-gpu",
        type=int,
        metavar="N",
        help="N examples per GPU at every size, the global batch N x GPUs (weak scaling: how a job grows)",
    )
    p.add_argument("--sharding", metavar="TYPE", help="force one sharding type on every table (default: planner's)")
    p.add_argument(
        "--sparse-parallel",
        default="auto",
        metavar="auto|1d|2d",
        help="1d: the tables sharded over all the GPUs; 2d: sharded within groups of G GPUs (a node, two, four ... "
        "short of the world) and replicated across the groups, as TorchRec's DMPCollection runs it, every group "
        "size and placement tried; auto: both, the fastest kept (default). The table says which and why",
    )
    p.add_argument(
        "--sync-every",
        type=int,
        metavar="N",
        help="2D: steps between syncs of the replicas (an all-reduce of each GPU's table shards and Adagrad "
        "state; default 1, TorchRec's train pipeline's). Past 1 the replicas train apart between syncs: "
        "an algorithm change, not only a layout",
    )
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
    p.add_argument(
        "--search",
        choices=("fast", "full"),
        default="fast",
        help="fast: the planner's search with the restrictions kept for speed (default); "
        "full: without them, to measure what they cost (docs/projection.md)",
    )
    p.add_argument("--no-cache", action="store_true", help="plan again instead of reading the plan cache")
    job = p.add_argument_group(
        "the job around the steps (a model: start-up as --from measured it, the planner timed at each size; "
        "checkpoints over the cluster's host-copy and storage_GBps bandwidths)"
    )
    job.add_argument(
        "--job-steps", type=int, default=10_000, metavar="N", help="steps of the job priced (default: 10,000)"
    )
    job.add_argument(
        "--checkpoint-every",
        type=int,
        default=500,
        metavar="K",
        help="steps between checkpoints (default: 500, as torchtitan's example configs save)",
    )
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


def _batches(spec: str | None, worlds: list[int]) -> tuple[int | None, dict[int, int]]:
    """--batch N (every world) or W=N,... (per world): (the config's new batch or None, per world)."""
    if not spec:
        return None, {}
    try:
        if "=" not in spec:
            return int(spec), {}
        per = {int(w): int(n) for w, n in (item.split("=") for item in spec.split(",") if item.strip())}
    except ValueError:
        raise UsageError(f"--batch takes N or W=N,W=N (e.g. 8=55296,64=135168), got {spec!r}") from None
    if any(n < 1 for n in per.values()):
        raise UsageError(f"--batch takes positive batches, got {spec!r}")
    missing = [w for w in worlds if w not in per]
    if missing:
        raise UsageError(f"--batch {spec} names no batch for --gpus {','.join(map(str, missing))}: add W=N for each")
    return None, per


def project_config(args: argparse.Namespace) -> ProjectConfig:
    """The flags, checked as far as they can be without the model: --check's companions, or a
    projection's world sizes, batches and sharding type (--calibrate checks its own)."""
    worlds, batch, per_world = (), None, {}
    if args.check and not args.calibrate:
        if not args.from_result:
            raise UsageError(
                "--check needs --from ONE_RANK.json: a 1-rank result of the same model and stack "
                "(gembench run --nproc 1 ...)"
            )
        if not args.cluster.endswith(".toml"):
            raise UsageError("--check needs --cluster FILE.toml measured on this host (gembench project --calibrate)")
    elif not args.calibrate:
        for flag, value in (("--job-steps", args.job_steps), ("--checkpoint-every", args.checkpoint_every)):
            if value < 1:
                raise UsageError(f"{flag} takes a positive number of steps, got {value}")
        from gembench.harness.projection.sparse2d import MODES

        if args.sparse_parallel not in MODES:
            raise UsageError(f"--sparse-parallel takes {', '.join(MODES)}, got {args.sparse_parallel!r}")
        if args.sync_every is not None and args.sync_every < 1:
            raise UsageError(f"--sync-every takes a positive number of steps, got {args.sync_every}")
        if args.sharding:
            from gembench.harness.train.distributed.plan import SHARDING_TYPES

            if args.sharding not in SHARDING_TYPES:
                raise UsageError(f"--sharding must be one of {', '.join(SHARDING_TYPES)}, got {args.sharding!r}")
        worlds = _worlds(args.gpus)
        per_gpu = args.batch_per_gpu
        if per_gpu is not None:
            if args.batch:
                raise UsageError("--batch and --batch-per-gpu both set the batch: pass one")
            if per_gpu < 1:
                raise UsageError(f"--batch-per-gpu takes a positive number of examples, got {per_gpu}")
            per_world = {w: per_gpu * w for w in worlds}
        else:
            batch, per_world = _batches(args.batch, worlds)
    same = {f.name: getattr(args, f.name) for f in dataclasses.fields(ProjectConfig) if hasattr(args, f.name)}
    return ProjectConfig(
        **same
        | {
            "model_args": tuple(args.model_args or ()),
            "worlds": tuple(worlds),
            "batch": batch,
            "per_world": per_world,
            "switches": tuple(args.switches),
        }
    )


def main(args: argparse.Namespace) -> int:
    config = project_config(args)
    if config.calibrate:
        from gembench.harness.projection.calibrate import calibrate_command

        return calibrate_command(config)
    if config.check:
        from gembench.harness.projection.check import check_command

        return check_command(config.check, config.from_result, config.cluster)
    return project_command(config)


def project_command(request: ProjectConfig) -> int:
    from gembench.harness.projection.cluster import load_cluster
    from gembench.harness.projection.report import print_projection, projection_document
    from gembench.harness.projection.sweep import sweep
    from gembench.harness.store.results import check_writable, load_result, write_result
    from gembench.harness.train.stack import stack_options

    cluster = load_cluster(request.cluster)
    stack = stack_options("optimized", None, request.switches)
    worlds, batch, per_world = list(request.worlds), request.batch, request.per_world
    result = load_result(request.from_result) if request.from_result else None
    m = _subject(request, result).at_batch(batch)
    from gembench.harness.train.workloads import applied_switches

    applied_switches(m.workload.for_stack(stack), stack)  # as `run` takes them: one it cannot take refused
    for w in worlds:
        gb = per_world.get(w, m.global_batch)
        if gb % w:
            raise UsageError(
                f"--gpus {w} does not divide the global batch {gb}; pick world sizes that divide it or pass --batch"
            )
    if request.sparse_parallel == "2d":
        from gembench.harness.projection.sparse2d import refuse_single_groups

        refuse_single_groups(worlds, cluster)
    for note in _notes(m, worlds, per_world):
        print(f"gembench project: note: {note}", file=sys.stderr)
    if result is not None:
        device = result["run"].get("device", "cpu")
        if device == "cpu" and cluster.source == "preset":
            print(
                f"gembench project: warning: --from {request.from_result} was measured on a CPU; its compute "
                f"prices {cluster.name} GPUs as that CPU (a result measured on the cluster's GPU belongs here)",
                file=sys.stderr,
            )
    if request.out:
        check_writable(request.out)
    progress = (lambda msg: print(msg, file=sys.stderr, flush=True)) if not request.quiet else (lambda msg: None)
    from gembench.harness.projection.rates import datasheet_compute, measured_compute

    compute = measured_compute(result) if result else datasheet_compute(m, cluster)
    rows = sweep(
        m,
        worlds,
        cluster,
        compute,
        request.sharding,
        request.schedule,
        not request.no_cache,
        progress,
        stack,
        per_world,
        request.search,
        request.sparse_parallel,
        request.sync_every,
    )
    from gembench.harness.projection.job import job_cost

    startup = (result or {}).get("startup")
    for row in rows:
        row["job"] = job_cost(
            row, m.counts["dense_params"], cluster, startup, request.job_steps, request.checkpoint_every
        )
    doc = projection_document(
        m,
        cluster,
        rows,
        request.schedule,
        compute,
        stack,
        id=uuid.uuid4().hex[:12],
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(),
    )
    print_projection(doc)
    if request.out:
        from gembench.harness.store.schema import validate

        validate(doc, request.out)
        write_result(request.out, doc)
        print(f"projection: {request.out}")
    return 0


SMALL_PER_GPU = 32  # examples per GPU below which a projection times latency, not a training job
SMALL_TABLES = 2**30  # bytes of fp32 tables under which they look sized for a CPU run, not production


def _notes(m, worlds: list[int], per_world: dict[int, int]) -> list[str]:
    """What a reader should know before trusting the rows: a per-GPU batch too small to be a
    training job's, tables that look cut down for a CPU."""
    notes = []
    batches = {w: per_world.get(w, m.global_batch) for w in worlds}
    small = [w for w in worlds if batches[w] // w < SMALL_PER_GPU]
    if small:
        w = small[-1]
        notes.append(
            f"{batches[w] // w} examples per GPU at {w} GPUs (global batch {batches[w]:,}): a step that small "
            "measures latency, not training; --batch-per-gpu N keeps N per GPU at every size"
        )
    table_bytes = 4 * m.counts["embedding_params"]  # fp32
    if table_bytes < SMALL_TABLES:
        notes.append(
            f"the tables hold {table_bytes / 2**20:,.0f} MiB in all: if they are sizes cut down for a CPU run, "
            "project the real ones (a --model-arg of your factory, or a config's [sparse] rows)"
        )
    return notes


def _subject(request: ProjectConfig, result: dict | None):
    """What is projected: --model's workload, --config's config, else the model --from measured
    (else small); with --from, refused in one line when it measured another model."""
    from gembench.harness.projection.subject import Subject, subject_of_result, workload_as_measured

    if request.model is not None:
        from gembench.loader import load_workload

        workload = load_workload(request.model, request.model_args)
        if result is not None:
            return workload_as_measured(workload, result, request.from_result)
        return Subject.of(workload)
    if request.config is None and result is not None:
        return subject_of_result(result, request.from_result)
    from gembench.harness.train.workloads import workload_of

    m = Subject.of(workload_of(request.config or "small"))
    if result is not None and result["config"]["name"] != m.name:
        raise UsageError(
            f"--from {request.from_result} measured {result['config']['name']!r}, "
            f"not {m.name!r}: project the model it measured (leave out --config)"
        )
    return m
