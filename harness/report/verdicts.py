"""The verdict tables of `gembench compare` and `gembench continuous`: terminal and Markdown.

The statistics (regression/compare.py, regression/paired.py) give plain rows; this renders them.
"""

from __future__ import annotations

import math

from gembench.harness.regression import stats
from gembench.harness.regression.compare import Comparison, rows
from gembench.harness.regression.paired import rows as paired_rows
from gembench.harness.regression.work import side_by_side
from gembench.harness.report.numbers import change, count, num, ratio


def header(c: Comparison) -> list[str]:
    lines = [f"A: {', '.join(c.a_ids)}", f"B: {', '.join(c.b_ids)}"]
    if c.reasons:
        lines.append(("FORCED, " if c.forced else "") + "not comparable: " + "; ".join(c.reasons))
    if c.work is not None:
        lines.append("work changed: " + c.work.line())
    elif (same := side_by_side(*c.model_flops, beyond=c.beyond)) is not None:
        lines.append(same)
    tested = sum(1 for j in c.judgements if j.method != "count")
    counted = len(c.judgements) - tested
    lines.append(
        f"one-sided tests at alpha={c.alpha:g} (Holm across {tested} metrics), "
        f"min effect {100 * c.min_effect:g}%, interval {100 * (1 - 2 * c.alpha):g}%"
        + (f"; {counted} exact counters: any increase beyond its threshold regresses" if counted else "")
    )
    return lines


def render_table(c: Comparison, fmt: str) -> str:
    """Terminal ("table") or Markdown ("markdown") rendering of one comparison."""
    from tabulate import tabulate

    level = f"{100 * (1 - 2 * c.alpha):g}% CI"
    table = []
    for r in rows(c):
        ci = "-" if not r["ci"] else f"[{change(r['ci'][0])}, {change(r['ci'][1])}]"
        p = r.get("p_worse_holm") if r["verdict"] != "improved" else r.get("p_better_holm")
        arrow = {"lower": " (lower better)", "higher": " (higher better)"}.get(r["better"], "")
        fmt_value = count if r.get("method") == "count" else num
        table.append(
            [
                r["metric"] + arrow,
                fmt_value(r["a"]),
                fmt_value(r["b"]),
                change(r["change"]),
                ci,
                num(p),
                r.get("method", "-"),
                r["verdict"],
            ]
        )
    cols = ["metric", "A", "B", "change", level, "p (Holm)", "one value is", "verdict"]
    lines = header(c)
    if c.reasons and not c.forced:
        return "\n".join(lines + ["(pass --force to compare anyway)"])
    body = tabulate(table, cols, tablefmt="github" if fmt == "markdown" else "simple", disable_numparse=True)
    below: list[str] = []
    _listed(below, op_time_lines(c.op_times, paired=False), fmt == "markdown")
    if fmt == "markdown":
        return "\n".join(["**gembench compare**", ""] + [f"- {ln}" for ln in lines] + ["", body, "", *below])
    return "\n".join(lines + ["", body] + (["", *below] if below else []))


def render_paired(judgements: list[stats.Judgement], header: list[str], fmt: str) -> str:
    """Terminal ("table") or Markdown ("markdown") table, one row per metric."""
    from tabulate import tabulate

    table, level = [], None
    for r in paired_rows(judgements):
        ci, level = r["ratio_ci"], r["ci_level"] or level
        ci_text = "-" if not ci or any(not math.isfinite(x) for x in ci) else f"[{ci[0]:.4f}, {ci[1]:.4f}]"
        p = r["p_better_holm"] if r["verdict"] == stats.IMPROVED else r["p_worse_holm"]
        one = {"paired": f"{r['rounds']} pair ratios", "count": "exact count"}.get(r["method"], r["method"])
        value = count if r["method"] == "count" else num
        table.append(
            [
                f"{r['metric']} ({r['better']} better)",
                value(r["base"]),
                value(r["head"]),
                ratio(r["ratio"]),
                ci_text,
                num(p),
                one,
                r["verdict"],
            ]
        )
    interval = f"{100 * level:g}% CI (decides)" if level else "CI"
    cols = ["metric", "BASE", "HEAD", "HEAD/BASE", interval, "p (Holm)", "one value is", "verdict"]
    body = tabulate(table, cols, tablefmt="github" if fmt == "markdown" else "simple", disable_numparse=True)
    if fmt == "markdown":
        return "\n".join(["**gembench continuous**", ""] + [f"- {ln}" for ln in header] + ["", body])
    return "\n".join(header + ["", body])


