"""asv: embedding imbalance (max/mean of per-rank work) per config; lower is better.

Tracked only where the run measures it (multi-rank runs); elsewhere asv reports it as skipped.
"""

from ._common import CONFIGS, metric, run_configs


class Imbalance:
    params = CONFIGS
    param_names = ["config"]
    timeout = 900

    def setup_cache(self):
        return run_configs()

    def setup(self, results, config):
        if (results.get(config) or {}).get("imbalance_max_mean") is None:
            raise NotImplementedError("this run does not measure imbalance")

    def track_imbalance_max_mean(self, results, config):
        return metric(results, config, "imbalance_max_mean")

    track_imbalance_max_mean.unit = "max/mean"
