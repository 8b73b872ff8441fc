"""Tables a person can read, made from result documents (never from live objects)."""

from __future__ import annotations

from tabulate import tabulate

from gembench.harness.report.numbers import ms, pct, si


def header(result: dict) -> str:
    run, env, peak = result["run"], result["env"], result["peak"]
    commit = env["git_commit"][:10] + ("+dirty" if env.get("git_dirty") else "")
    return (
        f"gembench run {result['config']['name']} ({result['config']['kind']}): "
        f"stack {run['stack']}, {run['dtype']}, {run['device']} = {env['device_name']}\n"
        f"batch {run['global_batch']} global / {run['per_rank_batch']} per rank x {run['nproc']} rank(s); "
        f"{run['steps']} timed steps after {run['warmup']} warm-up; seed {run['seed']}; commit {commit}\n"
        f"peak {peak['tflops_per_device']:.4g} TFLOP/s per device ({peak['source']})" + basis_line(result)
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
        *(
            [["HFU", f"{pct(s['hfu'])} (executed FLOPs: the model's plus the checkpointed blocks' recomputed forward)"]]
            if s.get("hfu") is not None
            else []
        ),
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


def run_report(result: dict) -> str:
    parts = [header(result), *diverged_banner(result), stage_table(result) + "\n" + blocks_line(result)]
    if "counters" in result:
        parts.append(counters_block(result))
    parts += [totals_table(result), loss_line(result)]
    if "ab" in result:
        parts.append(ab_table(result))
    if "profile" in result:
        parts.append(profile_block(result))
    return "\n\n".join(parts)


# -- distributed runs (run.nproc > 1): per-rank stages, imbalance, communication -------------


def rank_stage_table(result: dict) -> str:
    """Mean ms per stage and rank; the last column is the critical path (slowest rank)."""
    ranks = result["ranks"]
    crit = result["imbalance"]["critical_path_s"]
    rows = [[s] + [ms(r["stage_means_s"][s]) for r in ranks] + [ms(crit[s])] for s in crit]
    rows.append(["sum"] + [ms(sum(r["stage_means_s"].values())) for r in ranks] + [ms(sum(crit.values()))])
    rows.append(
        ["step (wall, p50)"] + [ms(r["step_time_p50_s"]) for r in ranks] + [ms(result["summary"]["step_time_s"]["p50"])]
    )
    headers = ["stage (mean ms)"] + [f"rank {r['rank']}" for r in ranks] + ["critical path"]
    return tabulate(rows, headers=headers, colalign=("left",) + ("right",) * (len(ranks) + 1))


LOAD_LABELS = {
    "ids": "IDs looked up",
    "unique_ids": "unique IDs",
    "bytes_read": "bytes read",
    "lookup_s": "lookup time",
    "perf_ms": "planner perf (ms)",
    "storage_bytes": "planner storage",
}


def imbalance_table(result: dict) -> str:
    imb = result["imbalance"]
    rows = []
    for side in ("measured", "planned"):
        for load, values in imb[side]["loads"].items():
            m = imb[side]["metrics"][load]
            fmt = (lambda v: ms(v)) if load == "lookup_s" else (lambda v: si(v))
            primary = " *" if side == "measured" and load == imb["primary"] else ""
            rows.append(
                [
                    side,
                    LOAD_LABELS.get(load, load) + primary,
                    " / ".join(fmt(v) for v in values),
                    f"{m['max_mean']:.3f}",
                    f"{m['min_max']:.3f}",
                    f"{m['total_variation']:.3f}",
                    f"{m['total_distance']:.3f}",
                    f"{m['chi']:.3f}",
                    f"{m['kl']:.3f}",
                ]
            )
    table = tabulate(
        rows,
        headers=["", "load per rank", "rank 0 / 1 / ...", "max/mean", "min/max", "tot.var", "tot.dist", "chi", "KL"],
        colalign=("left", "left", "right") + ("right",) * 6,
    )
    return (
        f"{table}\n* primary. stall cost {pct(imb['stall_cost'])} of the step; "
        f"{pct(imb['hot_1pct_share'])} of lookups hit the hottest 1% of rows"
    )


def comm_table(result: dict) -> str:
    c = result["comm"]
    rows = [
        [
            kind,
            f"{k['calls']:.0f}",
            si(k["bytes"], "B"),
            ms(k["time_s"]),
            ms(k["time_max_s"]),
            si(k["algbw_Bps"], "B/s"),
            si(k["busbw_Bps"], "B/s"),
            pct(k["step_share"]),
        ]
        for kind, k in c["by_kind"].items()
    ]
    table = tabulate(
        rows,
        headers=[
            "collective (per step, mean of ranks)",
            "calls",
            "bytes",
            "ms",
            "ms max rank",
            "algbw",
            "busbw",
            "of step",
        ],
        colalign=("left",) + ("right",) * 7,
    )
    exp = tabulate(
        [
            [
                f"rank {e['rank']}",
                ms(e["comm_s"]),
                ms(e["overlapped_s"]),
                ms(e["exposed_s"]),
                pct(e["overlap_fraction"]),
                pct(e["exposed_fraction"]),
            ]
            for e in c["exposure"]
        ],
        headers=["", "comm ms", "overlapped", "exposed", "overlap %", "exposed of step"],
        colalign=("left",) + ("right",) * 5,
    )
    return (
        f"{table}\n\n{exp}\n(from {c['profiled_steps']} profiled steps per rank; exposed "
        f"communication {pct(c['exposed_comm_fraction'])} of the step, mean of ranks)"
    )


def placement(p: dict) -> str:
    """A planned table's placement as "sharding_type@ranks", e.g. row_wise@0,1."""
    return f"{p['sharding']}@{','.join(map(str, p['ranks']))}"


def _plan_kinds(plan: dict) -> str:
    kinds: dict[str, int] = {}
    for p in plan.values():
        kinds[p["sharding"]] = kinds.get(p["sharding"], 0) + 1
    return ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))


