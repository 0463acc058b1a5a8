"""ringseed: peer-to-peer model distribution and fault-tolerant collectives for GPU clusters."""

__version__ = "0.1.0"
