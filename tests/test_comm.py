"""Communication metrics on hand-made traces: interval algebra, bus factors, gloo pairing, exposure."""

import pytest

from gembench.harness.metrics import comm


def test_interval_algebra_by_hand():
    a = [(0, 4), (2, 6), (10, 12)]
    assert comm.union(a) == [(0, 6), (10, 12)]
    assert comm.length(a) == 8
    b = [(5, 11)]
    assert comm.intersect(a, b) == [(5, 6), (10, 11)]
    assert comm.subtract(a, b) == [(0, 5), (11, 12)]
    assert comm.subtract(b, a) == [(6, 10)]
    assert comm.intersect(a, []) == [] and comm.subtract(a, []) == [(0, 6), (10, 12)]


def test_exposure_splits_comm_into_overlapped_and_exposed():
    # comm 0-10; compute 0-4 and 8-20: overlapped 4 + 2 = 6, exposed 4, over a 20 s step
    e = comm.exposure([(0, 10)], [(0, 4), (8, 20)], step_s=20)
    assert e["comm_s"] == 10 and e["overlapped_s"] == 6 and e["exposed_s"] == 4
    assert e["overlap_fraction"] == pytest.approx(0.6) and e["exposed_fraction"] == pytest.approx(0.2)


def test_nccl_tests_bus_factors():
    assert comm.bus_factor("all_reduce", 4) == pytest.approx(1.5)
    for family in ("reduce_scatter", "all_gather", "all_to_all"):
        assert comm.bus_factor(family, 4) == pytest.approx(0.75)
    assert comm.bus_factor("all_reduce", 1) == 0.0


def ev(name, ts, dur, tid=1, cat="cpu_op", dims=None, types=None):
    e = {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "pid": 1, "cat": cat, "args": {}}
    if dims is not None:
        e["args"] = {"Input Dims": dims, "Input type": types}
    return e


def toy_trace():
    """One step 0-100 us: a KJT all-to-all (int64 values: send 10, receive 12), a reduce-scatter
    that gloo runs as an all-reduce, and a dense-gradient all-reduce of a tensor list."""
    return [
        ev("gembench/step", 0, 100, cat="user_annotation"),
        ev("## all2all_data:kjt values ##", 1, 5, cat="user_annotation"),
        ev(
            "c10d::alltoall_base_",
            2,
            2,
            dims=[[12], [10], [], [], []],
            types=["long int", "long int", "", "ScalarList", "ScalarList"],
        ),
        ev("gloo:all_to_all", 4, 16, tid=9, dims=[[10]], types=["long int"]),
        ev("aten::mm", 10, 30),  # compute 10-40 overlaps the all-to-all's 10-20
        ev("gembench/output_dist", 40, 20, cat="user_annotation"),
        ev("c10d::_reduce_scatter_base_", 41, 1, dims=[[4, 8], [8, 8], [], []], types=["float", "float", "", "Scalar"]),
        ev("gloo:all_reduce", 42, 10, tid=8, dims=[[8, 8]], types=["float"]),
        ev("All2All_Pooled_Wait", 42, 10),  # blocks: not compute
        ev("gembench/grad_sync", 60, 30, cat="user_annotation"),
        ev("c10d::allreduce_", 61, 1, dims=[[[100]], [], []], types=["TensorList", "", ""]),
        ev("gloo:all_reduce", 62, 20, tid=9, dims=[[100]], types=["float"]),
    ]


def test_collectives_pair_queueing_calls_with_gloo_worker_events():
    calls = comm.collectives(toy_trace())
    assert [c["kind"] for c in calls] == ["kjt_all_to_all", "embedding_reduce_scatter", "dense_grad_all_reduce"]
    assert [c["bytes"] for c in calls] == [80, 256, 400]  # send buffer; full input; list from worker
    assert [(c["start_us"], c["end_us"]) for c in calls] == [(4, 20), (42, 52), (62, 82)]


def test_analyze_one_step_by_hand():
    a = comm.analyze(toy_trace(), world_size=2, step_name="gembench/step")
    assert a["profiled_steps"] == 1 and a["step_s"] == pytest.approx(100e-6)
    k = a["by_kind"]["kjt_all_to_all"]
    assert k["calls"] == 1 and k["bytes"] == 80 and k["time_s"] == pytest.approx(16e-6)
    assert k["algbw_Bps"] == pytest.approx(80 / 16e-6) and k["busbw_Bps"] == pytest.approx(40 / 16e-6)
    assert a["by_kind"]["dense_grad_all_reduce"]["busbw_Bps"] == pytest.approx(400 / 20e-6)
    e = a["exposure"]
    # comm 4-20, 42-52, 62-82 = 46 us; compute: mm 10-40 only (the wait and c10d calls are not)
    assert e["comm_s"] == pytest.approx(46e-6)
    assert e["overlapped_s"] == pytest.approx(10e-6)
    assert e["exposed_s"] == pytest.approx(36e-6)
    assert e["exposed_fraction"] == pytest.approx(0.36)
    # per kind: the all-to-all 4-20 overlaps mm 10-40 for 10 us; the other two are fully exposed
    assert k["overlapped_s"] == pytest.approx(10e-6) and k["exposed_s"] == pytest.approx(6e-6)
    grad = a["by_kind"]["dense_grad_all_reduce"]
    assert grad["overlapped_s"] == 0 and grad["exposed_s"] == pytest.approx(20e-6)


def test_classify_backward_and_forward():
    assert comm.classify("all_to_all", ["## All2All_Pooled_fwd ##"]) == "embedding_all_to_all"
    assert (
        comm.classify("all_to_all", ["autograd::engine::evaluate_function: X", "## All2All_Pooled_bwd ##"])
        == "embedding_grad_all_to_all"
    )
    assert comm.classify("all_gather", ["## ReduceScatterBase_bwd (all_gather) ##"]) == "embedding_grad_all_gather"
    assert comm.classify("all_reduce", ["DistributedDataParallel.forward", "backward"]) == "dense_grad_all_reduce"
    # DDP's reducer all-reduces from a gradient hook: only autograd's engine is around it
    hook = ["gembench/step", "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"]
    assert comm.classify("all_reduce", hook) == "dense_grad_all_reduce"
    assert comm.classify("all_reduce", ["gembench/step"]) == "all_reduce"


def test_a_coalesced_all_reduce_is_sized_by_every_tensor_and_the_replica_sync_is_named():
    # 2D sparse parallelism's replica sync: TorchRec's annotation around one coalesced all-reduce,
    # whose c10d call records a TensorList (no element type) and whose gloo worker lists each tensor
    span = ev("## 2d_weight_sync ##_custom_hook", 0, 100)
    call = ev("c10d::allreduce_coalesced_", 1, 5, dims=[[[20, 16], [5, 16]], []], types=["TensorList", ""])
    worker = ev("gloo:all_reduce", 10, 50, tid=9, dims=[[20, 16], [5, 16]], types=["float", "float"])
    [one] = comm.collectives([span, call, worker])
    assert one["bytes"] == (20 + 5) * 16 * 4
    assert one["kind"] == "embedding_replica_sync"
    assert comm.classify("all_reduce", ["gembench/replica_sync"]) == "embedding_replica_sync"
