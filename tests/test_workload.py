"""A model gembench did not write, through the whole harness (workload.py and loader.py, docs/workload.md).

The two examples (TorchRec's DLRM, a two-tower retrieval model) through check-model, run, run
--nproc 2, ablate, project and continuous, at small shapes; and every bad input as one line with exit 2.
"""

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
from synthetic import cli_in_process, gembench_cli, run_cli

from gembench.harness.device.hardware import cpu_native_bf16

REPO = Path(__file__).resolve().parents[1]

EXAMPLES = REPO / "examples"
DLRM = (f"{EXAMPLES}/torchrec_dlrm.py:dlrm", ["batch=32", "max_rows=500"])
TWO_TOWER = (f"{EXAMPLES}/two_tower.py:two_tower", ["batch=32", "max_rows=500"])
SHORT = ["--steps", "2", "--warmup", "1", "--set", "compile=off", "--quiet"]


def model_flags(spec, args):
    return ["--model", spec, *[a for pair in args for a in ("--model-arg", pair)]]


# -- bad input: one line naming the module and what to do, exit 2 ---------------------------------

BASE = f"""
import importlib.util, sys, torch
_spec = importlib.util.spec_from_file_location("two_tower_base", {str(EXAMPLES / "two_tower.py")!r})
tt = sys.modules["two_tower_base"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tt)
"""
BAD = {
    "does not import": ("raise RuntimeError('the feature store is down')", "make", "RuntimeError: the feature store"),
    "no factory": ("def other():\n    pass", "make", "has no factory 'make'; callables there: other"),
    "wrong type": (BASE + "def make():\n    return torch.nn.Linear(2, 2)", "make", "returned Linear, not a gembench"),
    "tables": (
        BASE + "class W(tt.TwoTower):\n    def tables(self):\n        return [{'name': 't'}]\n"
        "def make():\n    return W(batch=8, max_rows=50)",
        "make",
        "tables() gave a dict, not a TorchRec EmbeddingBagConfig",
    ),
    "batch shape": (
        BASE + "class W(tt.TwoTower):\n    def batch(self, i, rank=0, world=1, seed=0):\n"
        "        return super().batch(i, rank, 1, seed)\n"
        "def make():\n    return W(batch=8, max_rows=50)",
        "make",
        "holds 8 examples, not global_batch/world = 8/2 = 4",
    ),
    "flops formula": (
        BASE + "class W(tt.TwoTower):\n    def forward_flops(self, batch):\n        return {'towers': 1e12}\n"
        "def make():\n    return W(batch=8, max_rows=50)",
        "make",
        "FlopCounterMode counts",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_with_exit_2(case, tmp_path, capsys):
    source, factory, expected = BAD[case]
    path = tmp_path / f"bad_{case.replace(' ', '_')}.py"
    path.write_text(textwrap.dedent(source))
    code, out, err = run_cli(["check-model", f"{path}:{factory}", "--no-ranks"], capsys)
    assert code == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and str(path) in lines[0], err
    assert "Traceback" not in err


def test_an_unsupported_switch_and_config_with_model_are_refused(tmp_path, capsys):
    path = tmp_path / "no_bf16.py"
    path.write_text(
        BASE + "class W(tt.TwoTower):\n    unsupported = frozenset({'bf16'})\n"
        "def make():\n    return W(batch=8, max_rows=50)\n"
    )
    # --dtype bf16: asked for, so refused on every CPU (unasked, a CPU without bf16 drops it)
    code, _, err = run_cli(
        ["run", "--model", f"{path}:make", "--dtype", "bf16", "--steps", "1", "--warmup", "0"], capsys
    )
    assert code == 2 and "does not support bf16=True" in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(SystemExit) as exc:  # argparse: the two flags are one mutually exclusive group
        run_cli(["run", "--model", f"{path}:make", "--config", "tiny"], capsys)
    assert exc.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


# -- the examples through the harness --------------------------------------------------------------


@pytest.mark.parametrize("example", [DLRM, TWO_TOWER], ids=["torchrec_dlrm", "two_tower"])
def test_check_model_passes_on_the_examples(example):
    spec, args = example
    proc = gembench_cli("check-model", spec, *[a for pair in args for a in ("--model-arg", pair)])
    lines = [ln for ln in proc.stdout.splitlines() if ln[:4] in ("ok  ", "FAIL")]
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert len(lines) == 7 and all(ln.startswith("ok") for ln in lines), proc.stdout
    flops = next(ln for ln in lines if "FLOPs" in ln)
    assert flops.split()[2] == ("formula" if example is DLRM else "counted")  # the two-tower gives none


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each example run on one process (in this one, as ablate's runs are) and on 2 gloo ranks."""
    tmp = tmp_path_factory.mktemp("workload-runs")
    out = {}
    for name, (spec, args) in {"dlrm": DLRM, "two_tower": TWO_TOWER}.items():
        for nproc in (1, 2):
            path = tmp / f"{name}-{nproc}.json"
            argv = ["run", *model_flags(spec, args), *SHORT, "--out", str(path)]
            proc = gembench_cli(*argv, "--nproc", "2") if nproc == 2 else cli_in_process(*argv)
            assert proc.returncode == 0, proc.stderr[-3000:]
            out[name, nproc] = path
    return out


def test_a_run_records_the_workload_and_its_stages(runs):
    for (name, nproc), path in runs.items():
        r = json.loads(path.read_text())
        w = r["workload"]
        assert r["config"]["kind"] == "workload" and r["config"]["hash"] == w["hash"]
        assert w["flops_basis"] == ("formula" if name == "dlrm" else "counted")
        assert w["switches"]["applied"]["compile"] is False and "jagged" in w["switches"]["not_applicable"]
        assert r["run"]["nproc"] == nproc and r["flops"]["forward_per_step"] > 0
        for own in r.get("ranks") or [r]:  # each process's stages within its own step
            stages = {s: sum(v) for s, v in own["samples"]["stages"].items()}
            # one process: the forward split by the sparse timer; ranks: the staged engine's
            # stages, each TorchRec module fed its batch field (input dist, lookup, output dist)
            sparse = ("sparse_forward",) if nproc == 1 else ("input_dist", "embedding_lookup", "output_dist")
            assert all(stages[s] > 0 for s in sparse) and stages["dense_forward"] > 0
            assert sum(stages.values()) <= sum(own["samples"]["step_s"]) * 1.001
        if nproc == 2:
            assert len(r["ranks"]) == 2 and r["metrics"]["imbalance_max_mean"] >= 1.0
            assert "exposed_comm_fraction" in r["metrics"] and r["plan"]
    # same workload on one process and two ranks: one hash; two workloads: two
    hashes = {k: json.loads(p.read_text())["workload"]["hash"] for k, p in runs.items()}
    assert hashes["dlrm", 1] == hashes["dlrm", 2] != hashes["two_tower", 1]


def test_a_compiled_workload_breaks_no_graph_while_its_activations_are_counted(tmp_path):
    """compile=on compiles the towers the two-tower names; the step whose saved activations are
    counted (saved-tensor hooks) must not break or recompile them (compiling each tower as a module
    did: 11 graph breaks, 10 recompiles)."""
    path = tmp_path / "compiled.json"
    argv = ["run", *model_flags(*TWO_TOWER), "--steps", "2", "--warmup", "1", "--quiet", "--out", str(path)]
    proc = cli_in_process(*argv)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(path.read_text())
    assert r["workload"]["switches"]["applied"]["compile"] is True
    assert r["counters"]["graph_breaks"] == 0 and r["counters"]["recompiles"] == 0
    assert r["summary"]["activation_bytes"] > 0


def test_compare_refuses_two_different_workloads(runs, capsys):
    code, out, err = run_cli(["compare", str(runs["dlrm", 1]), str(runs["two_tower", 1])], capsys)
    assert code == 3 and "config.hash" in out + err, out + err


def test_project_plans_and_prices_a_workload_from_the_protocol(runs, tmp_path):
    """`project --model`: the workload's own tables planned, its counted FLOPs priced; `--from` its
    result alone projects the model it measured; another model's result is refused in one line."""
    from gembench.harness.projection.subject import Subject
    from gembench.loader import load_workload

    spec, args = TWO_TOWER
    out = tmp_path / "p.json"
    proc = cli_in_process(
        "project", *model_flags(spec, args), "--gpus", "8,64", "--batch", "1024", "--quiet", "--out", str(out)
    )
    assert proc.returncode == 0, proc.stderr
    assert "--model " + spec in proc.stdout and "no activation estimate" in proc.stdout, proc.stdout
    doc, run = json.loads(out.read_text()), json.loads(runs["two_tower", 1].read_text())
    assert (
        doc["config"] | {"source": "workload", "flops_basis": "counted", "activations_estimated": False}
        == doc["config"]
    )
    assert doc["config"]["hash"] == run["config"]["hash"]  # the model the run measured
    tables = load_workload(spec, args).tables()
    for row in doc["rows"]:
        assert row["plan"]["fits"] and sum(row["plan"]["shardings"].values()) == len(tables)
        assert row["step_time_s"] > 0 and 0 < row["mfu"] < 1
    # FLOPs per example as the run counted them (the same FlopCounterMode over the same batch)
    m = Subject.of(load_workload(spec, args))
    per_example = run["flops"]["forward_per_step"] / run["run"]["global_batch"]
    assert sum(m.flops.values()) == pytest.approx(per_example, rel=1e-6)
    proc = cli_in_process("project", "--from", str(runs["two_tower", 1]), "--gpus", "8", "--quiet")
    assert proc.returncode == 0 and "gembench project two-tower" in proc.stdout, proc.stderr
    assert "compute: measured: " in proc.stdout
    proc = cli_in_process("project", *model_flags(*DLRM), "--from", str(runs["two_tower", 1]), "--gpus", "8")
    assert proc.returncode == 2 and "not --model" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_ablate_a_workload_measures_only_the_switches_that_act_on_it(capsys):
    spec, args = TWO_TOWER
    code, out, err = run_cli(["ablate", *model_flags(spec, args), "--steps", "1", "--warmup", "1", "--quiet"], capsys)
    assert code == 0, err
    assert "+ fused_embeddings" in out and "activation_checkpointing=all" in out
    # bf16 is measured where the CPU multiplies it; where torch would emulate it, ablate says so
    native = cpu_native_bf16()
    assert ("- bf16" in out) == native and ("bf16 not measured" in err) != native, err
    assert "jagged" not in out and "content" not in out and "activation_checkpointing=hstu" not in out


def _git(repo, *args):
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True, capture_output=True
    )


def test_continuous_pairs_two_commits_of_a_model_repository(tmp_path, capsys):
    repo = tmp_path / "team-model"
    repo.mkdir()
    (repo / "two_tower.py").write_text((EXAMPLES / "two_tower.py").read_text())
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "base")
    text = (repo / "two_tower.py").read_text().replace("layers=(256, 128)", "layers=(256, 256, 128)")
    (repo / "two_tower.py").write_text(text)
    _git(repo, "commit", "-qam", "a deeper tower")
    argv = ["continuous", "HEAD~1", "HEAD", "--repo", str(repo), "--pairs", "2", "--steps", "2", "--warmup", "1"]
    argv += ["--model", "two_tower.py:two_tower", "--model-arg", "batch=16", "--model-arg", "max_rows=200"]
    code, out, err = run_cli([*argv, "--stack", "baseline", "--quiet"], capsys)
    assert code in (0, 1, 4), err  # a verdict, whichever it is
    assert "two-tower" in out and "differ in config.hash" in out, out
    assert [ln for ln in out.splitlines() if ln.startswith("aten_ops")][0].split()[-1] == "regressed", out


def test_the_zoo_is_one_provider_of_the_protocol():
    """A gembench config through the same checks: its analytic FLOPs formula against FlopCounterMode
    (for HSTU's attention the counter reads gembench's registered formula: metrics/flopcheck.py
    checks that one independently), its seeded batches, one step by the generic stages."""
    proc = gembench_cli("check-model", "gembench.models.zoo:zoo", "--model-arg", "config=tiny", "--no-ranks")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 6 and all(ln.startswith("ok") for ln in lines), proc.stdout
    assert "ZooWorkload 'tiny'" in lines[0] and "formula" in lines[3] and "(+0.00%)" in lines[3]


# -- on the ranks: FSDP2, TorchRec's pipeline, --rebalance, ablate ----------------------------------

# row-wise forced: one placement whatever order the planner meets the tables in (the pipeline and a
# split-forward model wrap them differently, and these tables, too small to split by the planner's
# own choice, leave it near-ties between table- and column-wise placements)
FP32 = ["--steps", "3", "--warmup", "1", "--set", "compile=off", "--dtype", "fp32", "--quiet", "--nproc", "2"]
FP32 += ["--sharding", "row_wise"]
RANK_RUNS = {"ddp": [], "fsdp": ["--set", "dense_parallel=fsdp"], "pipeline": ["--pipeline"]}


@pytest.fixture(scope="module")
def two_tower_ranks(tmp_path_factory):
    """The two-tower on 2 gloo ranks in fp32 (exact arithmetic to compare): DDP, FSDP2, the pipeline."""
    tmp = tmp_path_factory.mktemp("two-tower-ranks")
    out = {}
    for name, extra in RANK_RUNS.items():
        path = tmp / f"{name}.json"
        proc = gembench_cli("run", *model_flags(*TWO_TOWER), *FP32, *extra, "--out", str(path))
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[name] = json.loads(path.read_text())
    return out


def _loss_gap(a: dict, b: dict) -> float:
    assert all(len(r["samples"]["loss"]) == 3 for r in a["ranks"] + b["ranks"])
    return max(
        abs(x - y) for p, q in zip(a["ranks"], b["ranks"]) for x, y in zip(p["samples"]["loss"], q["samples"]["loss"])
    )


def test_fsdp_on_a_workload_trains_like_ddp(two_tower_ranks):
    """FSDP2 on the two towers (the blocks the workload names), the tables DMP's: the same losses
    as DDP, half the dense state on each of 2 ranks, and the dense part's own collectives."""
    ddp, fsdp = two_tower_ranks["ddp"], two_tower_ranks["fsdp"]
    assert fsdp["run"]["options"]["dense_parallel"] == "fsdp"
    assert fsdp["workload"]["switches"]["applied"]["dense_parallel"] == "fsdp"
    assert _loss_gap(ddp, fsdp) <= 1e-4
    assert fsdp["summary"]["dense_state_bytes"] < 0.6 * ddp["summary"]["dense_state_bytes"]
    assert {"dense_param_all_gather", "dense_grad_reduce_scatter"} <= set(fsdp["comm"]["by_kind"])
    # the staged step's all-reduce of the dense gradients, which FSDP2's reduce-scatter replaces
    assert "dense_grad_all_reduce" in ddp["comm"]["by_kind"] and not {"all_reduce", "dense_grad_all_reduce"} & set(
        fsdp["comm"]["by_kind"]
    )


def test_the_pipeline_runs_a_workload_and_trains_like_the_plain_step(two_tower_ranks):
    ddp, pipe = two_tower_ranks["ddp"], two_tower_ranks["pipeline"]
    assert pipe["run"]["options"]["pipeline"] is True
    for own in pipe["ranks"]:  # TorchRec's phases, not the staged step's stages
        assert list(own["samples"]["stages"]) == ["data", "input_dist", "forward", "backward", "optimizer"]
    assert _loss_gap(ddp, pipe) <= 1e-4
    assert pipe["metrics"]["imbalance_max_mean"] >= 1.0 and pipe["plan"] == ddp["plan"]


ONE_FIELD = """
class OneField:  # every feature in one KJT: no field feeds a tower's collection whole
    def __init__(self, ids):
        self.ids = ids
    def to(self, device, non_blocking=False):
        return OneField(self.ids.to(device, non_blocking=non_blocking))
class SplitModel(tt.TwoTowerModel):
    def forward(self, batch):
        query, item = batch.ids.split([len(tt.QUERY), len(tt.ITEM)])
        return super().forward(tt.Batch(query, item))
class W(tt.TwoTower):
    def build(self, device):
        model = super().build(device)
        model.__class__ = SplitModel
        return model
    def batch(self, i, rank=0, world=1, seed=0):
        b = super().batch(i, rank, world, seed)
        return OneField(type(b.query).concat([b.query, b.item]))
def make():
    return W(batch=32, max_rows=500)
"""


def test_a_model_whose_collections_no_field_feeds_whole_runs_its_forward_whole_on_ranks(two_tower_ranks, tmp_path):
    """The staged step runs each collection's dists itself only where a batch field feeds it whole;
    a model that splits one KJT inside its forward runs the forward whole (its sparse share timed
    as on one process) and trains exactly like the staged step on the same data."""
    path = tmp_path / "one_field.py"
    path.write_text(BASE + textwrap.dedent(ONE_FIELD))
    out = tmp_path / "whole.json"
    proc = gembench_cli("run", "--model", f"{path}:make", *FP32, "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    whole = json.loads(out.read_text())
    for own in whole["ranks"]:
        stages = own["samples"]["stages"]
        assert list(stages) == ["data", "sparse_forward", "dense_forward", "backward", "grad_sync", "optimizer"]
        assert all(t > 0 for t in stages["sparse_forward"])
    assert whole["plan"] == two_tower_ranks["ddp"]["plan"]
    assert _loss_gap(two_tower_ranks["ddp"], whole) <= 1e-4


def test_rebalance_replans_a_workload_from_its_own_tables(tmp_path):
    """The measured pooling of each table is what its batches hold (counted here from the
    workload's own batch source), beside the pooling it declares; the state carried over."""
    from gembench.loader import load_workload

    spec, args = TWO_TOWER
    path = tmp_path / "reb.json"
    flags = ["--steps", "2", "--warmup", "1", "--set", "compile=off", "--quiet", "--nproc", "2", "--rebalance"]
    proc = gembench_cli("run", *model_flags(spec, args), *flags, "--out", str(path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    reb = json.loads(path.read_text())["rebalance"]
    workload = load_workload(spec, args)
    timed = [workload.batch(i, rank, 2, 0) for rank in (0, 1) for i in (1, 2)]  # --warmup 1 --steps 2
    terms = sum(int(b.query.to_dict()["query_terms"].lengths().sum()) for b in timed)
    assert reb["pooling"]["measured"]["table_query_terms"] == pytest.approx(terms / (len(timed) * 16))
    assert reb["pooling"]["measured"]["table_user_id"] == pytest.approx(1.0)
    assert reb["pooling"]["expected"]["table_query_terms"] == 6.0 and reb["pooling"]["expected"]["table_item_id"] == 1.0
    assert reb["carried"]["tensors"] == 12 and reb["carried"]["optimizer_states"] > 0  # 8 dense + 4 tables
    assert reb["again_same_plan"]
    for side in ("before", "after", "again"):  # a re-plan keeps every table sharded
        assert all(p["sharding"] != "data_parallel" for p in reb[side]["plan"].values())


def test_the_pipeline_refuses_a_batch_that_is_not_a_pipelineable(tmp_path, capsys):
    path = tmp_path / "plain_batch.py"
    path.write_text(
        BASE + "class Plain:\n    def __init__(self, b):\n        self.query, self.item = b.query, b.item\n"
        "    def to(self, device, non_blocking=False):\n        return self\n"
        "class W(tt.TwoTower):\n    def batch(self, i, rank=0, world=1, seed=0):\n"
        "        return Plain(super().batch(i, rank, world, seed))\n"
        "def make():\n    return W(batch=8, max_rows=50)\n"
    )
    code, _, err = run_cli(["run", "--model", f"{path}:make", "--nproc", "2", "--pipeline", "--steps", "1"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--pipeline needs batch() to return a torchrec.streamable.Pipelineable (it gave a Plain)" in err


def test_ablate_on_ranks_takes_only_the_switches_that_act_on_the_workload():
    from argparse import Namespace

    from gembench.harness.commands.ablate_ranks import rank_variants

    spec, args = DLRM
    chosen = [label for label, *_ in rank_variants(Namespace(config=None, model=spec, model_args=args))]
    assert chosen == [
        "optimized, ddp",
        "dense_parallel=fsdp",
        "activation_checkpointing=all",
        "activation_dtype=fp8",
        "sparse_parallel=2d",  # any workload whose tables TorchRec shards
        "2d, replica_merge=updates",
        "compile=off",
        "+ pipeline",
    ]
    two_tower = Namespace(config=None, model=TWO_TOWER[0], model_args=["batch=8"])
    assert "activation_checkpointing=all" in [label for label, *_ in rank_variants(two_tower)]


def test_ablate_the_dlrm_example_on_two_ranks(monkeypatch, capsys):
    """`ablate --model examples/torchrec_dlrm.py:dlrm --nproc 2`, each variant a real 2-rank run;
    the variants narrowed to DDP and FSDP2 (the pipeline is run above), compile off (minutes of CPU
    compile otherwise), plus one that does not act on a workload and must be left out."""
    from gembench.harness.commands import ablate_ranks

    narrowed = [
        (ablate_ranks.REFERENCE, ("compile=off",), {}),
        ("dense_parallel=fsdp", ("dense_parallel=fsdp", "compile=off"), {}),
        ("activation_checkpointing=hstu", ("activation_checkpointing=hstu",), {}),
    ]
    monkeypatch.setattr(ablate_ranks, "RANK_VARIANTS", narrowed)
    spec, args = DLRM
    code, out, err = run_cli(
        ["ablate", *model_flags(spec, args), "--nproc", "2", "--steps", "2", "--warmup", "1"], capsys
    )
    assert code == 0, out + err
    rows = {ln.split("  ")[0]: ln for ln in out.splitlines() if ln.startswith(("optimized", "dense_"))}
    assert set(rows) == {ablate_ranks.REFERENCE, "dense_parallel=fsdp"} and "failed" not in out, out
    assert "torchrec-dlrm on 2 ranks" in out and "hstu" not in out
    assert "goal FSDP: dense state per rank" in out and "(goal <= 0.60: met)" in out, out


def test_run_ab_measures_a_workload_against_the_baseline(tmp_path, capsys):
    spec, args = TWO_TOWER
    path = tmp_path / "ab.json"
    argv = ["run", *model_flags(spec, args), "--ab", "--rounds", "2", "--steps", "2", "--warmup", "1"]
    code, _, err = run_cli([*argv, "--set", "compile=off", "--quiet", "--out", str(path)], capsys)
    assert code == 0, err
    r = json.loads(path.read_text())
    assert r["run"]["stack"] == "ab" and r["ab"]["baseline"]["options"]["bf16"] is False
    assert r["workload"]["name"] == "two-tower" and r["metrics"]["ab_mfu_ratio"] > 0
    assert len(r["ab"]["round_ratios"]) == 2 and r["ab"]["baseline"]["summary"]["step_time_s"]["p50"] > 0


def test_the_asv_suite_tracks_the_workload_its_variable_names(monkeypatch):
    """GEMBENCH_ASV_MODEL (and _MODEL_ARGS) put the workload in place of the configs: the suite's
    one parameter, and the one-process run its tracked metrics come from."""
    import importlib.util

    spec, args = TWO_TOWER
    monkeypatch.setenv("GEMBENCH_ASV_MODEL", spec)
    monkeypatch.setenv("GEMBENCH_ASV_MODEL_ARGS", ",".join(args))
    monkeypatch.setenv("GEMBENCH_ASV_STEPS", "2")
    monkeypatch.setenv("GEMBENCH_ASV_SET", "compile=off")
    loader = importlib.util.spec_from_file_location(
        "asv_common_model", REPO / "benchmarks" / "asv_suite" / "_common.py"
    )
    common = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(common)
    assert common.CONFIGS == [spec] and common.OneProcess.params == [spec]
    metrics = common.run_configs(1)[spec]
    assert metrics["step_time_s"] > 0 and metrics["mfu"] > 0
