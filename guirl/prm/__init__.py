"""The process reward model: a judge VLM scoring each step of an episode."""
