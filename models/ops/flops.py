"""Model FLOPs of the custom ops, registered with ``FlopCounterMode``.

FlopCounterMode counts 0 for a custom op it does not know. Every backend of HSTU attention
registers the same *model* FLOPs (real jagged lengths, causal half), whatever it executes, and the
padded jagged pool the FLOPs of its real rows, so the counted FLOPs and MFU do not depend on the
backend.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import flop_registry, register_flop_formula


def attention_model_flops(q: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor) -> int:
    """Forward model FLOPs H (d_qk + d_v) sum_i n_i^2 (needs real offsets, not fake ones; reads
    them on the host, which is fine: FlopCounterMode runs outside timed steps)."""
    lengths = (offsets[1:] - offsets[:-1]).to(torch.int64)
    heads = q.shape[1]
    return int(heads * (q.shape[2] + v.shape[2]) * int((lengths * lengths).sum()))


def register_model_flops(fwd, bwd, forward_flops) -> None:
    """Registers ``forward_flops(*args)`` for the forward op ``fwd(*args)`` and twice that for its
    backward ``bwd(grad_out, *args)`` (the gradients w.r.t. both operands of every matmul). Guarded
    so that a module reload does not register twice."""
    if fwd not in flop_registry:
        register_flop_formula(fwd, get_raw=True)(lambda *args, out_val=None, **kwargs: forward_flops(*args))
    if bwd not in flop_registry:
        register_flop_formula(bwd, get_raw=True)(
            lambda grad_out, *args, out_val=None, **kwargs: 2 * forward_flops(*args)
        )


def register_attention_flops(fwd, bwd) -> None:
    """Attention's pair: ``fwd(q, k, v, rab, offsets, ...)``, ``bwd(grad_out, q, k, v, rab, offsets, ...)``."""
    register_model_flops(fwd, bwd, lambda q, k, v, rab, offsets, *args: attention_model_flops(q, v, offsets))


def pool_model_flops(weights: torch.Tensor, values: torch.Tensor) -> int:
    """Forward FLOPs of per-segment ``weights^T values`` over the N real rows, (N, k) and (N, d):
    2 N k d."""
    return 2 * weights.shape[0] * weights.shape[1] * values.shape[1]


def register_pool_flops(fwd, bwd) -> None:
    """The padded pool's pair: ``fwd(weights, values, offsets, ...)``, ``bwd(grad_out, weights,
    values, offsets, ...)``: its real rows' FLOPs, however many padded rows it computes."""
    register_model_flops(fwd, bwd, lambda weights, values, *args: pool_model_flops(weights, values))


def register_fbgemm_pool_flops() -> None:
    """Registers fbgemm's jagged bmm ops, the pool's CUDA backend, with the same formula. Under
    autograd the counter sees the ``*_forward`` ops (fbgemm's autograd kernels call them, in
    backward too), so both names are registered: ``jagged_jagged_bmm(x, y, offsets, max_L)`` is
    the pool itself, ``jagged_dense_bmm(x, offsets, y, max_L)`` its values' gradient, per segment
    x (T, M) times y_b (M, N): 2 T M N."""
    fb = torch.ops.fbgemm

    def jagged_jagged(x_values, y_values, *args, out_val=None, **kwargs) -> int:
        return pool_model_flops(x_values, y_values)

    def jagged_dense(x_values, x_offsets, y, *args, out_val=None, **kwargs) -> int:
        return 2 * x_values.shape[0] * x_values.shape[1] * y.shape[-1]

    for name, fn in [
        ("jagged_jagged_bmm", jagged_jagged),
        ("jagged_jagged_bmm_forward", jagged_jagged),
        ("jagged_dense_bmm", jagged_dense),
        ("jagged_dense_bmm_forward", jagged_dense),
    ]:
        op = getattr(fb, name, None)
        if op is not None and op not in flop_registry:
            register_flop_formula(op, get_raw=True)(fn)
