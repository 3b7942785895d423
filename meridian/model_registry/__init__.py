"""The model registry: versions of Meridian's learned models (placement, routing, autoscaling), their lineage
and lifecycle state (candidate → shadow → canary → active → retired), kept in the bus's Redis, with the
checkpoint files in a content-addressed artifact store and every transition audited (docs/model-lifecycle.md).

The core imports no tier: each tier declares a :class:`CheckpointValidator` for its model in the
``meridian.model_validators`` entry-point group (:mod:`.validators`).

Modules: :mod:`.versions` (the record, the states and the transition table), :mod:`.registry` (Redis,
transactions, audit, events, metric), :mod:`.artifacts` (the artifact store), :mod:`.validators` (the tiers'
checkpoint validators), :mod:`.keys` (Redis key names), :mod:`.cli` (``meridian models``),
:mod:`.grpc_service` (``ModelService``), :mod:`.gates` (promotion gates, rollback monitor) and :mod:`.evaluation`
(online evaluation: the canary split, the evaluator that drives a candidate through the registry). Nothing is
imported here, so ``meridian``'s start-up stays fast.
"""
