"""What the report is drawn from: result files read leniently, grouped, ordered by git, gated.

A group is one config on one hardware class with one value of each of the gate's RUN_KEYS (stack,
dtype, ranks, global batch): exactly the runs one committed baseline applies to. Verdicts come
from regression/gate.py (thresholds, then the baseline comparison), per commit of the group.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gembench.errors import UsageError
from gembench.harness.store.results import (
    BASELINE_SCHEMA,
    BASELINES_DIR,
    RUN_KEYS,
    RUNS_DIR,
    expand_paths,
)
from gembench.harness.store.results import (
    field as get,
)

SOURCE_DIR = Path(__file__).resolve().parents[2]  # the gembench checkout whose commits results name
# what the page cannot be drawn without; a run lacking one is skipped with a warning naming it
REQUIRED = (
    "config.name",
    "env.hardware_class",
    "run.stack",
    "summary.stages",
    "summary.step_time_s.p50",
    "summary.mfu",
    "peak.tflops_per_device",
    "metrics",
)
PROJECTION_SCHEMA = "gembench.projection/1"
DEFAULT_INPUTS = (str(RUNS_DIR / "*.json"), str(BASELINES_DIR / "**" / "*.json"))


@dataclass
class Loaded:
    runs: list[dict]  # every run, each once (by id)
    baselines: dict[tuple, tuple[str, list[dict]]]  # (hardware_class, config) -> (path, runs)
    skipped: list[tuple[str, str]]  # (path, why)
    files: int  # files read successfully
    projections: list[dict] = field(default_factory=list)  # gembench.projection documents


def load(inputs: list[str], warn=lambda msg: print(msg, file=sys.stderr)) -> Loaded:
    """Read every file; a corrupt or foreign one is named in a warning and skipped."""
    import json

    from gembench.harness.store.results import load_runs
    from gembench.harness.store.schema import read_json, validate

    loaded = Loaded([], {}, [], 0)
    ids: set[str] = set()
    for path in expand_paths(inputs):
        try:
            doc = read_json(path)
            if isinstance(doc, dict) and doc.get("schema") == PROJECTION_SCHEMA:
                loaded.projections.append(validate(doc, path))
                loaded.files += 1
                continue
            runs = load_runs(path)
            for r in runs:
                for key in REQUIRED:
                    if get(r, key) is None:
                        raise UsageError(f"{path}: run {r.get('id')!r} lacks {key}")
        except UsageError as err:
            why = str(err).removeprefix(f"{path}: ").removeprefix(f"{path} ")
            loaded.skipped.append((str(path), why))
            warn(f"gembench report: warning: skipped {path}: {why}")
            continue
        loaded.files += 1
        is_bundle = json.loads(path.read_text()).get("schema") == BASELINE_SCHEMA
        if is_bundle and path.parent.name != "archive":  # archived baselines are history, not the line
            first = runs[0]
            loaded.baselines[(get(first, "env.hardware_class"), get(first, "config.name"))] = (str(path), runs)
        for r in runs:
            if r.get("id") not in ids:
                ids.add(r.get("id"))
                loaded.runs.append(r)
    return loaded


def commit_order(repo: Path = SOURCE_DIR) -> list[str]:
    """Every commit reachable from any ref, oldest first (topological); [] outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-list", "--all", "--topo-order", "--reverse"],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return out.split()


def head(repo: Path = SOURCE_DIR) -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def order_commits(runs: list[dict], known: list[str]) -> list[str]:
    """The commits of ``runs`` in git order; commits git does not know go last, by creation time."""
    position = {c: i for i, c in enumerate(known)}
    first_seen: dict[str, str] = {}
    for r in runs:
        c = get(r, "env.git_commit") or "unknown"
        first_seen[c] = min(first_seen.get(c, r.get("created", "")), r.get("created", ""))
    return sorted(first_seen, key=lambda c: (c not in position, position.get(c, 0), first_seen[c]))


def short(commit: str) -> str:
    return commit[:8] if len(commit) >= 40 else commit


