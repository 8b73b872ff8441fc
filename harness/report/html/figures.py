"""matplotlib figures for the HTML report, each returned as an inline SVG string.

Drawn with the Agg-free SVG backend and text as paths, so a page looks the same on every machine
(no font needs to be installed where it is opened). Every function takes plain result documents
(gembench.result/1) or numbers taken from them, never live objects. Times are drawn in ms.
"""

from __future__ import annotations

import io
import re

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

STYLE = {
    "svg.fonttype": "path",  # glyphs as paths: identical everywhere, no font requests
    "svg.hashsalt": "gembench",  # stable clip-path ids: the same input gives the same page
    "font.family": "DejaVu Sans",  # ships inside matplotlib
    "font.size": 8,
    "axes.titlesize": 9,
    "axes.titleweight": "bold",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e3e6ea",
    "grid.linewidth": 0.6,
    "axes.axisbelow": True,
    "axes.edgecolor": "#8a9099",
    "legend.frameon": False,
    "legend.fontsize": 7,
}

# One colour per stage name, the same in every figure of a page (single-process and rank stages).
STAGE_COLORS = {
    "data": "#9aa5b1",
    "sparse_forward": "#4e79a7",
    "input_dist": "#a0cbe8",
    "embedding_lookup": "#4e79a7",
    "output_dist": "#86bcb6",
    "dense_forward": "#59a14f",
    "loss": "#b6992d",
    "backward": "#f28e2b",
    "grad_sync": "#ff9d9a",
    "optimizer": "#b07aa1",
}
EXTRA_COLORS = ["#76b7b2", "#edc948", "#9c755f", "#bab0ac", "#d37295"]
SERIES = "#2b6cb0"
BASELINE = "#6b7280"
LIMIT = "#c53030"
GOOD, BAD = "#2f855a", "#c53030"


def stage_color(name: str) -> str:
    if name in STAGE_COLORS:
        return STAGE_COLORS[name]
    return EXTRA_COLORS[sum(map(ord, name)) % len(EXTRA_COLORS)]


_counter = iter(range(1, 1 << 30))


def to_svg(fig) -> str:
    """The figure as an <svg> element: no XML prolog, ids prefixed so several SVGs share one page."""
    buf = io.StringIO()
    fig.savefig(
        buf,
        format="svg",
        bbox_inches="tight",
        facecolor="none",  # the page's panel shows through
        metadata={"Date": None, "Creator": None},
    )
    plt.close(fig)
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    prefix = f"f{next(_counter)}-"
    ids = set(re.findall(r'\bid="([^"]+)"', text))
    for name in sorted(ids, key=len, reverse=True):
        text = (
            text.replace(f'id="{name}"', f'id="{prefix}{name}"')
            .replace(f"#{name})", f"#{prefix}{name})")
            .replace(f'#{name}"', f'#{prefix}{name}"')
        )
    return text


def _fig(width: float, height: float):
    with plt.rc_context(STYLE):
        return plt.figure(figsize=(width, height), layout="constrained")


# -- history across commits -------------------------------------------------------------------


