"""Training stacks: precision, compilation, kernels and optimizers applied to a pure model.

The model modules know nothing of these; a stack rewrites them from outside, as torchtitan
does: it swaps TorchRec's plain embedding modules for fbgemm's fused table-batched ones,
autocasts and compiles what the workload names; the model switches (the zoo's attention kernel
and content) reach the model through the workload's for_stack().

Two named stacks bracket GEM's "doubled efficiency":
  baseline:  what a team writes first: fp32 eager, one nn.EmbeddingBag per table with dense
             gradients and a separate optimizer, sequences padded to the batch maximum.
  optimized: bf16 autocast (where the device multiplies bf16 in hardware: RunConfig.precision),
             torch.compile on the dense arch, fused table-batched embeddings
             (fbgemm TBE, optimizer fused into backward), jagged attention, fused Adam, and
             on several ranks TorchRec's sparse-dist pipeline.
Every optimization is one field of StackOptions, so `gembench ablate` can flip it alone. Two of
GEM's dense-side techniques are choices rather than on/off (CHOICES): how the dense part is made
data parallel over ranks (DDP, FSDP2 or HSDP, harness/train/parallelize.py) and which blocks are
activation-checkpointed (none, each HSTU layer, every dense block).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from dataclasses import asdict, dataclass, fields, replace

import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingCollection

from gembench.errors import UsageError
from gembench.harness.train import activations, nvtx
from gembench.harness.train.parallelize import apply_ac, apply_compile, embedding_parameters
from gembench.harness.train.step import TrainState
from gembench.harness.train.workloads import SparseTimer, applied_switches, seeded

# fbgemm's fake dense_to_jagged (traced when the padded attention is compiled, as `gembench
# ablate`'s "- jagged" variant does) calls torch._check_is_size, deprecated since torch 2.13:
# fbgemm's to fix, and it says nothing about the run, so only that warning from fbgemm is muted.
warnings.filterwarnings(
    "ignore", message="_check_is_size will be removed", category=FutureWarning, module=r"fbgemm_gpu\."
)

EMBEDDING_LR = 0.02
DENSE_LR = 1e-3
ADAGRAD_EPS = 1e-8  # the same on both paths, so fused and eager Adagrad are the same update


@dataclass(frozen=True)
class StackOptions:
    """How a model is run. Each field is one optimization that `gembench ablate` can flip."""

    fused_embeddings: bool = True  # fbgemm TBE, Adagrad fused into backward (row-sparse on CPU sequences)
    # attention="jagged" (models/ops/hstu_attention.py); False: "padded", every sequence padded to the batch max
    jagged: bool = True
    bf16: bool = True  # autocast the dense arch to bf16 (weights and optimizer state stay fp32)
    fused_optimizer: bool = True  # one fused Adam kernel over all dense params, not a per-tensor loop
    compile: bool = True  # torch.compile the dense arch
    pipeline: bool = True  # several ranks: TorchRec TrainPipelineSparseDist (input dist overlapped)
    # several ranks: the dense part's data parallelism. ddp: replicas, gradients all-reduced;
    # fsdp: FSDP2 fully_shard per dense block; hsdp: fsdp within a node, replicas across nodes.
    # Default ddp: FSDP pays where the dense state, not communication, is the limit, and on small
    # its gathers cost more step time than the memory they save is worth (docs/configs.md).
    dense_parallel: str = "ddp"
    # torch.utils.checkpoint (non-reentrant) around: none, each HSTU layer ("hstu"), every dense block ("all").
    # Default none: checkpointing trades a longer step for activation memory, worth it for models
    # that do not fit (the measurement that chose both defaults: docs/configs.md).
    activation_checkpointing: str = "none"
    # The ad's content (a config's [content] section: ContentArch, item content): "off" runs the
    # config without it, so that its cost is one row of `gembench ablate`. A model choice, not
    # an optimization: the baseline stack keeps it on.
    content: str = "on"
    # What the forward saves for the backward is stored as: as computed ("compute"), or float8 e4m3
    # with a scale per row ("fp8", harness/train/activations.py): GEM's activation compression.
    activation_dtype: str = "compute"
    # Several ranks: how the tables are parallel. "1d": each sharded over every rank; "2d": sharded
    # within groups of sharding_group ranks and replicated across the groups (TorchRec's
    # DMPCollection), the replicas merged every replica_sync_every steps
    # (harness/train/distributed/sparse2d.py). sharding_group 0: half the ranks of a one-host job,
    # a host's ranks on several hosts. replica_merge: "average" (TorchRec's) or "updates" (each
    # replica's updates since the last merge added up, as 1-D applies every rank's gradient).
    sparse_parallel: str = "1d"
    sharding_group: int = 0
    replica_sync_every: int = 1
    replica_merge: str = "average"

    @property
    def dtype(self) -> str:
        return "bf16" if self.bf16 else "fp32"

    def to_dict(self) -> dict:
        return asdict(self)

    def chosen(self) -> list[str]:
        """``name=value`` of each choice and number switch not at its default."""
        default = StackOptions()
        return [
            f"{name}={getattr(self, name)}"
            for name in (*CHOICES, *NUMBERS)
            if getattr(self, name) != getattr(default, name)
        ]

    def describe(self) -> str:
        on = [name for name in OPTIMIZATIONS if getattr(self, name)]
        return ", ".join(on + self.chosen()) or "nothing"


OPTIMIZATIONS = tuple(f.name for f in fields(StackOptions) if f.type in (bool, "bool"))  # on/off
# the switches that choose among values, the first being the default
CHOICES = {
    "dense_parallel": ("ddp", "fsdp", "hsdp"),
    "activation_checkpointing": ("none", "hstu", "all"),
    "content": ("on", "off"),
    "activation_dtype": ("compute", "fp8"),
    "sparse_parallel": ("1d", "2d"),
    "replica_merge": ("average", "updates"),
}
NUMBERS = {"sharding_group": 0, "replica_sync_every": 1}  # switches that take a whole number, and its least
STACKS = {
    "baseline": StackOptions(**{name: False for name in OPTIMIZATIONS}),
    "optimized": StackOptions(),
}


def stack_options(name: str, dtype: str | None = None, switches: tuple[str, ...] = ()) -> StackOptions:
    """The named stack, with ``dtype`` ("fp32"/"bf16") overriding its precision if given, then
    each ``switches`` entry ("name=value", as `--set` takes them) applied in order."""
    if name not in STACKS:
        raise UsageError(f"--stack must be one of {', '.join(STACKS)}, got {name!r}")
    options = STACKS[name]
    options = options if dtype is None else replace(options, bf16=dtype == "bf16")
    return with_switches(options, switches)


def with_switches(options: StackOptions, switches) -> StackOptions:
    """``options`` with "name=value" switches applied: on/off ones take true/false (on/off, 1/0)."""
    for switch in switches:
        name, sep, value = switch.partition("=")
        name, value = name.strip().replace("-", "_"), value.strip().lower()
        known = OPTIMIZATIONS + tuple(CHOICES) + tuple(NUMBERS)
        if not sep or name not in known:
            raise UsageError(f"--set takes NAME=VALUE with NAME one of {', '.join(known)}; got {switch!r}")
        if name in NUMBERS:
            if not value.isdigit() or int(value) < NUMBERS[name]:
                raise UsageError(f"--set {name} takes a whole number >= {NUMBERS[name]}, got {value!r}")
            options = replace(options, **{name: int(value)})
        elif name in CHOICES:
            if value not in CHOICES[name]:
                raise UsageError(f"--set {name} must be one of {', '.join(CHOICES[name])}, got {value!r}")
            options = replace(options, **{name: value})
        elif value in ("true", "on", "1", "false", "off", "0"):
            options = replace(options, **{name: value in ("true", "on", "1")})
        else:
            raise UsageError(f"--set {name} is on or off (true/false), got {value!r}")
    return options


def check_one_process(options: StackOptions) -> None:
    """Refuse what only ranks can run: a sharded dense part needs more than one replica, and
    groups of ranks that shard the tables need ranks."""
    if options.dense_parallel != "ddp":
        raise UsageError(
            f"dense_parallel={options.dense_parallel} shards the dense part over ranks: "
            f"add --nproc 2 or more (one process has one replica)"
        )
    if options.sparse_parallel != "1d":
        raise UsageError(
            f"sparse_parallel={options.sparse_parallel} shards the tables within groups of ranks and "
            "replicates them across the groups: add --nproc 4 or more (one process holds every table)"
        )


def stack_label(options: StackOptions) -> str:
    """The stack's name where it is a named one, else the switches it has on."""
    for name, known in STACKS.items():
        if options == known:
            return name
    return options.describe()


