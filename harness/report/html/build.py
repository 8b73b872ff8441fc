"""The report page: one section per group (config x hardware class x stack/dtype/ranks/batch).

Each section: MFU and step time per commit with the baseline and the gate's limits, the latest
run's stages (and the --ab baseline stack), for distributed runs the per-rank heat map, embedding
load and communication, then every run's counters and environment, collapsed.
"""

from __future__ import annotations

import datetime as dt
import re
import socket

from gembench.harness.report import op_tables
from gembench.harness.report.html import figures
from gembench.harness.report.html.collect import Group, failed_metrics, overall, short
from gembench.harness.report.html.page import badge, details, esc, figure, page, table
from gembench.harness.report.numbers import pct, si
from gembench.harness.report.rank_tables import LOAD_LABELS
from gembench.harness.report.tables import largest_loss
from gembench.harness.store.results import field as get


def mfu_pct(value: float | None) -> str:
    """MFU as a percentage with three significant digits: CPU runs sit far below 1%."""
    return "-" if value is None else f"{100 * value:.3g}%"


def commit_label(run: dict) -> str:
    c = get(run, "env.git_commit") or "unknown"
    return short(c) + ("+dirty" if get(run, "env.git_dirty") else "")


def peak_source(peak: dict) -> str:
    """Where the peak came from, without the cache file's path (the environment section has it)."""
    return re.sub(r" \(cached in [^)]*\)", "", str(peak.get("source", "?")))


def caption(g: Group, runs: list[dict], what: str) -> str:
    """Every figure says device, dtype, peak and commit(s) it was drawn from."""
    r = runs[-1]
    peak = r.get("peak") or {}
    commits = sorted({commit_label(x) for x in runs})
    commit_text = (
        commits[0]
        if len(commits) == 1
        else f"{len(commits)} commits ({', '.join(commits[:6])}{', ...' if len(commits) > 6 else ''})"
    )
    return (
        f"<b>{esc(what)}</b> — device <b>{esc(get(r, 'env.device_name') or get(r, 'run.device'))}</b> "
        f"({esc(g.hardware_class)}), dtype <b>{esc(get(r, 'run.dtype'))}</b>, peak "
        f"<b>{peak.get('tflops_per_device', float('nan')):.4g} TFLOP/s</b> per device ({esc(peak_source(peak))}), "
        f"commit <b>{esc(commit_text)}</b>, {len(runs)} run(s)."
    )


def history_figure(g: Group) -> str:
    labels = [short(c) for c in g.commits]
    x_of = {c: i for i, c in enumerate(g.commits)}
    flagged = {c: failed_metrics(g.checks.get(c, [])) for c in g.commits}
    base = g.baseline
    base_commit = short(get(base[0], "env.git_commit") or "?") if base else ""

    def panel(metric, title, ylabel, scale, limit_field=None):
        points = [
            (x_of[get(r, "env.git_commit") or "unknown"], r["metrics"][metric])
            for r in g.runs
            if isinstance((r.get("metrics") or {}).get(metric), (int, float))
        ]
        if not points:
            return None
        values = [r["metrics"][metric] for r in base if isinstance(r["metrics"].get(metric), (int, float))]
        limit = getattr(g.limits, limit_field, None) if (g.limits and limit_field) else None
        where = (g.limits.sources or {}).get(limit_field, "") if limit is not None else ""
        return {
            "title": title,
            "ylabel": ylabel,
            "unit_scale": scale,
            "points": points,
            "baseline": sum(values) / len(values) if values else None,
            "baseline_label": f"baseline {base_commit} (mean of {len(values)})",
            "limit": (limit, f"gate {limit_field} {limit:g} {where}") if limit is not None else None,
            "flagged": {x_of[c]: f[metric] for c, f in flagged.items() if metric in f},
        }

    panels = [
        panel("mfu", "MFU", "MFU (%)", 100.0, "min_mfu"),
        panel("step_time_s", "step time (p50)", "ms", 1e3),
        panel("ab_mfu_ratio", "optimized / baseline stack MFU", "ratio", 1.0, "min_ab_mfu_ratio"),
        panel("imbalance_max_mean", "embedding imbalance", "max / mean", 1.0, "max_imbalance"),
        panel("exposed_comm_fraction", "exposed communication", "% of step", 100.0, "max_exposed_comm"),
    ]
    panels = [p for p in panels if p]
    svg = figures.history(panels, labels)
    return figure(
        svg,
        caption(g, g.runs, "Per commit, oldest left (git order; commits git does not know last)")
        + " Dots are runs, the line their median; dashed: the committed baseline; dotted red: the gate's "
        "limit from the thresholds file; a red X: a gate check FAILed at that commit.",
    )