def history(panels: list[dict], commits: list[str]) -> str:
    """Small multiples, one panel per metric, x = commits in git order.

    Each panel: {title, unit_scale (multiply values for display), ylabel, points: [(x, value)],
    baseline: value | None, baseline_label, limit: (value, label) | None, flagged: {x: reason}}.
    """
    with plt.rc_context(STYLE):
        fig = _fig(2.9 * len(panels), 2.5)
        axes = fig.subplots(1, len(panels), squeeze=False)[0]
        for ax, p in zip(axes, panels):
            k = p.get("unit_scale", 1.0)
            xs = np.array([x for x, _ in p["points"]], dtype=float)
            ys = np.array([v * k for _, v in p["points"]], dtype=float)
            ax.scatter(xs, ys, s=14, color=SERIES, alpha=0.55, zorder=3, label="run")
            med = [(x, float(np.median(ys[xs == x]))) for x in sorted(set(xs))]
            ax.plot(
                [m[0] for m in med],
                [m[1] for m in med],
                color=SERIES,
                lw=1.4,
                zorder=3,
                marker="o",
                ms=3.5,
                label="median per commit",
            )
            if p.get("baseline") is not None:
                ax.axhline(
                    p["baseline"] * k, color=BASELINE, ls="--", lw=1.1, label=p.get("baseline_label", "baseline")
                )
            if p.get("limit"):
                value, label = p["limit"]
                ax.axhline(value * k, color=LIMIT, ls=":", lw=1.3, label=label)
            for x, _reason in (p.get("flagged") or {}).items():
                y = [m[1] for m in med if m[0] == x]
                if y:
                    ax.scatter([x], y, s=90, marker="X", color=BAD, zorder=4, edgecolor="white", lw=0.6)
            if p.get("flagged"):
                ax.scatter([], [], s=50, marker="X", color=BAD, label="gate FAIL")
            ax.set_title(p["title"], loc="left")
            ax.set_ylabel(p["ylabel"])
            ax.set_xticks(
                range(len(commits)),
                commits,
                rotation=30 if len(commits) > 4 else 0,
                ha="right" if len(commits) > 4 else "center",
                fontsize=7,
            )
            ax.set_xlim(-0.5, max(len(commits) - 0.5, 0.5))
            lo, hi = ax.get_ylim()
            ax.set_ylim(min(0, lo), hi * 1.08)
        # one legend for the row of panels, above it: the panels stay free for the data
        seen: dict[str, object] = {}
        for ax in axes:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                seen.setdefault(label, handle)
        fig.legend(list(seen.values()), list(seen), loc="outside upper center", ncols=min(len(seen), 4), fontsize=6.5)
        return to_svg(fig)


# -- stages -----------------------------------------------------------------------------------


def stage_bars(bars: list[tuple[str, dict[str, float]]], losses: list[tuple[str, float]]) -> str:
    """Horizontal stacked bars of mean stage time (s in, ms drawn), one bar per (label, stages).

    ``losses[i]`` = (stage, seconds above ideal) of bar i: that segment is outlined and labelled.
    """
    stages: list[str] = []
    for _, st in bars:
        stages += [s for s in st if s not in stages]
    with plt.rc_context(STYLE):
        fig = _fig(8.6, 0.55 + 0.48 * len(bars))
        ax = fig.subplots()
        for i, (_label, st) in enumerate(bars):
            left = 0.0
            for s in stages:
                width = 1e3 * st.get(s, 0.0)
                loss = losses[i][0] == s
                ax.barh(
                    i,
                    width,
                    left=left,
                    color=stage_color(s),
                    height=0.62,
                    edgecolor="#1a202c" if loss else "white",
                    lw=1.6 if loss else 0.5,
                    hatch="///" if loss else None,
                )
                if width > 0.06 * sum(st.values()) * 1e3:
                    ax.text(left + width / 2, i, f"{width:.1f}", ha="center", va="center", fontsize=6.5, color="white")
                left += width
            stage, secs = losses[i]
            ax.text(
                left,
                i,
                f"  largest loss: {stage} ({1e3 * secs:.1f} ms above ideal)",
                va="center",
                fontsize=7,
                color="#1a202c",
            )
        ax.set_yticks(range(len(bars)), [b[0] for b in bars])
        ax.invert_yaxis()
        ax.set_xlabel("mean ms per step (stages; hatched = largest remaining loss)")
        ax.grid(axis="y", visible=False)
        xmax = max(1e3 * sum(st.values()) for _, st in bars)
        ax.set_xlim(0, xmax * 1.6)
        handles = [Patch(facecolor=stage_color(s), edgecolor="white", label=s) for s in stages]
        ax.legend(
            handles=handles,
            ncols=min(len(stages), 8),
            loc="lower left",
            bbox_to_anchor=(0.0, 1.0),
            fontsize=6.5,
            handlelength=1.2,
            columnspacing=1.0,
        )
        return to_svg(fig)


# -- distributed runs -------------------------------------------------------------------------


