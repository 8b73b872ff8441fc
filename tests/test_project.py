"""`gembench project`: the cost model's parts, the offline planner, the command's
refusals, --calibrate on gloo, and --check against measured runs on tiny."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from gembench.errors import UsageError
from gembench.harness.metrics.comm import bus_factor
from gembench.harness.projection.cluster import PRESETS, load_cluster
from gembench.harness.projection.cost import EMB_BYTES, collective_time, volumes
from gembench.harness.store.schema import validate
from gembench.models.config import load_config
from gembench.models.data import expected_ids_per_example

H100 = PRESETS["h100"]


def _gembench(*args, env=None):
    return subprocess.run([sys.executable, "-m", "gembench", *args], capture_output=True, text=True, env=env)


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
    tw, rw = volumes(cfg, _plan("table_wise", 4), ids, 4, 8), volumes(cfg, _plan("row_wise", 4), ids, 4, 8)
    total = 4 * 8 * 3.0 * 16 * EMB_BYTES
    assert tw["lookup"].sum() == pytest.approx(total) and rw["lookup"].sum() == pytest.approx(total)
    # table-wise puts all of it on one rank (imbalance 4 on 4 ranks), row-wise spreads it
    assert tw["lookup"].max() / tw["lookup"].mean() == pytest.approx(4.0)
    assert np.allclose(rw["lookup"], total / 4)
    # row-wise pooled tables return partial sums by reduce-scatter, table-wise by all-to-all
    assert rw["reduce_scatter"] == [(4, 4 * 8 * 16 * EMB_BYTES)] and tw["reduce_scatter"] == []
    assert tw["a2a_recv"].sum() == pytest.approx(4 * 8 * 16 * EMB_BYTES)


def test_sorted_ids_load_the_first_row_shard_with_the_head():
    import dataclasses

    cfg = load_config("tiny")
    ids = {"table_t0": 3.0}
    sorted_cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, id_layout="sorted"))
    hashed, head = volumes(cfg, _plan("row_wise", 4), ids, 4, 8), volumes(sorted_cfg, _plan("row_wise", 4), ids, 4, 8)
    assert head["lookup"].sum() == pytest.approx(hashed["lookup"].sum())  # the same lookups, elsewhere
    assert np.allclose(hashed["lookup"], hashed["lookup"].mean())
    assert head["lookup"][0] > 2 * head["lookup"][1:].max()  # shard 0 holds the hot rows


def test_expected_ids_follow_the_configs_distributions():
    cfg = load_config("dcnv2")  # pooling "fixed": exactly the listed IDs
    ids = expected_ids_per_example(cfg)
    assert [ids[f"table_t{i}"] for i in range(len(cfg.sparse.rows))] == [float(p) for p in cfg.sparse.pooling]
    small = load_config("small")
    assert all(ids > 0 for ids in expected_ids_per_example(small).values())


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
    assert "critical path per stage" in first.stdout and "h100" in first.stdout
    assert doc["rows"][1]["per_rank_batch"] == doc["rows"][0]["per_rank_batch"] // 8
    # the second run reads both plans from the cache
    assert again.returncode == 0 and again.stdout.count("(cached)") == 2


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
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    proc = _gembench("project", "--config", "small", *args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


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
    again = _gembench("project", "--calibrate", "--out", str(measured / "here.toml"), "--quiet")
    assert again.returncode == 2 and "never overwritten" in again.stderr


def test_check_prices_the_volumes_the_ranks_measured(measured):
    """The model's bytes per collective, from the run's own plan and the config's distributions,
    against the bytes the profiler saw: the reduce-scatter exactly, the all-to-all of sequence rows
    within the jagged lengths' spread between the expected and the drawn batch."""
    from gembench.harness.projection.offline_plan import plan_from_result

    r = json.loads((measured / "two.json").read_text())
    cfg = load_config("tiny")
    v = volumes(cfg, plan_from_result(r), expected_ids_per_example(cfg), 2, r["run"]["per_rank_batch"])
    kinds = r["comm"]["by_kind"]
    assert sum(b for _, b in v["reduce_scatter"]) == kinds["embedding_reduce_scatter"]["bytes"]
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
