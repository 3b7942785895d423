"""Federated training across regions on Flower: only model updates cross a region's boundary
(:mod:`meridian.federated.engine`)."""
