"""CLI commands contributed to ``meridian`` through the ``meridian.cli`` entry point."""

from __future__ import annotations

from meridian.cli import CliRoot


def register(cli: CliRoot) -> None:
    """Add this component's commands to the ``meridian`` CLI."""
