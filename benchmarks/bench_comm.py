"""asv: exposed-communication share of the step per config (communication not hidden behind
compute, divided by step time); lower is better. Skipped where the run has no collectives.
"""

from ._common import CONFIGS, metric, run_configs


class Comm:
    params = CONFIGS
    param_names = ["config"]
    timeout = 900

    def setup_cache(self):
        return run_configs()

    def setup(self, results, config):
        if (results.get(config) or {}).get("exposed_comm_fraction") is None:
            raise NotImplementedError("this run measures no communication")

    def track_exposed_comm_fraction(self, results, config):
        return metric(results, config, "exposed_comm_fraction")

    track_exposed_comm_fraction.unit = "fraction of step"
