"""`gembench run --nproc 2` end to end: sharded tiny GEM on 2 gloo ranks, as a user runs it.

Each run costs ~15-25 s on 2 cores, so the module makes three: table-wise (staged, traced),
row-wise (pipelined, --verbose) on one planted-skew config, and the fault runs; plus parent-side
refusals.
"""

import json
import os
import socket
import time

import pytest
import torch
from synthetic import gembench_cli, run_cli, schema_and_readers_agree

from gembench.errors import UsageError
from gembench.harness.device.hardware import cpu_native_bf16
from gembench.harness.train.distributed.plan import parse_sharding
from gembench.models.config import load_config
from gembench.models.data import SyntheticData

# the skew config (tiny with one hot table) and its table-wise run are conftest's session fixtures:
# tests/test_results.py reads the same run


@pytest.fixture(scope="module")
def row_wise(skew_config, tmp_path_factory):
    out = tmp_path_factory.mktemp("rw") / "r.json"
    proc = gembench_cli(
        "run",
        "--config",
        str(skew_config),
        "--nproc",
        "2",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--sharding",
        "row_wise",
        "--pipeline",
        "--out",
        str(out),
        "--quiet",
        "--verbose",
        "--set",
        "compile=off",
    )  # table_wise's run checks the compiled dense arch on ranks
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


def test_one_result_with_per_rank_stages_imbalance_and_comm(table_wise):
    proc, r, d = table_wise
    run = r["run"]
    assert run["nproc"] == 2 and run["global_batch"] == 64 and run["per_rank_batch"] == 32
    # the optimized stack as on one process (harness/train/stack.py), as it ran: compile and fused Adam included
    assert run["options"] == {
        "fused_embeddings": True,
        "jagged": True,
        "bf16": cpu_native_bf16(),  # the stack's bf16 where the CPU multiplies it
        "fused_optimizer": True,
        "compile": True,
        "pipeline": False,
        "dense_parallel": "ddp",
        "activation_checkpointing": "none",
        "content": "on",
        "activation_dtype": "compute",
        "sparse_parallel": "1d",
        "sharding_group": 0,
        "replica_sync_every": 1,
        "replica_merge": "average",
    }
    assert run["backend"] == "gloo" and run["stack"] == "optimized-staged"
    assert [x["rank"] for x in r["ranks"]] == [0, 1]
    stages = {
        "data",
        "input_dist",
        "embedding_lookup",
        "output_dist",
        "dense_forward",
        "backward",
        "grad_sync",
        "optimizer",
    }
    for rank in r["ranks"]:
        assert set(rank["samples"]["stages"]) == stages
        assert all(len(v) == 3 for v in rank["samples"]["stages"].values())
        assert rank["tflops"] > 0
    # critical path = per stage the slowest rank
    crit = r["imbalance"]["critical_path_s"]
    for s in stages:
        assert crit[s] == max(x["stage_means_s"][s] for x in r["ranks"])
    assert set(r["imbalance"]["measured"]["loads"]) >= {
        "ids",
        "unique_ids",
        "bytes_read",
        "bytes_written",
        "bytes_moved",
        "lookup_s",
    }
    assert set(r["imbalance"]["planned"]["loads"]) == {"perf_ms", "lookup_ms", "storage_bytes"}
    assert {"kjt_all_to_all", "embedding_all_to_all", "embedding_grad_all_to_all", "dense_grad_all_reduce"} <= set(
        r["comm"]["by_kind"]
    )
    # staged: nothing overlaps, so nearly all communication is exposed
    assert all(e["overlap_fraction"] < 0.2 for e in r["comm"]["exposure"])
    m = r["metrics"]
    assert 0 < m["mfu"] < 1 and m["imbalance_max_mean"] >= 1 and 0 < m["exposed_comm_fraction"] < 1
    # MFU = job FLOPs / step / sum of peaks
    assert m["mfu"] == pytest.approx(
        r["flops"]["model_per_step"] / m["step_time_s"] / (sum(r["peak"]["per_rank"]) * 1e12), rel=1e-9
    )
    for title in ("critical path", "rank 0", "embedding imbalance", "planned", "communication", "exposed"):
        assert title in proc.stdout
    assert "global 64 = 2 ranks x 32 per rank" in proc.stdout
    assert sorted(os.listdir(d / "traces")) == ["rank0.json", "rank1.json"]
    # cost counters: rank 0's at the top, each rank's in its entry, numbers copied to metrics
    assert r["counters"] == r["ranks"][0]["counters"]
    for rank in r["ranks"]:
        c = rank["counters"]
        assert c["aten_ops"] > 0 and c["kernels"] is None and c["h2d_bytes"] == 0
        assert c["graph_breaks"] == 0 and c["recompiles"] == 0  # the compiled dense arch neither breaks nor recompiles
    assert all(m[k] == r["counters"][k] for k in ("aten_ops", "host_syncs", "h2d_bytes", "recompiles"))


