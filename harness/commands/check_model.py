"""Check that a model of your own runs through gembench, one line per check, before any benchmark.

SPEC is pkg.module:factory or path/to/file.py:factory returning a gembench.workload.Workload
(docs/workload.md). The checks, in order: it imports and gives TorchRec tables; it builds on the
meta device; its batches are identical for a seed and hold global_batch/world examples; its FLOPs
formula (if any) agrees with FlopCounterMode within 1%; one unsharded step on CPU trains (finite
loss); the stages cover the step; and the same first step on 2 gloo ranks under TorchRec's
DistributedModelParallel gives the unsharded loss.

exit status: 0 every check passed; 1 a check failed (its line says which); 2 bad input (the
module does not import, no factory, wrong return type, tables not TorchRec's, a batch of the
wrong shape, a FLOPs formula the counter contradicts, an unsupported switch).

examples:
  gembench check-model examples/torchrec_dlrm.py:dlrm --model-arg max_rows=1000
  gembench check-model examples/two_tower.py:two_tower
  gembench check-model gembench.models.zoo:zoo --model-arg config=tiny
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import textwrap
from pathlib import Path

LOSS_RTOL = 1e-4  # fp32 on both sides; sharded pooling sums in another order
COVERAGE = 0.95  # the stages' share of the step's wall time below which timing misses work
TIMED = 3  # timed steps of the one-process check


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", metavar="SPEC", help="pkg.module:factory or path/to/file.py:factory")
    p.add_argument("--model-arg", dest="model_args", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-ranks", action="store_true", help="skip the 2-rank check (no torchrun)")


def main(args: argparse.Namespace) -> int:
    import torch

    if not args.no_ranks:
        torch.set_num_threads(1)  # before any op: the 2-rank check forks its ranks from this process

    from gembench.harness.train.memory import parameter_shapes
    from gembench.harness.train.parallelize import sparse_modules
    from gembench.harness.train.stack import build_train_state, stack_options
    from gembench.harness.train.step import losses
    from gembench.harness.train.work import counted_flops, flops_of
    from gembench.harness.train.workloads import prepared, seeded
    from gembench.loader import check_batch, load_workload

    failed = False

    def line(ok: bool, check: str, detail: str) -> None:
        nonlocal failed
        failed |= not ok
        print(f"{'ok  ' if ok else 'FAIL'}  {check:<18} {detail}", flush=True)

    workload = load_workload(args.spec, args.model_args)  # bad input: one line, exit 2 (cli)
    tables = workload.tables()
    line(True, "imports", f"{args.spec} -> {type(workload).__name__} {workload.name!r}, {len(tables)} TorchRec tables")
    meta = workload.build(torch.device("meta"))
    sparse = sparse_modules(meta) if isinstance(meta, torch.nn.Module) else []
    on_meta = isinstance(meta, torch.nn.Module) and all(p.is_meta for p in meta.parameters())
    counts = parameter_shapes(workload, meta) if on_meta else {}
    line(
        on_meta and bool(sparse),
        "builds on meta",
        f"{counts.get('embedding_params', 0):,} table and {counts.get('dense_params', 0):,} dense parameters, "
        f"{len(sparse)} TorchRec module(s)"
        if on_meta
        else "build(meta) must return an nn.Module whose parameters are all on the meta device",
    )
    batches, ident = prepared(workload, args.seed, count=2, meta=meta if on_meta else None)  # shapes: exit 2
    for r in (0, 1):
        check_batch(workload, workload.batch(0, r, 2, args.seed), r, 2)
    same = _same(workload.batch(0, 0, 1, args.seed), batches[0]) and _same(
        workload.batch(1, 0, 1, args.seed), batches[1]
    )
    line(same, "seeded batches", f"batch 0 and 1 drawn twice {'equal' if same else 'DIFFER'}; hash {ident.hash}")

    torch.manual_seed(args.seed)
    model = seeded(workload, torch.device("cpu"), args.seed)
    count = counted_flops(workload, model, batches[0])
    work = flops_of(workload, model, batches[:1], count=count)  # a formula claiming more than the count: exit 2
    total, untrained = sum(work.per_batch[0].values()), sum(work.untrained.values())
    if work.basis == "formula":
        counted = sum(count.trained.values())
        beyond = (
            f"; {work.beyond_formula:,.0f} it leaves out count as executed, not model" if work.beyond_formula else ""
        )
        line(
            True,
            "FLOPs",
            f"formula {total:,.0f} per batch, FlopCounterMode {counted:,.0f} reach the loss "
            f"({total / counted - 1:+.2%}){beyond}",
        )
    else:
        line(True, "FLOPs", f"counted by FlopCounterMode: {total:,.0f} per batch reach the loss (no formula given)")
    if untrained:
        blocks = ", ".join(f"{b} {f:,.0f}" for b, f in sorted(work.untrained.items(), key=lambda kv: -kv[1]))
        line(True, "untrained FLOPs", f"{untrained:,.0f} per batch reach no loss ({blocks}): executed once, not model")
    with torch.no_grad():
        first = float(losses(workload, workload.forward(model, batches[0]), batches[0])[0])
    del model

    from gembench.harness.train.measure import run_steps

    options = stack_options("optimized", "fp32", ("compile=off",))
    state = build_train_state(workload.for_stack(options), options, torch.device("cpu"), args.seed)
    samples = run_steps(state, batches, TIMED, 1)
    finite = all(math.isfinite(v) for v in samples.loss)
    line(finite, "one step (cpu)", f"loss {samples.loss[0]:.6g} after one step (first forward {first:.6g})")
    # the best step: work outside the stages shows in every step, the host pausing this process in one
    cover = max(sum(samples.stages[s][i] for s in samples.stages) / samples.step_s[i] for i in range(TIMED))
    shares = ", ".join(f"{s} {sum(v) / sum(samples.step_s):.0%}" for s, v in samples.stages.items())
    line(
        cover >= COVERAGE and min(samples.stages["sparse_forward"]) > 0,
        "stages cover step",
        f"{cover:.1%} of the step's wall time ({shares})",
    )
    if not args.no_ranks:
        line(*_ranks(args, workload))
    return 1 if failed else 0


def _ranks(args, workload) -> tuple[bool, str, str]:
    """The first forward's loss on 2 gloo ranks under DMP against the unsharded one on the same
    slices (mean over the ranks' slices: each rank's loss is over its own examples)."""
    import torch

    from gembench.harness.train.distributed.launch import relaunch
    from gembench.harness.train.step import losses
    from gembench.harness.train.workloads import seeded

    model = seeded(workload, torch.device("cpu"), args.seed)
    with torch.no_grad():
        slices = [workload.batch(0, r, 2, args.seed) for r in (0, 1)]
        want = sum(float(losses(workload, workload.forward(model, b), b)[0]) for b in slices) / 2
    with tempfile.TemporaryDirectory(prefix="gembench-check-") as tmp:
        out = Path(tmp) / "ranks.json"
        code = relaunch(2, rank_check, args, out)
        if code != 0 or not out.exists():
            return False, "2 gloo ranks (DMP)", f"the 2-rank job failed (exit {code}); its messages are above"
        got = json.loads(out.read_text())
    loss = sum(got["loss"]) / 2
    ok = math.isclose(loss, want, rel_tol=LOSS_RTOL)
    kinds: dict[str, list[str]] = {}
    for table, placed in got["plan"].items():
        kinds.setdefault(placed["sharding"], []).append(table)
    plan = "; ".join(f"{kind}: {', '.join(tables)}" for kind, tables in sorted(kinds.items()))
    indent = " " * 26  # under the detail column of the check lines
    return (
        ok,
        "2 gloo ranks (DMP)",
        f"first loss {loss:.6g} sharded vs {want:.6g} unsharded ({loss / want - 1:+.1e}); the plan:\n"
        + textwrap.fill(plan, width=100, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False),
    )


def _same(a, b) -> bool:
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from gembench.loader import batch_fields

    fa, fb = batch_fields(a), batch_fields(b)
    if fa.keys() != fb.keys():
        return False
    for k, x in fa.items():
        y = fb[k]
        if isinstance(x, KeyedJaggedTensor):
            if (
                x.keys() != y.keys()
                or not torch.equal(x.values(), y.values())
                or not torch.equal(x.lengths(), y.lengths())
            ):
                return False
        elif not torch.equal(x, y):
            return False
    return True


def rank_check(args, out: Path) -> int:
    """One of the 2 ranks: the workload sharded by TorchRec's planner and DMP, the first forward's
    loss on this rank's slice (fp32), then one backward and dense step; rank 0 writes the losses."""
    import torch
    import torch.distributed as dist

    from gembench.harness.train.distributed import library_logs
    from gembench.harness.train.distributed.carry import load_unsharded
    from gembench.harness.train.distributed.plan import shard_workload
    from gembench.harness.train.distributed.process_group import init_process_group, torchrun_env
    from gembench.harness.train.step import losses
    from gembench.harness.train.workloads import seeded
    from gembench.loader import load_workload

    library_logs.install(False)
    env = torchrun_env()
    dev = torch.device("cpu")
    init_process_group(dev, 300.0)
    try:
        workload = load_workload(args.spec, args.model_args)
        rank, world = env["rank"], env["world_size"]
        model = seeded(workload, dev, args.seed)
        unsharded = {k: v.detach() for k, v in model.state_dict().items()}
        dmp, planned = shard_workload(
            workload, model, env, dev, workload.global_batch // world, None, workload.pooling(), None, False
        )
        written = load_unsharded(dmp, unsharded)
        batch = workload.batch(0, rank, world, args.seed)
        loss = losses(workload, workload.forward(dmp.module, batch), batch)[0]
        loss.backward()
        losses = [None] * world
        dist.all_gather_object(losses, float(loss.detach()))
        if rank == 0:
            out.write_text(json.dumps({"loss": losses, "plan": planned.tables, "copied": written}))
        dist.barrier()
    except Exception as err:  # noqa: BLE001  the rank's error as one line
        print(f"gembench check-model: rank {env['rank']}: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        return 1
    finally:
        dist.destroy_process_group()
    return 0
