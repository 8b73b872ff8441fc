"""What each GPU of a projected step moves and holds under a plan: bytes looked up, sent and received
by each collective, and held, per table and sharding (docs/projection.md).

A row-split shard serves its rows' share of the lookups (uniform IDs) or the power law's mass over
its rows (row_skew(): hot rows first, metrics/imbalance.py's ``zipf_share``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gembench.harness.metrics.imbalance import zipf_share
from gembench.harness.projection.subject import Subject
from gembench.harness.train.distributed.plan import ROW_SPLITS

ID_BYTES = 8  # int64 IDs in the KJT all-to-all (TorchRec's default index dtype)
LENGTH_BYTES = 4  # one int32 length per example and feature
EMB_BYTES = 4  # fp32 embedding rows and pooled outputs (TorchRec's default, no quantized comms)
DP_STATE_BYTES = 16  # a data-parallel table's element: weight, gradient, Adam m and v (fp32)
ROW_STATE_BYTES = 4  # a sharded table's row-wise Adagrad state: one fp32 a row (the fused TBE's)


def _lookup_shares(sizes: list, offsets: list, rows: int, alpha: float) -> np.ndarray:
    """The share of a row-split table's lookups each shard serves: its share of the rows when IDs
    are uniform over them (hashed), the power law's mass over its row range when hot rows come first."""
    if not alpha:
        return np.array([s[0] / rows for s in sizes], dtype=float)
    return np.array([zipf_share(o[0], o[0] + s[0], rows, alpha) for s, o in zip(sizes, offsets)])


@dataclass
class _Table:
    """One table's volumes under one sharding, per shard (placed by ranks) and for every GPU."""

    kind: str
    sequence: bool
    look: np.ndarray  # lookup bytes, per shard
    kjt_recv: np.ndarray  # ID bytes received, per shard
    a2a_send: np.ndarray  # output all-to-all bytes sent (world), per shard
    rs_in: np.ndarray  # partial sums into a node's reduce-scatter (table_row_wise, grid), per shard
    cross_send: np.ndarray  # after it, bytes sent to the other nodes, per shard
    kjt_send: float = 0.0  # every GPU: ID bytes sent
    a2a_recv: float = 0.0  # every GPU: output bytes received (world all-to-all)
    cross_recv: float = 0.0  # every GPU: output bytes received from the nodes (table_row_wise, grid)
    rs_world: float = 0.0  # every GPU: row-wise reduce-scatter buffer
    dp_lookup: float = 0.0  # every GPU: a data-parallel table's own lookups
    dp_params: float = 0.0  # a data-parallel table's elements (all-reduced, Adam-updated)
    held: np.ndarray | None = None  # bytes held, per shard (weights + optimizer state)


