"""Projection to clusters no laptop has: offline plans, one cost model, calibrated links, checks."""
