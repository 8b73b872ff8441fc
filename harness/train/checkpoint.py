"""Checkpoints as training jobs take them: the whole training state through torch.distributed.checkpoint.

What is saved is what training needs to go on bit for bit: the model's state (TorchRec's fused
embedding tables among it; on ranks, their shards as ShardedTensors and FSDP2's DTensors), every
optimizer's state (the dense one's through DCP's state_dict API, the fused embedding optimizers'
own KeyedOptimizer state), the step the next run starts at (which is also the data position: step
i trains on batch i of the seed's cycle) and each process's RNG. One folder a save,
``DIR/step-00000012``: DCP's files (every rank writes its own shards), whose ``.metadata`` DCP
writes last, then gembench's manifest (what ran: the workload, its identity hash, the world size,
the commit, the stack), written last of all by a rename. A folder without both is a save cut short
and is never loaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gembench.errors import UsageError

MANIFEST = "gembench.json"
METADATA = ".metadata"  # DCP's, written once every shard is


def step_folder(root: Path, step: int) -> Path:
    return Path(root) / f"step-{step:08d}"


def cached_stager():
    """DCP's blocking stager (a copy into CPU memory that knows TorchRec's ShardedTensors, which
    DCP's default stager does not), copying into the same buffers every save: allocating them
    anew faulted in every page of the state, which on this 2-core VM took most of a save's
    blocking. The buffers are page-locked only where an accelerator copies into them (DCP's own
    cached staging pins them always, which a CPU-only torch cannot). Reusing them is safe: a
    save begins only once the previous one is written (Saver.finish)."""
    from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
    from torch.distributed.checkpoint.staging import BlockingAsyncStager

    class Stager(BlockingAsyncStager):
        def stage(self, state_dict):
            if self.state_dict_cache is None:
                pinned = torch.accelerator.is_available()
                self.state_dict_cache = _create_cpu_state_dict(state_dict, pin_memory=pinned)
            return _copy_state_dict(state_dict, self.state_dict_cache)

    return Stager(cache_staged_state_dict=True)


def due_steps(first: int, loop_steps: int, every: int) -> list[int]:
    """The steps after which a run that begins at step ``first`` and trains ``loop_steps`` (warm-up
    and timed) saves: every ``every``-th of the whole job's steps."""
    return [s for s in range(first + 1, first + loop_steps + 1) if s % every == 0]


def fused_modules(model: torch.nn.Module) -> dict:
    """{name: module} of the modules whose optimizer runs inside their backward (TorchRec's fused)."""
    return {n: m for n, m in model.named_modules() if callable(getattr(m, "fused_optimizer", None))}


@dataclass
class Held:
    """What a save holds of a process's training state: ``snapshot(step)`` is the dict DCP saves
    and loads (its tensors the live ones, so that loading fills them in place) and ``apply(loaded)``
    puts back what loading cannot fill in place."""

    snapshot: Callable[[int], dict]
    apply: Callable[[dict], None]


def of_process(state) -> Held:
    """The training state of a one-process TrainState (step.py)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    def snapshot(step: int) -> dict:
        model_sd, optim_sd = get_state_dict(state.model, state.optimizers)
        fused = {n: m.fused_optimizer().state_dict() for n, m in fused_modules(state.model).items()}
        return {"model": model_sd, "optim": optim_sd, "fused": fused, "step": step, "rng": torch.get_rng_state()}

    def apply(loaded: dict) -> None:
        set_state_dict(
            state.model, state.optimizers, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"]
        )
        for name, module in fused_modules(state.model).items():
            module.fused_optimizer().load_state_dict(loaded["fused"][name])
        torch.set_rng_state(loaded["rng"])

    return Held(snapshot, apply)


def of_rank(dmp: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int) -> Held:
    """The training state of one rank of a DMP model, as TorchRec checkpoints it: DMP's state_dict
    (the tables' shards, the dense part whole or as FSDP2's DTensors) and its fused optimizer's,
    loaded in place and then handed back to them; the dense ``optimizer``'s state through DCP's
    state_dict API (which gives a fresh optimizer the state to load into); this rank's RNG under
    its own key.

    The dense optimizer's param_groups (its hyperparameters: the stack's, which the manifest
    checks) are not saved: a rank holds only its tables' keys, so DCP's loader, missing the others,
    also tries its pre-2.4 key layout, which differs from today's only for such tensor-free nests."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    def snapshot(step: int) -> dict:
        return {
            "model": dmp.state_dict(),
            "dense_optim": get_optimizer_state_dict(dmp.module, optimizer)["state"],
            "fused": dmp.fused_optimizer.state_dict(),
            "step": step,
            "rng": {f"rank{rank}": torch.get_rng_state()},
        }

    def apply(loaded: dict) -> None:
        dmp.load_state_dict(loaded["model"])
        groups = get_optimizer_state_dict(dmp.module, optimizer)["param_groups"]
        set_optimizer_state_dict(dmp.module, optimizer, {"state": loaded["dense_optim"], "param_groups": groups})
        dmp.fused_optimizer.load_state_dict(loaded["fused"])
        torch.set_rng_state(loaded["rng"][f"rank{rank}"])

    return Held(snapshot, apply)


