"""Tables a person can read, made from result documents (never from live objects)."""

from __future__ import annotations

from tabulate import tabulate

from gembench.harness.report.numbers import ms, pct, si
from gembench.harness.report.op_tables import op_table


def header(result: dict) -> str:
    run, env, peak = result["run"], result["env"], result["peak"]
    commit = env["git_commit"][:10] + ("+dirty" if env.get("git_dirty") else "")
    return (
        f"gembench run {result['config']['name']} ({result['config']['kind']}): "
        f"stack {run['stack']}{''.join(' + ' + c for c in run.get('choices', []))}, {run['dtype']}, "
        f"{run['device']} = {env['device_name']}\n"
        f"batch {run['global_batch']} global / {run['per_rank_batch']} per rank x {run['nproc']} rank(s); "
        f"{run['steps']} timed steps after {run['warmup']} warm-up; seed {run['seed']}; commit {commit}\n"
        + (f"precision {run['dtype_why']}\n" if run.get("dtype_why") else "")
        + f"peak {peak['tflops_per_device']:.4g} TFLOP/s per device ({peak['source']})"
        + basis_line(result)
    )


def basis_line(result: dict) -> str:
    """What MFU divides by, and the other basis beside it (ranks sharing a CPU host)."""
    peak = result["peak"]
    if "basis_text" not in peak:  # results from before the basis was recorded
        return ""
    total = peak["tflops_per_device"] * peak["devices"]
    line = f"\nMFU basis: {peak['basis_text']} = {total:.4g} TFLOP/s"
    host = peak.get("host")
    if host and result["run"]["nproc"] > 1:
        line += (
            f"; beside it, MFU vs the host's own peak at {host['threads']} thread(s)"
            f"{' per host' if host.get('hosts', 1) > 1 else ''}: {host['tflops']:.4g} TFLOP/s "
            f"(the basis of one process on {host['threads']} thread(s))"
        )
    if peak.get("provisional") or (host or {}).get("provisional"):
        line += (
            "\nPROVISIONAL peak: calibrated under load this run and not cached, so MFU may be "
            "overstated; `gembench peak --recalibrate` on a quiet machine"
        )
    return line


def stage_table(result: dict) -> str:
    s = result["summary"]
    # HFU (executed FLOPs, recomputed forwards included) from results that have it; else = MFU
    rows = [
        [
            name,
            ms(r["time_s"]),
            pct(r["share"]),
            si(r["flops"], "FLOP") if r["flops"] else "-",
            f"{r['tflops']:.3f}" if r["flops"] else "-",
            pct(r["mfu"]) if r["flops"] else "-",
            pct(r.get("hfu", r["mfu"])) if r.get("hfu", r["flops"]) else "-",
        ]
        for name, r in s["stages"].items()
    ]
    step = s["step_time_s"]
    rows.append(
        [
            "step (wall, p50)",
            ms(step["p50"]),
            "",
            si(result["flops"]["model_per_step"], "FLOP"),
            f"{s['tflops']:.3f}",
            pct(s["mfu"]),
            pct(s.get("hfu", s["mfu"])),
        ]
    )
    return tabulate(
        rows,
        headers=["stage", "mean ms", "share", "model FLOPs", "TFLOP/s", "MFU", "HFU"],
        colalign=("left", "right", "right", "right", "right", "right", "right"),
    )


def totals_table(result: dict) -> str:
    s = result["summary"]
    step = s["step_time_s"]
    lo, hi = step["ci95"]
    rows = [
        ["step time p50 / p90", f"{ms(step['p50'])} / {ms(step['p90'])} ms"],
        ["p50 95% CI", f"[{ms(lo)}, {ms(hi)}] ms"],
        *coverage_rows(result),
        ["examples/s", f"{s['examples_per_s']:,.0f}"],
        ["achieved", f"{s['tflops']:.3f} TFLOP/s"],
        [
            "MFU",
            pct(s["mfu"])
            + (f" of {result['peak']['basis_text']}" if "basis_text" in result["peak"] else "")
            + (" (DIVERGED run: not a training figure)" if result.get("diverged") else ""),
        ],
        *([["HFU", f"{pct(s['hfu'])} ({hfu_basis(result)})"]] if s.get("hfu") is not None else []),
        *(
            [
                [
                    "MFU, host basis",
                    f"{pct(s['mfu_host'])} of the host's peak at {result['peak']['host']['threads']} thread(s)",
                ]
            ]
            if "mfu_host" in s and result["run"]["nproc"] > 1
            else []
        ),
        ["peak memory", f"{s['peak_memory_bytes'] / 2**20:,.0f} MiB ({s['peak_memory_source']})"],
        *(
            [
                [
                    "activation memory",
                    f"{s['activation_bytes'] / 2**20:,.1f} MiB saved for backward in one step "
                    f"(parameters excepted{', largest rank' if result['run']['nproc'] > 1 else ''})",
                ]
            ]
            if s.get("activation_bytes") is not None
            else []
        ),
        *(
            [
                [
                    "dense state",
                    f"{s['dense_state_bytes'] / 2**20:,.1f} MiB (weights, gradients, optimizer state"
                    f"{'; largest rank' if result['run']['nproc'] > 1 else ''})",
                ]
            ]
            if s.get("dense_state_bytes") is not None
            else []
        ),
        *(
            [
                [
                    "memory, estimate vs run",
                    f"{s['peak_memory_estimate_bytes'] / 2**20:,.0f} MiB estimated, "
                    f"{s['peak_memory_run_bytes'] / 2**20:,.0f} MiB measured "
                    f"({s['peak_memory_run_source']})",
                ]
            ]
            if s.get("peak_memory_run_bytes")
            else []
        ),
        [
            "embedding bytes/step",
            f"{si(s['embedding_bytes_per_step']['read'], 'B')} read, "
            f"{si(s['embedding_bytes_per_step']['written'], 'B')} written",
        ],
        *(
            [["input bytes/step", f"{si(s['input_bytes_per_step'], 'B')} moved to the device ({_inputs(result)})"]]
            if "input_bytes_per_step" in s
            else []
        ),
    ]
    return tabulate(rows, tablefmt="plain")


