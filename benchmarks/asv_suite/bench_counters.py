"""asv: the exact cost counters of one training step per config (lower is better).

Counted on a step of its own after the timed ones (harness/metrics/counters.py): aten ops the
step dispatches, host synchronisations, torch.compile graph breaks and recompiles. They do not
move with the machine's load, so a step in their history is a real change in the code's work.
"""

from ._common import OneProcess, metric


class Counters(OneProcess):
    requires = "aten_ops"

    def track_aten_ops(self, results, config):
        return metric(results, config, "aten_ops")

    track_aten_ops.unit = "ops per step"

    def track_host_syncs(self, results, config):
        return metric(results, config, "host_syncs")

    track_host_syncs.unit = "syncs per step"

    def track_graph_breaks(self, results, config):
        return metric(results, config, "graph_breaks")

    track_graph_breaks.unit = "graph breaks"

    def track_recompiles(self, results, config):
        return metric(results, config, "recompiles")

    track_recompiles.unit = "recompiles"
