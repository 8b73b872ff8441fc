"""Exact cost counters in compare and gate: any increase beyond its threshold regresses, no statistics."""

import pytest
from synthetic import make_result, run_cli, save

from gembench.errors import UsageError
from gembench.harness.commands.promote import promote
from gembench.harness.regression import thresholds
from gembench.harness.regression.compare import compare
from gembench.harness.regression.counters import judge_counter

COUNTS = {"aten_ops": 1200, "host_syncs": 3, "h2d_bytes": 65536, "kernels": None, "graph_breaks": 0, "recompiles": 0}


def _with(**changes):
    return {**COUNTS, **changes}


def _verdicts(c):
    return {j.metric: j.verdict for j in c.judgements}


def test_equal_counters_unchanged_and_null_kernels_not_judged():
    c = compare([make_result("a", seed=1, counters=COUNTS)], [make_result("b", seed=2, counters=COUNTS)])
    v = _verdicts(c)
    assert all(v[k] == "unchanged" for k in ("aten_ops", "host_syncs", "h2d_bytes", "graph_breaks", "recompiles"))
    assert "kernels" not in v and "kernels" not in c.unjudged  # null on CPU: absent from metrics


def test_one_more_op_regresses_one_fewer_improves():
    a = [make_result("a", seed=1, counters=COUNTS)]
    assert _verdicts(compare(a, [make_result("b", counters=_with(aten_ops=1201))]))["aten_ops"] == "regressed"
    assert _verdicts(compare(a, [make_result("b", counters=_with(aten_ops=1199))]))["aten_ops"] == "improved"
    # a graph break appearing from zero has no relative change, and still regresses
    j = [
        j
        for j in compare(a, [make_result("b", counters=_with(graph_breaks=1))]).judgements
        if j.metric == "graph_breaks"
    ][0]
    assert j.verdict == "regressed" and j.change is None and j.method == "count"


def test_counter_absent_on_one_side_is_not_judged():
    c = compare([make_result("a")], [make_result("b", counters=COUNTS)])
    assert "aten_ops" not in _verdicts(c) and c.unjudged["aten_ops"] == (None, 1200)
    from gembench.harness.report.verdicts import render_table

    row = [ln for ln in render_table(c, "table").splitlines() if ln.startswith("aten_ops")][0]
    assert " - " in row and "not judged" in row


def test_replicates_that_disagree_compare_medians_and_say_so():
    j = judge_counter("aten_ops", [100, 101, 101], [101, 101, 102], 0.0)
    assert j.verdict == "unchanged" and (j.mean_a, j.mean_b) == (101, 101)
    assert "A varies between runs (100..101): not deterministic" in j.note and "B varies" in j.note
    assert judge_counter("aten_ops", [100, 100, 101], [101, 101, 100], 0.0).verdict == "regressed"
    assert judge_counter("aten_ops", [7, 7], [7, 7], 0.0).note == "allowed increase 0% (default)"


TOML = """
[defaults]
max_counter_increase = 0.1
max_host_syncs_increase = 0
[hardware."cpu-*".config."tiny"]
max_counter_increase = 0.5
[hardware."cuda-*"]
max_aten_ops_increase = 0.01
"""


def test_thresholds_layers_and_per_counter_override(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text(TOML)
    cpu_tiny = thresholds.load(path, "tiny", "cpu-test-2t")
    assert cpu_tiny.counter_limit("aten_ops") == (0.5, "max_counter_increase from [hardware.'cpu-*'.config.'tiny']")
    assert cpu_tiny.counter_limit("host_syncs")[0] == 0.0  # per counter beats the general one
    assert thresholds.load(path, "small", "cpu-test-2t").counter_limit("h2d_bytes")[0] == 0.1
    assert thresholds.load(path, "small", "cuda-h100").counter_limit("aten_ops")[0] == 0.01
    assert cpu_tiny.counter_limit("instructions.hstu")[0] == 0.01  # instructions: their own default, not the general
    a = [make_result("a", seed=1, counters=COUNTS)]
    b = [make_result("b", seed=2, counters=_with(aten_ops=1500, host_syncs=4))]
    v = _verdicts(compare(a, b, limits=cpu_tiny))
    assert v["aten_ops"] == "unchanged" and v["host_syncs"] == "regressed"  # +25% allowed, +1 sync is not
    v = _verdicts(compare(a, b, limits=thresholds.load(path, "small", "cpu-test-2t")))
    assert v["aten_ops"] == "regressed"  # +25% > 10%


def test_threshold_field_errors_name_the_field(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text("[defaults]\nmax_counter_increase = -1\n")
    with pytest.raises(UsageError, match=r"\[defaults\] field 'max_counter_increase' = -1 is out of range"):
        thresholds.load(path, "tiny", "cpu-x")
    path.write_text("[defaults]\nmax_atenops_increase = 0\n")
    with pytest.raises(UsageError, match="'max_atenops_increase' is unknown"):
        thresholds.load(path, "tiny", "cpu-x")


@pytest.fixture
def gated(tmp_path):
    (tmp_path / "t.toml").write_text("[defaults]\nalpha = 0.01\nmin_effect = 0.03\nmax_counter_increase = 0\n")
    baseline, _ = promote([make_result(rid="base", seed=1, noise=0.002, counters=COUNTS)], tmp_path / "baselines")
    return tmp_path, str(tmp_path / "t.toml"), str(baseline)


def test_gate_fails_on_one_extra_sync_and_passes_on_equal_counts(gated, capsys):
    tmp, t, base = gated
    same = save(tmp, make_result(rid="same", seed=2, noise=0.002, counters=COUNTS))
    code, out, _ = run_cli(["gate", same, "--thresholds", t, "--baseline", base], capsys)
    assert code == 0, out
    assert "PASS           vs baseline host_syncs: unchanged: 3 -> 3 (+0.00%), exact count" in out
    more = save(tmp, make_result(rid="more", seed=2, noise=0.002, counters=_with(host_syncs=4)))
    code, out, _ = run_cli(["gate", more, "--thresholds", t, "--baseline", base], capsys)
    assert code == 1, out
    assert "FAIL           vs baseline host_syncs: regressed: 3 -> 4 (+33.33%), exact count, allowed increase 0%" in out


def test_compare_command_reads_counter_thresholds(tmp_path, capsys):
    (tmp_path / "t.toml").write_text("[defaults]\nmax_aten_ops_increase = 0.05\n")
    a = save(tmp_path, make_result("a", seed=1, counters=COUNTS))
    b = save(tmp_path, make_result("b", seed=2, counters=_with(aten_ops=1230)))
    code, out, _ = run_cli(["compare", a, b, "--format", "json", "--thresholds", str(tmp_path / "t.toml")], capsys)
    import json

    rows = {r["metric"]: r for r in json.loads(out)["comparisons"][0]["rows"]}
    assert code == 0 and rows["aten_ops"]["verdict"] == "unchanged" and rows["aten_ops"]["method"] == "count"
    code, out, _ = run_cli(["compare", a, b, "--format", "json", "--thresholds", str(tmp_path / "none.toml")], capsys)
    assert code == 2