def _inputs(result: dict) -> str:
    blocks = result["flops"].get("per_block", {})
    return "IDs, features, labels" + (", the ad's content" if {"content_arch", "item_content"} & set(blocks) else "")


def coverage_rows(result: dict) -> list[list[str]]:
    """How much of the step the timed stages account for, worded so that >100% explains itself."""
    cover = pct(result["summary"]["stage_coverage"])
    if "ranks" not in result:
        return [["stages cover", f"{cover} of each step's wall time (the rest is untimed)"]]
    per_rank = ", ".join(
        f"rank {r['rank']} {pct(r['stage_coverage'])}" for r in result["ranks"] if "stage_coverage" in r
    )
    rows = [
        [
            "critical path",
            f"{cover} of the step: the slowest rank's time in each stage, summed; "
            "different ranks are slowest in different stages, so it can exceed 100%",
        ]
    ]
    if per_rank:
        rows.append(["stages cover", f"{per_rank} of each rank's own step wall time"])
    return rows


def largest_loss(summary: dict, peak_tflops: float) -> tuple[str, float]:
    """The stage with the most time above its ideal (its model FLOPs at the peak)."""

    def above_ideal(row):
        return row["time_s"] - row["flops"] / (peak_tflops * 1e12)

    name = max(summary["stages"], key=lambda n: above_ideal(summary["stages"][n]))
    return name, above_ideal(summary["stages"][name])


def loss_line(result: dict) -> str:
    stage, seconds = largest_loss(result["summary"], result["peak"]["tflops_per_device"])
    step = result["summary"]["step_time_s"]["p50"]
    return (
        f"largest remaining loss: {stage}, {ms(seconds)} ms of the {ms(step)} ms step "
        "above what its model FLOPs need at the peak"
    )


def ab_table(result: dict) -> str:
    ab = result["ab"]
    base, opt = ab["baseline"]["summary"], result["summary"]
    rows = []
    for name in opt["stages"]:
        b, o = base["stages"][name]["time_s"], opt["stages"][name]["time_s"]
        rows.append([name, ms(b), ms(o), f"{b / o:.2f}x" if o > 0 else "-"])
    rows.append(
        [
            "step (wall, p50)",
            ms(base["step_time_s"]["p50"]),
            ms(opt["step_time_s"]["p50"]),
            f"{base['step_time_s']['p50'] / opt['step_time_s']['p50']:.2f}x",
        ]
    )
    rows.append(["MFU", pct(base["mfu"]), pct(opt["mfu"]), ""])
    table = tabulate(
        rows, headers=["stage", "baseline ms", "optimized ms", "speed-up"], colalign=("left", "right", "right", "right")
    )
    lo, hi = ab["mfu_ratio_ci95"]
    return (
        f"{table}\n\noptimized/baseline MFU ratio {ab['mfu_ratio']:.2f}x "
        f"(95% CI [{lo:.2f}, {hi:.2f}], {ab['rounds']} interleaved rounds of "
        f"{ab['steps_per_round']} steps each, ABBA order)"
    )


def diverged_banner(result: dict) -> list[str]:
    """A prominent line when the loss turned non-finite (result["diverged"]); else nothing."""
    d = result.get("diverged")
    if not d:
        return []
    where = "".join(f", {k} {d[k]}" for k in ("task", "rank", "stack") if d.get(k) is not None)
    return [
        f"!! DIVERGED: loss {d['loss']} at step {d['step']}{where} (steps counted from the first "
        "warm-up step). The timed steps ran on non-finite numbers: the MFU below is flagged, and "
        "`gembench gate` fails this run. Lower the learning rate or check the data."
    ]


