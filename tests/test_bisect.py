"""`continuous --repo --model --setup` and `gembench bisect` on a throwaway repository of a team's model.

The repository (made once per module) holds a two-tower model (gembench's example, a small TorchRec
model) that calls a block of the team's own package, src/teamblocks, which only --setup's `pip
install --target "$GEMBENCH_OVERLAY"` makes importable. Its five commits: the base, two that change
nothing that runs, one that plants a slowdown in the block (a busy wait of several steps' time),
and one more after it; a branch off the base whose model does not import. Refusals run in process
(seconds); one real comparison and one real bisect take minutes on a busy 2-core machine.
"""

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from synthetic import ctrl_c_reaches, make_result, run_cli

from gembench.harness.continuous import bisect

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SETUP = 'python -m pip install -q --no-deps --no-build-isolation --target "$GEMBENCH_OVERLAY" .'
MODEL = ["--model", "model.py:two_tower", "--model-arg", "batch=16", "--model-arg", "max_rows=200"]
SHORT = ["--stack", "baseline", "--steps", "20", "--warmup", "1", "--pairs", "2", "--setup", SETUP]
PYPROJECT = """[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "teamblocks"
version = "0.1"

[tool.setuptools.packages.find]
where = ["src"]
"""
BLOCK = 'def block():\n    """The team\'s own block, called once per forward."""\n'
PLANTED = (
    "import time\n\n\ndef block():\n    t = time.perf_counter()\n"
    "    while time.perf_counter() - t < 0.06:  # several steps' time, so that few pairs decide\n        pass\n"
)


def _git(repo, *args):
    out = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def _commit(repo, files: dict, message: str) -> str:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", message)
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    """The throwaway repository: (path, {name: sha})."""
    repo = tmp_path_factory.mktemp("team") / "team-model"
    repo.mkdir()
    _git(repo, "init", "-q")
    model = (EXAMPLES / "two_tower.py").read_text()
    model = model.replace("from torch import nn\n", "from torch import nn\n\nimport teamblocks\n", 1)
    model = model.replace(
        "        # by feature name: a sharded", "        teamblocks.block()\n        # by feature name: a sharded"
    )
    assert model.count("teamblocks") == 2
    files = {"pyproject.toml": PYPROJECT, "src/teamblocks/__init__.py": BLOCK, "model.py": model}
    shas = {"base": _commit(repo, files, "the two-tower model and its block")}
    shas["readme"] = _commit(repo, {"README.md": "# team model\n"}, "a README")
    shas["comment"] = _commit(repo, {"src/teamblocks/__init__.py": "# the block\n" + BLOCK}, "a comment")
    shas["planted"] = _commit(repo, {"src/teamblocks/__init__.py": PLANTED}, "block: busy-wait (the planted slowdown)")
    shas["after"] = _commit(repo, {"README.md": "# team model\n\nTwo towers.\n"}, "README: what it is")
    _git(repo, "branch", "-q", "broken", shas["base"])
    _git(repo, "checkout", "-q", "broken")
    _commit(repo, {"model.py": model + "\nimport teamblocks.missing\n"}, "a model that does not import")
    _git(repo, "checkout", "-q", "master" if _git(repo, "branch", "--list", "master") else "main")
    return repo, shas


def _state(repo) -> tuple:
    """What a command must leave as it found: status, worktrees, HEAD, bisect refs and log."""
    bisecting = subprocess.run(["git", "-C", str(repo), "bisect", "log"], capture_output=True).returncode == 0
    return (
        _git(repo, "status", "--porcelain"),
        _git(repo, "worktree", "list", "--porcelain"),
        _git(repo, "rev-parse", "HEAD"),
        _git(repo, "for-each-ref", "refs/bisect"),
        bisecting,
    )


# -- bad input: one line, exit 2, before anything runs ------------------------------------------------


