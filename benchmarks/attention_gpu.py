"""HSTU attention forward+backward: Triton kernels vs the tiled op vs the padded path.

Shapes of a config's first sequence (medium on CUDA, small on a CPU: H heads of hstu.dim / H,
lengths drawn as models/data.py draws them, + 1 for the CLS token GEM prepends), batch 512.
Throughput is causal *model* FLOPs, the formula FlopCounterMode is given for the ops:
3 H (d_qk + d_v) sum_i n_i^2 for forward (1x) + backward (2x), over real lengths. The padded
path is the shape of generative-recommenders' PyTorch reference (pad to the longest, dense
scores, SiLU, mask, back to jagged). Goals, printed and never asserted:
  one H200:  Triton >= 88 TFLOP/s (aim 150), 0 host synchronisations, <= 4 kernel launches;
  a CPU:     the tiled op >= 7x the padded reference and >= 10% of the host's GEMM peak in
             the same dtype (the peak `gembench peak` calibrates).

  python benchmarks/attention_gpu.py                      # CUDA: medium, bf16, all three paths
  python benchmarks/attention_gpu.py --batch 128 --reps 50
  python benchmarks/attention_gpu.py --device cpu         # small's shapes, fp32: tiled vs padded
  python benchmarks/attention_gpu.py --device cpu --dtype bf16

Without CUDA the Triton kernels are not timed (the interpreter tests in tests/test_hstu_triton.py
check them). On a CPU the tiled op is timed twice: on the one batch (the goals' figure, beside the
padded path), and on a new batch each call, as training calls it (its tiles' shapes change).
"""

from __future__ import annotations

import argparse
import contextlib
import time
import warnings

import numpy as np
import torch
from tabulate import tabulate

from gembench.harness.device.env import git_state
from gembench.harness.device.hardware import (
    cpu_peak,
    device_name,
    keep_freed_memory,
    reference_peak,
    resolve_device,
)
from gembench.models.config import load_config
from gembench.models.data import SEQUENCE_SIGMA, truncated_lognormal
from gembench.models.ops.pytorch.hstu_attention import hstu_jagged_attention, hstu_padded_attention
from gembench.models.ops.triton.hstu_attention import triton_hstu_attention

GOAL_TFLOPS, AIM_TFLOPS = 88.0, 150.0
GOAL_SYNCS, GOAL_LAUNCHES = 0, 4
CPU_SPEEDUP_GOAL, CPU_PEAK_GOAL = 7.0, 0.10
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def make_batch(
    batch: int, max_len: int | None, dtype: torch.dtype, device: torch.device, seed: int = 0, config: str = "medium"
):
    """q, k, v (T, H, D), rab (H, R) fp32 (the layer's parameter), offsets, max_len, lengths."""
    cfg = load_config(config)
    seq, heads = cfg.sequences[0], cfg.hstu.heads
    d_head = cfg.hstu.dim // heads
    cap = max_len or seq.max_len
    mean = seq.mean_len * cap / seq.max_len  # a reduced max_len keeps the shape of the law
    rng = np.random.default_rng(seed)
    lengths = truncated_lognormal(rng, mean, SEQUENCE_SIGMA, batch, 1, cap) + 1  # + CLS
    offsets = torch.zeros(batch + 1, dtype=torch.int64)
    offsets[1:] = torch.from_numpy(np.cumsum(lengths))
    T = int(offsets[-1])
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(T, heads, d_head, generator=g).to(device, dtype).requires_grad_() for _ in range(3))
    rab = (0.02 * torch.randn(heads, cap + 1, generator=g)).to(device).requires_grad_()
    return q, k, v, rab, offsets.to(device), cap + 1, lengths


def model_flops(lengths, heads: int, d_qk: int, d_v: int) -> float:
    """Forward + backward model FLOPs: 3 H (d_qk + d_v) sum n^2 (as registered for the ops)."""
    return 3.0 * heads * (d_qk + d_v) * float(np.sum(np.asarray(lengths, dtype=np.float64) ** 2))


