"""Baselines measured side by side with ringseed on the testbed: direct download and a libtorrent swarm."""
