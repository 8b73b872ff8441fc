"""Checkpoints as training jobs take them: the whole training state through torch.distributed.checkpoint.

What is saved is what training needs to go on bit for bit: the model's state (TorchRec's fused
embedding tables among it), every optimizer's state (torch's through DCP's ``get_state_dict``, the
fused embedding optimizers' own KeyedOptimizer state), the step the next run starts at (which is
also the data position: step i trains on batch i of the seed's cycle) and the RNG. One folder a
save, ``DIR/step-00000012``: DCP's files, whose ``.metadata`` DCP writes last, then gembench's
manifest (what ran: the workload, its identity hash, the world size, the commit, the stack),
written last of all by a rename. A folder without both is a save cut short and is never loaded.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gembench.errors import UsageError

MANIFEST = "gembench.json"
METADATA = ".metadata"  # DCP's, written once every shard is


def step_folder(root: Path, step: int) -> Path:
    return Path(root) / f"step-{step:08d}"


def due_steps(first: int, loop_steps: int, every: int) -> list[int]:
    """The steps after which a run that begins at step ``first`` and trains ``loop_steps`` (warm-up
    and timed) saves: every ``every``-th of the whole job's steps."""
    return [s for s in range(first + 1, first + loop_steps + 1) if s % every == 0]


def fused_modules(model: torch.nn.Module) -> dict:
    """{name: module} of the modules whose optimizer runs inside their backward (TorchRec's fused)."""
    return {n: m for n, m in model.named_modules() if callable(getattr(m, "fused_optimizer", None))}


def app_state(state, step: int) -> dict:
    """The training state of a one-process TrainState (step.py) after ``step`` steps, as DCP saves
    and loads it: loading fills these very tensors."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(state.model, state.optimizers)
    fused = {n: m.fused_optimizer().state_dict() for n, m in fused_modules(state.model).items()}
    return {"model": model_sd, "optim": optim_sd, "fused": fused, "step": step, "rng": torch.get_rng_state()}


def apply_state(state, loaded: dict) -> None:
    """Put a loaded ``app_state`` back into the model, the optimizers and the RNG."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    set_state_dict(state.model, state.optimizers, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])
    for name, module in fused_modules(state.model).items():
        module.fused_optimizer().load_state_dict(loaded["fused"][name])
    torch.set_rng_state(loaded["rng"])


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file())


@dataclass
class Saver:
    """Saves the state after every ``every``-th step of the run's loop (warm-up and timed steps),
    outside the step's clock, with DCP's asynchronous save: the loop is blocked while the state is
    staged (copied aside), and again only if the previous save is still writing when the next one
    is due; the files are written beside the steps. A save that fails (a full disk) is said once
    and ends the saving, never the run. ``first``: the step the run began at (a resumed run's);
    ``due``: the steps to save after (due_steps)."""

    state: object
    every: int
    root: Path
    manifest: dict
    first: int = 0
    due: frozenset = frozenset()
    saves: list = field(default_factory=list)
    error: str | None = None
    _pending: tuple | None = None  # (folder, step, started, blocked seconds, DCP's future)

    def __call__(self, i: int) -> None:
        done = self.first + i + 1  # steps trained once loop step i is over
        if self.error is not None or done not in self.due:
            return
        import torch.distributed.checkpoint as dcp

        waited = self.finish()  # the previous save's files must be written before this one starts
        folder = step_folder(self.root, done)
        start = time.perf_counter()
        try:
            response = dcp.async_save(app_state(self.state, done), checkpoint_id=str(folder), no_dist=True)
        except OSError as err:
            return self._failed(done, folder, err)
        future = getattr(response, "upload_completion", response)
        self._pending = (folder, done, start, waited + time.perf_counter() - start, future)

    def finish(self) -> float:
        """Wait for the save still writing, then write its manifest; the seconds waited."""
        if self._pending is None:
            return 0.0
        folder, done, start, blocked, future = self._pending
        self._pending = None
        t0 = time.perf_counter()
        try:
            future.result()
            write_manifest(folder, self.manifest | {"step": done})
        except OSError as err:
            self._failed(done, folder, err)
            return time.perf_counter() - t0
        waited = time.perf_counter() - t0
        self.saves.append(
            {
                "step": done,
                "seconds": time.perf_counter() - start,  # from the call to the manifest
                "blocked_s": blocked + waited,
                "bytes": folder_bytes(folder),
            }
        )
        return waited

    def _failed(self, done: int, folder: Path, err: OSError) -> None:
        self.error = f"the save at step {done} into {folder} failed ({err.strerror or err}); no later save was tried"
        print(f"gembench run: warning: {self.error}", flush=True)

    def record(self) -> dict:
        """What the run's saves cost: each save's step, seconds (call to manifest), the loop's
        blocked seconds and bytes written, and the totals."""
        self.finish()
        return {
            "every": self.every,
            "dir": str(self.root),
            "saves": self.saves,
            "blocked_s": sum(s["blocked_s"] for s in self.saves),
            "bytes": sum(s["bytes"] for s in self.saves),
            "async": True,
            **({"error": self.error} if self.error else {}),
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
        ("identity", "model or config"),
        ("world_size", "world size"),
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


def restore(state, folder: Path, step: int) -> None:
    """Load the save in ``folder`` (check_resumable passed it, its manifest naming ``step``) into
    ``state``; a state of another step is refused."""
    import torch.distributed.checkpoint as dcp

    loaded = app_state(state, 0)
    dcp.load(loaded, checkpoint_id=str(folder), no_dist=True)
    apply_state(state, loaded)
    if loaded["step"] != step:
        raise UsageError(f"--resume {folder}: its manifest says step {step}, its state step {loaded['step']}")
