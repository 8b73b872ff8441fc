"""Measure what each optimization buys: add them one at a time, then remove them one at a time.

Starting from the baseline stack, each row adds one more optimization (cumulative): the gain
column is what it adds on top of those before it. Then, from the optimized stack, each row removes
one alone: the loss column is what the full stack would lose without it. After the two tables
the choices (activation_checkpointing=hstu / all, activation_dtype=fp8, and content=off for a
config with a [content] section) are measured on the optimized stack, with MFU, HFU and the
activation memory each step saved; content=off's MFU is against its own, smaller FLOPs. All MFU
figures are against the same reference peak, so a ratio of MFUs is a ratio of throughputs.
`pipeline` acts on ranks only.

With --nproc N the dense-side switches are measured on N torchrun ranks instead, each variant one
`gembench run --nproc N --set ...`: DDP against FSDP2, activation checkpointing, compile, the
pipeline (and content=off), with step time, MFU, HFU, peak memory, activation memory and dense
state per rank and the dense part's communication, and the goals beside them (docs/configs.md).

exit status: 0 measured; 2 a usage error, or a variant refused before it starts (it would not fit).

examples:
  gembench ablate --config small
  gembench ablate --config small --nproc 2
  gembench ablate --model examples/torchrec_dlrm.py:dlrm --nproc 2   # a workload: the switches that act on it
  gembench ablate --config tiny --steps 5 --warmup 2 --out ablation.json   # each variant's result
  gembench ablate --config medium --device cuda --batch 256   # a batch every variant fits
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path


def configure(p: argparse.ArgumentParser) -> None:
    from gembench.harness.commands.run import add_model_flags

    add_model_flags(p, "config name or .toml path (default: small)")
    p.add_argument(
        "--batch",
        type=int,
        default=None,
        metavar="N",
        help="global batch, overriding the config's (recorded with its config hash)",
    )
    p.add_argument("--steps", type=int, default=8, help="timed steps per stack variant (default: 8)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up steps per variant, incl. compile (default: 3)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda[:N] (default: auto)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and data (default: 0)")
    p.add_argument("--peak-tflops", type=float, default=None, help="override the reference peak")
    p.add_argument("--out", type=Path, default=None, help="also write every variant's figures as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument(
        "--nproc",
        type=int,
        default=None,
        metavar="N",
        help="measure the dense-side switches (ddp/fsdp, activation checkpointing, compile, "
        "pipeline) on N torchrun ranks, one `gembench run --nproc N` per variant",
    )


def variants(single_process: bool, skip=(), optimized=None):
    """(label, options) pairs: cumulative additions from the baseline, then single removals from
    ``optimized`` (default the named stack; ``skip``: switches that do not act on the model,
    skipped_switches, or that this device does not run)."""
    from gembench.harness.train.stack import OPTIMIZATIONS, STACKS

    optimized = optimized or STACKS["optimized"]
    names = [n for n in OPTIMIZATIONS if not (single_process and n == "pipeline") and n not in skip]
    added, options = [("baseline", STACKS["baseline"])], STACKS["baseline"]
    for name in names:
        options = replace(options, **{name: True})
        added.append((f"+ {name}", options))
    removed = [(f"- {name}", replace(optimized, **{name: False})) for name in names]
    return added, removed


def choices(single_process: bool, excluded=(), optimized=None):
    """(label, options): ``optimized`` (default the named stack) with each other value of a
    choice switch (one process: no dense_parallel or sparse_parallel, which need ranks; ``excluded``: the switches
    or values that do not act on the model, skipped_switches)."""
    from gembench.harness.train.stack import CHOICES, STACKS

    optimized = optimized or STACKS["optimized"]
    skip = {"dense_parallel", "sparse_parallel", "replica_merge"} if single_process else set()
    return [
        (f"{name}={value}", replace(optimized, **{name: value}))
        for name, values in CHOICES.items()
        if name not in skip
        for value in values[1:]
        if f"{name}={value}" not in excluded and name not in excluded
    ]


def main(args: argparse.Namespace) -> int:
    from gembench.errors import UsageError
    from gembench.harness.store.reservation import Reservation

    if args.model_args and args.model is None:
        raise UsageError("--model-arg is an argument of --model's factory: add --model pkg.mod:factory")
    args.config = args.config or ("small" if args.model is None else None)
    reservation = Reservation.take(args.out) if args.out is not None else None  # before any work
    try:
        if args.nproc is not None:
            from gembench.harness.commands.ablate_ranks import ablate_ranks

            return ablate_ranks(args)
        return _ablate(args)
    finally:
        if reservation is not None:
            reservation.release()


def _ablate(args: argparse.Namespace) -> int:
    import sys

    from tabulate import tabulate

    from gembench.harness.commands.ablate_ranks import skipped_switches
    from gembench.harness.commands.run import run_config_from
    from gembench.harness.device.hardware import resolve_device
    from gembench.harness.report.numbers import pct
    from gembench.harness.store.reservation import write_or_fallback
    from gembench.harness.train.memory import memory_estimate, parameter_shapes
    from gembench.harness.train.runner import measure_stack, prepare, summarized
    from gembench.harness.train.workloads import workload_of

    workload = workload_of(args.config, args.model, args.model_args, args.batch)
    device_type = resolve_device(args.device).type
    workload = workload.on_device(device_type)
    skip = skipped_switches(workload)  # only the switches that act on the model
    # ablate's --out is its own table
    run = run_config_from(args, out=None, nproc=None, model_args=tuple(args.model_args or ()))
    optimized, why = run.precision()  # the optimized stack as this device runs it
    if why:  # bf16 emulated here: a row of it would time the emulation, and every row after it too
        skip = set(skip) | {"bf16"}
        print(f"gembench ablate: bf16 not measured, the stacks run {why}", file=sys.stderr)
    added, removed = variants(single_process=True, skip=skip, optimized=optimized)
    chosen = choices(single_process=True, excluded=skip, optimized=optimized)
    # Variants run one at a time, and each must fit: the memory check takes the hungriest.
    counts = parameter_shapes(workload)
    hungriest = max(
        (options for _, options in added + removed),
        key=lambda o: memory_estimate(workload.for_stack(o), counts, workload.global_batch, o, device_type)["total"],
    )
    setup = prepare(run, [hungriest])
    runs = {}  # options -> Measured: "+ compile" is the optimized stack, measured once
    todo = added + removed + chosen
    for i, (label, options) in enumerate(todo):
        key = tuple(sorted(options.to_dict().items()))
        if key not in runs:
            if not args.quiet:
                print(
                    f"gembench ablate: [{i + 1}/{len(todo)}] {label}: {options.describe()}", file=sys.stderr, flush=True
                )
            runs[key] = measure_stack(setup, options, label)
    # one peak for every variant: checked against all of them, re-measured once if beaten
    by_key = dict(zip(runs, summarized(setup, list(runs.values()))))
    measured = {label: by_key[tuple(sorted(options.to_dict().items()))] for label, options in todo}

    def row(label, reference):
        r = measured[label]["summary"]
        ref = measured[reference]["summary"]
        return [label, f"{1e3 * r['step_time_s']['p50']:.1f}", pct(r["mfu"]), f"{r['mfu'] / ref['mfu']:.2f}x"]

    rows = [row(added[0][0], added[0][0])]
    rows += [row(label, added[i][0]) for i, (label, _) in enumerate(added[1:])]
    print(
        f"gembench ablate {setup.workload.name}: {args.steps} timed steps per variant, "
        f"peak {setup.peak.tflops_per_device:.4g} TFLOP/s ({setup.peak.source})\n"
    )
    print(
        tabulate(
            rows,
            headers=["adding (cumulative)", "step ms", "MFU", "gain over previous row"],
            colalign=("left", "right", "right", "right"),
        )
    )
    full = added[-1][0]
    rows = [row(full, full)] + [
        [label, *row(label, full)[1:3], f"{measured[full]['summary']['mfu'] / measured[label]['summary']['mfu']:.2f}x"]
        for label, _ in removed
    ]
    print()
    print(
        tabulate(
            rows,
            headers=["removing (one at a time)", "step ms", "MFU", "full stack's gain from it"],
            colalign=("left", "right", "right", "right"),
        )
    )
    base, opt = measured[added[0][0]]["summary"], measured[full]["summary"]
    print(
        f"\noptimized/baseline MFU: {opt['mfu'] / base['mfu']:.2f}x "
        f"({pct(base['mfu'])} -> {pct(opt['mfu'])}); pipeline: only with --nproc > 1"
    )

    def act(label):
        return measured[label]["summary"].get("activation_bytes") or 0

    rows = [
        [
            label,
            f"{1e3 * measured[label]['summary']['step_time_s']['p50']:.1f}",
            pct(measured[label]["summary"]["mfu"]),
            pct(measured[label]["summary"]["hfu"]),
            f"{act(label) / 2**20:,.1f}",
            f"{act(label) / act(full) - 1:+.0%}" if act(full) else "-",
        ]
        for label in [full] + [label for label, _ in chosen]
    ]
    print()
    print(
        tabulate(
            rows,
            headers=["optimized stack, choosing", "step ms", "MFU", "HFU", "activation MiB", "activation vs full"],
            colalign=("left", "right", "right", "right", "right", "right"),
        )
    )
    print(
        "(HFU - MFU: the recomputed forward's share; activation MiB: saved for backward in one step;"
        " dense_parallel, sparse_parallel: only with --nproc > 1)"
    )
    if "activation_dtype=fp8" in measured:
        from gembench.harness.commands.ablate_ranks import fp8_goal

        print("\n".join(fp8_goal(measured[full]["summary"], measured["activation_dtype=fp8"]["summary"])))
    if args.out is not None:
        doc = {
            "schema": "gembench.ablation/1",
            "config": setup.workload.name,
            "config_hash": setup.ident.hash,
            "peak": {"tflops_per_device": setup.peak.tflops_per_device, "source": setup.peak.source},
            "variants": {
                label: {k: measured[label][k] for k in ("options", "summary", "counters")}
                for label, _ in added + removed + chosen
            },
        }
        write_or_fallback(args.out, json.loads(json.dumps(doc)))
        print(f"\nablation: {args.out}")
    return 0
