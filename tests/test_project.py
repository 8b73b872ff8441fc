"""`gembench project`: the cost model's parts, the offline planner and its search, the command's
refusals, --calibrate on gloo (alone and from a run's trace), and --check against measured runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
from synthetic import cli_in_process, run_cli

from gembench.errors import UsageError
from gembench.harness.metrics.comm import bus_factor
from gembench.harness.projection.cluster import KINDS, PRESETS, load_cluster
from gembench.harness.projection.rates import collective_time
from gembench.harness.projection.subject import Subject
from gembench.harness.projection.volumes import EMB_BYTES, volumes
from gembench.harness.store.schema import validate
from gembench.models.config import load_config
from gembench.models.data import expected_ids_per_example
from gembench.models.zoo import ZooWorkload

H100 = PRESETS["h100"]


def of(cfg):
    """A config as the projection reads it: the zoo's workload."""
    return Subject.of(ZooWorkload(cfg))


def _gembench(*args, env=None):
    """`gembench ARGS`: a run as its own process (its ranks are forked from it), the projection's
    commands in this one."""
    if args[0] == "run":
        return subprocess.run([sys.executable, "-m", "gembench", *args], capture_output=True, text=True, env=env)
    return cli_in_process(*args, env=env)


def test_a_collective_in_one_node_is_latency_plus_bus_bytes_over_the_link():
    link = H100.intra
    for family in ("all_to_all", "all_reduce", "reduce_scatter", "all_gather"):
        t = collective_time(H100, family, 2**30, 8)
        assert t == pytest.approx(link.latency_s + 2**30 * bus_factor(family, 8) / link.bandwidth_Bps)
    assert collective_time(H100, "all_reduce", 2**30, 1) == 0.0


def test_across_nodes_an_all_to_all_leaves_through_the_nic_at_n_over_n_minus_1():
    nodes, size = 4, 2**30
    t = collective_time(H100, "all_to_all", size, 8 * nodes)
    assert t == pytest.approx(H100.inter.latency_s + size * (nodes - 1) / nodes / H100.inter.bandwidth_Bps)
    # and the NIC, not NVLink, sets the time of every family across nodes
    for family in ("all_reduce", "reduce_scatter", "all_gather"):
        assert collective_time(H100, family, size, 64) > collective_time(H100, family, size, 8)


def test_hsdp_shards_within_a_node_and_all_reduces_across_on_the_nics():
    from gembench.harness.projection.cost import dense_shards

    hsdp = type("S", (), {"dense_parallel": "hsdp"})()
    assert dense_shards(hsdp, 64, 8) == 8 and dense_shards(hsdp, 4, 8) == 4
    # one GPU per node: the NIC alone carries it, at the all-reduce's bus factor over the nodes
    t = collective_time(H100, "all_reduce", 2**30, 8, per_node=1)
    assert t == pytest.approx(H100.inter.latency_s + 2**30 * bus_factor("all_reduce", 8) / H100.inter.bandwidth_Bps)


def _plan(kind: str, world: int, rows: int = 1000, dim: int = 16) -> dict:
    if kind == "table_wise":
        return {"table_t0": {"sharding": kind, "ranks": [0], "shard_sizes": [[rows, dim]]}}
    per = rows // world
    return {"table_t0": {"sharding": kind, "ranks": list(range(world)), "shard_sizes": [[per, dim]] * world}}


def test_a_plans_lookup_volume_is_the_global_batchs_ids_wherever_they_land():
    cfg = load_config("tiny")
    ids = {"table_t0": 3.0}
    tw, rw = volumes(of(cfg), _plan("table_wise", 4), ids, 4, 8), volumes(of(cfg), _plan("row_wise", 4), ids, 4, 8)
    total = 4 * 8 * 3.0 * 16 * EMB_BYTES
    assert tw["lookup"].sum() == pytest.approx(total) and rw["lookup"].sum() == pytest.approx(total)
    # table-wise puts all of it on one rank (imbalance 4 on 4 ranks), row-wise spreads it
    assert tw["lookup"].max() / tw["lookup"].mean() == pytest.approx(4.0)
    assert np.allclose(rw["lookup"], total / 4)
    # row-wise pooled tables return partial sums by reduce-scatter, table-wise by all-to-all
    assert rw["rs_world"] == 4 * 8 * 16 * EMB_BYTES and tw["rs_world"] == 0
    assert tw["a2a_recv"].sum() == pytest.approx(4 * 8 * 16 * EMB_BYTES) and not rw["a2a_send"].any()


def test_sorted_ids_load_the_first_row_shard_with_the_head():
    import dataclasses

    cfg = load_config("tiny")
    ids = {"table_t0": 3.0}
    sorted_cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, id_layout="sorted"))
    hashed, head = (
        volumes(of(cfg), _plan("row_wise", 4), ids, 4, 8),
        volumes(of(sorted_cfg), _plan("row_wise", 4), ids, 4, 8),
    )
    assert head["lookup"].sum() == pytest.approx(hashed["lookup"].sum())  # the same lookups, elsewhere
    assert np.allclose(hashed["lookup"], hashed["lookup"].mean())
    assert head["lookup"][0] > 2 * head["lookup"][1:].max()  # shard 0 holds the hot rows


def test_expected_ids_follow_the_configs_distributions():
    cfg = load_config("dcnv2")  # pooling "fixed": exactly the listed IDs
    ids = expected_ids_per_example(cfg)
    assert [ids[f"table_t{i}"] for i in range(len(cfg.sparse.rows))] == [float(p) for p in cfg.sparse.pooling]
    small = load_config("small")
    assert all(ids > 0 for ids in expected_ids_per_example(small).values())


def _pricer(cfg, world, batch, cluster=H100, compute=None, **kw):
    from gembench.harness.projection.cost import Pricer
    from gembench.harness.projection.rates import Compute

    compute = compute or Compute({"dense_forward": 1e-9, "backward": 2e-9}, 1e-5, 1.0 / 1.6e12, "test")
    return Pricer(of(cfg), expected_ids_per_example(cfg), world, batch, cluster, compute, **kw)


def _twrw(rows: int, dim: int, node: int, g: int = 8) -> dict:
    per = rows // g
    return {
        "sharding": "table_row_wise",
        "ranks": [node * g + i for i in range(g)],
        "shard_sizes": [[per, dim]] * g,
        "shard_offsets": [[i * per, 0] for i in range(g)],
    }


