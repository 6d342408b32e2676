"""Transformer components, each a pure-functional Flax linen module chosen by name in config.model."""
