"""The environment fingerprint every result carries: what ran, where, at which commit."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path

import torch

from gembench import __version__
from gembench.harness.device.hardware import cpu_model, device_name, hardware_class

SOURCE_DIR = Path(__file__).resolve().parents[1]
PACKAGES = ("torch", "torchrec", "fbgemm-gpu-cpu", "fbgemm-gpu", "numpy")


def package_versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def git_state() -> tuple[str, bool | None]:
    """(commit, dirty) of the gembench source tree; asv and CI may name the commit instead."""
    for var in ("GEMBENCH_COMMIT", "ASV_COMMIT"):
        if os.environ.get(var):
            return os.environ[var], None
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=SOURCE_DIR, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=SOURCE_DIR,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        return commit, bool(dirty)
    except (OSError, subprocess.SubprocessError):
        return "unknown", None


def fingerprint(device: torch.device) -> dict:
    commit, dirty = git_state()
    return {
        "hardware_class": hardware_class(device),
        "device_name": device_name(device),
        "cpu_model": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "packages": package_versions(),
        "gembench": __version__,
        "git_commit": commit,
        "git_dirty": dirty,
        "hostname": socket.gethostname(),
    }
