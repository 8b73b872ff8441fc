"""Training stacks: precision, compilation, kernels and optimizers applied to a pure model.

The model modules know nothing of these; a stack wraps them from outside, as torchtitan does.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import asdict, dataclass

import torch

from gembench.harness.step import TrainState
from gembench.models.config import ModelConfig
from gembench.models.gem import build_model


@dataclass(frozen=True)
class StackOptions:
    """How a model is run. Each field is one switch that ``gembench ablate`` can flip."""

    bf16: bool = False  # autocast the dense arch to bf16 (weights and optimizer stay fp32)
    compile: bool = False  # torch.compile the dense arch
    jagged: bool = True  # jagged HSTU attention; False pads every sequence to the batch max

    @property
    def dtype(self) -> str:
        return "bf16" if self.bf16 else "fp32"

    def to_dict(self) -> dict:
        return asdict(self)


def embedding_parameters(model: torch.nn.Module) -> set[int]:
    return {id(p) for name, p in model.named_parameters() if "sparse_arch" in name}


def build_train_state(cfg: ModelConfig, options: StackOptions, device: torch.device,
                      seed: int = 0) -> TrainState:
    """Build the pure model from ``cfg`` with ``seed`` and apply ``options`` to it."""
    torch.manual_seed(seed)
    model = build_model(cfg, device, attention="jagged" if options.jagged else "padded")
    sparse_ids = embedding_parameters(model)
    sparse = [p for p in model.parameters() if id(p) in sparse_ids]
    dense = [p for p in model.parameters() if id(p) not in sparse_ids]
    optimizers = [
        torch.optim.Adagrad(sparse, lr=0.02),  # the embedding optimizer of DLRM-style training
        torch.optim.Adam(dense, lr=1e-3),
    ]
    if options.compile:
        model.dense = torch.compile(model.dense)
    if options.bf16:
        autocast = functools.partial(torch.autocast, device_type=device.type, dtype=torch.bfloat16)
    else:
        autocast = contextlib.nullcontext
    return TrainState(model=model, optimizers=optimizers, autocast=autocast, device=device)
