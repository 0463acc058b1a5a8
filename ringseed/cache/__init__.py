"""The node cache service (PCache): checkpoints and datasets in node memory and SSD, replicated, persisted behind."""
