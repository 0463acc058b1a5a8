"""Multi-host testbed: network namespaces on a bridge with tc-limited links."""