class SparseAdagrad(torch.optim.Adagrad):
    """torch's Adagrad over row-sparse embedding gradients, with sparse invariant checks off.

    Its step builds COO tensors from each gradient; made with no explicit choice about their
    invariant checks, torch warns ("Sparse invariant checks are implicitly disabled") on every
    run. The gradients come from autograd's own embedding backward, so their indices are valid:
    checks off is the choice, made here and only for this step.
    """

    def step(self, closure=None):
        with torch.sparse.check_sparse_tensor_invariants(enable=False):
            return super().step(closure)


@functools.cache
def sync_free_fused_embedding_collection():
    """TorchRec's FusedEmbeddingCollection with a forward that reads nothing back to the host.

    TorchRec's forward splits each table group's looked-up rows by per-feature sizes that it sums
    on the device (``torch.sum`` of the lengths) and hands to ``torch.split`` as tensors: one
    device sync per feature, every step. Those sizes are the KJT's ``length_per_key``, host ints
    the batch carries (models/data.py). Same lookups, same outputs:
    {feature: JaggedTensor(values (n_f, dim), lengths (B,))}. The class is made on first use, as
    TorchRec's fused modules are imported: they pull in fbgemm's lookup code.
    """
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingCollection
    from torchrec.sparse.jagged_tensor import JaggedTensor

    class SyncFreeFusedEmbeddingCollection(FusedEmbeddingCollection):
        def forward(self, features):
            feature_dict = features.to_dict()
            sizes = dict(zip(features.keys(), features.length_per_key()))
            out = {}
            for emb_op, tables in zip(self._emb_modules, self._key_to_tables.values()):
                names, jts = [], []
                for table in tables:
                    for feature in table.feature_names:
                        jts.append(feature_dict[feature])
                        shared = feature in self._shared_features
                        names.append((feature, f"{feature}@{table.name}" if shared else feature))
                offsets = torch.ops.fbgemm.asynchronous_complete_cumsum(torch.cat([jt.lengths() for jt in jts]))
                lookups = emb_op(torch.cat([jt.values() for jt in jts]).int(), offsets.int(), weights=None)
                for (_, name), jt, rows in zip(names, jts, lookups.split([sizes[f] for f, _ in names])):
                    out[name] = JaggedTensor(
                        values=rows, lengths=jt.lengths(), weights=jt.values() if self.need_indices() else None
                    )
            return out

    return SyncFreeFusedEmbeddingCollection


