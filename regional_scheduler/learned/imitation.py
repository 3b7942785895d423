"""Behaviour cloning from the best heuristic (FGD on the openb traces), the policy's starting point.

Collection: the teacher drives :class:`~regional_scheduler.learned.env.PlacementEnv` (its own
decisions, so the states are the teacher's); at each decision we keep the teacher's target nodes, its
next-best nodes (hard negatives) and a random sample of the rest, up to ``max_candidates``.

Targets (``target``):

- ``"pick"`` (default): the node the teacher actually chose. FGD's scores are integers 0–100, so
  many nodes tie and the scheduler takes the first in node order; that tie-break is worth a lot
  (FGD with random ties loses ~5 points of GPU allocation on openb, ``docs/results-placement.md``) because
  it keeps filling the same nodes and leaves the others whole. Node order is not a feature, but its
  effect — preferring nodes already in use — is learnable from the node features.
- ``"ties"``: every node the teacher ranked best, a set likelihood that leaves the tie order free.

Loss: ``−log Σ_{j ∈ targets} softmax(logits)_j``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from regional_scheduler.learned.buffer import ImitationBuffer, ImitationSample
from regional_scheduler.learned.env import Episode, PlacementEnv
from regional_scheduler.learned.policy import PlacementNet
from regional_scheduler.policies.base import ScorePolicy, WorkloadAware
from regional_scheduler.policies.registry import get_policy


def collect(episodes: Sequence[Episode], *, teacher: str = "fgd", target: str = "pick",
            buffer: ImitationBuffer | None = None,
            max_candidates: int = 64, n_hard_negatives: int = 16, every: int = 1, seed: int = 0,
            on_step: Callable[[int], None] | None = None) -> ImitationBuffer:
    """Run ``teacher`` through ``episodes`` and store every ``every``-th decision it takes."""
    if target not in ("pick", "ties"):
        raise ValueError(f"target must be 'pick' or 'ties', not {target!r}")
    buffer = buffer or ImitationBuffer(max_candidates)
    rng = np.random.default_rng(seed)
    step = 0
    for episode in episodes:
        env = PlacementEnv(episode)
        _, info = env.reset(seed=seed)
        assert env.state is not None
        policy: ScorePolicy = env.features.fgd if teacher == "fgd" else get_policy(teacher)
        if teacher != "fgd" and isinstance(policy, WorkloadAware):
            policy.prepare(env.state, episode.workload)
        while not env.done:
            candidates = info["candidates"]
            scores = policy.score(env.state, env.pod, candidates).scores
            pick = int(np.argmax(scores))  # the scheduler's rule: first highest score
            if step % every == 0 and candidates.size > 1 and scores.max() > scores.min():
                best = np.array([pick]) if target == "pick" else np.flatnonzero(scores == scores.max())
                buffer.add(_sample(info["candidate_features"], env.pod_features, scores, best, rng, max_candidates,
                                   n_hard_negatives))
            _, _, _, _, info = env.step(int(candidates[pick]))
            step += 1
            if on_step is not None:
                on_step(step)
    return buffer


def _sample(features: np.ndarray, pod_features: np.ndarray, scores: np.ndarray, best: np.ndarray,
            rng: np.random.Generator, max_candidates: int, n_hard: int) -> ImitationSample:
    if best.size > max_candidates // 2:
        best = rng.choice(best, size=max_candidates // 2, replace=False)
    rest = np.setdiff1d(np.arange(scores.size), best)
    hard = rest[np.argsort(-scores[rest], kind="stable")[:n_hard]]
    others = np.setdiff1d(rest, hard)
    n_random = min(others.size, max_candidates - best.size - hard.size)
    keep = np.concatenate([best, hard, rng.choice(others, size=n_random, replace=False)]).astype(np.int64)
    context = np.concatenate([features.mean(axis=0), features.max(axis=0)]).astype(np.float32)
    teacher_best = np.zeros(keep.size, dtype=bool)
    teacher_best[: best.size] = True
    return ImitationSample(features[keep], pod_features, context, teacher_best)


def set_likelihood_loss(logits: torch.Tensor, teacher_best: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of ``−log Σ_{j ∈ best} softmax(logits)_j`` (logits already masked)."""
    log_p = torch.log_softmax(logits, dim=-1)
    return -(torch.logsumexp(log_p.masked_fill(~teacher_best, float("-inf")), dim=-1)).mean()


def behaviour_cloning(net: PlacementNet, buffer: ImitationBuffer, *, epochs: int = 4, batch_size: int = 128,
                      learning_rate: float = 3e-3, part: str = "all", seed: int = 0,
                      on_epoch: Callable[[int, float, float], None] | None = None) -> list[dict[str, float]]:
    """Fit ``net`` to the teacher's choices; returns per-epoch ``{"loss", "top1"}`` (top-1: the
    network's highest-scoring kept candidate is one of the teacher's targets).

    ``part``: ``"all"`` trains every parameter; ``"head"`` trains only the linear heuristic head with
    the MLP switched off (``mlp_scale`` = 0) — a linear imitation of the teacher; ``"mlp"`` then
    trains the MLP on what the head leaves unexplained (the head frozen, ``mlp_scale`` = 1).
    ``learning_rate`` 3e-3 with Adam suits a ~4k-parameter network; a few epochs over ~10k
    decisions reach a plateau without over-fitting a few episodes (the log shows it).
    """
    if part not in ("all", "head", "mlp"):
        raise ValueError(f"part must be all, head or mlp, not {part!r}")
    if part != "mlp":
        mean, std = buffer.feature_statistics()
        with torch.no_grad():
            net.feature_mean.copy_(torch.from_numpy(mean))
            net.feature_std.copy_(torch.from_numpy(std))
    if part == "all":
        params = list(net.parameters())
    elif part == "head":
        params = list(net.heuristic_head.parameters())
        with torch.no_grad():
            net.mlp_scale.fill_(0.0)
    else:
        params = list(net.mlp.parameters())
        with torch.no_grad():
            net.mlp_scale.fill_(1.0)
    optimiser = torch.optim.Adam(params, lr=learning_rate)
    rng = np.random.default_rng(seed)
    history: list[dict[str, float]] = []
    net.train()
    for epoch in range(epochs):
        order = rng.permutation(len(buffer))
        losses, hits = [], []
        for start in range(0, len(order), batch_size):
            batch = buffer.batch(order[start:start + batch_size])
            logits = net(batch.node_features, batch.pod_features, batch.valid, context=batch.context)
            loss = set_likelihood_loss(logits, batch.teacher_best)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            losses.append(float(loss.detach()))
            top = logits.detach().argmax(dim=-1)
            hits.append(float(batch.teacher_best.gather(1, top[:, None]).float().mean()))
        record = {"epoch": float(epoch), "loss": float(np.mean(losses)), "top1": float(np.mean(hits))}
        history.append(record)
        if on_epoch is not None:
            on_epoch(epoch, record["loss"], record["top1"])
    net.eval()
    return history
