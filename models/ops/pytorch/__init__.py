"""PyTorch implementations of the ops: the CPU paths and the padded references."""
