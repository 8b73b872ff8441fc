"""The op table: each op of the op step with its time, FLOPs, bytes, stage and block, held
against the roofline; its FLOPs add up to the step's model FLOPs."""

import pytest
import torch
from torch import nn

from gembench.harness.metrics import ops


class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(64, 32, bias=False), nn.Linear(32, 8, bias=False)


def test_the_recorder_files_each_op_under_its_stage_and_block_with_its_flops_and_bytes():
    torch.manual_seed(0)
    model, x = Two(), torch.randn(16, 64)
    recorder = ops.OpRecorder(torch.device("cpu"), model=model)
    with recorder:
        h = model.first(x)
        recorder.stage_ended("dense_forward")
        y = model.second(h.t().t())  # two views: they move nothing
        y.sum().backward()
        recorder.stage_ended("backward")
    rows = {(r["stage"], r["block"], r["op"]): r for r in ops.table(recorder.calls, 1.0, 10.0)}
    first = rows[("dense_forward", "first", "aten.mm.default")]
    assert first["flops"] == 2 * 16 * 64 * 32 and first["calls"] == 1
    assert first["read"] == 4 * (16 * 64 + 64 * 32) and first["written"] == 4 * 16 * 32
    views = [r for (stage, _, op), r in rows.items() if op.startswith(("aten.t.", "aten.transpose."))]
    assert views and all(r["read"] == r["written"] == 0 for r in views)
    # the backward's matmuls run under the modules they belong to
    backward = sum(r["flops"] for (stage, block, _), r in rows.items() if stage == "backward" and block == "first")
    assert backward == 2 * 16 * 64 * 32  # the weight's gradient (the input needs none)
    assert recorder.own_s > 0


def test_a_compiled_graphs_fused_cpu_kernels_are_timed_in_their_stage():
    import torch._inductor.config

    torch._dynamo.reset()
    with torch._inductor.config.patch({"cpp.enable_kernel_profile": True}):
        f = torch.compile(lambda x: torch.nn.functional.silu(x * 2 + 1).sum(), dynamic=False)
        x = torch.randn(512, 64)
        f(x)  # compiled before the recorder, as after a run's warm-up
        recorder = ops.OpRecorder(torch.device("cpu"))
        with recorder:
            torch.randn(4, 4).mm(torch.randn(4, 4))
            recorder.stage_ended("sparse_forward")
            f(x)
            recorder.stage_ended("dense_forward")
    rows = ops.table(recorder.calls, 1.0, 10.0)
    fused = [r for r in rows if r["op"].startswith(ops.FUSED_OP)]
    assert fused and all(r["stage"] == "dense_forward" and r["bound"] == "memory" for r in fused), rows
    # the buffers each kernel is handed: x read (fp32), and the 4-byte sum written
    assert sum(r["read"] for r in fused) == 512 * 64 * 4 and sum(r["written"] for r in fused) == 4, fused
    assert all(0 < r["bound_s"] and r["lost_s"] == pytest.approx(max(r["time_s"] - r["bound_s"], 0.0)) for r in fused)
    assert {r["stage"] for r in rows if r["op"] == "aten.mm.default"} == {"sparse_forward"}
    # the kernels are put back after the op step: a call outside it notes nothing
    f(x)
    assert not any(recorder._kernel_bytes.calls.values())


def test_a_generated_module_whose_file_is_gone_is_passed_over(monkeypatch, tmp_path):
    import types

    from torch._inductor.codecache import PyCodeCache

    from gembench.harness.metrics.fused import KernelBytes

    gone = types.ModuleType("gone")
    gone.__file__ = str(tmp_path / "removed.py")  # its cache folder cleaned since it was loaded
    monkeypatch.setattr(PyCodeCache, "modules", [*PyCodeCache.modules, gone])
    with KernelBytes() as kb:
        assert kb.take("graph_0_cpp_fused_x_0") == (0, 0)


def test_a_fused_kernel_compiled_during_the_op_step_keeps_its_bytes_unseen():
    import torch._inductor.config

    torch._dynamo.reset()
    with torch._inductor.config.patch({"cpp.enable_kernel_profile": True}):
        f = torch.compile(lambda x: torch.nn.functional.silu(x * 3 - 1).sum(), dynamic=False)
        recorder = ops.OpRecorder(torch.device("cpu"))
        with recorder:
            f(torch.randn(256, 32))  # compiled inside the op step: its module was not there to wrap
            recorder.stage_ended("dense_forward")
    fused = [r for r in ops.table(recorder.calls, 1.0, 10.0) if r["op"].startswith(ops.FUSED_OP)]
    assert fused and all(r["bound"] == "fused" and r["lost_s"] == r["time_s"] for r in fused), fused


