"""Autoscaling policies, one per module; :mod:`.registry` maps names to constructors."""