def counters_block(result: dict) -> str:
    """The cost counters of one extra step (harness/metrics/counters.py), one line each."""
    c = result["counters"]
    na = "- (no device kernels on the CPU)"
    rows = [
        ["aten ops dispatched", f"{c['aten_ops']:,}"],
        ["host syncs", f"{c['host_syncs']:,}"],
        ["host-to-device bytes", f"{c['h2d_bytes']:,}"],
        ["kernels launched", na if c["kernels"] is None else f"{c['kernels']:,}"],
        ["graph breaks (whole run)", f"{c['graph_breaks']:,}"],
        ["recompiles (whole run)", f"{c['recompiles']:,}"],
    ]
    return "cost counters (extra steps after the timed ones; lower is better)\n" + tabulate(
        rows, tablefmt="plain", colalign=("left", "right")
    )


def profile_block(result: dict) -> str:
    """The profiled step's top ops (``gembench run --trace DIR``) and where its trace is."""
    p = result["profile"]
    rows = [
        [
            r["name"] if len(r["name"]) <= 70 else r["name"][:67] + "...",
            r["calls"],
            f"{r['self_us'] / 1e3:.2f}",
            pct(r["share"]),
        ]
        for r in p["top"]
    ]
    table = tabulate(
        rows,
        headers=[f"top {len(rows)} {p['ranked']} by self time", "calls", "self ms", "share"],
        colalign=("left", "right", "right", "right"),
        disable_numparse=True,
    )
    return f"{table}\n(one profiled step after the timed ones; trace: {p['trace']}, open in ui.perfetto.dev)"


def blocks_line(result: dict) -> str:
    """Each block's share of the model's forward FLOPs (models/flops.py, the analytic count)."""
    blocks = result["flops"].get("per_block") or {}
    total = sum(blocks.values())
    shares = sorted(blocks.items(), key=lambda kv: -kv[1])
    return "model FLOPs by block: " + ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in shares) if total else ""


def startup_block(result: dict) -> str:
    """What the run paid before its first timed step, by phase, and its timed steps as a job."""
    from gembench.harness.metrics.startup import PHASES

    st = result["startup"]
    total = st["to_first_step_s"]
    rows = [[name, f"{s:.2f}", pct(s / total) if total else "-", PHASES[name]] for name, s in st["phases"].items()]
    untimed = total - sum(st["phases"].values())
    rows.append(["(unnamed)", f"{untimed:.2f}", pct(untimed / total) if total else "-", "between the phases above"])
    since = "the process's start" if st["from"] == "process" else "the run's call (its process was already running)"
    where = ""
    if "ranks_to_first_step_s" in st:
        ready = ", ".join(f"{t:.1f}" if t is not None else "-" for t in st["ranks_to_first_step_s"])
        where = f"; the slowest rank, rank {st['rank']} (ranks ready after {ready} s)"
    s = result["summary"]
    steps = len(result["samples"]["step_s"])
    saved = result.get("checkpoint") or {}
    lines = []
    if saved.get("resumed_from"):
        lines.append(f"resumed at step {saved['resumed_at']} from {saved['resumed_from']}")
    if "every" in saved:
        n = len(saved["saves"])
        lines.append(
            f"checkpoints: {n} save(s) every {saved['every']} steps into {saved['dir']}, "
            f"{si(saved['bytes'], 'B')} written, the loop blocked {saved['blocked_s']:.2f} s in all "
            f"(asynchronous: the state staged, then written beside the steps)"
            + (f"; {saved['error']}" if saved.get("error") else "")
        )
    rest = "the rest start-up" + (" and checkpoints" if saved.get("saves") else "")
    table = tabulate(rows, headers=["phase", "s", "share", "what"], tablefmt="simple", disable_numparse=True)
    return "\n".join(
        [
            *lines,
            f"start-up: {total:.1f} s from {since} to the first timed step{where}",
            table,
            f"a job of these {steps} timed steps: {st['job_s']:.1f} s wall, goodput {pct(st['goodput'])} ({rest}), "
            f"end-to-end MFU {pct(st['end_to_end_mfu'])} (steady state {pct(s['mfu'])})",
        ]
    )


def run_report(result: dict) -> str:
    parts = [header(result), *diverged_banner(result), stage_table(result) + "\n" + blocks_line(result)]
    if "ops" in result:
        parts.append(op_table(result))
    if "counters" in result:
        parts.append(counters_block(result))
    parts += [totals_table(result), loss_line(result)]
    if "startup" in result:
        parts.append(startup_block(result))
    if "ab" in result:
        parts.append(ab_table(result))
    if "profile" in result:
        parts.append(profile_block(result))
    return "\n\n".join(parts)


def hfu_basis(result: dict) -> str:
    """What HFU counts beyond the model FLOPs: the recomputed forward, and what the step executes
    that the model does not ask for (work reaching no loss, padding the formula leaves out)."""
    beyond = (result.get("flops") or {}).get("executed_beyond_model_per_step") or 0.0
    text = "executed FLOPs: the model's plus the checkpointed blocks' recomputed forward"
    if beyond:
        text += f", plus {beyond / 1e6:,.1f} MFLOP a step beyond the model (padding, work reaching no loss)"
    return text
