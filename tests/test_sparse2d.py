"""2D sparse parallelism (TorchRec's DMPCollection) on 4 gloo ranks: tiny sharded within 2 groups
of 2 ranks and replicated across them, against the 1-D plan over all 4; and its refusals.

Each run costs ~10 s on 2 cores (fp32, compile off: the switch, not the compiler, is under test).
"""

import json

import numpy as np
import pytest
from synthetic import gembench_cli, run_cli

BF16_RTOL = 1.6e-2  # torch.testing's relative tolerance for bfloat16


def four_ranks(tmp_path_factory, name, *switches):
    out = tmp_path_factory.mktemp(name) / "r.json"
    cmd = ["run", "--config", "tiny", "--nproc", "4", "--steps", "8", "--warmup", "0", "--dtype", "fp32"]
    cmd += ["--set", "compile=off", *[a for s in switches for a in ("--set", s)], "--quiet", "--out", str(out)]
    proc = gembench_cli(*cmd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


@pytest.fixture(scope="module")
def one_d(tmp_path_factory):
    return four_ranks(tmp_path_factory, "one_d")[1]


@pytest.fixture(scope="module")
def two_d(tmp_path_factory):
    return four_ranks(tmp_path_factory, "two_d", "sparse_parallel=2d")


def test_the_layout_is_torchrecs_and_said(two_d):
    proc, r = two_d
    sparse = r["run"]["sparse_parallel"]
    # TorchRec places a group's ranks W/G apart, so a shard's replicas are neighbours (one host)
    assert sparse["sharding_group"] == 2 and sparse["groups"] == [[0, 2], [1, 3]]
    assert sparse["replica_groups"] == [[0, 1], [2, 3]] and sparse["replica_sync_every"] == 1
    assert "sparse_parallel=2d" in r["run"]["choices"]
    assert "2D sparse parallel: that plan (its ranks a group's) on each of 2 groups of 2 ranks" in proc.stdout
    # the plan is one group's: every table's shards on ranks 0 and 1 of a group
    assert {k for t in r["plan"].values() for k in t["ranks"]} <= {0, 1}
    # the planner's loads, one a rank of the job: each rank holds what its place in the group does
    perf = r["imbalance"]["planned"]["loads"]["perf_ms"]
    assert len(perf) == 4 and perf[0] == perf[1] and perf[2] == perf[3]


def test_the_replica_sync_is_a_stage_and_moves_the_shards_and_their_adagrad_state(two_d):
    _, r = two_d
    assert "replica_sync" in r["samples"]["stages"] and min(r["samples"]["stages"]["replica_sync"]) > 0
    groups = r["run"]["sparse_parallel"]["groups"]
    for rank in r["ranks"]:
        place = next(g.index(rank["rank"]) for g in groups if rank["rank"] in g)
        # fp32 weights and one fp32 row-wise Adagrad sum a row, of every shard this rank holds
        expected = sum(
            rows * cols * 4 + rows * 4
            for t in r["plan"].values()
            for k, (rows, cols) in zip(t["ranks"], t["shard_sizes"])
            if k == place
        )
        sync = rank["comm"]["by_kind"]["embedding_replica_sync"]
        assert sync["bytes"] == expected and sync["calls"] == 2  # weights, then optimizer state
        assert sync["exposed_s"] > 0  # the staged step overlaps nothing


def test_losses_equal_the_one_d_plans_within_bf16_tolerance(one_d, two_d):
    _, r = two_d
    assert "sparse_parallel" not in one_d["run"]
    for a, b in zip(one_d["ranks"], r["ranks"]):
        # the first step is the same model on the same batch, before any update: the same loss
        assert b["samples"]["loss"][0] == a["samples"]["loss"][0]
        level = np.mean(b["samples"]["loss"]) / np.mean(a["samples"]["loss"]) - 1
        assert abs(level) < BF16_RTOL, (a["rank"], level)
    # the two layouts train the same model on the same batches: same model FLOPs
    assert r["flops"]["model_per_step"] == one_d["flops"]["model_per_step"]


def test_the_pipelined_step_syncs_the_replicas_too(tmp_path):
    out = tmp_path / "p.json"
    proc = gembench_cli(
        *("run", "--config", "tiny", "--nproc", "4", "--steps", "2", "--warmup", "1", "--pipeline", "--quiet"),
        *("--set", "compile=off", "--set", "sparse_parallel=2d", "--set", "replica_sync_every=2"),
        *("--set", "replica_merge=updates", "--out", str(out)),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    syncs = r["samples"]["stages"]["replica_sync"]
    assert len(syncs) == 2 and r["run"]["sparse_parallel"]["replica_sync_every"] == 2
    assert "each shard's replicas merged by their updates every 2 steps" in proc.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        ((), "sparse_parallel=2d shards the tables within groups of ranks"),
        (("--nproc", "4", "--set", "sharding_group=3"), "sharding_group=3 must divide the 4 ranks"),
        (("--nproc", "4", "--set", "sharding_group=4"), "sharding_group=4 must divide the 4 ranks into 2 or more"),
        (("--nproc", "4", "--checkpoint-every", "2", "--checkpoint-dir", "ck"), "--checkpoint-every does not take"),
    ],
)
def test_refusals_are_one_line_and_exit_2(args, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["run", "--config", "tiny", "--set", "sparse_parallel=2d", *args], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_two_d_numbers_without_two_d_are_refused(capsys):
    code, _, err = run_cli(["run", "--config", "tiny", "--nproc", "2", "--set", "sharding_group=2"], capsys)
    assert code == 2 and "applies to sparse_parallel=2d" in err


def test_the_layout_is_in_the_schema(two_d, tmp_path):
    from gembench.harness.store import results

    out = tmp_path / "r.json"
    out.write_text(json.dumps(two_d[1]))
    assert results.load_result(out)["run"]["sparse_parallel"]["mode"] == "2d"


def test_ablate_on_ranks_sets_2d_beside_1d(one_d, two_d):
    from gembench.harness.commands.ablate_ranks import RANK_VARIANTS, sparse_comm_ms, two_d_line

    assert ("sparse_parallel=2d", ("sparse_parallel=2d",), {}) in RANK_VARIANTS
    _, r = two_d
    line = two_d_line(one_d, r)
    level = np.mean(r["samples"]["loss"]) / np.mean(one_d["samples"]["loss"]) - 1
    assert line.startswith(f"2D (average): 2 groups of 2 ranks; rank 0's loss level {level:+.2%} of 1-D's")
    sync_ms = 1e3 * r["comm"]["by_kind"]["embedding_replica_sync"]["time_s"]
    assert f"replica sync {sync_ms:.1f} ms" in line
    assert sparse_comm_ms(r) > sync_ms and sparse_comm_ms(one_d) > 0


def test_a_merge_of_updates_moves_each_row_as_far_as_the_replicas_moved_it_together():
    import torch

    from gembench.harness.train.distributed.sparse2d import SumOfUpdates

    a, b = torch.zeros(3, 2), torch.zeros(3, 2)  # two replicas of one shard, as last merged
    merge_a = SumOfUpdates(None, reduce=lambda ts: [t.add_(b - 0) for t in ts])  # the other's change
    merge_b = SumOfUpdates(None, reduce=lambda ts: [t.add_(a_change) for t in ts])
    merge_a.base([a]), merge_b.base([b])
    a[0] += 1.0  # only replica a's group looked row 0 up, only b's row 1, both row 2
    b[1] += 2.0
    a[2] += 0.5
    b[2] += 0.25
    a_change = a.clone()
    merge_a([a])
    merge_b([b])
    assert torch.equal(a, b) and a.tolist() == [[1.0, 1.0], [2.0, 2.0], [0.75, 0.75]]
    # the next merge counts from here: no change, no move
    merge_a.reduce = lambda ts: None
    merge_a([a])
    assert a.tolist() == [[1.0, 1.0], [2.0, 2.0], [0.75, 0.75]]
