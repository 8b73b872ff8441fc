"""`gembench gate`: every exit status (0 pass, 1 fail, 2 error, 3 not comparable, 4 inconclusive)."""

from pathlib import Path

import pytest
from synthetic import make_result, run_cli, save

from gembench.errors import UsageError
from gembench.harness.commands.promote import promote
from gembench.harness.regression import thresholds

ROOT = Path(__file__).resolve().parents[1]
TOML = """
[defaults]
min_mfu = 0.05
max_imbalance = 1.25
alpha = 0.01
min_effect = 0.03
[hardware."cpu-*"]
min_mfu = 0.01
[hardware."cpu-*".config."tiny"]
max_exposed_comm = 0.3
"""


@pytest.fixture
def setup(tmp_path):
    (tmp_path / "t.toml").write_text(TOML)
    baseline, _ = promote([make_result(rid="base", seed=1, noise=0.002)], tmp_path / "baselines")
    return tmp_path, str(tmp_path / "t.toml"), str(baseline)


def _gate(capsys, thresholds_path, baseline, result_path, *extra):
    return run_cli(["gate", result_path, "--thresholds", thresholds_path, "--baseline", baseline, *extra], capsys)


def test_pass_exit_0(setup, capsys):
    tmp, t, base = setup
    r = save(tmp, make_result(rid="ok", seed=2, noise=0.002, metrics={"exposed_comm_fraction": 0.1}))
    code, out, _ = _gate(capsys, t, base, r)
    assert code == 0, out
    assert "PASS           min_mfu: mfu" in out and "PASS           max_exposed_comm" in out
    assert "SKIP           max_imbalance: the result has no imbalance_max_mean" in out
    assert "vs baseline step_time_s: unchanged" in out and out.rstrip().endswith("gate: pass")


def test_regression_exit_1(setup, capsys):
    tmp, t, base = setup
    r = save(tmp, make_result(rid="slow", seed=2, noise=0.002, step_s=0.110))
    code, out, _ = _gate(capsys, t, base, r)
    assert code == 1 and "FAIL           vs baseline step_time_s: regressed" in out


def test_threshold_missed_exit_1(setup, capsys):
    tmp, t, base = setup
    r = save(tmp, make_result(rid="imb", seed=2, noise=0.002, metrics={"imbalance_max_mean": 1.6}))
    code, out, _ = _gate(capsys, t, base, r)
    assert code == 1 and "FAIL           max_imbalance: imbalance_max_mean 1.6 > 1.25 ([defaults])" in out


def test_a_start_up_past_its_limit_fails_the_gate(setup, capsys):
    tmp, t, base = setup
    limit = Path(t).read_text() + "max_startup_s = 30\n"  # under the tiny table
    Path(t).write_text(limit)
    slow = save(tmp, make_result(rid="slow-start", seed=2, noise=0.002, metrics={"startup_s": 41.5}))
    code, out, _ = _gate(capsys, t, base, slow)
    assert code == 1 and "FAIL           max_startup_s: startup_s 41.5 > 30" in out
    fast = save(tmp, make_result(rid="fast-start", seed=2, noise=0.002, metrics={"startup_s": 12.0}))
    code, out, _ = _gate(capsys, t, base, fast)
    assert code == 0 and "PASS           max_startup_s: startup_s 12 <= 30" in out


def test_errors_exit_2_and_name_the_field(setup, capsys, tmp_path):
    tmp, t, base = setup
    r = save(tmp, make_result(rid="x", seed=2))
    bad = tmp_path / "bad.toml"
    bad.write_text('[hardware."cpu-*".config."tiny"]\nmax_imbalance = "high"\n')
    code, _, err = _gate(capsys, str(bad), base, r)
    assert code == 2 and "bad.toml" in err and "'max_imbalance' must be a number" in err and "config.'tiny'" in err
    bad.write_text("[defaults]\nmin_mfuu = 0.1\n")
    code, _, err = _gate(capsys, str(bad), base, r)
    assert code == 2 and "field 'min_mfuu' is unknown" in err
    bad.write_text("[defaults]\nmin_mfu = 3\n")
    assert "out of range" in _gate(capsys, str(bad), base, r)[2]
    bad.write_text("[defaults\n")
    assert "not valid TOML" in _gate(capsys, str(bad), base, r)[2]
    code, _, err = _gate(capsys, t, base, str(tmp / "missing.json"))
    assert code == 2 and "missing.json" in err


def test_not_comparable_exit_3(setup, capsys):
    tmp, t, base = setup
    r = save(tmp, make_result(rid="new-torch", seed=2, noise=0.002, torch="2.14.0"))
    code, out, _ = _gate(capsys, t, base, r)
    assert code == 3 and "NOT-COMPARABLE baseline" in out and "stack.torch" in out
    r2 = save(tmp, make_result(rid="other-class", seed=2, hardware_class="cpu-other-2t"))
    assert _gate(capsys, t, base, r2)[0] == 3


def test_inconclusive_exit_4(setup, capsys):
    tmp, t, base = setup
    r = save(tmp, make_result(rid="noisy", seed=3, noise=0.15, steps=30, step_s=0.102))
    code, out, _ = _gate(capsys, t, base, r)
    assert code == 4 and "INCONCLUSIVE   vs baseline step_time_s" in out


def test_missing_baseline_is_skip_or_3_when_required(setup, capsys, monkeypatch):
    tmp, t, _ = setup
    r = save(tmp, make_result(rid="alone", seed=2))
    monkeypatch.chdir(tmp)  # default baseline path results/baselines/... does not exist here
    code, out, _ = run_cli(["gate", r, "--thresholds", t], capsys)
    assert code == 0 and "SKIP           baseline: none at results/baselines/cpu-test-2t/tiny.json" in out
    assert run_cli(["gate", r, "--thresholds", t, "--require-baseline"], capsys)[0] == 3


def test_threshold_layers_and_sources(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text(TOML)
    cpu_tiny = thresholds.load(path, "tiny", "cpu-x-2t")
    assert (cpu_tiny.min_mfu, cpu_tiny.max_exposed_comm, cpu_tiny.max_imbalance) == (0.01, 0.3, 1.25)
    assert cpu_tiny.sources["min_mfu"] == "[hardware.'cpu-*']"
    gpu_small = thresholds.load(path, "small", "cuda-h100")
    assert (gpu_small.min_mfu, gpu_small.max_exposed_comm) == (0.05, None)


def test_committed_thresholds_file_is_valid():
    for hw in ("cpu-intel-r-xeon-r-processor-2t", "cuda-nvidia-h100-80gb-hbm3"):
        for config in ("tiny", "small", "medium"):
            limits = thresholds.load(ROOT / "results" / "thresholds.toml", config, hw)
            assert limits.min_ab_mfu_ratio is not None and limits.alpha == 0.01
    with pytest.raises(UsageError, match="no thresholds file"):
        thresholds.load("nope.toml", "tiny", "cpu")
