"""Training infrastructure: optimizer and schedule, checkpoints, run logging."""
