"""`gembench ablate --nproc N`: GEM's dense-side switches measured on N torchrun ranks.

Each variant is one `gembench run --nproc N --set ...` in its own set of processes (a rank's
memory is its own, and nothing of one variant's compile or allocator state reaches the next), its
result read back from a temporary file. The reference is the optimized stack under DDP.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# (label, --set switches, other RunConfig fields)
RANK_VARIANTS = [
    ("optimized, ddp", (), {}),
    ("dense_parallel=fsdp", ("dense_parallel=fsdp",), {}),
    ("activation_checkpointing=hstu", ("activation_checkpointing=hstu",), {}),
    ("activation_checkpointing=all", ("activation_checkpointing=all",), {}),
    ("fsdp + checkpointing hstu", ("dense_parallel=fsdp", "activation_checkpointing=hstu"), {}),
    ("activation_dtype=fp8", ("activation_dtype=fp8",), {}),
    # tables sharded within groups (half the ranks on one host), replicated across them
    ("sparse_parallel=2d", ("sparse_parallel=2d",), {}),
    ("2d, replica_merge=updates", ("sparse_parallel=2d", "replica_merge=updates"), {}),
    ("compile=off", ("compile=off",), {}),
    ("+ pipeline", (), {"pipeline": True}),
    ("content=off", ("content=off",), {}),  # configs with a [content] section only
]
REFERENCE = RANK_VARIANTS[0][0]


def run_variant(args, switches, flags, out: Path) -> tuple[dict | None, str]:
    """One `gembench run --nproc N` of a variant: (its result or None, the error's last line)."""
    from gembench.harness.commands.run import run_config_from

    config = None if args.config is None else str(args.config)
    run = run_config_from(args, config=config, switches=switches, out=out, quiet=True, **flags)
    cmd = [sys.executable, "-m", "gembench", "run", *run.to_argv()]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not out.exists():
        lines = (
            [line for line in proc.stderr.splitlines() if line.startswith("gembench")]
            or proc.stderr.splitlines()
            or ["?"]
        )
        return None, lines[0]
    return json.loads(out.read_text()), ""


def skipped_switches(workload) -> set[str]:
    """The switches that do not act on the workload: those not applicable to it (the zoo's
    attention kernel and content where it has none; compile where it names nothing to compile),
    and each checkpointing mode that wraps none of its blocks (``activation_checkpointing=hstu``)."""
    from gembench.harness.train.stack import CHOICES, STACKS
    from gembench.harness.train.workloads import applied_switches

    skip = set(applied_switches(workload, STACKS["baseline"]).not_applicable)
    for mode in CHOICES["activation_checkpointing"][1:]:
        if not workload.checkpointed(mode):
            skip.add(f"activation_checkpointing={mode}")
    return skip


def rank_variants(args) -> list:
    """RANK_VARIANTS that act on the model (skipped_switches): content=off for a config with
    a [content] section, HSTU checkpointing where it has HSTU layers, checkpointing all where it
    names blocks, compile where it names what to compile."""
    from gembench.harness.train.workloads import workload_of

    skip = skipped_switches(workload_of(args.config, args.model, args.model_args))
    return [v for v in RANK_VARIANTS if not any(s in skip or s.partition("=")[0] in skip for s in v[1])]


def dense_comm_ms(result: dict) -> float:
    return 1e3 * sum(k["time_s"] for name, k in result["comm"]["by_kind"].items() if name.startswith("dense_"))


def sparse_comm_ms(result: dict) -> float:
    """The tables' collectives a step: IDs and embeddings exchanged, and 2D's replica sync."""
    kinds = result["comm"]["by_kind"].items()
    return 1e3 * sum(k["time_s"] for name, k in kinds if name.startswith(("embedding_", "kjt_")))


def ablate_ranks(args) -> int:
    from tabulate import tabulate

    from gembench.harness.report.numbers import pct
    from gembench.harness.store.reservation import write_or_fallback

    if args.nproc < 2:
        from gembench.errors import UsageError

        raise UsageError(f"--nproc must be 2 or more for the ranks' ablation, got {args.nproc}")
    variants = rank_variants(args)
    load_before = "load average %.2f / %.2f / %.2f (1/5/15 min) at the start" % os.getloadavg()
    results, errors = {}, {}
    with tempfile.TemporaryDirectory(prefix="gembench-ablate-") as tmp:
        for i, (label, switches, flags) in enumerate(variants):
            if not args.quiet:
                print(
                    f"gembench ablate: [{i + 1}/{len(variants)}] {label} on {args.nproc} ranks",
                    file=sys.stderr,
                    flush=True,
                )
            results[label], errors[label] = run_variant(args, switches, flags, Path(tmp) / f"{i}.json")
    if results[REFERENCE] is None:
        print(f"gembench ablate: error: the reference ({REFERENCE}) failed: {errors[REFERENCE]}", file=sys.stderr)
        return 1

    def mib(x):
        return f"{x / 2**20:,.1f}" if x is not None else "-"

    ref = results[REFERENCE]["summary"]
    rows = []
    for label, *_ in variants:
        r = results[label]
        if r is None:
            rows.append([label, "failed", *["-"] * 11])
            continue
        s = r["summary"]
        rows.append(
            [
                label,
                f"{1e3 * s['step_time_s']['p50']:.1f}",
                f"{s['step_time_s']['p50'] / ref['step_time_s']['p50']:.2f}x",
                pct(s["mfu"]),
                pct(s.get("hfu", s["mfu"])),
                mib(s["peak_memory_bytes"]),
                mib(s.get("activation_bytes")),
                mib(s.get("dense_state_bytes")),
                f"{dense_comm_ms(r):.1f}",
                f"{sparse_comm_ms(r):.1f}",
                f"{r['metrics']['imbalance_max_mean']:.3f}",
                pct(r["comm"]["exposed_comm_fraction"]),
            ]
        )
    first = results[REFERENCE]
    print(
        f"gembench ablate {first['config']['name']} on {args.nproc} ranks ({first['run']['dtype']}, "
        f"{first['env']['device_name']}): {args.steps} timed steps per variant, "
        f"MFU basis {first['peak']['basis_text']}; machine load {load_before}\n"
    )
    print(
        tabulate(
            rows,
            headers=[
                "variant",
                "step ms",
                "vs ddp",
                "MFU",
                "HFU",
                "peak MiB/rank",
                "activations MiB",
                "dense state MiB",
                "dense comm ms",
                "sparse comm ms",
                "imbalance",
                "exposed comm",
            ],
            colalign=("left",) + ("right",) * 11,
        )
    )
    print(
        "(peak: RSS per rank, largest; activations: saved for backward in one step; dense state: "
        "weights, gradients, Adam state on the largest rank; dense comm: the dense part's collectives per step; "
        "sparse comm: the tables' (IDs, embeddings, 2D's replica sync); imbalance: the measured embedding load, "
        "max/mean over ranks)"
    )
    for label, error in errors.items():
        if error:
            print(f"{label} failed: {error}")
    print()
    for line in goals(results):
        print(line)
    if args.out is not None:
        doc = {
            "schema": "gembench.ablation-ranks/1",
            "nproc": args.nproc,
            "machine_load": load_before,
            "variants": {
                label: None
                if r is None
                else {
                    "options": r["run"]["options"],
                    "summary": r["summary"],
                    "comm": {k: v for k, v in r["comm"].items() if k != "calls"},
                }
                for label, r in results.items()
            },
            "errors": {k: v for k, v in errors.items() if v},
        }
        write_or_fallback(args.out, json.loads(json.dumps(doc)))
        print(f"\nablation: {args.out}")
    return 0 if all(r is not None for r in results.values()) else 1


def goals(results: dict) -> list[str]:
    """The dense-side switches' goals beside what was measured (printed, not asserted: timings move
    with load)."""
    out = []
    ddp, fsdp = results.get(REFERENCE), results.get("dense_parallel=fsdp")
    if ddp and fsdp and ddp["summary"].get("dense_state_bytes") and fsdp["summary"].get("dense_state_bytes"):
        state = fsdp["summary"]["dense_state_bytes"] / ddp["summary"]["dense_state_bytes"]
        step = fsdp["summary"]["step_time_s"]["p50"] / ddp["summary"]["step_time_s"]["p50"] - 1
        out.append(
            f"goal FSDP: dense state per rank {state:.2f}x DDP's (goal <= 0.60: "
            f"{'met' if state <= 0.6 else 'NOT met'}); step time {step:+.1%} vs DDP (goal within 10%: "
            f"{'met' if abs(step) <= 0.10 else 'NOT met'})"
        )
    ac = results.get("activation_checkpointing=hstu")
    if ddp and ac and ddp["summary"].get("activation_bytes"):
        less = 1 - ac["summary"]["activation_bytes"] / ddp["summary"]["activation_bytes"]
        s = ac["summary"]
        recomputed = s["hfu"] / s["mfu"] - 1 if s.get("hfu") else 0.0  # executed / model FLOPs - 1
        out.append(
            f"goal checkpointing hstu: activation memory {less:.0%} lower (goal >= 30%: "
            f"{'met' if less >= 0.30 else 'NOT met'}); HFU - MFU = {pct_points(s)} "
            f"(the recomputed share, {recomputed:.1%} of the model FLOPs)"
        )
    fp8 = results.get("activation_dtype=fp8")
    if ddp and fp8:
        out += fp8_goal(ddp["summary"], fp8["summary"])
    for label, switches, _ in RANK_VARIANTS:
        if ddp and "sparse_parallel=2d" in switches and results.get(label):
            out.append(two_d_line(ddp, results[label]))
    return out


def two_d_line(one: dict, two: dict) -> str:
    """2D against the 1-D plan: its layout, the loss level on the same batches, imbalance and comm."""
    import numpy as np

    sparse = two["run"]["sparse_parallel"]
    level = np.mean(two["samples"]["loss"]) / np.mean(one["samples"]["loss"]) - 1
    sync = two["comm"]["by_kind"].get("embedding_replica_sync", {})
    merge = two["run"]["options"].get("replica_merge", "average")
    imbalance = [r["metrics"]["imbalance_max_mean"] for r in (two, one)]
    return (
        f"2D ({merge}): {len(sparse['groups'])} groups of {sparse['sharding_group']} ranks; rank 0's loss level "
        f"{level:+.2%} of 1-D's (bf16's relative tolerance: 1.6%); imbalance {imbalance[0]:.3f} vs "
        f"{imbalance[1]:.3f}; replica sync {1e3 * sync.get('time_s', 0.0):.1f} ms, "
        f"{sync.get('bytes', 0) / 2**20:.1f} MiB a rank every {sparse['replica_sync_every']} step(s)"
    )


# FP8 activations' goals against the stack saving as computed (benchmarks/fp8_activations.py too)
FP8_MEMORY_GOAL = 0.40  # at least this much less activation memory
FP8_TIME_GOAL = 0.10  # at most this much slower a step


def fp8_goal(reference: dict, fp8: dict) -> list[str]:
    """FP8 activations against the stack that saves them as computed: memory and step time."""
    if not reference.get("activation_bytes"):
        return []
    less = 1 - fp8["activation_bytes"] / reference["activation_bytes"]
    slower = fp8["step_time_s"]["p50"] / reference["step_time_s"]["p50"] - 1
    return [
        f"goal FP8 activations: activation memory {less:.0%} lower (goal >= {FP8_MEMORY_GOAL:.0%}: "
        f"{'met' if less >= FP8_MEMORY_GOAL else 'NOT met'}); step time {slower:+.1%} (goal <= "
        f"+{FP8_TIME_GOAL:.0%}: {'met' if slower <= FP8_TIME_GOAL else 'NOT met'}; the loss drift: "
        "benchmarks/fp8_activations.py)"
    ]


def pct_points(summary: dict) -> str:
    return f"{100 * (summary['hfu'] - summary['mfu']):.2f} points"
