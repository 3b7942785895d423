"""The learned placement policy: features, network, environment, reward, training and serving.

Imports torch only where a module needs it; the baselines never import this package.
"""
