"""PyTorch's own distributed test suite, run against the ringseed backend (and Gloo, to compare)."""
