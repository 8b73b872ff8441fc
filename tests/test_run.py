"""`gembench run` and `gembench describe` end to end, as a user calls them."""

import json

import pytest
from synthetic import gembench_cli, run_cli

from gembench.harness.commands.describe import describe
from gembench.models.config import known_configs, load_config
from gembench.models.zoo import ZooWorkload

# tiny_run: conftest's session fixture (tests/test_results.py and test_memory_estimate.py read it too)


def test_run_writes_an_honest_result(tiny_run):
    proc, result, _ = tiny_run
    s = result["summary"]
    assert 0 < s["mfu"] <= 1
    assert len(result["samples"]["step_s"]) == 5
    # the stages account for the whole step (nothing untimed hides between them)
    assert s["stage_coverage"] == pytest.approx(1.0, abs=0.05)
    assert sum(r["share"] for r in s["stages"].values()) == pytest.approx(1.0, abs=1e-9)
    assert set(s["stages"]) == {"data", "sparse_forward", "dense_forward", "loss", "backward", "optimizer"}
    env = result["env"]
    for key in ("hardware_class", "device_name", "cpu_model", "cpu_cores", "git_commit", "git_dirty"):
        assert key in env
    assert env["packages"]["torch"].startswith("2.13.0")
    assert result["config"]["hash"] == load_config("tiny").hash
    assert result["peak"]["source"].startswith("calibrated")
    assert result["metrics"]["mfu"] == s["mfu"]
    # the table names the peak, the device and the commit
    assert "MFU" in proc.stdout and "peak" in proc.stdout and "commit" in proc.stdout


def test_run_counts_step_costs_and_prints_them(tiny_run):
    proc, result, _ = tiny_run
    c = result["counters"]
    keys = {"aten_ops", "aten_op_counts", "host_syncs", "h2d_bytes", "kernels", "graph_breaks", "recompiles"}
    assert set(c) == keys | {"source"}
    assert sum(c["aten_op_counts"].values()) == c["aten_ops"]  # the per-op counts add up to the total
    # the optimized step reads nothing back on the host (KJT layout carried by the batch, losses
    # read after the loop; the tiled attention's host plan is inside its op)
    assert c["host_syncs"] == 0
    assert c["aten_ops"] > 0 and c["h2d_bytes"] == 0 and c["kernels"] is None
    assert c["graph_breaks"] == 0 and c["recompiles"] == 0
    assert all(
        result["metrics"][k] == c[k] for k in ("aten_ops", "host_syncs", "h2d_bytes", "graph_breaks", "recompiles")
    )
    assert "cost counters" in proc.stdout and "aten ops dispatched" in proc.stdout
    # (that the counts are the same in another run: tests/test_counters.py)


def test_run_trace_writes_one_step_and_prints_top_ops(tiny_run):
    proc, result, path = tiny_run
    trace_dir = path.parent / "tr"
    events = json.loads((trace_dir / "trace.json").read_text())["traceEvents"]
    assert sum(e.get("cat") == "cpu_op" for e in events) > 100
    top = result["profile"]["top"]
    assert result["profile"]["ranked"] == "CPU ops" and len(top) == 10
    assert "top 10 CPU ops by self time" in proc.stdout and top[0]["name"][:60] in proc.stdout
    assert str(trace_dir / "trace.json") in proc.stdout


def test_a_default_run_shows_no_user_warning(tiny_run):
    # e.g. "Sparse invariant checks are implicitly disabled" from the sparse Adagrad
    assert "UserWarning" not in tiny_run[0].stderr, tiny_run[0].stderr
    assert "profiler_start" not in tiny_run[0].stderr  # libkineto's marks (trace.py)


