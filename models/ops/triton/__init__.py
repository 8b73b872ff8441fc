"""Triton implementations of the ops (GPU kernels; CPU tensors run them in Triton's interpreter)."""
