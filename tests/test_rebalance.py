"""`gembench run --nproc 2 --rebalance`: the re-plan's inputs (pure functions), one real run on
sorted IDs (the row-wise head moved off shard 0, the state carried over), and the refusals."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
from synthetic import gembench_cli, run_cli

from gembench.harness.train.distributed import rebalance


def measured(hist: list[float], rows: int = 100) -> rebalance.Measured:
    h = np.asarray(hist, dtype=float)
    return rebalance.Measured(
        ids={"table_a": 1000.0},
        pooling={"table_a": 10.0},
        hist={"table_a": h / h.sum()},
        rows={"table_a": rows},
        seconds_per_byte=1e-9,
        world=2,
    )


def test_share_of_rows_reads_the_histogram_partial_bins_pro_rata():
    m = measured([8, 1, 1, 0])  # 4 bins of 25 rows: the head in the first
    assert m.share("table_a", 0, 50) == pytest.approx(0.9)
    assert m.share("table_a", 50, 100) == pytest.approx(0.1)
    assert m.share("table_a", 0, 12.5) == pytest.approx(0.4)  # half the first bin
    assert m.share("table_a", 0, 100) == pytest.approx(1.0)


def test_row_skew_and_plan_change():
    m = measured([8, 1, 1, 0])
    plan = {
        "table_a": {
            "sharding": "row_wise",
            "ranks": [0, 1],
            "shard_offsets": [[0, 0], [50, 0]],
            "shard_sizes": [[50, 8], [50, 8]],
        }
    }
    assert rebalance.row_skew(m, plan) == {"table_a": pytest.approx(0.9 / 0.5)}
    moved = {"table_a": {"sharding": "table_wise", "ranks": [1]}}
    assert rebalance.plan_change(plan, moved) == [
        {"table": "table_a", "before": "row_wise@0,1", "after": "table_wise@1"}
    ]
    assert rebalance.plan_change(plan, plan) == []


def test_measured_lookups_price_each_shard_by_the_bytes_it_moves():
    from torchrec.distributed.planner.types import Perf

    m = measured([8, 1, 1, 0])
    shard = lambda lo: SimpleNamespace(
        offset=[lo, 0],
        size=[50, 8],  # noqa: E731
        perf=Perf(fwd_compute=1.0, fwd_comms=0.5, bwd_compute=2.0, bwd_comms=0.7),
    )
    option = SimpleNamespace(name="table_a", sharding_type="row_wise", shards=[shard(0), shard(50)])
    rebalance.MeasuredLookups(m).estimate([option])
    head, tail = option.shards
    # (1000 IDs x share read + 100 examples' rows written) x 8 columns x 4 bytes x 1 ns, in ms;
    # backward in TorchRec's 2:1 proportion; comms kept
    assert head.perf.fwd_compute == pytest.approx(1e3 * (1000 * 0.9 + 100) * 8 * 4 * 1e-9)
    assert tail.perf.fwd_compute == pytest.approx(1e3 * (1000 * 0.1 + 100) * 8 * 4 * 1e-9)
    assert head.perf.bwd_compute == pytest.approx(2 * head.perf.fwd_compute)
    assert head.perf.fwd_comms == 0.5 and head.perf.bwd_comms == 0.7


@pytest.fixture(scope="module")
def sorted_run(tmp_path_factory):
    from gembench.models.config import load_config

    d = tmp_path_factory.mktemp("rebalance")
    text = open(load_config("tiny").source).read().replace("[data]\n", '[data]\nid_layout = "sorted"\n', 1)
    cfg = d / "tiny-sorted.toml"
    cfg.write_text(text)
    proc = gembench_cli(
        "run",
        "--config",
        str(cfg),
        "--nproc",
        "2",
        "--steps",
        "4",
        "--warmup",
        "1",
        "--rebalance",
        "--sharding",
        "untold",  # TorchRec's planner as it ships: told neither the pooling nor the skew
        "--set",
        "compile=off",
        "--out",
        str(d / "r.json"),
        "--quiet",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads((d / "r.json").read_text())


def test_rebalance_moves_the_sorted_head_off_the_first_row_wise_shard(sorted_run):
    from gembench.harness.store.schema import validate

    proc, r = sorted_run
    rb = r["rebalance"]
    validate(r)  # the result schema, rebalance section included
    before, after = rb["before"], rb["after"]
    # the planner told nothing splits the tables row-wise; sorted IDs put each table's head on
    # shard 0, which the measured per-row load shows and the re-plan avoids
    assert any(p["sharding"] == "row_wise" for p in before["plan"].values())
    assert max(rb["row_skew_before"].values()) > 1.5
    assert rb["moved"] and all(m["before"] != m["after"] for m in rb["moved"])
    assert after["plan"] == r["plan"]  # the result is the rebalanced run's
    # the planner's plan ran once more after it, on the carried state: the same plan, the same load
    again = rb["again"]
    assert rb["again_same_plan"] and again["loads"][rb["primary"]] == before["loads"][rb["primary"]]
    assert len(again["step_s"]) == len(before["step_s"]) == len(after["step_s"]) == 4
    primary = rb["primary"]
    assert after["metrics"][primary]["max_mean"] < before["metrics"][primary]["max_mean"]
    assert rb["goal"]["max_mean"] == pytest.approx(after["metrics"][primary]["max_mean"])
    # measured pooling is what the batches hold: close to the config's expectation
    for t, v in rb["pooling"]["measured"].items():
        assert v == pytest.approx(rb["pooling"]["expected"][t], rel=0.25)
    # every dense and table tensor carried (each table's sum checked in the run), optimizer state too
    assert rb["carried"]["tensors"] > 50 and rb["carried"]["optimizer_states"] > 0
    lo, hi = rb["step_change"]["ci95"]
    assert lo <= rb["step_change"]["ratio"] <= hi
    assert "rebalance: the planner's plan, then TorchRec's planner again" in proc.stdout
    assert "moved " in proc.stdout and "goal: measured max/mean <= 1.10" in proc.stdout
    assert "planner's plan again" in proc.stdout and "the runs went A, B, A'" in proc.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--rebalance"], "--rebalance re-plans a sharded job on several ranks"),
        (["--nproc", "1", "--rebalance"], "it needs --nproc 2 or more"),
        (["--nproc", "2", "--rebalance", "--sharding", "table_wise"], "forces every table"),
        (["--nproc", "2", "--rebalance", "--pipeline"], "drop --pipeline"),
    ],
)
def test_rebalance_refusals_are_one_line_and_exit_2(capsys, args, message):
    code, _, err = run_cli(["run", "--config", "tiny", *args], capsys)  # in process: no start-up to pay
    assert code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1
