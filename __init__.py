"""gembench: benchmarks and regression gates for GEM-like recommendation training."""

__version__ = "0.1.0"
