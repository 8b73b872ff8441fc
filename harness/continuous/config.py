"""What `gembench continuous` and `gembench bisect` are asked to do: frozen records below the commands.

The commands parse their flags, check them and resolve the defaults that depend on other flags
(harness/commands/continuous.py, bisect.py), once, into these; the library takes nothing else:
run_pairs a Measuring, bisect a BisectConfig, which its predicate reads back from the state file
`git bisect run` hands it (as_json, from_json).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

# The sequential design's cap and budget, from its simulated rates (benchmarks/harness_quality.py
# --sequential; docs/continuous.md): enough for a noisy host's 2% pair spread at a minute a batch.
MAX_PAIRS = 48
DEFAULT_BUDGET = 1200.0  # s
DEFAULT_STEPS = 480
TURN_STEPS = 5  # steps per turn unless --bursts says otherwise: the noise is faster than a turn
FEWEST_HALVED_STEPS = 160  # halving stops above this: fast-half keeps 80 steps of a process
MIN_EFFECT = 0.01  # a 2% slowdown must be caught: the regression threshold sits below it
MARGIN = 0.02  # "unchanged" needs the interval inside +-2%: precise enough for 1%, not for 0.2%


@dataclass(frozen=True)
class Measuring:
    """What each revision runs and how pairs of its processes are measured and judged: the flags
    continuous and bisect share, checked, with their dependent defaults resolved."""

    pairs: int  # the most pairs run (bisect: its first look's)
    parallel: int = 1  # pairs at once, each on a CPU of its own
    sequential: bool = False  # a pair's two processes one after the other instead of taking turns
    bursts: int = 1  # turns each process of a pair takes
    burst_steps: int = DEFAULT_STEPS  # steps a turn (the last one may be shorter)
    benchmark: str = "run"  # run: `gembench run`; instructions: benchmarks/instructions.py
    kernels: tuple[str, ...] = ()  # instructions: the kernels counted (none: all)
    config: str | None = "tiny"
    model: str | None = None
    model_args: tuple[str, ...] = ()
    steps: int = DEFAULT_STEPS
    halve_steps: bool = False  # the default steps: halved once where pairs half as long pay (paired.halving)
    warmup: int = 3
    stack: str = "optimized"
    nproc: int | None = None
    threads: int = 1
    seed: int = 0
    device: str = "auto"
    statistic: str = "fast-half"
    metrics: tuple[str, ...] = ("step_time_s",)  # the timing metrics tested
    alpha: float | None = None  # None: the thresholds file's, else stats.ALPHA
    min_effect: float | None = None  # None: MIN_EFFECT
    margin: float | None = None  # None: max(MARGIN, min_effect)
    thresholds: str = "results/thresholds.toml"
    format: str = "table"
    json_out: Path | None = None
    repo: str = "."
    setup: str | None = None
    keep_results: Path | None = None
    timeout: float = 1800.0
    quiet: bool = False
    pythons: tuple[str, str] | None = None  # BASE's and HEAD's interpreters (continuous --python)
    peaks_probed: str | None = None  # what the parent probed for its children (calibration.PROBED_ENV)

    def as_json(self) -> dict:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_json(cls, values: dict) -> Measuring:
        """The inverse of as_json: lists back to tuples, the paths back to Paths."""
        out = {}
        for f in fields(cls):
            value = values[f.name]
            if isinstance(value, list):
                value = tuple(value)
            elif value is not None and str(f.type).startswith("Path"):
                value = Path(value)
            out[f.name] = value
        return cls(**out)


@dataclass(frozen=True)
class ContinuousConfig:
    base: str
    head: str
    measuring: Measuring  # pairs: the fixed design's, or the sequential design's most
    looking: bool  # the sequential design: judged after each batch, until clear, its most pairs or the budget
    budget: float = DEFAULT_BUDGET  # s
    numerics: str = "fail"  # fail: changed losses make the exit status; report: only said
    loss_tolerance: float | None = None  # None: the dtype's (regression/numerics.py)
    environments: dict | None = None  # --python's: {"BASE": Environment, "HEAD": Environment}


@dataclass(frozen=True)
class BisectConfig:
    good: str
    bad: str
    max_pairs: int  # one comparison's most pairs
    measuring: Measuring  # pairs: a comparison's first look; alpha, min_effect and margin set

    def as_json(self) -> dict:
        return {"good": self.good, "bad": self.bad, "max_pairs": self.max_pairs, "measuring": self.measuring.as_json()}

    @classmethod
    def from_json(cls, values: dict) -> BisectConfig:
        return cls(values["good"], values["bad"], values["max_pairs"], Measuring.from_json(values["measuring"]))


def _plain(value):
    if isinstance(value, Path):
        return str(value)
    return list(value) if isinstance(value, tuple) else value