def numerics_line(n: dict) -> str:
    """One sentence for the ``numerics`` section (regression/numerics.py)."""
    if n["verdict"] == "not compared":
        return f"numerics not compared: {n['reason']}"
    tol = f"{n['dtype']}'s tolerance {n['tolerance']:.0e}"
    if n["verdict"] == "unchanged":
        return f"numerics unchanged: {n['steps']} steps' losses, max |rel diff| {n['max_rel_diff']:.1e} within {tol}"
    f = n["first"]
    a, b = ("non-finite" if v is None else f"{v:.7g}" for v in (f["base"], f["head"]))
    where = f"first at step {f['step']} ({f['series']}, pair {f['pair']})"
    if n["verdict"] == "unreproducible":
        return f"numerics unreproducible: {n['reason']}, {where}: {a} vs {b} (beyond {tol})"
    return f"numerics changed: {where}, BASE {a} vs HEAD {b} (rel diff {f['rel_diff']:.1e} > {tol})"


def ops_lines(ops: dict, top: int = 10) -> tuple[str, list[str]] | None:
    """The aten ops added, removed or changed in count per step: a heading and the ``top``
    biggest changes; None where nothing changed or the counts were not recorded."""
    changes = ops["changes"]
    if not ops["recorded"] or not changes:
        return None
    more = f", the top {top} of {len(changes)} (all in --format json's op_changes)" if len(changes) > top else ""
    head = f"aten ops changed per step ({count(ops['base_total'])} -> {count(ops['head_total'])}){more}:"
    items = [f"{c['op']} {count(c['base'])} -> {count(c['head'])} ({c['kind']})" for c in changes[:top]]
    return head, items


def op_time_lines(times: list[dict] | None, paired: bool, top: int = 5) -> tuple[str, list[str]] | None:
    """The ``top`` ops whose time in the op step changed most (opdiff.time_changes): a heading and
    one line each, with the stage and block it sits in; None where a side has no op table."""
    if not times:
        return None
    more = f" (all {len(times)} in the JSON's op times)" if len(times) > top else ""
    how = "HEAD - BASE, mean of the pairs' differences, 95% interval" if paired else "B - A, medians"
    head = f"ops whose time changed most, in the op step ({how}){more}:"
    items = []
    for t in times[:top]:
        ci = f" [{1e3 * t['ci_s'][0]:+.2f}, {1e3 * t['ci_s'][1]:+.2f}]" if t.get("ci_s") else ""
        items.append(
            f"{t['op']} in {t['stage']} / {t['block']}: {1e3 * t['base_s']:.2f} -> {1e3 * t['head_s']:.2f} ms "
            f"({1e3 * t['delta_s']:+.2f}{ci}){'' if t['kind'] == 'changed' else ' ' + t['kind']}"
        )
    return head, items


def _listed(lines: list[str], listed, md: bool) -> None:
    if listed:
        lines.append(("- " if md else "") + listed[0])
        lines += [f"  - `{x}`" if md else f"  {x}" for x in listed[1]]


def render_changes(numerics: dict, ops: dict, fmt: str) -> str:
    """The lines under `continuous`'s table: its numerics, the ops that changed in count, and
    those whose time changed most."""
    md = fmt == "markdown"
    lines = ["", ("- " if md else "") + numerics_line(numerics)]
    _listed(lines, ops_lines(ops), md)
    _listed(lines, op_time_lines(ops.get("times"), paired=True), md)
    return "\n".join(lines)