def paths(device: torch.device) -> dict:
    """name -> f(q, k, v, rab, offsets, max_len); the PyTorch paths get rab in q's dtype, as the
    dispatcher gives it to them."""
    out = {}
    if device.type == "cuda":
        out["triton"] = lambda q, k, v, rab, off, n: triton_hstu_attention(q, k, v, rab, off, n)
    out["tiled"] = lambda q, k, v, rab, off, n: hstu_jagged_attention(q, k, v, rab.to(q.dtype), off)
    out["padded"] = lambda q, k, v, rab, off, n: hstu_padded_attention(q, k, v, rab.to(q.dtype), off, n)
    return out


def fwd_bwd(fn, q, k, v, rab, offsets, max_len, grad_out):
    out = fn(q, k, v, rab, offsets, max_len)
    return torch.autograd.grad(out, (q, k, v, rab), grad_out)


def time_ms(fn, args, device: torch.device, reps: int) -> float:
    """Median ms of one forward+backward (after the warm-up call that autotunes)."""
    fwd_bwd(fn, *args)
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fwd_bwd(fn, *args)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fwd_bwd(fn, *args)
            times.append(1e3 * (time.perf_counter() - t0))
    return float(np.median(times))


def time_fresh_ms(fn, make, reps: int, warm: int = 10) -> tuple[float, float]:
    """(median ms, total model FLOPs / total s) of one forward+backward on a new batch each call, as a
    training step sees them: a shape-specialized kernel built for one batch's shapes is built again
    for the next one's. ``make(seed)`` gives (call args, model FLOPs); the first ``warm`` batches
    are not timed."""
    times, flops = [], 0.0
    for seed in range(1, 1 + warm + reps):
        args, batch_flops = make(seed)
        t0 = time.perf_counter()
        fwd_bwd(fn, *args)
        if seed > warm:
            times.append(time.perf_counter() - t0)
            flops += batch_flops
    return 1e3 * float(np.median(times)), flops / sum(times)


