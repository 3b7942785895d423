"""Learned, predictive autoscaling with HPA baseline and guard rails."""
