"""Every shipped config's model lands wholly on the device it is built for.

Built on `meta` (no memory, so large and xl too): a parameter, buffer or plain tensor attribute
left on another device is what crashes a CUDA run ("mat2 is on cpu" in TorchRec's CrossNet).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gembench.models.config import known_configs, load_config
from gembench.models.gem import build_model


def tensors_of(module: nn.Module):
    """(name, tensor) for every parameter, buffer and plain tensor attribute, also in lists/dicts."""
    yield from module.named_parameters()
    yield from module.named_buffers()
    for prefix, sub in module.named_modules():
        for attr, value in vars(sub).items():
            if attr.startswith("_"):
                continue  # _parameters/_buffers/_modules: covered above
            items = (
                value.items()
                if isinstance(value, dict)
                else enumerate(value)
                if isinstance(value, (list, tuple))
                else [(None, value)]
            )
            for key, item in items:
                if isinstance(item, torch.Tensor):
                    yield (f"{prefix}.{attr}" if prefix else attr) + ("" if key is None else f"[{key!r}]"), item


def off_device(model: nn.Module, device: str) -> list[str]:
    return [f"{name} on {t.device}" for name, t in tensors_of(model) if t.device.type != device]


@pytest.mark.parametrize("name", known_configs())
@pytest.mark.parametrize("attention", ["jagged", "padded"])
def test_model_is_built_wholly_on_the_meta_device(name, attention):
    cfg = load_config(name)
    model = build_model(cfg, device="meta", attention=attention)
    assert sum(1 for _ in tensors_of(model)) > 0
    assert off_device(model, "meta") == []


def test_the_check_sees_plain_tensor_attributes():
    model = nn.Linear(2, 2, device="meta")
    model.kernels = [torch.zeros(2)]  # a list of tensors: .to() would not move it
    assert off_device(model, "meta") == ["kernels[0] on cpu"]
