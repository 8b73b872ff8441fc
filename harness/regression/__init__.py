"""Regression detection, statistics only: tests, paired commits, comparison, exact counters, thresholds, the gate."""
