"""Cost counters (harness/metrics/counters.py) and profiles (harness/metrics/trace.py).

The pure parts on hand-made inputs; the counters of real tiny steps in process (the baseline
stack: no compile, a few seconds); `gembench run` prints them (tests/test_run.py).
"""

import pytest
import torch
from synthetic import zoo_state

from gembench.harness.metrics import counters
from gembench.harness.metrics.trace import kineto_marks_dropped, self_times, top_rows
from gembench.harness.train.measure import run_steps
from gembench.harness.train.runconfig import RunConfig
from gembench.harness.train.runner import run_benchmark
from gembench.harness.train.stack import STACKS
from gembench.harness.train.step import NoClock, train_step
from gembench.models.config import load_config
from gembench.models.data import SyntheticData
from gembench.models.ops.pytorch.hstu_attention import hstu_jagged_attention


def test_host_reads_are_counted_where_a_gpu_would_wait():
    x = torch.arange(6.0)
    with counters.StepCounter("cpu") as c:
        y = (x * 2).sum()
        y.item()  # _local_scalar_dense
        bool(y > 0)  # another
        x.tolist()  # no dispatch on the CPU: counted by the tolist wrapper
        torch.nonzero(x)  # output size depends on the data
        x[x > 2]  # boolean mask index: a nonzero inside
        torch.repeat_interleave(x.long()[:3], torch.tensor([1, 2, 3]))  # sizes from values
        x.add(1).mul(3)  # two ops, no reads
    assert c.host_syncs == c.host_reads == 6
    assert c.aten_ops >= 10
    assert c.cuda_syncs is None
    assert "tolist" not in torch.Tensor.__dict__  # the wrapper is gone again


def test_reads_inside_a_custom_op_and_of_optimizer_step_counters_are_not_counted():
    # the tiled attention plans its tiles on the host with tolist: inside the op, not counted
    T, H, D = 10, 2, 4
    q, k, v = (torch.randn(T, H, D) for _ in range(3))
    offsets = torch.tensor([0, 3, 10])
    p = torch.nn.Parameter(torch.randn(3))
    opt = torch.optim.Adam([p], lr=0.1, foreach=False)  # reads its CPU step counter with item()
    p.sum().backward()
    opt.step()
    with counters.StepCounter("cpu", [opt]) as c:
        hstu_jagged_attention(q, k, v, torch.zeros(H, 11), offsets)
        (p * 2).sum().backward()
        opt.step()
    assert c.host_reads == 0
    with counters.StepCounter("cpu") as c:  # without the optimizer named, its step read shows
        opt.step()
    assert c.host_reads == 1


def test_device_counts_from_trace_events():
    events = [
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 10, "dur": 5},
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 20, "dur": 5},
        {
            "ph": "X",
            "cat": "gpu_memcpy",
            "name": "Memcpy HtoD (Pageable -> Device)",
            "ts": 1,
            "dur": 1,
            "args": {"bytes": 4096},
        },
        {
            "ph": "X",
            "cat": "gpu_memcpy",
            "name": "Memcpy DtoH (Device -> Pageable)",
            "ts": 30,
            "dur": 1,
            "args": {"bytes": 8},
        },
        {"ph": "X", "cat": "kernel", "name": "late", "ts": 100, "dur": 5},
        {"ph": "i", "cat": "kernel", "name": "instant", "ts": 12},
    ]
    assert counters.device_counts(events) == {"kernels": 3, "h2d_bytes": 4096}
    assert counters.device_counts(events, window=(0, 50)) == {"kernels": 2, "h2d_bytes": 4096}