def stages_figure(g: Group) -> str:
    r = g.latest
    peak = r["peak"]["tflops_per_device"]
    bars, losses = [], []
    if "ab" in r:
        base = r["ab"]["baseline"]["summary"]
        bars.append(("baseline stack", {k: v["time_s"] for k, v in base["stages"].items()}))
        losses.append(largest_loss(base, peak))
        label = "optimized stack"
    else:
        label = "critical path" if (get(r, "run.nproc") or 1) > 1 else str(get(r, "run.stack"))
    bars.append((label, {k: v["time_s"] for k, v in r["summary"]["stages"].items()}))
    losses.append(largest_loss(r["summary"], peak))
    svg = figures.stage_bars(bars, losses)
    stage, secs = losses[-1]
    step = r["summary"]["step_time_s"]["p50"]
    callout = (
        f'<div class="callout">Largest remaining loss: <b>{esc(stage)}</b>, {1e3 * secs:.1f} ms of the '
        f"{1e3 * step:.1f} ms step above what its model FLOPs need at the peak."
    )
    if "ab" in r:
        ab = r["ab"]
        lo, hi = ab["mfu_ratio_ci95"]
        callout += (
            f" Optimized/baseline MFU ratio <b>{ab['mfu_ratio']:.2f}x</b> (95% CI [{lo:.2f}, {hi:.2f}], "
            f"{ab['rounds']} interleaved rounds)."
        )
    callout += "</div>"
    what = f"Stages of the latest run {r.get('id')}" + (" (--ab: both stacks)" if "ab" in r else "")
    return callout + figure(
        svg, caption(g, [r], what) + " Mean ms per timed step; the hatched segment is the largest loss."
    )


