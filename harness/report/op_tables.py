"""The op table of a run, as a person reads it: the ops that lose the most time above their
roofline, grouped by stage and block, and what the table covers (harness/metrics/ops.py)."""

from __future__ import annotations

from tabulate import tabulate

from gembench.harness.metrics.fused import FUSED_OP
from gembench.harness.report.numbers import pct, si

TOP = 10  # rows printed; the JSON keeps every row
STAGE_ORDER = ("data", "sparse_forward", "input_dist", "embedding_lookup", "output_dist", "dense_forward")


def _stage_key(stage: str) -> int:
    order = STAGE_ORDER + ("loss", "backward", "grad_sync", "optimizer")
    return order.index(stage) if stage in order else len(order)


def _short(op: str, width: int = 64) -> str:
    """An op's name within ``width``: a fused kernel is named after every op it fuses."""
    return op if len(op) <= width else op[: width - 3] + "..."


HEADERS = [
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
]


def top_rows(result: dict, top: int = TOP) -> list[list]:
    """The ``top`` rows that lose most above their roofline, as printed (HEADERS), grouped by
    stage and block; none where the result has no op table."""
    ops = result.get("ops")
    if not ops:
        return []
    step = ops["summary"]["step_s"]
    shown = sorted(ops["rows"][:top], key=lambda r: (_stage_key(r["stage"]), r["block"], -r["lost_s"]))
    return [
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


def head_lines(result: dict, top: int = TOP) -> list[str]:
    """What the table shows and the roofline it is held against."""
    ops = result["ops"]
    bandwidth = result["peak"].get("bandwidth", {})
    source = str(bandwidth.get("source", "")).split(";")[0]
    return [
        f"where the op step's time goes: the {min(top, len(ops['rows']))} of {len(ops['rows'])} ops (by stage, "
        f"block, op) that lose most above their roofline, min(peak, FLOP/B x bandwidth); every row in the JSON's "
        f"ops.rows",
        f"roofline of rank {ops['rank']}: peak {ops['peak_tflops']:.4g} TFLOP/s, bandwidth {ops['bandwidth_gbs']:.4g} "
        f"GB/s ({source}{', PROVISIONAL' if bandwidth.get('provisional') else ''})",
    ]


def foot_lines(result: dict) -> list[str]:
    """What the table covers of the op step, the fused kernels' share, and its FLOPs' sum."""
    s, rows = result["ops"]["summary"], result["ops"]["rows"]
    step = s["step_s"]
    kernels = [r for r in rows if r["op"].startswith(FUSED_OP)]
    unseen = [r for r in kernels if r["bound"] == "fused"]
    kernels_s = sum(r["time_s"] for r in kernels)
    gpu_fused = ", and a GPU's compiled graphs' fused kernels" if "cuda" in str(result["run"].get("device")) else ""
    lines = [
        f"the ops' time covers {pct(s['coverage']) if s.get('coverage') is not None else '-'} of the op step's "
        f"{1e3 * step:.1f} ms (the rest: Python and framework time between ops{gpu_fused}); "
        f"{1e3 * s['lost_s']:.1f} ms above the roofline in all"
    ]
    if kernels:
        bytes_are = (
            "their bytes are the buffers each call is handed, read and written"
            if not unseen
            else f"{len(unseen)} of them with bytes unseen, all their time counted lost"
        )
        lines.append(
            f"{len(kernels)} fused kernels of compiled graphs took {1e3 * kernels_s:.1f} ms "
            f"({pct(kernels_s / step) if step else '-'} of the op step): {bytes_are}"
        )
    want = s["model_flops"] + s.get("recomputed_flops", 0.0) + s.get("executed_beyond_model_flops", 0.0)
    lines.append(
        f"their FLOPs {si(s['flops'])}: {pct(s['flops'] / want) if want else '-'} of the batch's model FLOPs "
        f"{si(s['model_flops'])} + recomputed {si(s.get('recomputed_flops', 0.0))} + executed beyond the model "
        f"{si(s.get('executed_beyond_model_flops', 0.0))}"
    )
    return lines


def op_table(result: dict, top: int = TOP) -> str:
    if not result.get("ops"):
        return ""
    body = tabulate(
        top_rows(result, top),
        headers=HEADERS,
        disable_numparse=True,
        colalign=("left", "left", "left") + ("right",) * 8 + ("left", "right"),
    )
    return "\n".join(head_lines(result, top) + [body] + foot_lines(result))
