"""FP8 activations: what autograd saves for the backward, stored as float8 and restored there.

GEM compresses the activations a step holds between its forward and its backward. Here that is a
pair of saved-tensor hooks (torch.autograd.graph.saved_tensors_hooks) entered around the forward,
from outside the model: each floating tensor autograd saves is stored as float8 e4m3 with one
fp32 scale per row (its last dimension in memory), and decompressed to its own dtype and strides
when the backward reads it. Left as they are: parameters and the casts autocast makes of them
(weights, not activations), integer tensors (indices, lengths), views that are not a permutation of
a whole tensor (a slice across rows, an expand), tensors under MIN_NUMEL elements and rows under
MIN_ROW elements (a layer norm's per-token statistics: one 4-byte scale per element or two would
hold more than the tensor, and quantizing them costs as much as a wide tensor's rows). A tensor
saved by several ops is compressed once.

The two conversions are compiled (one fused pass each way, shapes dynamic): eager they take
several memory passes and cost a large share of a CPU step.
"""

from __future__ import annotations

import contextlib
import functools
import weakref

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # e4m3fn's largest finite value
MIN_NUMEL = 4096
MIN_ROW = 16  # a row's fp32 scale at most a quarter of its float8 bytes
# the step's measure of what it saves (memory.SavedForBackward) while one is counting: saved-tensor
# hooks do not nest, so the hooks here report what they hold to it
counting = None


def _quantize(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    amax = rows.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12)
    return (rows * (FP8_MAX / amax)).to(FP8), amax / FP8_MAX


def _dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() * scale).to(dtype)


@functools.cache
def codec():
    """(quantize, dequantize), compiled once per process."""
    return torch.compile(_quantize, dynamic=True), torch.compile(_dequantize, dynamic=True)


def is_weight(t: torch.Tensor) -> bool:
    """A parameter, or autocast's cast of one (a copy whose only input is a leaf)."""
    if t.is_leaf:
        return t.requires_grad
    fn = t.grad_fn
    return fn is not None and type(fn).__name__ == "ToCopyBackward0" and _from_leaf(fn)


def _from_leaf(fn) -> bool:
    nexts = [f for f, _ in fn.next_functions if f is not None]
    return len(nexts) == 1 and type(nexts[0]).__name__ == "AccumulateGrad"


def memory_order(t: torch.Tensor) -> list[int] | None:
    """The dims of ``t`` from the outermost in memory, where ``t`` is a permutation of a contiguous
    tensor (a permuted view included); None for a slice across rows or an expanded view."""
    order = sorted(range(t.dim()), key=lambda d: -t.stride(d))
    return order if t.permute(order).is_contiguous() else None


class Packed:
    """A saved tensor as float8 rows and their scales, with what restores its shape, strides and
    dtype: quantized in its memory order, with no copy, and permuted back when restored (a
    compiled backward asserts the strides it saved)."""

    __slots__ = ("q", "scale", "shape", "order", "dtype")

    def __init__(self, t: torch.Tensor, order: list[int]):
        quantize, _ = codec()
        dense = t.permute(order)
        self.q, self.scale = quantize(dense.view(-1, dense.shape[-1]))
        self.shape, self.order, self.dtype = dense.shape, order, t.dtype

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q, self.scale

    def restore(self) -> torch.Tensor:
        _, dequantize = codec()
        t = dequantize(self.q, self.scale, self.dtype).view(self.shape)
        return t.permute(sorted(range(len(self.order)), key=self.order.__getitem__))


class Fp8Saves:
    """The hooks of one forward. ``counter`` (memory.SavedForBackward, when a step's saves are being
    measured) is told what is actually held: hooks do not nest, so it cannot see past these."""

    def __init__(self, counter=None):
        self.counter = counter
        self.seen: dict[tuple, tuple[weakref.ref, Packed]] = {}

    def compressible(self, t: torch.Tensor) -> list[int] | None:
        """The memory order to quantize ``t`` in, or None to keep it as it is."""
        if (
            t.is_floating_point()
            and t.dtype != FP8
            and t.dim() > 0
            and t.numel() >= MIN_NUMEL
            and t.layout == torch.strided
            and type(t) is torch.Tensor  # not a DTensor, fake or other subclass
            and not is_weight(t)
        ):
            order = memory_order(t)
            if order is not None and t.shape[order[-1]] >= MIN_ROW:
                return order
        return None

    def pack(self, t: torch.Tensor):
        order = self.compressible(t)
        if order is None:
            if self.counter is not None:
                self.counter.count(t)
            return t
        key = (t.data_ptr(), t.shape, t.stride(), t.dtype, t._version)
        hit = self.seen.get(key)
        if hit is not None and hit[0]() is t:
            return hit[1]
        packed = Packed(t.detach(), order)
        self.seen[key] = (weakref.ref(t), packed)
        if self.counter is not None:
            for part in packed.tensors():
                self.counter.count(part)
        return packed

    @staticmethod
    def unpack(saved):
        return saved.restore() if isinstance(saved, Packed) else saved


def saving(activation_dtype: str):
    """A context factory for the forward: ``fp8`` enters the hooks above (reporting to ``counting``
    where a step's saves are being measured), anything else nothing."""
    if activation_dtype != "fp8":
        return contextlib.nullcontext

    @contextlib.contextmanager
    def fp8_saves():
        hooks = Fp8Saves(counting)
        with torch.autograd.graph.saved_tensors_hooks(hooks.pack, hooks.unpack):
            yield

    return fp8_saves
