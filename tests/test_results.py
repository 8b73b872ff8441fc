"""Result store: atomic never-overwrite writes, schema checks, baseline bundles, promotion."""

import json
import os

import pytest
from synthetic import gembench_cli, make_result, run_cli, save, schema_and_readers_agree

from gembench.errors import UsageError
from gembench.harness.commands.promote import promote
from gembench.harness.store import results
from gembench.harness.store.schema import schema_dir

pytestmark = pytest.mark.reads_shared_runs("tiny_run")  # by request.getfixturevalue


def test_write_is_atomic_and_never_overwrites(tmp_path):
    path = tmp_path / "runs" / "r.json"
    results.write_result(path, make_result())
    with pytest.raises(UsageError, match="never overwritten"):
        results.write_result(path, make_result(rid="other"))
    assert results.load_result(path)["id"] == "r1"
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]  # no temp files left behind


def test_load_names_the_file_on_every_mistake(tmp_path):
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"schema": "other/1"}))
    for path, message in [(tmp_path / "missing.json", "no result file"), (bad_json, "bad JSON"), (wrong, "expected")]:
        with pytest.raises(UsageError, match=message) as err:
            results.load_runs(path)
        assert str(path) in str(err.value)


def test_baseline_bundle_holds_replicates(tmp_path):
    runs = [make_result(rid=f"r{i}", seed=i) for i in range(3)]
    target, archived = promote(runs, tmp_path)
    assert target == tmp_path / "cpu-test-2t" / "tiny.json" and archived is None
    assert [r["id"] for r in results.load_runs(target)] == ["r0", "r1", "r2"]
    broken = tmp_path / "broken.json"
    broken.write_text(
        json.dumps(
            {
                "schema": results.BASELINE_SCHEMA,
                "promoted": "2026-01-01T00:00:00+00:00",
                "hardware_class": "cpu-test-2t",
                "config": "tiny",
                "runs": [],
            }
        )
    )
    with pytest.raises(UsageError, match=r"\$\.runs must hold at least 1 item"):
        results.load_runs(broken)


def test_promote_keeps_the_old_baseline(tmp_path, capsys):
    first = save(tmp_path, make_result(rid="old"))
    second = save(tmp_path, make_result(rid="new", seed=5))
    root = tmp_path / "baselines"
    assert run_cli(["promote", first, "--baselines", str(root)], capsys)[0] == 0
    code, out, _ = run_cli(["promote", second, "--baselines", str(root)], capsys)
    assert code == 0 and "previous baseline kept" in out
    (old,) = (root / "cpu-test-2t" / "archive").iterdir()
    assert results.load_runs(old)[0]["id"] == "old"
    assert results.load_runs(root / "cpu-test-2t" / "tiny.json")[0]["id"] == "new"


def test_promote_refuses_mixed_or_dirty_runs(tmp_path):
    with pytest.raises(UsageError, match="not replicates"):
        promote([make_result(), make_result(rid="x", torch="2.12.0")], tmp_path)
    with pytest.raises(UsageError, match="dirty"):
        promote([make_result(git_dirty=True)], tmp_path)
    assert promote([make_result(git_dirty=True)], tmp_path, allow_dirty=True)[0].exists()


def test_differences_and_safe_paths():
    a, b = make_result(), make_result(torch="2.12.0", config_hash="beef")
    assert results.differences(a, b) == ["stack.torch: '2.13.0' vs '2.12.0'", "config.hash: 'cafe' vs 'beef'"]
    packaged = {"env": {"packages": {"torch": "2.13.0+cpu", "fbgemm-gpu-cpu": "1.8.0", "torchrec": "1.8.0"}}}
    assert [results.field(packaged, f"stack.{p}") for p in ("torch", "torchrec", "fbgemm")] == [
        "2.13.0+cpu",
        "1.8.0",
        "1.8.0",
    ]
    assert results.differences(
        packaged,
        {"env": {"packages": {"torch": "2.13.0+cpu", "fbgemm-gpu": "1.9.0", "torchrec": "1.8.0"}}},
        ["stack.fbgemm"],
    )
    assert results.baseline_path("cuda/../x", "tiny", "root") == results.Path("root/cuda_.._x/tiny.json")
    assert os.sep not in results.safe_name("a/b")


# -- the schema and the writers agree -------------------------------------------------------------

# few steps, fp32, no compile: the shape matters here (the compiled stack: tiny_run and tests/test_stacks.py)
AB_RUN = ["--config", "tiny", "--ab", "--rounds", "2", "--steps", "2", "--warmup", "1", "--dtype", "fp32"]
AB_RUN += ["--set", "compile=off"]


@pytest.fixture
def real_result(request, tmp_path):
    """The path of a real result of each kind: one process is the session's shared run (conftest),
    --ab is made here (N ranks: tests/test_distributed.py, beside the shared 2-rank run)."""
    if request.param == "tiny":
        return request.getfixturevalue("tiny_run")[2]
    out = tmp_path / "ab.json"
    proc = gembench_cli("run", *AB_RUN, "--quiet", "--out", str(out), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.parametrize("real_result", ["tiny", "ab"], indirect=True)
def test_schema_and_writer_agree_on_real_results(tmp_path, capsys, real_result):
    schema_and_readers_agree(real_result, tmp_path, capsys)


def test_committed_baselines_validate():
    committed = sorted((schema_dir().parent / "baselines").rglob("*.json"))
    assert committed
    for path in committed:
        assert results.load_runs(path)


def test_one_expander_for_compare_and_report(tmp_path):
    """Files, globs and folders (searched below) name the same files for every command."""
    from gembench.harness.commands.compare import expand_side
    from gembench.harness.store.results import expand_paths

    (tmp_path / "a" / "deep").mkdir(parents=True)
    for name in ("a/r1.json", "a/deep/r2.json", "a/notes.txt"):
        (tmp_path / name).write_text("{}")
    folder = [tmp_path / "a" / "r1.json", tmp_path / "a" / "deep" / "r2.json"]
    assert sorted(expand_paths([str(tmp_path / "a")])) == sorted(folder)
    assert sorted(expand_side(str(tmp_path / "a"))) == sorted(folder)  # compare looks inside folders too
    assert expand_paths([str(tmp_path / "a" / "*.json"), str(tmp_path / "a" / "r1.json")]) == folder[:1]
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="folder .*empty holds no"):
        expand_side(str(tmp_path / "a") + "," + str(tmp_path / "empty"))
