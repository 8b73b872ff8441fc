"""What `gembench continuous` measures and decides, below the command: the pairs of processes run
under the sequential design (regression/sequential.py) and judged by the plan the thresholds file
gives; the JSON document of the verdict and the lines printed above and below its table.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from gembench.errors import UsageError
from gembench.harness.continuous.config import MARGIN, MIN_EFFECT, ContinuousConfig, Measuring


@dataclasses.dataclass(frozen=True)
class Plan:
    """How the pairs are judged, from the thresholds for the first result's config and hardware."""

    alpha: float
    min_effect: float
    margin: float
    limits: object  # thresholds.load's, None without a thresholds file

    def judge(self, m: Measuring, rounds: list, alpha: float) -> list:
        from gembench.harness.regression import paired

        return paired.judge_rounds(
            rounds, judged_metrics(m, rounds), alpha, self.min_effect, self.limits, m.statistic, self.margin
        )


def work_changed(rounds: list):
    """How HEAD's model FLOPs per step differ from BASE's (work.WorkChange), or None."""
    from gembench.harness.regression.work import work_change

    return work_change([rounds[0][0]], [rounds[0][1]])


def judged_metrics(m: Measuring, rounds: list) -> list[str]:
    """--metric, with step time for MFU where the work changed (MFU rises with wasted FLOPs)."""
    from gembench.harness.regression.work import WORK_METRICS

    if work_changed(rounds) is None:
        return list(m.metrics)
    return list(dict.fromkeys("step_time_s" if x in WORK_METRICS else x for x in m.metrics))


def plan_of(m: Measuring, first: dict) -> Plan:
    """The thresholds file read for the first result's config and hardware; alpha, effect and margin."""
    from gembench.harness.regression import stats, thresholds
    from gembench.harness.store.results import field

    limits = None
    if Path(m.thresholds).exists():
        limits = thresholds.load(
            m.thresholds, str(field(first, "config.name")), str(field(first, "env.hardware_class"))
        )
    elif m.thresholds != "results/thresholds.toml":
        raise UsageError(f"no thresholds file {m.thresholds}")
    alpha = m.alpha if m.alpha is not None else ((limits and limits.alpha) or stats.ALPHA)
    min_effect = MIN_EFFECT if m.min_effect is None else m.min_effect
    margin = max(MARGIN, min_effect) if m.margin is None else m.margin
    return Plan(alpha, min_effect, margin, limits)


def measured_pairs(cfg: ContinuousConfig, co: dict, say):
    """The pairs, under the sequential design when cfg.looking: (rounds, whether they took turns,
    the design or None, the plan)."""
    from gembench.harness.continuous.pairs import run_pairs
    from gembench.harness.regression.sequential import SequentialDesign, look_of

    m = cfg.measuring
    design, plan = None, None

    def enough(rounds, elapsed, per_batch):  # run_pairs asks after each batch
        nonlocal design, plan
        if design is None:  # the thresholds file is read once, for the first result's config
            plan = plan_of(m, rounds[0][0])
            design = SequentialDesign(plan.alpha, m.pairs, cfg.budget)
        judge = lambda alpha: look_of(plan.judge(m, rounds, alpha))  # noqa: E731
        return design.after_batch(len(rounds), elapsed, per_batch, judge, say)

    rounds, interleaved = run_pairs(m, co, say, enough if cfg.looking else None)
    return rounds, interleaved, design, plan or plan_of(m, rounds[0][0])


def document(cfg, co, rounds, interleaved, design, plan, alpha, judgements, losses, ops, code) -> dict:
    """The JSON result; its notes and minutes, the caller's, are held None in their places."""
    from gembench.harness.continuous import environments
    from gembench.harness.regression import paired
    from gembench.harness.regression.directions import per_step
    from gembench.harness.regression.work import executed_beyond, model_flops
    from gembench.harness.store.results import field

    m = cfg.measuring
    first = rounds[0][0]
    return {
        "schema": "gembench.continuous/1",
        "base": {"revision": cfg.base, "sha": co["BASE"].sha},
        "head": {"revision": cfg.head, "sha": co["HEAD"].sha},
        "config": field(first, "config.name"),
        "hardware_class": field(first, "env.hardware_class"),
        "stack": m.stack,
        "steps": m.steps,
        "steps_per_pair": [len(per_step(base, "step_time_s")) or m.steps for base, _ in rounds],
        "warmup": m.warmup,
        "seed": m.seed,
        "pairs": len(rounds),
        "rounds": len(rounds),
        "design": design.document() if design is not None else {"kind": "fixed", "pairs": m.pairs},
        "order": "ABBA",
        "statistic": m.statistic,
        "interleaved": bool(interleaved),
        "bursts": m.bursts if interleaved else None,
        "parallel": m.parallel if interleaved else 1,
        "threads": m.threads,
        "alpha": alpha,
        "min_effect": plan.min_effect,
        "margin": plan.margin,
        "notes": None,
        "minutes": None,
        "rows": paired.rows(judgements),
        "numerics": losses,
        "op_changes": ops,
        "exit_status": code,
        "model_flops": {"base": model_flops(rounds[0][0]), "head": model_flops(rounds[0][1])},
        "executed_beyond": {"base": executed_beyond(rounds[0][0]), "head": executed_beyond(rounds[0][1])},
        "work_changed": None
        if (w := work_changed(rounds)) is None
        else {"base": w.a, "head": w.b, "change": w.change, "line": w.line("HEAD", "BASE")},
    } | (environments.document(cfg.environments) if cfg.environments else {})


