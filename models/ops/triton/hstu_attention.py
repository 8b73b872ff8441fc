"""``gembench::triton_hstu_attention``: the Triton kernel pair as a differentiable custom op.

One public entry point, :func:`triton_hstu_attention` (re-exported by ``gembench.models.hstu``).
It is a ``torch.library`` custom op with ``register_autograd``, so ``torch.compile`` keeps it as
one opaque call and ``FlopCounterMode`` counts the same model FLOPs as the tiled op.

CUDA tensors run the compiled kernels. CPU tensors run the same kernels through Triton's
interpreter, in a process started with ``TRITON_INTERPRET=1`` (Triton fixes compiled vs
interpreted when ``triton.jit`` decorates a function, its own library included, so the variable
must be set before triton is first imported: tests/conftest.py does so on machines without CUDA).
That path is for tests only (slow); the dispatcher sends CPU tensors to the tiled PyTorch op.

triton is imported on first use, so the model imports on machines without it.
"""

from __future__ import annotations

import contextlib
import importlib.util

import torch

from gembench.models.ops.flops import register_attention_flops

TRITON_AVAILABLE = importlib.util.find_spec("triton") is not None


@contextlib.contextmanager
def interpreter_fixes():
    """Two gaps of Triton 3.6's interpreter, patched for the duration of an interpreted call.

    * Loop bounds that are kernel scalars (``range(0, n, BLOCK)``): the interpreter holds scalars
      as shape-(1,) numpy arrays and gives tensors ``__index__ = int(array)``, which numpy >= 2.4
      refuses for 1-D arrays; ``__index__`` takes the single element instead.
    * ``tl.dot`` of bf16 tiles: the interpreter stores bf16 as uint16 bit patterns and multiplies
      those integers; the operands are widened to fp32 first (exact, as the GPU's bf16 MMA with
      fp32 accumulation). Every other bf16 step (loads, casts, stores) is the interpreter's own.
    The compiled GPU path never comes here.
    """
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    patch_tensor = getattr(interpreter, "_patch_lang_tensor", None)
    builder = getattr(interpreter, "InterpreterBuilder", None)
    create_dot = getattr(builder, "create_dot", None)
    convert = getattr(interpreter, "_convert_float", None)

    def patched_tensor(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    def widened(handle):
        if handle.dtype.scalar != tl.bfloat16:
            return handle
        data = convert(handle.data, tl.bfloat16, tl.float32, None).view(np.float32)
        return interpreter.TensorHandle(data, tl.float32)

    def patched_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return create_dot(self, widened(a), widened(b), d, input_precision, max_num_imprecise_acc)

    if patch_tensor is not None:
        interpreter._patch_lang_tensor = patched_tensor
    if create_dot is not None and convert is not None:
        builder.create_dot = patched_dot
    try:
        yield
    finally:
        if patch_tensor is not None:
            interpreter._patch_lang_tensor = patch_tensor
        if create_dot is not None and convert is not None:
            builder.create_dot = create_dot


def interpreted() -> bool:
    """Whether this process runs Triton in its interpreter: TRITON_INTERPRET=1 was set before
    triton was first imported (its own library functions are decorated then, too)."""
    from triton.runtime.interpreter import InterpretedFunction

    from gembench.models.ops.triton import hstu_attention_kernels as kernels

    return kernels.INTERPRET and isinstance(kernels.tl.zeros, InterpretedFunction)


def run_kernels(name: str, device: torch.device, *args, **kwargs):
    """Calls launcher ``name`` ("forward"/"backward") of the kernels module."""
    if not TRITON_AVAILABLE:
        raise RuntimeError("triton_hstu_attention needs the triton package (scripts/setup.sh installs it)")
    from gembench.models.ops.triton import hstu_attention_kernels as kernels

    if device.type == "cuda" and not kernels.INTERPRET:
        return getattr(kernels, name)(*args, **kwargs)
    if not interpreted():
        raise RuntimeError(
            f"triton_hstu_attention on {device.type} tensors needs Triton's interpreter: set "
            "TRITON_INTERPRET=1 before anything imports triton (torchrec does; tests/conftest.py sets it)"
        )
    with interpreter_fixes():
        return getattr(kernels, name)(*args, **kwargs)


def _check(q, k, v, rab, offsets, max_len) -> None:
    # Shapes, dtypes and devices only: nothing here reads device memory.
    if q.dim() != 3 or k.shape != q.shape or v.dim() != 3 or v.shape[:2] != q.shape[:2]:
        raise ValueError(
            f"q, k must be (T, H, D_qk) and v (T, H, D_v); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"q, k, v must share one dtype of fp32/bf16/fp16; got {q.dtype}, {k.dtype}, {v.dtype}")
    if rab.dim() != 2 or rab.shape[0] != q.shape[1]:
        raise ValueError(f"rab must be (H={q.shape[1]}, R), R = 0 for no bias; got {tuple(rab.shape)}")
    if offsets.dim() != 1 or offsets.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"offsets must be a 1-D int64/int32 tensor; got {offsets.dtype} {tuple(offsets.shape)}")
    if len({t.device for t in (q, k, v, rab, offsets)}) != 1:
        raise ValueError("q, k, v, rab and offsets must be on one device")
    if not 1 <= q.shape[2] <= 256 or not 1 <= v.shape[2] <= 256:
        raise ValueError(f"head dims must be in 1..256; got {q.shape[2]}, {v.shape[2]}")
    if offsets.shape[0] - 1 > 65535:
        raise ValueError(f"at most 65535 sequences per call (grid axis 1); got {offsets.shape[0] - 1}")
    if max_len < 0:
        raise ValueError(f"max_len must be >= 0; got {max_len}")


@torch.library.custom_op("gembench::triton_hstu_attention", mutates_args=())
def triton_hstu_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rab: torch.Tensor, offsets: torch.Tensor, max_len: int
) -> torch.Tensor:
    """Jagged causal HSTU attention, fused in one Triton kernel (backward: one more kernel).

    Args:
        q, k: (T, H, D_qk); v: (T, H, D_v): jagged values, any strides with unit last stride
            (views of a fused projection need no copy). fp32, bf16 or fp16, one dtype.
        rab: (H, R) relative-position bias, any float dtype (read in fp32); bucket
            clamp(i - j, 0, R - 1); R = 0: no bias (kernels compiled without it). Its gradient
            comes back in its own dtype (fp32 for an fp32 parameter under autocast: no cast kernel).
        offsets: (B + 1,) int64 sequence boundaries, on the device of q.
        max_len: a bound of the sequence lengths (Python int: sizes the grid without reading
            offsets). A longer sequence is still exact, only slower.

    Returns:
        (T, H, D_v): per sequence of real length n, ``(SiLU(Q K^T + rab) / n, causal) @ V``.
    """
    _check(q, k, v, rab, offsets, max_len)
    return run_kernels("forward", q.device, q, k, v, rab, offsets, max_len)


