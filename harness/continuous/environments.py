"""Two environments, one code: `gembench continuous --python BASE_PY --python HEAD_PY`.

For a dependency upgrade: each revision's processes run under an interpreter of its own (a
virtualenv with torch, torchrec, fbgemm... of its own; scripts/env_variant.sh makes one that
differs from .venv in one package), the code on PYTHONPATH as usual, so both revisions may be
the same commit. Before any worktree is made, each interpreter is asked whether it runs and finds
what `gembench run` imports, and for the version of every distribution it sees (the first of a
name on its sys.path, as importlib.metadata.version finds it). The result names both
environments' key packages and every distribution whose version differs; after the run, each
result's recorded versions (env.packages) are checked to be its interpreter's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from gembench.errors import UsageError

# what every result records (harness/device/env.py's PACKAGES), shown for both environments
KEY_PACKAGES = ("torch", "torchrec", "fbgemm-gpu-cpu", "fbgemm-gpu", "numpy")
# what `gembench run` imports: an interpreter without one of these cannot run a revision
REQUIRED_MODULES = ("torch", "torchrec", "fbgemm_gpu", "numpy", "scipy", "tabulate", "jsonschema", "tqdm")

# Run by the interpreter under test: no gembench, no torch import, a fraction of a second.
PROBE = r"""
import importlib.util, json, platform, re, sys
from importlib import metadata
missing = [m for m in sys.argv[1].split(",") if importlib.util.find_spec(m) is None]
seen = {}
for d in metadata.distributions():  # in sys.path order: the first of a name is the one imported
    name = re.sub(r"[-_.]+", "-", d.metadata["Name"] or "").lower()
    if name and name not in seen:
        seen[name] = d.version
print(json.dumps({"python": platform.python_version(), "missing": missing, "packages": seen}))
"""


@dataclass
class Environment:
    python: str  # the interpreter as given, made absolute (a venv's bin/python link kept: it is the venv)
    python_version: str
    packages: dict[str, str] = field(default_factory=dict)  # every distribution it sees: name -> version

    def key(self) -> dict[str, str]:
        """python and the key packages it has."""
        return {"python": self.python_version} | {p: self.packages[p] for p in KEY_PACKAGES if p in self.packages}

    def summary(self) -> str:
        return ", ".join(f"{name} {version}" for name, version in self.key().items())


def probe(python: str, label: str) -> Environment:
    """The environment of interpreter ``python`` (BASE's or HEAD's), or a UsageError naming it."""
    flag = f"--python {python} ({label})"
    path = python if os.sep in python else shutil.which(python)
    if path is None or not Path(path).exists():
        raise UsageError(f"{flag}: no such interpreter; give the path of a virtualenv's bin/python")
    path = os.path.abspath(path)
    if Path(path).is_dir() or not os.access(path, os.X_OK):
        raise UsageError(f"{flag}: not an executable file; give the path of a virtualenv's bin/python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    try:
        proc = subprocess.run(
            [path, "-c", PROBE, ",".join(REQUIRED_MODULES)], env=env, capture_output=True, text=True, timeout=120
        )
        found = json.loads(proc.stdout) if proc.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError):
        found = None
    if not isinstance(found, dict):
        raise UsageError(f"{flag} is not a Python interpreter gembench can use (running a version check failed)")
    if found["missing"]:
        raise UsageError(
            f"{flag} (Python {found['python']}) lacks gembench's dependencies: {', '.join(found['missing'])}; "
            "install them there (scripts/setup.sh), or make a variant of .venv with scripts/env_variant.sh"
        )
    return Environment(path, found["python"], found["packages"])


def probe_both(pythons: list[str] | None) -> dict[str, Environment] | None:
    """{BASE: ..., HEAD: ...} from two --python flags (BASE's first), None without them."""
    if not pythons:
        return None
    if len(pythons) != 2:
        raise UsageError(
            f"--python is given twice, BASE's interpreter then HEAD's (got {len(pythons)}); "
            "for one upgraded environment pass the current one as BASE's"
        )
    return {label: probe(py, label) for label, py in zip(("BASE", "HEAD"), pythons)}


def differences(envs: dict[str, Environment]) -> list[dict]:
    """Every distribution (and python) whose version differs: [{package, base, head}], None where absent."""
    base, head = ({"python": e.python_version} | e.packages for e in (envs["BASE"], envs["HEAD"]))
    return [
        {"package": name, "base": base.get(name), "head": head.get(name)}
        for name in sorted(set(base) | set(head), key=lambda n: (n != "python", n))
        if base.get(name) != head.get(name)
    ]


def describe(diffs: list[dict]) -> str:
    if not diffs:
        return "the environments differ in nothing they report: same python, same package versions"
    return "environments differ in: " + ", ".join(
        f"{d['package']} {d['base'] or 'absent'} -> {d['head'] or 'absent'}" for d in diffs
    )


def header_lines(envs: dict[str, Environment]) -> list[str]:
    return [f"{label} env {e.python}: {e.summary()}" for label, e in envs.items()] + [describe(differences(envs))]


def document(envs: dict[str, Environment]) -> dict:
    """What the JSON result says of them."""
    return {
        "environments": {
            label: {"python": e.python, "versions": e.key(), "packages": len(e.packages)} for label, e in envs.items()
        },
        "environment_differences": differences(envs),
    }


def check_results(envs: dict[str, Environment] | None, rounds: list[tuple[dict, dict]]) -> None:
    """Each process recorded its own interpreter's key versions: else PYTHONPATH or a .pth file won."""
    if not envs:
        return
    for pair in rounds:
        for label, result in zip(("BASE", "HEAD"), pair):
            recorded = (result.get("env") or {}).get("packages") or {}
            expected = envs[label].packages
            for name, version in recorded.items():
                norm = re.sub(r"[-_.]+", "-", name).lower()
                if norm in expected and expected[norm] != version:
                    raise UsageError(
                        f"{label}'s process ran {name} {version}, not the {expected[norm]} its --python "
                        f"{envs[label].python} has: something on its path shadows that environment"
                    )
