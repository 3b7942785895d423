"""DQN split as Stable-Baselines3 does: algorithm, policy network, replay buffer, checkpoint I/O."""
