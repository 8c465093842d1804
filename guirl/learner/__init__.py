"""Learner: losses, advantages, the training loop, FSDP wrapping, checkpoints, weight publishing.
Built in a later issue; the package exists so the layout is fixed from the start."""