def rebalance_table(result: dict) -> str:
    """--rebalance: the first plan's run beside the re-planned one, the plan change, the goal."""
    rb = result["rebalance"]
    sides = [rb["before"], rb["after"], rb["again"]]

    def row(label, cell):
        return [label, *(cell(side) for side in sides)]

    def per_rank(load, fmt):
        return lambda side: " / ".join(fmt(v) for v in side["loads"][load])

    rows = []
    for load in rb["before"]["loads"]:
        fmt = ms if load == "lookup_s" else si
        label = LOAD_LABELS.get(load, load)
        rows.append(row(label + " per rank", per_rank(load, fmt)))
        rows.append(
            row(
                label + " max/mean" + (" *" if load == rb["primary"] else ""),
                lambda side: f"{side['metrics'][load]['max_mean']:.3f}",
            )
        )
    rows += [
        row("step p50 per rank (ms)", lambda side: " / ".join(ms(v) for v in side["rank_step_p50_s"])),
        row("step p50 (ms)", lambda side: ms(side["step_time_s"]["p50"])),
        row("stall cost", lambda side: pct(side["stall_cost"])),
        row("exposed comm", lambda side: pct(side["exposed_comm_fraction"])),
        row("MFU", lambda side: pct(side["mfu"])),
        row("plan", lambda side: _plan_kinds(side["plan"])),
    ]
    table = tabulate(
        rows,
        headers=["", "planner's plan", "rebalanced", "planner's plan again"],
        colalign=("left", "right", "right", "right"),
    )
    moved = rb["moved"]
    shown = ", ".join(f"{m['table'].removeprefix('table_')} {m['before']} -> {m['after']}" for m in moved[:12])
    more = f" and {len(moved) - 12} more" if len(moved) > 12 else ""
    change, goal, carried = rb["step_change"], rb["goal"], rb["carried"]
    lo, hi = change["ci95"]
    worse = "met" if goal["step_not_worse"] else "NOT met (slower, 95% CI above 1)"
    lines = [
        table + "\n* primary",
        f"moved {len(moved)} table(s)" + (f": {shown}{more}" if moved else " (the re-plan kept the plan)"),
        f"step rebalanced / planner's plan: {change['ratio']:.3f}, 95% CI [{lo:.3f}, {hi:.3f}] ({change['test']}: "
        f"the runs went A, B, A' in the same processes)"
        + ("" if rb["again_same_plan"] else "; NOTE: the planner's plan came out different the second time"),
        f"goal: measured max/mean <= {goal['max_mean_at_most']:.2f} after: {goal['max_mean']:.3f} "
        f"{'met' if goal['met_imbalance'] else 'NOT met'}; step not worse: {worse}",
        f"re-planned from: measured pooling and per-row load of every table, lookup "
        f"{rb['lookup_s_per_byte'] * 1e9:.2f} ns per byte read; carried {carried['tensors']} tensors and "
        f"{carried['optimizer_states']} optimizer states"
        + (
            f", {len(carried['reset'])} optimizer state(s) reset (their layout changed shape)"
            if carried["reset"]
            else ""
        ),
    ]
    return "\n".join(lines)


def distributed_report(result: dict) -> str:
    run = result["run"]
    plan = ", ".join(f"{t.removeprefix('table_')}:{placement(p)}" for t, p in result["plan"].items())
    ranks = result["ranks"]
    per_rank = ", ".join(f"rank {r['rank']} {r['tflops']:.3f} TFLOP/s ({pct(r['mfu'])} of its peak)" for r in ranks)
    engine = (
        "TorchRec TrainPipelineSparseDist (input dist and DDP gradient sync overlapped)"
        if run["options"].get("pipeline")
        else "staged (nothing overlapped)"
    )
    return "\n\n".join(
        [
            header(result),
            *diverged_banner(result),
            f"{run['nproc']} ranks on {run['nnodes']} host(s), {run['backend']}; step: {engine}\n"
            f"batch: global {run['global_batch']} = {run['nproc']} ranks x {run['per_rank_batch']} per rank\n"
            f"sharding ({run['sharding']}): {plan}",
            "critical path: the slowest rank in each stage\n" + stage_table(result) + "\n" + blocks_line(result),
            rank_stage_table(result),
            "embedding imbalance: measured on the real batches vs the planner's estimates\n" + imbalance_table(result),
            "communication\n" + comm_table(result),
            *(
                [
                    "rebalance: the planner's plan, then TorchRec's planner again on the load measured on it, then the "
                    "planner's plan once more\n" + rebalance_table(result)
                ]
                if "rebalance" in result
                else []
            ),
            totals_table(result) + f"\nper rank: {per_rank}",
        ]
    )
