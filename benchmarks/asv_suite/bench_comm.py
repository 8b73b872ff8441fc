"""asv: exposed-communication share of the step per config (communication not hidden behind
compute, divided by step time); lower is better. Skipped where the run has no collectives.
"""

from ._common import Ranks, metric


class Comm(Ranks):
    requires = "exposed_comm_fraction"

    def track_exposed_comm_fraction(self, results, config):
        return metric(results, config, "exposed_comm_fraction")

    track_exposed_comm_fraction.unit = "fraction of step"
