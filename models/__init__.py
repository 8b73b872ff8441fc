"""GEM-like model zoo: configurations, synthetic data, pure nn.Module blocks and their FLOPs."""