def folder_bytes(folder: Path, pattern: str = "*") -> int:
    return sum(f.stat().st_size for f in Path(folder).rglob(pattern) if f.is_file())


@dataclass
class Saver:
    """Saves the state after every ``every``-th step of the run's loop (warm-up and timed steps),
    outside the step's clock, with DCP's asynchronous save: the loop is blocked while the state is
    staged (copied aside), and again only if the previous save is still writing when the next one
    is due; the files are written beside the steps. A save that fails (a full disk) is said once
    and ends the saving, never the run. ``first``: the step the run began at (a resumed run's);
    ``due``: the steps to save after (due_steps). On ranks, every rank calls it at the same steps:
    ``group`` is a process group of the save's own (DCP plans and finishes a save collectively,
    from its writing thread, which must not share the training's group) and the ``lead`` rank writes
    the manifest once DCP's metadata says every rank's shards are written."""

    held: Held
    every: int
    root: Path
    manifest: dict
    first: int = 0
    due: frozenset = frozenset()
    group: object | None = None  # torch.distributed.ProcessGroup; None: one process
    lead: bool = True
    rank: int = 0
    startup: object | None = None  # metrics/startup.Startup: the run's, told the staging buffers' making
    staging_s: float = 0.0
    saves: list = field(default_factory=list)
    error: str | None = None
    _pending: tuple | None = None  # (folder, step, started, blocked seconds, DCP's future)
    _stager: object | None = None

    def __call__(self, i: int) -> None:
        done = self.first + i + 1  # steps trained once loop step i is over
        if self.error is not None:
            return
        import torch.distributed.checkpoint as dcp

        if self._stager is None:
            self.prepare()
        if done not in self.due:
            return
        waited = self.finish()  # the previous save's files must be written before this one starts
        folder = step_folder(self.root, done)
        start = time.perf_counter()
        where = {"no_dist": True} if self.group is None else {"process_group": self.group}
        try:
            snapshot = self.held.snapshot(done)
            response = dcp.async_save(snapshot, checkpoint_id=str(folder), async_stager=self._stager, **where)
        except save_failures() as err:
            return self._failed(done, folder, err)
        future = getattr(response, "upload_completion", response)
        self._pending = (folder, done, start, waited + time.perf_counter() - start, future)

    def prepare(self) -> None:
        """Make the staging buffers (a copy of the state), so that no save pays for them: each
        then blocks the loop for a copy into them. After the loop's first step, when every
        optimizer has its state (asking for it earlier would make it, with a step of Adam's
        count the run never took), inside the start-up's warm-up where it has one."""
        start = time.perf_counter()
        phase = self.startup.phase("staging") if self.startup is not None and self.startup.open else None
        with phase or contextlib.nullcontext():
            self._stager = cached_stager()
            self._stager.stage(self.held.snapshot(self.first))
        self.staging_s = time.perf_counter() - start

    def finish(self) -> float:
        """Wait for the save still writing, then write its manifest; the seconds waited."""
        if self._pending is None:
            return 0.0
        folder, done, start, blocked, future = self._pending
        self._pending = None
        t0 = time.perf_counter()
        try:
            future.result()
            if self.lead:
                write_manifest(folder, self.manifest | {"step": done})
        except save_failures() as err:
            self._failed(done, folder, err)
            return time.perf_counter() - t0
        waited = time.perf_counter() - t0
        self.saves.append(
            {
                "step": done,
                "seconds": time.perf_counter() - start,  # from the call to the manifest
                "blocked_s": blocked + waited,
                "bytes": folder_bytes(folder),
                "own_bytes": folder_bytes(folder, f"__{self.rank}_*.distcp"),  # the files this process wrote
            }
        )
        return waited

    def _failed(self, done: int, folder: Path, err: Exception) -> None:
        self.error = f"the save at step {done} into {folder} failed ({reason(err)}); no later save was tried"
        if self.lead:
            print(f"gembench run: warning: {self.error}", flush=True)

    def record(self) -> dict:
        """What the run's saves cost: each save's step, seconds (call to manifest), the loop's
        blocked seconds and bytes written, the totals, and the staging buffers' making."""
        self.finish()
        return {
            "every": self.every,
            "dir": str(self.root),
            "saves": self.saves,
            "blocked_s": sum(s["blocked_s"] for s in self.saves),
            "bytes": sum(s["bytes"] for s in self.saves),
            "staging_s": self.staging_s,  # the staging buffers made once, after the first step
            "async": True,
            **({"error": self.error} if self.error else {}),
        }


def save_failures() -> tuple:
    """What a failed save raises: the OS's error on one process, DCP's (every rank's failures) on ranks."""
    from torch.distributed.checkpoint.api import CheckpointException

    return OSError, CheckpointException


def reason(err: Exception) -> str:
    """What went wrong, in a few words: the OS's reason, or the first of DCP's ranks' failures."""
    if isinstance(err, OSError):
        return err.strerror or str(err)
    failures = getattr(err, "failures", None)  # DCP's CheckpointException: {rank: exception}
    if failures:
        rank, first = sorted(failures.items())[0]
        return f"rank {rank}: {reason(first) if isinstance(first, Exception) else first}"
    return str(err).splitlines()[0] if str(err) else type(err).__name__


