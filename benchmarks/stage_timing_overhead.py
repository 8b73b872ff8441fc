"""What the stage timing costs: the same steps with stage clocks and without, interleaved.

Each round runs `--steps` steps untimed (one clock read per step) and `--steps` with every stage
boundary marked, in alternating order, on the same model and batches. The overhead is the
median over rounds of (timed / untimed - 1). Goal: under 2% on `small`, and on a model gembench
did not write (--model, or --examples: both of examples/). Timing adds the forward hooks on each
model's sparse modules (the sparse timer: off in the untimed steps). The cost counters run on extra steps after the
timed ones, so they cost the timed steps nothing; what one counted step costs is printed beside,
as % of a plain step and as % of the run (one counted step per run of --run-steps). The op
table too runs on a step of its own; what it leaves in the timed steps is the profiler range
inductor puts around each fused CPU kernel, priced by compiling the stack with and without them.

  python benchmarks/stage_timing_overhead.py                  # small, optimized stack
  python benchmarks/stage_timing_overhead.py --config tiny --stack baseline
  python benchmarks/stage_timing_overhead.py --examples --set compile=off
"""

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from gembench.harness.device.hardware import keep_freed_memory
from gembench.harness.train.measure import run_steps
from gembench.harness.train.runconfig import RunConfig
from gembench.harness.train.stack import STACKS, build_train_state
from gembench.harness.train.workloads import workload_of

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
EXAMPLE_SPECS = [(f"{EXAMPLES}/torchrec_dlrm.py:dlrm", ("max_rows=10000",)), (f"{EXAMPLES}/two_tower.py:two_tower", ())]


def overhead(state, batches, rounds: int, steps: int, timer=None) -> tuple[list, dict]:
    """Per round timed/untimed - 1, and the seconds each way; ``timer``: the model's sparse timer,
    its hooks off in the untimed steps."""
    run_steps(state, batches, 0, warmup=3)  # compile and warm caches outside the measurement
    ratios, totals = [], {True: 0.0, False: 0.0}
    for r in range(rounds):
        spent = {}
        for timed in (True, False) if r % 2 else (False, True):
            if timer is not None:
                timer.attach() if timed else timer.detach()
            start = time.perf_counter()
            run_steps(state, batches, steps, 0, timed=timed)
            spent[timed] = time.perf_counter() - start
            totals[timed] += spent[timed]
            if timer is not None:
                timer.detach()
        ratios.append(spent[True] / spent[False] - 1)
    if timer is not None:
        timer.attach()
    return ratios, totals


def counter_cost(state, batches, rounds: int) -> float:
    """A step under the cost counters (metrics/counters.StepCounter) / a plain untimed step - 1,
    the median over ``rounds`` pairs in alternating order."""
    from gembench.harness.metrics.counters import StepCounter

    ratios = []
    for r in range(rounds):
        spent = {}
        for counted in (True, False) if r % 2 else (False, True):
            start = time.perf_counter()
            if counted:
                with StepCounter(state.device, state.optimizers):
                    run_steps(state, batches[:1], 1, 0, timed=False)
            else:
                run_steps(state, batches[:1], 1, 0, timed=False)
            spent[counted] = time.perf_counter() - start
        ratios.append(spent[True] / spent[False] - 1)
    return float(np.median(ratios))


def kernel_profile_cost(state, workload, options, device, batches, rounds: int, steps: int) -> float | None:
    """Untimed steps of ``state`` (compiled as the stack compiles, with inductor's kernel ranges:
    what the op table reads a CPU's fused kernels from) / the same stack compiled without them - 1,
    the median over rounds in alternating order; None where nothing is compiled for a CPU."""
    import torch._inductor.config as inductor_config

    if not options.compile or device.type != "cpu":
        return None
    without = build_train_state(workload, options, device)  # the stack turns the ranges on
    inductor_config.cpp.enable_kernel_profile = False
    run_steps(without, batches, 0, warmup=3, timed=False)  # compiles without them
    inductor_config.cpp.enable_kernel_profile = True
    states = {True: state, False: without}
    ratios = []
    for r in range(rounds):
        spent = {}
        for profiled in (True, False) if r % 2 else (False, True):
            start = time.perf_counter()
            run_steps(states[profiled], batches, steps, 0, timed=False)
            spent[profiled] = time.perf_counter() - start
        ratios.append(spent[True] / spent[False] - 1)
    return float(np.median(ratios))


def report(name: str, ratios, totals, rounds: int, steps: int, counted: float, run_steps_: int) -> None:
    print(f"{name}: {rounds} rounds x {steps} steps each way")
    print(
        f"untimed {1e3 * totals[False] / (rounds * steps):.1f} ms/step, "
        f"timed {1e3 * totals[True] / (rounds * steps):.1f} ms/step"
    )
    print(
        f"stage-timing overhead: median {100 * np.median(ratios):+.2f}% "
        f"(rounds: {', '.join(f'{100 * x:+.1f}%' for x in ratios)}); goal < 2%"
    )
    print(
        f"cost counters: a counted step {100 * counted:+.1f}% over a plain one; outside the timed steps, "
        f"one per run: {100 * (1 + counted) / run_steps_:.2f}% of a {run_steps_}-step run's time"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="small")
    p.add_argument("--stack", default="optimized", choices=sorted(STACKS))
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--device", default="cpu")
    p.add_argument("--set", dest="switches", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--model", default=None, help="a workload (pkg.mod:factory or file.py:factory) instead of --config")
    p.add_argument("--model-arg", dest="model_args", action="append", default=[])
    p.add_argument("--examples", action="store_true", help="both models of examples/ instead of --config")
    p.add_argument("--run-steps", type=int, default=20, help="timed steps of the run the counted step is priced in")
    args = p.parse_args()
    keep_freed_memory()  # as a run's process does
    device = torch.device(args.device)
    # the stack as a run on this device holds it (bf16 where the device multiplies it)
    options = RunConfig(args.config, stack=args.stack, switches=tuple(args.switches), device=args.device).options
    specs = EXAMPLE_SPECS if args.examples else [(args.model, tuple(args.model_args))]
    for spec, model_args in specs:
        workload = workload_of(args.config, spec, model_args).on_device(device.type).for_stack(options)
        state = build_train_state(workload, options, device)
        batches = [workload.batch(i) for i in range(args.steps)]
        ratios, totals = overhead(state, batches, args.rounds, args.steps, state.timer)
        counted = counter_cost(state, batches, args.rounds)
        name = f"{workload.name} ({args.stack}, {options.describe()})"
        report(name, ratios, totals, args.rounds, args.steps, counted, args.run_steps)
        kernels = kernel_profile_cost(state, workload, options, device, batches, args.rounds, args.steps)
        if kernels is not None:
            print(
                f"op table's kernel ranges (inductor cpp.enable_kernel_profile) in the timed steps: "
                f"{100 * kernels:+.2f}% (median of {args.rounds} alternating rounds); goal <= 1%"
            )


if __name__ == "__main__":
    main()
