"""Tables a person can read, made from result documents (never from live objects)."""

from __future__ import annotations

from tabulate import tabulate


def si(value: float, unit: str = "") -> str:
    """1234567 -> '1.23 M'; keeps tables narrow without losing the order of magnitude."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}".strip()


def pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def ms(seconds: float) -> str:
    return f"{1e3 * seconds:.1f}"


def header(result: dict) -> str:
    run, env, peak = result["run"], result["env"], result["peak"]
    commit = env["git_commit"][:10] + ("+dirty" if env.get("git_dirty") else "")
    return (
        f"gembench run {result['config']['name']} ({result['config']['kind']}): "
        f"stack {run['stack']}, {run['dtype']}, {run['device']} = {env['device_name']}\n"
        f"batch {run['global_batch']} global / {run['per_rank_batch']} per rank x {run['nproc']} rank(s); "
        f"{run['steps']} timed steps after {run['warmup']} warm-up; seed {run['seed']}; commit {commit}\n"
        f"peak {peak['tflops_per_device']:.4g} TFLOP/s per device ({peak['source']})"
    )


def stage_table(result: dict) -> str:
    s = result["summary"]
    rows = [
        [name, ms(r["time_s"]), pct(r["share"]), si(r["flops"], "FLOP") if r["flops"] else "-",
         f"{r['tflops']:.3f}" if r["flops"] else "-", pct(r["mfu"]) if r["flops"] else "-"]
        for name, r in s["stages"].items()
    ]
    step = s["step_time_s"]
    rows.append(["step (wall, p50)", ms(step["p50"]), "", si(result["flops"]["model_per_step"], "FLOP"),
                 f"{s['tflops']:.3f}", pct(s["mfu"])])
    return tabulate(rows, headers=["stage", "mean ms", "share", "model FLOPs", "TFLOP/s", "MFU"],
                    colalign=("left", "right", "right", "right", "right", "right"))


def totals_table(result: dict) -> str:
    s = result["summary"]
    step = s["step_time_s"]
    lo, hi = step["ci95"]
    rows = [
        ["step time p50 / p90", f"{ms(step['p50'])} / {ms(step['p90'])} ms"],
        ["p50 95% CI", f"[{ms(lo)}, {ms(hi)}] ms"],
        ["stages cover", f"{pct(s['stage_coverage'])} of each step's wall time"],
        ["examples/s", f"{s['examples_per_s']:,.0f}"],
        ["achieved", f"{s['tflops']:.3f} TFLOP/s"],
        ["MFU", pct(s["mfu"])],
        ["peak memory", f"{s['peak_memory_bytes'] / 2**20:,.0f} MiB ({s['peak_memory_source']})"],
        ["embedding bytes/step", f"{si(s['embedding_bytes_per_step']['read'], 'B')} read, "
                                 f"{si(s['embedding_bytes_per_step']['written'], 'B')} written"],
    ]
    return tabulate(rows, tablefmt="plain")


def run_report(result: dict) -> str:
    return "\n\n".join([header(result), stage_table(result), totals_table(result)])