NOISE = (
    "The topology was constructed directly",
    "known issue with TorchRec's dense tensor size",
    "USDT:",
    "profiler_start",
    "profiler_stop",
    "FutureWarning",
)


def test_library_noise_is_kept_off_the_terminal_unless_verbose(table_wise, row_wise):
    quiet, verbose = table_wise[0], row_wise[0]  # row_wise runs with --verbose
    for line in NOISE:
        assert line not in quiet.stdout + quiet.stderr, line
    assert "library message(s) off the terminal" in quiet.stderr and "--verbose" in quiet.stderr
    # the planner's logging warning (not silenced by the fixtures' PYTHONWARNINGS=ignore) is back
    assert "The topology was constructed directly" in verbose.stderr


def test_schema_and_writer_agree_on_the_distributed_result(table_wise, tmp_path, capsys):
    schema_and_readers_agree(table_wise[2] / "r.json", tmp_path, capsys)


def test_mfu_basis_and_coverage_say_what_they_are(table_wise):
    proc, r, _ = table_wise
    peak, s = r["peak"], r["summary"]
    assert peak["basis"] == "ranks" and peak["basis_text"] == "2 rank(s) x peak at 1 thread(s)"
    host = peak["host"]
    assert host["threads"] == 2 and host["hosts"] == 1
    # the two bases divide the same FLOPs: their MFU ratio is the inverse ratio of the peaks
    assert s["mfu_host"] / s["mfu"] == pytest.approx(sum(peak["per_rank"]) / host["tflops"], rel=1e-9)
    assert r["metrics"]["mfu_host"] == s["mfu_host"]
    assert "MFU basis: 2 rank(s) x peak at 1 thread(s)" in proc.stdout
    assert "MFU, host basis" in proc.stdout and "of the host's peak at 2 thread(s)" in proc.stdout
    assert all(0 < x["stage_coverage"] <= 1.05 for x in r["ranks"])
    assert "slowest rank's time in each stage, summed" in proc.stdout
    assert "of each rank's own step wall time" in proc.stdout


def expected_bytes(r, cfg, rank):
    """Bytes rank ``rank`` sends per kind over the profiled steps, from the batches and the plan."""
    world, b_local, b_global = 2, r["run"]["per_rank_batch"], r["run"]["global_batch"]
    owner = {t.removeprefix("table_"): p["ranks"] for t, p in r["plan"].items()}
    assert all(len(ranks) == 1 for ranks in owner.values())  # table-wise: one shard per table
    pooled = [f"t{i}" for i in range(len(cfg.sparse.rows))]
    seqs = [s.name for s in cfg.sequences]
    local_pooled = [f for f in pooled if owner[f] == [rank]]
    kjt = emb = grad = 0
    for index in r["run"]["batches"]["profiled"]:
        batches = [SyntheticData(cfg, seed=0, batch_size=b_local, rank=q).batch(index) for q in range(world)]
        mine = batches[rank]
        # KJT all-to-all, per module: splits (lengths, values, stride) x world int64, then every
        # feature's lengths (B_local each) and values go to their table's owner
        for kjt_ in (mine.sparse, mine.seq):
            kjt += (3 * world + kjt_.lengths().numel() + kjt_.values().numel()) * 8
        # pooled embeddings back: for every example of the job, this rank's tables' sums (fp32)
        emb += b_global * len(local_pooled) * cfg.sparse.dim * 4
        # sequence embeddings back: one row per ID this rank received for its sequence tables
        emb += sum(b.seq[s].values().numel() for b in batches for s in seqs if owner[s] == [rank]) * cfg.hstu.dim * 4
        # gradients of the pooled embeddings of this rank's own examples, for every table
        grad += b_local * len(pooled) * cfg.sparse.dim * 4
        grad += sum(mine.seq[s].values().numel() for s in seqs) * cfg.hstu.dim * 4
    return {"kjt_all_to_all": kjt, "embedding_all_to_all": emb, "embedding_grad_all_to_all": grad}


