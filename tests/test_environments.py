"""`gembench continuous --python BASE_PY --python HEAD_PY`: one code under two environments.

The two environments come from scripts/env_variant.sh, each a variant of this one holding a planted
package (a wheel made here, installed from a local folder) at another version: the result must name
the difference. Bad interpreters are refused in process, before any worktree. One real comparison
of tiny (2 pairs of 2 steps, baseline stack) runs on a clone: about a minute on 2 idle cores.
"""

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from synthetic import run_cli

from gembench.harness.continuous import environments

ROOT = Path(__file__).resolve().parents[1]
PLANTED = "gembench-planted"


def _wheel(folder: Path, version: str) -> None:
    """A minimal pure wheel of PLANTED at ``version``: one module and its metadata."""
    dist = f"gembench_planted-{version}.dist-info"
    with zipfile.ZipFile(folder / f"gembench_planted-{version}-py3-none-any.whl", "w") as whl:
        whl.writestr("gembench_planted.py", f"VERSION = {version!r}\n")
        whl.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {PLANTED}\nVersion: {version}\n")
        whl.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{dist}/RECORD", "")


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    """{version: python} of two variants of this environment, PLANTED 1.0 in one and 2.0 in the other."""
    tmp = tmp_path_factory.mktemp("envs")
    wheels = tmp / "wheels"
    wheels.mkdir()
    base_venv = Path(sys.prefix)  # this interpreter's virtualenv: what the variants reuse
    out = {}
    for version in ("1.0", "2.0"):
        _wheel(wheels, version)
        dest = tmp / f"venv-{version}"
        env = {"PATH": "/usr/bin:/bin", "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}
        proc = subprocess.run(
            ["bash", str(ROOT / "scripts" / "env_variant.sh"), str(dest), f"{PLANTED}=={version}", str(base_venv)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        assert f"{PLANTED} {version}" in proc.stdout
        out[version] = str(dest / "bin" / "python")
    return out


def test_the_variants_differ_in_the_planted_package_only(variants):
    envs = environments.probe_both([variants["1.0"], variants["2.0"]])
    assert environments.differences(envs) == [{"package": PLANTED, "base": "1.0", "head": "2.0"}]
    assert envs["BASE"].key() == envs["HEAD"].key() and "torch" in envs["BASE"].key()  # the rest is shared
    lines = environments.header_lines(envs)
    assert lines[0].startswith(f"BASE env {variants['1.0']}: python ") and "torch " in lines[0]
    assert lines[-1] == f"environments differ in: {PLANTED} 1.0 -> 2.0"
    # the same environment twice differs in nothing
    assert environments.differences(environments.probe_both([sys.executable, sys.executable])) == []


def test_a_result_from_another_version_is_refused():
    envs = {
        label: environments.Environment("/x/bin/python", "3.11.7", {"torchrec": "1.8.0"}) for label in ("BASE", "HEAD")
    }
    ok = {"env": {"packages": {"torchrec": "1.8.0"}}}
    environments.check_results(envs, [(ok, ok)])
    with pytest.raises(Exception, match="HEAD's process ran torchrec 1.9.2, not the 1.8.0"):
        environments.check_results(envs, [(ok, {"env": {"packages": {"torchrec": "1.9.2"}}})])


def test_bad_interpreters_are_refused_with_one_line(tmp_path, capsys):
    not_python = tmp_path / "not-python"
    not_python.write_text("#!/bin/sh\nexit 0\n")
    not_python.chmod(0o755)
    bare = tmp_path / "bare"  # a virtualenv of its own: none of gembench's dependencies
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    cases = [
        (["--python", str(tmp_path / "nope"), "--python", sys.executable], "(BASE): no such interpreter"),
        (["--python", sys.executable, "--python", str(not_python)], "(HEAD) is not a Python interpreter"),
        (["--python", sys.executable, "--python", str(tmp_path)], "(HEAD): not an executable file"),
        (
            ["--python", str(bare / "bin" / "python"), "--python", sys.executable],
            "lacks gembench's dependencies: torch",
        ),
        (["--python", sys.executable], "--python is given twice"),
        ([], "give BASE and HEAD revisions"),
    ]
    for flags, said in cases:
        code, _, err = run_cli(["continuous", *flags, "--repo", str(tmp_path)], capsys)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert code == 2 and len(lines) == 1 and said in lines[0], (flags, err)


def test_one_revision_under_two_environments_names_the_difference(variants, tmp_path, capsys):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", "--no-local", str(ROOT), str(clone)], check=True, capture_output=True)
    saved = tmp_path / "continuous.json"
    argv = ["continuous", "--repo", str(clone), "--python", variants["1.0"], "--python", variants["2.0"]]
    argv += ["--steps", "2", "--pairs", "2", "--stack", "baseline", "--format", "json", "--json-out", str(saved)]
    code, out, err = run_cli(argv, capsys)
    assert code in (0, 1, 4), err
    doc = json.loads(out)
    assert json.loads(saved.read_text()) == doc  # --json-out holds what --format json prints
    assert doc["base"]["sha"] == doc["head"]["sha"] and doc["base"]["revision"] == "HEAD"  # one code
    assert doc["environment_differences"] == [{"package": PLANTED, "base": "1.0", "head": "2.0"}]
    assert [e["python"] for e in doc["environments"].values()] == [variants["1.0"], variants["2.0"]]
    assert doc["environments"]["BASE"]["versions"] == doc["environments"]["HEAD"]["versions"]  # torch & co shared