def test_table_row_wise_reduce_scatters_in_its_node_then_sends_each_gpus_share_over_the_nics():
    """TorchRec's TwRwPooledEmbeddingDist: partial sums reduce-scattered over the owning node's
    GPUs, then an all-to-all of one GPU per node carries each example's row to its rank."""
    cfg = load_config("dcnv2-mlperf")
    world, batch, dim = 16, 32, cfg.sparse.dim
    v = volumes(of(cfg), {"table_t0": _twrw(cfg.sparse.rows[0], dim, node=1)}, {"table_t0": 3.0}, world, batch)
    gb = world * batch
    assert np.allclose(v["rs_in"][8:], gb * dim * EMB_BYTES) and not v["rs_in"][:8].any()
    assert np.allclose(v["cross_send"][8:], gb / 8 * dim * EMB_BYTES) and not v["cross_send"][:8].any()
    assert np.allclose(v["cross_recv"], batch * dim * EMB_BYTES)  # every GPU gets its examples' rows back
    assert v["lookup"][:8].sum() == 0 and v["lookup"][8:].sum() == pytest.approx(gb * 3.0 * dim * EMB_BYTES)
    # priced: the NIC step appears across nodes only, and the node's reduce-scatter stays on NVLink
    row = _pricer(cfg, world, batch).price({"table_t0": _twrw(cfg.sparse.rows[0], dim, node=1)})
    one = _pricer(cfg, 8, batch).price({"table_t0": _twrw(cfg.sparse.rows[0], dim, node=0)})
    assert row.stages["output_dist"].time_s > one.stages["output_dist"].time_s
    assert row.stages["output_dist"].gpu >= 8  # a GPU of the owning node sets it


def test_a_data_parallel_table_is_looked_up_at_home_and_all_reduced_in_the_backward():
    cfg = load_config("tiny")
    world, batch, rows, dim = 4, 8, 5000, cfg.sparse.dim
    dp = {"table_t1": {"sharding": "data_parallel", "ranks": list(range(world)), "shard_sizes": [[rows, dim]] * world}}
    v = volumes(of(cfg), dp, {"table_t1": 2.0}, world, batch)
    assert np.allclose(v["lookup"], batch * 2.0 * dim * EMB_BYTES) and v["dp_params"] == rows * dim
    assert not (v["kjt_send"].any() or v["a2a_send"].any() or v["rs_in"].any()) and v["groups"] == 0
    with_dp = _pricer(cfg, world, batch).price(dp)
    tw = {"table_t1": {"sharding": "table_wise", "ranks": [0], "shard_sizes": [[rows, dim]]}}
    without = _pricer(cfg, world, batch).price(tw)
    assert with_dp.stages["grad_sync"].time_s == without.stages["grad_sync"].time_s
    table = collective_time(H100, "all_reduce", rows * dim * 4, world, kind="dense_grad_all_reduce")
    assert with_dp.exposed_comm_s == pytest.approx(table + with_dp.stages["grad_sync"].exposed_s)
    assert with_dp.imbalance.max_mean == pytest.approx(1.0) and without.imbalance.max_mean == 4.0


def test_table_row_wise_crosses_the_nodes_in_a_group_of_one_gpu_per_node():
    """TorchRec's intra_and_cross_node_pg: the reduce-scatter's group is a node's 8 GPUs, the
    all-to-all after it one GPU of each node (its group size is the number of nodes, not W)."""
    cfg = load_config("dcnv2-mlperf")
    world, batch, dim, nodes = 32, 16, cfg.sparse.dim, 4
    plan = {"table_t0": _twrw(cfg.sparse.rows[0], dim, node=2)}
    v = volumes(of(cfg), plan, {"table_t0": 3.0}, world, batch)
    row = _pricer(cfg, world, batch).price(plan)
    node_rs = collective_time(H100, "reduce_scatter", float(v["rs_in"].max()), 8, kind="embedding_reduce_scatter")
    cross = float(np.maximum(v["cross_send"], v["cross_recv"]).max())
    over_nodes = collective_time(H100, "all_to_all", cross, nodes, per_node=1, kind="embedding_all_to_all")
    assert row.stages["output_dist"].time_s == pytest.approx(node_rs + over_nodes)
    assert over_nodes < collective_time(H100, "all_to_all", cross, world, per_node=1)  # (N-1)/N, not (W-1)/W


def test_a_data_parallel_table_has_no_all_to_all_and_its_gradient_is_all_reduced_in_the_backward():
    """DMP's data-parallel sharding: input and output dists pass through; the table's gradient
    (dense kernel: as large as the table) is written in the backward and all-reduced there by the
    DDP TorchRec wraps its lookup in, apart from the dense gradients; the dense optimizer steps it."""
    from gembench.harness.projection.rates import ADAM_STEP_BYTES, UPDATE_PER_LOOKUP, Compute

    cfg = load_config("tiny")
    world, batch, rows, dim = 4, 8, 5000, cfg.sparse.dim
    dp = {"table_t1": {"sharding": "data_parallel", "ranks": list(range(world)), "shard_sizes": [[rows, dim]] * world}}
    streams = Compute({"dense_forward": 1e-9, "backward": 2e-9}, 1e-5, 1e-9, "test", optimizer_s_per_param=3e-10)
    pricer = _pricer(cfg, world, batch, compute=streams)
    row = pricer.price(dp)
    assert row.stages["input_dist"].time_s == 0.0 and row.stages["output_dist"].time_s == 0.0
    dense = collective_time(H100, "all_reduce", pricer.counts["dense_params"] * 4, world, kind="dense_grad_all_reduce")
    table = collective_time(H100, "all_reduce", rows * dim * 4, world, kind="dense_grad_all_reduce")
    assert row.stages["grad_sync"].time_s == pytest.approx(dense)
    looked = batch * expected_ids_per_example(cfg)["table_t1"] * dim * EMB_BYTES
    rate, c = pricer.compute.lookup_s_per_byte, pricer.compute
    dense_bwd = c.per_example["backward"] * batch
    zeroed = rows * dim * EMB_BYTES * c.optimizer_s_per_param / ADAM_STEP_BYTES  # streamed, as Adam streams
    gradient = UPDATE_PER_LOOKUP * looked * rate + zeroed
    assert row.stages["backward"].time_s == pytest.approx(dense_bwd + gradient + table)
    assert row.stages["optimizer"].time_s == pytest.approx(c.optimizer_s + rows * dim * c.optimizer_s_per_param)
    # a cluster file that measured its memory (--calibrate): a table's state streams no faster than
    # that, however fast a small dense part's Adam ran from the caches
    import dataclasses

    slow = dataclasses.replace(H100, memory_Bps=ADAM_STEP_BYTES / 3e-9)  # 10x slower than the compute's rate
    dram = _pricer(cfg, world, batch, cluster=slow, compute=streams).price(dp)
    assert dram.stages["optimizer"].time_s == pytest.approx(c.optimizer_s + rows * dim * 3e-9)
    zeroed_dram = rows * dim * EMB_BYTES * 3e-9 / ADAM_STEP_BYTES
    assert dram.stages["backward"].time_s == pytest.approx(
        dense_bwd + UPDATE_PER_LOOKUP * looked * rate + zeroed_dram + table
    )
    # a compute measured with the same tables data-parallel (a 1-rank reference of the checked plan)
    # holds their gradients and Adam already: nothing is added for them
    from gembench.harness.projection.rates import data_parallel_params

    assert (
        data_parallel_params({"plan": {**dp, **{"table_t0": {"sharding": "table_wise", "shard_sizes": [[9, 9]]}}}})
        == rows * dim
    )
    held = dataclasses.replace(streams, dp_params=float(rows * dim))
    same = _pricer(cfg, world, batch, compute=held).price(dp)
    assert same.stages["optimizer"].time_s == pytest.approx(c.optimizer_s)
    assert same.stages["backward"].time_s == pytest.approx(dense_bwd + UPDATE_PER_LOOKUP * looked * rate + table)
    fast = dataclasses.replace(H100, memory_Bps=ADAM_STEP_BYTES / 3e-11)  # faster than the compute: it stands
    assert _pricer(cfg, world, batch, cluster=fast, compute=streams).price(dp).stages["optimizer"].time_s == (
        pytest.approx(row.stages["optimizer"].time_s)
    )


