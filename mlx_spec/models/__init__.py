"""Thin extensions of mlx-lm's model classes, one module per architecture family."""

import mlx.core as mx

from ..errors import SpecError


def materialize(model) -> None:
    """Evaluate every array a module tree holds, private ones too (RoPE frequency tables are built lazily at
    construction). MLX arrays belong to the stream of the thread that made them: one left unevaluated here
    fails when the chat's generation thread first uses it."""
    mx.eval([value for module in model.modules() for value in module.values() if isinstance(value, mx.array)])


def to_target_vocabulary(scores: mx.array, index: mx.array) -> mx.array:
    """Scores over a head's reduced vocabulary (n, R) as scores over the target's (n, V): `index` maps each target
    token to its row, R (past the last) for tokens outside it, which score -inf."""
    padded = mx.concatenate([scores, mx.full((*scores.shape[:-1], 1), -mx.inf, dtype=scores.dtype)], axis=-1)
    return mx.take(padded, index, axis=-1)


def load_exactly(module, weights: dict, misfit: str) -> None:
    """Load `weights` (name -> array) into `module`, every parameter and nothing else, and `materialize` it; a
    mismatch is a SpecError: `misfit` with "{}" standing for what did not fit."""
    try:
        module.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise SpecError(misfit.format(e)) from None
    materialize(module)
