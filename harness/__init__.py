"""Measuring: hardware, staged steps, metrics, results, comparison and gates."""
