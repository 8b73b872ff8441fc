"""`gembench continuous`: paired rounds of two commits, their verdicts, errors and cleanup.

The statistics run on synthetic rounds (milliseconds); the command itself runs on a temporary
clone of this repository: errors and interrupts cost seconds, one real run of tiny about a minute.
"""

import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from synthetic import ctrl_c_reaches, make_result, run_cli

from gembench.harness.regression import paired, stats
from gembench.harness.report.verdicts import render_paired

ROOT = Path(__file__).resolve().parents[1]


def _rounds(effect, noise=0.01, drift=0.3, n=8, seed=0, counters=None, head_counters=None):
    """Rounds whose two processes share a drift factor (up to +-30%) and differ by ``effect``."""
    rng = random.Random(seed)
    out = []
    for r in range(n):
        shared = math.exp(rng.uniform(-drift, drift))
        base = make_result(
            f"b{r}", step_s=0.01 * shared * rng.lognormvariate(0, noise), noise=0.005, seed=2 * r, counters=counters
        )
        head = make_result(
            f"h{r}",
            step_s=0.01 * shared * (1 + effect) * rng.lognormvariate(0, noise),
            noise=0.005,
            seed=2 * r + 1,
            counters=head_counters or counters,
        )
        out.append((base, head))
    return out


def _verdict(judgements, metric="step_time_s"):
    return next(j for j in judgements if j.metric == metric).verdict


def test_paired_change_cancels_shared_drift():
    a = [1.0, 2.0, 0.5, 4.0, 1.5]
    b = [x * 1.05 * f for x, f in zip(a, (1.001, 0.999, 1.0, 1.002, 0.998))]
    c = stats.paired_change(a, b)
    assert abs(c.change - 0.05) < 0.002 and c.se < 0.002 and c.df == 4
    assert stats.paired_ratio_interval([y / x for x, y in zip(a, b)])[0] == pytest.approx(1 + c.change)
    # unpaired, the same values are hopeless: the drift (8x) swamps the 5%
    assert stats.relative_change(a, b).se > 0.3
    with pytest.raises(ValueError, match="equal"):
        stats.paired_change([1.0], [1.0, 2.0])


def test_five_percent_under_30_percent_drift_is_caught_and_no_change_is_not():
    j = paired.judge_rounds(_rounds(0.05), ["step_time_s"], 0.01, 0.03)
    assert _verdict(j) == "regressed" and paired.exit_status(j) == 1
    row = paired.rows(j)[0]
    assert row["method"] == "paired" and row["rounds"] == 8 and 1.03 < row["ratio"] < 1.07
    assert row["ratio_ci95"][0] < row["ratio"] < row["ratio_ci95"][1]
    j = paired.judge_rounds(_rounds(0.0, seed=1), ["step_time_s"], 0.01, 0.03)
    assert _verdict(j) == "unchanged" and paired.exit_status(j) == 0
    j = paired.judge_rounds(_rounds(-0.08, seed=2), ["step_time_s"], 0.01, 0.03)
    assert _verdict(j) == "improved" and paired.exit_status(j) == 0
    j = paired.judge_rounds(_rounds(0.0, noise=0.2, n=3, seed=3), ["step_time_s"], 0.01, 0.03)
    assert _verdict(j) == "inconclusive" and paired.exit_status(j) == 4


