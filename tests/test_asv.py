"""asv across two commits of a throwaway repository: the second plants a slowdown; asv must flag it.

This checks the asv recipe gembench uses (virtualenv per commit, `pip wheel --no-deps` build,
`asv continuous` exit status) on a package small enough to build in seconds. It also checks that
the repository's own asv.conf.json keeps the settings DESIGN.md section 5 asks for.
"""

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CONF = {
    "version": 1,
    "project": "slowpkg",
    "repo": ".",
    "branches": ["main"],
    "environment_type": "virtualenv",
    "pythons": [f"{sys.version_info.major}.{sys.version_info.minor}"],
    "matrix": {"req": {"setuptools": ""}},
    "build_command": ["python -m pip wheel --no-deps --no-build-isolation -w {build_cache_dir} {build_dir}"],
    "install_command": ["in-dir={env_dir} python -m pip install --no-deps --force-reinstall {wheel_file}"],
    "benchmark_dir": "benchmarks",
    "env_dir": ".asv/env",
    "results_dir": "results/asv",
    "html_dir": "results/html",
}


def _read_jsonc(path: Path) -> dict:
    """asv.conf.json allows // comments; drop whole-line ones before parsing."""
    return json.loads("\n".join(ln for ln in path.read_text().splitlines() if not ln.strip().startswith("//")))


def test_repo_asv_conf_follows_the_traps():
    conf = _read_jsonc(ROOT / "asv.conf.json")
    assert conf["results_dir"] == "results/asv" and conf["html_dir"] == "results/html"
    assert all("--no-deps" in c for c in conf["build_command"])
    req = conf["matrix"]["req"]
    assert req["torch"] == "==2.13.0" and req["fbgemm-gpu-cpu"] == "==1.8.0"
    assert "--no-deps" in req["pip+torchrec"] and "torchrec" not in req and "fbgemm-gpu" not in req


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True, capture_output=True)


def _write(repo: Path, loops: int) -> None:
    (repo / "slowpkg").mkdir(exist_ok=True)
    (repo / "slowpkg" / "__init__.py").write_text(f"def work():\n    return sum(i * i for i in range({loops}))\n")


def test_asv_continuous_flags_a_planted_slowdown(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "pyproject.toml").write_text(textwrap.dedent("""\
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "slowpkg"
        version = "0.0.1"
        [tool.setuptools]
        packages = ["slowpkg"]
        """))
    (repo / "asv.conf.json").write_text(json.dumps(CONF, indent=1))
    (repo / "benchmarks").mkdir()
    (repo / "benchmarks" / "__init__.py").write_text("")
    (repo / "benchmarks" / "bench_work.py").write_text(
        "import slowpkg\n\n\ndef time_work():\n    slowpkg.work()\n\n\ndef track_loops():\n    return 1.0\n"
    )
    (repo / ".gitignore").write_text(".asv/\nresults/\n")
    _write(repo, 20_000)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "fast")
    _write(repo, 60_000)  # the planted slowdown: three times the work
    _git(repo, "commit", "-q", "-am", "slow")

    asv = [sys.executable, "-m", "asv"]
    subprocess.run([*asv, "machine", "--yes", "--machine", "ci"], cwd=repo, check=True, capture_output=True, timeout=120)
    proc = subprocess.run(
        [*asv, "continuous", "--machine", "ci", "--factor", "1.5", "--show-stderr", "HEAD~1", "HEAD"],
        cwd=repo, capture_output=True, text=True, timeout=540,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    # asv's table marks what got worse with "+" in its Change column: the planted time_work only.
    worse = [ln for ln in out.splitlines() if re.match(r"\|\s*\+\s*\|", ln)]
    assert "PERFORMANCE DECREASED" in out and any("bench_work.time_work" in ln for ln in worse), out[-4000:]
    assert not any("track_loops" in ln for ln in worse), out[-4000:]