def test_grid_sends_every_id_to_each_column_block():
    cfg = load_config("dcnv2-mlperf")
    world, batch, dim, rows = 16, 8, cfg.sparse.dim, 80000
    half, per = dim // 2, rows // 8
    grid = {
        "sharding": "grid_shard",
        "ranks": list(range(16)),
        "shard_sizes": [[per, half]] * 16,
        "shard_offsets": [[(i % 8) * per, (i // 8) * half] for i in range(16)],
    }
    v = volumes(of(cfg), {"table_t0": grid}, {"table_t0": 3.0}, world, batch)
    twrw = volumes(of(cfg), {"table_t0": _twrw(rows, dim, node=0)}, {"table_t0": 3.0}, world, batch)
    assert np.allclose(v["kjt_send"], 2 * twrw["kjt_send"])  # two column blocks: the IDs twice
    assert v["lookup"].sum() == pytest.approx(twrw["lookup"].sum()) and v["lookup"].max() < twrw["lookup"].max()


def test_the_critical_path_names_the_stage_and_the_gpu_that_sets_it():
    """A hot table-wise table on GPU 3 of 8: its lookups and their fused update make the backward
    the longest stage, set by GPU 3's lookup bytes; with a heavy dense part it is dense compute."""
    from gembench.harness.projection.rates import Compute

    cfg = load_config("tiny")
    plan = {f"table_t{i}": {"sharding": "table_wise", "ranks": [i], "shard_sizes": [[5000, 16]]} for i in range(8)}
    ids = {name: 1.0 for name in plan} | {"table_t3": 500.0}
    slow_hbm = Compute({"dense_forward": 1e-9, "backward": 2e-9}, 1e-6, 1e-9, "test")
    from gembench.harness.projection.cost import Pricer

    row = Pricer(of(cfg), ids, 8, 64, H100, slow_hbm).price(plan)
    cp = row.critical_path
    assert (cp.stage, cp.gpu, cp.set_by) == ("backward", 3, "lookup bytes")
    assert row.most_loaded.lookup_bytes.gpu == 3 and row.stages["embedding_lookup"].gpu == 3
    heavy = Compute({"dense_forward": 1e-3, "backward": 2e-3}, 1e-6, 1e-15, "test")
    row = Pricer(of(cfg), ids, 8, 64, H100, heavy).price(plan)
    assert row.critical_path.stage == "backward" and row.critical_path.set_by == "dense compute"


def test_the_planner_is_offered_what_torchrec_has_where_it_applies():
    from gembench.harness.projection.cluster import load_cluster
    from gembench.harness.projection.offline_plan import candidates, dp_limit

    cfg, limit = load_config("dcnv2-mlperf"), dp_limit(load_cluster("h100"))
    assert limit == 0.25 * 80 * 2**30 / 4  # 5 GiB of fp32 weights: 20 GiB replicated with Adam
    types, kept = candidates(of(cfg), 128, 8, "fast", limit)
    big, small = types["table_t0"], types["table_t5"]  # 40M rows; 3 rows
    assert set(big) == {"table_wise", "column_wise", "row_wise", "table_row_wise", "grid_shard"}
    assert set(small) == {"table_wise", "data_parallel", "column_wise"}  # no split into empty shards
    assert [k["tables"] for k in kept if "data_parallel" in k["what"]] == [
        sum(r * cfg.sparse.dim * 4 > limit for r in cfg.sparse.rows)
    ]
    full, lifted = candidates(of(cfg), 128, 8, "full", limit)
    assert "data_parallel" in full["table_t0"] and lifted == []
    one_node, _ = candidates(of(cfg), 8, 8, "fast", limit)  # within one node: no table_row_wise or grid
    assert not {"table_row_wise", "grid_shard"} & set(one_node["table_t0"])
    tiny, _ = candidates(of(load_config("tiny")), 2, 8, "fast", limit)  # dim 16: no column blocks
    assert "column_wise" not in tiny["table_t0"] and "row_wise" in tiny["table_clicks"]
    xl_rw = candidates(of(load_config("xl")), 4096, 8, "fast", limit)[1]
    assert any("row_wise for the largest tables" in k["what"] and k["tables"] > 600 for k in xl_rw)


def test_torchrecs_estimate_made_once_per_shape_is_the_estimate_of_every_shard():
    """OncePerShape: the perf TorchRec's estimator gives each shard, from one estimate per
    distinct shard size and option, equals estimating every shard."""
    from torchrec.distributed.planner.constants import DEFAULT_PERF_ESTIMATOR
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.estimator import EmbeddingPerfEstimatorFactory
    from torchrec.distributed.planner.shard_estimators import EmbeddingStorageEstimator

    from gembench.harness.projection.offline_plan import OncePerShape, candidates, constraints, embedding_module
    from gembench.harness.projection.offline_plan import topology as make_topology
    from gembench.harness.train.distributed.plan import sharders

    cfg = load_config("dcnv2")  # dim 128: column blocks, so grid too
    topo = make_topology(H100, 16)
    cons = constraints(of(cfg), expected_ids_per_example(cfg), candidates(of(cfg), 16, 8, "full", 0)[0])

    def options(once: bool):
        perf = EmbeddingPerfEstimatorFactory.create(DEFAULT_PERF_ESTIMATOR, topology=topo, constraints=cons)
        estimators = [OncePerShape(perf) if once else perf, EmbeddingStorageEstimator(topology=topo, constraints=cons)]
        return EmbeddingEnumerator(topo, 32, cons, estimator=estimators).enumerate(
            embedding_module(of(cfg)), sharders()
        )

    each, once = options(False), options(True)
    assert len(each) == len(once) and {o.sharding_type for o in each} >= {"row_wise", "data_parallel", "grid_shard"}
    for a, b in zip(each, once):
        assert (a.name, a.sharding_type) == (b.name, b.sharding_type)
        assert [s.perf for s in a.shards] == [s.perf for s in b.shards]


def test_the_planner_keeps_the_plan_the_cost_model_prices_fastest(skew_config):
    """Every plan TorchRec's planner partitions is rated by the projected step: the one it keeps
    is the fastest of those rated, and on the skewed table (64 IDs per example) it is not the
    table-wise plan that piles them on one GPU."""
    from gembench.harness.projection import offline_plan
    from gembench.harness.projection.rates import datasheet_compute

    cfg = load_config(str(skew_config))
    world, batch = 8, cfg.data.global_batch // 8
    ids = expected_ids_per_example(cfg)
    steps = []

    class Recorded(offline_plan.ProjectedStep):
        def rate(self, plan):
            steps.append(super().rate(plan))
            return steps[-1]

    pricer = _pricer(cfg, world, batch, compute=datasheet_compute(of(cfg), H100))
    original = offline_plan.ProjectedStep
    offline_plan.ProjectedStep = Recorded
    try:
        plan = offline_plan.plan_offline(of(cfg), world, batch, H100, 0.0, pricer, "test", ids, use_cache=False)
    finally:
        offline_plan.ProjectedStep = original
    kept = pricer.price(plan.tables)
    assert plan.fits and plan.proposals == len(steps) > 1
    assert kept.step_time_s == pytest.approx(min(steps))
    tw = offline_plan.plan_offline(
        of(cfg), world, batch, H100, 0.0, pricer, "test", ids, forced="table_wise", use_cache=False
    )
    assert kept.step_time_s < pricer.price(tw.tables).step_time_s
    assert kept.imbalance.max_mean < pricer.price(tw.tables).imbalance.max_mean


def test_the_descent_moves_a_class_of_identical_tables_together():
    """tiny's seven 5,000-row tables pool alike: one class, one sharding type in every plan rated."""
    from gembench.harness.projection import offline_plan

    cfg = load_config("tiny")
    ids = expected_ids_per_example(cfg)
    kinds = []

    class Recorded(offline_plan.ProjectedStep):
        def rate(self, plan):
            kinds.append({so.sharding_type for so in plan if so.name in {f"table_t{i}" for i in range(1, 8)}})
            return super().rate(plan)

    original = offline_plan.ProjectedStep
    offline_plan.ProjectedStep = Recorded
    try:
        plan = offline_plan.plan_offline(of(cfg), 4, 16, H100, 0.0, _pricer(cfg, 4, 16), "test", ids, use_cache=False)
    finally:
        offline_plan.ProjectedStep = original
    assert plan.fits and len(kinds) == plan.proposals > 3 and all(len(k) == 1 for k in kinds)
    assert len(set().union(*kinds)) >= 3  # the class tried several types


def test_the_fast_search_stops_at_its_cpu_budget_whatever_the_wall_clock(monkeypatch):
    """The budget counts this process's CPU time from the first proposal: a machine busy with other
    jobs (the wall clock running on) rates the same plans; past the budget the row says so."""
    from gembench.harness.projection import offline_plan

    cfg = load_config("tiny")
    ids = expected_ids_per_example(cfg)

    def plan():
        return offline_plan.plan_offline(of(cfg), 4, 16, H100, 0.0, _pricer(cfg, 4, 16), "test", ids, use_cache=False)

    whole = plan()
    monkeypatch.setattr(offline_plan, "PLAN_BUDGET_S", 0.5)
    monkeypatch.setattr(offline_plan.ClassDescent, "clock", staticmethod(lambda: 0.0))  # no CPU time spent
    idle = plan()
    assert idle.proposals == whole.proposals > 3 and not [r for r in idle.restrictions if "CPU budget" in r["what"]]
    ticks = iter(range(10**6))  # a CPU second per proposal
    monkeypatch.setattr(offline_plan.ClassDescent, "clock", staticmethod(lambda: float(next(ticks))))
    cut = plan()
    assert cut.fits and cut.proposals == 1 and [r for r in cut.restrictions if "CPU budget" in r["what"]]


def test_in_run_links_price_the_runs_calls_at_what_they_took_and_never_under_the_isolated():
    from gembench.harness.projection.calibrate import in_run_links
    from gembench.harness.projection.cluster import Link

    floor = {"all_to_all": Link(100e-6, 1e9), "all_reduce": Link(200e-6, 1e9)}
    iso = lambda b: 100e-6 + b * bus_factor("all_to_all", 2) / 1e9  # noqa: E731
    points = {
        "kjt_all_to_all": [(1000.0, 3 * iso(1000)), (5000.0, 3 * iso(5000))],  # 3x slower in the run
        "embedding_all_to_all": [(60000.0, 0.5 * iso(60000))],  # faster than alone: held at the floor
        "dense_grad_all_reduce": [(1e6, 1.0)],
    }
    links = in_run_links(points, 2, floor)
    assert links["kjt_all_to_all"].latency_s == pytest.approx(300e-6)
    assert links["kjt_all_to_all"].bandwidth_Bps == pytest.approx(1e9 / 3)
    assert links["embedding_all_to_all"] == floor["all_to_all"]
    assert links["all_to_all"].latency_s > floor["all_to_all"].latency_s  # the family, over its kinds
    assert "all_gather" not in links  # the run had none: the isolated figure prices it


def test_a_cluster_file_says_which_links_it_prices_with(tmp_path):
    from gembench.harness.projection.cluster import Link, read_cluster, to_toml

    base = dataclasses_replace(PRESETS["h100"], collectives={"all_to_all": Link(1e-4, 1e9)}, source="x")
    slow = dataclasses_replace(base, in_run={"kjt_all_to_all": Link(5e-4, 2e8)}, links="in_run")
    path = tmp_path / "c.toml"
    path.write_text(to_toml(slow))
    back = read_cluster(path)
    assert back.links == "in_run" and back.in_run["kjt_all_to_all"].latency_s == pytest.approx(5e-4)
    assert "in-run" in back.links_used() and "isolated" in dataclasses_replace(back, links="isolated").links_used()
    kjt = collective_time(back, "all_to_all", 1e6, 8, kind="kjt_all_to_all")
    assert kjt > collective_time(back, "all_to_all", 1e6, 8, kind="embedding_all_to_all")  # other jobs: isolated
    assert (
        collective_time(dataclasses_replace(back, links="isolated"), "all_to_all", 1e6, 8, kind="kjt_all_to_all") < kjt
    )
    path.write_text(to_toml(slow).replace('links = "in_run"', 'links = "measured"'))
    with pytest.raises(UsageError, match='links must be "isolated" or "in_run"'):
        read_cluster(path)
    path.write_text(to_toml(slow).replace("[in_run.kjt_all_to_all]", "[in_run.kjt]"))
    with pytest.raises(UsageError, match=r"\[in_run\] knows"):
        read_cluster(path)


def dataclasses_replace(obj, **kw):
    import dataclasses

    return dataclasses.replace(obj, **kw)


def test_a_jobs_checkpoints_are_staged_then_written_and_a_slow_write_blocks_the_next_save():
    from gembench.harness.projection.job import DENSE_STATE_BYTES, job_cost

    row = {
        "world": 16,
        "step_time_s": 0.01,
        "mfu": 0.2,
        "memory": {"embeddings_bytes": 4e9},
        "plan": {"fits": True, "seconds": 3.0},
    }
    cluster = dataclasses_replace(H100, storage_Bps=8e9)
    startup = {"to_first_step_s": 60.0, "phases": {"plan": 10.0, "compile": 30.0}}
    job = job_cost(row, 1e8, cluster, startup, steps=1000, every=100)
    per_gpu = 4e9 + DENSE_STATE_BYTES * 1e8 / 16
    staged, written = per_gpu / H100.host_copy_Bps, per_gpu * 8 / 8e9  # a node's 8 GPUs share its storage
    assert job["checkpoint_bytes_per_gpu"] == pytest.approx(per_gpu) and job["checkpoint_written_s"] == written
    # each write (~4.1 s) outlasts the 1 s between saves: the loop waits for the rest
    assert job["checkpoint_blocked_s"] == pytest.approx(staged + written - 100 * 0.01)
    assert job["startup_s"] == pytest.approx(60.0 - 10.0 + 3.0)
    assert job["job_s"] == pytest.approx(1000 * 0.01 + 53.0 + 10 * job["checkpoint_blocked_s"])
    assert job["end_to_end_mfu"] == pytest.approx(0.2 * 10.0 / job["job_s"]) and job["goodput"] < 1
    fast = job_cost(row, 1e8, dataclasses_replace(H100, storage_Bps=1e12), None, steps=1000, every=100)
    assert fast["checkpoint_blocked_s"] == pytest.approx(staged) and fast["includes"] == ["checkpoints"]
    assert job_cost(row | {"plan": {"fits": False}}, 1e8, cluster, None, 1000, 100) is None


def test_a_cluster_files_storage_figures_survive_its_round_trip_and_a_bad_one_is_named(tmp_path):
    from gembench.harness.projection.cluster import read_cluster, to_toml

    path = tmp_path / "c.toml"
    path.write_text(to_toml(dataclasses_replace(H100, storage_Bps=2e9)))
    back = read_cluster(path)
    assert back.storage_Bps == pytest.approx(2e9) and back.host_copy_Bps == pytest.approx(H100.host_copy_Bps)
    path.write_text(to_toml(H100).replace("host_copy_GBps = 51.2", "host_copy_GBps = -1"))
    with pytest.raises(UsageError, match="host_copy_GBps must be a number of GB/s"):
        read_cluster(path)


def test_dcnv2_mlperf_is_held_against_the_published_system(capsys):
    from gembench.harness.projection.published import MLPERF_V4_DCNV2, published
    from gembench.harness.projection.rates import datasheet_compute
    from gembench.harness.projection.report import print_projection, projection_document
    from gembench.harness.projection.sweep import sweep
    from gembench.harness.train.stack import STACKS

    assert [p.gpus for p in MLPERF_V4_DCNV2] == [8, 64, 128]
    assert published("dcnv2-mlperf", "h100", 64).global_batch == 135168 and not published("dcnv2", "h100", 64)
    cfg, stack = load_config("dcnv2-mlperf"), STACKS["optimized"]
    compute = datasheet_compute(of(cfg), H100)
    rows = sweep(of(cfg), [8], H100, compute, None, "pipelined", False, lambda _: None, stack, {8: 55296})
    print_projection(projection_document(of(cfg), H100, rows, "pipelined", compute, stack, "t", "now"))
    out = capsys.readouterr().out
    block = out.split("held against MLPerf Training v4.0")[1]
    assert re.search(r"\n\s+8\s+55,296\s+15\.63 M\s+[\d.]+ M\s+[\d.]+x\s+1x DGX H100", block), block
    assert "global batch 55,296" in out


@pytest.fixture(scope="module")
def projection(tmp_path_factory):
    out = tmp_path_factory.mktemp("proj") / "p.json"
    cache = tmp_path_factory.mktemp("cache")
    env = {**__import__("os").environ, "GEMBENCH_CACHE": str(cache)}
    first = _gembench("project", "--config", "small", "--gpus", "8,64", "--cluster", "h100", "--out", str(out), env=env)
    again = _gembench("project", "--config", "small", "--gpus", "8,64", "--cluster", "h100", "--quiet", env=env)
    return first, again, out


def test_project_prints_a_row_per_world_and_writes_a_valid_document(projection):
    first, again, out = projection
    assert first.returncode == 0, first.stderr[-2000:]
    doc = json.loads(out.read_text())
    validate(doc, out)
    assert [r["world"] for r in doc["rows"]] == [8, 64]
    for row in doc["rows"]:
        assert row["plan"]["fits"] and sum(row["plan"]["shardings"].values()) == 28  # small's 26 + 2 sequences
        assert 0 < row["mfu"] < 1 and row["imbalance"]["max_mean"] >= 1.0 and row["memory"]["fits"]
        assert row["step_time_s"] == pytest.approx(sum(s["exposed_s"] for s in row["stages"].values()))
        # why the curve bends: the stage the schedule hides least, and the GPU that sets it
        cp, stages = row["critical_path"], row["stages"]
        assert cp["exposed_s"] == max(s["exposed_s"] for s in stages.values()) and 0 <= cp["gpu"] < row["world"]
        assert cp["gpu"] == stages[cp["stage"]]["gpu"] and cp["set_by"] == stages[cp["stage"]]["set_by"]
        assert set(row["most_loaded"]) == {"lookup_bytes", "all_to_all_bytes", "dense_compute"}
        # the kept plan beside the most balanced one the planner rated
        assert row["plan"]["proposals"] >= 1 and 1.0 <= row["imbalance"]["best_found"] <= row["imbalance"]["max_mean"]
        assert row["plan"]["search"] == "fast" and row["plan"]["restrictions"]
        assert 0 < row["plan"]["cpu_seconds"] and "s of CPU)" in first.stderr  # planning's own CPU time
    assert re.search(r"\n\s+8\s.*: GPU \d+, ", first.stdout)  # the critical path column
    assert "plans rated" in first.stdout and "kept for speed" in first.stdout
    assert "critical path per stage" in first.stdout and "h100" in first.stdout
    for row in doc["rows"]:  # no --from, no storage bandwidth in a preset: the checkpoints' staging alone
        job = row["job"]
        assert job["startup_s"] is None and job["checkpoint_written_s"] is None and job["includes"] == ["checkpoints"]
        assert job["checkpoint_blocked_s"] == pytest.approx(job["checkpoint_bytes_per_gpu"] / H100.host_copy_Bps)
    assert "the job: 10,000 steps, a checkpoint every 500" in first.stdout and "no storage_GBps" in first.stdout
    assert doc["rows"][1]["per_rank_batch"] == doc["rows"][0]["per_rank_batch"] // 8
    # the second run reads both plans from the cache
    rows = [line for line in again.stdout.splitlines() if re.match(r"\s+(8|64)\s+\d+\s", line)]
    assert again.returncode == 0 and len(rows) == 2 and all("(cached)" in line for line in rows)


def test_the_report_draws_the_projection(projection, tmp_path):
    _, _, out = projection
    proc = _gembench("report", str(out), "--out", str(tmp_path / "rep"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    page = (tmp_path / "rep" / "index.html").read_text()
    assert "Projection: small on h100" in page and page.count("<figure>") == 1 and page.count("<svg") == 1
    assert "peak <b>989.4 TFLOP/s</b>" in page and "Overview" not in page


@pytest.mark.parametrize(
    "args, message",
    [
        (["--cluster", "a100x"], "no preset 'a100x'"),
        (["--gpus", "7"], "does not divide the global batch 512"),
        (["--gpus", "eight"], "--gpus takes world sizes"),
        (["--sharding", "diagonal"], "--sharding must be one of"),
        (["--set", "activation_checkpointing=most"], "activation_checkpointing"),
        (["--sparse-parallel", "3d"], "--sparse-parallel takes auto, 1d, 2d"),
        (["--sync-every", "0"], "--sync-every takes a positive number"),
        (["--sparse-parallel", "2d", "--gpus", "8,64"], "--gpus 8 has no sharding group smaller than the world"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    proc = _gembench("project", "--config", "small", *args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_batch_takes_one_global_batch_or_one_per_world():
    from gembench.harness.commands.project import _batches

    assert _batches("1024", [8, 64]) == (1024, {}) and _batches(None, [8]) == (None, {})
    assert _batches("8=55296,64=135168", [8, 64]) == (None, {8: 55296, 64: 135168})
    for spec, message in (("8=512", "names no batch for --gpus 64"), ("8=many", "takes N or W=N"), ("8=0", "positive")):
        with pytest.raises(UsageError, match=message):
            _batches(spec, [8, 64])


def test_a_cluster_file_with_a_missing_field_is_named(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(
        'name = "mine"\ngpus_per_node = 8\npeak_tflops = 900\nhbm_gib = 80\nhbm_GBps = 3000\n'
        "[intra]\nlatency_us = 10\nbandwidth_GBps = 300\n"
    )
    with pytest.raises(UsageError, match="field 'inter' is missing"):
        load_cluster(str(path))
    path.write_text(path.read_text() + "[inter]\nlatency_us = 20\n")
    with pytest.raises(UsageError, match=r"\[inter\] has no bandwidth_GBps"):
        load_cluster(str(path))
    path.write_text(path.read_text() + "bandwidth_GBps = 40\n")
    inter = load_cluster(str(path)).inter
    assert (inter.latency_s, inter.bandwidth_Bps) == (pytest.approx(20e-6), pytest.approx(40e9))


def test_a_from_result_of_another_config_is_refused(tmp_path):
    from synthetic import make_result, save

    path = save(tmp_path, make_result(config="tiny"))
    proc = _gembench("project", "--config", "small", "--gpus", "8", "--from", path)
    assert proc.returncode == 2 and "not 'small'" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """tiny on 2 gloo ranks (row-wise, so the reduce-scatter is there to count), the same on 1 rank
    at the per-rank batch with 1 thread (compute), and this host's links (--calibrate)."""
    import os

    d = tmp_path_factory.mktemp("check")
    common = ["--config", "tiny", "--steps", "3", "--warmup", "1", "--set", "compile=off", "--quiet"]
    two = _gembench("run", *common, "--nproc", "2", "--sharding", "row_wise", "--out", str(d / "two.json"))
    assert two.returncode == 0, two.stderr[-2000:]
    batch = json.loads((d / "two.json").read_text())["run"]["per_rank_batch"]
    one = _gembench(
        "run",
        *common,
        "--nproc",
        "1",
        "--batch",
        str(batch),
        "--out",
        str(d / "one.json"),
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert one.returncode == 0, one.stderr[-2000:]
    links = _gembench("project", "--calibrate", "--out", str(d / "here.toml"), "--quiet")
    assert links.returncode == 0, links.stderr[-2000:]
    return d


def test_calibrate_writes_a_cluster_file_of_this_hosts_links(measured):
    cluster = load_cluster(str(measured / "here.toml"))
    assert cluster.gpus_per_node == 2 and set(cluster.collectives) == {
        "all_to_all",
        "all_reduce",
        "reduce_scatter",
        "all_gather",
    }
    assert all(link.bandwidth_Bps > 1e6 for link in cluster.collectives.values())
    assert cluster.memory_Bps > 1e8  # every rank's Adam over a buffer far larger than the caches
    assert cluster.storage_Bps > 1e6 and cluster.host_copy_Bps == cluster.memory_Bps  # a checkpoint's two legs
    again = _gembench("project", "--calibrate", "--out", str(measured / "here.toml"), "--quiet")
    assert again.returncode == 2 and "never overwritten" in again.stderr


def test_calibrate_from_a_runs_trace_prices_its_collectives_as_they_ran(measured, table_wise):
    """Links fitted on the shared 2-rank run's own trace (table-wise, compute beside each call),
    the isolated links of --calibrate as their floor; --check of the row-wise run says which
    links it priced with, and the in-run ones can only make its collectives slower."""
    traces = table_wise[2] / "traces"
    out = measured / "in-run.toml"
    proc = _gembench(
        "project", "--calibrate", "--trace", str(traces), "--cluster", str(measured / "here.toml"), "--out", str(out)
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "kjt_all_to_all:" in proc.stdout and "calls in the run" in proc.stdout
    iso, run = load_cluster(str(measured / "here.toml")), load_cluster(str(out))
    assert run.links == "in_run" and {"kjt_all_to_all", "all_to_all"} <= set(run.in_run)
    for kind, link in run.in_run.items():
        floor = iso.collectives[KINDS.get(kind, kind)]
        assert link.latency_s >= floor.latency_s and link.bandwidth_Bps <= floor.bandwidth_Bps
    from gembench.harness.projection.check import check

    two, one = (json.loads((measured / f).read_text()) for f in ("two.json", "one.json"))
    before, after = check(two, one, iso), check(two, one, run)
    assert before["links"].startswith("isolated") and after["links"].startswith("in-run")
    stage = {r["stage"]: r for r in before["stages"]}, {r["stage"]: r for r in after["stages"]}
    for s in ("input_dist", "output_dist"):
        assert stage[1][s]["projected_s"] >= stage[0][s]["projected_s"]
        assert stage[1][s]["measured_s"] == stage[0][s]["measured_s"]


def test_check_prices_the_volumes_the_ranks_measured(measured):
    """The model's bytes per collective, from the run's own plan and the config's distributions,
    against the bytes the profiler saw: the reduce-scatter exactly, the all-to-all of sequence rows
    within the jagged lengths' spread between the expected and the drawn batch."""
    from gembench.harness.projection.offline_plan import plan_from_result

    r = json.loads((measured / "two.json").read_text())
    cfg = load_config("tiny")
    v = volumes(of(cfg), plan_from_result(r), expected_ids_per_example(cfg), 2, r["run"]["per_rank_batch"])
    kinds = r["comm"]["by_kind"]
    assert v["rs_world"] == kinds["embedding_reduce_scatter"]["bytes"]
    assert v["a2a_send"].mean() == pytest.approx(kinds["embedding_all_to_all"]["bytes"], rel=0.10)


def test_check_prints_projected_against_measured_per_stage(measured):
    proc = _gembench(
        "project",
        "--check",
        str(measured / "two.json"),
        "--from",
        str(measured / "one.json"),
        "--cluster",
        str(measured / "here.toml"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    print(proc.stdout)
    lines = {line.split()[0]: line for line in proc.stdout.splitlines()[3:] if line.strip()}
    for stage in (
        "input_dist",
        "embedding_lookup",
        "output_dist",
        "dense_forward",
        "backward",
        "grad_sync",
        "optimizer",
        "step",
    ):
        assert re.search(r"[+-]\d+\.\d%", lines[stage]), lines.get(stage)
    # the check refuses a 1-rank result in place of the distributed one, and a preset's links
    bad = _gembench(
        "project",
        "--check",
        str(measured / "one.json"),
        "--from",
        str(measured / "one.json"),
        "--cluster",
        str(measured / "here.toml"),
    )
    assert bad.returncode == 2 and "distributed result" in bad.stderr
    preset = _gembench("project", "--check", str(measured / "two.json"), "--from", str(measured / "one.json"))
    assert preset.returncode == 2 and "--calibrate" in preset.stderr


def test_dcnv2_mlperf_runs_capped_on_cpu_and_is_projected_uncapped():
    from gembench.models.config import for_device

    cfg = load_config("dcnv2-mlperf")
    assert max(cfg.sparse.rows) == 40_000_000 and cfg.data.global_batch == 65536 and cfg.sparse.dim == 128
    cpu = for_device(cfg, "cpu")
    assert max(cpu.sparse.rows) == 100_000 and cpu.hash != cfg.hash  # never compared with the uncapped one
    assert for_device(cfg, "cuda") is cfg
    small = load_config("small")
    assert for_device(small, "cpu") is small  # no cap in its file
    assert cpu.sparse.rows[5] == cfg.sparse.rows[5] == 3  # small tables as published


def test_from_prices_compute_as_measured(measured, tmp_path):
    out = tmp_path / "p.json"
    proc = _gembench(
        "project",
        "--config",
        "tiny",
        "--gpus",
        "2,8",
        "--from",
        str(measured / "one.json"),
        "--cluster",
        "h100",
        "--out",
        str(out),
        "--quiet",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "was measured on a CPU" in proc.stderr  # a CPU's compute on GPU presets is said out loud
    doc = json.loads(out.read_text())
    one = json.loads((measured / "one.json").read_text())["ranks"][0]
    assert doc["compute"]["source"].startswith("measured")
    per_example = one["stage_means_s"]["dense_forward"] / one["per_rank_batch"]
    for row in doc["rows"]:  # the dense forward scales with the per-rank batch, nothing else
        assert row["stages"]["dense_forward"]["time_s"] == pytest.approx(per_example * row["per_rank_batch"])
    # the job's start-up: the measured one, its sharding plan as the projection's planner took it
    start = json.loads((measured / "one.json").read_text())["startup"]
    for row in doc["rows"]:
        expected = start["to_first_step_s"] - start["phases"].get("plan", 0.0) + row["plan"]["seconds"]
        assert row["job"]["startup_s"] == pytest.approx(expected)
        assert row["job"]["includes"] == ["start-up", "checkpoints"] and row["job"]["end_to_end_mfu"] < row["mfu"]
    assert "the sharding plan as this projection's planner took at each size" in proc.stdout


def test_batch_per_gpu_scales_the_batch_with_the_world_and_small_setups_are_named(capsys):
    code, out, err = run_cli(
        ["project", "--config", "tiny", "--gpus", "8,16", "--batch-per-gpu", "64", "--quiet"], capsys
    )
    assert code == 0, err
    table = out.split("critical path per stage")[0]
    rows = [line.split() for line in table.splitlines() if line.strip().startswith(("8 ", "16 "))]
    assert [r[2] for r in rows] == ["64", "64"]  # batch/GPU: 512 and 1,024 in all
    assert "examples per GPU" not in err and "the tables hold 6 MiB in all" in err  # tiny's tables: CPU-sized
    code, out, err = run_cli(["project", "--config", "tiny", "--gpus", "8,16", "--quiet"], capsys)
    assert code == 0 and "note: 4 examples per GPU at 16 GPUs (global batch 64)" in err
    code, _, err = run_cli(["project", "--config", "tiny", "--batch", "64", "--batch-per-gpu", "8"], capsys)
    assert code == 2 and "--batch and --batch-per-gpu both set the batch: pass one" in err


def test_memory_reads_to_two_significant_figures():
    from gembench.harness.report.numbers import figures2

    assert [figures2(x) for x in (0.0012, 0.026, 0.2, 1.5, 12.3, 123.4)] == [
        "0.0012",
        "0.026",
        "0.20",
        "1.5",
        "12",
        "123",
    ]


def test_the_fast_search_names_a_plan_the_full_search_finds_faster(skew_config, monkeypatch, capsys, tmp_path):
    """With its restrictions tightened until the hot table can be neither replicated nor split,
    the fast search piles it on one GPU: the full search, asked because that plan is imbalanced,
    finds the row-wise one and the projection says so; unrestricted, nothing is said."""
    from gembench.harness.projection import offline_plan

    args = ["project", "--config", str(skew_config), "--gpus", "8", "--batch-per-gpu", "4096", "--quiet"]
    code, out, err = run_cli([*args, "--no-cache"], capsys)
    assert code == 0, err
    assert "--search full finds" not in out
    monkeypatch.setattr(offline_plan, "ROW_WISE_SHARDS", 0)
    monkeypatch.setattr(offline_plan, "dp_limit", lambda cluster: 0.0)
    code, out, err = run_cli([*args, "--no-cache", "--out", str(tmp_path / "p.json")], capsys)
    assert code == 0, err
    [row] = json.loads((tmp_path / "p.json").read_text())["rows"]
    full = row["plan"]["full_search"]
    assert row["imbalance"]["max_mean"] > 2 and full["imbalance"] < 1.1
    assert row["step_time_s"] > 1.1 * full["step_time_s"]
    assert re.search(r"8 GPUs: --search full finds a plan [\d.]+x faster: .* pass --search full", out), out


def _groups_plan(g: int, rows: int = 5000, dim: int = 16) -> dict:
    """tiny's eight tables table-wise, one on each GPU of a group of ``g``."""
    return {f"table_t{i}": {"sharding": "table_wise", "ranks": [i % g], "shard_sizes": [[rows, dim]]} for i in range(8)}


def test_a_2d_step_prices_its_replica_sync_by_the_formula_and_its_embeddings_within_the_group():
    """64 GPUs in groups of 8: one sync all-reduces a GPU's shard (fp32 weights, one fp32 Adagrad
    state a row) over the 8 replicas, once every N steps; consecutive groups sync over the NICs
    (one replica a node), strided ones within a node over NVLink. The embeddings' collectives are
    a world of 8's, the dense gradients' a world of 64's."""
    from gembench.harness.projection.sparse2d import SparseGroups

    cfg, plan, shard = load_config("tiny"), _groups_plan(8), 5000 * (16 * 4 + 4)
    for inter_host, link in ((True, H100.inter), (False, H100.intra)):
        groups = SparseGroups(8, 64, inter_host, sync_every=4)
        step = _pricer(cfg, 64, 32, groups=groups).price(plan)
        one_sync = link.latency_s + shard * bus_factor("all_reduce", 8) / link.bandwidth_Bps
        assert step.stages["replica_sync"].exposed_s == pytest.approx(one_sync / 4)
        assert step.examples_per_s == pytest.approx(64 * 32 / step.step_time_s)
    groups = SparseGroups(8, 64, True, sync_every=1)
    two_d = _pricer(cfg, 64, 32, groups=groups).price(plan)
    in_node, whole = _pricer(cfg, 8, 32).price(plan), _pricer(cfg, 64, 32).price(plan | {})
    assert two_d.stages["output_dist"].time_s == pytest.approx(in_node.stages["output_dist"].time_s)
    assert two_d.stages["grad_sync"].time_s == pytest.approx(whole.stages["grad_sync"].time_s)
    assert _pricer(cfg, 64, 32).price(plan).stages["replica_sync"].time_s == 0.0  # 1-D has none


def test_2d_offers_the_group_sizes_that_divide_the_world_and_place_them_evenly():
    from gembench.harness.projection.sparse2d import group_sizes, layouts

    assert group_sizes(64, 8) == [8, 16, 32] and group_sizes(8, 8) == [] and group_sizes(16, 8) == [8]
    assert group_sizes(48, 8) == [8, 16]  # 32 does not divide 48
    both = layouts(128, 16, 8, 1)
    assert [g.inter_host for g in both] == [True, False]
    consecutive, strided = both
    assert (consecutive.group_per_node(8), consecutive.replica_per_node(8)) == (8, 1)  # 2 nodes a group
    assert (strided.group_per_node(8), strided.replica_per_node(8)) == (1, 8)  # ranks k, k+8, ...: a node each
    assert layouts(48, 16, 8, 1)[-1].inter_host  # a stride of 3 does not tile nodes of 8: consecutive only


@pytest.fixture(scope="module")
def sparse_sweeps():
    """tiny at 16 GPUs (a group of 8: two layouts) under each --sparse-parallel."""
    from gembench.harness.projection.rates import datasheet_compute
    from gembench.harness.projection.sweep import sweep
    from gembench.harness.train.stack import STACKS

    m, stack = of(load_config("tiny")), STACKS["optimized"]
    compute = datasheet_compute(m, H100)
    batches = {16: 16 * 512}
    run = lambda mode, **kw: sweep(
        m, [16], H100, compute, None, "pipelined", False, lambda _: None, stack, batches, sparse=mode, **kw
    )[0]  # noqa: E731
    return m, {mode: run(mode) for mode in ("1d", "2d", "auto")}, run


def test_a_forced_layout_is_kept_and_auto_keeps_the_fastest(sparse_sweeps):
    _, rows, _ = sparse_sweeps
    one, two, auto = rows["1d"], rows["2d"], rows["auto"]
    assert one["sparse"]["chosen"] == "1d" and [c["layout"] for c in one["sparse"]["candidates"]] == ["1D"]
    assert two["sparse"]["chosen"] == "2d" and all(c["group_size"] == 8 for c in two["sparse"]["candidates"])
    # the sync moves the sharded tables alone (data-parallel ones are DDP's), every step by default
    sync, sharded = two["stages"]["replica_sync"]["exposed_s"], set(two["plan"]["shardings"]) - {"data_parallel"}
    assert sync == pytest.approx(two["sparse"]["sync_s"]) and (sync > 0) == bool(sharded)
    assert one["stages"]["replica_sync"]["exposed_s"] == 0 and one["sparse"]["sync_s"] == 0
    steps = [c["step_time_s"] for c in auto["sparse"]["candidates"] if c["fits"]]
    assert len(steps) == 3 and auto["step_time_s"] == pytest.approx(min(steps))
    assert auto["sparse"]["why"].startswith("2D G=8" if auto["sparse"]["chosen"] == "2d" else "1D")


def test_a_group_that_cannot_hold_the_tables_is_not_offered(sparse_sweeps, monkeypatch):
    from gembench.harness.projection import sweep as sweep_module
    from gembench.harness.projection.sparse2d import table_state_bytes

    m, _, run = sparse_sweeps
    # HBM for a sixteenth of the tables and the dense side: a group of 8 cannot hold them
    monkeypatch.setattr(sweep_module, "table_state_bytes", lambda _: 1e6 * H100.hbm_bytes)
    row = run("auto")
    assert table_state_bytes(m) < 1e6 * H100.hbm_bytes
    twod = [c for c in row["sparse"]["candidates"] if c["group_size"] == 8]
    assert twod and all(not c["fits"] and "not offered" in c["note"] for c in twod)
    assert row["sparse"]["chosen"] == "1d" and row["sparse"]["why"].startswith("1D: no 2D group fits")


def test_the_published_goals_are_met_or_not_on_the_rows_figures():
    from gembench.harness.projection.published import goals

    def row(world, ratio, imbalance, per_gpu):
        pub = {"ratio": ratio, "examples_per_s": 2e6 * world * (0.3 if world > 8 else 1.0)}
        return {"world": world, "plan": {"fits": True}, "published": pub, "imbalance": {"max_mean": imbalance},
                "examples_per_s": per_gpu * world}  # fmt: skip

    met = goals([row(8, 0.95, 1.0, 2e6), row(64, 1.0, 1.2, 1e6), row(128, 0.9, 1.4, 0.6e6)], 8)
    assert [ok for _, ok in met] == [True, True, True]
    assert "0.30 (>= 0.27; published 0.30)" in met[2][0]
    missed = goals([row(8, 0.95, 1.0, 2e6), row(64, 1.2, 1.2, 1e6), row(128, 0.9, 3.8, 0.4e6)], 8)
    assert [ok for _, ok in missed] == [False, False, False]


def test_check_prices_a_2d_run_as_its_groups_and_holds_its_replica_sync(measured):
    """2D on 2 ranks: groups of one rank, each holding every table, the two replicas merged every
    step. --check prices the run's plan as one group's and sets the replica sync beside its own."""
    from gembench.harness.projection.check import check

    out = measured / "two_2d.json"
    common = ["--config", "tiny", "--steps", "3", "--warmup", "1", "--set", "compile=off", "--quiet"]
    proc = _gembench("run", *common, "--nproc", "2", "--set", "sparse_parallel=2d", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    two, one = json.loads(out.read_text()), json.loads((measured / "one.json").read_text())
    assert two["run"]["sparse_parallel"]["sharding_group"] == 1
    doc = check(two, one, load_cluster(str(measured / "here.toml")))
    rows = {r["stage"]: r for r in doc["stages"]}
    assert rows["replica_sync"]["projected_s"] > 0 and rows["replica_sync"]["measured_s"] > 0
    one_d = check(json.loads((measured / "two.json").read_text()), one, load_cluster(str(measured / "here.toml")))
    assert "replica_sync" not in {r["stage"] for r in one_d["stages"]}