def test_bad_input_is_one_line(team, tmp_path, capsys):
    repo, shas = team
    before = _state(repo)
    cases = [
        (["continuous", "HEAD~1", "HEAD", "--repo", str(tmp_path)], f"--repo {tmp_path}: not a git repository"),
        (["continuous", "HEAD", "nosuch", "--repo", str(repo)], "HEAD revision 'nosuch' is not a commit"),
        (["bisect", "nosuch", "HEAD", "--repo", str(repo)], "GOOD revision 'nosuch' is not a commit"),
        (["bisect", "HEAD", "HEAD~4", "--repo", str(repo)], "GOOD HEAD is not an ancestor of BAD HEAD~4"),
        (["bisect", "HEAD", "HEAD", "--repo", str(repo)], "are one commit"),
        (["bisect", "HEAD~1", "HEAD", "--pairs", "4", "--max-pairs", "2"], "--max-pairs (2) must be at least"),
        (["bisect", "HEAD~1", "HEAD", "--benchmark", "instructions"], "bisect times steps"),
        (["bisect", "HEAD~1", "HEAD", "--format", "markdown"], "--format markdown: bisect prints a table"),
    ]
    for argv, message in cases:
        code, out, err = run_cli(argv, capsys)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (argv, err)
    assert _state(repo) == before


def test_a_failing_setup_names_the_revision_and_its_last_stderr_line(team, capsys):
    repo, shas = team
    before = _state(repo)
    setup = "echo building >&2; echo 'cc: not found' >&2; exit 3"
    code, out, err = run_cli(
        ["continuous", "HEAD~1", "HEAD", "--repo", str(repo), *MODEL, "--setup", setup, "--quiet"], capsys
    )
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"--setup failed in BASE HEAD~1 ({shas['planted'][:10]}), exit 3: cc: not found" in err, err
    assert _state(repo) == before


