"""Model checkpoints guirl builds itself (the tiny Qwen3-VL used by tests and demos)."""
