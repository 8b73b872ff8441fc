"""Instruction counts of the kernel micro-benchmarks, the way PyTorch's own CI tracks them.

Each kernel of benchmarks/test_kernels.py (HSTU attention jagged and padded, Wukong FM and layer,
embedding lookups through torchrec, nn.EmbeddingBag and fbgemm's TBE) is run under valgrind's
callgrind by ``torch.utils.benchmark.Timer(...).collect_callgrind()``, which counts the
instructions the CPU retires for the statement, with the interpreter's own noise removed
(``counts(denoise=True)``). Unlike a time, an instruction count does not care how busy the
machine is: two runs of one build agree to ~0.2% (measured on the shared 2-core VM), so a 1%
increase is a real change in work done. `gembench compare A.json B.json` (and the thresholds'
``max_instructions_increase``, default 1%) judges two such files exactly.

The result is a small JSON document, schema ``gembench.instructions/1``:
    {schema, id, created, config: {name: "kernels", hash}, run: {number, tool, valgrind},
     env: (as a gembench result: hardware_class, packages, git_commit, ...),
     kernels: {name: {instructions_per_call, number, stmt}},
     metrics: {"instructions.<name>": instructions per call}}
written under results/runs/ (never overwritten).

Needs valgrind (Debian: `apt-get install -y valgrind`; scripts/setup.sh installs it where it can);
without it, prints a notice and exits 0 having written nothing. Each kernel is one valgrind process
that imports torch under instrumentation: ~35-60 s each on 2 cores, ~5 min for all.

usage:
  python benchmarks/instructions.py                              # all kernels -> results/runs/
  python benchmarks/instructions.py --kernel wukong_fm --kernel hstu_attention_jagged
  python benchmarks/instructions.py --out before.json            # then, on the change:
  python benchmarks/instructions.py --out after.json && gembench compare before.json after.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

from gembench.harness.device.tools import valgrind_version

SCHEMA = "gembench.instructions/1"
NUMBER = 3  # statement calls per count: per-call counts are exact, more calls only cost time

# name -> (setup, statement). Inputs are built by test_kernels' own helpers (same sizes and seeds).
_COMMON = "import torch\ntorch.set_grad_enabled(False)\nfrom gembench.benchmarks import test_kernels as tk\n"
KERNELS: dict[str, tuple[str, str]] = {
    "hstu_attention_jagged": (
        _COMMON
        + "from gembench.models.ops.pytorch.hstu_attention import hstu_jagged_attention\nq, k, v, rab, offsets, cap = tk._jagged()",
        "hstu_jagged_attention(q, k, v, rab, offsets)",
    ),
    "hstu_attention_padded": (
        _COMMON
        + "from gembench.models.ops.pytorch.hstu_attention import hstu_padded_attention\nq, k, v, rab, offsets, cap = tk._jagged()",
        "hstu_padded_attention(q, k, v, rab, offsets, cap)",
    ),
    "wukong_fm": (
        _COMMON + "torch.manual_seed(0)\nx = torch.randn(512, 16, 32)\ny = torch.randn(16, 16)",
        "torch.matmul(x, torch.matmul(x.transpose(1, 2), y))",
    ),
    "wukong_layer": (
        _COMMON + "from gembench.models.wukong import WukongLayer\ntorch.manual_seed(0)\n"
        "layer = WukongLayer(n_in=16, dim=32, n_fm=16, n_lcb=16, rank=16, mlp=[256, 256]).eval()\n"
        "x = torch.randn(512, 16, 32)",
        "layer(x)",
    ),
    "embedding_lookup_plain_embeddingbag": (
        _COMMON + "torch.manual_seed(0)\nbags = [torch.nn.EmbeddingBag(5000, 32, mode='sum') for _ in range(8)]\n"
        "lengths, values = tk._ids()\nper_table = lengths.view(8, 512)\n"
        "chunks = torch.split(values, per_table.sum(1).tolist())\n"
        "offsets = [torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(per_table[t], 0)[:-1]]) for t in range(8)]",
        "torch.cat([bag(ids, off) for bag, ids, off in zip(bags, chunks, offsets)], dim=1)",
    ),
    "embedding_lookup_fbgemm_tbe": (
        _COMMON + "from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode\n"
        "from fbgemm_gpu.split_table_batched_embeddings_ops_training import ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen\n"
        "torch.manual_seed(0)\n"
        "tbe = SplitTableBatchedEmbeddingBagsCodegen([(5000, 32, EmbeddingLocation.HOST, ComputeDevice.CPU)] * 8, "
        "pooling_mode=PoolingMode.SUM)\n"
        "lengths, values = tk._ids()\noffsets = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(lengths, 0)])",
        "tbe(values, offsets)",
    ),
    "embedding_lookup_torchrec_ebc": (
        _COMMON + "from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor\n"
        "torch.manual_seed(0)\nkeys = [f'f{i}' for i in range(8)]\n"
        "ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=f't{i}', embedding_dim=32, num_embeddings=5000, "
        "feature_names=[k]) for i, k in enumerate(keys)], device=torch.device('cpu'))\n"
        "lengths, values = tk._ids()\nkjt = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths)",
        "ebc(kjt).values()",
    ),
}


def _callgrind_env() -> None:
    """collect_callgrind starts `python` from PATH and checks it is this interpreter: put ours first.

    The package root must also reach it: the child imports gembench from PYTHONPATH.
    """
    bindir = str(Path(sys.executable).parent)
    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    import gembench

    root = str(Path(gembench.__file__).resolve().parent.parent)
    if Path(gembench.__file__).resolve().parent.name != "gembench":
        # the package is a checkout reached through a symlink folder: keep whatever path found it
        root = next((p for p in sys.path if p and (Path(p) / "gembench").exists()), root)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])


def count(name: str, number: int = NUMBER, repeats: int = 1) -> list[int]:
    """Instructions per call of kernel ``name`` (callgrind, denoised), ``repeats`` counts from one valgrind process."""
    from torch.utils.benchmark import Timer

    setup, stmt = KERNELS[name]
    timer = Timer(stmt, setup=setup, num_threads=1)
    if repeats == 1:
        found = [timer.collect_callgrind(number=number, collect_baseline=False)]
    else:
        found = list(timer.collect_callgrind(number=number, repeats=repeats, collect_baseline=False))
    return [round(s.counts(denoise=True) / number) for s in found]


def definitions_hash(names: list[str], number: int) -> str:
    text = json.dumps({n: KERNELS[n] for n in names} | {"_number": number}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def measure(names: list[str], number: int = NUMBER, progress=print) -> dict:
    """The gembench.instructions/1 document for ``names``."""
    import datetime as dt
    import secrets

    import torch

    from gembench.harness.device.env import fingerprint

    _callgrind_env()
    kernels = {}
    for i, name in enumerate(names, 1):
        t0 = time.perf_counter()
        per_call = count(name, number)[0]
        kernels[name] = {
            "instructions_per_call": per_call,
            "number": number,
            "stmt": KERNELS[name][1],
            "seconds": round(time.perf_counter() - t0, 1),
        }
        progress(f"instructions: {i}/{len(names)} {name}: {per_call:,} per call ({kernels[name]['seconds']:.0f} s)")
    created = dt.datetime.now(dt.timezone.utc)
    return {
        "schema": SCHEMA,
        "id": f"{created:%Y%m%dT%H%M%SZ}-instructions-{secrets.token_hex(3)}",
        "created": created.isoformat(timespec="seconds"),
        "config": {"name": "kernels", "hash": definitions_hash(names, number), "kernels": names},
        "run": {
            "number": number,
            "tool": "torch.utils.benchmark.Timer.collect_callgrind, counts(denoise=True)",
            "valgrind": valgrind_version(),
            "num_threads": 1,
        },
        "env": fingerprint(torch.device("cpu")),
        "kernels": kernels,
        "metrics": {f"instructions.{n}": k["instructions_per_call"] for n, k in kernels.items()},
    }


def report(doc: dict) -> str:
    from tabulate import tabulate

    rows = [[n, f"{k['instructions_per_call']:,}", f"{k['seconds']:.0f} s"] for n, k in doc["kernels"].items()]
    env = doc["env"]
    head = (
        f"instruction counts per call ({doc['run']['valgrind']}, 1 thread, denoised), {env['cpu_model']}, "
        f"torch {env['packages'].get('torch')}, commit {str(env['git_commit'])[:10]}"
    )
    return head + "\n\n" + tabulate(rows, ["kernel", "instructions", "took"], disable_numparse=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--kernel",
        action="append",
        choices=sorted(KERNELS),
        default=None,
        help="kernel to count (repeatable; default all)",
    )
    p.add_argument("--number", type=int, default=NUMBER, help=f"calls per count (default {NUMBER})")
    p.add_argument(
        "--out", type=Path, default=None, help="result JSON (default results/runs/<id>.json; never overwritten)"
    )
    args = p.parse_args(argv)
    from gembench.errors import UsageError
    from gembench.harness.store.results import RUNS_DIR, check_writable, write_result

    version = valgrind_version()
    if version is None:
        print(
            "instructions: valgrind is not installed; skipped (Debian: apt-get install -y valgrind, "
            "or scripts/setup.sh as root)",
            file=sys.stderr,
        )
        return 0
    try:
        if args.number < 1:
            raise UsageError(f"--number must be >= 1, got {args.number}")
        if args.out is not None:
            check_writable(args.out)
        doc = measure(args.kernel or list(KERNELS), args.number, lambda m: print(m, file=sys.stderr, flush=True))
        out = write_result(args.out or RUNS_DIR / f"{doc['id']}.json", doc)
    except UsageError as err:
        print(f"instructions: error: {err}", file=sys.stderr)
        return 2
    print(report(doc))
    print(f"\nresult: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
