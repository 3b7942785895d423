"""The continual-learning loop of the learned models: what tiers publish for learning (records), what a tier
declares to be retrained and benchmarked (:mod:`.tiers`), the learner that consumes records, watches drift,
retrains and hands candidates to online evaluation (:mod:`.learner`), and ``meridian bench lifecycle``
(:mod:`.bench`). The core imports no tier: tiers declare themselves in the ``meridian.lifecycle`` entry-point
group (docs/model-lifecycle.md, "Continual learning")."""
