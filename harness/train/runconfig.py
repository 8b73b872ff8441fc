"""What one `gembench run` is asked to do: one validated dataclass between the CLI and the library.

The same fields for one process and for N ranks (the ranks re-parse the same command line under
torchrun and get the same RunConfig). Every check that needs no model is here, done once before
any work: step counts, the flags that do not combine, and every path the run will write.
Checks that need the model (the batch split over ranks, sharding types, memory) stay with what
builds it (runner.prepare, distributed/launch.check).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path

import torch

from gembench.errors import UsageError
from gembench.harness.device.hardware import cpu_native_bf16
from gembench.harness.store.results import writable_folder
from gembench.harness.train.stack import StackOptions, check_one_process, stack_options


def check_counts(steps: int, warmup: int) -> None:
    """--steps and --warmup, for every runner (library callers too)."""
    if steps < 1:
        raise UsageError(f"--steps must be at least 1, got {steps}")
    if warmup < 0:
        raise UsageError(f"--warmup must be 0 or more, got {warmup}")


# The flags that name a run: always written by to_argv, so that another revision's defaults
# (`gembench continuous` runs other commits' `gembench run`) cannot change what is measured.
IDENTITY = ("config", "model", "model_args", "steps", "warmup", "stack", "seed", "device")
FLAG_OF = {"switches": "--set", "model_args": "--model-arg"}  # fields whose flag is not --<field-name>
DEFAULT_CONFIG = "small"
NO_NATIVE_BF16 = (
    "fp32: this CPU has neither AVX-512 BF16 nor AMX, so torch would emulate bf16 GEMMs at about "
    "1% of fp32's speed; --dtype bf16 runs them anyway"
)


@dataclass(frozen=True)
class RunConfig:
    config: str | None = DEFAULT_CONFIG  # a config name or a .toml path (library callers: a ModelConfig too)
    # or a workload (workload.py, gembench.workload): pkg.mod:factory or path/file.py:factory, with KEY=VALUE args
    model: str | None = None
    model_args: tuple[str, ...] = ()
    steps: int = 10
    warmup: int = 3
    batch: int | None = None  # global batch override
    stack: str = "optimized"
    dtype: str | None = None  # overrides the stack's precision
    switches: tuple[str, ...] = ()  # "name=value" stack switches over the stack (--set)
    device: str = "auto"
    seed: int = 0
    peak_tflops: float | None = None
    bandwidth_gbs: float | None = None  # the op table's memory roofline (default: datasheet / triad)
    out: Path | None = None
    trace: Path | None = None
    nsys: Path | None = None  # rerun under Nsight Systems into this report (harness/train/nvtx.py)
    quiet: bool = False
    verbose: bool = False
    # several ranks
    nproc: int | None = None
    sharding: str | None = None
    pipeline: bool = False
    rebalance: bool = False  # re-plan from the measured load and run again (distributed/rebalance.py)
    timeout: float = 300.0
    # two stacks interleaved in one process
    ab: bool = False
    rounds: int = 6
    # taking turns with another process (gembench continuous)
    pace: str | None = None
    burst: int = 20
    # checkpoints (train/checkpoint.py): saved every N steps into a folder; a run resumed from one
    checkpoint_every: int | None = None
    checkpoint_dir: Path | None = None
    resume: Path | None = None

    def to_argv(self) -> list[str]:
        """This request as `gembench run` flags: the one serializer, for `gembench continuous`,
        `gembench ablate --nproc` and `--nsys`. IDENTITY always, the other fields
        where they differ from their defaults; parsing to_argv() gives this request back
        (commands/run.py's run_config)."""
        if self.model is None and not isinstance(self.config, str | Path):
            raise TypeError("to_argv needs a config name or path, not a ModelConfig object")
        argv = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "config" and self.model is not None:
                continue  # a workload's run has no config
            if (f.name not in IDENTITY and value == f.default) or value is None or value is False:
                continue
            flag = FLAG_OF.get(f.name, "--" + f.name.replace("_", "-"))
            if value is True:
                argv.append(flag)
            elif isinstance(value, tuple):
                argv += [a for v in value for a in (flag, str(v))]
            else:
                argv += [flag, str(value)]
        return argv

    @property
    def options(self) -> StackOptions:
        return self.precision()[0]

    def precision(self) -> tuple[StackOptions, str | None]:
        """The stack as it runs on this run's device, and why its precision is not the named
        stack's where it is not: a stack's bf16 is kept only where the device multiplies bf16 in
        hardware, unless --dtype or --set bf16 asked for it."""
        options = stack_options(self.stack, self.dtype, self.switches)
        asked = self.dtype is not None or any(s.partition("=")[0].strip() == "bf16" for s in self.switches)
        # a CUDA device is taken at its word: a job for GPU nodes may be submitted from a CPU host
        cuda = self.device.startswith("cuda") or (self.device == "auto" and torch.cuda.is_available())
        if not options.bf16 or asked or cuda or cpu_native_bf16():
            return options, None
        return replace(options, bf16=False), NO_NATIVE_BF16

    def check(self, distributed: bool) -> "RunConfig":
        """Every check that needs no model; ``distributed``: N ranks (--nproc, or under torchrun)."""
        check_counts(self.steps, self.warmup)
        if self.model is not None and self.config not in (None, DEFAULT_CONFIG):
            raise UsageError("--config and --model name the model twice: give one of them")
        if self.model_args and self.model is None:
            raise UsageError("--model-arg is an argument of --model's factory: add --model pkg.mod:factory")
        options = self.options  # an unknown stack, dtype or switch is named here
        if not distributed:
            check_one_process(options)
        if distributed:
            if self.ab:
                raise UsageError("--ab compares stacks in one process; it does not combine with --nproc")
            if self.pace is not None:
                raise UsageError("--pace takes turns with one process; it cannot drive --nproc ranks")
            if self.nproc is not None and self.nproc < 1:
                raise UsageError(f"--nproc must be at least 1, got {self.nproc}")
            if self.rebalance and self.nproc is not None and self.nproc < 2:
                raise UsageError(
                    f"--rebalance moves tables between ranks: it needs --nproc 2 or more, got {self.nproc}"
                )
            if self.timeout <= 0:
                raise UsageError(f"--timeout must be positive seconds, got {self.timeout}")
        if self.rebalance and not distributed:
            raise UsageError("--rebalance re-plans a sharded job on several ranks: add --nproc 2 (or more)")
        if self.ab and self.stack == "baseline":
            raise UsageError(
                "--ab measures the baseline stack against the one --stack, --dtype and --set describe: "
                "with --stack baseline it would measure the baseline against itself; drop --stack baseline"
            )
        if self.ab and (self.rounds < 2 or self.steps < self.rounds):
            raise UsageError(
                f"--ab needs --rounds >= 2 and --steps >= --rounds, got --rounds {self.rounds} --steps {self.steps}"
            )
        if self.pace is not None and (self.ab or self.burst < 1):
            raise UsageError(
                f"--pace needs a single stack and --burst >= 1, got --burst {self.burst}"
                f"{' with --ab' if self.ab else ''}"
            )
        if self.trace is not None:
            writable_folder(Path(self.trace), "--trace")
        self.check_checkpoints(distributed)
        return self

    def check_checkpoints(self, distributed: bool) -> None:
        if (self.checkpoint_every is None) != (self.checkpoint_dir is None):
            raise UsageError("--checkpoint-every N and --checkpoint-dir DIR go together: give both")
        if self.checkpoint_every is not None and self.checkpoint_every < 1:
            raise UsageError(f"--checkpoint-every must be at least 1 step, got {self.checkpoint_every}")
        if self.checkpoint_every is not None or self.resume is not None:
            if self.ab:
                raise UsageError("--checkpoint-every and --resume take one stack: drop --ab")
            for flag, on in (("--pipeline", self.pipeline), ("--rebalance", self.rebalance)):
                if on:  # the pipeline holds batches in flight across a save; --rebalance runs three plans
                    raise UsageError(f"--checkpoint-every and --resume take the staged step: drop {flag}")
        if self.checkpoint_dir is not None:
            writable_folder(Path(self.checkpoint_dir), "--checkpoint-dir", create=False)
