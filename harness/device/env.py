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
# What tells git which repository to read, whatever the working folder: git exports GIT_DIR to the
# commands it runs (`git bisect run` in a worktree does), and a child that inherits it reads that
# repository instead of the one it sits in
REPOSITORY_VARIABLES = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_COMMON_DIR",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_NAMESPACE",
    "GIT_PREFIX",
)


def without_repository(env: dict) -> dict:
    """``env`` without git's repository variables: git then finds the repository from its folder."""
    return {k: v for k, v in env.items() if k not in REPOSITORY_VARIABLES}


def package_versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def git_state() -> tuple[str, bool | None]:
    """(commit, dirty) of the gembench source tree (the repository its folder is in, whatever
    repository an inherited GIT_DIR names); asv and CI may name the commit instead."""
    for var in ("GEMBENCH_COMMIT", "ASV_COMMIT"):
        if os.environ.get(var):
            return os.environ[var], None
    git = {"cwd": SOURCE_DIR, "env": without_repository(os.environ), "capture_output": True, "text": True}
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], timeout=10, check=True, **git).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], timeout=10, check=True, **git
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
