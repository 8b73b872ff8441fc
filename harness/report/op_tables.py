"""The op table of a run, as a person reads it: the ops that lose the most time above their
roofline, grouped by stage and block, and what the table covers (harness/metrics/ops.py)."""

from __future__ import annotations

from tabulate import tabulate

from gembench.harness.report.numbers import pct, si

TOP = 10  # rows printed; the JSON keeps every row
STAGE_ORDER = ("data", "sparse_forward", "input_dist", "embedding_lookup", "output_dist", "dense_forward")


def _stage_key(stage: str) -> int:
    order = STAGE_ORDER + ("loss", "backward", "grad_sync", "optimizer")
    return order.index(stage) if stage in order else len(order)


def _short(op: str, width: int = 64) -> str:
    """An op's name within ``width``: a fused kernel is named after every op it fuses."""
    return op if len(op) <= width else op[: width - 3] + "..."


def op_table(result: dict, top: int = TOP) -> str:
    ops = result.get("ops")
    if not ops:
        return ""
    s, rows = ops["summary"], ops["rows"]
    step = s["step_s"]
    shown = sorted(rows[:top], key=lambda r: (_stage_key(r["stage"]), r["block"], -r["lost_s"]))
    table = [
        [
            r["stage"],
            r["block"],
            _short(r["op"]),
            r["calls"],
            f"{1e3 * r['time_s']:.2f}",
            pct(r["time_s"] / step) if step else "-",
            si(r["flops"]) if r["flops"] else "-",
            si(r["read"] + r["written"], "B"),
            f"{r['tflops'] * 1e3:.2f}" if r["flops"] else "-",
            f"{r['gbs']:.1f}",
            f"{r['intensity']:.1f}" if r.get("intensity") else "-",
            r["bound"],
            f"{1e3 * r['lost_s']:.2f}",
        ]
        for r in shown
    ]
    bandwidth = result["peak"].get("bandwidth", {})
    source = str(bandwidth.get("source", "")).split(";")[0]
    head = (
        f"where the op step's time goes: the {len(shown)} of {len(rows)} ops (by stage, block, op) that lose most "
        f"above their roofline, min(peak, FLOP/B x bandwidth); every row in the JSON's ops.rows\n"
        f"roofline of rank {ops['rank']}: peak {ops['peak_tflops']:.4g} TFLOP/s, bandwidth {ops['bandwidth_gbs']:.4g} "
        f"GB/s ({source}{', PROVISIONAL' if bandwidth.get('provisional') else ''})"
    )
    body = tabulate(
        table,
        headers=[
            "stage",
            "block",
            "op",
            "calls",
            "ms",
            "of step",
            "FLOPs",
            "moved",
            "GFLOP/s",
            "GB/s",
            "FLOP/B",
            "bound",
            "lost ms",
        ],
        disable_numparse=True,
        colalign=("left", "left", "left") + ("right",) * 8 + ("left", "right"),
    )
    fused = [r for r in rows if r["bound"] == "fused"]
    fused_s = sum(r["time_s"] for r in fused)
    fused_line = (
        f"\n{len(fused)} fused kernels of compiled graphs took {1e3 * fused_s:.1f} ms "
        f"({pct(fused_s / step) if step else '-'} of the op step): their bytes are unseen, so all their time "
        f"counts as lost"
        if fused
        else ""
    )
    gpu_fused = ", and a GPU's compiled graphs' fused kernels" if "cuda" in str(result["run"].get("device")) else ""
    want = s["model_flops"] + s.get("recomputed_flops", 0.0) + s.get("executed_beyond_model_flops", 0.0)
    flops = (
        f"their FLOPs {si(s['flops'])}: {pct(s['flops'] / want) if want else '-'} of the batch's model FLOPs "
        f"{si(s['model_flops'])} + recomputed {si(s.get('recomputed_flops', 0.0))} + executed beyond the model "
        f"{si(s.get('executed_beyond_model_flops', 0.0))}"
    )
    cover = (
        f"the ops' time covers {pct(s['coverage']) if s.get('coverage') is not None else '-'} of the op step's "
        f"{1e3 * step:.1f} ms (the rest: Python and framework time between ops{gpu_fused}); "
        f"{1e3 * s['lost_s']:.1f} ms above the roofline in all{fused_line}"
    )
    return f"{head}\n{body}\n{cover}\n{flops}"
