"""The process group of one rank: torchrun's environment, the backend, the device.

gloo on CPU, nccl on CUDA; multi-node jobs come from torchrun's rendezvous (RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE).
"""

from __future__ import annotations

import datetime as dt
import os

import torch
import torch.distributed as dist

from gembench.errors import UsageError


def torchrun_env() -> dict | None:
    """Rank, world and local sizes from torchrun's environment; None outside torchrun."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    return {
        "rank": int(os.environ["RANK"]),
        "world_size": int(os.environ["WORLD_SIZE"]),
        "local_rank": int(os.environ.get("LOCAL_RANK", 0)),
        "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"])),
    }


def backend_for(device: torch.device) -> str:
    """gloo on CPU, nccl on CUDA; a build without it is a usage error, found before launching."""
    if not dist.is_available():
        raise UsageError("this torch build has no torch.distributed: install a build with it to use --nproc")
    if device.type == "cuda":
        if not dist.is_nccl_available():
            raise UsageError("--device cuda needs the nccl backend, which this torch build lacks")
        return "nccl"
    if not dist.is_gloo_available():
        raise UsageError("--device cpu needs the gloo backend, which this torch build lacks")
    return "gloo"


def init_process_group(device: torch.device, timeout_s: float) -> str:
    backend = backend_for(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # Slightly longer than the watchdog's timeout: the watchdog names the rank at fault first,
    # the process-group timeout is only the backstop for a rank whose watchdog cannot run.
    dist.init_process_group(backend, timeout=dt.timedelta(seconds=timeout_s + 30))
    return backend


def rank_device(device: str, local_rank: int) -> torch.device:
    if device.startswith("cuda"):
        return torch.device("cuda", local_rank)
    return torch.device(device)
