"""Compiles the Triton HSTU attention kernels for sm_90 (H100/H200) on any machine, GPU or not.

Triton's wheel ships ptxas, so every autotune config can be lowered to a cubin here: this
catches what the interpreter does not check (layouts, dot shapes, gather lowering) and prints
each config's registers, spill stack and shared memory as ptxas reports them (cuobjdump), the
first thing to look at when a config is slow.

  python benchmarks/attention_sm90_compile.py                 # bf16, d_head 64, every config
  python benchmarks/attention_sm90_compile.py --dtype fp32 --head-dim 24 --first
  python benchmarks/attention_sm90_compile.py --head-dim 128 --no-rab --first   # MLPerf DLRMv4's
  python benchmarks/attention_sm90_compile.py --ptx-dir /tmp/ptx-before          # then again after a
      refactor into another folder, and `diff -r`: PTX without line info, equal if no code changed

Run it without TRITON_INTERPRET (the kernels must be decorated for compilation); it uses
Triton's compiler API (ASTSource, GPUTarget), not a public contract: adjust on a Triton upgrade.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import time

from tabulate import tabulate

TYPES = {"bf16": "bf16", "fp32": "fp32", "fp16": "fp16"}


def code_only(ptx: str) -> str:
    """PTX without its line info and debug sections: what a change of comments or layout leaves alone."""
    ptx = re.sub(r"\.section\s+\.debug.*?\n\t}\n", "", ptx, flags=re.S)
    return "\n".join(ln for ln in ptx.splitlines() if ln.strip() and not ln.strip().startswith((".loc", ".file", "//")))


def compile_config(kernel, pointers: dict, constants: dict, config, target) -> dict:
    """Lowers one autotune config to a cubin; returns its ptxas resource usage and its PTX."""
    import triton
    from triton.compiler import ASTSource

    consts = {**constants, **config.kwargs}
    names = kernel.fn.arg_names
    signature = {n: "constexpr" if n in consts else pointers.get(n, "i32") for n in names}
    t0 = time.perf_counter()
    compiled = triton.compile(
        ASTSource(kernel.fn, signature, constexprs=consts),
        target=target,
        options={"num_warps": config.num_warps, "num_stages": config.num_stages},
    )
    seconds = time.perf_counter() - t0
    usage = {}
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(compiled.asm["cubin"])
        fh.flush()
        out = subprocess.run([cuobjdump, "-res-usage", fh.name], capture_output=True, text=True).stdout
    for token in " ".join(out.split()).split():
        if ":" in token:
            key, _, value = token.partition(":")
            if key in ("REG", "STACK") and value.isdigit():
                usage[key] = int(value)
    ptx = compiled.asm["ptx"]
    return {
        "regs": usage.get("REG"),
        "stack": usage.get("STACK"),
        "smem": compiled.metadata.shared,
        "wgmma": ptx.count("wgmma.mma_async"),
        "mma.sync": ptx.count("mma.sync"),
        "s": seconds,
        "ptx": code_only(ptx),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", choices=TYPES, default="bf16")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--first", action="store_true", help="only the first config of each kernel (a quick check)")
    p.add_argument("--no-rab", action="store_true", help="the kernels without a relative bias (HAS_RAB false)")
    p.add_argument(
        "--ptx-dir", help="write each config's PTX (line info stripped) here, to diff against another commit's"
    )
    args = p.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        print("TRITON_INTERPRET=1 is set: run without it (kernels must be decorated for compilation)")
        return 2
    import triton
    from triton.backends.compiler import GPUTarget

    from gembench.models.ops.triton import hstu_attention_kernels

    target = GPUTarget("cuda", 90, 32)
    t = TYPES[args.dtype]
    block_d = max(16, triton.next_power_of_2(args.head_dim))
    constants = dict(
        D_QK=args.head_dim,
        D_V=args.head_dim,
        BLOCK_DQK=block_d,
        BLOCK_DV=block_d,
        PRECISION="ieee" if args.dtype == "fp32" else "tf32",
        HAS_RAB=not args.no_rab,
    )
    kernels = [
        (
            hstu_attention_kernels.hstu_fwd_kernel,
            {**{n: f"*{t}" for n in ("Q", "K", "V", "OUT")}, "RAB": "*fp32", "OFFSETS": "*i64"},
        ),
        (
            hstu_attention_kernels.hstu_bwd_kernel,
            {
                **{n: f"*{t}" for n in ("Q", "K", "V", "DO", "DQ", "DK", "DV")},
                "RAB": "*fp32",
                "OFFSETS": "*i64",
                "DRAB": "*fp32",
            },
        ),
    ]
    rows = []
    for kernel, pointers in kernels:
        for config in kernel.configs[:1] if args.first else kernel.configs:
            r = compile_config(kernel, pointers, constants, config, target)
            tile = "-".join(f"{k}{v}" for k, v in config.kwargs.items())
            if args.ptx_dir:
                os.makedirs(args.ptx_dir, exist_ok=True)
                name = f"{kernel.fn.__name__}-{tile}-w{config.num_warps}s{config.num_stages}.ptx"
                with open(os.path.join(args.ptx_dir, name), "w") as fh:
                    fh.write(r["ptx"])
            rows.append(
                [
                    kernel.fn.__name__,
                    " ".join(f"{k}={v}" for k, v in config.kwargs.items()),
                    config.num_warps,
                    config.num_stages,
                    r["regs"],
                    r["stack"],
                    r["smem"],
                    r["wgmma"],
                    r["mma.sync"],
                    hashlib.sha256(r["ptx"].encode()).hexdigest()[:12],
                    f"{r['s']:.1f}",
                ]
            )
            print(f"compiled {rows[-1][0]} {rows[-1][1]}", file=sys.stderr, flush=True)
    print(f"sm_90, {args.dtype}, d_head {args.head_dim}, triton {triton.__version__}")
    print(
        tabulate(
            rows,
            headers=[
                "kernel",
                "tile",
                "warps",
                "stages",
                "regs",
                "spill stack B",
                "smem B",
                "wgmma (ptx)",
                "mma.sync (ptx)",
                "ptx code",
                "compile s",
            ],
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
