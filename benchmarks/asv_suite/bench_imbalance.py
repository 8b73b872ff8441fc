"""asv: embedding imbalance (max/mean of per-rank work) per config; lower is better.

Measured on GEMBENCH_ASV_NPROC (default 2) torchrun ranks; skipped where a commit cannot run them.
"""

from ._common import Ranks, metric


class Imbalance(Ranks):
    requires = "imbalance_max_mean"

    def track_imbalance_max_mean(self, results, config):
        return metric(results, config, "imbalance_max_mean")

    track_imbalance_max_mean.unit = "max/mean"
