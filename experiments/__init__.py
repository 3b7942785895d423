"""Research experiments: questions asked of Meridian's components, not parts of the product.

Like rl-zoo beside Stable-Baselines3, these modules sit outside the library: each answers one
research question (its module docstring says which), runs as ``python -m experiments.<module>`` from
the repository root, and may import any product package. It is not installed with the product
(pyproject's ``packages.find`` leaves it out). No product package (``meridian``, ``meridian_demo``,
``node_agent``, ``regional_scheduler``, ``global_scheduler``, ``gnn``, ``protos``) imports
``experiments`` (``tests/meridian/test_architecture.py``).

- :mod:`experiments.rollout`: how much could lookahead over FGD gain? (``docs/history/bench-learned-diary.md``)
- :mod:`experiments.trajectory_probe`: how much of a run's GPU allocation is trajectory, not policy?
- :mod:`experiments.validation`: which placement checkpoint is better, judged on training lists only?
- :mod:`experiments.carbon_bound`: what is the least carbon any routing policy could emit on a window?
"""
