import os
from pathlib import Path

import pytest
import torch

# Triton's interpreter runs the GPU kernels on CPU tensors (tests/test_hstu_triton.py). Triton fixes
# interpreted vs compiled when it is first imported (torchrec imports it), so this comes first.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="session")
def _small_peak_cache(tmp_path_factory):
    """Keep tests off the user's calibration cache, and give runs one settled peak: without it every
    run process beside the other test worker (a busy machine) measures its own provisional peak,
    seconds of GEMMs each. Measured once here per thread count a run or rank uses, a quarter above
    what one GEMM size gave, so that a run's short probe does not beat it and re-measure.
    tests/test_peak.py tests calibration itself, on caches of its own."""
    if "GEMBENCH_CACHE" in os.environ:  # the user's choice: used as it is
        return
    os.environ["GEMBENCH_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    import datetime as dt

    from gembench.harness.device import calibration

    cores = os.cpu_count() or 1
    for threads in sorted({1, max(1, cores // 2), cores, torch.get_num_threads()}):
        for dtype, torch_dtype in calibration.DTYPES.items():
            with calibration.torch_threads(threads):
                tflops, size = calibration.time_gemm(1024, torch_dtype, 0.2)
            entry = calibration.Entry(calibration.cpu_model(), dtype, threads, torch.__version__)
            now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
            entry.add(
                calibration.Measurement(
                    round(1.25 * tflops, 4), size, 1, threads, now, [0.0] * 3, 0.0, cores, True, "tests"
                )
            )
            calibration.save_entry(entry)
        with calibration.torch_threads(threads):
            tbs, n = calibration.time_triad(calibration.TRIAD_SIZES[0], 0.2)
        entry = calibration.Entry(calibration.cpu_model(), calibration.TRIAD, threads, torch.__version__)
        # twice the figure: a busy machine's probe must not beat it and re-measure within a rank's --timeout
        entry.add(calibration.Measurement(round(2 * tbs, 6), n, 1, threads, now, [0.0] * 3, 0.0, cores, True, "tests"))
        calibration.save_entry(entry)


# -- real runs made once per session, for tests that only read their result -------------------
# (`pytest -n 2 --dist loadgroup`: the files that read one share a worker, see below)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """`gembench run --config tiny --steps 5 --trace DIR`, optimized stack, as a user runs it
    (library warnings not silenced): (process, result, its path); the trace is in path.parent/"tr"."""
    import json

    from synthetic import gembench_cli

    out = tmp_path_factory.mktemp("tiny-run") / "r.json"
    trace = str(out.parent / "tr")
    proc = gembench_cli(
        "run", "--config", "tiny", "--steps", "5", "--trace", trace, "--out", str(out), "--quiet", library_warnings=True
    )
    assert proc.returncode == 0, proc.stderr
    return proc, json.loads(out.read_text()), out


@pytest.fixture(scope="session")
def skew_config(tmp_path_factory):
    """tiny, but table t0 is hot: 64 IDs per example against 1 for every other table, and the
    sequence is nearly empty, so t0's lookups are almost all of the embedding work."""
    import re

    from gembench.models.config import load_config

    text = open(load_config("tiny").source).read()
    skew = re.sub(
        r"pooling = \[[^\]]*\]",
        "pooling = [64, 1, 1, 1, 1, 1, 1, 1]",
        text.replace('pooling = "uniform"', 'pooling = "fixed"'),
    )
    skew = skew.replace("max_len = 32", "max_len = 2").replace("mean_len = 16", "mean_len = 1")
    path = tmp_path_factory.mktemp("cfg") / "skew.toml"
    path.write_text(skew.replace('name = "tiny"', 'name = "skew"'))
    return path


@pytest.fixture(scope="session")
def table_wise(skew_config, tmp_path_factory):
    """The skew config on 2 gloo ranks, table-wise, staged, traced: (process, result, its folder)."""
    import json

    from synthetic import gembench_cli

    d = tmp_path_factory.mktemp("tw")
    proc = gembench_cli(
        "run",
        "--config",
        str(skew_config),
        "--nproc",
        "2",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--sharding",
        "table_wise",
        "--trace",
        str(d / "traces"),
        "--out",
        str(d / "r.json"),
        "--quiet",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads((d / "r.json").read_text()), d


# Each shared run has a worker group of its own, so that the two can run side by side; a file
# reading both goes with the costlier table_wise (tiny_run is then made there too, from a warm
# compile cache). A file that reads one by request.getfixturevalue names it in its marker:
# `pytestmark = pytest.mark.reads_shared_runs("tiny_run")`.
SHARED_RUNS = {"table_wise": "shared-table-wise", "tiny_run": "shared-tiny-run"}  # costlier first


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "reads_shared_runs(*fixtures): the file reads these session shared runs "
        "through request.getfixturevalue (grouped with the others that do)",
    )


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups into node ids
def pytest_collection_modifyitems(config, items):
    """For `pytest -n 2 --dist loadgroup` (the README's command): a test file goes to one worker
    whole (its module fixtures, real runs, are made once), and the files that read a shared run go
    together, so that each shared run is made once in the whole session."""
    reads: dict = {}
    for item in items:
        marker = item.get_closest_marker("reads_shared_runs")
        reads.setdefault(item.path, set()).update(set(SHARED_RUNS) & set(item.fixturenames))
        reads[item.path].update(marker.args if marker else ())
    for item in items:
        group = next((g for fixture, g in SHARED_RUNS.items() if fixture in reads[item.path]), item.path.name)
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    """Fail early if `--dist loadgroup` would silently ignore the groups (pytest 9 with
    pytest-xdist 3.8 does: xdist writes a node id field pytest 9 no longer reads)."""
    items, config = session.items, session.config
    if getattr(config.option, "loadgroup", False) and items and "@" not in items[0].nodeid:
        raise pytest.UsageError(
            "pytest-xdist's --dist loadgroup ignores the test groups with this pytest; "
            "install the pinned one: pip install -c scripts/constraints.txt -e '.[test]'"
        )
