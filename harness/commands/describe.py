"""Sizes, FLOPs and memory of a configuration, computed without running it.

Works for every tier, including `large` and `xl` that no laptop can run: the model is built on
the meta device (no memory), and FLOPs per example use a large seeded sample of sequence
lengths (HSTU attention grows with E[n^2], not E[n]^2).

examples:
  gembench describe                       # small
  gembench describe --config xl
  gembench describe --config dcnv2 --json
"""

from __future__ import annotations

import argparse
import json


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="small", help="config name or path to a .toml file (default: small)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


def describe(cfg) -> dict:
    from gembench.models.flops import TRAIN_FLOPS_PER_FORWARD, forward_flops_per_example, \
        memory_estimate, parameter_counts

    counts = parameter_counts(cfg)
    per_example = forward_flops_per_example(cfg)
    forward = sum(per_example.values())
    return {
        "config": cfg.name, "kind": cfg.kind, "description": cfg.description, "hash": cfg.hash,
        "source": cfg.source, "global_batch": cfg.data.global_batch,
        "tables": len(cfg.sparse.rows), "sequences": [s.name for s in cfg.sequences],
        **counts,
        "embedding_bytes_fp32": counts["embedding_params"] * 4,
        "forward_flops_per_example": per_example,
        "forward_gflop_per_example": forward / 1e9,
        "train_flops_per_step": TRAIN_FLOPS_PER_FORWARD * forward * cfg.data.global_batch,
        "memory_estimate_bytes": memory_estimate(cfg, cfg.data.global_batch, counts),
    }


def main(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from gembench.harness.report import si
    from gembench.models.config import load_config

    d = describe(load_config(args.config))
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
    print(tabulate(sizes, tablefmt="plain"))
    total = sum(d["forward_flops_per_example"].values())
    blocks = [[name, si(v, "FLOP"), f"{100 * v / total:.1f}%"]
              for name, v in d["forward_flops_per_example"].items()]
    print("\n" + tabulate(blocks, headers=["block", "forward/example", "share"], colalign=("left", "right", "right")))
    mem = d["memory_estimate_bytes"]
    rows = [[k, si(v, "B")] for k, v in mem.items()]
    print("\n" + tabulate(rows, headers=["training memory (estimate, fp32, one device)", ""]))
    return 0
