"""MFU at equal work: the FLOPs a step is credited with are those that reach the loss, and a
comparison whose two sides do other model FLOPs judges time and says that the work changed.

A commit that wastes compute (a no-grad matmul, a call whose output no loss reads) is slower and
can never read as faster through MFU: its FLOPs are executed (HFU), never model FLOPs (MFU)."""

import json
import textwrap
from pathlib import Path

import pytest
import torch
from synthetic import gembench_cli, make_result, run_cli, save

REPO = Path(__file__).resolve().parents[1]
TWO_TOWER = REPO / "examples" / "two_tower.py"

# the example, and beside it the same model with a planted waste: ``waste`` no-grad matmuls of
# 384^3 in every forward (never read), and ``grow`` more trained work (the query tower run again,
# its output added at weight 0: in the loss's graph, the parameters and so the hash unchanged)
PLANTED = textwrap.dedent(
    f"""
    import importlib.util, sys, torch
    _spec = importlib.util.spec_from_file_location("two_tower_base", {str(TWO_TOWER)!r})
    tt = sys.modules["two_tower_base"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(tt)

    class Planted(tt.TwoTower):
        def __init__(self, waste=0, grow=0, **kw):
            super().__init__(**kw)
            self.waste, self.grow = waste, grow

        def forward(self, model, batch):
            q, i = model(batch)
            for _ in range(self.grow):
                q = q + 0.0 * model.query_tower(torch.ones(q.shape[0], 2 * self.dim))
            with torch.no_grad():
                w = torch.full((384, 384), 1e-3)
                for _ in range(self.waste):
                    w = w @ w
            return q, i

    def make(waste: int = 0, grow: int = 0):
        return Planted(batch=16, max_rows=500, waste=waste, grow=grow)
    """
)


def test_no_grad_work_and_unread_outputs_are_executed_not_model_flops():
    import importlib.util
    import sys

    from gembench.harness.train.work import counted_flops

    spec = importlib.util.spec_from_file_location("two_tower_base", TWO_TOWER)
    tt = sys.modules["two_tower_base"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tt)

    class Wasteful(tt.TwoTower):
        def forward(self, model, batch):
            out = model(batch)
            with torch.no_grad():
                torch.ones(64, 64) @ torch.ones(64, 64)  # 2 x 64^3
            model.item_tower(torch.zeros(4, 128))  # grad on, and no loss reads it
            return out

    clean, wasteful = tt.TwoTower(batch=8, max_rows=50), Wasteful(batch=8, max_rows=50)
    torch.manual_seed(0)
    model = clean.build(torch.device("cpu"))
    batch = clean.batch(0)
    a, b = counted_flops(clean, model, batch), counted_flops(wasteful, model, batch)
    assert a.untrained == {} and a.trained == b.trained  # the waste credits no model FLOP
    tower = 2 * 4 * (128 * 256 + 256 * 128)  # the item tower at 4 rows: two linears
    assert b.untrained == {"other": 2 * 64**3, "item_tower": tower}


def test_the_padding_a_stack_computes_is_executed_not_model_flops():
    """The baseline stack's padded attention computes every padded position: the same model
    FLOPs as the jagged kernel (the formula's), the padding beyond them executed (HFU)."""
    from gembench.harness.train.stack import STACKS, autocast_for
    from gembench.harness.train.work import stack_flops
    from gembench.models.config import load_config
    from gembench.models.zoo import ZooWorkload

    workload, cpu = ZooWorkload(load_config("tiny")), torch.device("cpu")
    batches = [workload.batch(0)]
    work = {}
    for name in ("optimized", "baseline"):
        options = STACKS[name]
        work[name] = stack_flops(workload, workload.for_stack(options), batches, autocast_for(options, cpu), cpu, 0)
    jagged, padded = work["optimized"], work["baseline"]
    assert padded.per_batch == jagged.per_batch and padded.basis == "formula"
    assert jagged.beyond_formula == 0.0 and padded.beyond_formula > 0.01 * sum(padded.per_batch[0].values())