class Volumes:
    """Each GPU's bytes under a plan, for one model, world and per-rank batch; each table's
    volumes are computed once per sharding (the planner rates many plans of the same options)."""

    def __init__(
        self, m: Subject, ids: dict[str, float], world: int, batch: int, gpus_per_node: int, sent: int = EMB_BYTES
    ):
        self.ids, self.world, self.batch, self.sent = ids, world, batch, sent  # sent: bytes per element sent
        self.g = min(world, gpus_per_node)
        self.nodes = math.ceil(world / self.g)
        self.sequences, self.alphas = m.sequences, m.skew
        self._cache: dict[tuple, _Table] = {}

    def _table(self, name: str, t: dict) -> _Table:
        sizes = t["shard_sizes"]
        key = (name, t["sharding"], len(sizes), tuple(sizes[0]), tuple(sizes[-1]))
        if key not in self._cache:
            self._cache[key] = self._new(name, t["sharding"], sizes, t.get("shard_offsets") or _offsets(t))
        return self._cache[key]

    def _new(self, name: str, kind: str, sizes: list, offsets: list) -> _Table:
        n_ids, n = self.ids.get(name, 0.0), len(sizes)
        gb, batch = self.world * self.batch, self.batch
        sequence = name in self.sequences
        cols = np.array([s[1] for s in sizes], dtype=float)
        zeros = np.zeros(n)
        out = _Table(kind, sequence, zeros, zeros, zeros, zeros, zeros)
        if kind == "data_parallel":
            rows, dim = sizes[0]
            out.dp_lookup, out.dp_params = batch * n_ids * dim * EMB_BYTES, float(rows * dim)
            out.held = np.full(n, rows * dim * DP_STATE_BYTES, dtype=float)
            return out
        first_block = [i for i in range(n) if offsets[i][1] == offsets[0][1]]
        dim_total = float(sum(s[1] for s, o in zip(sizes, offsets) if o[0] == offsets[0][0]))
        if kind in ROW_SPLITS:
            block_rows = sum(sizes[i][0] for i in first_block)
            share = _lookup_shares(sizes, offsets, block_rows, self.alphas.get(name, 0.0))
        else:
            share = np.ones(n)
        id_bytes = n_ids * ID_BYTES + LENGTH_BYTES
        looked = gb * n_ids * share
        out.look, out.kjt_recv = looked * cols * EMB_BYTES, gb * id_bytes * share
        out.kjt_send = batch * id_bytes * len({o[1] for o in offsets})  # each column block needs every ID
        out.held = np.array([s[0] * s[1] * EMB_BYTES + s[0] * ROW_STATE_BYTES for s in sizes], dtype=float)
        sent = self.sent
        if sequence:  # unpooled rows go back to their examples' ranks
            out.a2a_send = looked * cols * sent
            out.a2a_recv = batch * n_ids * dim_total * sent
        elif kind in ("table_wise", "column_wise"):
            out.a2a_send = gb * cols * sent
            out.a2a_recv = batch * dim_total * sent
        elif kind == "row_wise":
            out.rs_world = gb * dim_total * sent
        else:  # table_row_wise, grid: reduce-scatter in the node, then each GPU's share to its peers
            out.rs_in = gb * cols * sent
            out.cross_send = gb / self.g * cols * sent
            out.cross_recv = batch * dim_total * sent
        return out

    def __call__(self, tables: dict[str, dict]) -> dict:
        """Per GPU (arrays of W): bytes looked up, sent and received by each collective, held, and
        held in sharded tables (``synced``: what 2D's replica sync all-reduces; not the data-parallel
        tables, whose gradients DDP all-reduces)."""
        w = self.world
        keys = ("lookup", "kjt_send", "kjt_recv", "a2a_send", "a2a_recv", "rs_in", "cross_send", "cross_recv", "held")
        keys += ("synced",)
        v: dict = {k: np.zeros(w) for k in keys}
        v["rs_world"], v["dp_params"], v["dp_lookup"] = 0.0, 0.0, 0.0
        groups = set()  # TorchRec sends each (module, sharding type) group in collectives of its own
        for name, t in tables.items():
            x = self._table(name, t)
            if x.kind == "data_parallel":
                v["lookup"] += x.dp_lookup
                v["dp_lookup"] += x.dp_lookup
                v["held"] += x.held[0]
                v["dp_params"] += x.dp_params
                continue
            ranks = np.asarray(t["ranks"], dtype=int)
            groups.add((x.sequence, x.kind))
            for key in ("kjt_recv", "a2a_send", "rs_in", "cross_send", "held"):
                np.add.at(v[key], ranks, getattr(x, key))
            np.add.at(v["lookup"], ranks, x.look)
            np.add.at(v["synced"], ranks, x.held)
            v["kjt_send"] += x.kjt_send
            v["a2a_recv"] += x.a2a_recv
            v["cross_recv"] += x.cross_recv
            v["rs_world"] += x.rs_world
        v["groups"] = len(groups)
        v["a2a_groups"] = len([g for g in groups if g[0] or g[1] in ("table_wise", "column_wise")])
        return v


def _offsets(t: dict) -> list:
    """Shard offsets of a plan recorded without them: rows stacked (row splits) or columns side by side."""
    sizes = t["shard_sizes"]
    if t["sharding"] == "column_wise":
        starts = np.cumsum([0] + [s[1] for s in sizes])
        return [[0, int(starts[i])] for i in range(len(sizes))]
    if t["sharding"] in ROW_SPLITS:
        starts = np.cumsum([0] + [s[0] for s in sizes])
        return [[int(starts[i]), 0] for i in range(len(sizes))]
    return [[0, 0]] * len(sizes)


def volumes(
    m: Subject, tables: dict[str, dict], ids: dict[str, float], world: int, batch: int, gpus_per_node: int = 8
) -> dict:
    """Per rank (arrays of W): the bytes of each collective of the step; ``batch`` is per rank."""
    return Volumes(m, ids, world, batch, gpus_per_node)(tables)