def test_a_model_that_does_not_import_at_one_revision_is_named_with_it(team, capsys):
    repo, shas = team
    argv = ["continuous", shas["base"][:10], "broken", "--repo", str(repo), *MODEL, *SHORT, "--quiet"]
    code, out, err = run_cli(argv, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "HEAD broken (" in err and "failed to run" in err and "teamblocks.missing" in err, err


# -- the predicate and its outcome, on synthetic figures ----------------------------------------------


def test_a_candidate_is_placed_against_the_midpoint_not_against_unchanged():
    mid = math.sqrt(1.5)  # BAD was 1.5x GOOD
    assert bisect.classify([1.49, 1.52, 1.50, 1.51], mid, 0.01)[0] == bisect.BAD
    # 3% slower than GOOD with a wide interval: far from "unchanged within 2%", plainly nearer GOOD
    assert bisect.classify([1.00, 1.06, 1.02, 1.04], mid, 0.01)[0] == bisect.GOOD
    assert bisect.classify([1.0, 1.5], mid, 0.01)[0] == bisect.UNDECIDED
    assert bisect.classify([1.2], mid, 0.01)[0] == bisect.UNDECIDED  # one pair: no interval
    sha = "a" * 40
    assert bisect.outcome(["Bisecting: 0 revisions left", f"{sha} is the first bad commit", "commit x"]) == (sha, [])
    skipped = ["There are only 'skip'ped commits left to test.", "The first bad commit could be any of:", sha, "b" * 40]
    assert bisect.outcome(skipped) == (None, [sha, "b" * 40])


def test_the_state_file_carries_the_checked_config_to_the_predicate():
    """The predicate reads the command's typed config back from JSON, paths and tuples included."""
    import json

    from gembench.harness.continuous.config import BisectConfig, Measuring

    measuring = Measuring(pairs=4, kernels=("wukong_fm",), keep_results=Path("kept"), alpha=0.01, margin=0.02)
    config = BisectConfig("v1.2", "HEAD", 12, measuring)
    assert BisectConfig.from_json(json.loads(json.dumps(config.as_json()))) == config


def test_no_regression_is_said_and_nothing_is_bisected(team, capsys, monkeypatch):
    """BAD no slower than GOOD (synthetic pairs in place of the processes): exit 0, no bisect."""
    repo, shas = team
    before = _state(repo)

    def pairs(args, co, say, enough=None):
        rounds = []
        for r in range(args.pairs):
            rounds.append((make_result(seed=2 * r), make_result(seed=2 * r + 1)))
            if enough is not None and enough(rounds, 0.0, 0.0):
                break
        return rounds, True

    monkeypatch.setattr("gembench.harness.continuous.pairs.run_pairs", pairs)
    code, out, err = run_cli(["bisect", "HEAD~3", "HEAD", "--repo", str(repo), *MODEL, "--pairs", "4"], capsys)
    assert code == 0, err
    assert "BAD/GOOD" in out and "over 4 pairs: unchanged" in out, out
    assert "bisect: no regression: BAD is not slower than GOOD (unchanged); nothing to bisect" in out, out
    assert "step 1" not in out + err
    assert _state(repo) == before


# -- real runs: the planted slowdown caught, then found -----------------------------------------------


def test_continuous_repo_catches_a_slowdown_planted_in_the_models_own_code(team, capsys):
    repo, shas = team
    argv = ["continuous", "HEAD~2", "HEAD~1", "--repo", str(repo), *MODEL, *SHORT, "--pairs", "4", "--quiet"]
    code, out, err = run_cli(argv, capsys)
    assert code == 1, out + err
    assert f"HEAD HEAD~1 = {shas['planted'][:10]}" in out, out
    row = [ln for ln in out.splitlines() if ln.startswith("step_time_s")][0]
    assert row.split()[-1] == "regressed", out
    assert [ln for ln in out.splitlines() if ln.startswith("aten_ops")][0].split()[-1] == "unchanged", out


def test_bisect_names_the_planted_commit_and_leaves_the_repository_as_found(team, capsys):
    """Five commits: GOOD, two that change nothing that runs, the planted slowdown, one after."""
    repo, shas = team
    before = _state(repo)
    argv = ["bisect", shas["base"], "HEAD", "--repo", str(repo), *MODEL, *SHORT, "--max-pairs", "6", "--quiet"]
    code, out, err = run_cli(argv, capsys)
    assert code == 0, out + err
    assert f"bisect: culprit: {shas['planted']} block: busy-wait (the planted slowdown)" in out, out
    lines = out.splitlines()
    assert "regressed" in lines[0], out
    steps = [ln for ln in lines if ln.startswith("step ")]
    assert steps and all(ln.split()[-1] in ("good", "bad") for ln in steps), out
    assert any(shas["planted"][:10] in ln and ln.endswith(": bad") for ln in steps), out
    assert _state(repo) == before


def test_ctrl_c_during_a_bisect_leaves_the_repository_as_found(team):
    """Interrupted while the bisect's first candidate runs: exit 130, no worktree, no bisect."""
    repo, shas = team
    before = _state(repo)
    argv = [sys.executable, "-m", "gembench", "bisect", shas["base"], "HEAD", "--repo", str(repo), *MODEL, *SHORT]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=ctrl_c_reaches,  # from a background shell (SIGINT ignored), Ctrl-C must still reach it
    )
    try:
        deadline = time.monotonic() + 400
        for line in proc.stderr:  # the bisect has started once git names its first candidate
            if line.startswith("bisect: Bisecting:") or time.monotonic() > deadline:
                break
        assert line.startswith("bisect: Bisecting:"), line
        worktrees = _git(repo, "worktree", "list").splitlines()
        assert len(worktrees) == 3, worktrees
        time.sleep(3)  # the predicate's pairs are starting
        os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert _state(repo) == before
    assert not any(Path(ln.split()[0]).exists() for ln in worktrees[1:])


def test_a_result_records_its_own_trees_commit_whatever_git_dir_git_exported(tmp_path, monkeypatch):
    """`git bisect run` in a worktree exports GIT_DIR, the candidate's: GOOD's processes, started
    from the predicate, must still record the commit of the gembench they imported, and git must
    find each revision's repository from its own folder."""
    from gembench.harness.continuous.pairs import child_env
    from gembench.harness.device import env

    repo = Path(__file__).resolve().parents[1]
    clean = env.without_repository(os.environ)
    own = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, env=clean, capture_output=True, text=True)
    if own.returncode != 0:
        pytest.skip("not a git checkout")
    other = tmp_path / "other"
    other.mkdir()
    for cmd in (
        ["init", "-q"],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x"],
    ):
        subprocess.run(["git", *cmd], cwd=other, check=True)
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.delenv("GEMBENCH_COMMIT", raising=False)
    monkeypatch.delenv("ASV_COMMIT", raising=False)
    assert env.git_state()[0] == own.stdout.strip()
    assert "GIT_DIR" not in child_env(tmp_path)
