"""Analytic model FLOPs next to what torch's FlopCounterMode counts, per config.

The analytic figures are the formulas of docs/design.md section 2 evaluated on the batch's real
jagged lengths (models/flops.py); the counter sees every GEMM the model executes, plus the
formulas gembench registers for the ops it would count as 0 (the HSTU jagged-attention custom
op: its model FLOPs; fbgemm jagged bmm: their GEMM FLOPs). Training = forward + backward.

The first table's ratio is therefore NOT independent for those blocks: their registered formulas
are the analytic ones. The second table checks them independently (harness/metrics/flopcheck.py):
on sequences of equal length, HSTU attention's padded path and a dense PMA summary run as plain
aten matmuls counted by torch's own formulas; the full-square attention must count exactly 2x the
causal model FLOPs, the dense PMA summary exactly its analytic FLOPs.

  python benchmarks/flops_crosscheck.py              # tiny small dcnv2
  python benchmarks/flops_crosscheck.py dlrm medium  # any configs (medium: minutes on a CPU)
  BATCH=1 python benchmarks/flops_crosscheck.py dlrmv4-mlperf   # a batch of 1 at 4,095 tokens

Configs run as on CPU (tables capped at sparse.cpu_rows_cap), at the config's global batch or BATCH.
"""

import os
import sys

import torch
from tabulate import tabulate
from torch.utils.flop_counter import FlopCounterMode

from gembench.harness.metrics.mfu import train_flops
from gembench.harness.report.numbers import si
from gembench.models.config import for_device, load_config, with_global_batch
from gembench.models.data import SyntheticData
from gembench.models.flopcheck import hstu_attention_check, summary_check
from gembench.models.flops import batch_forward_flops
from gembench.models.gem import build_model
from gembench.models.heads import multitask_loss


def _config(name: str):
    batch = os.environ.get("BATCH")
    return for_device(with_global_batch(load_config(name), int(batch) if batch else None), "cpu")


def crosscheck(name: str) -> tuple[list, list]:
    """(the whole model's row, one row per content block): analytic against counted FLOPs."""
    cfg = _config(name)
    torch.manual_seed(0)
    model = build_model(cfg)
    batch = SyntheticData(cfg, seed=0).batch(0)
    with FlopCounterMode(display=False) as forward:
        model(batch)
    with FlopCounterMode(display=False) as train:
        multitask_loss(model(batch), batch.labels).backward()
    blocks = batch_forward_flops(cfg, batch)
    analytic = sum(blocks.values())
    f, t = forward.get_total_flops(), train.get_total_flops()
    # the content blocks are plain Linear layers: torch's own GEMM formulas count them (independent)
    counts = forward.get_flop_counts()
    modules = {
        "content_arch": ["GEM.content_arch"],
        "item_content": [f"GEM.item_content.{s.name}" for s in cfg.sequences],
    }
    content = [
        [name, block, si(blocks[block], "FLOP"), si(c, "FLOP"), f"{c / blocks[block]:.4f}"]
        for block, names in modules.items()
        if blocks.get(block)
        for c in [sum(sum(counts.get(m, {}).values()) for m in names)]
    ]
    return (
        [
            name,
            si(analytic, "FLOP"),
            si(f, "FLOP"),
            f"{f / analytic:.4f}",
            si(train_flops(analytic), "FLOP"),
            si(t, "FLOP"),
            f"{t / train_flops(analytic):.4f}",
        ],
        content,
    )


def independent_rows(name: str, batch: int = 4, longest: int = 1024) -> list:
    """Attention blocks on ``batch`` sequences of the config's max length (at most ``longest``:
    the padded path holds B x H x n^2 scores), counted natively."""
    cfg = _config(name)
    if cfg.kind != "gem" or not cfg.sequences:
        return []
    n, h, x = min(cfg.sequences[0].max_len, longest), cfg.hstu, cfg.cross
    rows = []
    for backward in (False, True):
        a = hstu_attention_check(batch, n, h.dim, h.heads, backward=backward, rab=h.rab)
        rows.append(
            [
                name,
                f"HSTU attention, {'training' if backward else 'forward'}",
                f"{batch} x {n}",
                si(a["analytic"], "FLOP"),
                f"{a['jagged'] / a['analytic']:.4f}",
                si(a["padded"], "FLOP"),
                f"{a['padded'] / (2 * a['analytic']):.4f}",
            ]
        )
        if x is None:  # no summaries ([candidate] configs)
            continue
        p = summary_check(batch, n + 1, h.dim, cfg.sparse.dim, x.pma_seeds, x.recent, h.heads, backward=backward)
        rows.append(
            [
                name,
                f"PMA summary, {'training' if backward else 'forward'}",
                f"{batch} x {n + 1}",
                si(p["analytic"], "FLOP"),
                f"{p['jagged'] / p['analytic']:.4f}",
                si(p["dense"], "FLOP"),
                f"{p['dense'] / p['analytic']:.4f}",
            ]
        )
    return rows


def main(names: list[str]) -> None:
    checked = [crosscheck(n) for n in names]
    rows = [whole for whole, _ in checked]
    print(
        tabulate(
            rows,
            headers=[
                "config",
                "forward analytic",
                "forward counted",
                "ratio",
                "train analytic (3x)",
                "train counted",
                "ratio",
            ],
            colalign=("left",) + ("right",) * 6,
            disable_numparse=True,
        )
    )
    print(
        "\n(for HSTU attention and the PMA summary the counted side above is gembench's registered "
        "formula, the analytic one again: not independent)\n"
    )
    rows = [r for n in names for r in independent_rows(n)]
    print(
        tabulate(
            rows,
            headers=[
                "config",
                "block (equal lengths)",
                "B x n",
                "analytic",
                "registered/analytic (circular)",
                "aten counted (independent)",
                "independent ratio",
            ],
            colalign=("left", "left", "right", "right", "right", "right", "right"),
            disable_numparse=True,
        )
    )
    print(
        "independent ratio: HSTU = padded full-square count / (2 x causal analytic); "
        "PMA = dense count / analytic. 1.0000 = the analytic count is right."
    )
    content = [row for _, rows in checked for row in rows]
    if content:
        print("\nthe ad's content (configs with [content]), forward, counted by torch's GEMM formulas (independent):")
        print(
            tabulate(
                content,
                headers=["config", "block", "analytic", "counted", "ratio"],
                colalign=("left", "left", "right", "right", "right"),
                disable_numparse=True,
            )
        )


if __name__ == "__main__":
    main(sys.argv[1:] or ["tiny", "small", "dcnv2"])