def rank_heatmap(ranks: list[dict], critical: dict[str, float]) -> str:
    """Ranks x stages, mean ms per step; the slowest rank of each stage is boxed."""
    stages = list(critical)
    data = np.array([[1e3 * r["stage_means_s"].get(s, 0.0) for s in stages] for r in ranks])
    with plt.rc_context(STYLE):
        fig = _fig(min(1.6 + 0.95 * len(stages), 9.5), 1.2 + 0.3 * len(ranks))
        ax = fig.subplots()
        # each stage scaled to its own slowest rank: a straggler shows as the dark cell of its column
        rel = data / np.maximum(data.max(axis=0, keepdims=True), 1e-12)
        im = ax.imshow(rel, aspect="auto", cmap="Oranges", vmin=0, vmax=1)
        for i in range(data.shape[0]):
            for j in range(data.shape[1]):
                ax.text(
                    j,
                    i,
                    f"{data[i, j]:.1f}",
                    ha="center",
                    va="center",
                    fontsize=6.5,
                    color="white" if rel[i, j] > 0.65 else "#1a202c",
                )
        ax.set_xticks(range(len(stages)), stages, rotation=25, ha="right")
        ax.set_yticks(range(len(ranks)), [f"rank {r['rank']}" for r in ranks])
        ax.grid(False)
        cb = fig.colorbar(im, ax=ax, shrink=0.9, pad=0.01)
        cb.set_label("share of the slowest rank", fontsize=6.5)
        cb.ax.tick_params(labelsize=6)
        ax.set_title("mean ms per stage and rank", loc="left")
        return to_svg(fig)


def rank_loads(
    measured: dict[str, list[float]],
    planned: dict[str, list[float]],
    labels: dict[str, str],
    limit: tuple[float, str] | None,
) -> str:
    """Embedding load per rank as a multiple of the mean over ranks: measured vs the planner's."""
    series = [("measured", k, v) for k, v in measured.items()] + [("planned", k, v) for k, v in planned.items()]
    nranks = len(series[0][2]) if series else 0
    with plt.rc_context(STYLE):
        fig = _fig(5.6, 2.6)
        ax = fig.subplots()
        width = 0.8 / max(len(series), 1)
        palette = ["#2b6cb0", "#4299e1", "#90cdf4", "#63b3ed", "#dd6b20", "#f6ad55"]
        for i, (side, key, values) in enumerate(series):
            v = np.array(values, dtype=float)
            rel = v / v.mean() if v.mean() > 0 else np.zeros_like(v)
            color = palette[i % 4] if side == "measured" else palette[4 + i % 2]
            ax.bar(
                np.arange(nranks) + (i - (len(series) - 1) / 2) * width,
                rel,
                width * 0.92,
                color=color,
                hatch=None if side == "measured" else "..",
                edgecolor="white",
                lw=0.3,
                label=f"{side}: {labels.get(key, key)}",
            )
        ax.axhline(1.0, color=BASELINE, lw=0.8)
        if limit:
            ax.axhline(limit[0], color=LIMIT, ls=":", lw=1.3, label=limit[1])
        ax.set_xticks(range(nranks), [f"rank {r}" for r in range(nranks)])
        ax.set_ylabel("load / mean over ranks")
        ax.set_title("embedding load per rank", loc="left")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=6.5)
        return to_svg(fig)


def rebalance(sides: list[tuple[str, dict]], primary: str, label: str) -> str:
    """--rebalance: per rank, the primary lookup load (left) and the step p50 (right) of each run
    (the planner's plan, the rebalanced one, the planner's plan again)."""
    colors = ["#dd6b20", "#2b6cb0", "#f6ad55"]
    nranks = len(sides[0][1]["loads"][primary])
    x, width = np.arange(nranks), 0.8 / len(sides)
    with plt.rc_context(STYLE):
        fig = _fig(6.4, 2.4)
        left, right = fig.subplots(1, 2)
        for i, ((name, side), color) in enumerate(zip(sides, colors)):
            at = x + (i - (len(sides) - 1) / 2) * width
            m = side["metrics"][primary]["max_mean"]
            left.bar(
                at,
                np.array(side["loads"][primary], dtype=float) / 1e6,
                width * 0.92,
                color=color,
                label=f"{name} (max/mean {m:.3f})",
            )
            right.bar(at, 1e3 * np.array(side["rank_step_p50_s"]), width * 0.92, color=color, label=name)
        load_unit = "MB" if primary.startswith("bytes") else "millions"
        for ax, title, unit in ((left, f"{label} per rank", load_unit), (right, "step p50 per rank", "ms")):
            ax.set_xticks(x, [f"rank {r}" for r in range(nranks)])
            ax.set_title(title, loc="left")
            ax.set_ylabel(unit)
        left.legend(loc="lower left", fontsize=6.5)
        return to_svg(fig)


