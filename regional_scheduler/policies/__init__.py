"""Placement policies: one module per policy, looked up by name in :mod:`.registry`."""
