"""OverArch and TaskArch: the shared top MLP, one logit per task, and the training loss."""

from __future__ import annotations

import torch
from torch import nn
from torchrec.modules.mlp import MLP


class OverArch(nn.Module):
    """Shared MLP over the flattened interaction output, then one linear head per task.

    forward(x: (B, in_features)) -> logits (B, tasks). The task heads are the rows of one
    Linear(h, tasks): the same arithmetic as ``tasks`` separate Linear(h, 1) heads, in one GEMM.
    """

    def __init__(self, in_features: int, mlp: tuple[int, ...], tasks: int, device=None):
        super().__init__()
        self.shared = MLP(in_features, list(mlp), device=device) if mlp else nn.Identity()
        self.task_arch = nn.Linear(mlp[-1] if mlp else in_features, tasks, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.task_arch(self.shared(x))


def mlp_flops(in_features: int, widths) -> float:
    """Forward FLOPs per example of a chain of Linear layers: 2 * sum(in * out)."""
    total, prev = 0, in_features
    for w in widths:
        total += 2 * prev * w
        prev = w
    return float(total)


def over_arch_flops(in_features: int, mlp, tasks: int) -> float:
    return mlp_flops(in_features, list(mlp) + [tasks])


def multitask_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy over examples and tasks, computed in fp32 for stability."""
    return task_losses(logits, labels).mean()


def task_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-task binary cross-entropy: logits, labels (B, tasks) -> (tasks,), fp32.

    Their mean is ``multitask_loss`` (every task has B examples, so it is the mean over examples
    and tasks); kept apart so that a loss that turns non-finite can be traced to its task.
    """
    per_example = nn.functional.binary_cross_entropy_with_logits(logits.float(), labels.float(), reduction="none")
    return per_example.mean(dim=0)
