"""Sizes, FLOPs and memory of a configuration, computed without running it.

Works for every tier, including `large` and `xl` that no laptop can run: the model is built on
the meta device (no memory), and FLOPs per example use a large seeded sample of sequence
lengths (HSTU attention grows with E[n^2], not E[n]^2).

examples:
  gembench describe                       # small
  gembench describe --config xl
  gembench describe --config dcnv2 --json
  gembench describe --config medium --batch 512   # sizes and memory at another global batch
  gembench describe --config dlrmv4-mlperf        # + its FLOPs reconciled with MLPerf's 315.7

The memory table is the estimate `gembench run` checks before allocating (models/flops.py
memory_estimate), per stack, for one CUDA device: embeddings (tables + Adagrad state, + dense
gradients without fused embeddings), dense (weights, gradients, Adam state), activations saved
for backward, the largest transient block, and build (the moment fused tables are built next to
the plain ones). total = max(build, the rest summed): the peak torch.cuda.max_memory_allocated
should show. On CPU a run adds its runtime's growth (docs/configs.md, "Batch size and the memory
estimate"). A config with a [reference] (a published FLOPs count) gets a reconciliation table:
gembench's training FLOPs per example turned into the reference's one convention at a time, and
the residual left.
"""

from __future__ import annotations

import argparse
import json


