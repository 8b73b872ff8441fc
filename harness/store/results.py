"""Result files: one versioned JSON document per run, written atomically, never overwritten.

The documents' fields are the JSON Schemas in results/schema/ (draft 2020-12), one file per kind
and version: ``result-1.json`` (``gembench.result/1``, every run), ``baseline-1.json``
(``gembench.baseline/1``: replicate runs of one config on one hardware class, promoted to
``results/baselines/<hardware_class>/<config>.json``; the one replaced moves to ``archive/`` beside
it), ``projection-1.json`` and ``instructions-1.json``. Every field is named there, the less
obvious ones with a description.

Every reader validates a document against results/schema/ (schema.py: load_document, validate);
a run whose loss turned non-finite carries ``diverged: {step, task, loss}``. Writers reserve their
path first and keep a result they cannot write in $TMPDIR (reservation.py).

Comparability: two results are comparable only when the fields in COMPARABLE_KEYS agree (same
hardware class, same torch/torchrec/fbgemm versions, same config hash, for a --model run the same
workload hash); the gate also requires RUN_KEYS to agree, since a baseline for another precision or
stack is not this run's baseline.
"""

from __future__ import annotations

import glob
import json
import os
import tempfile
from pathlib import Path

from gembench.errors import UsageError
from gembench.harness.store.schema import load_document, validate  # noqa: F401  (readers' API)

SCHEMA = "gembench.result/1"
BASELINE_SCHEMA = "gembench.baseline/1"
# Instruction counts of the kernel micro-benchmarks (benchmarks/instructions.py): result-like
# (id, config, env, metrics "instructions.<kernel>"), so compare reads them like results.
INSTRUCTIONS_SCHEMA = "gembench.instructions/1"

RESULTS_DIR = Path("results")
RUNS_DIR = RESULTS_DIR / "runs"
BASELINES_DIR = RESULTS_DIR / "baselines"

# Fields whose difference makes two results "not comparable" (unless forced).
# "stack.*" are virtual keys: package versions from env.packages (as `gembench run` writes them) or
# from the flat env.torch / env.torchrec / env.fbgemm_gpu of older documents; see stack_version.
COMPARABLE_KEYS = (
    "env.hardware_class",
    "stack.torch",
    "stack.torchrec",
    "stack.fbgemm",
    "config.hash",
    "workload.hash",
)
# Fields that the gate additionally requires to match its baseline.
RUN_KEYS = ("run.stack", "run.dtype", "run.nproc", "run.global_batch")


def check_writable(path: str | os.PathLike, overwrite: bool = False) -> Path:
    """Fail before any work is done if ``path`` cannot be written (or already exists)."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise UsageError(f"{path} already exists; results are never overwritten: pass another --out")
    writable_folder(path.parent if str(path.parent) else Path("."), create=False)
    return path


def writable_folder(folder: Path, flag: str = "--out", create: bool = True) -> Path:
    """Create ``folder`` for ``flag`` if needed; a UsageError when it cannot be made or written.
    ``create=False`` only checks that it could be: a run refused later leaves no empty folder."""
    if not create:
        probe = Path(folder)
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        if not probe.is_dir():
            raise UsageError(f"cannot create folder {folder} for {flag}: {probe} is not a folder")
        if not os.access(probe, os.W_OK):
            raise UsageError(f"folder {probe} is not writable: pass a {flag} somewhere you can write")
        return Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"cannot create folder {folder} for {flag}: {err.strerror}") from None
    if not os.access(folder, os.W_OK):
        raise UsageError(f"folder {folder} is not writable: pass a {flag} somewhere you can write")
    return folder


def atomic_write(path: Path, text: str, replace: bool = True, durable: bool = True) -> Path:
    """``text`` to ``path`` atomically: a reader sees the old file or the new one (or none), never
    half of one. ``replace=False`` never clobbers: FileExistsError if ``path`` exists by then.
    ``durable=False`` skips the fsync, for a cache that costs only a re-measurement if lost.
    The one writer of gembench's files (results, pages, tables, the peak cache)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would keep the file from everyone else
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # fails if path appeared meanwhile
            os.unlink(tmp)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_result(path: str | os.PathLike, result: dict, overwrite: bool = False) -> Path:
    """Write ``result`` as JSON to ``path`` atomically: readers see the whole file or none."""
    path = check_writable(path, overwrite)
    text = json.dumps(result, indent=1, sort_keys=False, allow_nan=False) + "\n"
    try:
        return atomic_write(path, text, replace=overwrite)
    except FileExistsError:
        raise UsageError(f"{path} appeared while writing; results are never overwritten") from None


