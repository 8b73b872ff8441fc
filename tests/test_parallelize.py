"""GEM's dense-side techniques as stack switches: activation checkpointing, FSDP2, HFU.

The checkpointing tests run in this process on tiny in fp32 without compile (seconds); the FSDP
ones run `gembench run --nproc 2` on gloo ranks, as a user would.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from synthetic import BF16_LOSS_RTOL, MEMORY_VARIANTS, gembench_cli, run_cli, zoo_state
from torch.utils.flop_counter import FlopCounterMode

from gembench.errors import UsageError
from gembench.harness.metrics.mfu import summarize, train_flops
from gembench.harness.train.measure import run_steps
from gembench.harness.train.parallelize import apply_ac
from gembench.harness.train.runconfig import RunConfig
from gembench.harness.train.stack import stack_options
from gembench.models.config import load_config
from gembench.models.data import SyntheticData
from gembench.models.flops import batch_forward_flops
from gembench.models.heads import multitask_loss
from gembench.models.zoo import ZooWorkload

CPU = torch.device("cpu")
FP32 = ("compile=off",)  # with --dtype fp32: exact arithmetic to compare, no compile to wait for


def _fp32(*switches):
    return stack_options("optimized", "fp32", FP32 + switches)


def _losses(options, steps: int = 5) -> list[float]:
    cfg = load_config("tiny")
    state = zoo_state(cfg, options, CPU)
    data = SyntheticData(cfg, seed=0, batch_size=cfg.data.global_batch)
    return run_steps(state, [data.batch(i) for i in range(steps)], steps, 0).loss


def test_blocks_are_read_off_the_model():
    cfg = load_config("tiny")
    workload = ZooWorkload(cfg)  # the zoo names its blocks off its model's structure (models/blocks.py)
    names = list(workload.blocks())
    model = zoo_state(cfg, _fp32(), CPU).model
    assert all(isinstance(model.get_submodule(n), torch.nn.Module) for n in names)
    layers = cfg.hstu.layers * len(cfg.sequences)
    assert len([n for n in names if n.startswith("sequence_arch.")]) == layers
    assert len([n for n in names if n.startswith("interaction_arch.layers.")]) == cfg.wukong.layers
    assert {"dense_arch", "nonseq_summary", "over_arch"} <= set(names)
    assert not any("sparse" in n for n in names)
    assert len(workload.checkpointed("hstu")) == layers and workload.checkpointed("none") == ()
    assert workload.checkpointed("all") == workload.blocks()


@pytest.mark.parametrize("mode", ["hstu", "all"])
def test_checkpointing_changes_no_loss_in_fp32(mode):
    off, on = _losses(_fp32()), _losses(_fp32(f"activation_checkpointing={mode}"))
    assert len(off) == 5 and np.max(np.abs(np.subtract(off, on))) <= 1e-6, (off, on)


def test_executed_flops_exceed_the_model_by_the_checkpointed_forward():
    """Counted by torch's FlopCounterMode: a training step with each HSTU layer checkpointed
    executes exactly the HSTU layers' forward once more than the same step without."""
    cfg = load_config("tiny")
    batch = SyntheticData(cfg, seed=0, batch_size=cfg.data.global_batch).batch(0)

    def counted(mode: str, backward: bool = True) -> FlopCounterMode:
        torch.manual_seed(0)
        model = zoo_state(cfg, _fp32(), CPU).model
        apply_ac(ZooWorkload(cfg), model, mode)
        with FlopCounterMode(display=False) as counter:
            loss = multitask_loss(model(batch), batch.labels)
            if backward:
                loss.backward()
        return counter

    plain, checkpointing = counted("none").get_total_flops(), counted("hstu").get_total_flops()
    per_module = counted("none", backward=False).get_flop_counts()
    hstu_forward = sum(
        sum(ops.values()) for name, ops in per_module.items() if re.fullmatch(r".*\.sequence_arch\.[^.]+", name)
    )
    assert hstu_forward > 0 and checkpointing - plain == hstu_forward
    # the analytic side: the recomputed share is the sequence arch's forward, and HFU follows it
    per_block = batch_forward_flops(cfg, batch)
    recomputed = ZooWorkload(cfg).recomputed_flops(per_block, "hstu")
    assert recomputed == per_block["sequence_arch"] > 0
    forward = sum(per_block.values())
    s = summarize([0.1], {"backward": [0.05]}, [forward], 64, 1.0, recomputed_flops=[recomputed])
    assert s["hfu"] / s["mfu"] == pytest.approx((train_flops(forward) + recomputed) / train_flops(forward))
    assert s["stages"]["backward"]["hfu"] > s["stages"]["backward"]["mfu"]
    assert summarize([0.1], {}, [forward], 64, 1.0)["hfu"] == summarize([0.1], {}, [forward], 64, 1.0)["mfu"]