def steps_text(per_pair: list[int]) -> str:
    """ "480 steps", or "480 steps (240 from pair 5)" where the steps were halved."""
    changed = next((k for k, n in enumerate(per_pair) if n != per_pair[0]), None)
    return f"{per_pair[0]} steps" + (f" ({per_pair[changed]} from pair {changed + 1})" if changed else "")


def header_lines(cfg: ContinuousConfig, doc: dict, design, plan: Plan, judgements) -> list[str]:
    """The lines above the verdict table: what ran, how it was judged, the looks taken."""
    from gembench.harness.continuous import environments
    from gembench.harness.regression.work import side_by_side

    m = cfg.measuring
    interleaved, alpha, minutes, pairs = doc["interleaved"], doc["alpha"], doc["minutes"], doc["pairs"]
    hw = doc["hardware_class"]
    header = [
        f"BASE {cfg.base} = {doc['base']['sha'][:10]}   HEAD {cfg.head} = {doc['head']['sha'][:10]}",
        f"{doc['config']} on {hw}, stack {m.stack}, seed {m.seed}: {pairs} process pairs ABBA "
        f"x {steps_text(doc['steps_per_pair'])} "
        f"(+{m.warmup} warm-up) per process, "
        f"{f'taking turns, {m.bursts} turns each' if interleaved else 'one process after the other'}"
        f"{f', {m.parallel} pairs at once on CPUs of their own' if interleaved and m.parallel > 1 else ''}, "
        f"{m.threads} thread(s); one value per process = its {m.statistic} step; {minutes:.1f} min",
        f"paired one-sided t-tests on log(HEAD/BASE) per pair at alpha={alpha:g} (Holm across "
        f"{sum(j.method == 'paired' for j in judgements)}), regression >= {100 * plan.min_effect:g}%, unchanged "
        f"within +-{100 * plan.margin:g}%; counters exact",
    ]
    if design is not None and design.last:
        history = design.looks.history
        header.append(
            f"sequential: {len(history)} look(s) at "
            + ", ".join(str(h["pairs"]) for h in history)
            + f" pairs (at most {m.pairs}, --budget {cfg.budget:g} s), alpha {plan.alpha:g} spent over them "
            f"(Pocock-type, by pairs or the budget's share, whichever is further); the verdict is the last "
            f"look's, at alpha {alpha:.2g}"
        )
    header += [f"note: BASE and HEAD differ in {d}" for d in doc["notes"]]
    flops, executed = doc["model_flops"], doc.get("executed_beyond") or {}
    beyond = (executed.get("base") or {}, executed.get("head") or {})
    if doc.get("work_changed"):
        header.append("work changed: " + doc["work_changed"]["line"])
    elif (same := side_by_side(flops["base"], flops["head"], "BASE", "HEAD", beyond)) is not None:
        header.append(same)
    if m.benchmark == "instructions":
        header[1] = (
            f"kernel instruction counts (benchmarks/instructions.py, callgrind) on {hw}: "
            f"{m.pairs} pair(s), {minutes:.1f} min"
        )
    if cfg.environments:
        header[1:1] = environments.header_lines(cfg.environments)
    return header


def verdict_line(cfg: ContinuousConfig, code: int) -> str:
    from gembench.harness.regression.numerics import NUMERICS_EXIT

    return {
        0: "continuous: pass",
        1: "continuous: REGRESSION",
        NUMERICS_EXIT: "continuous: NUMERICS CHANGED",
        4: "continuous: INCONCLUSIVE (too noisy: a larger --budget or --max-pairs, or a quieter machine)"
        if cfg.looking
        else "continuous: INCONCLUSIVE (too noisy: more --pairs)",
    }[code]