def _run(tmp_path: Path, name: str, *model_args: str) -> dict:
    out = tmp_path / f"{name}.json"
    args = [a for pair in model_args for a in ("--model-arg", pair)]
    proc = gembench_cli(
        "run", "--model", f"{tmp_path / 'planted.py'}:make", *args, "--steps", "24", "--warmup", "2",
        "--set", "compile=off", "--quiet", "--out", str(out), "--peak-tflops", "1",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


@pytest.mark.xdist_group("planted")
def test_the_gate_fails_a_planted_wasted_matmul_and_names_a_change_of_work(tmp_path, capsys):
    (tmp_path / "planted.py").write_text(PLANTED)
    clean, wasteful, grown = (
        _run(tmp_path, "clean"),
        _run(tmp_path, "waste", "waste=20"),
        _run(tmp_path, "grow", "grow=2"),
    )

    # the waste: the same model FLOPs, the 20 matmuls executed beyond them. MFU credits the model
    # FLOPs alone at the step's own time, HFU adds what was executed: both identities hold whatever
    # the load (the two runs' times, taken minutes apart on a shared runner, are the benchmarks' to
    # compare: a load spike once made the clean run 88x slower than here)
    model, waste = clean["flops"]["model_per_step"], 20 * 2 * 384**3
    assert wasteful["flops"]["model_per_step"] == model
    assert wasteful["flops"]["untrained_per_block"] == {"other": waste}
    for r in (clean, wasteful):
        assert r["summary"]["mfu"] == pytest.approx(model / (r["summary"]["step_time_s"]["p50"] * 1e12))
    assert wasteful["summary"]["hfu"] == pytest.approx(wasteful["summary"]["mfu"] * (model + waste) / model)

    # the gate fails it on the exact op count, which no load can hide, and names the FLOPs it wastes
    code, out, _ = run_cli(["gate", str(tmp_path / "waste.json"), "--baseline", str(tmp_path / "clean.json")], capsys)
    assert code == 1, out
    failed = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert any("vs baseline aten_ops: regressed" in line and "exact count" in line for line in failed), out
    assert "(the same work); run executes 2.265 GFLOP more beyond them (other +2.265 GFLOP)" in out, out

    # more trained work: MFU is not judged, step time is, and the line says which block grew
    code, out, _ = run_cli(["compare", str(tmp_path / "clean.json"), str(tmp_path / "grow.json")], capsys)
    assert "work changed: B does" in out and "more model FLOPs per step than A" in out and "query_tower +" in out
    assert "| mfu" not in out and "not judged" in out.split("mfu", 1)[1].splitlines()[0]
    assert "step_time_s" in out
    code, out, _ = run_cli(["gate", str(tmp_path / "grow.json"), "--baseline", str(tmp_path / "clean.json")], capsys)
    assert "SKIP           vs baseline mfu: work changed: the run does" in out
    assert grown["flops"]["per_block"]["query_tower"] > clean["flops"]["per_block"]["query_tower"]


def test_a_gate_threshold_on_mfu_holds_at_the_baselines_flops(tmp_path, capsys):
    """A run that does 2x the baseline's model FLOPs in the same time would double its MFU: held at
    the baseline's FLOPs, its MFU is the baseline's, and a threshold above that fails."""
    from gembench.harness.commands.promote import promote

    baseline, _ = promote([make_result(f"b{i}", seed=i) for i in range(3)], tmp_path / "baselines")
    doubled = [make_result(f"r{i}", seed=10 + i, flops_per_step=2e9) for i in range(3)]
    paths = [save(tmp_path, r) for r in doubled]
    thresholds = tmp_path / "t.toml"
    thresholds.write_text("[defaults]\nmin_mfu = 0.12\n")  # the baseline's MFU is 0.1, the run's own 0.2
    code, out, _ = run_cli(["gate", *paths, "--baseline", str(baseline), "--thresholds", str(thresholds)], capsys)
    assert (
        "FAIL           min_mfu: mfu 0.09" in out and "held at the baseline's model FLOPs: the run does 100.0%" in out
    )
    assert code == 1


def test_continuous_judges_step_time_where_head_does_other_work():
    """`continuous --metric mfu` on a HEAD that adds trained FLOPs: its MFU could only rise."""
    from types import SimpleNamespace

    from gembench.harness.continuous.verdict import judged_metrics, work_changed

    same = [(make_result("b", seed=1), make_result("h", seed=2))]
    more = [(make_result("b", seed=1), make_result("h", seed=2, flops_per_step=1.35e9))]
    m = SimpleNamespace(metrics=("mfu", "aten_ops"))
    assert judged_metrics(m, same) == ["mfu", "aten_ops"] and work_changed(same) is None
    assert judged_metrics(m, more) == ["step_time_s", "aten_ops"]
    assert work_changed(more).line("HEAD", "BASE").startswith("HEAD does 35.0% more model FLOPs per step than BASE")


def test_the_same_work_line_names_what_a_side_executes_beyond_it():
    from gembench.harness.regression.work import side_by_side

    same = side_by_side(1e9, 1e9, "BASE", "HEAD", ({"padding": 3e8}, {"other": 2e9, "padding": 1e8}))
    assert same == (
        "model FLOPs per step: BASE 1 GFLOP, HEAD 1 GFLOP (the same work); HEAD executes 1.8 GFLOP more "
        "beyond them (other +2 GFLOP, padding -0.2 GFLOP): HFU counts it, MFU does not"
    )
    assert side_by_side(1e9, 1e9, beyond=({"other": 5.0}, {"other": 5.0})).endswith("(the same work)")