def test_all_to_all_bytes_equal_what_batches_and_plan_imply(table_wise, skew_config):
    _, r, _ = table_wise
    cfg = load_config(str(skew_config))
    for rank, calls in enumerate(r["comm"]["calls"]):
        counted = {}
        for c in calls:
            counted[c["kind"]] = counted.get(c["kind"], 0) + c["bytes"]
        want = expected_bytes(r, cfg, rank)
        assert {k: counted.get(k, 0) for k in want} == want, f"rank {rank}"


def test_planted_skew_table_wise_vs_row_wise(table_wise, row_wise):
    tw, rw = table_wise[1], row_wise[1]
    # one hot table, all of it on one rank: that rank reads most of the bytes
    assert tw["metrics"]["imbalance_max_mean"] > 1.5
    # the same data with every table split by rows over both ranks: close to even
    assert rw["metrics"]["imbalance_max_mean"] < 1.1
    for r in (tw, rw):
        assert set(r["imbalance"]["planned"]["metrics"]["perf_ms"]) >= {"max_mean", "chi", "kl"}
    assert rw["run"]["stack"] == "optimized-pipeline"
    assert set(rw["ranks"][0]["samples"]["stages"]) == {"data", "input_dist", "forward", "backward", "optimizer"}
    assert all(p["sharding"] == "row_wise" for p in rw["plan"].values())


@pytest.mark.parametrize(
    "mode, message",
    [
        ("hang", "rank 1 hung in stage embedding_lookup of step 2"),
        ("exit", "rank 1: injected fault (exit) at step 2, stage embedding_lookup"),
    ],
)
def test_a_failing_rank_ends_the_run_without_a_result(tmp_path, mode, message):
    out = tmp_path / "r.json"
    start = time.monotonic()
    # the baseline stack: no compile in the first step, and peak and bandwidth given, not calibrated
    # (a GEMM probe re-measuring on a loaded machine outlasted --timeout in the peak stage): the
    # fault is the only thing that may stall
    proc = gembench_cli(
        "run",
        "--config",
        "tiny",
        "--nproc",
        "2",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--stack",
        "baseline",
        "--peak-tflops",
        "1",
        "--bandwidth-gbs",
        "10",
        "--timeout",
        "10",
        "--out",
        str(out),
        "--quiet",
        env={"GEMBENCH_FAULT": f"1:2:{mode}"},
        timeout=240,
    )
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    assert not out.exists()
    assert message in proc.stderr, proc.stderr[-3000:]
    assert "no result written" in proc.stderr
    assert elapsed < 150  # setup + --timeout + torchrun's teardown, not forever


def test_refusals_are_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    # in process: the parent refuses before it starts any rank
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        monkeypatch.setenv("MASTER_PORT", str(port))
        code, _, err = run_cli(["run", "--config", "tiny", "--nproc", "2"], capsys)
    monkeypatch.delenv("MASTER_PORT")
    assert code == 2 and f"port {port}" in err and "in use" in err
    code, _, err = run_cli(["run", "--config", "tiny", "--nproc", "3"], capsys)
    assert code == 2 and "global batch 64 does not split evenly over 3 ranks" in err
    code, _, err = run_cli(["run", "--config", "tiny", "--nproc", "2", "--sharding", "t9=row_wise"], capsys)
    assert code == 2 and "no table 't9'" in err
    assert len(err.strip().splitlines()) == 1


def test_parse_sharding():
    tables = ["table_t0", "table_t1", "table_clicks"]
    assert parse_sharding(None, tables) == {}
    assert parse_sharding("row_wise", tables) == dict.fromkeys(tables, "row_wise")
    assert parse_sharding("t0=row_wise,default=table_wise", tables) == {
        "table_t0": "row_wise",
        "table_t1": "table_wise",
        "table_clicks": "table_wise",
    }
    assert parse_sharding("clicks=column_wise", tables) == {"table_clicks": "column_wise"}
    with pytest.raises(UsageError, match="not a sharding type"):
        parse_sharding("diagonal", tables)


