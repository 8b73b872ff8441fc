"""`gembench report` and `gembench compare --format html`: content, git order, gate marks, bad input."""

import re
import subprocess

import pytest
from report_fixtures import ab_result, baseline, dist_result, full_result, write
from synthetic import run_cli

from gembench.harness.report.html import collect

# a request-making construct anywhere in the page (namespace URIs in SVG are not requests)
FETCHES = re.compile(
    r"""(\bsrc\s*=|href\s*=\s*["']?(https?:|//)|url\(\s*["']?(https?:|//)|@import|<script|<link\b)""", re.I
)


def two_commits():
    """Two commits, older first: this checkout's last two, or made-up ones in a shallow clone
    (unknown commits are ordered by creation time, which the fixtures make increase)."""
    known = collect.commit_order()
    if len(known) >= 2:
        return known[-2], known[-1], known
    return "1" * 40, "2" * 40, []


def _git(repo, *args) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def test_commit_order_is_gits_and_ends_at_head(tmp_path, monkeypatch):
    """On a made-up history: oldest first, ending at HEAD; a side branch's commits after their
    parent; outside a checkout, no order and no HEAD. On this checkout: HEAD after its parents."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "--quiet", "-b", "main")
    made = []
    for i in range(3):
        (repo / "f").write_text(str(i))
        _git(repo, "add", "f")
        _git(repo, "commit", "--quiet", "-m", f"c{i}")
        made.append(_git(repo, "rev-parse", "HEAD"))
    assert collect.head(repo) == made[-1]
    assert collect.commit_order(repo) == made  # linear: git's order, ends at HEAD
    _git(repo, "checkout", "--quiet", "-b", "side", made[0])
    (repo / "g").write_text("side")
    _git(repo, "add", "g")
    _git(repo, "commit", "--quiet", "-m", "side")
    side = _git(repo, "rev-parse", "HEAD")
    order = collect.commit_order(repo)  # every ref, topological: each commit after its parent
    assert sorted(order) == sorted([*made, side]) and order.index(side) > order.index(made[0])
    assert order.index(made[0]) < order.index(made[1]) < order.index(made[2])
    plain = tmp_path / "plain"
    plain.mkdir()
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # git must not find a repository above
    assert collect.head(repo) == side and collect.commit_order(plain) == [] and collect.head(plain) is None
    monkeypatch.delenv("GIT_CEILING_DIRECTORIES")

    head = collect.head()
    if head is None:
        pytest.skip("not a git checkout")
    known = collect.commit_order()
    assert head in known
    parents = _git(collect.SOURCE_DIR, "rev-parse", "HEAD^@").split()  # none in a shallow clone
    assert all(known.index(p) < known.index(head) for p in parents if p in known)


def test_order_commits_follows_git_and_puts_unknown_last_by_creation_time():
    older, newer = "a" * 40, "b" * 40
    known = ["0" * 40, older, "c" * 40, newer]
    runs = [
        full_result("a", newer, created="2026-01-01T00:00:00+00:00"),
        full_result("b", "f" * 40, created="2026-01-03T00:00:00+00:00"),
        full_result("c", "e" * 40, created="2026-01-02T00:00:00+00:00"),
        full_result("d", older, created="2026-01-04T00:00:00+00:00"),
    ]
    assert collect.order_commits(runs, known) == [older, newer, "e" * 40, "f" * 40]


def test_report_page_is_self_contained_and_marks_the_regression(tmp_path, capsys):
    older, newer, _ = two_commits()
    base = [full_result(f"base{i}", older, seed=i) for i in range(3)]
    write(tmp_path / "baselines" / "cpu-test-2t" / "tiny.json", baseline(base))
    # the newer commit is twice as slow: MFU and step time regress against the baseline
    for i in range(3):
        write(
            tmp_path / "runs" / f"slow{i}.json",
            full_result(f"slow{i}", newer, step_s=0.2, seed=10 + i, created="2026-01-02T00:00:00+00:00"),
        )
    write(tmp_path / "runs" / "ab.json", ab_result("ab1", newer))
    write(tmp_path / "runs" / "dist.json", dist_result("dist1", newer))
    code, out, err = run_cli(
        ["report", str(tmp_path / "runs"), str(tmp_path / "baselines"), "--out", str(tmp_path / "rep")], capsys
    )
    assert code == 0, err
    page = (tmp_path / "rep" / "index.html").read_text()
    assert "report:" in out and "index.html" in out
    assert not FETCHES.search(page), FETCHES.search(page).group(0)
    # groups: single-process optimized (history + stages), --ab, --nproc 2 (history, stages, heat map, load, comm)
    assert page.count("<figure>") == 2 + 2 + 5
    assert page.count("<svg") == page.count("<figure>")
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids)), "ids repeat across the inline SVGs"
    # the gate's own checks: a FAIL against the baseline at the newer commit, none at the baseline's
    assert "vs baseline mfu" in page and "regressed" in page and 'class="badge FAIL"' in page
    assert "Largest remaining loss: <b>backward</b>" in page
    assert "(--ab: both stacks)" in page and "Optimized/baseline MFU ratio <b>2.05x</b>" in page
    assert "Per-rank stages" in page and "Embedding load per rank" in page and "exposed vs overlapped" in page
    # every figure caption names device, dtype, peak and commit
    for cap in re.findall(r"<figcaption>(.*?)</figcaption>", page, re.S):
        assert "device <b>Test CPU" in cap and "dtype <b>bf16" in cap and "TFLOP/s" in cap and "commit <b>" in cap
    # counters (present on the distributed run) and every run's environment, collapsed
    assert page.count("<details>") == 3 + 3 + 1 + 1
    assert "aten_ops" in page and "not recorded by the gembench that made this run" in page


def test_report_on_a_folder_without_results_exits_2_with_one_line(tmp_path, capsys):
    code, out, err = run_cli(["report", str(tmp_path), "--out", str(tmp_path / "rep")], capsys)
    assert code == 2 and not (tmp_path / "rep").exists()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(tmp_path) in lines[0] and "gembench run" in lines[0]


def test_corrupt_and_foreign_files_are_named_and_skipped(tmp_path, capsys):
    _, newer, _ = two_commits()
    write(tmp_path / "good.json", full_result("good", newer))
    (tmp_path / "corrupt.json").write_text('{"schema": "gembench.result/1", ')
    write(tmp_path / "foreign.json", {"schema": "someone-else/2", "value": 1})
    code, out, err = run_cli(["report", str(tmp_path), "--out", str(tmp_path / "rep")], capsys)
    assert code == 0
    warnings = [ln for ln in err.splitlines() if "warning: skipped" in ln]
    assert len(warnings) == 2
    assert any("corrupt.json" in w and "bad JSON" in w for w in warnings)
    assert any("foreign.json" in w and "someone-else/2" in w for w in warnings)
    page = (tmp_path / "rep" / "index.html").read_text()
    assert "2 file(s) skipped" in page and "foreign.json" in page


def test_nothing_left_after_skipping_exits_2(tmp_path, capsys):
    (tmp_path / "corrupt.json").write_text("not json")
    code, out, err = run_cli(["report", str(tmp_path / "*.json"), "--out", str(tmp_path / "rep")], capsys)
    assert code == 2 and "corrupt.json" in err and "no gembench results" in err
    assert not (tmp_path / "rep" / "index.html").exists()


def test_compare_html_renders_the_verdict_table(tmp_path, capsys):
    older, newer, _ = two_commits()
    a = [write(tmp_path / f"a{i}.json", full_result(f"a{i}", older, seed=i)) for i in range(3)]
    b = [write(tmp_path / f"b{i}.json", full_result(f"b{i}", newer, step_s=0.2, seed=10 + i)) for i in range(3)]
    code, out, err = run_cli(["compare", ",".join(a), ",".join(b), "--format", "html"], capsys)
    assert code == 0 and out.startswith("<!DOCTYPE html>")
    assert 'class="badge regressed"' in out and "step_time_s" in out and not FETCHES.search(out)
    target = tmp_path / "cmp.html"
    code, out, err = run_cli(["compare", ",".join(a), ",".join(b), "--format", "html", "--out", str(target)], capsys)
    assert code == 0 and out == "" and target.read_text().count('class="badge regressed"') >= 2
