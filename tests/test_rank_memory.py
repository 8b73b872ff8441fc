"""The rank memory estimate on small on 2 gloo ranks, ddp without checkpointing and fsdp with
hstu's (tests/test_parallelize.py holds all four cells on tiny; benchmarks/rank_memory.py prints
the grid): a file of its own so that `pytest -n 2 --dist loadgroup` runs these 2-rank runs on the
other worker from test_parallelize's."""

from __future__ import annotations

import json

import pytest
from synthetic import MEMORY_VARIANTS, gembench_cli


@pytest.mark.parametrize("name", ["ddp", "fsdp+hstu"])  # each switch off, then both on (tiny holds all four)
def test_small_rank_memory_estimate_within_0_7_to_1_5(tmp_path, name):
    """small, where tensors outweigh the runtime: the estimate's sharded dense state and
    checkpointed activations against what each rank measured. benchmarks/rank_memory.py prints
    the same grid with the figures."""
    out = tmp_path / "r.json"
    args = ["run", "--config", "small", "--nproc", "2", "--steps", "1", "--warmup", "1", "--out", str(out), "--quiet"]
    for s in ("compile=off", *MEMORY_VARIANTS[name]):
        args += ["--set", s]
    proc = gembench_cli(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in json.loads(out.read_text())["ranks"]:
        print(
            f"small {name} rank {rank['rank']}: estimate {rank['peak_memory_estimate_bytes'] / 2**20:.0f} MiB, "
            f"measured {rank['peak_memory_run_bytes'] / 2**20:.0f} MiB"
        )
        assert 0.7 <= rank["memory_estimate_ratio"] <= 1.5
