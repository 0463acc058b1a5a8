"""The SDK of the node cache in training pods: an fsspec filesystem (``ringseed://``), async saves, a FUSE mount."""
