"""GEM-like model zoo: configurations, synthetic data, pure nn.Module blocks and their FLOPs."""

import logging

# Importing TorchRec trips a torch.fx deprecation warning on every run; it is not ours to fix
# and would bury the first line a user reads.
logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
