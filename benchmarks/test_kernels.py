"""pytest-benchmark micro-benchmarks of the hot kernels: HSTU attention, Wukong FM, embedding lookup.

Sizes follow the `small` tier (docs/design.md section 3) so each kernel takes milliseconds on a CPU.
The project's pytest settings pass --benchmark-disable (each benchmark then runs once, as a test);
turn timing on with --benchmark-enable:

  pytest benchmarks/test_kernels.py --benchmark-enable --benchmark-autosave
  pytest benchmarks/test_kernels.py --benchmark-enable --benchmark-compare --benchmark-compare-fail=min:10%

asv imports every module of benchmarks/; nothing here runs on import and no name starts with an
asv prefix (time_, track_, mem_, peakmem_), so asv ignores this file.
"""

import math

import pytest
import torch

torch.manual_seed(0)


def _bench(benchmark, fn, *args):
    with torch.no_grad():
        out = benchmark(fn, *args)
    assert torch.isfinite(out).all()
    return out


# ----------------------------------------------------------------------------- HSTU attention


def _jagged(batch=32, mean=96, cap=256, heads=2, head_dim=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.clamp(torch.exp(math.log(mean) + 0.5 * torch.randn(batch, generator=g)).long(), 1, cap)
    offsets = torch.zeros(batch + 1, dtype=torch.long)
    offsets[1:] = torch.cumsum(lengths, 0)
    T = int(offsets[-1])
    q, k, v = (torch.randn(T, heads, head_dim, generator=g) for _ in range(3))
    rab = 0.02 * torch.randn(heads, cap, generator=g)
    return q, k, v, rab, offsets, cap


def test_hstu_attention_jagged(benchmark):
    from gembench.models.ops.pytorch.hstu_attention import hstu_jagged_attention

    q, k, v, rab, offsets, _ = _jagged()
    _bench(benchmark, hstu_jagged_attention, q, k, v, rab, offsets)


def test_hstu_attention_padded(benchmark):
    from gembench.models.ops.pytorch.hstu_attention import hstu_padded_attention

    q, k, v, rab, offsets, cap = _jagged()
    _bench(benchmark, hstu_padded_attention, q, k, v, rab, offsets, cap)


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs CUDA: the Triton kernels are timed on a GPU (tests/test_hstu_triton.py checks them "
    "on CPU in Triton's interpreter)",
)
def test_hstu_attention_triton_fwd_bwd(benchmark):
    """Forward+backward of the Triton kernels, bf16, medium-like lengths (batch 128, up to 1024)."""
    from gembench.models.ops.triton.hstu_attention import triton_hstu_attention

    q, k, v, rab, offsets, cap = _jagged(batch=128, mean=384, cap=1024, heads=4, head_dim=64)
    q, k, v = (t.to("cuda", torch.bfloat16).requires_grad_() for t in (q, k, v))
    rab, offsets = rab.to("cuda").requires_grad_(), offsets.to("cuda")
    grad_out = torch.randn_like(v)

    def fwd_bwd():
        out = triton_hstu_attention(q, k, v, rab, offsets, cap)
        grads = torch.autograd.grad(out, (q, k, v, rab), grad_out)
        torch.cuda.synchronize()
        return out, grads

    fwd_bwd()  # autotune outside the timed rounds
    out, grads = benchmark(fwd_bwd)
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)


# ----------------------------------------------------------------------------- Wukong FM


def test_wukong_fm_plain_torch(benchmark):
    """The optimized FM alone, X (X^T Y): the kernel every Wukong layer starts with."""
    x = torch.randn(512, 16, 32)
    y = torch.randn(16, 16)
    _bench(benchmark, lambda x, y: torch.matmul(x, torch.matmul(x.transpose(1, 2), y)), x, y)


def test_wukong_layer(benchmark):
    from gembench.models.wukong import WukongLayer

    layer = WukongLayer(n_in=16, dim=32, n_fm=16, n_lcb=16, rank=16, mlp=[256, 256]).eval()
    _bench(benchmark, layer, torch.randn(512, 16, 32))


# ----------------------------------------------------------------------------- embedding lookup


def _ids(tables=8, rows=5000, batch=512, max_pool=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_pool + 1, (tables * batch,), generator=g)
    values = torch.randint(0, rows, (int(lengths.sum()),), generator=g)
    return lengths, values


def test_embedding_lookup_torchrec_ebc(benchmark):
    """torchrec EmbeddingBagCollection, 8 tables x 5k rows, d=32, sum pooling (unsharded: one
    nn.EmbeddingBag per table; sharded models use the fbgemm TBE below)."""
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor

    keys = [f"f{i}" for i in range(8)]
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(name=f"t{i}", embedding_dim=32, num_embeddings=5000, feature_names=[k])
            for i, k in enumerate(keys)
        ],
        device=torch.device("cpu"),
    )
    lengths, values = _ids()
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths)
    with torch.no_grad():
        out = benchmark(lambda: ebc(kjt).values())
    assert out.shape == (512, 8 * 32)


def test_embedding_lookup_plain_embeddingbag(benchmark):
    """The same lookups through one torch.nn.EmbeddingBag per table: the reference torchrec must beat."""
    bags = [torch.nn.EmbeddingBag(5000, 32, mode="sum") for _ in range(8)]
    lengths, values = _ids()
    per_table = lengths.view(8, 512)
    splits = per_table.sum(1).tolist()
    chunks = torch.split(values, splits)
    offsets = [torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(per_table[t], 0)[:-1]]) for t in range(8)]

    def lookup():
        return torch.cat([bag(ids, off) for bag, ids, off in zip(bags, chunks, offsets)], dim=1)

    with torch.no_grad():
        out = benchmark(lookup)
    assert out.shape == (512, 8 * 32)


def test_embedding_lookup_fbgemm_tbe(benchmark):
    """fbgemm's table-batched embedding (TBE) on CPU: all 8 tables in one fused kernel."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(5000, 32, EmbeddingLocation.HOST, ComputeDevice.CPU)] * 8, pooling_mode=PoolingMode.SUM
    )
    lengths, values = _ids()
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(lengths, 0)])
    with torch.no_grad():
        out = benchmark(tbe, values, offsets)
    assert out.shape == (512, 8 * 32)