def distributed_figures(g: Group) -> str:
    r = g.latest
    if (get(r, "run.nproc") or 1) <= 1 or "ranks" not in r:
        return ""
    imb, comm = r["imbalance"], r["comm"]
    out = [
        figure(
            figures.rank_heatmap(r["ranks"], imb["critical_path_s"]),
            caption(g, [r], "Per-rank stages") + " Colour: each stage relative to its slowest rank "
            f"(the straggler is the darkest cell); stall cost {pct(imb['stall_cost'])} of the step.",
        )
    ]
    measured = {k: v for k, v in imb["measured"]["loads"].items() if k in ("ids", "bytes_moved", "lookup_s")}
    limit = getattr(g.limits, "max_imbalance", None) if g.limits else None
    primary = imb["measured"]["metrics"][imb["primary"]]
    out.append(
        figure(
            figures.rank_loads(
                measured,
                imb["planned"]["loads"],
                LOAD_LABELS,
                (limit, f"gate max_imbalance {limit:g}") if limit else None,
            ),
            caption(g, [r], "Embedding load per rank, measured on the real batches vs TorchRec's planner")
            + f" Primary load {esc(LOAD_LABELS.get(imb['primary'], imb['primary']))}: max/mean "
            f"{primary['max_mean']:.3f}; {pct(imb['hot_1pct_share'])} of lookups hit the hottest 1% of rows.",
        )
    )
    if "rebalance" in r:
        rb = r["rebalance"]
        change = rb["step_change"]
        moved = ", ".join(f"{m['table'].removeprefix('table_')} {m['before']} to {m['after']}" for m in rb["moved"][:8])
        out.append(
            figure(
                figures.rebalance(
                    [
                        (name, rb[key])
                        for name, key in (
                            ("planner's plan", "before"),
                            ("rebalanced", "after"),
                            ("planner's plan again", "again"),
                        )
                        if key in rb
                    ],
                    rb["primary"],
                    LOAD_LABELS.get(rb["primary"], rb["primary"]),
                ),
                caption(
                    g,
                    [r],
                    "Rebalanced: the planner's plan, then TorchRec's planner again on the load measured on it,"
                    " then the planner's plan once more",
                )
                + f" Step rebalanced/planner's plan {change['ratio']:.3f} (95% CI {change['ci95'][0]:.3f} to "
                f"{change['ci95'][1]:.3f}); {len(rb['moved'])} table(s) moved"
                + (f": {esc(moved)}" if moved else "")
                + ".",
            )
        )
    per_kind = all("exposed_s" in k for k in comm["by_kind"].values())
    out.append(
        figure(
            figures.comm_split(comm["by_kind"], comm["exposure"]),
            caption(g, [r], "Communication per collective, exposed vs overlapped with compute")
            + f" From {comm['profiled_steps']} profiled steps per rank (torch.profiler); exposed communication "
            f"{pct(comm['exposed_comm_fraction'])} of the step, mean of ranks. Per kind, ms per step: "
            + ", ".join(
                f"{esc(k)} {1e3 * v['time_s']:.1f}"
                for k, v in sorted(comm["by_kind"].items(), key=lambda kv: -kv[1]["time_s"])
            )
            + "."
            + ("" if per_kind else " This result predates per-collective exposure: only the per-rank split is known."),
        )
    )
    return "".join(out)


def kv_table(mapping: dict) -> str:
    rows = []
    for k, v in mapping.items():
        if isinstance(v, dict):
            v = ", ".join(f"{a} {b}" for a, b in v.items())
        rows.append(f'<tr><td class="l">{esc(k)}</td><td class="l mono">{esc(v)}</td></tr>')
    return f"<table><tbody>{''.join(rows)}</tbody></table>"


COUNTER_ORDER = ("aten_ops", "host_syncs", "h2d_bytes", "kernels", "graph_breaks", "recompiles", "source")


def run_details(r: dict) -> str:
    s = r["summary"]
    summary = (
        f'<span class="mono">{esc(r.get("id"))}</span> — commit {esc(commit_label(r))}, '
        f"{esc(r.get('created', '?'))}, MFU {mfu_pct(s['mfu'])}, step {1e3 * s['step_time_s']['p50']:.1f} ms"
    )
    counters = r.get("counters")
    if isinstance(counters, dict):
        ordered = {k: counters[k] for k in COUNTER_ORDER if k in counters}
        ordered.update({k: v for k, v in counters.items() if k not in ordered and k != "aten_op_counts"})
        counter_html = "<h3>cost counters (lower is better)</h3>" + kv_table(
            {
                k: ("n/a" if v is None else (si(v) if isinstance(v, (int, float)) and k.endswith("bytes") else v))
                for k, v in ordered.items()
            }
        )
    else:
        counter_html = '<h3>cost counters</h3><p class="lead">not recorded by the gembench that made this run</p>'
    run = {k: v for k, v in (r.get("run") or {}).items() if k not in ("batches",)}
    peak = {k: v for k, v in (r.get("peak") or {}).items()}
    op_html = (
        "<h3>op table</h3>"
        + "".join(f'<p class="lead">{esc(line)}</p>' for line in op_tables.head_lines(r))
        + table(op_tables.HEADERS, op_tables.top_rows(r))
        + "".join(f'<p class="lead">{esc(line)}</p>' for line in op_tables.foot_lines(r))
        if r.get("ops")
        else ""
    )
    inner = (
        op_html
        + counter_html
        + "<h3>metrics</h3>"
        + kv_table({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in (r.get("metrics") or {}).items()})
        + "<h3>environment</h3>"
        + kv_table(r.get("env") or {})
        + "<h3>run</h3>"
        + kv_table(run)
        + "<h3>peak</h3>"
        + kv_table(peak)
        + "<h3>config</h3>"
        + kv_table(r.get("config") or {})
    )
    return details(summary, inner)


