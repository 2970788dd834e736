"""The RL step: the trainer, its rollout sources and the stages of its phases."""