def fuse_embeddings(model: nn.Module, device: torch.device) -> list[torch.optim.Optimizer]:
    """Swap plain TorchRec embedding modules for fused ones, keeping the weights.

    Pooled tables become a FusedEmbeddingBagCollection: one fbgemm table-batched kernel for all
    tables, with exact Adagrad applied inside the backward (no gradient tensor, no optimizer
    step). fbgemm has no CPU kernel for unpooled (sequence) tables, so on CPU those keep their
    nn.Embedding but get row-sparse gradients: Adagrad then touches only the looked-up rows,
    which is what the fused kernel does too. Returns the optimizers still to be stepped.
    """
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

    kwargs = {"lr": EMBEDDING_LR, "eps": ADAGRAD_EPS}
    remaining: list[nn.Parameter] = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, EmbeddingBagCollection):
                fused_type, configs = FusedEmbeddingBagCollection, child.embedding_bag_configs()
            elif isinstance(child, EmbeddingCollection) and device.type == "cuda":
                fused_type, configs = sync_free_fused_embedding_collection(), child.embedding_configs()
            elif isinstance(child, EmbeddingCollection):
                for table in child.embeddings.values():
                    table.sparse = True
                    remaining.append(table.weight)
                continue
            else:
                continue
            fused = fused_type(configs, optimizer_type=torch.optim.Adagrad, optimizer_kwargs=kwargs, device=device)
            fused.load_state_dict(child.state_dict())
            setattr(parent, name, fused)
    return [SparseAdagrad(remaining, lr=EMBEDDING_LR, eps=ADAGRAD_EPS)] if remaining else []


