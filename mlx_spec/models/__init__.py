"""Thin extensions of mlx-lm's model classes, one module per architecture family."""

import mlx.core as mx


def materialize(model) -> None:
    """Evaluate every array a module tree holds, private ones too (RoPE frequency tables are built lazily at
    construction). MLX arrays belong to the stream of the thread that made them: one left unevaluated here
    fails when the chat's generation thread first uses it."""
    mx.eval([value for module in model.modules() for value in module.values() if isinstance(value, mx.array)])
