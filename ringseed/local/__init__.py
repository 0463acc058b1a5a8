"""Cluster-free runs: a master and its agents or peers as local processes on 127.0.0.1."""