@dataclass
class Group:
    config: str
    hardware_class: str
    run_keys: tuple  # values of RUN_KEYS
    runs: list[dict] = field(default_factory=list)  # oldest first
    commits: list[str] = field(default_factory=list)  # git order
    baseline_path: str | None = None
    baseline: list[dict] = field(default_factory=list)
    limits: object = None  # thresholds.Limits
    checks: dict[str, list] = field(default_factory=dict)  # commit -> [gate.Check]

    @property
    def title(self) -> str:
        stack, dtype, nproc, batch = self.run_keys
        ranks = f"{nproc} ranks" if nproc and nproc > 1 else "1 process"
        return f"{self.config} · {stack} · {dtype} · {ranks} · batch {batch} · {self.hardware_class}"

    @property
    def anchor(self) -> str:
        return "g-" + "".join(c if c.isalnum() else "-" for c in self.title.replace(" · ", "_"))

    @property
    def latest(self) -> dict:
        return self.runs[-1]

    def runs_of(self, commit: str) -> list[dict]:
        return [r for r in self.runs if (get(r, "env.git_commit") or "unknown") == commit]


def group(loaded: Loaded, known_commits: list[str]) -> list[Group]:
    groups: dict[tuple, Group] = {}
    for r in sorted(loaded.runs, key=lambda r: r.get("created", "")):
        key = (get(r, "config.name"), get(r, "env.hardware_class"), tuple(get(r, k) for k in RUN_KEYS))
        g = groups.setdefault(key, Group(key[0], key[1], key[2]))
        g.runs.append(r)
    for (config, hw, run_keys), g in groups.items():
        g.commits = order_commits(g.runs, known_commits)
        path, runs = loaded.baselines.get((hw, config), (None, []))
        if runs and tuple(get(runs[0], k) for k in RUN_KEYS) == run_keys:
            g.baseline_path, g.baseline = path, runs
    # single-process groups before distributed ones, then by stack and hardware
    return sorted(
        groups.values(),
        key=lambda g: (
            g.config,
            g.run_keys[2] or 1,
            g.run_keys[0] == "ab",
            str(g.run_keys[0]),
            g.hardware_class,
            str(g.run_keys),
        ),
    )


def gate_group(g: Group, thresholds_path: str | None) -> None:
    """The gate's own checks for every commit of the group: thresholds, then the baseline."""
    from gembench.harness.regression import gate, stats, thresholds

    g.limits = (
        thresholds.load(thresholds_path, g.config, g.hardware_class)
        if thresholds_path
        else thresholds.Limits(sources={})
    )
    alpha = g.limits.alpha or stats.ALPHA
    min_effect = g.limits.min_effect if g.limits.min_effect is not None else stats.MIN_EFFECT
    baseline_ids = {r.get("id") for r in g.baseline}
    for commit in g.commits:
        runs = g.runs_of(commit)
        checks = gate.threshold_checks(runs, g.limits, g.baseline or None)
        if g.baseline and not {r.get("id") for r in runs} <= baseline_ids:
            checks += gate.baseline_checks(runs, g.baseline, g.baseline_path, alpha, min_effect)
        g.checks[commit] = checks


def failed_metrics(checks: list) -> dict[str, str]:
    """metric -> the failing check's line, for marking points in the history figures."""
    from gembench.harness.regression import gate

    out = {}
    for c in checks:
        if c.status != gate.FAIL:
            continue
        metric = (
            gate.THRESHOLD_METRICS[c.name][0]
            if c.name in gate.THRESHOLD_METRICS
            else c.name.removeprefix("vs baseline ")
        )
        out[metric] = c.line()
    return out


def overall(checks: list) -> str:
    """The worst status of a commit's checks, in the gate's precedence (PASS when none failed)."""
    from gembench.harness.regression import gate

    statuses = {c.status for c in checks}
    for status in gate.PRECEDENCE:
        if status in statuses:
            return status
    return gate.PASS if checks else "no checks"
