"""The HTML skeleton every gembench page shares: one file, inline CSS, no scripts, no requests.

`gembench report` and `gembench compare --format html` both build on page(); the look lives
in CSS here once. Everything interpolated goes through esc() (result files are data, not markup).
"""

from __future__ import annotations

import html

CSS = """
:root { --ink:#1a202c; --muted:#5a6472; --line:#e2e6eb; --panel:#f7f8fa; --accent:#2b6cb0;
        --good:#2f855a; --bad:#c53030; --warn:#b7791f; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--ink); background: #fff;
       font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
header.top { background: #1f2a37; color: #f4f6f8; padding: 18px 32px 14px; }
header.top h1 { margin: 0 0 4px; font-size: 21px; font-weight: 650; letter-spacing: .2px; }
header.top .meta { color: #c3cad3; font-size: 12.5px; }
header.top .meta b { color: #fff; font-weight: 600; }
main { max-width: 1240px; margin: 0 auto; padding: 8px 32px 48px; }
h2 { font-size: 17px; margin: 30px 0 6px; padding-bottom: 4px; border-bottom: 2px solid var(--line); }
h3 { font-size: 14px; margin: 18px 0 6px; color: var(--muted); font-weight: 600; }
p.lead { color: var(--muted); margin: 2px 0 10px; }
figure { margin: 10px 0 16px; padding: 10px 12px 8px; background: var(--panel);
         border: 1px solid var(--line); border-radius: 6px; }
figure svg { display: block; max-width: 100%; height: auto; margin: 0 auto; }
figcaption { font-size: 12px; color: var(--muted); margin-top: 6px; }
figcaption b { color: var(--ink); font-weight: 600; }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr)); gap: 0 16px; }
table { border-collapse: collapse; font-size: 12.5px; margin: 6px 0 12px; }
th, td { padding: 4px 10px; border-bottom: 1px solid var(--line); text-align: right; white-space: nowrap; }
th { background: var(--panel); font-weight: 600; color: var(--muted); }
th:first-child, td:first-child, td.l, th.l { text-align: left; }
td.mono, span.mono { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: 12px; }
.badge { display: inline-block; padding: 0 7px; border-radius: 9px; font-size: 11.5px; font-weight: 600;
         color: #fff; background: var(--muted); }
.PASS, .improved, .unchanged { background: var(--good); }
.FAIL, .regressed { background: var(--bad); }
.INCONCLUSIVE, .inconclusive, .NOT-COMPARABLE, .not-comparable { background: var(--warn); }
.SKIP, .not-judged, .no-checks { background: #a0aec0; }
.warn { background: #fffaf0; border: 1px solid #f6e05e; border-left: 4px solid var(--warn);
        padding: 8px 12px; border-radius: 4px; margin: 12px 0; font-size: 13px; }
.callout { border-left: 4px solid var(--accent); background: #ebf4ff; padding: 6px 12px; margin: 8px 0;
           border-radius: 3px; font-size: 13px; }
details { border: 1px solid var(--line); border-radius: 5px; margin: 6px 0; background: #fff; }
details > summary { cursor: pointer; padding: 6px 10px; font-size: 13px; }
details[open] > summary { border-bottom: 1px solid var(--line); background: var(--panel); }
details > div { padding: 4px 10px 2px; overflow-x: auto; }
ul.checks { margin: 4px 0 10px; padding-left: 18px; font-size: 12.5px; }
footer { color: var(--muted); font-size: 12px; border-top: 1px solid var(--line); margin-top: 36px; padding-top: 8px; }
"""


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def badge(status: str) -> str:
    return f'<span class="badge {esc(status.replace(" ", "-"))}">{esc(status)}</span>'


def table(headers: list[str], rows: list[list[str]], raw: bool = False) -> str:
    """An HTML table; cells are escaped unless ``raw`` (then the caller escaped them)."""
    cell = (lambda v: str(v)) if raw else esc
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def figure(svg: str, caption_html: str) -> str:
    return f"<figure>{svg}<figcaption>{caption_html}</figcaption></figure>"


def details(summary_html: str, inner_html: str) -> str:
    return f"<details><summary>{summary_html}</summary><div>{inner_html}</div></details>"


def page(title: str, header_meta_html: str, body_html: str, footer_html: str = "") -> str:
    """A whole page: no <script>, no external URL; the only resources are inline."""
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        # forbids every fetch: a page that tried one would show the violation in the console
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; img-src data:\">\n"
        f"<title>{esc(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        f'<header class="top"><h1>{esc(title)}</h1><div class="meta">{header_meta_html}</div></header>\n'
        f"<main>\n{body_html}\n<footer>{footer_html}</footer>\n</main>\n</body>\n</html>\n"
    )