def test_an_op_is_held_against_the_lower_of_its_two_roofs():
    calls = [
        ["aten.mm.default", "backward", "b", 2.0, 4e12, 1e9, 0, False],  # 1 s at a 4 TFLOP/s peak
        ["aten.add.Tensor", "backward", "b", 1.0, 0.0, 5e9, 5e9, False],  # 10 GB at 20 GB/s: 0.5 s
    ]
    rows = {r["op"]: r for r in ops.table(calls, 4.0, 20.0)}
    mm, add = rows["aten.mm.default"], rows["aten.add.Tensor"]
    assert mm["bound"] == "compute" and mm["bound_s"] == pytest.approx(1.0) and mm["lost_s"] == pytest.approx(1.0)
    assert add["bound"] == "memory" and add["bound_s"] == pytest.approx(0.5) and add["lost_s"] == pytest.approx(0.5)
    assert [r["op"] for r in ops.table(calls, 4.0, 20.0)] == ["aten.mm.default", "aten.add.Tensor"]  # by time lost
    assert mm["intensity"] == pytest.approx(4e3) and mm["tflops"] == pytest.approx(2.0)


def test_a_runs_op_table_adds_up_to_its_model_flops_and_is_printed(tiny_run):
    proc, result, _ = tiny_run
    o = result["ops"]
    s = o["summary"]
    want = s["model_flops"] + s["recomputed_flops"] + s["executed_beyond_model_flops"]
    assert s["flops"] == pytest.approx(want, rel=0.01)
    assert {r["stage"] for r in o["rows"]} >= {"sparse_forward", "dense_forward", "backward", "optimizer"}
    assert 0 < s["coverage"] <= 1.05 and s["lost_s"] <= s["time_s"]
    assert result["peak"]["bandwidth"]["gbs"] > 0
    assert "where the op step's time goes" in proc.stdout and "lost ms" in proc.stdout


def test_the_html_report_shows_a_runs_op_table(tiny_run, tmp_path, capsys):
    from synthetic import run_cli

    _, result, path = tiny_run
    code, _, err = run_cli(["report", str(path), "--out", str(tmp_path / "rep")], capsys)
    assert code == 0, err
    page = (tmp_path / "rep" / "index.html").read_text()
    top = result["ops"]["rows"][0]["op"]
    assert "<h3>op table</h3>" in page and "lost ms" in page and top[:40] in page
    assert "the ops&#x27; time covers" in page


def _with_ops(result: dict, slow: float, seed: int) -> dict:
    """``result`` with an op table of three ops, the backward matmul ``slow`` x its time, a little
    noise (``seed``) on every op."""
    import random

    rng = random.Random(seed)
    rows = [
        ("dense_forward", "over_arch", "aten.addmm.default", 0.004),
        ("backward", "over_arch", "aten.mm.default", 0.006 * slow),
        ("optimizer", "other", "aten._fused_adam_.default", 0.002),
    ]
    result["ops"] = {
        "rows": [
            {"stage": s, "block": b, "op": op, "time_s": t * (1 + rng.uniform(-0.01, 0.01))} for s, b, op, t in rows
        ]
    }
    return result


def test_a_verdict_names_the_op_whose_time_changed_with_its_stage_and_block():
    """A slowdown planted in one op (the backward matmul, 1.5 x) is the first op compare and
    continuous name, with its stage and block; in continuous's pairs with an interval."""
    from synthetic import make_result

    from gembench.harness.regression import compare, opdiff
    from gembench.harness.report.verdicts import render_changes, render_table

    base = [_with_ops(make_result(f"a{i}", seed=i), 1.0, i) for i in range(4)]
    head = [_with_ops(make_result(f"b{i}", step_s=0.103, seed=10 + i), 1.5, 10 + i) for i in range(4)]
    c = compare.compare(base, head)
    first = c.op_times[0]
    assert (first["op"], first["stage"], first["block"]) == ("aten.mm.default", "backward", "over_arch")
    assert first["delta_s"] == pytest.approx(0.003, rel=0.05) and first["ci_s"] is None  # unpaired
    text = render_table(c, "table")
    assert "ops whose time changed most" in text
    assert (
        "aten.mm.default in backward / over_arch: 6.0" in text.split("ops whose time changed most")[1].splitlines()[1]
    )
    section = opdiff.section(list(zip(base, head)))
    lo, hi = section["times"][0]["ci_s"]
    assert section["times"][0]["op"] == "aten.mm.default" and 0.0025 < lo < 0.003 < hi < 0.0035
    lines = render_changes({"verdict": "not compared", "reason": "x"}, section, "table")
    assert "aten.mm.default in backward / over_arch" in lines and "95% interval" in lines
    # an op only one side runs is named as added or removed
    head[0]["ops"]["rows"].append({"stage": "loss", "block": "other", "op": "aten.exp.default", "time_s": 0.01})
    added = next(t for t in opdiff.time_changes(base, head, paired=True) if t["op"] == "aten.exp.default")
    assert added["kind"] == "added"
