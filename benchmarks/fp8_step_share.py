"""Where FP8 activations' step time goes: the hooks, the quantizing, the restoring, in one process.

Separate `gembench run`s of the two switches sit minutes apart, and this machine's speed drifts by
as much as the effect between them. Here a config's stack is built twice in one process (saving as
computed, and with fp8) and its steps are taken in rotation with two variants of the fp8 hooks, so
every variant sees the same drift: the hooks holding each tensor as it is (their own cost), and
quantizing while the backward reads a kept copy (the quantizing's cost). Prints each variant's
median and best step, and its cost over the computed saves.

  python benchmarks/fp8_step_share.py                  # small, bf16, 25 rounds after 3 warm ones (~2 min)
  python benchmarks/fp8_step_share.py --config tiny --rounds 30
"""

import argparse
import statistics
import time

import torch

import gembench.harness.train.activations as activations
from gembench.harness.device.hardware import keep_freed_memory
from gembench.harness.train.stack import build_train_state, stack_options
from gembench.harness.train.step import NoClock, train_step
from gembench.models.config import load_config
from gembench.models.data import SyntheticData
from gembench.models.zoo import ZooWorkload

FULL = activations.Packed


class AsItIs(FULL):
    """The hooks' own cost: the tensor held as it is."""

    __slots__ = ()

    def __init__(self, t: torch.Tensor, order: list[int]):
        self.q, self.scale, self.shape, self.order, self.dtype = t, None, t.shape, order, t.dtype

    def tensors(self):
        return (self.q,)

    def restore(self) -> torch.Tensor:
        return self.q


class QuantizeOnly(FULL):
    """The quantizing's cost: quantized, and the backward reads a kept copy."""

    __slots__ = ("kept",)

    def __init__(self, t: torch.Tensor, order: list[int]):
        super().__init__(t, order)
        self.kept = t

    def restore(self) -> torch.Tensor:
        return self.kept


VARIANTS = {  # name -> (activation_dtype, what the hooks hold)
    "computed saves": ("compute", FULL),
    "fp8": ("fp8", FULL),
    "fp8 hooks, tensors as they are": ("fp8", AsItIs),
    "fp8, quantized, restore skipped": ("fp8", QuantizeOnly),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="small")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--rounds", type=int, default=25, help="timed rounds, one step of each variant a round")
    p.add_argument("--warm", type=int, default=3, help="rounds discarded first (compiles, first touches)")
    args = p.parse_args()
    keep_freed_memory()  # as a `gembench run` process does
    cfg = load_config(args.config)
    data = SyntheticData(cfg, seed=0, batch_size=cfg.data.global_batch)
    batches = [data.batch(i) for i in range(8)]
    states = {}
    for switch in ("compute", "fp8"):
        options = stack_options("optimized", args.dtype, (f"activation_dtype={switch}",))
        states[switch] = build_train_state(ZooWorkload(cfg).for_stack(options), options, torch.device("cpu"), seed=0)
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    try:
        for r in range(args.warm + args.rounds):
            names = list(VARIANTS)
            for i, name in enumerate(names[r % len(names) :] + names[: r % len(names)]):  # who follows whom rotates
                switch, held = VARIANTS[name]
                activations.Packed = held  # pack and unpack look it up at each call
                t0 = time.perf_counter()
                train_step(states[switch], batches[(r + i) % len(batches)], NoClock())
                if r >= args.warm:
                    times[name].append(time.perf_counter() - t0)
    finally:
        activations.Packed = FULL
    base = statistics.median(times["computed saves"])
    print(f"{args.config}, {args.dtype}, {torch.get_num_threads()} threads: {args.rounds} rounds after {args.warm}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:34s} median {1e3 * med:8.1f} ms  best {1e3 * min(ts):8.1f} ms  {100 * (med / base - 1):+6.1f}%")


if __name__ == "__main__":
    main()
