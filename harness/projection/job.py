"""What a projected job pays outside its steps: start-up and checkpoints, priced by a stated model.

None of it is measured at the projected size; each figure carries a measured one there by a rule:

- Start-up (with --from, a result that recorded its start-up by phase): every phase as the result
  measured it, except the sharding plan, which is this projection's own planner time at each world
  size (TorchRec's planner, timed here). Rendezvous, build, compile and warm-up are held as
  measured: nothing here says how they grow with the world, and the table says so.
- A checkpoint: the bytes one GPU writes (the largest GPU's embedding shards with their optimizer
  state, under 2D split over the shard's replicas, and its share of the dense weights and Adam
  state: DCP writes a replicated tensor once),
  staged into host memory at the cluster's host-copy bandwidth (what an asynchronous save blocks
  the loop for), written at the node's storage bandwidth (the cluster file's storage_GBps; not
  priced without it). A save still writing when the next is due blocks the loop for the rest.
- The job: ``steps`` steps and a save every ``every``: end-to-end MFU = model FLOPs / (start-up +
  steps + blocked saves), goodput the steps' share of that wall time.
"""

from __future__ import annotations

from gembench.harness.projection.cluster import Cluster

DENSE_STATE_BYTES = 4 + 8  # an fp32 weight and Adam's two moments, per dense parameter
JOB_STEPS = 10_000
CHECKPOINT_EVERY = 500  # steps between saves, as torchtitan's example configs take them


def job_cost(
    row: dict, dense_params: float, cluster: Cluster, startup: dict | None, steps: int, every: int
) -> dict | None:
    """A projection row's job figures (``row``: a fitting row of sweep.sweep); ``startup``: the
    --from result's start-up section (None: not known, left out of the job)."""
    if not row["plan"]["fits"]:
        return None
    world, step_s = row["world"], row["step_time_s"]
    replicas = (row.get("sparse") or {}).get("replicas", 1)  # 2D: each shard written once, by one replica
    per_gpu = row["memory"]["embeddings_bytes"] / replicas + DENSE_STATE_BYTES * dense_params / world
    staged = per_gpu / cluster.host_copy_Bps if cluster.host_copy_Bps else None
    written = per_gpu * min(world, cluster.gpus_per_node) / cluster.storage_Bps if cluster.storage_Bps else None
    blocked = None
    if staged is not None:
        blocked = staged + max(0.0, (written or 0.0) - every * step_s)  # the loop waits for the previous save
    start = None
    if startup is not None:
        start = startup["to_first_step_s"] - startup["phases"].get("plan", 0.0) + row["plan"]["seconds"]
    stepping = steps * step_s
    job_s = stepping + (start or 0.0) + (steps // every) * (blocked or 0.0)
    return {
        "steps": steps,
        "checkpoint_every": every,
        "startup_s": start,
        "checkpoint_bytes_per_gpu": per_gpu,
        "checkpoint_staged_s": staged,
        "checkpoint_written_s": written,
        "checkpoint_blocked_s": blocked,
        "job_s": job_s,
        "goodput": stepping / job_s if job_s else 0.0,
        "end_to_end_mfu": row["mfu"] * stepping / job_s if job_s else 0.0,
        "includes": [k for k, v in (("start-up", start), ("checkpoints", blocked)) if v is not None],
    }
