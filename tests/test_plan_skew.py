"""The run's planner told the skew: a row-split shard priced at the lookups its rows serve under
row_skew() (DeclaredSkew), on a CPU every shard at the bytes it moves (LookupBytes), and no table
split by rows too small to give every rank a share."""

import json

import pytest
from synthetic import gembench_cli


def test_small_tables_are_not_split_by_rows_and_forced_types_stand():
    from gembench.harness.train.distributed.plan import MIN_ROWS_PER_SHARD, allowed_types

    rows = {"tiny": 20, "edge": 2 * MIN_ROWS_PER_SHARD - 1, "big": 2 * MIN_ROWS_PER_SHARD}
    types = allowed_types(rows, 2, {}, sharded_only=False)
    assert set(types) == {"tiny", "edge"}
    assert types["tiny"] == ["table_wise", "column_wise", "data_parallel"]
    assert allowed_types(rows, 2, {"tiny": "row_wise"}, False)["tiny"] == ["row_wise"]  # the user's word
    rebalance = allowed_types(rows, 2, {}, sharded_only=True)
    assert rebalance["big"] == ["table_wise", "row_wise", "column_wise", "table_row_wise"]
    assert rebalance["tiny"] == ["table_wise", "column_wise"]


def test_on_a_cpu_a_lookup_is_priced_at_the_bytes_it_moves():
    """Rows read at the pooling factor plus outputs written: a pooled table-wise shard of width 16
    pooling 3 IDs moves 4 rows an example, a sequence shard 6; a row-wise half reads half the IDs
    and still writes every example's row; the backward keeps TorchRec's proportion, comms stay."""
    from types import SimpleNamespace

    import torch
    from torchrec.distributed.planner.types import Perf

    from gembench.harness.train.distributed.plan import LookupBytes

    def option(kind, pooled, halves=1):
        shards = [
            SimpleNamespace(
                size=[1000 // halves, 16], perf=Perf(fwd_compute=1.0, fwd_comms=0.5, bwd_compute=2.0, bwd_comms=0.7)
            )
            for _ in range(halves)
        ]
        t = torch.empty(1000, 16, device="meta")
        return SimpleNamespace(
            sharding_type=kind, tensor=t, batch_size=8, input_lengths=[3.0], is_pooled=pooled, shards=shards
        )

    options = [option("table_wise", True), option("table_wise", False), option("row_wise", True, 2)]
    LookupBytes(world=2, bandwidth=64.0).estimate(options)
    row = 16 * 4 / 64.0  # a 16-column fp32 row over the bandwidth
    tw, seq, rw = (o.shards[0].perf for o in options)
    assert tw.fwd_compute == pytest.approx(16 * 4 * row)  # 16 examples x (3 rows read + 1 written)
    assert seq.fwd_compute == pytest.approx(16 * 6 * row)  # 3 read + 3 written
    assert rw.fwd_compute == pytest.approx(16 * 2.5 * row)  # 1.5 read + 1 written
    assert tw.bwd_compute == pytest.approx(2 * tw.fwd_compute) and tw.fwd_comms == 0.5 and tw.bwd_comms == 0.7


def test_declared_skew_prices_the_head_shard_at_its_lookups():
    from types import SimpleNamespace

    import torch
    from torchrec.distributed.planner.types import Perf

    from gembench.harness.metrics.imbalance import zipf_share
    from gembench.harness.train.distributed.plan import DeclaredSkew

    def shard(lo):
        return SimpleNamespace(
            offset=[lo, 0], size=[500, 8], perf=Perf(fwd_compute=1.0, fwd_comms=0.5, bwd_compute=2.0, bwd_comms=0.7)
        )

    option = SimpleNamespace(
        name="table_t0",
        sharding_type="row_wise",
        tensor=torch.empty(1000, 8, device="meta"),
        shards=[shard(0), shard(500)],
    )
    uniform = SimpleNamespace(name="table_t1", sharding_type="row_wise", tensor=option.tensor, shards=[shard(0)])
    DeclaredSkew({"table_t0": 1.2}).estimate([option, uniform])
    head, tail = option.shards
    assert head.perf.fwd_compute == pytest.approx(zipf_share(0, 500, 1000, 1.2) / 0.5)
    assert head.perf.bwd_compute == pytest.approx(2 * head.perf.fwd_compute)
    assert head.perf.fwd_compute + tail.perf.fwd_compute == pytest.approx(2.0)  # the lookups only moved
    assert head.perf.fwd_comms == 0.5 and uniform.shards[0].perf.fwd_compute == 1.0  # no skew: as TorchRec priced


def test_the_planner_told_sorted_ids_keeps_the_heads_off_row_wise_shards(tmp_path):
    """tiny with IDs sorted (hottest rows first): TorchRec's planner alone splits every table by
    rows and rates the plan balanced; told row_skew(), it does not split the heads, and the
    imbalance it plans is the one the batches then show (within 15%)."""
    from gembench.models.config import load_config

    text = open(load_config("tiny").source).read().replace("[data]\n", '[data]\nid_layout = "sorted"\n', 1)
    cfg = tmp_path / "tiny-sorted.toml"
    cfg.write_text(text)
    out = tmp_path / "r.json"
    proc = gembench_cli(
        "run", "--config", str(cfg), "--nproc", "2", "--steps", "4", "--warmup", "1", "--set", "compile=off",
        "--out", str(out), "--quiet",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert not any(p["sharding"] == "row_wise" for p in r["plan"].values())
    imb = r["imbalance"]
    planned, measured = imb["planned"]["metrics"]["lookup_ms"], imb["measured"]["metrics"]["bytes_moved"]
    assert planned["max_mean"] > 1.02
    assert measured["max_mean"] == pytest.approx(planned["max_mean"], rel=0.15)
