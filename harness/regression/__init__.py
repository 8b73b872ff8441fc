"""Regression detection: the result store, statistics, comparison, thresholds and the CI gate."""