# -- applied from outside the model, on one process and on every rank alike ------------------


def dense_optimizer(params, options: StackOptions) -> torch.optim.Optimizer:
    """Adam over the dense parameters: one fused kernel, or the per-tensor loop a team writes first."""
    if options.fused_optimizer:
        return torch.optim.Adam(params, lr=DENSE_LR, fused=True)
    return torch.optim.Adam(params, lr=DENSE_LR, foreach=False)


def autocast_for(options: StackOptions, device: torch.device):
    """A context factory for the forward: its precision, bf16 autocast (weights and optimizer state
    stay fp32) or none, and how it saves activations for the backward (activation_dtype)."""
    saves = activations.saving(options.activation_dtype)
    if not options.bf16:
        return saves

    @contextlib.contextmanager
    def bf16():
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16), saves():
            yield

    return bf16


def seeded_model(workload, options: StackOptions, device: torch.device, seed: int) -> nn.Module:
    """What one process and every rank start from: the pure model of the workload as the stack
    runs it (for_stack), built from ``seed`` (the same weights for every stack and rank),
    activation checkpointing applied, and its dense blocks in NVTX ranges when they are on
    (gembench run --nsys)."""
    model = seeded(workload, device, seed)
    apply_ac(workload, model, options.activation_checkpointing)
    nvtx.enable_from_env(device)
    nvtx.apply_block_ranges(model, workload.blocks())
    return model


def on_ranks(options: StackOptions, pipeline: bool) -> StackOptions:
    """What a stack is on N ranks: TorchRec's sharded tables are always fbgemm's fused TBE (DMP has
    no plain-EmbeddingBag path), and overlap is the --pipeline choice; the rest is the stack's."""
    return replace(options, fused_embeddings=True, pipeline=pipeline)


def build_train_state(workload, options: StackOptions, device: torch.device, seed: int = 0) -> TrainState:
    """The workload's model as ``options`` runs it on one process (``workload``: as for_stack
    gave it), built from ``seed`` (same weights for every stack), the stack applied."""
    check_one_process(options)
    applied_switches(workload, options)
    model = seeded_model(workload, options, device, seed)
    optimizers: list[torch.optim.Optimizer] = fuse_embeddings(model, device) if options.fused_embeddings else []
    tables = embedding_parameters(model)  # after the swap: the fused modules' own
    if not options.fused_embeddings:
        optimizers.append(
            torch.optim.Adagrad([p for p in model.parameters() if id(p) in tables], lr=EMBEDDING_LR, eps=ADAGRAD_EPS)
        )
    dense = [p for p in model.parameters() if id(p) not in tables]
    optimizers.append(dense_optimizer(dense, options))
    apply_compile(workload, model, options)
    return TrainState(
        model=model,
        optimizers=optimizers,
        autocast=autocast_for(options, device),
        device=device,
        workload=workload,
        timer=SparseTimer(model, device, workload),
        dense_params=dense,
    )