def test_self_times_subtract_nested_events_per_thread():
    ev = lambda name, ts, dur, tid=1: {
        "ph": "X",
        "cat": "cpu_op",
        "name": name,
        "ts": ts,
        "dur": dur,  # noqa: E731
        "pid": 0,
        "tid": tid,
    }
    events = [ev("outer", 0, 100), ev("a", 10, 30), ev("b", 50, 20), ev("a_inner", 15, 10), ev("a", 0, 40, tid=2)]
    t = self_times(events, ("cpu_op",))
    assert t["outer"] == {"calls": 1, "total_us": 100, "self_us": 50}
    assert t["a"] == {"calls": 2, "total_us": 70, "self_us": 60}  # 30 - 10 on tid 1, 40 on tid 2
    assert t["a_inner"]["self_us"] == 10 and t["b"]["self_us"] == 20
    what, rows = top_rows(events, torch.device("cpu"), n=2)
    assert what == "CPU ops" and [r["name"] for r in rows] == ["a", "outer"]
    assert sum(r["share"] for r in top_rows(events, torch.device("cpu"))[1]) == pytest.approx(1.0)


def _tiny_baseline():
    return run_benchmark(RunConfig("tiny", steps=1, warmup=1, stack="baseline", device="cpu", peak_tflops=1.0))


def test_counters_of_real_steps_are_deterministic_and_see_a_planted_op(monkeypatch):
    a, b = _tiny_baseline(), _tiny_baseline()
    assert a["counters"] == b["counters"]  # same seed, same code: the same counts
    c = a["counters"]
    assert set(c) == set(counters.KEYS) | {"source", "aten_op_counts"}
    assert sum(c["aten_op_counts"].values()) == c["aten_ops"] and "aten.mm.default" in c["aten_op_counts"]
    assert c["aten_ops"] > 100 and c["kernels"] is None and c["h2d_bytes"] == 0
    assert c["host_syncs"] == 0 and c["graph_breaks"] == 0 and c["recompiles"] == 0
    assert {k: a["metrics"][k] for k in counters.KEYS if k != "kernels"} == {
        k: c[k] for k in counters.KEYS if k != "kernels"
    }
    assert "kernels" not in a["metrics"]

    from gembench.models.zoo import ZooWorkload

    real_loss = ZooWorkload.loss

    def planted(self, output, batch):  # one more aten op, and one host read, in every step
        per_task = real_loss(self, output, batch) * 1.0
        per_task.detach().sum().item()
        return per_task

    monkeypatch.setattr(ZooWorkload, "loss", planted)
    p = _tiny_baseline()["counters"]
    from gembench.harness.regression.opdiff import op_changes

    changed = {x["op"]: x["delta"] for x in op_changes(c["aten_op_counts"], p["aten_op_counts"])}
    assert changed["aten.mul.Tensor"] == 2 and changed["aten._local_scalar_dense.default"] == 1
    # the mul, its backward's mul, the detach, the sum and the read's _local_scalar_dense
    assert p["aten_ops"] == c["aten_ops"] + 5
    assert p["host_syncs"] == c["host_syncs"] + 1


def test_batches_carry_their_kjt_layout_so_torchrec_reads_nothing_back():
    cfg = load_config("tiny")
    batch = SyntheticData(cfg, seed=0).batch(0)
    for kjt in (batch.sparse, batch.seq):
        assert kjt._length_per_key == [int(kjt[k].lengths().sum()) for k in kjt.keys()]
        assert kjt._offset_per_key[-1] == kjt.values().numel()
        moved = kjt.to(torch.device("cpu"))
        assert moved._length_per_key == kjt._length_per_key
    # a KJT without them costs the embedding modules a host read (the counter sees it)
    state = zoo_state(cfg, STACKS["baseline"], torch.device("cpu"))
    run_steps(state, [batch], 1, 0)
    bare = SyntheticData(cfg, seed=0).batch(0)
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    bare.sparse = KeyedJaggedTensor(bare.sparse.keys(), bare.sparse.values(), lengths=bare.sparse.lengths())
    with counters.StepCounter("cpu", state.optimizers) as with_layout:
        train_step(state, batch, NoClock())
    with counters.StepCounter("cpu", state.optimizers) as without:
        train_step(state, bare, NoClock())
    assert with_layout.host_reads == 0 and without.host_reads >= 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_one_tiny_step_on_cuda_makes_no_host_sync():
    # Needs the fused GPU attention kernel (Triton) in place of the tiled CPU op on CUDA: the
    # tiled op plans its tiles on the host and syncs ~86 times per step.
    cfg = load_config("tiny")
    dev = torch.device("cuda")
    state = zoo_state(cfg, STACKS["optimized"], dev)
    batches = [SyntheticData(cfg, seed=0).batch(i) for i in range(3)]
    run_steps(state, batches, 1, 2)  # warm-up and compile outside the checked step
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        train_step(state, batches[2], NoClock())
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()


