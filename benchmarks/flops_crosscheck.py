"""Analytic model FLOPs next to what torch's FlopCounterMode counts, per config.

The analytic figures are the formulas of DESIGN.md section 2 evaluated on the batch's real
jagged lengths (models/flops.py); the counter sees every GEMM the model executes, plus the
formulas gembench registers for the ops it would count as 0 (the HSTU jagged-attention custom
op: its model FLOPs; fbgemm jagged bmm: their GEMM FLOPs). Training = forward + backward.

  python benchmarks/flops_crosscheck.py              # tiny small dcnv2
  python benchmarks/flops_crosscheck.py dlrm medium  # any configs (medium: minutes on a CPU)
"""

import sys

import torch
from tabulate import tabulate
from torch.utils.flop_counter import FlopCounterMode

from gembench.harness.report import si
from gembench.models.config import load_config
from gembench.models.data import SyntheticData
from gembench.models.flops import batch_forward_flops
from gembench.models.gem import build_model
from gembench.models.heads import multitask_loss


def crosscheck(name: str) -> list:
    cfg = load_config(name)
    torch.manual_seed(0)
    model = build_model(cfg)
    batch = SyntheticData(cfg, seed=0).batch(0)
    with FlopCounterMode(display=False) as forward:
        model(batch)
    with FlopCounterMode(display=False) as train:
        multitask_loss(model(batch), batch.labels).backward()
    analytic = sum(batch_forward_flops(cfg, batch).values())
    f, t = forward.get_total_flops(), train.get_total_flops()
    return [name, si(analytic, "FLOP"), si(f, "FLOP"), f"{f / analytic:.4f}",
            si(3 * analytic, "FLOP"), si(t, "FLOP"), f"{t / (3 * analytic):.4f}"]


def main(names: list[str]) -> None:
    rows = [crosscheck(n) for n in names]
    print(tabulate(rows, headers=["config", "forward analytic", "forward counted", "ratio",
                                  "train analytic (3x)", "train counted", "ratio"],
                   colalign=("left",) + ("right",) * 6))


if __name__ == "__main__":
    main(sys.argv[1:] or ["tiny", "small", "dcnv2"])
