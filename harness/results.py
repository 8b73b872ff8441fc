"""Result files: one versioned JSON document per run, written atomically, never overwritten.

Schema ``gembench.result/1`` (all times in seconds, FLOPs as floats):

    schema, id, created (ISO 8601 UTC)
    config:  {name, hash, path, kind}
    run:     {steps, warmup, dtype, device, seed, stack, nproc, global_batch, per_rank_batch}
    env:     {hardware_class, device_name, cpu_model, cpu_cores, python, torch, torchrec,
              fbgemm_gpu, gembench, git_commit, git_dirty, hostname}
    peak:    {tflops_per_device, devices, dtype, source}
    flops:   {forward_per_step, model_per_step, per_block: {block: forward FLOPs per step}}
    samples: {step_s: [...], mfu: [...], stages: {stage: [...]}}   one entry per timed step
    summary: {step_time_s: {p50, p90, mean, ci95: [lo, hi]}, examples_per_s, tflops, mfu,
              peak_memory_bytes, stages: {stage: {time_s, share, flops, tflops, mfu}}}
    metrics: flat {name: number}: the headline figures that compare and gate read
             (mfu, step_time_s, examples_per_s, peak_memory_bytes, and, where measured,
             imbalance_max_mean, exposed_comm_fraction, ab_mfu_ratio)
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from gembench.harness.errors import UsageError

SCHEMA = "gembench.result/1"


def check_writable(path: str | os.PathLike, overwrite: bool = False) -> Path:
    """Fail before any work is done if ``path`` cannot be written (or already exists)."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise UsageError(f"{path} already exists; results are never overwritten: pass another --out")
    parent = path.parent if str(path.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"cannot create folder {parent} for --out: {err.strerror}") from None
    if not os.access(parent, os.W_OK):
        raise UsageError(f"folder {parent} is not writable: pass an --out somewhere you can write")
    return path


def write_result(path: str | os.PathLike, result: dict, overwrite: bool = False) -> Path:
    """Write ``result`` as JSON to ``path`` atomically: readers see the whole file or none."""
    path = check_writable(path, overwrite)
    text = json.dumps(result, indent=1, sort_keys=False, allow_nan=False) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # fails if path appeared meanwhile: never clobber
            os.unlink(tmp)
    except FileExistsError:
        os.unlink(tmp)
        raise UsageError(f"{path} appeared while writing; results are never overwritten") from None
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def load_result(path: str | os.PathLike) -> dict:
    """Read a result file, checking its schema; errors name the file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"no result file {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UsageError(f"{path} is not a gembench result (bad JSON: {err})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise UsageError(f"{path} has schema {found!r}, expected {SCHEMA!r}")
    return data