def gate_list(g: Group) -> str:
    commit = get(g.latest, "env.git_commit") or "unknown"
    checks = g.checks.get(commit, [])
    if not checks:
        return ""
    items = "".join(f"<li>{badge(c.status)} <b>{esc(c.name)}</b>: {esc(c.detail)}</li>" for c in checks)
    base = (
        f"baseline {esc(g.baseline_path)}"
        if g.baseline_path
        else "no committed baseline for this group (create one: gembench promote RESULT)"
    )
    return f'<h3>gate at the latest commit {esc(short(commit))} ({base})</h3><ul class="checks">{items}</ul>'


def section(g: Group) -> str:
    parts = [
        f'<h2 id="{esc(g.anchor)}">{esc(g.title)}</h2>',
        f'<p class="lead">{len(g.runs)} run(s) over {len(g.commits)} commit(s); config hash '
        f'<span class="mono">{esc(get(g.latest, "config.hash"))}</span></p>',
        history_figure(g),
        gate_list(g),
        stages_figure(g),
        distributed_figures(g),
        "<h3>runs (counters and environment)</h3>",
    ]
    parts += [run_details(r) for r in reversed(g.runs)]
    return "\n".join(p for p in parts if p)


def overview(groups: list[Group]) -> str:
    rows = []
    for g in groups:
        r = g.latest
        commit = get(r, "env.git_commit") or "unknown"
        base = g.baseline
        values = [x["metrics"]["mfu"] for x in base if isinstance(x["metrics"].get("mfu"), (int, float))]
        base_mfu = sum(values) / len(values) if values else None
        rows.append(
            [
                f'<a href="#{esc(g.anchor)}">{esc(g.config)}</a>',
                esc(get(r, "run.stack")),
                esc(get(r, "run.dtype")),
                esc(get(r, "run.nproc")),
                esc(g.hardware_class),
                esc(len(g.runs)),
                esc(commit_label(r)),
                mfu_pct(r["summary"]["mfu"]),
                f"{1e3 * r['summary']['step_time_s']['p50']:.1f}",
                mfu_pct(base_mfu),
                badge(overall(g.checks.get(commit, []))),
            ]
        )
    return table(
        [
            "config",
            "stack",
            "dtype",
            "ranks",
            "hardware class",
            "runs",
            "latest commit",
            "MFU",
            "step ms",
            "baseline MFU",
            "gate (latest)",
        ],
        rows,
        raw=True,
    )


def projection_section(doc: dict) -> str:
    """A `gembench project` sweep: stages on the critical path and MFU / exposed comm vs GPUs."""
    rows = [r for r in doc["rows"] if r["plan"]["fits"]]
    c, opts = doc["cluster"], doc["options"]
    title = f"Projection: {doc['config']['name']} on {c['name']}"
    head = (
        f'<h2 id="p-{esc(doc["id"])}">{esc(title)}</h2><p class="lead">{esc(doc["schedule"])} schedule, dense '
        f"{esc(opts['dense_parallel'])}, checkpointing {esc(opts['activation_checkpointing'])}; compute "
        f"{esc(doc['compute']['source'])}. A model, not a measurement: `gembench project --check` prints its "
        "error against measured runs.</p>"
    )
    missing = [str(r["world"]) for r in doc["rows"] if not r["plan"]["fits"]]
    note = f"<p>No plan fits at {esc(', '.join(missing))} GPUs.</p>" if missing else ""
    if not rows:
        return head + note
    cap = (
        f"<b>{esc(title)}</b>: per world size, the step's critical path by stage (left) and MFU and exposed "
        f"communication (right). Device <b>{esc(c['name'])}</b>, dtype <b>bf16</b>, peak "
        f"<b>{c['peak_tflops']:g} TFLOP/s</b> per GPU, commit <b>{esc(short(doc['env']['git_commit']))}</b>."
    )
    return head + figure(figures.projection(rows), cap) + note