def test_process_value_median_or_best_step():
    r = make_result(step_s=0.01, noise=0.1, steps=101, seed=4)
    steps = r["samples"]["step_s"]
    assert paired.process_value(r, "step_time_s") == sorted(steps)[50]
    assert paired.process_value(r, "step_time_s", "min") == min(steps)
    assert paired.process_value(r, "step_time_s", "p10") == sorted(steps)[10]
    assert paired.process_value(r, "mfu", "p10") == sorted(r["samples"]["mfu"], reverse=True)[10]
    assert paired.process_value(r, "step_time_s", "fast-half") == pytest.approx(
        sum(sorted(steps)[: len(steps) // 2]) / (len(steps) // 2)
    )
    assert (
        paired.process_value(r, "mfu", "fast-half")
        == pytest.approx(  # the better half: the higher MFUs
            sum(sorted(r["samples"]["mfu"], reverse=True)[: len(steps) // 2]) / (len(steps) // 2)
        )
    )
    assert paired.process_value(r, "mfu", "min") == max(r["samples"]["mfu"])  # higher is better: the best step
    assert paired.process_value(r, "peak_memory_bytes") == 123_456_789  # no samples: the headline value


def test_counters_judged_exactly_beside_the_times():
    counts = {"aten_ops": 900, "host_syncs": 2, "h2d_bytes": 4096, "kernels": None, "graph_breaks": 0, "recompiles": 0}
    j = paired.judge_rounds(
        _rounds(0.0, seed=5, counters=counts, head_counters={**counts, "aten_ops": 901}), ["step_time_s"], 0.01, 0.03
    )
    by = {x.metric: x for x in j}
    assert by["aten_ops"].verdict == "regressed" and by["aten_ops"].method == "count"
    assert by["h2d_bytes"].verdict == "unchanged" and "kernels" not in by
    assert paired.exit_status(j) == 1
    text = render_paired(j, ["header"], "table")
    assert "aten_ops (lower better)" in text and "exact count" in text and "8 pair ratios" in text
    assert render_paired(j, ["header"], "markdown").startswith("**gembench continuous**")
    # absent on one side: not judged
    j = paired.judge_rounds(_rounds(0.0, seed=5, head_counters=counts), ["step_time_s"], 0.01, 0.03)
    assert [x.metric for x in j] == ["step_time_s"]


# ----------------------------------------------------------------------------- the command


def _git(repo, *args):
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@pytest.fixture
def clone(tmp_path):
    repo = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", "--no-local", str(ROOT), str(repo)], check=True, capture_output=True)
    return repo


def _worktrees(repo):
    return [ln for ln in _git(repo, "worktree", "list", "--porcelain").splitlines() if ln.startswith("worktree ")]


def test_unknown_revision_and_bad_rounds_exit_2(clone, capsys):
    code, _, err = run_cli(["continuous", "nope", "HEAD", "--repo", str(clone)], capsys)
    assert code == 2 and "BASE revision 'nope' is not a commit" in err
    code, _, err = run_cli(["continuous", "HEAD", "HEAD", "--repo", str(clone), "--rounds", "1"], capsys)
    assert code == 2 and "--pairs must be at least 2" in err
    code, _, err = run_cli(["continuous", "HEAD", "HEAD", "--repo", str(clone), "--metric", "aten_ops"], capsys)
    assert code == 2 and "not a timing metric" in err


@pytest.mark.parametrize("mode", [[], ["--sequential"]])
def test_a_revision_that_fails_is_named_with_its_error_and_worktrees_go(clone, capsys, mode):
    run_py = clone / "harness" / "commands" / "run.py"
    run_py.write_text(run_py.read_text() + '\nraise RuntimeError("planted failure for the test")\n')
    _git(clone, "commit", "--quiet", "-am", "broken")
    broken = _git(clone, "rev-parse", "HEAD")
    code, _, err = run_cli(["continuous", "HEAD", "HEAD~1", "--repo", str(clone), "--quiet", *mode], capsys)
    assert code == 2, err
    line = [ln for ln in err.splitlines() if ln.strip()][-1]
    assert (
        line == f"gembench continuous: error: BASE HEAD ({broken[:10]}) failed to run (exit 1): "
        "RuntimeError: planted failure for the test"
    )
    assert len(_worktrees(clone)) == 1


# ----------------------------------------------------------------------------- taking turns

FAKE_WORKER = """
import sys
from gembench.harness.continuous.interleave import Pacer
label, log, steps, die_after = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
argv = sys.argv
pace = Pacer(argv[argv.index("--pace") + 1], int(argv[argv.index("--burst") + 1]))
for k in range(steps):
    if k == die_after:
        sys.exit("planted: worker " + label + " gave up at step " + str(k))
    pace(k)
    with open(log, "a") as fh:
        fh.write(label)
pace.done()
"""


def _fake_workers(tmp_path, steps, burst, die_after=(-1, -1), labels="AB", log=None):
    from gembench.harness.continuous import interleave

    log = log or tmp_path / f"turns-{labels}.txt"
    return log, [
        interleave.start(
            label,
            [sys.executable, "-c", FAKE_WORKER, label, str(log), str(steps), str(die)],
            dict(os.environ),
            tmp_path,
            tmp_path,
            burst,
        )
        for label, die in zip(labels, die_after)
    ]


def test_workers_take_turns_abba_by_burst_and_never_overlap(tmp_path):
    from gembench.harness.continuous import interleave

    log, workers = _fake_workers(tmp_path, steps=7, burst=2)  # 4 turns each, the last one step
    try:
        interleave.take_turns(workers[::-1], bursts=4, timeout=60)  # B takes the first turn
        interleave.finish(workers, timeout=60)
    finally:
        interleave.close(workers)
    assert log.read_text() == "BBAAAABBBBAAAB"


def test_pairs_side_by_side_each_take_their_own_turns(tmp_path):
    """Two pairs driven at once: each pair's turns are ABBA and never overlap, whatever the other does."""
    from gembench.harness.continuous import interleave

    log1, pair1 = _fake_workers(tmp_path, steps=7, burst=2, labels="AB")
    log2, pair2 = _fake_workers(tmp_path, steps=7, burst=2, labels="CD")
    try:
        interleave.take_turns_side_by_side([(pair1, None), (pair2[::-1], None)], bursts=4, timeout=60)
        interleave.finish(pair1 + pair2, timeout=60)
    finally:
        interleave.close(pair1 + pair2)
    assert log1.read_text() == "AABBBBAAAABBBA"
    assert log2.read_text() == "DDCCCCDDDDCCCD"


def test_a_worker_warmed_before_its_partner_started_is_not_waited_for_again(tmp_path):
    """Start-ups judged: a pair's second process starts once its first is warm (its "ready" read
    by the caller), and the turns begin from there."""
    import time

    from gembench.harness.continuous import interleave

    log, (a,) = _fake_workers(tmp_path, steps=4, burst=2, labels="A")
    workers = [a]
    try:
        interleave.wait_ready([a], time.monotonic() + 60)
        _, (b,) = _fake_workers(tmp_path, steps=4, burst=2, labels="B", log=log)
        workers.append(b)
        interleave.take_turns_side_by_side([([a, b], None)], bursts=2, timeout=30, warm=[a])
        interleave.finish(workers, timeout=60)
    finally:
        interleave.close(workers)
    assert log.read_text() == "AABBBBAA"

    from gembench.harness.continuous import interleave

    _, pair1 = _fake_workers(tmp_path, steps=6, burst=2, labels="AB")
    _, pair2 = _fake_workers(tmp_path, steps=6, burst=2, die_after=(-1, 3), labels="CD")
    with pytest.raises(interleave.WorkerFailed) as info:
        try:
            interleave.take_turns_side_by_side([(pair1, None), (pair2, None)], bursts=3, timeout=60)
        finally:
            interleave.close(pair1 + pair2)
    assert info.value.worker.label == "D" and "planted: worker D gave up at step 3" in info.value.stderr
    assert all(w.proc.poll() is not None for w in pair1 + pair2)


def test_a_worker_that_dies_mid_round_is_named_with_its_error(tmp_path):
    from gembench.harness.continuous import interleave

    log, workers = _fake_workers(tmp_path, steps=6, burst=2, die_after=(-1, 3))
    with pytest.raises(interleave.WorkerFailed) as info:
        try:
            interleave.take_turns(workers, bursts=3, timeout=60)
        finally:
            interleave.close(workers)
    assert info.value.worker.label == "B" and info.value.code == 1
    assert "planted: worker B gave up at step 3" in info.value.stderr
    assert not info.value.predates_pacing
    assert all(w.proc.poll() is not None for w in workers)  # the other one is ended too


def test_an_old_revision_without_pace_is_recognised():
    from gembench.harness.continuous.interleave import WorkerFailed

    old = WorkerFailed.__new__(WorkerFailed)
    old.code, old.stderr = 2, "gembench run: error: unrecognized arguments: --pace 5,8 --burst 20\n"
    assert old.predates_pacing
    old.code = 1
    assert not old.predates_pacing


def test_pace_refuses_what_it_cannot_drive(capsys):
    code, _, err = run_cli(["run", "--config", "tiny", "--pace", "x", "--steps", "1"], capsys)
    assert code == 2 and "--pace x: --pace takes two file descriptors R,W" in err
    code, _, err = run_cli(["run", "--config", "tiny", "--pace", "5,6", "--nproc", "2"], capsys)
    assert code == 2 and "cannot drive --nproc" in err


def _running_children(pid: int) -> list[str]:
    """The pids of ``pid``'s children that have become a `gembench run --pace` (exec'd, not just forked)."""
    out = []
    for child in subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True
    ).stdout.split():
        try:
            if b"--pace" in Path(f"/proc/{child}/cmdline").read_bytes():
                out.append(child)
        except OSError:  # ended meanwhile
            pass
    return out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_removes_worktrees_and_ends_the_running_process(clone, sig):
    """Signalled once both pairs run (not while a child is being started, where interrupts are held
    anyway): the command ends every process, removes its worktrees and exits 130."""
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gembench",
            "continuous",
            "HEAD",
            "HEAD",
            "--repo",
            str(clone),
            "--stack",
            "baseline",
            "--steps",
            "500",
            "--parallel",
            "2",
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
        preexec_fn=ctrl_c_reaches,  # from a background shell (SIGINT ignored), Ctrl-C must still reach it
    )
    try:
        first = proc.stderr.readline()
        assert "pairs of processes (ABBA)" in first, first
        paths = [ln.split(" ", 1)[1] for ln in _worktrees(clone)[1:]]
        assert len(paths) == 2 and all(Path(p).exists() for p in paths)
        children = []
        deadline = time.monotonic() + 120
        while len(children) < 4 and time.monotonic() < deadline:  # two pairs of benchmark processes
            children = _running_children(proc.pid)
            time.sleep(0.1)
        assert len(children) == 4, children
        os.kill(proc.pid, sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert len(_worktrees(clone)) == 1 and not any(Path(p).exists() for p in paths)
    assert not Path(paths[0]).parent.exists()  # the temporary folder too
    for pid in children:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_real_run_over_head_1_head_of_a_clone(clone, capsys):
    """Two rounds of tiny (baseline stack: no compile) with 2 steps: ~1 minute on 2 idle cores."""
    code, out, err = run_cli(
        [
            "continuous",
            "HEAD~1",
            "HEAD",
            "--repo",
            str(clone),
            "--steps",
            "2",
            "--rounds",
            "2",
            "--stack",
            "baseline",
            "--format",
            "json",
        ],
        capsys,
    )
    assert code in (0, 1, 4, 5), err  # 5: HEAD~1 may be a commit that changed the numerics
    import json

    doc = json.loads(out)
    assert doc["rounds"] == 2 and doc["head"]["sha"] == _git(clone, "rev-parse", "HEAD") and doc["interleaved"] is True
    row = doc["rows"][0]
    assert row["metric"] == "step_time_s" and len(row["round_ratios"]) == 2 and row["ratio"] > 0
    assert doc["numerics"]["steps"] == 2 and doc["numerics"]["verdict"] != "unreproducible"  # paced: bit for bit
    assert "then taking turns of 2 step(s), 1 each" in err  # both processes at once
    assert "pair 2/2 (HEAD first)" in err and "min left" in err  # progress, ABBA: pair 2 starts with HEAD
    assert len(_worktrees(clone)) == 1


def test_a_revision_older_than_pace_makes_every_round_sequential(clone, capsys):
    """As `continuous <a commit from before --pace> HEAD`: the old revision refuses --pace, and the rounds
    run one process after the other instead, with a notice (two rounds of tiny baseline, 2 steps)."""
    run_py = clone / "harness" / "commands" / "run.py"
    text = run_py.read_text()
    flag = re.compile(r'paced\.add_argument\(\s*"--pace",')
    assert flag.search(text)
    run_py.write_text(flag.sub('paced.add_argument("--no-such-pace", dest="pace",', text))
    _git(clone, "commit", "--quiet", "-am", "as before --pace")
    code, out, err = run_cli(
        [
            "continuous",
            "HEAD",
            "HEAD~1",
            "--repo",
            str(clone),
            "--steps",
            "2",
            "--rounds",
            "2",
            "--stack",
            "baseline",
            "--format",
            "json",
        ],
        capsys,
    )
    assert code in (0, 1, 4), err
    assert "predates --pace: every pair runs its two processes one after the other" in err
    import json

    doc = json.loads(out)
    assert doc["interleaved"] is False and len(doc["rows"][0]["round_ratios"]) == 2
    assert len(_worktrees(clone)) == 1


def test_child_env_sets_threads_and_only_the_revision_path(tmp_path, monkeypatch):
    from gembench.harness.continuous.pairs import child_env

    monkeypatch.setenv("GEMBENCH_COMMIT", "f" * 40)  # would make the result claim another commit
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    env = child_env(tmp_path, 1)
    assert env["OMP_NUM_THREADS"] == "1" and env["PYTHONPATH"] == str(tmp_path) and "GEMBENCH_COMMIT" not in env
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert "OMP_NUM_THREADS" not in child_env(tmp_path)  # no --threads: torch's own default
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert child_env(tmp_path)["OMP_NUM_THREADS"] == "3"  # nor does it change the user's
    assert env["PYTHONHASHSEED"] == os.environ.get("PYTHONHASHSEED", "0")  # one seed for both revisions


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs, Linux"
)
def test_a_pair_is_pinned_to_one_cpu_once_warm(tmp_path):
    """Both processes of a pair end up on the same CPU (the one they are given), every thread of them."""
    from gembench.harness.continuous import interleave
    from gembench.harness.continuous.pairs import pair_cpu

    cpus = sorted(os.sched_getaffinity(0))
    assert [pair_cpu(i) for i in range(4)] == [cpus[i % len(cpus)] for i in range(4)]
    side_by_side = [pair_cpu(i, 2) for i in range(4)]  # pairs (0, 1) then (2, 3) at once
    assert len(set(side_by_side[:2])) == len(set(side_by_side[2:])) == 2  # a CPU each
    assert side_by_side[0] != side_by_side[2]  # the pair that starts with BASE changes CPU
    log, workers = _fake_workers(tmp_path, steps=4, burst=2)
    try:
        interleave.wait_ready(workers, time.monotonic() + 60)  # after their first "ready": warm, not yet timing
        interleave.pin(workers, cpus[1])
        for w in workers:
            for tid in os.listdir(f"/proc/{w.proc.pid}/task"):
                assert os.sched_getaffinity(int(tid)) == {cpus[1]}
    finally:
        interleave.close(workers)


def _planted(clone, old: str, new: str, message: str) -> None:
    """A throwaway commit of the clone that replaces ``old`` by ``new`` in tiny's Wukong block."""
    wukong = clone / "models" / "wukong.py"
    text = wukong.read_text()
    assert text.count(old) == 1, old
    wukong.write_text(text.replace(old, new))
    _git(clone, "commit", "--quiet", "-am", message)


QUICK = ["--steps", "3", "--rounds", "2", "--stack", "baseline", "--min-effect", "0.5", "--margin", "0.5", "--quiet"]


def test_a_commit_that_changes_the_loss_but_not_the_speed_is_a_numerics_change(clone, capsys):
    """Another initial scale of a weight: the same ops, the same speed, other losses: exit 5 (tiny
    baseline, 2 pairs of 3 steps; a 50% --min-effect keeps timing noise from deciding)."""
    _planted(clone, "nn.init.xavier_uniform_(self.fm_proj)", "nn.init.xavier_uniform_(self.fm_proj, gain=2.0)", "init")
    code, out, err = run_cli(["continuous", "HEAD~1", "HEAD", "--repo", str(clone), *QUICK], capsys)
    assert code == 5, out + err
    assert re.search(r"numerics changed: first at step 3 \(loss, pair \d\), BASE [\d.]+ vs HEAD [\d.]+", out), out
    assert "continuous: NUMERICS CHANGED" in out and "aten ops changed" not in out


def test_an_added_op_is_named_by_its_aten_name(clone, capsys):
    """`res * 1.0` in the Wukong block: exact, so the losses stay bit for bit, but aten_ops grows and
    the verdict names aten.mul.Tensor (two layers, forward and backward)."""
    _planted(clone, "torch.cat([fmb, lcb], dim=1) + res)", "torch.cat([fmb, lcb], dim=1) + res * 1.0)", "op")
    code, out, err = run_cli(["continuous", "HEAD~1", "HEAD", "--repo", str(clone), *QUICK], capsys)
    assert code == 1, out + err
    assert "numerics unchanged: 3 steps' losses, max |rel diff| 0.0e+00 within fp32's tolerance" in out, out
    assert re.search(
        r"aten ops changed per step \([\d,]+ -> [\d,]+\):\n  aten\.mul\.Tensor \d+ -> \d+ \((added|changed)\)", out
    )


def test_where_start_up_is_judged_each_revision_compiles_into_a_cache_of_its_own(tmp_path, monkeypatch):
    from gembench.harness.continuous.config import Measuring
    from gembench.harness.continuous.pairs import revision_env
    from gembench.harness.continuous.worktrees import Checkout

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "users-cache"))
    caches = set()
    for model in (None, "din.py:din"):
        for label in ("BASE", "HEAD"):
            c = Checkout(label, label, "0" * 40, tmp_path / label.lower(), tmp_path / f"path-{label.lower()}")
            env = revision_env(Measuring(pairs=2, model=model, metrics=("step_time_s", "startup_s")), c)
            assert Path(env["TORCHINDUCTOR_CACHE_DIR"]).parent == tmp_path
            caches.add((model, env["TORCHINDUCTOR_CACHE_DIR"]))
            # judging steps alone, both share the user's cache: what was compiled before is warm
            shared = revision_env(Measuring(pairs=2, model=model, metrics=("step_time_s",)), c)
            assert shared["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "users-cache")
    assert len({cache for _, cache in caches}) == 2  # one per revision, whatever it runs


def test_where_start_up_is_not_judged_processes_serve_the_peaks_the_parent_probed(tmp_path, monkeypatch):
    from gembench.harness.continuous.config import Measuring
    from gembench.harness.continuous.pairs import revision_env
    from gembench.harness.continuous.worktrees import Checkout
    from gembench.harness.device.calibration import PROBED_ENV

    monkeypatch.setenv(PROBED_ENV, "inherited from the shell")
    c = Checkout("HEAD", "HEAD", "0" * 40, tmp_path / "head", tmp_path / "path-head")
    probed = "2.13.0 bf16/1 fp32/1 triad/1"
    assert revision_env(Measuring(pairs=2, peaks_probed=probed), c)[PROBED_ENV] == probed
    judged = Measuring(pairs=2, metrics=("step_time_s", "startup_s"), peaks_probed=probed)
    assert PROBED_ENV not in revision_env(judged, c)  # start-up judged: each process probes, as any run
    assert PROBED_ENV not in revision_env(Measuring(pairs=2), c)  # nothing probed here


@pytest.mark.parametrize("metrics, warmed", [(("step_time_s",), False), (("step_time_s", "startup_s"), True)])
def test_where_start_up_is_judged_each_revisions_cache_is_warmed_first(tmp_path, monkeypatch, metrics, warmed):
    """Side by side, the first batch's pairs would race to fill each revision's empty compile cache
    (one process compiling cold, the other not): a short untimed process per revision comes first."""
    from gembench.harness.continuous import pairs
    from gembench.harness.continuous.config import Measuring
    from gembench.harness.continuous.worktrees import Checkout
    from gembench.harness.regression import paired

    co = {
        label: Checkout(label, label, "0" * 40, tmp_path / label.lower(), tmp_path / f"path-{label.lower()}")
        for label in pairs.LABELS
    }
    (tmp_path / "base").mkdir()
    calls = []

    def process(cmd, env, cwd, timeout):
        calls.append((cmd, env["TORCHINDUCTOR_CACHE_DIR"]))
        return 0, ""

    def batch(m, co, batch, folder):  # the pairs themselves: not what is under test
        for _, outs, _, _ in batch:
            for out in outs.values():
                out.write_text("{}")
        return True

    monkeypatch.setattr(pairs, "run_process", process)
    monkeypatch.setattr(pairs, "interleaved_pairs", batch)
    monkeypatch.setattr(pairs, "checked_result", lambda c, label, out: {})
    monkeypatch.setattr(paired, "process_value", lambda result, metric, statistic: None)
    rounds, _ = pairs.run_pairs(Measuring(pairs=2, parallel=2, metrics=metrics, steps=40), co, lambda text: None)
    assert len(rounds) == 2
    if not warmed:
        assert calls == []
        return
    assert [cache for _, cache in calls] == [str(tmp_path / "compile-cache-base"), str(tmp_path / "compile-cache-head")]
    for cmd, _ in calls:
        assert cmd[cmd.index("--steps") + 1] == "1" and cmd[cmd.index("--warmup") + 1] == "1"


def _lived_rounds(pairs, steps, process_noise, step_noise, seed=0):
    """Pairs of processes whose steps carry a factor of their process's own and one of each step."""
    rng = random.Random(seed)

    def process():
        own = rng.lognormvariate(0, process_noise)
        return {"samples": {"step_s": [0.01 * own * rng.lognormvariate(0, step_noise) for _ in range(steps)]}}

    return [(process(), process()) for _ in range(pairs)]


def test_halving_pays_where_the_processes_carry_the_noise_not_where_the_steps_do():
    # a pair: 2 x 200 steps of 10 ms timed, 6 s of start-ups: half as long costs 8 of its 10 s
    lived = paired.halving(_lived_rounds(40, 200, 0.02, 0.01), "step_time_s", "fast-half", 10.0)
    assert lived.pays and lived.variance_ratio < 1.25 and lived.cost_ratio == pytest.approx(1.25, rel=0.02)
    stepwise = paired.halving(_lived_rounds(40, 200, 0.0, 0.05, seed=1), "step_time_s", "fast-half", 10.0)
    assert not stepwise.pays and stepwise.variance_ratio > 1.6
    assert paired.halving(_lived_rounds(3, 200, 0.02, 0.01), "step_time_s", "fast-half", 10.0) is None  # too few


@pytest.mark.parametrize(
    "process_noise, step_noise, halve, halved",
    [(0.02, 0.01, True, True), (0.0, 0.05, True, False), (0.02, 0.01, False, False)],
)
def test_the_default_steps_are_halved_once_where_the_pairs_say_it_pays(
    tmp_path, monkeypatch, process_noise, step_noise, halve, halved
):
    """From the first look on, pairs whose noise their processes carry run half the steps; pairs
    whose steps carry it, or steps the user gave (halve_steps off), keep theirs."""
    from gembench.harness.continuous import pairs
    from gembench.harness.continuous.config import Measuring

    lived = iter(r for pair in _lived_rounds(8, 400, process_noise, step_noise) for r in pair)
    steps_run, said = [], []

    def batch(m, co, batch, folder):
        steps_run.append((m.steps, m.bursts))
        for _, outs, _, _ in batch:
            for out in outs.values():
                out.write_text("{}")
        return True

    monkeypatch.setattr(pairs, "interleaved_pairs", batch)
    monkeypatch.setattr(pairs, "checked_result", lambda c, label, out: next(lived))
    monkeypatch.setattr(time, "perf_counter", iter(range(0, 10_000, 10)).__next__)  # a batch: 10 s
    (tmp_path / "base").mkdir()
    co = {label: type("C", (), {"path": tmp_path / label.lower()})() for label in pairs.LABELS}
    m = Measuring(pairs=8, parallel=2, steps=400, bursts=80, burst_steps=5, halve_steps=halve)
    rounds, _ = pairs.run_pairs(m, co, said.append)
    assert len(rounds) == 8
    expected = [(400, 80)] * 2 + [(200, 40)] * 2 if halved else [(400, 80)] * 4
    assert steps_run == expected
    assert any("the next pairs take 200 steps" in line for line in said) == halved
