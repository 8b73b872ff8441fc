"""The numerics and changed ops of `gembench continuous`, in-process on synthetic results."""

import math

import pytest
from synthetic import make_result, run_cli

from gembench.harness.regression import numerics, opdiff
from gembench.harness.report.verdicts import render_changes

LOSSES = [0.42, 0.34, 0.37, 0.35, 0.29]


def _with_losses(losses, dtype="fp32", rid="r", tasks=2, **run):
    r = make_result(rid, steps=len(losses))
    r["samples"]["loss"] = list(losses)
    r["samples"]["task_loss"] = [[x] * tasks if x is not None else [None] * tasks for x in losses]
    r["run"].update(dtype=dtype, **run)
    return r


def _pairs(base, head, n=2, **kw):
    return [(_with_losses(base, rid=f"b{k}", **kw), _with_losses(head, rid=f"h{k}", **kw)) for k in range(n)]


def test_equal_losses_are_unchanged_and_the_tolerance_is_the_dtypes():
    n = numerics.judge(_pairs(LOSSES, LOSSES))
    assert n["verdict"] == "unchanged" and n["max_rel_diff"] == 0 and n["steps"] == 5
    assert n["tolerance"] == numerics.TOLERANCE["fp32"] and n["dtype"] == "fp32"
    text = render_changes(n, opdiff.section(_pairs(LOSSES, LOSSES)), "table")
    assert "numerics unchanged: 5 steps' losses, max |rel diff| 0.0e+00 within fp32's tolerance 1e-05" in text
    # within bf16's tolerance, beyond fp32's
    near = [x * (1 + 5e-5) for x in LOSSES]
    assert numerics.judge(_pairs(LOSSES, near, dtype="bf16"))["verdict"] == "unchanged"
    assert numerics.judge(_pairs(LOSSES, near))["verdict"] == "changed"
    assert numerics.judge(_pairs(LOSSES, near), tol=1e-4)["verdict"] == "unchanged"  # --loss-tolerance
    assert numerics.tolerance(["fp32", "bf16"]) == numerics.TOLERANCE["bf16"]  # the looser one


def test_a_change_names_its_first_step_and_both_values():
    head = LOSSES[:2] + [0.38] + LOSSES[3:]
    head[4] = 0.5  # a later, bigger difference: the first one is named
    n = numerics.judge(_pairs(LOSSES, head))
    assert n["verdict"] == "changed" and n["first"]["timed_step"] == 2 and n["first"]["step"] == 2 + 2  # warm-up 2
    assert n["first"]["base"] == 0.37 and n["first"]["head"] == 0.38
    assert n["first"]["rel_diff"] == pytest.approx(0.01 / 0.38) and n["max_rel_diff"] == pytest.approx(0.21 / 0.5)
    assert numerics.exit_status(0, n) == 5 and numerics.exit_status(4, n) == 5
    assert numerics.exit_status(1, n) == 1 and numerics.exit_status(0, n, fail=False) == 0
    line = render_changes(n, {"recorded": False, "changes": []}, "markdown").splitlines()[1]
    assert line == (
        "- numerics changed: first at step 4 (loss, pair 1), BASE 0.37 vs HEAD 0.38 "
        "(rel diff 2.6e-02 > fp32's tolerance 1e-05)"
    )


def test_one_tasks_loss_and_non_finite_losses_count():
    base, head = _pairs(LOSSES, LOSSES, n=1)[0]
    head["samples"]["task_loss"][1][1] = 0.5
    n = numerics.judge([(base, head)])
    assert n["verdict"] == "changed" and n["first"]["series"] == "task1 loss" and n["first"]["timed_step"] == 1
    both_nan = numerics.judge(_pairs(LOSSES[:2] + [None], LOSSES[:2] + [None]))
    assert both_nan["verdict"] == "unchanged"
    one_nan = numerics.judge(_pairs(LOSSES, LOSSES[:2] + [None] + LOSSES[3:]))
    assert one_nan["verdict"] == "changed" and one_nan["first"]["rel_diff"] == math.inf
    assert "BASE 0.37 vs HEAD non-finite" in render_changes(one_nan, {"recorded": False, "changes": []}, "table")


def test_a_revision_whose_own_processes_disagree_is_unreproducible():
    rounds = _pairs(LOSSES, LOSSES, n=3)
    rounds[2][1]["samples"]["loss"][3] += 1e-3
    n = numerics.judge(rounds)
    assert n["verdict"] == "unreproducible" and n["first"]["within"] == "HEAD" and n["first"]["pair"] == 3
    assert "HEAD's processes differ among themselves (pair 1 against pair 3)" in n["reason"]
    assert numerics.exit_status(0, n) == 5


def test_losses_that_cannot_be_compared_are_said_so():
    rounds = _pairs(LOSSES, LOSSES)
    del rounds[0][1]["samples"]["loss"], rounds[0][1]["samples"]["task_loss"]
    n = numerics.judge(rounds)
    assert n["verdict"] == "not compared" and n["reason"] == "HEAD recorded no per-step losses"
    assert numerics.exit_status(0, n) == 0
    n = numerics.judge([(_with_losses(LOSSES, seed=0), _with_losses(LOSSES, seed=1))])
    assert n["verdict"] == "not compared" and "different run.seed" in n["reason"]


def _ops(**counts):
    r = make_result(counters={"aten_ops": sum(counts.values())})
    r["counters"]["aten_op_counts"] = counts
    return r


def test_ops_added_removed_and_changed_biggest_first_top_ten_in_the_verdict():
    base = {"aten.mm.default": 12, "aten.relu.default": 4, "aten.sum.default": 1}
    head = {"aten.mm.default": 14, "aten.sum.default": 1, "aten.mul.Tensor": 1}
    rounds = [(_ops(**base), _ops(**head)), (_ops(**base), _ops(**head))]
    s = opdiff.section(rounds)
    assert s["recorded"] and (s["base_total"], s["head_total"]) == (17, 16)
    assert [(c["op"], c["kind"], c["delta"]) for c in s["changes"]] == [
        ("aten.relu.default", "removed", -4),
        ("aten.mm.default", "changed", 2),
        ("aten.mul.Tensor", "added", 1),
    ]
    text = render_changes({"verdict": "not compared", "reason": "x"}, s, "table")
    assert "aten ops changed per step (17 -> 16):\n  aten.relu.default 4 -> 0 (removed)" in text
    assert "  aten.mul.Tensor 0 -> 1 (added)" in text
    many = {f"aten.op{k:02d}.default": k + 1 for k in range(12)}
    s = opdiff.section([(_ops(), _ops(**many))])
    text = render_changes({"verdict": "not compared", "reason": "x"}, s, "markdown")
    assert "the top 10 of 12 (all in --format json's op_changes)" in text and len(s["changes"]) == 12
    assert "`aten.op11.default 0 -> 12 (added)`" in text and "aten.op01.default" not in text
    assert not opdiff.section([(_ops(**base), make_result())])["recorded"]  # an older result: not listed


def test_a_loss_tolerance_that_is_not_a_relative_difference_is_refused(capsys):
    code, _, err = run_cli(["continuous", "HEAD", "HEAD", "--loss-tolerance", "2"], capsys)
    assert code == 2 and "--loss-tolerance is a relative difference (1e-3 = 0.1%), got 2.0" in err
