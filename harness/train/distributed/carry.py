"""Carry a trained model's state into the same model sharded by another plan (--rebalance).

TorchRec's own resharding (DistributedModelParallel.reshard) moves table-wise and column-wise
shards of an EmbeddingBagCollection between ranks; a re-plan may also change a table's sharding
type or move a sequence table (EmbeddingCollection), which it does not take. So the second model
is built afresh with the new plan and every tensor is copied over: each sharded table (and each
state of TorchRec's fused optimizer) is assembled whole on every rank from the old shards (each
rank writes its shards into zeros, an all-reduce sums them: shards do not overlap) and each rank
keeps the slices its new shards cover, the sum over the new shards checked against the old.
Dense parameters are copied as they are (same FSDP layout on both); the dense optimizer's state
is loaded as a state dict. Collective: every rank calls it. The optimizer's state dicts list
different tables on different ranks, so the ranks first agree on the union of what they hold.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch import nn

from gembench.harness.train.distributed.rebalance import Carried


def _sharded():
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    return ShardedTensor


def _layout(state: dict) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """{key: (global size, dtype)} of the ShardedTensors in a flat state dict."""
    return {k: (tuple(v.size()), v.dtype) for k, v in state.items() if isinstance(v, _sharded())}


def _agreed(local: dict) -> dict:
    """The union over ranks of ``local`` layouts, in one order on every rank."""
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, local)
    union: dict = {}
    for layout in every:
        union.update(layout)
    return dict(sorted(union.items()))


def _whole(tensor, size: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """The whole tensor on every rank from its shards: this rank's written into zeros, summed."""
    full = torch.zeros(size, dtype=torch.float32 if dtype.is_floating_point else dtype)
    if tensor is not None:
        _slices(tensor.local_shards(), full, into_shards=False)
    dist.all_reduce(full)
    return full


def _slices(shards, full: torch.Tensor, into_shards: bool) -> None:
    for shard in shards:
        m = shard.metadata
        where = tuple(slice(o, o + s) for o, s in zip(m.shard_offsets, m.shard_sizes))
        if into_shards:
            shard.tensor.copy_(full[where].to(shard.tensor.dtype))
        else:
            full[where] = shard.tensor.to(full.dtype)


def _check_sum(full: torch.Tensor, shards) -> None:
    """The new shards, summed over the ranks, hold what the old tensor held (a wrong offset or a
    missed shard fails the run here, not silently in its figures). Collective."""
    local = torch.zeros((), dtype=torch.float64)
    for shard in shards:
        local += shard.tensor.double().sum()
    dist.all_reduce(local)
    want = full.double().sum()
    if not torch.isclose(local, want, rtol=1e-5, atol=1e-6 * float(full.numel())):
        raise RuntimeError(
            f"carrying a tensor of {tuple(full.shape)} to its new shards: their sum "
            f"{float(local):.6g} is not the old one's {float(want):.6g}"
        )


def _move(old: dict, new: dict) -> tuple[int, list[str]]:
    """Every sharded tensor of ``old`` into ``new`` (flat state dicts, keys alike); (moved, reset)."""
    src_layout, dst_layout = _agreed(_layout(old)), _agreed(_layout(new))
    moved, reset = 0, []
    with torch.no_grad():
        for key, (size, dtype) in src_layout.items():
            if key not in dst_layout:
                continue
            full = _whole(old.get(key), size, dtype)
            if dst_layout[key][0] != size:  # e.g. row-wise Adagrad's momentum per column shard
                reset.append(key)
                continue
            shards = new[key].local_shards() if key in new else []
            _slices(shards, full, into_shards=True)
            _check_sum(full, shards)
            moved += 1
    return moved, reset


def _flat(optimizer_state: dict) -> dict:
    return {f"{param}/{name}": v for param, states in optimizer_state["state"].items() for name, v in states.items()}


def carry_state(old: nn.Module, new: nn.Module, old_dense_opt, new_dense_opt) -> Carried:
    """Copy ``old`` (a DMP) into ``new`` (the same model under another plan); what was carried."""
    from torch.distributed.tensor import DTensor

    with warnings.catch_warnings():  # torch's deprecation notice of ShardedTensor, TorchRec's format
        warnings.simplefilter("ignore", FutureWarning)
        carried = Carried()
        old_sd, new_sd = old.state_dict(), new.state_dict()
        carried.tensors, _ = _move(old_sd, new_sd)
        with torch.no_grad():
            for key, dst in new_sd.items():  # dense: the same layout on every build
                if isinstance(dst, _sharded()):
                    continue
                if isinstance(dst, DTensor):
                    dst.to_local().copy_(old_sd[key].to_local())
                else:
                    dst.copy_(old_sd[key])
                carried.tensors += 1
        new.load_state_dict(new_sd)
        old_opt, new_opt = old.fused_optimizer.state_dict(), new.fused_optimizer.state_dict()
        carried.optimizer_states, carried.reset = _move(_flat(old_opt), _flat(new_opt))
        new.fused_optimizer.load_state_dict(new_opt)
        new_dense_opt.load_state_dict(old_dense_opt.state_dict())
    return carried


def load_unsharded(dmp, state: dict) -> int:
    """Write the unsharded model's tensors (``state``: its state_dict, taken before DMP) into the
    sharded one, so that every rank starts from the weights one process would: DMP initialises
    its shards afresh. Each rank copies the slices its shards cover; returns the tensors written."""
    written = 0
    with torch.no_grad():
        for key, value in dmp.state_dict().items():
            source = state.get(key.removeprefix("module.").removeprefix("_dmp_wrapped_module."))
            if source is None or source is value:
                continue
            if isinstance(value, _sharded()):
                _slices(value.local_shards(), source, into_shards=True)
            else:
                value.copy_(source)
            written += 1
    return written
