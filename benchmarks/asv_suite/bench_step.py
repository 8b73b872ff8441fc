"""asv: the training step per config, tracked across commits (every figure: lower is better).

The same figures for GEMBENCH_ASV_NPROC ranks (RankStep), MFU against the host's peak
(mfu_host: the basis one process of N x T threads is measured on, so one process and N ranks
compare).

asv 0.6 treats a larger value as worse for every benchmark (track_ ones included), so only
lower-is-better quantities appear here: step time, time over ideal (1/MFU: 1.0 would be a step at
the reference peak), and peak memory. Each config is run once per commit through the harness API
(gembench.harness.train.runner.run_benchmark), in setup_cache, and the tracks read that one result.

  asv run HEAD~3..HEAD --bench bench_step        # a few commits
  asv continuous HEAD~1 HEAD --bench bench_step  # exits 1 when something got worse
"""

from ._common import OneProcess, Ranks, metric


class Step(OneProcess):
    requires = "step_time_s"

    def track_step_time(self, results, config):
        return metric(results, config, "step_time_s")

    track_step_time.unit = "seconds"

    def track_time_over_ideal(self, results, config):
        return 1.0 / metric(results, config, "mfu")

    track_time_over_ideal.unit = "x ideal (1/MFU)"

    def track_peak_memory(self, results, config):
        return metric(results, config, "peak_memory_bytes")

    track_peak_memory.unit = "bytes"


class RankStep(Ranks):
    requires = "mfu_host"

    def track_step_time(self, results, config):
        return metric(results, config, "step_time_s")

    track_step_time.unit = "seconds"

    def track_time_over_ideal_host(self, results, config):
        return 1.0 / metric(results, config, "mfu_host")

    track_time_over_ideal_host.unit = "x ideal (1/MFU on the host's peak)"

    def track_peak_memory(self, results, config):
        return metric(results, config, "peak_memory_bytes")

    track_peak_memory.unit = "bytes"
