"""asv: embedding imbalance (max/mean of per-rank work) per config; lower is better.

Tracked only where the run measures it (multi-rank runs); elsewhere asv reports it as skipped.
"""

from ._common import TrackedRun, metric


class Imbalance(TrackedRun):
    requires = "imbalance_max_mean"

    def track_imbalance_max_mean(self, results, config):
        return metric(results, config, "imbalance_max_mean")

    track_imbalance_max_mean.unit = "max/mean"