def comm_split(by_kind: dict[str, dict], exposure: list[dict]) -> str:
    """Left: ms per step per collective kind, exposed vs overlapped where recorded. Right: per rank."""
    kinds = sorted(by_kind, key=lambda k: by_kind[k]["time_s"])
    per_kind = all("exposed_s" in by_kind[k] for k in kinds)
    with plt.rc_context(STYLE):
        fig = _fig(8.6, 0.9 + 0.26 * max(len(kinds), len(exposure)))
        left, right = fig.subplots(1, 2, width_ratios=[1.6, 1])
        y = np.arange(len(kinds))
        if per_kind:
            exp = np.array([1e3 * by_kind[k]["exposed_s"] for k in kinds])
            ovl = np.array([1e3 * by_kind[k]["overlapped_s"] for k in kinds])
            left.barh(y, exp, color=BAD, height=0.6, label="exposed")
            left.barh(y, ovl, left=exp, color=GOOD, height=0.6, label="overlapped")
        else:
            left.barh(
                y,
                [1e3 * by_kind[k]["time_s"] for k in kinds],
                color=BASELINE,
                height=0.6,
                label="time (exposure not recorded per kind)",
            )
        maxes = [1e3 * by_kind[k].get("time_max_s", by_kind[k]["time_s"]) for k in kinds]
        left.scatter(maxes, y, marker="|", s=80, color="#1a202c", zorder=4, label="slowest rank")
        left.set_yticks(y, kinds)
        left.set_xlabel("ms per step (mean of ranks)")
        left.set_title("per collective", loc="left")
        left.grid(axis="y", visible=False)
        left.legend(loc="lower right", fontsize=6.5)
        r = np.arange(len(exposure))
        exp = np.array([1e3 * e["exposed_s"] for e in exposure])
        ovl = np.array([1e3 * e["overlapped_s"] for e in exposure])
        right.barh(r, exp, color=BAD, height=0.6, label="exposed")
        right.barh(r, ovl, left=exp, color=GOOD, height=0.6, label="overlapped")
        for i, e in enumerate(exposure):
            right.text(exp[i] + ovl[i], i, f" {100 * e['exposed_fraction']:.1f}% of step", va="center", fontsize=6.5)
        right.set_yticks(r, [f"rank {e['rank']}" for e in exposure])
        right.set_xlim(0, max(float((exp + ovl).max()) if len(exposure) else 1.0, 1e-6) * 1.7)
        right.invert_yaxis()
        right.set_xlabel("ms per step, all collectives")
        right.set_title("per rank", loc="left")
        right.grid(axis="y", visible=False)
        right.legend(loc="lower right", fontsize=6.5)
        return to_svg(fig)


def projection(rows: list[dict]) -> str:
    """Left: exposed ms per stage, stacked, per world size. Right: MFU and exposed comm share vs GPUs."""
    stages = list(rows[0]["stages"])
    worlds = [r["world"] for r in rows]
    with plt.rc_context(STYLE):
        fig = _fig(8.6, 2.8)
        left, right = fig.subplots(1, 2, width_ratios=[1.3, 1])
        x = np.arange(len(rows))
        bottom = np.zeros(len(rows))
        for stage in stages:
            ms = np.array([1e3 * r["stages"][stage]["exposed_s"] for r in rows])
            left.bar(x, ms, bottom=bottom, color=stage_color(stage), width=0.6, label=stage)
            bottom += ms
        left.set_xticks(x, [f"{w:,}" for w in worlds])
        left.set_xlabel("GPUs")
        left.set_ylabel("ms per step (critical path)")
        left.set_title("step by stage", loc="left")
        left.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=6.5)
        left.grid(axis="x", visible=False)
        right.plot(worlds, [100 * r["mfu"] for r in rows], marker="o", color=SERIES, label="MFU %")
        right.plot(
            worlds,
            [100 * r["exposed_comm_fraction"] for r in rows],
            marker="s",
            color=BAD,
            label="exposed comm % of step",
        )
        right.set_xscale("log", base=2)
        right.set_xticks(worlds, [f"{w:,}" for w in worlds])
        right.set_xlabel("GPUs")
        right.set_ylim(0, 100)
        right.set_title("MFU and exposed communication", loc="left")
        right.legend(loc="upper left", fontsize=6.5)
        return to_svg(fig)
