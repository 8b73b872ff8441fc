"""Carry a trained model's state into the same model sharded by another plan (--rebalance).

TorchRec's own resharding (DistributedModelParallel.reshard) moves table-wise and column-wise
shards of an EmbeddingBagCollection between ranks; a re-plan may also change a table's sharding
type or move a sequence table (EmbeddingCollection), which it does not take. So the second model
is built afresh with the new plan and every tensor is copied over: each sharded table (and each
state of TorchRec's fused optimizer) is gathered whole from its old shards and each rank keeps the
slices its new shards cover; dense parameters are copied as they are (same FSDP layout on both),
and the dense optimizer's state is loaded as a state dict. Collective: every rank calls it, in
the same order (state dicts are ordered alike on every rank).
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch import nn

from gembench.harness.distributed.rebalance import Carried


def _whole(src) -> torch.Tensor:
    """A ShardedTensor gathered whole on every rank (rank 0 gathers, then broadcasts)."""
    full = torch.empty(tuple(src.size()), dtype=src.dtype) if dist.get_rank() == 0 else None
    src.gather(dst=0, out=full)
    if full is None:
        full = torch.empty(tuple(src.size()), dtype=src.dtype)
    dist.broadcast(full, 0)
    return full


def _copy(src, dst) -> bool:
    """Copy ``src`` into ``dst`` (ShardedTensor, DTensor or plain); False if their shapes differ."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.tensor import DTensor

    if tuple(src.size()) != tuple(dst.size()):  # sizes are global: every rank decides alike
        return False
    with torch.no_grad():
        if isinstance(dst, ShardedTensor):
            full = _whole(src) if isinstance(src, ShardedTensor) else src
            for shard in dst.local_shards():
                m = shard.metadata
                rows = tuple(slice(o, o + s) for o, s in zip(m.shard_offsets, m.shard_sizes))
                shard.tensor.copy_(full[rows].to(shard.tensor.dtype))
            _check_sum(full, dst)
        elif isinstance(dst, DTensor):
            dst.to_local().copy_(src.to_local())
        else:
            dst.copy_(src)
    return True


def _check_sum(full: torch.Tensor, dst) -> None:
    """The new shards, summed over the ranks, hold what the old table held (a wrong offset or a
    missed shard fails the run here, not silently in its figures)."""
    local = torch.zeros((), dtype=torch.float64)
    for shard in dst.local_shards():
        local += shard.tensor.double().sum()
    dist.all_reduce(local)
    want = full.double().sum()
    if not torch.isclose(local, want, rtol=1e-6, atol=1e-6 * float(full.numel())):
        raise RuntimeError(f"carrying a table of {tuple(full.shape)} to its new shards: their sum "
                           f"{float(local):.6g} is not the table's {float(want):.6g}")


def carry_state(old: nn.Module, new: nn.Module, old_dense_opt, new_dense_opt) -> Carried:
    """Copy ``old`` (a DMP) into ``new`` (the same model under another plan); what was carried."""
    with warnings.catch_warnings():  # torch's deprecation notice of ShardedTensor, TorchRec's format
        warnings.simplefilter("ignore", FutureWarning)
        return _carry(old, new, old_dense_opt, new_dense_opt)


def _carry(old: nn.Module, new: nn.Module, old_dense_opt, new_dense_opt) -> Carried:
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    carried = Carried()
    old_sd, new_sd = old.state_dict(), new.state_dict()
    for key, dst in new_sd.items():
        if _copy(old_sd[key], dst):
            carried.tensors += 1
    new.load_state_dict(new_sd)
    old_opt, new_opt = old.fused_optimizer.state_dict(), new.fused_optimizer.state_dict()
    # the trained optimizer lists every table on every rank, a fresh one only the tables it holds:
    # every rank walks the old list (the gathers are collective) and keeps what its shards cover
    for param in sorted(old_opt["state"]):
        for name, src in sorted(old_opt["state"][param].items()):
            dst = new_opt["state"].get(param, {}).get(name)
            if dst is not None and tuple(dst.size()) != tuple(src.size()):
                carried.reset.append(f"{param}.{name}")  # e.g. row-wise Adagrad's momentum per column shard
                dst = None
            whole = _whole(src) if isinstance(src, ShardedTensor) else src
            if dst is not None:
                _copy(whole, dst)
                carried.optimizer_states += 1
    new.fused_optimizer.load_state_dict(new_opt)
    new_dense_opt.load_state_dict(old_dense_opt.state_dict())
    return carried