def configure(p: argparse.ArgumentParser) -> None:
    from gembench.harness.commands.run import add_model_flags

    add_model_flags(p, "config name or path to a .toml file (default: small)")
    p.add_argument(
        "--batch",
        type=int,
        default=None,
        metavar="N",
        help="global batch, overriding the config's (changes the config hash)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


def describe(cfg) -> dict:
    from gembench.harness.metrics.mfu import TRAIN_FLOPS_PER_FORWARD
    from gembench.harness.train.stack import STACKS
    from gembench.models.flops import TRAIN_PER_FORWARD, forward_flops_per_example, reconcile_flops
    from gembench.models.memory import memory_estimate, parameter_counts

    assert TRAIN_PER_FORWARD == TRAIN_FLOPS_PER_FORWARD  # models' reconciliation counts as MFU does
    counts = parameter_counts(cfg)
    per_example = forward_flops_per_example(cfg)
    forward = sum(per_example.values())
    content = None
    if cfg.content is not None:
        c = cfg.content
        content = {
            "vectors": dict(zip(c.labels, c.vectors)),
            "tokens": c.tokens,
            "token_dim": c.token_dim,
            "sequence_dim": c.sequence_dim,
            "dtype": c.dtype,
            "interaction_tokens": c.candidate_tokens,
            "input_bytes_per_example": _content_bytes(cfg),
        }
    return {
        "config": cfg.name,
        "kind": cfg.kind,
        "description": cfg.description,
        "hash": cfg.hash,
        "source": cfg.source,
        "global_batch": cfg.data.global_batch,
        "tables": len(cfg.sparse.rows),
        "sequences": [s.name for s in cfg.sequences],
        **counts,
        "embedding_bytes_fp32": counts["embedding_params"] * 4,
        "forward_flops_per_example": per_example,
        "block_params": _block_params(cfg),
        "content": content,
        "forward_gflop_per_example": forward / 1e9,
        "train_flops_per_step": TRAIN_FLOPS_PER_FORWARD * forward * cfg.data.global_batch,
        "memory_estimate_bytes": memory_estimate(cfg, cfg.data.global_batch, counts, STACKS["optimized"]),
        "memory_estimate_bytes_by_stack": {
            name: memory_estimate(cfg, cfg.data.global_batch, counts, options, "cuda")
            for name, options in STACKS.items()
        },
        # the optimized stack with each switch of GEM's dense side (harness/train/parallelize.py);
        # per rank of SWITCH_RANKS for the data-parallel ones: the batch, the tables and (fsdp)
        # the dense state split over them
        "memory_estimate_bytes_by_switch": {
            label: memory_estimate(cfg, batch, counts, options, "cuda", shards=shards, embedding_share=share)
            for label, options, batch, shards, share in _switch_cells(cfg)
        },
        "flops_reconciliation": reconcile_flops(cfg) if cfg.reference is not None else None,
    }


def _block_params(cfg) -> dict[str, int]:
    """Parameters of each top-level block of the model (built on meta), by the block's name."""
    import torch

    from gembench.models.zoo import build_model

    with torch.device("meta"):
        model = build_model(cfg, device="meta")
    return {name: sum(p.numel() for p in child.parameters()) for name, child in model.named_children()}


def _content_bytes(cfg) -> float:
    """Content input bytes per example: candidate vectors and tokens, and every item's content
    over the expected sequence lengths."""
    from gembench.models.flops import expected_lengths
    from gembench.models.zoo import content_input_bytes

    items = sum(float(n.mean()) for n in expected_lengths(cfg, samples=4096).values())
    return content_input_bytes(cfg.content, 1, items)


SWITCH_RANKS = 8  # one node of GPUs


def _switch_cells(cfg):
    from dataclasses import replace

    from gembench.harness.train.stack import STACKS

    opt, n, batch = STACKS["optimized"], SWITCH_RANKS, cfg.data.global_batch
    return [
        ("activation_checkpointing=hstu", replace(opt, activation_checkpointing="hstu"), batch, 1, 1.0),
        ("activation_checkpointing=all", replace(opt, activation_checkpointing="all"), batch, 1, 1.0),
        (f"ddp, per rank of {n}", opt, max(1, batch // n), 1, 1 / n),
        (f"fsdp, per rank of {n}", replace(opt, dense_parallel="fsdp"), max(1, batch // n), n, 1 / n),
        (
            f"fsdp + hstu, per rank of {n}",
            replace(opt, dense_parallel="fsdp", activation_checkpointing="hstu"),
            max(1, batch // n),
            n,
            1 / n,
        ),
    ]


def main(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from gembench.harness.report.numbers import si
    from gembench.models.config import load_config, with_global_batch

    if args.model is not None:
        return _main_workload(args)
    d = describe(with_global_batch(load_config(args.config or "small"), args.batch))
    if args.json:
        print(json.dumps(d, indent=1))
        return 0
    print(f"{d['config']} ({d['kind']}): {d['description']}\n{d['source']}  hash {d['hash']}\n")
    sizes = [
        ["pooled tables / sequences", f"{d['tables']} / {len(d['sequences'])}"],
        ["embedding rows", f"{d['embedding_rows']:,}"],
        ["embedding parameters", f"{d['embedding_params']:,} ({si(d['embedding_bytes_fp32'], 'B')} fp32)"],
        ["dense parameters", f"{d['dense_params']:,}"],
        ["global batch", f"{d['global_batch']:,}"],
        ["forward per example", f"{d['forward_gflop_per_example']:.4g} GFLOP"],
        ["training per step", si(d["train_flops_per_step"], "FLOP")],
    ]
    c = d["content"]
    if c:
        sizes.append(
            [
                "content per candidate",
                ", ".join(f"{k} {v}" for k, v in c["vectors"].items())
                + (f", {c['tokens']} tokens x {c['token_dim']}" if c["tokens"] else "")
                + (f"; per sequence item {c['sequence_dim']}" if c["sequence_dim"] else "")
                + f" ({c['dtype']}): {si(c['input_bytes_per_example'], 'B')} input per example",
            ]
        )
    print(tabulate(sizes, tablefmt="plain"))
    total = sum(d["forward_flops_per_example"].values())
    params = d["block_params"]
    blocks = [
        [name, si(v, "FLOP"), f"{100 * v / total:.1f}%", f"{params[name]:,}" if name in params else ""]
        for name, v in d["forward_flops_per_example"].items()
    ]
    print(
        "\n"
        + tabulate(
            blocks,
            headers=["block", "forward/example", "share", "parameters"],
            colalign=("left", "right", "right", "right"),
        )
    )
    by_stack = d["memory_estimate_bytes_by_stack"]
    rows = [[k, *(f"{by_stack[name][k] / 2**30:,.2f}" for name in by_stack)] for k in by_stack["optimized"]]
    print(
        "\n"
        + tabulate(
            rows,
            headers=["peak training memory, GiB (estimate, one CUDA device)", *by_stack],
            colalign=("left", "right", "right"),
        )
    )
    by_switch = d["memory_estimate_bytes_by_switch"]
    keys = ["embeddings", "dense", "activations", "transient", "build", "total"]  # total = max(build, the rest)
    rows = [[label, *(f"{cells[k] / 2**30:,.3f}" for k in keys)] for label, cells in by_switch.items()]
    print(
        "\n"
        + tabulate(
            rows, headers=["optimized stack with (GiB, estimate)", *keys], colalign=("left",) + ("right",) * len(keys)
        )
    )
    if d["flops_reconciliation"]:
        print("\n" + reconciliation_text(d["flops_reconciliation"]))
    return 0


def describe_workload(workload) -> dict:
    """A workload's sizes, FLOPs and memory estimate: tables and parameters from its meta build;
    FLOPs per example from its formula, or counted by FlopCounterMode over one forward of batch 0
    on CPU (the one thing here that runs the model); memory per stack from parameter shapes."""
    import torch

    from gembench.harness.metrics.mfu import TRAIN_FLOPS_PER_FORWARD
    from gembench.harness.train import generic as G
    from gembench.harness.train.stack import STACKS

    batches, ident = G.prepared(workload, 0)
    counts = G.parameter_shapes(workload)
    formula = workload.forward_flops(batches[0])
    if formula is None:
        per_batch, basis = G.counted_flops(workload, G.seeded(workload, torch.device("cpu"), 0), batches[0]), "counted"
    else:
        per_batch, basis = formula, "formula"
    per_example = {k: float(v) / workload.global_batch for k, v in per_batch.items()}
    forward = sum(per_example.values())
    return {
        "config": workload.name,
        "kind": "workload",
        "description": type(workload).__doc__ or "",
        "hash": ident.hash,
        "source": workload.spec,
        "global_batch": workload.global_batch,
        "tables": [
            {"name": t.name, "rows": t.num_embeddings, "dim": t.embedding_dim, "features": list(t.feature_names)}
            for t in workload.tables()
        ],
        **counts,
        "embedding_bytes_fp32": counts["embedding_params"] * 4,
        "flops_basis": basis,
        "forward_flops_per_example": per_example,
        "forward_gflop_per_example": forward / 1e9,
        "train_flops_per_step": TRAIN_FLOPS_PER_FORWARD * forward * workload.global_batch,
        "memory_estimate_bytes_by_stack": {
            name: G.memory_estimate(counts, options, "cuda") for name, options in STACKS.items()
        },
    }


def _main_workload(args) -> int:
    from tabulate import tabulate

    from gembench.harness.report.numbers import si
    from gembench.workload import load_workload

    workload = load_workload(args.model, args.model_args)
    if args.batch is not None:
        workload.global_batch = args.batch
    d = describe_workload(workload)
    if args.json:
        print(json.dumps(d, indent=1))
        return 0
    print(f"{d['config']} (workload): {d['source']}  hash {d['hash']}\n")
    rows = [
        ["tables", f"{len(d['tables'])} ({sum(t['rows'] for t in d['tables']):,} rows)"],
        ["embedding parameters", f"{d['embedding_params']:,} ({si(d['embedding_bytes_fp32'], 'B')} fp32)"],
        ["dense parameters", f"{d['dense_params']:,}"],
        ["global batch", f"{d['global_batch']:,}"],
        ["forward per example", f"{d['forward_gflop_per_example']:.4g} GFLOP ({d['flops_basis']})"],
        ["training per step", si(d["train_flops_per_step"], "FLOP")],
    ]
    print(tabulate(rows, tablefmt="plain"))
    total = sum(d["forward_flops_per_example"].values()) or 1.0
    blocks = [[k, si(v, "FLOP"), f"{100 * v / total:.1f}%"] for k, v in d["forward_flops_per_example"].items()]
    print("\n" + tabulate(blocks, headers=["block", "forward/example", "share"], colalign=("left", "right", "right")))
    by_stack = d["memory_estimate_bytes_by_stack"]
    rows = [[k, *(f"{by_stack[n][k] / 2**30:,.3f}" for n in by_stack)] for k in by_stack["optimized"]]
    print("\n" + tabulate(rows, headers=["memory, GiB (estimate from parameter shapes; activations not)", *by_stack]))
    return 0


def reconciliation_text(r: dict) -> str:
    """The reconciliation of describe(cfg)["flops_reconciliation"] as two tables and a residual line."""
    from tabulate import tabulate

    rows = [[k, f"{a:,.3f}", f"{b:,.3f}", f"{a - b:+,.3f}"] for k, a, b in r["rows"]]
    ours, theirs = sum(a for _, a, _ in r["rows"]), sum(b for _, _, b in r["rows"])
    rows.append(["total", f"{ours:,.3f}", f"{theirs:,.3f}", f"{ours - theirs:+,.3f}"])
    parts = tabulate(
        rows,
        headers=[
            f"training GFLOP per example ({r['tokens']:,.0f} tokens)",
            "gembench",
            "reference's convention",
            "difference",
        ],
        colalign=("left", "right", "right", "right"),
        disable_numparse=True,
    )
    steps = tabulate(
        [[what, f"{v:,.3f}"] for what, v in r["steps"]],
        headers=["from gembench's count to the reference's", "GFLOP"],
        colalign=("left", "right"),
        disable_numparse=True,
    )
    residual = r["residual_gflop"]
    return (
        f"{parts}\n\n{steps}\n\nreconciled {r['reconciled_gflop']:,.2f} GFLOP per example vs "
        f"{r['published_gflop']:g} published ({r['published_in']}): residual {residual:+.3f} GFLOP "
        f"({100 * residual / r['published_gflop']:+.3f}%)"
    )