def test_the_staged_step_leaves_a_data_parallel_tables_gradient_to_torchrec(tmp_path):
    """TorchRec wraps a data_parallel table's lookup in a DDP of its own, which all-reduces its
    gradient in the backward: grad_sync all-reduces only the other dense parameters (it once
    all-reduced the table's gradient a second time)."""
    import torch.distributed as dist
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.types import ParameterConstraints

    from gembench.harness.train.distributed.engines import StagedStep
    from gembench.harness.train.distributed.plan import data_parallel_tables, dense_parameters, shard
    from gembench.harness.train.measure import World
    from gembench.harness.train.stack import STACKS

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            tables = [
                EmbeddingBagConfig(name=f"t{i}", embedding_dim=8, num_embeddings=50, feature_names=[f"f{i}"])
                for i in (0, 1)
            ]
            self.ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
            self.head = torch.nn.Linear(16, 1)

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model, sharder = Model(), EmbeddingBagCollectionSharder()
        kinds = {"t0": "data_parallel", "t1": "table_wise"}
        constraints = {t: ParameterConstraints(sharding_types=[k]) for t, k in kinds.items()}
        planner = EmbeddingShardingPlanner(
            topology=Topology(world_size=1, compute_device="cpu"), constraints=constraints
        )
        dmp = shard(model, planner.plan(model, [sharder]), torch.device("cpu"), ddp=False, sharders=[sharder])
        names = {id(p): n for n, p in dmp.named_parameters()}
        assert {names[i] for i in data_parallel_tables(dmp)} == {"ebc.embedding_bags.t0.weight"}
        assert "ebc.embedding_bags.t0.weight" in {names[id(p)] for p in dense_parameters(dmp)}  # Adam steps it
        step = StagedStep(dmp, torch.device("cpu"), World(), STACKS["optimized"], None, [])
        assert {names[id(p)] for p in step.replicated} == {"head.weight", "head.bias"}
    finally:
        dist.destroy_process_group()


def test_sparse_arch_reads_the_pooled_embeddings_by_feature_name():
    """A sharded EmbeddingBagCollection's KeyedTensor lists its keys by sharding type, then by
    rank, not in the tables' order: GEM's SparseArch must read its columns by name (it once read
    them by position, so a plan that placed the tables out of order fed features to the wrong slots)."""
    from torchrec import KeyedTensor

    from gembench.harness.train.workloads import seeded, workload_of

    workload = workload_of("tiny").on_device("cpu")
    model, batch = seeded(workload, torch.device("cpu"), 0), workload.batch(0, 0, 1, 0)
    arch = model.sparse_arch
    with torch.no_grad():
        want, _ = arch(batch.sparse, None)
        kt = arch.pooled(batch.sparse)
        shuffled = list(reversed(kt.keys()))  # as a sharded collection may list them
        by_name = kt.to_dict()

        class Shuffled(torch.nn.Module):
            def forward(self, features):
                return KeyedTensor.from_tensor_list(shuffled, [by_name[k] for k in shuffled])

        arch.pooled = Shuffled()
        got, _ = arch(batch.sparse, None)
    assert not torch.equal(want[:, 0], want[:, -1])  # the check can tell the slots apart
    assert torch.equal(got, want)


def test_every_ranks_first_loss_is_one_process_loss_on_its_batch(tmp_path):
    """Before any update, a rank's loss is the unsharded model's on that rank's batch, whatever the
    plan. clicks=row_wise,default=table_wise: on tiny at 2 ranks the planner places the pooled
    tables out of order (t0, t2, t3, t4 on rank 0; t1, t5, t6, t7 on rank 1), so the sharded
    collection's keys come back as t0, t2, t3, t4, t1, t5, t6, t7 (the loss read by position was
    0.68118 / 0.66484 against 0.68195 / 0.66759)."""
    from gembench.harness.train.stack import on_ranks, seeded_model, stack_options
    from gembench.harness.train.step import losses
    from gembench.harness.train.workloads import workload_of

    out = tmp_path / "r.json"
    proc = gembench_cli(
        "run",
        "--config",
        "tiny",
        "--nproc",
        "2",
        "--dtype",
        "fp32",
        "--set",
        "compile=off",
        "--steps",
        "1",
        "--warmup",
        "0",
        "--sharding",
        "clicks=row_wise,default=table_wise",
        "--out",
        str(out),
        "--quiet",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = json.loads(out.read_text())["ranks"]
    options = on_ranks(stack_options("optimized", "fp32", ("compile=off",)), pipeline=False)
    workload = workload_of("tiny").on_device("cpu")
    variant = workload.for_stack(options)
    model = seeded_model(variant, options, torch.device("cpu"), 0)
    with torch.no_grad():
        for r in ranks:
            batch = workload.batch(0, r["rank"], len(ranks), 0)
            want = losses(variant, variant.forward(model, batch), batch)[0].item()
            assert r["samples"]["loss"][0] == pytest.approx(want, rel=1e-6), r["rank"]
