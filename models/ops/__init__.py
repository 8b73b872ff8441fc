"""Operators with several backends: one small dispatcher per op (``hstu_attention.py``) picks an
implementation from ``pytorch/`` (CPU and reference paths) or ``triton/`` (GPU kernels).
Model blocks call the dispatchers, never a backend."""
