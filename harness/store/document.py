"""The one builder of a result document, for one process and for N ranks alike.

The runners measure and summarize; this puts the figures in the documented shape (schema
``gembench.result/1``, fields in store/results.py): identity, what ran, where, against which peak,
the samples and summary, sections only some runs have (ranks, plan, imbalance, comm), and the
headline metrics every reader (compare, gate, report, asv) takes.
"""

from __future__ import annotations

import datetime as dt
import secrets

from gembench.harness.store.results import SCHEMA


def headline_metrics(summary: dict) -> dict:
    """The figures every run has, as ``result["metrics"]``; runs add their own beside them."""
    metrics = {
        "mfu": summary["mfu"],
        "step_time_s": summary["step_time_s"]["p50"],
        "examples_per_s": summary["examples_per_s"],
        "peak_memory_bytes": summary["peak_memory_bytes"],
    }
    if "mfu_host" in summary:  # against the host's peak: one process and N ranks compare on it
        metrics["mfu_host"] = summary["mfu_host"]
    return metrics


def result_document(
    cfg,
    label: str,
    run: dict,
    env: dict,
    peak: dict,
    flops: dict,
    samples: dict,
    summary: dict,
    sections: dict | None = None,
    metrics: dict | None = None,
    diverged: dict | None = None,
) -> dict:
    """``label`` names the run in its id (stack, ranks); ``sections`` come after the summary;
    ``metrics`` are added to the headline ones."""
    created = dt.datetime.now(dt.timezone.utc)
    doc = {
        "schema": SCHEMA,
        "id": f"{created:%Y%m%dT%H%M%SZ}-{cfg.name}-{label}-{secrets.token_hex(3)}",
        "created": created.isoformat(timespec="seconds"),
        "config": {"name": cfg.name, "hash": cfg.hash, "path": cfg.source, "kind": cfg.kind},
        "run": run,
        "env": env,
        "peak": peak,
        "flops": flops,
        "samples": samples,
        "summary": summary,
        **(sections or {}),
        "metrics": {**headline_metrics(summary), **(metrics or {})},
    }
    if diverged:
        doc["diverged"] = diverged
    return doc
