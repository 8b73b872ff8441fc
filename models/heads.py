"""OverArch and TaskArch: the shared top MLP, one logit per task, and the training loss."""

from __future__ import annotations

from typing import Sequence

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


class SwishLayerNorm(nn.Module):
    """``x * sigmoid(LN(x))``: the gated norm of generative-recommenders' MLPs (MLPerf DLRMv4)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.norm(x))


class SwishMLP(nn.Sequential):
    """Linear layers of ``widths``, a :class:`SwishLayerNorm` after each but the last, and a
    LayerNorm after the last when ``out_norm``: (N, in_features) -> (N, widths[-1])."""

    def __init__(self, in_features: int, widths: Sequence[int], out_norm: bool = True) -> None:
        layers: list[nn.Module] = []
        for i, w in enumerate(widths):
            layers.append(nn.Linear(in_features if i == 0 else widths[i - 1], w))
            layers.append(SwishLayerNorm(w) if i < len(widths) - 1 else nn.LayerNorm(w) if out_norm else nn.Identity())
        super().__init__(*layers)


class UserItemHead(nn.Module):
    """The [candidate] head (MLPerf DLRMv4's): ``SwishMLP(user * item)`` -> logits (B, tasks).

    forward(user (B, dim), item (B, dim)) -> (B, tasks): Linear layers of ``mlp`` then one to
    ``tasks``, a SwishLayerNorm between them, no norm on the logits.
    """

    def __init__(self, dim: int, mlp, tasks: int) -> None:
        super().__init__()
        self.mlp = SwishMLP(dim, [*mlp, tasks], out_norm=False)

    def forward(self, user: torch.Tensor, item: torch.Tensor) -> torch.Tensor:
        return self.mlp(user * item)


def user_item_head_flops(dim: int, mlp, tasks: int) -> float:
    """Forward FLOPs per example of :class:`UserItemHead`: its Linear layers (the product is elementwise)."""
    return mlp_flops(dim, [*mlp, tasks])


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
