"""Meridian's shared core: data model, quantities, cluster state, metrics, simulator, bus, CLI."""

__version__ = "0.1.0"