def count_launches(fn, args) -> int:
    """Device kernels (fills, casts and copies included) in one forward+backward (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fwd_bwd(fn, *args)
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def count_syncs(fn, args) -> int:
    """Host synchronisations in one forward+backward (torch.cuda.set_sync_debug_mode warnings)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fwd_bwd(fn, *args)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum(1 for w in caught if "synchroniz" in str(w.message))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cuda, cpu")
    p.add_argument("--config", help="whose first sequence and heads (default medium on CUDA, small on CPU)")
    p.add_argument("--batch", type=int, default=512, help="sequences (default 512)")
    p.add_argument("--max-len", type=int, help="longest sequence before CLS (default: the config's)")
    p.add_argument("--dtype", choices=DTYPES, help="default bf16 on CUDA, fp32 on CPU")
    p.add_argument("--reps", type=int, help="timed repetitions (default 20 on CUDA, 3 on CPU)")
    p.add_argument("--only", nargs="+", choices=["triton", "tiled", "padded"], help="paths to time")
    args = p.parse_args()
    device = resolve_device(args.device)
    keep_freed_memory()  # as a run's process does
    cuda = device.type == "cuda"
    if not cuda:
        print(
            "No CUDA device: the Triton kernels are not timed (tests/test_hstu_triton.py checks them "
            "in Triton's interpreter).\n"
        )
    config = args.config or ("medium" if cuda else "small")
    dtype_name = args.dtype or ("bf16" if cuda else "fp32")
    reps = args.reps or (20 if cuda else 5)
    q, k, v, rab, offsets, cap, lengths = make_batch(
        args.batch, args.max_len, DTYPES[dtype_name], device, config=config
    )
    heads, d_head = q.shape[1], q.shape[2]
    flops = model_flops(lengths, heads, d_head, d_head)
    grad_out = torch.randn_like(v)
    call = (q, k, v, rab, offsets, cap, grad_out)
    commit, dirty = git_state()
    peak = reference_peak(device) if cuda else cpu_peak(dtype_name)  # a CPU: the dtype's own GEMM peak
    print(
        f"{config}'s shapes, device {device_name(device)}, dtype {dtype_name}, "
        f"peak {peak.tflops_per_device:.4g} TFLOP/s "
        f"({peak.source}), commit {commit[:10]}{' (dirty)' if dirty else ''}"
    )
    print(
        f"batch {args.batch} sequences, H={heads}, d_head={d_head}, lengths 2..{cap} (mean {np.mean(lengths):.0f}, "
        f"T={int(q.shape[0])}), model FLOPs fwd+bwd = 3 H (d_qk + d_v) sum n^2 = {flops / 1e12:.4g} TFLOP\n"
    )
    rows, times_ms = [], {}
    for name, fn in paths(device).items():
        if args.only and name not in args.only:
            continue
        try:
            ms = time_ms(fn, call, device, reps)
        except torch.cuda.OutOfMemoryError:
            rows.append([name, "out of memory", "", "", ""])
            torch.cuda.empty_cache()
            continue
        times_ms[name] = ms
        tflops = flops / (ms / 1e3) / 1e12
        launches = count_launches(fn, call) if cuda else None
        syncs = count_syncs(fn, call) if cuda else None
        rows.append(
            [
                name,
                f"{ms:.3f}",
                f"{tflops:.3g}",
                f"{100 * tflops / peak.tflops_per_device:.2f}%",
                "n/a (CPU)" if syncs is None else syncs,
                "n/a (CPU)" if launches is None else launches,
            ]
        )
    if not cuda and "tiled" in times_ms:

        def fresh(seed):
            q, k, v, rab, offsets, cap, lengths = make_batch(
                args.batch, args.max_len, DTYPES[dtype_name], device, seed=seed, config=config
            )
            return (q, k, v, rab, offsets, cap, torch.randn_like(v)), model_flops(lengths, heads, d_head, d_head)

        ms, per_s = time_fresh_ms(paths(device)["tiled"], fresh, 2 * reps)
        tflops = per_s / 1e12
        share = f"{100 * tflops / peak.tflops_per_device:.2f}%"
        rows.append(["tiled, a new batch a call", f"{ms:.3f}", f"{tflops:.3g}", share, "n/a (CPU)", "n/a (CPU)"])
    print(
        tabulate(
            rows,
            headers=[
                "path",
                "fwd+bwd ms (median)",
                "TFLOP/s (model, causal)",
                "of peak",
                "host syncs",
                "kernel launches",
            ],
            colalign=("left",) + ("right",) * 5,
        )
    )
    if not cuda:
        cpu_goals(times_ms, flops, peak.tflops_per_device)
        return
    triton_row = next((r for r in rows if r[0] == "triton" and r[1] != "out of memory"), None)
    print("\ngoals (triton, one H200, batch 512)")
    if triton_row is None:
        print("  not measured here")
        return
    tflops, syncs, launches = float(triton_row[2]), triton_row[4], triton_row[5]
    print(
        f"  throughput  {tflops:.3g} TFLOP/s  goal >= {GOAL_TFLOPS:g} (aim {AIM_TFLOPS:g}): "
        f"{'met' if tflops >= GOAL_TFLOPS else 'not met'}"
    )
    print(f"  host syncs  {syncs}  goal {GOAL_SYNCS}: {'met' if syncs == GOAL_SYNCS else 'not met'}")
    print(f"  launches    {launches}  goal <= {GOAL_LAUNCHES}: {'met' if launches <= GOAL_LAUNCHES else 'not met'}")


def cpu_goals(times: dict[str, float], flops: float, peak_tflops: float) -> None:
    """The CPU goals from each path's fwd+bwd ms and the model FLOPs against the dtype's peak."""
    print("\ngoals (tiled, a CPU)")
    if "tiled" not in times:
        print("  not measured (--only left the tiled op out)")
        return
    share = flops / (times["tiled"] / 1e3) / 1e12 / peak_tflops
    if "padded" in times:
        speedup = times["padded"] / times["tiled"]
        print(
            f"  vs the padded reference  {speedup:.2f}x  goal >= {CPU_SPEEDUP_GOAL:g}x: "
            f"{'met' if speedup >= CPU_SPEEDUP_GOAL else 'not met'}"
        )
    print(
        f"  of the GEMM peak         {100 * share:.1f}%  goal >= {100 * CPU_PEAK_GOAL:g}%: "
        f"{'met' if share >= CPU_PEAK_GOAL else 'not met'}"
    )


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
