"""Model checkpoints: the tiny Qwen3-VL guirl builds itself (tests, demos), which checkpoint a run loads."""
