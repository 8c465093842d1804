"""guirl: reinforcement learning for vision-language GUI agents on real desktops."""

__version__ = "0.1.0"
