"""`gembench compare`: verdicts by direction, formats, replicates, not-comparable, errors."""

import json

from synthetic import make_result, run_cli, save


def _pair(tmp_path, slow=1.0, **kw):
    a = save(tmp_path, make_result(rid="a", seed=1))
    b = save(tmp_path, make_result(rid="b", seed=2, step_s=0.100 * slow, **kw))
    return a, b


def test_slowdown_is_a_regression_in_each_metric_direction(tmp_path, capsys):
    a, b = _pair(tmp_path, slow=1.10)
    code, out, _ = run_cli(["compare", a, b, "--format", "json"], capsys)
    assert code == 0
    rows = {r["metric"]: r for r in json.loads(out)["comparisons"][0]["rows"]}
    assert rows["step_time_s"]["verdict"] == "regressed" and rows["step_time_s"]["change"] > 0.05
    assert rows["mfu"]["verdict"] == "regressed" and rows["mfu"]["change"] < -0.05  # lower MFU is worse
    assert rows["examples_per_s"]["verdict"] == "regressed"
    assert rows["peak_memory_bytes"]["verdict"] == "unchanged"
    assert rows["step_time_s"]["method"] == "batch-medians"
    lo, hi = rows["step_time_s"]["ci"]
    assert lo < rows["step_time_s"]["change"] < hi


def test_speedup_is_an_improvement(tmp_path, capsys):
    a, b = _pair(tmp_path, slow=0.85)
    out = run_cli(["compare", a, b, "--format", "json"], capsys)[1]
    rows = {r["metric"]: r["verdict"] for r in json.loads(out)["comparisons"][0]["rows"]}
    assert rows["step_time_s"] == rows["mfu"] == "improved"


def test_table_and_markdown_formats(tmp_path, capsys):
    a, b = _pair(tmp_path, slow=1.10)
    code, table, _ = run_cli(["compare", a, b], capsys)
    assert code == 0 and "step_time_s (lower better)" in table and "regressed" in table and "98% CI" in table
    code, md, _ = run_cli(["compare", a, b, "--format", "markdown"], capsys)
    assert code == 0 and md.startswith("**gembench compare**") and "| metric" in md and "|---" in md.replace(":", "")


def test_replicates_by_comma_and_glob(tmp_path, capsys):
    for i in range(4):
        save(tmp_path, make_result(rid=f"main{i}", seed=i))
        save(tmp_path, make_result(rid=f"pr{i}", seed=10 + i, step_s=0.12))
    a = ",".join(str(tmp_path / f"main{i}.json") for i in range(4))
    out = run_cli(["compare", a, str(tmp_path / "pr*.json"), "--format", "json"], capsys)[1]
    cmp = json.loads(out)["comparisons"][0]
    assert cmp["b"] == ["pr0", "pr1", "pr2", "pr3"]
    step = next(r for r in cmp["rows"] if r["metric"] == "step_time_s")
    assert step["method"] == "replicates" and step["n"] == [4, 4] and step["verdict"] == "regressed"


def test_not_comparable_unless_forced(tmp_path, capsys):
    a = save(tmp_path, make_result(rid="a"))
    b = save(tmp_path, make_result(rid="b", hardware_class="cuda-h100"))
    code, out, _ = run_cli(["compare", a, b], capsys)
    assert code == 3 and "not comparable: env.hardware_class" in out and "--force" in out
    code, out, _ = run_cli(["compare", a, b, "--force", "--format", "json"], capsys)
    cmp = json.loads(out)["comparisons"][0]
    assert code == 0 and cmp["forced"] and not cmp["comparable"] and cmp["rows"]


def test_usage_errors_are_one_line_exit_2(tmp_path, capsys):
    a, _ = _pair(tmp_path)
    for argv, words in [
        (["compare", a, str(tmp_path / "nope.json")], "no result file"),
        (["compare", a], "at least two"),
        (["compare", a, a, "--alpha", "0.9"], "--alpha"),
        (["compare", a, a, "--metric", "speed"], "unknown"),
    ]:
        code, _, err = run_cli(argv, capsys)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, (argv, err)
