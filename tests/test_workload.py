"""A model gembench did not write, through the whole harness (gembench/workload.py, docs/workload.md).

The two examples (TorchRec's DLRM, a two-tower retrieval model) through check-model, run, run
--nproc 2, ablate and continuous, at small shapes; and every bad input as one line with exit 2.
"""

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
from synthetic import gembench_cli, run_cli

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
        BASE + "class W(tt.TwoTower):\n    def forward_flops(self, batch):\n        return {'towers': 1e6}\n"
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
    code, _, err = run_cli(["run", "--model", f"{path}:make", "--steps", "1", "--warmup", "0"], capsys)
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
    """Each example run on one process and on 2 gloo ranks."""
    tmp = tmp_path_factory.mktemp("workload-runs")
    out = {}
    for name, (spec, args) in {"dlrm": DLRM, "two_tower": TWO_TOWER}.items():
        for nproc in (1, 2):
            path = tmp / f"{name}-{nproc}.json"
            extra = ["--nproc", "2"] if nproc == 2 else []
            proc = gembench_cli("run", *model_flags(spec, args), *SHORT, *extra, "--out", str(path))
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
            assert stages["sparse_forward"] > 0 and stages["dense_forward"] > 0
            assert sum(stages.values()) <= sum(own["samples"]["step_s"]) * 1.001
        if nproc == 2:
            assert len(r["ranks"]) == 2 and r["metrics"]["imbalance_max_mean"] >= 1.0
            assert "exposed_comm_fraction" in r["metrics"] and r["plan"]
    # same workload on one process and two ranks: one hash; two workloads: two
    hashes = {k: json.loads(p.read_text())["workload"]["hash"] for k, p in runs.items()}
    assert hashes["dlrm", 1] == hashes["dlrm", 2] != hashes["two_tower", 1]


def test_compare_refuses_two_different_workloads(runs, capsys):
    code, out, err = run_cli(["compare", str(runs["dlrm", 1]), str(runs["two_tower", 1])], capsys)
    assert code == 3 and "config.hash" in out + err, out + err


def test_ablate_a_workload_measures_only_the_switches_that_act_on_it(capsys):
    spec, args = TWO_TOWER
    code, out, err = run_cli(["ablate", *model_flags(spec, args), "--steps", "1", "--warmup", "1", "--quiet"], capsys)
    assert code == 0, err
    assert "+ fused_embeddings" in out and "- bf16" in out and "activation_checkpointing=all" in out
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