def expand_paths(items: list[str]) -> list[Path]:
    """Files named by result arguments, for every command that reads results: files as given,
    globs (``**`` recursive) and folders (every ``*.json`` below them), each file once, in order."""
    out: list[Path] = []
    for text in items:
        if any(ch in text for ch in "*?["):
            out += [Path(p) for p in sorted(glob.glob(text, recursive=True))]
        elif Path(text).is_dir():
            out += sorted(Path(text).rglob("*.json"))
        else:
            out.append(Path(text))
    seen, unique = set(), []
    for p in out:
        if p.resolve() not in seen:
            seen.add(p.resolve())
            unique.append(p)
    return unique


def load_result(path: str | os.PathLike) -> dict:
    """Read one result file, validated against its JSON Schema; errors name the file and field."""
    path = Path(path)
    data = load_document(path)
    if data["schema"] not in (SCHEMA, INSTRUCTIONS_SCHEMA):
        raise UsageError(f"{path} is a {data['schema']} bundle, not a single {SCHEMA} result")
    return data


def stack_version(result: dict, package: str) -> str | None:
    """Installed version of torch, torchrec or fbgemm (CPU or CUDA build) recorded in a result."""
    env = result.get("env") or {}
    packages = env.get("packages") or {}
    for name, version in packages.items():
        norm = name.lower().replace("_", "-")
        if norm == package or (package == "fbgemm" and norm.startswith("fbgemm-gpu")):
            return version
    legacy = {"torch": "torch", "torchrec": "torchrec", "fbgemm": "fbgemm_gpu"}[package]
    return env.get(legacy)


def field(result: dict, dotted: str):
    """``field(r, "env.hardware_class")`` -> r["env"]["hardware_class"], or None where missing.

    ``stack.torch``, ``stack.torchrec`` and ``stack.fbgemm`` read package versions (stack_version).
    """
    if dotted.startswith("stack."):
        return stack_version(result, dotted.split(".", 1)[1])
    node = result
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def differences(a: dict, b: dict, keys=COMPARABLE_KEYS) -> list[str]:
    """Human-readable list of the ``keys`` on which results a and b differ (empty: comparable)."""
    return [f"{k}: {field(a, k)!r} vs {field(b, k)!r}" for k in keys if field(a, k) != field(b, k)]


def load_runs(path: str | os.PathLike) -> list[dict]:
    """The runs in a result file (one) or a baseline bundle (one or more); errors name the file."""
    data = load_document(path)
    return data["runs"] if data["schema"] == BASELINE_SCHEMA else [data]


def safe_name(text: str) -> str:
    """A file-name-safe form of a hardware class or config name."""
    return "".join(c if c.isalnum() or c in "-_.+" else "_" for c in str(text)) or "_"


def baseline_path(hardware_class: str, config: str, root: str | os.PathLike = BASELINES_DIR) -> Path:
    """Where the baseline for ``config`` on ``hardware_class`` lives."""
    return Path(root) / safe_name(hardware_class) / f"{safe_name(config)}.json"


def baseline_for(result: dict, root: str | os.PathLike = BASELINES_DIR) -> Path:
    """The baseline path for a result's own hardware class and config."""
    hw, cfg = field(result, "env.hardware_class"), field(result, "config.name")
    if not hw or not cfg:
        raise UsageError(f"result {result.get('id')!r} lacks env.hardware_class or config.name; pass --baseline")
    return baseline_path(hw, cfg, root)