def test_compile_counts_see_graph_breaks_and_recompiles():
    since = counters.fresh_compile_state()

    @torch.compile(backend="eager")
    def f(x):
        y = x * 2
        torch._dynamo.graph_break()
        return y + 1

    f(torch.ones(3))
    assert counters.compile_counts(since) == {"graph_breaks": 1, "recompiles": 0}
    f(torch.ones(3, 4))  # another rank: the guards fail, dynamo compiles f again
    counts = counters.compile_counts(since)
    assert counts["recompiles"] >= 1 and counts["graph_breaks"] >= 1
    assert counters.compile_counts(counters.fresh_compile_state()) == {"graph_breaks": 0, "recompiles": 0}


def test_compiled_code_runs_compiled_under_the_counter():
    @torch.compile(dynamic=False)
    def f(x):
        return ((x.sin() + 1).cos() * 3).exp()

    counters.fresh_compile_state()
    x = torch.ones(4)
    f(x)
    before = counters.compile_snapshot()
    with counters.StepCounter("cpu") as c:
        f(x)
    # one fused inductor kernel (its output allocated by an op or none), not 5 eager ops: the
    # dispatch mode did not send torch.compile back to eager
    assert c.aten_ops <= 1 and counters.compile_counts(before)["recompiles"] == 0


def test_fused_sequence_tables_split_their_rows_by_host_sizes():
    """The CUDA stack's FusedEmbeddingCollection (stack.py) against TorchRec's, on the CPU.

    fbgemm has no CPU kernel for unpooled tables, so both are built on the meta device and get
    the same CPU lookup (rows of one weight); what differs is how the rows are split per feature.
    """
    from torchrec import EmbeddingConfig
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from gembench.harness.train.stack import sync_free_fused_embedding_collection

    tables = [
        EmbeddingConfig(name=f"table_{f}", embedding_dim=4, num_embeddings=20, feature_names=[f]) for f in ("a", "b")
    ]
    weight = torch.randn(20, 4)

    def lookup(indices, offsets, weights=None):  # unpooled TBE: one row per index
        return weight[indices.long()]

    modules = []
    for cls in (FusedEmbeddingCollection, sync_free_fused_embedding_collection()):
        m = cls(tables, optimizer_type=torch.optim.Adagrad, optimizer_kwargs={"lr": 0.1}, device=torch.device("meta"))
        m._emb_modules[:] = [lookup] * len(m._emb_modules)
        modules.append(m)
    lengths = torch.tensor([2, 1, 3, 0, 1, 2])  # a: 3 examples, 6 ids; b: 3 ids
    kjt = KeyedJaggedTensor(
        ["a", "b"], torch.arange(9), lengths=lengths, stride=3, length_per_key=[6, 3], offset_per_key=[0, 6, 9]
    )
    with counters.StepCounter("cpu") as theirs:
        want = modules[0](kjt)
    with counters.StepCounter("cpu") as ours:
        got = modules[1](kjt)
    assert set(got) == set(want) == {"a", "b"}
    for f in want:
        assert torch.equal(got[f].values(), want[f].values())
        assert torch.equal(got[f].lengths(), want[f].lengths())
    assert theirs.host_reads == 2 and ours.host_reads == 0  # one torch.split size per feature


def test_only_kineto_marks_are_dropped_from_stderr(capfd):
    import os

    with kineto_marks_dropped():
        os.write(2, b"USDT:2026-12-01 04:23:15 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"a real error\n")
        os.write(2, b"STAGE:2026-12-01 04:23:15 1:1 SyncActivityProfilerHandler.cpp:60] Completed\n")
    assert capfd.readouterr().err == "a real error\n"
