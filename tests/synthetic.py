"""Synthetic gembench.result/1 documents and the CLI runners (in process, and as a subprocess) for the tests.

Results are built here rather than by `gembench run` so that compare/gate/stats tests take
milliseconds and control the noise exactly.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

from gembench.harness.store.results import SCHEMA, write_result

# bf16 autocast rounds activations to 8 mantissa bits (relative error ~4e-3 per op); after a few
# optimizer steps the mean BCE of two stacks must still agree to 2% (measured on tiny: < 0.2%);
# every bf16 stack comparison uses it (tests/test_stacks.py, tests/test_parallelize.py)
BF16_LOSS_RTOL = 0.02

# the four cells the rank memory estimate is held on, ddp/fsdp x none/hstu, in fp32 without compile
# (tests/test_parallelize.py on tiny, tests/test_rank_memory.py on small)
MEMORY_VARIANTS = {
    "ddp": (),
    "ddp+hstu": ("activation_checkpointing=hstu",),
    "fsdp": ("dense_parallel=fsdp",),
    "fsdp+hstu": ("dense_parallel=fsdp", "activation_checkpointing=hstu"),
}


def zoo_state(cfg, options, device=None, seed: int = 0):
    """A config's training state as one process builds it: the zoo's workload as the stack runs it
    (for_stack), the stack applied (harness/train/stack.build_train_state)."""
    import torch

    from gembench.harness.train.stack import build_train_state
    from gembench.models.zoo import ZooWorkload

    return build_train_state(ZooWorkload(cfg).for_stack(options), options, device or torch.device("cpu"), seed=seed)


def make_result(
    rid: str = "r1",
    step_s: float = 0.100,
    noise: float = 0.005,
    steps: int = 60,
    seed: int = 0,
    hardware_class: str = "cpu-test-2t",
    config: str = "tiny",
    config_hash: str = "cafe",
    torch: str = "2.13.0",
    flops_per_step: float = 1e9,
    peak_tflops: float = 0.1,
    metrics: dict | None = None,
    counters: dict | None = None,
    **env,
) -> dict:
    """A result whose step times are N(step_s, (noise*step_s)^2) and whose metrics follow from them."""
    rng = random.Random(seed)
    samples = [max(1e-6, rng.gauss(step_s, noise * step_s)) for _ in range(steps)]
    mfu = [flops_per_step / s / (peak_tflops * 1e12) for s in samples]
    mean_s = sum(samples) / steps
    headline = {
        "mfu": sum(mfu) / steps,
        "step_time_s": mean_s,
        "examples_per_s": 64 / mean_s,
        "peak_memory_bytes": 123_456_789,
    }
    headline.update(metrics or {})
    if counters is not None:  # the shared contract: result["counters"], copied into the flat metrics
        headline.update({k: v for k, v in counters.items() if k != "source" and v is not None})
    result = {
        "schema": SCHEMA,
        "id": rid,
        "created": "2026-01-01T00:00:00+00:00",
        "config": {"name": config, "hash": config_hash, "path": None, "kind": "gem"},
        "run": {
            "steps": steps,
            "warmup": 2,
            "dtype": "fp32",
            "device": "cpu",
            "seed": 0,
            "stack": "naive",
            "nproc": 1,
            "global_batch": 64,
            "per_rank_batch": 64,
        },
        "env": {
            "hardware_class": hardware_class,
            "torch": torch,
            "torchrec": "1.8.0",
            "fbgemm_gpu": "1.8.0",
            "git_commit": "0" * 40,
            "git_dirty": False,
            **env,
        },
        "peak": {"tflops_per_device": peak_tflops, "devices": 1, "dtype": "fp32", "source": "synthetic"},
        "flops": {"model_per_step": flops_per_step, "per_block": {"dense_arch": flops_per_step / 3}},
        "samples": {"step_s": samples, "mfu": mfu, "stages": {}},
        "summary": {
            "step_time_s": {"p50": sorted(samples)[steps // 2], "mean": mean_s},
            "examples_per_s": headline["examples_per_s"],
            "mfu": headline["mfu"],
        },
        "metrics": headline,
    }
    if counters is not None:
        result["counters"] = {"source": "synthetic", **counters}
    return result


def save(tmp: Path, result: dict, name: str | None = None) -> str:
    path = Path(tmp) / (name or f"{result['id']}.json")
    write_result(path, result)
    return str(path)


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """Run `gembench ARGV` in process; returns (exit status, stdout, stderr).

    Only commands whose modules exist are registered, so these tests do not depend on the
    progress of unrelated commands.
    """
    from gembench.harness import cli

    saved = dict(cli.COMMANDS)
    try:
        for name, (module, _) in saved.items():
            if importlib.util.find_spec(module) is None:
                del cli.COMMANDS[name]
        code = cli.main(argv)
    finally:
        cli.COMMANDS.clear()
        cli.COMMANDS.update(saved)
    out, err = capsys.readouterr()
    return code, out, err


def cli_in_process(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    """`gembench ARGS` in this process, as gembench_cli's CompletedProcess (for the commands that
    neither fork nor change process state: a process of its own costs an import of torch and
    TorchRec); ``env`` is set around it."""
    import contextlib
    import io

    from gembench.harness import cli

    out, err = io.StringIO(), io.StringIO()
    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(list(args))
            except SystemExit as done:  # argparse's own refusals
                code = done.code if isinstance(done.code, int) else 2
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return subprocess.CompletedProcess(["gembench", *args], code, out.getvalue(), err.getvalue())


def gembench_cli(*args, env=None, cwd=None, timeout=600, library_warnings=False):
    """`python -m gembench ARGS` as a user runs it: the CompletedProcess (text, output captured).
    Library warnings are off (PYTHONWARNINGS=ignore) unless ``library_warnings``, where they are
    left as a user's shell has them (PYTHONWARNINGS unset); ``env`` is added to this environment."""
    environ = {**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})}
    if library_warnings:
        environ.pop("PYTHONWARNINGS")
    return subprocess.run(
        [sys.executable, "-m", "gembench", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=environ
    )


def ctrl_c_reaches() -> None:
    """A preexec_fn: in the child, SIGINT back to its default, so that Python turns it into
    KeyboardInterrupt. A shell starts background jobs with SIGINT ignored, and children inherit
    that (a test run started with `&`, nohup or a CI runner would see its Ctrl-C ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def load_json(text: str) -> dict:
    return json.loads(text)


def package_pyproject(name: str) -> str:
    """pyproject.toml of a throwaway repository's one setuptools package ``name`` (version 0.0.1)."""
    return (
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        f'[project]\nname = "{name}"\nversion = "0.0.1"\n[tool.setuptools]\npackages = ["{name}"]\n'
    )


def schema_and_readers_agree(out: Path, tmp_path: Path, capsys) -> None:
    """A real result at ``out`` validates, every top-level field it has is described in the
    schema, and the readers take it: a bundle of it validates, and it compares with itself."""
    from gembench.harness.commands.promote import promote
    from gembench.harness.store import results
    from gembench.harness.store.schema import schema_dir

    result = results.load_result(out)  # raises, naming the field, if the writer broke the schema
    schema = json.loads((schema_dir() / "result-1.json").read_text())
    undescribed = set(result) - set(schema["properties"])
    assert not undescribed, f"describe {sorted(undescribed)} in results/schema/result-1.json"
    target, _ = promote([result], tmp_path / "baselines", allow_dirty=True)
    assert results.load_runs(target)[0]["id"] == result["id"]
    assert run_cli(["compare", str(out), str(target)], capsys)[0] == 0
