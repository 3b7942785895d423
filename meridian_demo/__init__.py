"""``meridian demo``: the composition root that runs every tier on one machine.

The core must not import components and components must not import each other (ARCHITECTURE.md),
so the one place that wires them all together lives in its own small package, as a ``cmd/`` main
does in a Go project. It holds no scheduling logic of its own.
"""
