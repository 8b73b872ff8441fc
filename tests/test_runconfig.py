"""One run config between the CLI and the library: the same fields for one process and N ranks,
checked once, before any work."""

import argparse
from dataclasses import fields
from pathlib import Path

import pytest

from gembench.errors import UsageError
from gembench.harness.commands import run as run_command
from gembench.harness.commands.run import run_config_from
from gembench.harness.train.runconfig import RunConfig


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    run_command.configure(parser)
    return parser.parse_args(list(argv))


def test_every_run_flag_is_a_field_and_the_defaults_agree():
    ns = parsed()
    assert {f.name for f in fields(RunConfig)} == set(vars(ns))  # nothing dropped on the way in
    assert run_config_from(ns) == RunConfig()


@pytest.mark.parametrize(
    "argv, distributed, words",
    [
        (["--steps", "0"], False, "--steps must be at least 1"),
        (["--warmup", "-1"], True, "--warmup must be 0 or more"),
        (["--ab", "--nproc", "2"], True, "--ab compares stacks in one process"),
        (["--pace", "3,4", "--nproc", "2"], True, "--pace takes turns with one process"),
        (["--timeout", "0", "--nproc", "2"], True, "--timeout must be positive"),
        (["--ab", "--rounds", "1"], False, "--ab needs --rounds >= 2"),
        (["--ab", "--stack", "baseline"], False, "would measure the baseline against itself"),
        (["--pace", "3,4", "--burst", "0"], False, "--pace needs a single stack and --burst >= 1"),
        (["--trace", "/proc/nope"], False, "cannot create folder /proc/nope for --trace"),
        (["--trace", "/proc/nope", "--nproc", "2"], True, "cannot create folder /proc/nope for --trace"),
    ],
)
def test_what_needs_no_model_is_refused_in_one_place(argv, distributed, words):
    with pytest.raises(UsageError, match=words.replace("+", r"\+")):
        run_config_from(parsed(*argv)).check(distributed)


def test_a_good_request_passes_and_creates_its_trace_folder(tmp_path):
    run = run_config_from(parsed("--config", "tiny", "--trace", str(tmp_path / "t"))).check(False)
    assert run.options.compile and Path(tmp_path / "t").is_dir()


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--config", "tiny", "--steps", "5", "--warmup", "1", "--seed", "3", "--device", "cpu"],
        ["--stack", "baseline", "--dtype", "bf16", "--set", "compile=off", "--set", "jagged=off", "--batch", "64"],
        ["--nproc", "2", "--sharding", "t0=row_wise,default=table_wise", "--pipeline", "--timeout", "60"],
        ["--ab", "--rounds", "3", "--out", "r.json", "--trace", "tr", "--quiet", "--peak-tflops", "1.5"],
        ["--pace", "3,4", "--burst", "5", "--verbose", "--rebalance", "--nsys", "prof"],
    ],
)
def test_the_one_serializer_gives_back_the_same_request(argv):
    """continuous, ablate --nproc and --nsys build `gembench run` command lines only
    through RunConfig.to_argv: parsing its output must give back the config it came from, with
    the flags that name a run always written."""
    run = run_config_from(parsed(*argv))
    again = run.to_argv()
    assert run_config_from(parsed(*again)) == run
    for flag in ("--config", "--steps", "--warmup", "--stack", "--seed", "--device"):
        assert flag in again
    assert again.count("--set") == len(run.switches)


def test_the_run_config_carries_the_model_to_ranks_and_continuous():
    run = run_config_from(parsed("--model", "m.py:f", "--model-arg", "batch=8", "--nproc", "2"))
    argv = run.to_argv()
    assert run.config is None and "--config" not in argv
    assert argv[:4] == ["--model", "m.py:f", "--model-arg", "batch=8"]
    assert run_config_from(parsed(*argv)) == run


def test_the_stacks_bf16_is_kept_only_where_the_cpu_multiplies_it(monkeypatch):
    from gembench.harness.train import runconfig

    monkeypatch.setattr(runconfig, "cpu_native_bf16", lambda: False)
    options, why = RunConfig("tiny", device="cpu").precision()
    assert not options.bf16 and "AVX-512 BF16 nor AMX" in why and "--dtype bf16" in why
    for asked in (
        RunConfig("tiny", device="cpu", dtype="bf16"),
        RunConfig("tiny", device="cpu", switches=("bf16=on",)),
    ):
        assert asked.precision() == (asked.options, None) and asked.options.bf16  # asked for: kept
    assert RunConfig("tiny", device="cpu", stack="baseline").precision()[1] is None  # fp32 already
    assert RunConfig("tiny", device="cuda").options.bf16  # a GPU's word is taken, from any host
    monkeypatch.setattr(runconfig, "cpu_native_bf16", lambda: True)
    assert RunConfig("tiny", device="cpu").precision() == (RunConfig("tiny").precision()[0], None)
    assert RunConfig("tiny", device="cpu").options.bf16