def test_run_bf16_with_peak_override(tmp_path):
    out = tmp_path / "b.json"
    proc = gembench_cli(
        "run",
        "--config",
        "tiny",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--dtype",
        "bf16",
        "--set",
        "compile=off",
        "--peak-tflops",
        "1.5",
        "--out",
        str(out),
        "--quiet",
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["run"]["dtype"] == "bf16"
    peak = result["peak"]
    assert {k: peak[k] for k in ("tflops_per_device", "devices", "dtype", "source", "provisional")} == {
        "tflops_per_device": 1.5,
        "devices": 1,
        "dtype": "bf16",
        "source": "override: --peak-tflops",
        "provisional": False,
    }
    assert peak["basis_text"] == "1 rank(s) x the --peak-tflops figure" and "host" not in peak


@pytest.mark.parametrize(
    "args, message",
    [
        (["--config", "nope"], "unknown config 'nope': known configs are"),
        (["--config", "tiny", "--steps", "0"], "--steps must be at least 1"),
        (["--config", "tiny", "--warmup", "-1"], "--warmup must be 0 or more"),
        (["--config", "xl"], "--config xl needs about"),
        (["--config", "tiny", "--device", "tpu"], "--device must be auto, cpu or cuda"),
        (["--config", "tiny", "--peak-tflops", "-3"], "--peak-tflops must be positive"),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, capsys, args, message):
    out = tmp_path / "r.json"
    code, _, err = run_cli(["run", *args, "--out", str(out), "--quiet"], capsys)
    assert code == 2
    assert message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_bad_config_file_names_file_and_field(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text(
        load_config("tiny").source and open(load_config("tiny").source).read().replace("mean_len = 16", "mean_len = 99")
    )
    code, _, err = run_cli(["run", "--config", str(bad), "--quiet"], capsys)
    assert code == 2
    assert str(bad) in err and "sequences[0].mean_len" in err
    assert "Traceback" not in err


def test_out_is_never_overwritten_or_unwritable(tmp_path, capsys):
    existing = tmp_path / "r.json"
    existing.write_text("keep me")
    code, _, err = run_cli(["run", "--config", "tiny", "--out", str(existing), "--quiet"], capsys)
    assert code == 2 and "never overwritten" in err
    assert existing.read_text() == "keep me"
    blocked = tmp_path / "file" / "r.json"
    (tmp_path / "file").write_text("a file, not a folder")
    code, _, err = run_cli(["run", "--config", "tiny", "--out", str(blocked), "--quiet"], capsys)
    assert code == 2 and "--out" in err and "Traceback" not in err


@pytest.mark.parametrize("name", known_configs())
def test_describe_every_tier(name):
    d = describe(ZooWorkload(load_config(name)))
    assert d["embedding_rows"] > 0 and d["dense_params"] > 0 and d["flops_basis"] == "formula"
    assert d["forward_gflop_per_example"] > 0
    assert d["memory_estimate_bytes"]["total"] > d["embedding_bytes_fp32"]


def test_describe_cli_and_help(capsys):
    code, out, _ = run_cli(["describe", "--config", "xl"], capsys)
    assert code == 0 and "GFLOP" in out and "9,408,000,000" in out
    top = gembench_cli("--help")  # `python -m gembench` itself; the rest in this process
    assert top.returncode == 0 and "examples:" in top.stdout
    with pytest.raises(SystemExit) as help_exit:
        run_cli(["run", "--help"], capsys)
    run_help = capsys.readouterr().out
    assert help_exit.value.code == 0 and "--peak-tflops" in run_help and "examples:" in run_help
    code, out, _ = run_cli([], capsys)
    assert code == 2 and "examples:" in out


def test_batch_flag_is_recorded_in_run_and_hash(tmp_path):
    from gembench.models.config import with_global_batch

    out = tmp_path / "r.json"
    proc = gembench_cli(
        "run",
        "--config",
        "tiny",
        "--stack",
        "baseline",
        "--batch",
        "32",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--quiet",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["run"]["global_batch"] == 32 == result["run"]["per_rank_batch"]
    assert result["config"]["hash"] == with_global_batch(load_config("tiny"), 32).hash != load_config("tiny").hash
    s = result["summary"]  # estimate and measured peak side by side
    assert s["peak_memory_estimate_bytes"] > 0 and s["peak_memory_run_bytes"] > 0 and s["memory_estimate_ratio"] > 0


@pytest.mark.parametrize("command", ["run", "ablate", "describe"])
def test_bad_batch_is_one_line_exit_2(tmp_path, monkeypatch, capsys, command):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli([command, "--config", "tiny", "--batch", "0"], capsys)
    assert code == 2 and err.count("\n") == 1 and "--batch must be a positive" in err
    assert list(tmp_path.iterdir()) == []  # a refused run leaves nothing behind, not even results/


def test_batch_must_split_over_ranks(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["run", "--config", "tiny", "--batch", "33", "--nproc", "2"], capsys)
    assert code == 2 and "--batch 33 does not split evenly over --nproc 2" in err


def test_refusal_comes_before_the_compile_notice(tmp_path):
    # xl never fits: the memory refusal is the only line, no "compiles the dense part" before it.
    # A real process: nothing its start-up or exit prints may join the line (the refusals above run in process)
    proc = gembench_cli("run", "--config", "xl", "--device", "cpu", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "needs about" in proc.stderr and "torch.compile" not in proc.stderr


def test_describe_batch(capsys):
    code, out, _ = run_cli(["describe", "--config", "medium", "--batch", "512", "--json"], capsys)
    d = json.loads(out)
    assert code == 0
    assert d["global_batch"] == 512 and set(d["memory_estimate_bytes_by_stack"]) == {"baseline", "optimized"}


def test_no_compile_notice_where_the_workload_compiles_nothing(tmp_path):
    """compile=on is the optimized stack's, but a workload that names nothing to compile (compiled()
    empty) compiles nothing: no notice that it does."""
    from pathlib import Path

    two_tower = Path(__file__).resolve().parents[1] / "examples" / "two_tower.py"
    (tmp_path / "plain.py").write_text(
        "import importlib.util, sys\n"
        f"_spec = importlib.util.spec_from_file_location('two_tower_base', {str(two_tower)!r})\n"
        "tt = sys.modules['two_tower_base'] = importlib.util.module_from_spec(_spec)\n"
        "_spec.loader.exec_module(tt)\n"
        "class Plain(tt.TwoTower):\n    def compiled(self):\n        return ()\n"
        "def make():\n    return Plain(batch=16, max_rows=200)\n"
    )
    out = tmp_path / "r.json"
    proc = gembench_cli(
        "run", "--model", f"{tmp_path / 'plain.py'}:make", "--steps", "2", "--warmup", "1", "--out", str(out)
    )
    assert proc.returncode == 0, proc.stderr
    assert "torch.compile" not in proc.stderr and "compiling" not in proc.stderr, proc.stderr
    assert "compile" in json.loads(out.read_text())["workload"]["switches"]["not_applicable"]