def across_ranks(records: list[dict | None]) -> dict | None:
    """The job's checkpoint section from each rank's: the lead rank's saves (its bytes are the
    whole save's, every rank's files in one folder), each save blocking the job as long as its
    slowest rank (the next step waits for every rank), and each rank's blocked seconds and bytes."""
    if not records or records[0] is None:
        return None
    if len(records) == 1 or "saves" not in records[0]:
        return records[0]
    saves = [
        s | {"blocked_s": max(r["saves"][k]["blocked_s"] for r in records if len(r["saves"]) > k)}
        for k, s in enumerate(records[0]["saves"])
    ]
    return records[0] | {
        "saves": saves,
        "blocked_s": sum(s["blocked_s"] for s in saves),
        "ranks_blocked_s": [r["blocked_s"] for r in records],
        "ranks_bytes": [sum(s["own_bytes"] for s in r["saves"]) for r in records],
    }


def write_manifest(folder: Path, manifest: dict) -> None:
    tmp = Path(folder) / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, Path(folder) / MANIFEST)


def complete(folder: Path) -> bool:
    return (Path(folder) / METADATA).is_file() and (Path(folder) / MANIFEST).is_file()


def resolve(path: Path) -> Path:
    """--resume's folder: a save (step-N), or a --checkpoint-dir, whose latest complete save is taken."""
    path = Path(path)
    if not path.is_dir():
        raise UsageError(f"--resume {path}: no such folder (give a --checkpoint-dir or one of its step-N folders)")
    if path.name.startswith("step-") or (path / MANIFEST).exists() or (path / METADATA).exists():
        if not complete(path):
            missing = METADATA if not (path / METADATA).is_file() else MANIFEST
            raise UsageError(
                f"--resume {path}: the save is incomplete (no {missing}: it was cut short); "
                "resume from an earlier step-N folder"
            )
        return path
    saves = sorted(p for p in path.glob("step-*") if p.is_dir() and complete(p))
    if not saves:
        raise UsageError(f"--resume {path}: no complete save in it (step-N folders with {METADATA} and {MANIFEST})")
    return saves[-1]


def check_resumable(folder: Path, manifest: dict) -> dict:
    """The save's manifest, when it was made by the run this one is (same workload, identity,
    world size, stack and commit); else one line saying what differs."""
    saved = json.loads((Path(folder) / MANIFEST).read_text())
    for key, what in (
        ("world_size", "world size"),
        ("identity", "model or config"),
        ("options", "stack"),
        ("seed", "seed"),
        ("commit", "commit"),
    ):
        if saved.get(key) != manifest.get(key):
            raise UsageError(
                f"--resume {folder}: saved with another {what} ({key} {saved.get(key)!r}, this run "
                f"{manifest.get(key)!r}); resume with the run that saved it, or start afresh"
            )
    return saved


def manifest_of(ident, world_size: int, options: dict, seed: int) -> dict:
    """What a save says of the run that made it: a resumed run must match it (check_resumable)."""
    from gembench.harness.device.env import git_state

    return {
        "workload": ident.name,
        "identity": ident.hash,
        "world_size": world_size,
        "options": options,
        "seed": seed,
        "commit": git_state()[0],
    }


def wanted(run) -> bool:
    """Does the run (a RunConfig) save or resume?"""
    return run.checkpoint_every is not None or run.resume is not None


def plan(run, manifest: dict) -> dict:
    """--checkpoint-every and --resume (``run``: a RunConfig), checked before any work: the save to
    resume from (its manifest matching this run's), the step it goes on at, the steps to save
    after, and no earlier save among them to overwrite."""
    folder, first = None, 0
    if run.resume is not None:
        folder = resolve(run.resume)
        first = int(check_resumable(folder, manifest)["step"])
    due = []
    if run.checkpoint_every is not None:
        due = due_steps(first, run.warmup + run.steps, run.checkpoint_every)
        taken = [f for f in (step_folder(run.checkpoint_dir, s) for s in due) if f.exists()]
        if taken:
            raise UsageError(
                f"--checkpoint-dir {run.checkpoint_dir} already holds {taken[0].name}, which this run would save: "
                "saves are never overwritten; pass another --checkpoint-dir"
            )
    return {"manifest": manifest, "resume": folder, "first": first, "due": frozenset(due)}


def restore(held: Held, folder: Path, step: int, group=None) -> None:
    """Load the save in ``folder`` (check_resumable passed it, its manifest naming ``step``) into
    ``held``; a state of another step is refused. ``group``: the ranks' process group (None: one
    process)."""
    import torch.distributed.checkpoint as dcp

    loaded = held.snapshot(0)
    where = {"no_dist": True} if group is None else {"process_group": group}
    dcp.load(loaded, checkpoint_id=str(folder), **where)
    held.apply(loaded)
    if loaded["step"] != step:
        raise UsageError(f"--resume {folder}: its manifest says step {step}, its state step {loaded['step']}")
