"""asv, the way asv itself sees gembench.

1. The repository's suite (benchmarks/asv_suite, asv.conf.json's benchmark_dir) passes
   `asv check --python=same` and a quick `asv run --python=same` on tiny, with every benchmark
   ok. Both run with the modules asv's environment lacks made unimportable (tests/asv_env), so a
   test-only import at the top of a suite module fails here as it fails under `asv run`; and a
   planted `import pytest` or a helper named like a benchmark (`def time_x(a):`) must fail them.
2. asv across two commits of a throwaway repository: the second plants a slowdown; asv must flag
   it. This checks the recipe gembench uses (virtualenv per commit, `pip wheel --no-deps` build,
   `asv continuous` exit status) on a package small enough to build in seconds.
3. The repository's asv.conf.json keeps the pins and build settings the design document asks for.
"""

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from synthetic import package_pyproject

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


def _absent_from_asv_env() -> list[str]:
    """Top-level modules of what gembench's .venv installs (its dependencies and test extra) but
    asv's environment does not (gembench goes in --no-deps; only the conf's matrix is installed)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    norm = lambda name: re.split(r"[<>=!~ \[]", name, maxsplit=1)[0].lower().replace("_", "-")
    matrix = {norm(k.removeprefix("pip+")) for k in _read_jsonc(ROOT / "asv.conf.json")["matrix"]["req"]}
    missing = {norm(r) for r in wanted} - matrix
    missing.discard("asv")  # the asv command itself runs under the same PYTHONPATH (see _asv)
    modules = {
        mod
        for mod, dists in importlib.metadata.packages_distributions().items()
        if any(norm(d) in missing for d in dists)
    }
    assert {"pytest", "matplotlib"} <= modules, modules  # the list is read, not empty by accident
    return sorted(modules)


def _asv(tmp_path: Path, *args: str, benchmark_dir: Path | None = None, timeout: int = 120):
    """asv from the repository root on a copy of its conf (results in tmp_path, HOME too: the
    machine file), with asv's environment's missing modules made unimportable."""
    conf = _read_jsonc(ROOT / "asv.conf.json")
    conf.update(
        results_dir=str(tmp_path / "results"),
        html_dir=str(tmp_path / "html"),
        env_dir=str(tmp_path / "env"),
        repo=str(ROOT),
        benchmark_dir=str(benchmark_dir or ROOT / conf["benchmark_dir"]),
    )
    conf_path = tmp_path / "asv.conf.json"
    conf_path.write_text(json.dumps(conf))
    # --python=same runs benchmarks with this environment's PYTHONPATH; a virtualenv run would
    # take ASV_PYTHONPATH
    blocker = str(ROOT / "tests" / "asv_env")
    env = dict(
        os.environ,
        HOME=str(tmp_path),
        PYTHONPATH=blocker,
        ASV_PYTHONPATH=blocker,
        GEMBENCH_ASV_ABSENT=",".join(_absent_from_asv_env()),
        GEMBENCH_ASV_CONFIGS="tiny",
        GEMBENCH_ASV_STEPS="5",
        GEMBENCH_ASV_SET="compile=off",
    )  # what is checked is that the suite runs, not compile
    asv = [sys.executable, "-m", "asv"]
    if not (tmp_path / ".asv-machine.json").exists():
        subprocess.run(
            [*asv, "machine", "--yes", "--machine", "ci"],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            timeout=120,
        )
    proc = subprocess.run(
        [*asv, *args, "--config", str(conf_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    return proc, proc.stdout + proc.stderr


def test_asv_suite_passes_asv_check(tmp_path):
    proc, out = _asv(tmp_path, "check", "--python=same")
    assert proc.returncode == 0 and "No problems found" in out, out[-3000:]


@pytest.mark.parametrize(
    "plant, named",
    [
        ("import pytest\n", "No module named 'pytest'"),
        ("\n\ndef time_x(a):\n    return a\n", "time_x"),
    ],
    ids=["test-only-import", "helper-named-like-a-benchmark"],
)
def test_asv_check_fails_on_a_planted_break(tmp_path, plant, named):
    suite = tmp_path / "asv_suite"
    shutil.copytree(ROOT / "benchmarks" / "asv_suite", suite, ignore=shutil.ignore_patterns("__pycache__"))
    module = suite / "bench_step.py"
    text = module.read_text()
    # an import goes on top (after the docstring), a helper at the end
    module.write_text(text.replace('"""\n\n', '"""\n\n' + plant, 1) if plant.startswith("import") else text + plant)
    proc, out = _asv(tmp_path, "check", "--python=same", benchmark_dir=suite)
    assert proc.returncode != 0 and named in out, out[-3000:]


def test_asv_quick_run_of_the_suite(tmp_path):
    """Every tracked benchmark runs once on tiny (one process and 2 ranks) and reports a value."""
    proc, out = _asv(tmp_path, "run", "--python=same", "--quick", "--machine", "ci", "--show-stderr", timeout=900)
    assert proc.returncode == 0, out[-4000:]
    names = [n for n in json.loads((tmp_path / "results" / "benchmarks.json").read_text()) if n != "version"]
    ok = re.findall(r"··· (\S+)\s+ok$", out, re.M)
    assert len(names) >= 12 and len(ok) == len(names), out[-4000:]
    assert not re.search(r"··· \S+\s+(failed|skipped)$", out, re.M), out[-4000:]
    assert not re.search(r"^\s+tiny\s+(failed|n/a)\s*$", out, re.M), out[-4000:]


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True, capture_output=True
    )


def _write(repo: Path, loops: int) -> None:
    (repo / "slowpkg").mkdir(exist_ok=True)
    (repo / "slowpkg" / "__init__.py").write_text(f"def work():\n    return sum(i * i for i in range({loops}))\n")


def test_asv_continuous_flags_a_planted_slowdown(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "pyproject.toml").write_text(package_pyproject("slowpkg"))
    (repo / "asv.conf.json").write_text(json.dumps(CONF, indent=1))
    (repo / "benchmarks").mkdir()
    (repo / "benchmarks" / "__init__.py").write_text("")
    (repo / "benchmarks" / "bench_work.py").write_text(
        "import slowpkg\n\n\ndef time_work():\n    slowpkg.work()\n\n\n"
        # Twenty samples a round: with asv's default few, a busy CI host left 3x inside the noise.
        "time_work.repeat = 20\n\n\ndef track_loops():\n    return 1.0\n"
    )
    (repo / ".gitignore").write_text(".asv/\nresults/\n")
    _write(repo, 20_000)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "fast")
    _write(repo, 100_000)  # the planted slowdown: five times the work
    _git(repo, "commit", "-q", "-am", "slow")

    asv = [sys.executable, "-m", "asv"]
    subprocess.run(
        [*asv, "machine", "--yes", "--machine", "ci"], cwd=repo, check=True, capture_output=True, timeout=120
    )
    proc = subprocess.run(
        [*asv, "continuous", "--machine", "ci", "--factor", "1.5", "--show-stderr", "HEAD~1", "HEAD"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=540,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    # asv's table marks what got worse with "+" in its Change column: the planted time_work only.
    worse = [ln for ln in out.splitlines() if re.match(r"\|\s*\+\s*\|", ln)]
    assert "PERFORMANCE DECREASED" in out and any("bench_work.time_work" in ln for ln in worse), out[-4000:]
    assert not any("track_loops" in ln for ln in worse), out[-4000:]
