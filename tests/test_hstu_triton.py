"""The Triton HSTU attention kernels, run on CPU tensors by Triton's interpreter.

The interpreter executes the same kernel source as the GPU (TRITON_INTERPRET=1, which
tests/conftest.py sets before anything imports triton). Outputs and all four gradients are
compared with the padded reference evaluated in fp32 on the same input values, on ragged
batches: lengths 1, the maximum and between, an empty sequence, a non-power-of-two max_len,
clamped and unclamped rab buckets. Tolerance: max |kernel - reference| <= tol * max |reference|,
tol 1e-4 for fp32 and 2e-2 for bf16. Shapes are tiny: the interpreter runs every program in
numpy, one after the other.

If triton was imported compiled before these tests (a CPU session whose TRITON_INTERPRET was not
set early enough), the kernels cannot run here; one test then runs this file in a fresh process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from gembench.models.hstu import HSTULayer
from gembench.models.ops import hstu_attention as dispatcher
from gembench.models.ops.pytorch.hstu_attention import hstu_padded_attention
from gembench.models.ops.triton import hstu_attention as triton_op
from gembench.models.ops.triton.hstu_attention import triton_hstu_attention

CUDA = torch.cuda.is_available()
INTERPRETED = triton_op.TRITON_AVAILABLE and triton_op.interpreted()
DEVICE = "cuda" if CUDA and not INTERPRETED else "cpu"
in_process = pytest.mark.skipif(
    not (CUDA or INTERPRETED),
    reason="triton was imported compiled in this CPU process: test_in_fresh_interpreter_process runs these",
)
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def _offsets(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0).to(DEVICE)


def _inputs(lengths, heads, d_head, buckets, dtype, rab_dtype=None, seed=0, fused=False):
    """q, k, v (T, H, D) in dtype (views of one (T, 3 H D) projection if fused), rab (H, R)."""
    g = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    if fused:
        proj = torch.randn(T, 3 * heads * d_head, generator=g).to(DEVICE, dtype)
        q, k, v = (t.reshape(T, heads, d_head) for t in proj.split(heads * d_head, dim=-1))
    else:
        q, k, v = (torch.randn(T, heads, d_head, generator=g).to(DEVICE, dtype) for _ in range(3))
    rab = torch.randn(heads, buckets, generator=g).to(DEVICE, rab_dtype or dtype)
    return [t.detach().requires_grad_() for t in (q, k, v, rab)]


def _reference(q, k, v, rab, offsets, max_len, grad_out):
    """Padded reference in fp32 (fbgemm's padding has no fp64 kernel) on the same values:
    output and grads of q, k, v, rab."""
    xs = [t.detach().float().requires_grad_() for t in (q, k, v, rab)]
    out = hstu_padded_attention(*xs, offsets, max_len)
    grads = torch.autograd.grad(out, xs, grad_out.float())
    return out, grads


def _assert_rel(actual: torch.Tensor, expected: torch.Tensor, tol: float, what: str) -> None:
    err = (actual.double() - expected.double()).abs().max().item() if expected.numel() else 0.0
    scale = expected.abs().max().item() if expected.numel() else 0.0
    assert err <= tol * max(scale, 1e-12), f"{what}: max error {err:.3g} > {tol} x max |ref| {scale:.3g}"


def _check_against_reference(lengths, heads, d_head, buckets, dtype, rab_dtype=None, max_len=None, fused=False, seed=0):
    offsets = _offsets(lengths)
    max_len = max_len or max(lengths)
    q, k, v, rab = _inputs(lengths, heads, d_head, buckets, dtype, rab_dtype, seed, fused)
    out = triton_hstu_attention(q, k, v, rab, offsets, max_len)
    assert out.shape == v.shape and out.dtype == dtype
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1)).to(DEVICE, dtype)
    grads = torch.autograd.grad(out, [q, k, v, rab], grad_out)
    ref_out, ref_grads = _reference(q, k, v, rab, offsets, max(lengths), grad_out)
    tol = TOL[dtype]
    _assert_rel(out, ref_out, tol, "output")
    for name, x, grad, ref in zip("q k v rab".split(), (q, k, v, rab), grads, ref_grads):
        assert grad.dtype == x.dtype and grad.shape == x.shape, name
        _assert_rel(grad, ref, tol, f"grad {name}")


# lengths: 1, the maximum, between, a multiple of the tiles, an empty sequence; max_len never a
# power of two.
CASES = {
    "fp32-h1-d16-unclamped": dict(lengths=[1, 37, 0, 13], heads=1, d_head=16, buckets=37, dtype=torch.float32),
    "fp32-h3-d32-clamped": dict(lengths=[20, 1, 33, 0, 32, 7], heads=3, d_head=32, buckets=8, dtype=torch.float32),
    "fp32-h2-d64-fused-views": dict(
        lengths=[19, 1, 6], heads=2, d_head=64, buckets=19, dtype=torch.float32, fused=True
    ),
    "fp32-h4-d24-odd-head": dict(lengths=[1, 9, 0, 18], heads=4, d_head=24, buckets=18, dtype=torch.float32),
    "bf16-h2-d32": dict(lengths=[35, 1, 0, 12], heads=2, d_head=32, buckets=35, dtype=torch.bfloat16),
    "bf16-h4-d16-fp32-rab": dict(
        lengths=[1, 21, 9], heads=4, d_head=16, buckets=21, dtype=torch.bfloat16, rab_dtype=torch.float32
    ),
}


@in_process
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_matches_padded_reference(case):
    _check_against_reference(**case)


@in_process
def test_max_len_below_longest_sequence_is_still_exact():
    # The grid is sized from max_len without reading offsets; programs step through longer
    # sequences, so an underestimate costs speed, never correctness.
    _check_against_reference([30, 3, 17], heads=2, d_head=16, buckets=30, dtype=torch.float32, max_len=12)


@in_process
@pytest.mark.parametrize(
    "fwd_cfg,bwd_cfg",
    [
        ({"BLOCK_M": 32, "BLOCK_N": 16}, {"BLOCK": 32}),
        ({"BLOCK_M": 16, "BLOCK_N": 32}, {"BLOCK": 16}),
    ],
    ids=["m32n16-b32", "m16n32-b16"],
)
def test_other_tile_shapes(fwd_cfg, bwd_cfg):
    """The autotuned kernels with tile shapes other than the interpreter's default (BLOCK_M !=
    BLOCK_N, blocks longer than short sequences)."""
    kernels = pytest.importorskip("gembench.models.ops.triton.hstu_attention_kernels")
    lengths = [45, 1, 0, 20, 32]
    offsets = _offsets(lengths)
    q, k, v, rab = _inputs(lengths, heads=2, d_head=16, buckets=12, dtype=torch.float32)
    grad_out = torch.randn(v.shape, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    with torch.no_grad():
        with triton_op.interpreter_fixes():
            out = kernels.forward(q, k, v, rab, offsets, 45, config=fwd_cfg)
            grads = kernels.backward(grad_out, q, k, v, rab, offsets, 45, config=bwd_cfg)
    ref_out, ref_grads = _reference(q, k, v, rab, offsets, 45, grad_out)
    _assert_rel(out, ref_out, 1e-4, "output")
    for name, grad, ref in zip("q k v rab".split(), grads, ref_grads):
        _assert_rel(grad, ref, 1e-4, f"grad {name}")


@in_process
def test_different_qk_and_v_head_dims():
    # The padded reference needs one head dim, so this checks the definition directly.
    lengths, H, R = [5, 1, 11], 2, 6
    offsets = _offsets(lengths)
    g = torch.Generator().manual_seed(3)
    q, k = (torch.randn(sum(lengths), H, 16, generator=g).to(DEVICE) for _ in range(2))
    v = torch.randn(sum(lengths), H, 32, generator=g).to(DEVICE)
    rab = torch.randn(H, R, generator=g).to(DEVICE)
    out = triton_hstu_attention(q, k, v, rab, offsets, 11)
    start = 0
    for n in lengths:
        i = torch.arange(n, device=DEVICE)
        bias = rab[:, (i[:, None] - i[None, :]).clamp(0, R - 1)]
        s = torch.einsum("ihd,jhd->hij", q[start : start + n], k[start : start + n]) + bias
        a = torch.nn.functional.silu(s).tril() / n
        _assert_rel(out[start : start + n], torch.einsum("hij,jhd->ihd", a, v[start : start + n]).double(), 1e-4, "out")
        start += n


@in_process
def test_flops_registered_like_the_tiled_op():
    lengths = [7, 1, 12]
    offsets = _offsets(lengths)
    q, k, v, rab = _inputs(lengths, heads=2, d_head=16, buckets=12, dtype=torch.float32)
    with FlopCounterMode(display=False) as counter:
        triton_hstu_attention(q, k, v, rab, offsets, 12).sum().backward()
    by_op = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    model = 2 * (16 + 16) * sum(n * n for n in lengths)  # H (d_qk + d_v) sum n^2
    assert by_op["gembench.triton_hstu_attention"] == model
    assert by_op["gembench.triton_hstu_attention_bwd"] == 2 * model


@in_process
def test_opcheck():
    """Schema, fake (meta) implementation and autograd registration agree with the kernels, so
    torch.compile can trace through the op."""
    lengths = [3, 1, 6]
    args = (*(t.detach().requires_grad_() for t in _inputs(lengths, 1, 16, 6, torch.float32)), _offsets(lengths), 6)
    torch.library.opcheck(
        torch.ops.gembench.triton_hstu_attention.default,
        args,
        test_utils=("test_schema", "test_faketensor", "test_autograd_registration"),
    )


@in_process
def test_layer_with_triton_backend_matches_tiled(monkeypatch):
    """HSTULayer through the dispatcher with the Triton backend forced (as on CUDA) against the
    same layer on the tiled op: same output and parameter gradients (rab reaches the kernel in
    fp32 as the parameter is, without a cast)."""
    lengths = [9, 1, 0, 14]
    offsets = _offsets(lengths)
    torch.manual_seed(0)
    layer = HSTULayer(dim=32, heads=2, max_len=15).to(DEVICE)
    x = torch.randn(sum(lengths), 32, device=DEVICE)

    def run(backend):
        monkeypatch.setattr(dispatcher, "select_backend", lambda kernel, device: backend)
        layer.zero_grad()
        y = layer(x, offsets, 15)
        y.square().sum().backward()
        return y.detach(), {n: p.grad.clone() for n, p in layer.named_parameters()}

    y_tiled, g_tiled = run("tiled")
    y_triton, g_triton = run("triton")
    _assert_rel(y_triton, y_tiled.double(), 1e-4, "layer output")
    for name in g_tiled:
        _assert_rel(g_triton[name], g_tiled[name].double(), 1e-4, f"grad {name}")


def test_bad_inputs_are_named():
    # Checked from shapes and dtypes alone (no device read), before any kernel runs.
    q = torch.zeros(5, 2, 16)
    off = torch.tensor([0, 5])
    with pytest.raises(ValueError, match="one dtype"):
        triton_hstu_attention(q, q, q.double(), torch.zeros(2, 4), off, 5)
    with pytest.raises(ValueError, match="rab must be"):
        triton_hstu_attention(q, q, q, torch.zeros(3, 4), off, 5)
    with pytest.raises(ValueError, match="offsets must be"):
        triton_hstu_attention(q, q, q, torch.zeros(2, 4), off.float(), 5)


# ------------------------------------------------------------------------------- dispatcher


def test_dispatcher_selection():
    assert dispatcher.select_backend("jagged", "cpu") == "tiled"
    assert dispatcher.select_backend("padded", "cpu") == "padded"
    assert dispatcher.select_backend("padded", "cuda") == "padded"
    assert dispatcher.select_backend("jagged", "cuda", triton_available=True) == "triton"
    assert dispatcher.select_backend("jagged", torch.device("cuda", 1), triton_available=True) == "triton"
    with pytest.warns(UserWarning, match="triton is not installed"):
        assert dispatcher.select_backend("jagged", "cuda", triton_available=False) == "tiled"
    with pytest.raises(ValueError, match="jagged, padded"):
        dispatcher.select_backend("dense", "cpu")


@pytest.mark.parametrize("attention,expected", [("jagged", "tiled"), ("padded", "padded")])
def test_layer_routes_through_dispatcher_on_cpu(monkeypatch, attention, expected):
    called = []
    for name, backend in (
        ("hstu_jagged_attention", "tiled"),
        ("hstu_padded_attention", "padded"),
        ("triton_hstu_attention", "triton"),
    ):
        real = getattr(dispatcher, name)
        monkeypatch.setattr(dispatcher, name, lambda *a, _r=real, _b=backend: called.append(_b) or _r(*a))
    layer = HSTULayer(dim=16, heads=2, max_len=8, attention=attention)
    offsets = torch.tensor([0, 3, 8])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning on CPU
        layer(torch.randn(8, 16), offsets, 8)
    assert called == [expected]


# ------------------------------------------------------------------------------- sm_90


def _ptxas() -> bool:
    try:
        import triton
    except ImportError:
        return False
    return os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas"))


@pytest.mark.skipif(not _ptxas(), reason="triton wheel without ptxas")
def test_kernels_compile_for_sm90():
    """What the interpreter does not check (layouts, dot shapes, gather lowering): the first
    autotune config of each kernel is lowered to an sm_90 cubin, in a process without the
    interpreter, with a head dim that needs masked columns."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "attention_sm90_compile.py")
    proc = subprocess.run(
        [sys.executable, script, "--first", "--head-dim", "24"], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "hstu_fwd_kernel" in proc.stdout and "hstu_bwd_kernel" in proc.stdout


# ------------------------------------------------------------------------------- fallback


@pytest.mark.skipif(CUDA or INTERPRETED, reason="the kernels run in this process")
def test_in_fresh_interpreter_process():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and " failed" not in proc.stdout