def render(
    groups: list[Group],
    skipped: list[tuple[str, str]],
    inputs: list[str],
    files: int,
    head: str | None,
    thresholds: str | None,
    projections: list[dict] = (),
) -> str:
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    runs = sum(len(g.runs) for g in groups)
    meta = (
        f"<b>{runs}</b> runs in <b>{len(groups)}</b> groups from <b>{files}</b> files "
        f"({esc(', '.join(inputs))}) · thresholds {esc(thresholds or 'none')} · "
        f"source at commit <b>{esc(short(head) if head else 'unknown')}</b> · "
        f"built {esc(now)} on {esc(socket.gethostname())}"
    )
    body = []
    if skipped:
        items = "".join(f'<li><span class="mono">{esc(p)}</span>: {esc(why)}</li>' for p, why in skipped)
        body.append(f'<div class="warn"><b>{len(skipped)} file(s) skipped</b><ul>{items}</ul></div>')
    if groups:
        body.append(
            '<h2>Overview</h2><p class="lead">The latest run of each group; MFU = model FLOPs per step / '
            "step time / (peak x devices). Gate = the worst of `gembench gate`'s checks at that commit.</p>"
        )
        body.append(overview(groups))
    body += [section(g) for g in groups]
    body += [projection_section(doc) for doc in projections]
    footer = (
        "gembench report: one self-contained file (inline SVG drawn by matplotlib, no scripts, no network). "
        'Regenerate with <span class="mono">gembench report --out DIR</span>.'
    )
    return page("gembench report", meta, "\n".join(body), footer)


def render_compare(comparisons: list, title: str = "gembench compare") -> str:
    """The compare/gate verdict table(s) of `gembench compare --format html`."""
    from gembench.harness.regression.compare import rows
    from gembench.harness.report.numbers import change, num
    from gembench.harness.report.verdicts import header

    body = []
    for c in comparisons:
        lines = "".join(f"<li>{esc(ln)}</li>" for ln in header(c))
        body.append(f'<ul class="checks">{lines}</ul>')
        if c.reasons and not c.forced:
            body.append('<div class="warn">not comparable (pass --force to compare anyway)</div>')
            continue
        level = f"{100 * (1 - 2 * c.alpha):g}% CI"
        table_rows = []
        for r in rows(c):
            ci = "-" if not r["ci"] else f"[{change(r['ci'][0])}, {change(r['ci'][1])}]"
            p = r.get("p_worse_holm") if r["verdict"] != "improved" else r.get("p_better_holm")
            better = f" ({r['better']} better)" if r["better"] else ""
            table_rows.append(
                [
                    f'<span class="l">{esc(r["metric"])}{esc(better)}</span>',
                    esc(num(r["a"])),
                    esc(num(r["b"])),
                    esc(change(r["change"])),
                    esc(ci),
                    esc(num(p)),
                    esc(r.get("method", "-")),
                    badge(r["verdict"]),
                ]
            )
        body.append(
            table(["metric", "A", "B", "change", level, "p (Holm)", "one value is", "verdict"], table_rows, raw=True)
        )
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return page(title, f"{len(comparisons)} comparison(s) · built {esc(now)}", "\n".join(body))
