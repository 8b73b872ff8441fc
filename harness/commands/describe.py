"""Sizes, FLOPs and memory of a model (a config, or your --model), computed without running it.

Works for every tier, including `large` and `xl` that no laptop can run: the model is built on
the meta device (no memory), and a config's FLOPs per example use a large seeded sample of
sequence lengths (HSTU attention grows with E[n^2], not E[n]^2). A workload without a FLOPs
formula is counted by FlopCounterMode over one forward of its batch 0 on CPU (the one thing here
that runs a model).

examples:
  gembench describe                       # small
  gembench describe --config xl
  gembench describe --config dcnv2 --json
  gembench describe --config medium --batch 512   # sizes and memory at another global batch
  gembench describe --config dlrmv4-mlperf        # + its FLOPs reconciled with MLPerf's 315.7
  gembench describe --model examples/two_tower.py:two_tower

The memory table is the estimate `gembench run` checks before allocating (the workload's own,
the zoo's models/memory.py, else from its parameter shapes), per stack, for one process on
--memory-device (default: a CUDA device where this host has one, else the CPU):
embeddings (tables + Adagrad state, + dense gradients without fused embeddings), dense (weights,
gradients, Adam state), activations saved for backward, the largest transient block, and build
(the moment fused tables are built next to the plain ones). total = max(build, the rest
summed): the peak torch.cuda.max_memory_allocated should show. On CPU a run adds its runtime's
growth (docs/configs.md, "Batch size and the memory estimate"). Then what the model tells of
itself beyond the protocol (details()): a config's content, and for a config with a [reference]
(a published FLOPs count) the reconciliation of gembench's training FLOPs per example with it,
one convention at a time, and the residual left.
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
    p.add_argument(
        "--memory-device",
        choices=("cpu", "cuda"),
        default=None,
        help="the device the memory tables estimate for (default: cuda where this host has one, else cpu)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


def describe(workload, device_type: str = "cuda") -> dict:
    """A workload's sizes, FLOPs per example and block, and memory estimates, from the protocol:
    tables and parameters from the meta build; FLOPs from flops_per_example(), else its batch
    formula, else counted; memory by stack and by switch (memory_estimate) on ``device_type``."""
    from dataclasses import replace

    import torch
    from torchrec import EmbeddingBagConfig

    from gembench.harness.metrics.mfu import TRAIN_FLOPS_PER_FORWARD
    from gembench.harness.train.memory import activations_estimated, memory_estimate, parameter_shapes
    from gembench.harness.train.stack import STACKS
    from gembench.harness.train.work import flops_per_example
    from gembench.harness.train.workloads import identity

    meta = workload.build(torch.device("meta"))
    counts = parameter_shapes(workload, meta)
    ident = identity(workload, meta=meta)
    per_example, basis = flops_per_example(workload)
    forward = sum(per_example.values())
    batch = workload.global_batch
    opt, n = STACKS["optimized"], SWITCH_RANKS

    def estimate(options, batch=batch, shards=1, share=1.0):
        return memory_estimate(workload.for_stack(options), counts, batch, options, device_type, shards, share)

    cells = [
        (f"activation_checkpointing={mode}", replace(opt, activation_checkpointing=mode), batch, 1, 1.0)
        for mode in ("hstu", "all")
        if workload.checkpointed(mode)
    ]
    cells += [
        (f"ddp, per rank of {n}", opt, max(1, batch // n), 1, 1 / n),
        (f"fsdp, per rank of {n}", replace(opt, dense_parallel="fsdp"), max(1, batch // n), n, 1 / n),
    ]
    if workload.checkpointed("hstu"):
        both = replace(opt, dense_parallel="fsdp", activation_checkpointing="hstu")
        cells.append((f"fsdp + hstu, per rank of {n}", both, max(1, batch // n), n, 1 / n))
    return {
        "config": workload.name,
        "kind": workload.kind,
        "description": workload.description or (type(workload).__doc__ or "").strip().split("\n")[0],
        "hash": ident.hash,
        "source": ident.source,
        "global_batch": batch,
        "tables": [
            {
                "name": t.name,
                "rows": t.num_embeddings,
                "dim": t.embedding_dim,
                "features": list(t.feature_names),
                "pooled": isinstance(t, EmbeddingBagConfig),
            }
            for t in workload.tables()
        ],
        **counts,
        "embedding_bytes_fp32": counts["embedding_params"] * 4,
        "flops_basis": basis,
        "forward_flops_per_example": per_example,
        "block_params": {name: sum(p.numel() for p in c.parameters()) for name, c in meta.named_children()},
        "forward_gflop_per_example": forward / 1e9,
        "train_flops_per_step": TRAIN_FLOPS_PER_FORWARD * forward * batch,
        "memory_device": device_type,
        "memory_estimate_bytes": estimate(opt),
        "memory_estimate_bytes_by_stack": {name: estimate(options) for name, options in STACKS.items()},
        # the optimized stack with each switch of GEM's dense side (harness/train/parallelize.py);
        # per rank of SWITCH_RANKS for the data-parallel ones: the batch, the tables and (fsdp)
        # the dense state split over them
        "memory_estimate_bytes_by_switch": {
            label: estimate(options, b, shards, share) for label, options, b, shards, share in cells
        },
        "activations_estimated": activations_estimated(workload),
        "details": workload.details(),
    }


SWITCH_RANKS = 8  # one node of GPUs
ONE = {"cuda": "one CUDA device", "cpu": "one process on this CPU host, its runtime included"}


def main(args: argparse.Namespace) -> int:
    import torch
    from tabulate import tabulate

    from gembench.harness.report.numbers import si
    from gembench.harness.train.workloads import workload_of

    device = args.memory_device or ("cuda" if torch.cuda.is_available() else "cpu")
    d = describe(workload_of(args.config, args.model, args.model_args, args.batch), device)
    if args.json:
        print(json.dumps(d, indent=1))
        return 0
    print(f"{d['config']} ({d['kind']}): {d['description']}\n{d['source']}  hash {d['hash']}\n")
    pooled = sum(t["pooled"] for t in d["tables"])
    sizes = [
        ["pooled tables / sequences", f"{pooled} / {len(d['tables']) - pooled}"],
        ["embedding rows", f"{d['embedding_rows']:,}"],
        ["embedding parameters", f"{d['embedding_params']:,} ({si(d['embedding_bytes_fp32'], 'B')} fp32)"],
        ["dense parameters", f"{d['dense_params']:,}"],
        ["global batch", f"{d['global_batch']:,}"],
        ["forward per example", f"{d['forward_gflop_per_example']:.4g} GFLOP ({d['flops_basis']})"],
        ["training per step", si(d["train_flops_per_step"], "FLOP")],
    ]
    print(tabulate(sizes, tablefmt="plain"))
    total = sum(d["forward_flops_per_example"].values()) or 1.0
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
    what = "estimate" if d["activations_estimated"] else "estimate from parameter shapes; activations not estimated"
    print(
        "\n"
        + tabulate(
            rows,
            headers=[f"peak training memory, GiB ({what}, {ONE[d['memory_device']]})", *by_stack],
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
    for title, section in d["details"].items():
        print("\n" + details_text(title, section))
    return 0


def details_text(title: str, section: dict) -> str:
    """One section of a workload's details() as a table, its title the first column's header."""
    from tabulate import tabulate

    headers = [title, *section["headers"][1:]]
    text = tabulate(
        section["rows"],
        headers=headers,
        colalign=("left",) + ("right",) * (len(headers) - 1),
        disable_numparse=True,
    )
    return text + (f"\n{section['note']}" if section.get("note") else "")
