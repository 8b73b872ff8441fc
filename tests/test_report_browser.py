"""The report in a real browser: headless Chromium through Selenium, network off, from a temp dir.

Asserts what a person opening the page would notice: no console errors, no request leaving the
page or failing, every figure drawn with a non-zero size; and a screenshot is taken. The checker
itself is tested on pages broken on purpose, so a clean result means something.
"""

import pytest
from report_fixtures import ab_result, dist_result, full_result, write
from synthetic import run_cli

from gembench.harness.report.html import collect
from gembench.harness.report.html.browser import check_page, missing

pytestmark = pytest.mark.skipif(missing() is not None, reason=missing() or "")


def test_report_renders_clean_offline(tmp_path, capsys):
    commit = collect.head() or "0" * 40
    runs = tmp_path / "runs"
    for i in range(2):
        write(runs / f"r{i}.json", full_result(f"r{i}", commit, seed=i))
    write(runs / "ab.json", ab_result("ab", commit))
    write(runs / "dist.json", dist_result("dist", commit))
    code, _, err = run_cli(["report", str(runs), "--out", str(tmp_path / "rep")], capsys)
    assert code == 0, err
    page = tmp_path / "rep" / "index.html"
    shot = tmp_path / "shot.png"
    check = check_page(page, screenshot=shot)
    assert check.problems() == []
    assert len(check.figures) == page.read_text().count("<figure>") == 2 + 2 + 5
    assert all(f["width"] > 100 and f["height"] > 50 for f in check.figures)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    assert check.page_size[1] > 1500  # the whole page laid out, not an error stub


def test_compare_html_renders_clean_offline(tmp_path, capsys):
    a = write(tmp_path / "a.json", full_result("a", "0" * 40))
    b = write(tmp_path / "b.json", full_result("b", "0" * 40, step_s=0.2, seed=3))
    code, _, _ = run_cli(["compare", a, b, "--format", "html", "--out", str(tmp_path / "c.html")], capsys)
    assert code == 0
    check = check_page(tmp_path / "c.html")
    assert check.problems(min_figures=0) == []


BROKEN = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>broken</title></head><body>
<figure><svg xmlns="http://www.w3.org/2000/svg" width="200" height="100"><rect width="200" height="100" fill="teal"/></svg>
<figcaption>fine</figcaption></figure>
<figure><svg xmlns="http://www.w3.org/2000/svg" width="0" height="0"></svg><figcaption>empty svg</figcaption></figure>
<figure><img src="missing.png" alt=""><figcaption>missing file</figcaption></figure>
<img src="https://example.com/pixel.png" alt="">
<script>console.error("boom from the page");</script>
<script>throw new Error("uncaught here");</script>
</body></html>
"""


def test_checker_reports_what_is_broken(tmp_path):
    page = tmp_path / "broken.html"
    page.write_text(BROKEN)
    check = check_page(page)
    problems = "\n".join(check.problems())
    assert "boom from the page" in problems and "uncaught here" in problems
    assert "request left the page: https://example.com/pixel.png" in problems
    assert "missing.png" in problems and "request failed" in problems
    empty = {f["caption"] for f in check.empty_figures()}
    assert {"empty svg", "missing file", "https://example.com/pixel.png"} <= empty and "fine" not in empty