@pytest.mark.parametrize(
    "switches, message",
    [
        (("dense_parallel=zero3",), "--set dense_parallel must be one of ddp, fsdp, hsdp, got 'zero3'"),
        (("activation_checkpointing=some",), "--set activation_checkpointing must be one of none, hstu, all"),
        (("compile=maybe",), "--set compile is on or off"),
        (("nothing=1",), "--set takes NAME=VALUE"),
    ],
)
def test_bad_switches_are_named(switches, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        RunConfig(switches=switches).check(distributed=False)


def test_fsdp_on_one_process_is_refused():
    with pytest.raises(UsageError, match="add --nproc 2 or more"):
        RunConfig(switches=("dense_parallel=fsdp",)).check(distributed=False)
    RunConfig(switches=("dense_parallel=fsdp",)).check(distributed=True)


def test_refusals_on_the_command_line_are_one_line_and_exit_2(capsys):
    for args, message in [
        (("--set", "dense_parallel=fsdp"), "add --nproc 2 or more"),
        (("--nproc", "2", "--set", "dense_parallel=hsdp"), "needs torchrun --nnodes 2 or more"),
    ]:
        code, _, err = run_cli(["run", "--config", "tiny", "--steps", "1", *args], capsys)  # in process
        assert code == 2 and message in err, err[-2000:]
        assert len(err.strip().splitlines()) == 1, err


def _rank_run(tmp_path, name: str, *switches: str, config: str = "tiny", dtype: str = "fp32") -> dict:
    out = tmp_path / f"{name}.json"
    args = [
        "run",
        "--config",
        config,
        "--nproc",
        "2",
        "--steps",
        "5",
        "--warmup",
        "0",
        "--dtype",
        dtype,
        "--out",
        str(out),
        "--quiet",
    ]
    for s in ("compile=off", *switches):
        args += ["--set", s]
    proc = gembench_cli(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


# the four cells the memory estimate is held on: synthetic.MEMORY_VARIANTS (test_rank_memory.py holds small on them)
VARIANTS = MEMORY_VARIANTS
# and FSDP's parity under the bf16 stack (bf16 parameters all-gathered, fp32 reduction)
BF16_VARIANTS = {"ddp bf16": (), "fsdp bf16": ("dense_parallel=fsdp",)}


@pytest.fixture(scope="module")
def tiny_ranks(tmp_path_factory):
    """tiny on 2 gloo ranks, 5 steps: the four fp32 cells, then ddp and fsdp in bf16."""
    tmp = tmp_path_factory.mktemp("ranks")
    runs = {name: _rank_run(tmp, name.replace("+", "_"), *switches) for name, switches in VARIANTS.items()}
    runs |= {
        name: _rank_run(tmp, name.replace(" ", "_"), *switches, dtype="bf16")
        for name, switches in BF16_VARIANTS.items()
    }
    return runs


def _max_loss_gap(a: dict, b: dict) -> float:
    gaps = [
        np.max(np.abs(np.subtract(x["samples"]["loss"], y["samples"]["loss"]))) for x, y in zip(a["ranks"], b["ranks"])
    ]
    assert all(len(x["samples"]["loss"]) == 5 for x in a["ranks"])
    return float(max(gaps))


def test_fsdp_trains_like_ddp_and_checkpointing_changes_nothing_on_two_ranks(tiny_ranks):
    r = tiny_ranks
    assert r["fsdp+hstu"]["run"]["options"]["dense_parallel"] == "fsdp"
    assert r["fsdp+hstu"]["run"]["options"]["activation_checkpointing"] == "hstu"
    print({pair: _max_loss_gap(r[pair[0]], r[pair[1]]) for pair in [("ddp", "fsdp"), ("fsdp", "fsdp+hstu")]})
    assert _max_loss_gap(r["ddp"], r["fsdp"]) <= 1e-4
    assert _max_loss_gap(r["fsdp"], r["fsdp+hstu"]) <= 1e-6
    s = r["fsdp+hstu"]["summary"]
    assert s["hfu"] > s["mfu"] and s["activation_bytes"] < r["fsdp"]["summary"]["activation_bytes"]
    assert r["ddp"]["summary"]["hfu"] == pytest.approx(r["ddp"]["summary"]["mfu"])
    assert _max_loss_gap(r["ddp"], r["ddp+hstu"]) <= 1e-6
    # FSDP holds half the dense state on each of 2 ranks (weights, gradients, Adam state)
    assert r["fsdp"]["summary"]["dense_state_bytes"] < 0.6 * r["ddp"]["summary"]["dense_state_bytes"]


def test_fsdp_trains_like_ddp_under_the_bf16_stack(tiny_ranks):
    """bf16 rounding differs between the two (FSDP casts the gathered weights, DDP's autocast casts
    per op), so the tolerance is the one every bf16 stack comparison uses (synthetic.BF16_LOSS_RTOL)."""
    ddp, fsdp = tiny_ranks["ddp bf16"], tiny_ranks["fsdp bf16"]
    assert fsdp["run"]["options"]["bf16"] and fsdp["run"]["options"]["dense_parallel"] == "fsdp"
    for a, b in zip(ddp["ranks"], fsdp["ranks"]):
        print(f"rank {a['rank']}: ddp {np.round(a['samples']['loss'], 5)}, fsdp {np.round(b['samples']['loss'], 5)}")
        assert b["samples"]["loss"] == pytest.approx(a["samples"]["loss"], rel=BF16_LOSS_RTOL)
    assert _max_loss_gap(ddp, fsdp) > 0  # the two really took different bf16 paths


def test_the_dense_part_communicates_by_its_own_kinds(tiny_ranks):
    ddp, fsdp = tiny_ranks["ddp"]["comm"]["by_kind"], tiny_ranks["fsdp"]["comm"]["by_kind"]
    # FSDP's gathers and reduce-scatters in place of the data-parallel all-reduce
    assert {"dense_param_all_gather", "dense_grad_reduce_scatter"} <= set(fsdp)
    assert "dense_grad_all_reduce" not in fsdp and "dense_grad_all_reduce" in ddp
    # what the sparse part sends does not change with the dense part's parallelism
    assert {k: v["bytes"] for k, v in fsdp.items() if not k.startswith("dense_")} == {
        k: v["bytes"] for k, v in ddp.items() if not k.startswith("dense_")
    }


def test_the_report_figures_the_dense_collectives(tiny_ranks, tmp_path, capsys):
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "fsdp.json").write_text(json.dumps(tiny_ranks["fsdp"]))
    code, _, err = run_cli(["report", str(runs), "--out", str(tmp_path / "rep")], capsys)
    assert code == 0, err
    page = (tmp_path / "rep" / "index.html").read_text()
    caption = re.search(r"Communication per collective.*?</figcaption>", page, re.S).group(0)
    for kind in ("dense_param_all_gather", "dense_grad_reduce_scatter", "embedding_all_to_all"):
        assert kind in caption
    # exposure is recorded per kind, so the figure splits each bar, the dense kinds' included
    assert "predates per-collective exposure" not in caption
    assert all("exposed_s" in v for v in tiny_ranks["fsdp"]["comm"]["by_kind"].values())


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_rank_records_its_memory_estimate_within_0_7_to_1_5(tiny_ranks, name):
    for rank in tiny_ranks[name]["ranks"]:
        print(
            f"{name} rank {rank['rank']}: estimate {rank['peak_memory_estimate_bytes'] / 2**20:.0f} MiB, "
            f"measured {rank['peak_memory_run_bytes'] / 2**20:.0f} MiB"
        )
        assert 0.7 <= rank["memory_estimate_ratio"] <= 1.5


def test_hsdp_replicates_across_two_torchrun_nodes(tmp_path):
    """Two torchrun agents on this host as two nodes of one rank each (c10d rendezvous, as
    multi-node jobs start): HSDP's mesh is (2 nodes, 1 rank), so the dense part is replicated
    across the nodes and all-reduced, and the run ends in one result from rank 0."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "h.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--nproc_per_node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "hsdp-test",
        "-m",
        "gembench",
        "run",
        "--config",
        "tiny",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--dtype",
        "fp32",
        "--set",
        "compile=off",
        "--set",
        "dense_parallel=hsdp",
        "--out",
        str(out),
        "--quiet",
    ]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    nodes = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)
    ]
    errors = [node.communicate(timeout=300)[1] for node in nodes]
    assert all(node.returncode == 0 for node in nodes), errors[0][-2000:] + errors[1][-2000:]
    r = json.loads(out.read_text())
    assert r["run"]["nproc"] == 2 and r["run"]["options"]["dense_parallel"] == "hsdp"
    assert "dense_grad_all_reduce" in r["comm"]["by_kind"]  # replicas across the nodes


def test_ablate_on_ranks_prints_the_goals_against_what_was_measured():
    from gembench.harness.commands.ablate_ranks import RANK_VARIANTS, REFERENCE, goals
    from gembench.harness.train.stack import STACKS, with_switches

    for _, switches, flags in RANK_VARIANTS:  # every variant is a valid run: its switches and run-config fields
        with_switches(STACKS["optimized"], switches)
        assert set(flags) <= {"pipeline"} and RunConfig(**flags).pipeline == flags.get("pipeline", False)

    def result(step, state, act, mfu, hfu):
        return {
            "summary": {
                "step_time_s": {"p50": step},
                "dense_state_bytes": state,
                "activation_bytes": act,
                "mfu": mfu,
                "hfu": hfu,
            }
        }

    lines = goals(
        {
            REFERENCE: result(1.0, 100, 100, 0.10, 0.10),
            "dense_parallel=fsdp": result(1.05, 50, 90, 0.095, 0.095),
            "activation_checkpointing=hstu": result(1.2, 100, 40, 0.08, 0.10),
            "activation_dtype=fp8": result(1.12, 100, 55, 0.09, 0.09),
        }
    )
    assert lines[2].startswith(
        "goal FP8 activations: activation memory 45% lower (goal >= 40%: met); step time +12.0% (goal <= +10%: NOT met"
    )
    assert lines[0].startswith(
        "goal FSDP: dense state per rank 0.50x DDP's (goal <= 0.60: met); step time +5.0% vs DDP (goal within 10%: met)"
    )
    assert lines[1].startswith(
        "goal checkpointing hstu: activation memory 60% lower (goal >= 30%: met); "
        "HFU - MFU = 2.00 points (the recomputed share, 25.0% of the model FLOPs)"
    )
