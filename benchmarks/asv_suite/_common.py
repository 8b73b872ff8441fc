"""Shared by the asv modules: which configs to run and one harness run per config per commit.

The configs come from GEMBENCH_ASV_CONFIGS (comma-separated, default "tiny": seconds on two CPU
cores; "tiny,small" for a nightly job; "medium" on a GPU). Steps from GEMBENCH_ASV_STEPS, stack
switches over the optimized stack from GEMBENCH_ASV_SET ("dense_parallel=fsdp,compile=off").
Imbalance and communication exist only between ranks: those classes run `gembench run --nproc
GEMBENCH_ASV_NPROC` (default 2) as torchrun ranks. Only the metrics dict of each result is kept:
asv pickles what setup_cache returns. GEMBENCH_ASV_MODEL=pkg.mod:factory (or file.py:factory, with
GEMBENCH_ASV_MODEL_ARGS="key=value,...") tracks that model (docs/workload.md) in place of the configs.
"""

import json
import os
import subprocess
import sys
import tempfile

MODEL = os.environ.get("GEMBENCH_ASV_MODEL") or None  # a workload in place of the configs
MODEL_ARGS = tuple(a for a in os.environ.get("GEMBENCH_ASV_MODEL_ARGS", "").split(",") if a)
CONFIGS = [MODEL] if MODEL else [c for c in os.environ.get("GEMBENCH_ASV_CONFIGS", "tiny").split(",") if c]
STEPS = int(os.environ.get("GEMBENCH_ASV_STEPS", "20"))
NPROC = int(os.environ.get("GEMBENCH_ASV_NPROC", "2"))
# stack switches over the optimized stack, as `gembench run --set` takes them (comma-separated;
# default none). The repository's own test of the suite turns compile off to save its minute.
SWITCHES = [s for s in os.environ.get("GEMBENCH_ASV_SET", "").split(",") if s]


def run_configs(nproc: int = 1) -> dict:
    """{config: metrics dict, or None where this commit cannot run it}."""
    if nproc > 1:
        return {c: run_ranks(c, nproc) for c in CONFIGS}
    try:  # the library takes a RunConfig whole
        from gembench.harness.train.runconfig import RunConfig
        from gembench.harness.train.runner import run_benchmark
    except ImportError:
        return run_configs_keywords()
    if MODEL:
        run = RunConfig(None, model=MODEL, model_args=MODEL_ARGS, steps=STEPS, warmup=3, switches=tuple(SWITCHES))
        return {MODEL: dict(run_benchmark(run)["metrics"])}
    runs = {c: RunConfig(c, steps=STEPS, warmup=3, switches=tuple(SWITCHES), quiet=True) for c in CONFIGS}
    return {c: dict(run_benchmark(run)["metrics"]) for c, run in runs.items()}


def run_configs_keywords() -> dict:
    """Commits from before the folders were the layers: run_benchmark took keyword arguments."""
    try:
        from gembench.harness.runner import run_benchmark
    except ImportError:  # a commit from before the harness API: nothing to track there
        return {c: None for c in CONFIGS}
    kwargs = {}
    if SWITCHES:  # only then: older commits' run_benchmark may not know stack switches
        from gembench.harness.stack import STACKS, with_switches

        kwargs["options"] = with_switches(STACKS["optimized"], SWITCHES)
    return {c: dict(run_benchmark(c, steps=STEPS, warmup=3, **kwargs)["metrics"]) for c in CONFIGS}


def run_ranks(config: str, nproc: int) -> dict | None:
    """One distributed run through the CLI (ranks are processes); None where it cannot run."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        cmd = [
            sys.executable,
            "-m",
            "gembench",
            "run",
            *(
                ["--model", MODEL, *[a for m in MODEL_ARGS for a in ("--model-arg", m)]]
                if MODEL
                else ["--config", config]
            ),
            "--nproc",
            str(nproc),
            "--steps",
            str(STEPS),
            "--out",
            out,
            "--quiet",
            *[a for s in SWITCHES for a in ("--set", s)],
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not os.path.exists(out):
            print(proc.stderr[-2000:], file=sys.stderr)  # asv --show-stderr shows why
            return None
        with open(out) as fh:
            return json.load(fh)["metrics"]


def metric(results: dict, config: str, name: str) -> float:
    return float(results[config][name])


class TrackedRun:
    """Base of the asv classes: tracks read one harness run per config made in setup_cache.

    ``requires`` names the metric a subclass tracks; where the run did not measure it (say,
    imbalance on one process) asv reports the benchmark as skipped, not as a failure.
    """

    params = CONFIGS
    param_names = ["config"]
    timeout = 900
    requires = "step_time_s"

    def setup(self, results, config):
        if (results.get(config) or {}).get(self.requires) is None:
            raise NotImplementedError(f"config {config} has no {self.requires} at this commit")


# asv keys setup_cache by where the function is written: every class built on OneProcess shares
# one single-process run per commit, every class built on Ranks one distributed run.


class OneProcess(TrackedRun):
    def setup_cache(self):
        return run_configs(1)


class Ranks(TrackedRun):
    def setup_cache(self):
        return run_configs(NPROC)