@triton_hstu_attention.register_fake
def _(q, k, v, rab, offsets, max_len):
    return q.new_empty((q.shape[0], q.shape[1], v.shape[2]), dtype=v.dtype)


@torch.library.custom_op("gembench::triton_hstu_attention_bwd", mutates_args=())
def triton_hstu_attention_bwd(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rab: torch.Tensor,
    offsets: torch.Tensor,
    max_len: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward of :func:`triton_hstu_attention`: (grad_q, grad_k, grad_v, grad_rab)."""
    return run_kernels("backward", q.device, grad_out, q, k, v, rab, offsets, max_len)


@triton_hstu_attention_bwd.register_fake
def _(grad_out, q, k, v, rab, offsets, max_len):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), rab.new_empty(rab.shape))


def _setup_context(ctx, inputs, output):
    q, k, v, rab, offsets, max_len = inputs
    ctx.save_for_backward(q, k, v, rab, offsets)
    ctx.max_len = max_len


def _backward(ctx, grad_out):
    q, k, v, rab, offsets = ctx.saved_tensors
    gq, gk, gv, grab = triton_hstu_attention_bwd(grad_out, q, k, v, rab, offsets, ctx.max_len)
    return gq, gk, gv, grab, None, None


triton_hstu_attention.register_autograd(_backward, setup_context=_setup_context)
register_attention_flops(torch.ops.gembench.triton_hstu_attention, torch.ops.gembench.triton_hstu_attention_bwd)
