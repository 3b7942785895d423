"""Double DQN with a target network, Huber loss and linearly decaying ε-greedy exploration."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn import functional

from meridian.seeding import set_random_seed
from regional_scheduler.autoscaling.dqn.policy import QNetwork
from regional_scheduler.autoscaling.dqn.replay_buffer import ReplayBuffer
from regional_scheduler.autoscaling.env import AutoscaleEnv


class DQN:
    """Hyper-parameters are keyword arguments (defaults sized for minutes of CPU training).

    :param learning_rate: Adam step size.
    :param buffer_size: transitions kept for replay.
    :param learning_starts: environment steps before the first gradient step.
    :param batch_size: transitions per gradient step.
    :param gamma: discount per step (one minute); 0.97 looks ~30 minutes ahead, longer than a pod start-up
        plus the scale-down cool-down.
    :param train_freq: environment steps per gradient step.
    :param target_update_interval: environment steps between target-network copies.
    :param exploration_fraction: fraction of training over which ε decays from 1 to ``exploration_final_eps``.
    :param hidden: hidden layer widths of the Q-network.
    :param seed: seeds random, numpy, torch and the environment (:func:`set_random_seed`).
    """

    def __init__(self, env: AutoscaleEnv, *, learning_rate: float = 1e-3, buffer_size: int = 50_000,
                 learning_starts: int = 1_000, batch_size: int = 64, gamma: float = 0.97, train_freq: int = 2,
                 target_update_interval: int = 500, exploration_fraction: float = 0.3,
                 exploration_final_eps: float = 0.05, hidden: tuple[int, ...] = (64, 64), seed: int = 0) -> None:
        self.env = env
        self.learning_rate = learning_rate
        self.learning_starts = learning_starts
        self.batch_size = batch_size
        self.gamma = gamma
        self.train_freq = train_freq
        self.target_update_interval = target_update_interval
        self.exploration_fraction = exploration_fraction
        self.exploration_final_eps = exploration_final_eps
        self.seed = seed
        self.rng = set_random_seed(seed)
        n_features = int(env.observation_space.shape[0])
        n_actions = int(env.action_space.n)
        self.q_net = QNetwork(n_features, n_actions, hidden)
        self.target_net = QNetwork(n_features, n_actions, hidden)
        self.target_net.load_state_dict(self.q_net.state_dict())
        self.optimizer = torch.optim.Adam(self.q_net.parameters(), lr=learning_rate)
        self.buffer = ReplayBuffer(buffer_size, n_features)

    def _epsilon(self, step: int, total: int) -> float:
        progress = min(1.0, step / max(1.0, self.exploration_fraction * total))
        return 1.0 + progress * (self.exploration_final_eps - 1.0)

    def _train_step(self) -> float:
        batch = self.buffer.sample(self.batch_size, self.rng)
        with torch.no_grad():
            next_actions = self.q_net(batch.next_states).argmax(dim=1, keepdim=True)
            next_q = self.target_net(batch.next_states).gather(1, next_actions).squeeze(1)
            target = batch.rewards + self.gamma * (1.0 - batch.dones) * next_q
        q = self.q_net(batch.states).gather(1, batch.actions.unsqueeze(1)).squeeze(1)
        loss = functional.smooth_l1_loss(q, target)
        self.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.q_net.parameters(), 10.0)
        self.optimizer.step()
        return float(loss.item())

    def learn(self, total_steps: int, progress: Callable[[int, dict[str, float]], None] | None = None) -> QNetwork:
        state, _ = self.env.reset(seed=self.seed)
        self.env.action_space.seed(self.seed)
        episode_reward, episode_violations, episodes = 0.0, 0, 0
        last_stats: dict[str, float] = {}
        for step in range(total_steps):
            if self.rng.random() < self._epsilon(step, total_steps):
                action = int(self.rng.integers(self.env.action_space.n))
            else:
                action = self.q_net.predict(state)
            next_state, reward, terminated, truncated, info = self.env.step(action)
            self.buffer.add(state, action, reward, next_state, terminated)
            episode_reward += reward
            episode_violations += int(info["violated"])
            state = next_state
            if terminated or truncated:
                episodes += 1
                last_stats = {"episode_reward": episode_reward, "episode_violations": float(episode_violations),
                              "episodes": float(episodes)}
                state, _ = self.env.reset()
                episode_reward, episode_violations = 0.0, 0
            if step >= self.learning_starts and step % self.train_freq == 0:
                last_stats["loss"] = self._train_step()
            if step % self.target_update_interval == 0:
                self.target_net.load_state_dict(self.q_net.state_dict())
            if progress is not None:
                progress(step + 1, last_stats)
        return self.q_net
