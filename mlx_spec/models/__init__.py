"""Thin extensions of mlx-lm's model classes, one module per architecture family."""
